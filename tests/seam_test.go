// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Tests of the seam between the device and the paths: a
// responder touches a target's memory one step at a time, never across
// socket I/O, so that deregistration waits for transfers in flight
// (TestSeamDeregInFlight) and one slow peer stalls nothing but its own
// connection (TestSeamNoStallAcrossIO). A raw client that joins a real
// agent as a member host (tcp_hostile_test.go) plays the slow peer: it
// sends a request's header and then its payload when the test says so,
// or reads a READ's response when the test says so.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/tcpwire"
	"github.com/vrdma/vrdma/internal/testenv"
)

// seamMember returns host from's identity as a raw client claims it, with
// the switch's secret (created by a first tcp connection between the
// hosts, which the caller has made).
func seamMember(t *testing.T, c *testenv.Cluster, from *testenv.Host) rawIdentity {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sec, _, err := store.Get[records.SwitchSecret](ctx, c.Store(), records.SwitchSecretKey(c.Switch.Name))
	if err != nil {
		t.Fatalf("the switch secret after a tcp connection: %v", err)
	}
	return rawHostIdentity(t, from, sec.Key)
}

// readHeader reads the next frame's header, and nothing of its payload.
func (p *rawPeer) readHeader() tcpwire.Header {
	p.t.Helper()
	var hb [tcpwire.HeaderLen]byte
	if _, err := io.ReadFull(p.nc, hb[:]); err != nil {
		p.t.Fatalf("read a frame header: %v", err)
	}
	var h tcpwire.Header
	if err := tcpwire.Decode(hb[:], tcpwire.Version, &h); err != nil {
		p.t.Fatalf("the agent sent a bad frame: %v", err)
	}
	return h
}

// waitBytes waits until b holds want in every byte of its first n.
func waitBytes(t *testing.T, what string, b []byte, n int, want byte) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for time.Now().Before(deadline) {
		if bytes.Count(b[:n], []byte{want}) == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: the first %d bytes did not become %#x", what, n, want)
}

// TestSeamDeregInFlight deregisters a region while a slow tcp WRITE to it
// (and a slow READ of it) is in flight, and registers its guest memory
// again with other contents: the new region is never touched, and the
// transfer ends REM_ACCESS_ERR — a WRITE's response says so; a READ's
// response, already begun, is cut, and no byte of the new contents is in
// what it sent.
func TestSeamDeregInFlight(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff})
	ha, hb := c.Hosts[0], c.Hosts[1]
	env := &tcpEnv{c: c, prefix: "sd"}
	s := &suite{env: env, how: connCM}
	va := ha.Open(t, "sd-a", testenv.VMOptions{MemMB: 64})
	vb := hb.Open(t, "sd-b", testenv.VMOptions{MemMB: 128})
	hostileTraffic(t, s, va, vb) // the first connection creates the switch's secret
	asA := seamMember(t, c, ha)

	const size = 32 << 20 // more than the sockets between the raw client and the agent buffer
	const early = 256 << 10
	// pair connects a fresh QP pair and returns b with a region of size
	// bytes filled with old, b's expected PSN and the region's buffer.
	pair := func(t *testing.T, old byte) (a, b *end, mr *vrdma.MR, buf []byte, epsn uint32) {
		a, b = newEnd(t, va, qpConfig{}), newEnd(t, vb, qpConfig{})
		s.connect(t, a, b, connCM)
		buf, err := vb.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		mr, err = b.pd.RegMR(opCtx(t), buf, vrdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		for i := range buf {
			buf[i] = old
		}
		info, err := b.qp.Query(opCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		return a, b, mr, buf, info.Attr.RQPSN & tcpwire.PSNMask
	}
	// reregister deregisters mr — it must return while the transfer is
	// stalled — and registers its memory again, filled with fresh.
	reregister := func(t *testing.T, b *end, mr *vrdma.MR, buf []byte, fresh byte) *vrdma.MR {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := mr.Dereg(ctx); err != nil {
			t.Fatalf("dereg while a transfer to the region is stalled: %v", err)
		}
		mr2, err := b.pd.RegMR(opCtx(t), buf, vrdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		for i := range buf {
			buf[i] = fresh
		}
		return mr2
	}

	t.Run("write", func(t *testing.T) {
		a, b, mr, buf, e := pair(t, 0x11)
		p := rawJoin(t, asA, hb)
		payload := bytes.Repeat([]byte{0xaa}, size)
		p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.Write, Tag: 1, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(), PSN: e,
			RKey: mr.RKey(), RemoteAddr: mr.Addr(), PayloadLen: size}, payload[:early]))
		waitBytes(t, "the WRITE's first bytes", buf, early, 0xaa) // the transfer is under way
		mr2 := reregister(t, b, mr, buf, 0x22)
		p.mustWrite(payload[early:])
		r := p.readHeader()
		if r.Tag != 1 || r.Status != tcpwire.RemAccessErr {
			t.Errorf("response to a WRITE whose region was deregistered during it: %+v, want REM_ACCESS_ERR", r)
		}
		if n := len(buf) - bytes.Count(buf, []byte{0x22}); n != 0 {
			t.Errorf("the region registered again after dereg: %d of its %d bytes were overwritten by the WRITE to the old one", n, len(buf))
		}
		expectState(t, b.qp, vrdma.QPSErr)
		rawProbe(t, p, 2) // the connection carries on
		if err := mr2.Dereg(opCtx(t)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("read", func(t *testing.T) {
		a, b, mr, buf, e := pair(t, 0x33)
		p := rawJoin(t, asA, hb)
		p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.Read, Tag: 1, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(), PSN: e,
			RKey: mr.RKey(), RemoteAddr: mr.Addr(), ImmOrLen: size}, nil))
		r := p.readHeader()
		if r.Type != tcpwire.ReadResp || r.Status != tcpwire.OK || r.PayloadLen != size {
			t.Fatalf("READ response: %+v, want OK with %d bytes", r, size)
		}
		got := make([]byte, size)
		if _, err := io.ReadFull(p.nc, got[:early]); err != nil { // the response is under way; the rest waits in the sockets
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the agent fills the sockets and waits for room
		mr2 := reregister(t, b, mr, buf, 0x44)
		p.nc.SetReadDeadline(time.Now().Add(waitTimeout))
		n, err := io.ReadFull(p.nc, got[early:])
		n += early
		switch {
		case err == nil:
			t.Logf("the whole READ response (%d bytes) left before dereg returned", n)
		case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			t.Logf("the READ response was cut after %d of %d bytes, when its region was deregistered", n, size)
		default:
			t.Fatalf("read the rest of the READ response: %v", err)
		}
		if k := bytes.IndexByte(got[:n], 0x44); k >= 0 {
			t.Errorf("the READ response sent the contents of the region registered after dereg (at byte %d of %d)", k, n)
		}
		if k := len(got[:n]) - bytes.Count(got[:n], []byte{0x33}); k != 0 {
			t.Errorf("%d bytes of the READ response are not the region's contents", k)
		}
		if n == size {
			// It completed before dereg returned: then it may not have been cut.
			return
		}
		if err := mr2.Dereg(opCtx(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSeamNoStallAcrossIO stalls a 64 MiB tcp WRITE to VM b halfway
// (its peer stops sending) and destroys a QP of b meanwhile: ping-pongs
// between two other VMs, on the memcpy and on the rdma path, and with b
// itself on both, keep completing, and the destroy returns. Before the
// responder let go of b's memory across socket I/O, the destroy waited
// for the stalled transfer, and every later user of b's memory waited
// behind the destroy — the rdma engine's reader among them, and with it
// every rdma QP of the host.
func TestSeamNoStallAcrossIO(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 3, RDMA: true, NoRDMA: []int{0}, Netns: testenv.NetnsOff})
	h0, h1, h2 := c.Hosts[0], c.Hosts[1], c.Hosts[2]
	env := &tcpEnv{c: c, prefix: "ss"}
	s := &suite{env: env, how: connCM}
	va := h0.Open(t, "ss-a", testenv.VMOptions{MemMB: 16})
	vb := h1.Open(t, "ss-b", testenv.VMOptions{MemMB: 128})
	vc := h1.Open(t, "ss-c", testenv.VMOptions{MemMB: 16})
	vf := h1.Open(t, "ss-f", testenv.VMOptions{MemMB: 16})
	vd := h2.Open(t, "ss-d", testenv.VMOptions{MemMB: 16})
	hostileTraffic(t, s, va, vb)
	asA := seamMember(t, c, h0)

	// The stalled transfer: a 64 MiB WRITE from a's host to b, 1 MiB of
	// it sent.
	const size, sent = 64 << 20, 1 << 20
	a, b := newEnd(t, va, qpConfig{}), newEnd(t, vb, qpConfig{})
	s.connect(t, a, b, connCM)
	if pi := b.qp.Path(); pi.Path != vrdma.PathTCP {
		t.Fatalf("a-b path %s, want tcp: %s", pi.Path, pi.Reason)
	}
	big := b.mr(t, size, vrdma.AccessAll)
	info, err := b.qp.Query(opCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	p := rawJoin(t, asA, h1)
	payload := bytes.Repeat([]byte{0x5a}, size)
	p.mustWrite(rawFrame(tcpwire.Header{Type: tcpwire.Write, Tag: 1, DstQPN: b.qp.QPN(), SrcQPN: a.qp.QPN(),
		PSN: info.Attr.RQPSN & tcpwire.PSNMask, RKey: big.RKey(), RemoteAddr: big.Addr(), PayloadLen: size}, payload[:sent]))
	waitBytes(t, "the stalled WRITE's first bytes", big.Bytes(), sent, 0x5a)

	// The pairs that must not stall, each connected before the destroy.
	pairs := []struct {
		name string
		from *vrdma.VM
		to   *vrdma.VM
		path vrdma.PathKind
	}{
		{"memcpy c-f", vc, vf, vrdma.PathMemcpy},
		{"rdma d-c", vd, vc, vrdma.PathRDMA},
		{"memcpy c-b", vc, vb, vrdma.PathMemcpy},
		{"rdma d-b", vd, vb, vrdma.PathRDMA},
	}
	type pingPair struct {
		name     string
		from, to *end
		src, dst *vrdma.MR
	}
	var pps []pingPair
	for _, pr := range pairs {
		from, to := newEnd(t, pr.from, qpConfig{}), newEnd(t, pr.to, qpConfig{})
		(&suite{env: seamEnv{env, pr.path}, how: connCM}).connect(t, from, to, connCM) // checks the path
		pps = append(pps, pingPair{pr.name, from, to, from.mr(t, 4096, vrdma.AccessAll), to.mr(t, 4096, vrdma.AccessAll)})
	}

	// Destroy a QP of b while the transfer is stalled.
	victim := newEnd(t, vb, qpConfig{})
	destroyed := make(chan error, 1)
	go func() { destroyed <- victim.qp.Destroy(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // the destroy is under way (before the fix: waiting for b's memory)

	var wg sync.WaitGroup
	for _, pp := range pps {
		wg.Go(func() {
			for i := range 20 {
				id := uint64(i + 1)
				if err := pp.from.qp.PostSend([]vrdma.SendWR{{ID: id, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
					SGL: sgl(pp.src.SGE(0, 8)), RemoteAddr: pp.dst.Addr(), RKey: pp.dst.RKey()}}); err != nil {
					t.Errorf("%s: post write %d: %v", pp.name, id, err)
					return
				}
				wc := make([]vrdma.WorkCompletion, 1)
				deadline := time.Now().Add(waitTimeout)
				for {
					n, err := pp.from.scq.Poll(wc)
					if err != nil {
						t.Errorf("%s: poll: %v", pp.name, err)
						return
					}
					if n == 1 {
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("%s: write %d of 20 did not complete within %v while a transfer to VM b was stalled", pp.name, id, waitTimeout)
						return
					}
					time.Sleep(100 * time.Microsecond)
				}
				if wc[0].Status != vrdma.WCSuccess || wc[0].WRID != id {
					t.Errorf("%s: write %d completed with %+v", pp.name, id, wc[0])
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-destroyed:
		if err != nil {
			t.Errorf("destroy a QP of b: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Errorf("destroying a QP of b did not return within %v while a transfer to b was stalled", waitTimeout)
	}

	// The stalled transfer resumes and completes.
	p.mustWrite(payload[sent:])
	if r := p.readHeader(); r.Tag != 1 || r.Status != tcpwire.OK {
		t.Errorf("the stalled WRITE, resumed: %+v, want OK", r)
	}
	if n := bytes.Count(big.Bytes(), []byte{0x5a}); n != size {
		t.Errorf("the stalled WRITE landed %d of its %d bytes", n, size)
	}
}

// seamEnv is a cluster's tcpEnv whose pairs take path.
type seamEnv struct {
	*tcpEnv
	path vrdma.PathKind
}

func (e seamEnv) Path() vrdma.PathKind { return e.path }
