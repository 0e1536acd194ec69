// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"bytes"
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestPathMTU checks where a connection's path MTU comes from: an
// adapter's port reports as active MTU its port group's RoCE MTU, or the
// largest its switch's MTU carries; a connection takes the smaller of its
// two ends' — through the connection manager across hosts (the dialer
// says its MTU, the acceptor answers with the one it took) and out of
// band (the endpoints carry it) — and moves data with it.
func TestPathMTU(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, MTU: 9000})
	ctx := opCtx(t)
	small := records.PortGroup{Name: "mtu2048", Key: "dvportgroup-mtu2048", Switch: c.Switch.Name, VLAN: c.PortGroup.VLAN,
		PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2, RoCEMTU: 2048}
	if _, err := c.Store().Create(ctx, records.PortGroupKey(small.Key), small); err != nil {
		t.Fatal(err)
	}
	vma := c.Hosts[0].Open(t, "mtu-a", testenv.VMOptions{MemMB: 8})
	vmb := c.Hosts[1].OpenVMX(t, "mtu-b", testenv.VMXOn(testenv.VMOptions{MemMB: 8}, c.Switch.UUID, small.Key))
	for _, x := range []struct {
		vm   *vrdma.VM
		want uint32
		why  string
	}{{vma, 4096, "the largest RoCE MTU switch MTU 9000 carries"}, {vmb, 2048, "port group " + small.Key + "'s RoCE MTU"}} {
		p, err := x.vm.Adapters()[0].QueryPort(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.ActiveMTU != x.want {
			t.Errorf("%s/vrdma0: active MTU %d, want %d (%s)", x.vm.Name(), p.ActiveMTU, x.want, x.why)
		}
	}
	pathMTU := func(e *end) uint32 {
		t.Helper()
		qi, err := e.qp.Query(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return qi.Attr.PathMTU
	}

	// The connection manager, from the larger end and from the smaller.
	for _, dir := range []struct{ from, to *vrdma.VM }{{vma, vmb}, {vmb, vma}} {
		a, b := newEnd(t, dir.from, qpConfig{}), newEnd(t, dir.to, qpConfig{})
		s := &suite{env: &tcpEnv{c: c}}
		s.cmConnect(t, a, b, false)
		if ma, mb := pathMTU(a), pathMTU(b); ma != 2048 || mb != 2048 {
			t.Errorf("CM %s → %s: path MTU %d and %d, want 2048 on both", dir.from.Name(), dir.to.Name(), ma, mb)
		}
		writeAndCheck(t, a, b, 3*2048+100)
	}

	// Out of band.
	a, b := newEnd(t, vma, qpConfig{}), newEnd(t, vmb, qpConfig{})
	if ea, eb := a.qp.Endpoint(), b.qp.Endpoint(); ea.MTU != 4096 || eb.MTU != 2048 {
		t.Fatalf("endpoints carry MTUs %d and %d, want 4096 and 2048", ea.MTU, eb.MTU)
	}
	if err := a.qp.ConnectTo(ctx, b.qp.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectTo(ctx, a.qp.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if ma, mb := pathMTU(a), pathMTU(b); ma != 2048 || mb != 2048 {
		t.Errorf("out of band: path MTU %d and %d, want 2048 on both", ma, mb)
	}
	writeAndCheck(t, a, b, 5000)
}

// writeAndCheck writes n bytes from a to b (several packets of the path
// MTU) and checks they arrived.
func writeAndCheck(t *testing.T, a, b *end, n int) {
	t.Helper()
	src, dst := a.mr(t, n, vrdma.AccessLocalWrite), b.mr(t, n, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
	fill(src.Bytes(), uint64(n))
	postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
		SGL: sgl(src.SGE(0, n)), RemoteAddr: off(dst, 0), RKey: dst.RKey()})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatalf("WRITE of %d bytes: the target differs from the source", n)
	}
}
