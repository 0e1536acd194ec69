// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/tcpwire"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestSecurityUDPortGroups: a UD QP's address resolution obeys the rules
// a connection does (docs/SECURITY.md): an address handle to an adapter on
// a port group of another VLAN is refused, on another host and on the
// same one, with the rule named; one on the same port group is made. A
// datagram that names a QPN of an adapter other than the one its address
// handle reaches — a QP of another port group behind the same host — is
// dropped there, counted, while the QPs of the address handle's adapter
// still receive.
func TestSecurityUDPortGroups(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff})
	pg := records.PortGroup{Name: "other-vlan", Key: "dvportgroup-20", Switch: c.Switch.Name, VLAN: 20,
		PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Store().Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
		t.Fatal(err)
	}
	other := testenv.VMOptions{MemMB: 16}
	a := newUDEnd(t, c.Hosts[0].Open(t, "usA", testenv.VMOptions{MemMB: 16}), 8, 1024)                    // host 0, the cluster's port group
	b := newUDEnd(t, c.Hosts[1].Open(t, "usB", testenv.VMOptions{MemMB: 16}), 8, 1024)                    // host 1, the same port group
	cv := newUDEnd(t, c.Hosts[1].OpenVMX(t, "usC", testenv.VMXOn(other, c.Switch.UUID, pg.Key)), 8, 1024) // host 1, VLAN 20
	d := newUDEnd(t, c.Hosts[0].OpenVMX(t, "usD", testenv.VMXOn(other, c.Switch.UUID, pg.Key)), 8, 1024)  // host 0, VLAN 20
	a.post(t, 0, 8)
	d.post(t, 0, 8)
	for _, x := range []struct {
		what     string
		from, to *udEnd
	}{{"another host, another VLAN", cv, a}, {"this host, another VLAN", d, a}, {"another VLAN, to it", a, cv}} {
		_, err := x.from.pd.CreateAH(opCtx(t), vrdma.AHAttr{DGID: x.to.ad.GID()})
		expectCode(t, err, "refused", "an address handle to "+x.what)
		t.Logf("%s: %v", x.what, err)
	}
	if _, err := b.pd.CreateAH(opCtx(t), vrdma.AHAttr{DGID: a.ad.GID()}); err != nil {
		t.Fatalf("an address handle on the same port group: %v", err)
	}
	// C reaches D (VLAN 20, host 0): it names A's QPN there, and D's.
	ah, err := cv.pd.CreateAH(opCtx(t), vrdma.AHAttr{DGID: d.ad.GID()})
	if err != nil {
		t.Fatal(err)
	}
	s := &suite{env: &tcpEnv{c: c}}
	for i, qpn := range []uint32{a.qp.QPN(), d.qp.QPN()} {
		tag := uint64(8 + 2*i) // udSize: 100 and 513 bytes
		udMessage(cv.src(), tag, udSize(tag))
		postSend(t, cv.qp, vrdma.SendWR{ID: tag, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(cv.srcSGE(udSize(tag))),
			AH: ah, RemoteQPN: qpn, RemoteQKey: udQKey})
		expectWC(t, waitWC(t, cv.scq, 1)[0], cv.qp, tag, vrdma.WCSuccess, vrdma.WCSend)
	}
	if got := d.received(t, cv, 1, waitTimeout, []uint64{10}); got[10] != 1 {
		t.Fatalf("D received %v, want its datagram", got)
	}
	expectNoWC(t, a.rcq, 3*quiet, "a datagram from another VLAN, through an address handle to another adapter")
	if st, err := s.agentOf(t, a.end).Status(t.Context()); err != nil || st.DatagramsDropped == 0 {
		t.Errorf("host 0 counted %d datagrams dropped (%v), want the one to A", st.DatagramsDropped, err)
	}
}

// TestSecurityUDSpoofedSource: a member host that speaks the tcp path by
// hand (host A's identity, key and secret: a host gone bad) sends
// datagram frames to a UD QP of host B. B delivers the one whose source
// GID is an adapter of A, and drops — silently, counted — those that name
// an adapter of another host (C) or of no host, and one with a malformed
// length closes the connection (the decoder refuses it).
func TestSecurityUDSpoofedSource(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 3, Netns: testenv.NetnsOff})
	ha, hb, hc := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	a := newUDEnd(t, ha.Open(t, "ssA", testenv.VMOptions{MemMB: 16}), 8, 1024)
	b := newUDEnd(t, hb.Open(t, "ssB", testenv.VMOptions{MemMB: 16}), 8, 1024)
	cv := newUDEnd(t, hc.Open(t, "ssC", testenv.VMOptions{MemMB: 16}), 8, 1024)
	b.post(t, 0, 8)
	// A real datagram first: host A dials B, which makes the switch's secret.
	ah, err := a.pd.CreateAH(opCtx(t), vrdma.AHAttr{DGID: b.ad.GID()})
	if err != nil {
		t.Fatal(err)
	}
	tag := uint64(8)
	udMessage(a.src(), tag, udSize(tag))
	postSend(t, a.qp, vrdma.SendWR{ID: tag, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(a.srcSGE(udSize(tag))),
		AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: udQKey})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, tag, vrdma.WCSuccess, vrdma.WCSend)
	if got := b.received(t, a, 1, waitTimeout, []uint64{tag}); got[tag] != 1 {
		t.Fatalf("B received %v, want A's datagram", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sec, _, err := store.Get[records.SwitchSecret](ctx, c.Store(), records.SwitchSecretKey(c.Switch.Name))
	if err != nil {
		t.Fatalf("the switch secret after a tcp connection: %v", err)
	}
	p := rawJoin(t, rawHostIdentity(t, ha, sec.Key), hb)
	frame := func(sgid vrdma.GID, tag uint64) []byte {
		n := udSize(tag)
		payload := make([]byte, tcpwire.DatagramPrefix+n)
		tcpwire.PutDatagramPrefix(payload, sgid, b.ad.GID())
		udMessage(payload[tcpwire.DatagramPrefix:], tag, n)
		return rawFrame(tcpwire.Header{Type: tcpwire.UDSend, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(), RKey: udQKey,
			RemoteAddr: tcpwire.DatagramRoute(0, 64, 0)}, payload)
	}
	st := func() uint64 {
		s, err := (&suite{env: &tcpEnv{c: c}}).agentOf(t, b.end).Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return s.DatagramsDropped
	}
	before := st()
	p.mustWrite(frame(cv.ad.GID(), 10))                     // an adapter of host C
	p.mustWrite(frame(vrdma.GID{0xfe, 0x80, 15: 0x42}, 12)) // an adapter of no host
	p.mustWrite(frame(a.ad.GID(), 14))                      // A's own: delivered
	if got := b.received(t, a, 1, waitTimeout, []uint64{14}); got[14] != 1 || len(got) != 1 {
		t.Fatalf("B received %v, want only the datagram from A's adapter", got)
	}
	expectNoWC(t, b.rcq, 3*quiet, "datagrams from adapters not on the sending host")
	if after := st(); after < before+2 {
		t.Errorf("host B counted %d datagrams dropped, want at least %d", after, before+2)
	}
	// A datagram frame longer than the GIDs and the largest MTU: the
	// decoder refuses it and B closes the connection.
	p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.UDSend, DstQPN: b.qp.QPN(), PayloadLen: tcpwire.DatagramPrefix + tcpwire.MaxDatagram + 1}, nil))
	p.expectClosed()
}
