// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// UD QPs and address handles: the conformance suite's case ud, which runs
// on every path.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// udQKey is the Q_Key the case's QPs share.
const udQKey = 0x11111111

// udEnd is a UD QP with its PD, CQs and one receive buffer per receive
// slot (GRH + MTU bytes each).
type udEnd struct {
	*end
	buf  *vrdma.MR
	slot int // bytes per receive
	n    int // receive slots
}

// newUDEnd makes a UD QP in RTS on vm's first adapter, with n receive
// buffers of GRH + mtu bytes.
func newUDEnd(t *testing.T, vm *vrdma.VM, n, mtu int) *udEnd {
	t.Helper()
	ctx := opCtx(t)
	ad := vm.Adapters()[0]
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scq, err := ad.CreateCQ(ctx, 512)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := ad.CreateCQ(ctx, 512)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{Type: vrdma.QPTypeUD, SendCQ: scq, RecvCQ: rcq, Caps: defaultCaps})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.ReadyUD(ctx, udQKey); err != nil {
		t.Fatal(err)
	}
	e := &udEnd{end: &end{vm: vm, ad: ad, pd: pd, scq: scq, rcq: rcq, qp: qp}, slot: vrdma.GRHSize + mtu, n: n}
	e.buf = e.mr(t, n*e.slot+mtu, vrdma.AccessLocalWrite)
	return e
}

// post posts receives into slots [from, to).
func (e *udEnd) post(t *testing.T, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		postRecv(t, e.qp, vrdma.RecvWR{ID: uint64(i), SGL: sgl(e.buf.SGE(i*e.slot, e.slot))})
	}
}

// src returns the send buffer: the MTU's bytes after the receive slots.
func (e *udEnd) src() []byte { return e.buf.Bytes()[e.n*e.slot:] }

// srcSGE is the first n bytes of the send buffer.
func (e *udEnd) srcSGE(n int) vrdma.SGE { return e.buf.SGE(e.n*e.slot, n) }

// ah makes an address handle from e to dst's adapter, checking its path.
func (e *udEnd) ah(t *testing.T, s *suite, dst *udEnd) *vrdma.AH {
	t.Helper()
	ah, err := e.pd.CreateAH(opCtx(t), vrdma.AHAttr{DGID: dst.ad.GID()})
	if err != nil {
		t.Fatal(err)
	}
	if p := ah.Path(); p.Path != s.env.Path() {
		t.Errorf("address handle %s → %s takes %q (%s), want %q", e.ad.GID(), dst.ad.GID(), p.Path, p.Reason, s.env.Path())
	}
	return ah
}

// udMessage fills b's first n bytes with datagram tag's contents (the
// tag in its first 8 bytes when they fit).
func udMessage(b []byte, tag uint64, n int) {
	fill(b[:n], tag)
	if n >= 8 {
		binary.LittleEndian.PutUint64(b, tag)
	}
}

// received collects the receives of e until none came for wait, or until
// want arrived, and counts them by tag; each is checked: success, GRH
// set, src_qp, the GRH's GIDs, its bytes those udMessage wrote for one of
// the tags sent (udSize long), the immediate.
func (e *udEnd) received(t *testing.T, from *udEnd, want int, wait time.Duration, sent []uint64) map[uint64]int {
	t.Helper()
	got := map[uint64]int{}
	wc := make([]vrdma.WorkCompletion, 64)
	total := 0
	last := time.Now()
	for total < want && time.Since(last) < wait {
		n, err := e.rcq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		last = time.Now()
		for _, w := range wc[:n] {
			total++
			if w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCRecv || w.Flags&vrdma.WCGRH == 0 || w.SrcQP != from.qp.QPN() || w.QPNum != e.qp.QPN() {
				t.Fatalf("receive %s: want SUCCESS RECV with GRH from QP 0x%x at QP 0x%x", fmtWC(w), from.qp.QPN(), e.qp.QPN())
			}
			b := e.buf.Bytes()[int(w.WRID)*e.slot:][:w.ByteLen]
			g, err := vrdma.ParseGRH(b)
			if err != nil || g.SGID != from.ad.GID() || g.DGID != e.ad.GID() {
				t.Fatalf("receive %s: GRH %+v (%v), want SGID %s DGID %s", fmtWC(w), g, err, from.ad.GID(), e.ad.GID())
			}
			msg := b[vrdma.GRHSize:]
			tag, ok := udTag(msg, sent, w)
			if !ok {
				t.Fatalf("receive %s: a %d-byte message of no datagram sent (corrupt)", fmtWC(w), len(msg))
			}
			exp := make([]byte, len(msg))
			udMessage(exp, tag, len(msg))
			expectBytes(t, fmt.Sprintf("datagram 0x%x", tag), msg, exp)
			if withImm := tag%2 == 1; (w.Flags&vrdma.WCWithImm != 0) != withImm || withImm && w.Imm != uint32(tag) {
				t.Fatalf("receive %s of datagram 0x%x: immediate wrong", fmtWC(w), tag)
			}
			got[tag]++
		}
	}
	return got
}

// udTag finds which of the datagrams sent msg is, received with w: the
// one whose size is its length and whose bytes it holds (and whose
// immediate w carries, if any).
func udTag(msg []byte, sent []uint64, w vrdma.WorkCompletion) (uint64, bool) {
	for _, tag := range sent {
		if udSize(tag) == len(msg) && (w.Flags&vrdma.WCWithImm == 0 || w.Imm == uint32(tag)) {
			exp := make([]byte, len(msg))
			udMessage(exp, tag, len(msg))
			if string(exp) == string(msg) {
				return tag, true
			}
		}
	}
	return 0, false
}

// udSizes are the case's message sizes: empty, short, up to the MTU.
var udSizes = []int{0, 1, 7, 8, 100, 513, 1000, 1024}

func udSize(tag uint64) int { return udSizes[(tag>>1)%uint64(len(udSizes))] }

func testUD(t *testing.T, s *suite) {
	const mtu, per = 1024, 48
	vms := s.env.OpenVMs(t, 3)
	a := newUDEnd(t, vms[0], 16, mtu)
	b := newUDEnd(t, vms[1], 2*per, mtu)
	c := newUDEnd(t, vms[2], 2*per, mtu)
	b.post(t, 0, 2*per)
	c.post(t, 0, 2*per)
	toB, toC := a.ah(t, s, b), a.ah(t, s, c)
	wait := waitTimeout
	if s.lossy() {
		wait = 300 * time.Millisecond // what is lost never comes
	}

	t.Run("many-peers", func(t *testing.T) {
		// One UD QP sends to two peers through two address handles, SEND
		// and SEND with immediate, every size up to the MTU.
		sent := map[*udEnd][]uint64{}
		for i := range 2 * per {
			dst, ah := b, toB
			if i%2 == 1 {
				dst, ah = c, toC
			}
			tag := uint64(dst.qp.QPN())<<20 | uint64(i)
			sent[dst] = append(sent[dst], tag)
			udMessage(a.src(), tag, udSize(tag))
			wr := vrdma.SendWR{ID: tag, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled | vrdma.SendInline, SGL: sgl(a.srcSGE(udSize(tag))),
				AH: ah, RemoteQPN: dst.qp.QPN(), RemoteQKey: udQKey}
			if tag%2 == 1 {
				wr.Opcode, wr.Imm = vrdma.OpSendWithImm, uint32(tag)
			}
			if udSize(tag) > int(a.qp.Caps().MaxInlineData) {
				wr.Flags &^= vrdma.SendInline
			}
			postSend(t, a.qp, wr)
			// UD completes when the datagram has left: the buffer is free again.
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, tag, vrdma.WCSuccess, vrdma.WCSend)
		}
		for _, dst := range []*udEnd{b, c} {
			got := dst.received(t, a, per, wait, sent[dst])
			n := 0
			for tag, k := range got {
				n += k
				// Short messages of one size are alike: only longer ones tell duplicates.
				if k > 1 && udSize(tag) >= 8 && !s.lossy() {
					t.Fatalf("datagram 0x%x received %d times", tag, k)
				}
			}
			if !s.lossy() && n != per {
				t.Fatalf("QP 0x%x received %d of %d datagrams on a lossless path", dst.qp.QPN(), n, per)
			}
			t.Logf("QP 0x%x received %d of %d datagrams, each whole", dst.qp.QPN(), n, per)
		}
	})

	t.Run("reply", func(t *testing.T) {
		// The receiver answers through an address handle made from the
		// completion and GRH of what it received (ibv_create_ah_from_wc).
		a.post(t, 0, a.n)
		tag := uint64(1)<<40 | 2
		var w vrdma.WorkCompletion
		for try := 0; ; try++ {
			udMessage(a.src(), tag, udSize(tag))
			postSend(t, a.qp, vrdma.SendWR{ID: tag, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(a.srcSGE(udSize(tag))),
				AH: toB, RemoteQPN: b.qp.QPN(), RemoteQKey: udQKey})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, tag, vrdma.WCSuccess, vrdma.WCSend)
			var ok bool
			if w, ok = pollWithin(t, b.rcq, wait); ok {
				break
			}
			if !s.lossy() || try > 20 {
				t.Fatal("no datagram reached B")
			}
		}
		back, err := b.pd.CreateAHFromWC(opCtx(t), &w, b.buf.Bytes()[int(w.WRID)*b.slot:][:vrdma.GRHSize])
		if err != nil {
			t.Fatal(err)
		}
		defer back.Destroy(opCtx(t))
		if p := back.Path(); p.Path != s.env.Path() {
			t.Errorf("address handle from the completion takes %q, want %q", p.Path, s.env.Path())
		}
		rtag := uint64(2)<<40 | 5
		for try := 0; ; try++ {
			udMessage(b.src(), rtag, udSize(rtag))
			postSend(t, b.qp, vrdma.SendWR{ID: rtag, Opcode: vrdma.OpSendWithImm, Imm: uint32(rtag), Flags: vrdma.SendSignaled,
				SGL: sgl(b.srcSGE(udSize(rtag))), AH: back, RemoteQPN: w.SrcQP, RemoteQKey: udQKey})
			expectWC(t, waitWC(t, b.scq, 1)[0], b.qp, rtag, vrdma.WCSuccess, vrdma.WCSend)
			if got := a.received(t, b, 1, wait, []uint64{rtag}); got[rtag] >= 1 {
				return
			}
			if !s.lossy() || try > 20 {
				t.Fatalf("A did not receive the reply 0x%x", rtag)
			}
		}
	})

	t.Run("srq", func(t *testing.T) {
		// A UD QP created on a shared receive queue takes its receives
		// from it.
		ctx := opCtx(t)
		srq, err := b.pd.CreateSRQ(ctx, vrdma.SRQAttr{MaxWR: 8, MaxSGE: 1})
		if err != nil {
			t.Fatal(err)
		}
		rcq, err := b.ad.CreateCQ(ctx, 64) // its own: late datagrams of B's other QP (lossy paths) land in b.rcq
		if err != nil {
			t.Fatal(err)
		}
		qp, err := b.pd.CreateQP(ctx, vrdma.QPInitAttr{Type: vrdma.QPTypeUD, SendCQ: b.scq, RecvCQ: rcq, SRQ: srq, Caps: defaultCaps})
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.ReadyUD(ctx, udQKey); err != nil {
			t.Fatal(err)
		}
		const k = 4
		rb := b.mr(t, k*b.slot, vrdma.AccessLocalWrite)
		for i := range k {
			if err := srq.PostRecv([]vrdma.RecvWR{{ID: uint64(1000 + i), SGL: sgl(rb.SGE(i*b.slot, b.slot))}}); err != nil {
				t.Fatal(err)
			}
		}
		var tags []uint64
		for i := range k {
			tag := uint64(4)<<40 | uint64(8+2*i) // no immediate; 100, 513, 1000 and 1024 bytes
			tags = append(tags, tag)
			udMessage(a.src(), tag, udSize(tag))
			postSend(t, a.qp, vrdma.SendWR{ID: tag, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(a.srcSGE(udSize(tag))),
				AH: toB, RemoteQPN: qp.QPN(), RemoteQKey: udQKey})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, tag, vrdma.WCSuccess, vrdma.WCSend)
		}
		got := 0
		for got < k {
			w, ok := pollWithin(t, rcq, wait)
			if !ok {
				break
			}
			if w.Status != vrdma.WCSuccess || w.QPNum != qp.QPN() || w.SrcQP != a.qp.QPN() || w.Flags&vrdma.WCGRH == 0 || w.WRID < 1000 || w.WRID >= 1000+k {
				t.Fatalf("receive %s: want SUCCESS with GRH at QP 0x%x from 0x%x, from the SRQ", fmtWC(w), qp.QPN(), a.qp.QPN())
			}
			msg := rb.Bytes()[int(w.WRID-1000)*b.slot:][vrdma.GRHSize:w.ByteLen]
			tag, ok := udTag(msg, tags, w)
			if !ok {
				t.Fatalf("receive %s: %d bytes of no datagram sent", fmtWC(w), len(msg))
			}
			exp := make([]byte, len(msg))
			udMessage(exp, tag, len(msg))
			expectBytes(t, fmt.Sprintf("datagram 0x%x", tag), msg, exp)
			got++
		}
		if got != k && !s.lossy() {
			t.Fatalf("the UD QP on the SRQ received %d of %d datagrams", got, k)
		}
	})

	t.Run("drops", func(t *testing.T) {
		// Another Q_Key, a QPN that is no UD QP of the destination: the
		// datagrams are dropped there, silently; the sender completes
		// them. A remote Q_Key with the privileged bit uses the QP's own.
		// A receiver of its own: on a lossy path a late datagram of the
		// cases above may still reach C's QP.
		c := newUDEnd(t, vms[2], 8, mtu)
		c.post(t, 0, 8)
		toC := a.ah(t, s, c)
		bad := []vrdma.SendWR{
			{ID: 1, RemoteQPN: c.qp.QPN(), RemoteQKey: udQKey + 1},
			{ID: 2, RemoteQPN: c.qp.QPN() ^ 0x5a5a5, RemoteQKey: udQKey},
			{ID: 3, RemoteQPN: a.qp.QPN(), RemoteQKey: udQKey}, // a's QPN, through the AH to c's adapter
		}
		for _, wr := range bad {
			wr.Opcode, wr.Flags, wr.AH, wr.SGL = vrdma.OpSend, vrdma.SendSignaled|vrdma.SendInline, toC, sgl(a.srcSGE(16))
			postSend(t, a.qp, wr)
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, wr.ID, vrdma.WCSuccess, vrdma.WCSend)
		}
		expectNoWC(t, c.rcq, 3*quiet, "datagrams with another Q_Key or QPN")
		// Only the first names c's QP, which counts it; on a lossy path
		// the wire may lose or hold it, so it goes again until counted.
		for try := 0; s.qpCounters(t, c.end).RequestsDropped == 0; try++ {
			if !s.lossy() || try > 20 {
				t.Fatalf("QP 0x%x counted no dropped datagram", c.qp.QPN())
			}
			wr := bad[0]
			wr.Opcode, wr.Flags, wr.AH, wr.SGL = vrdma.OpSend, vrdma.SendSignaled|vrdma.SendInline, toC, sgl(a.srcSGE(16))
			postSend(t, a.qp, wr)
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, wr.ID, vrdma.WCSuccess, vrdma.WCSend)
			expectNoWC(t, c.rcq, quiet, "a datagram with another Q_Key")
		}
		tag := uint64(3)<<40 | 6
		udMessage(a.src(), tag, udSize(tag))
		for try := 0; ; try++ {
			postSend(t, a.qp, vrdma.SendWR{ID: tag, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(a.srcSGE(udSize(tag))),
				AH: toC, RemoteQPN: c.qp.QPN(), RemoteQKey: vrdma.PrivilegedQKey | 0x1234})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, tag, vrdma.WCSuccess, vrdma.WCSend)
			if got := c.received(t, a, 1, wait, []uint64{tag}); got[tag] >= 1 {
				break
			} else if !s.lossy() || try > 20 {
				t.Fatalf("a datagram with the privileged Q_Key bit (the QP's own Q_Key) did not arrive: %v", got)
			}
		}
	})

	t.Run("destroy-after-post", func(t *testing.T) {
		// Datagrams posted unsignaled right before the QP's destroy
		// leave, as an HCA has sent them by then: mckey's sender posts
		// its datagrams and exits at once. The destroy goes to the agent
		// while the datagrams still wait in the send queue.
		const n = 64
		d := newUDEnd(t, vms[0], n, mtu) // its receive slots hold the datagrams to send
		r := newUDEnd(t, vms[1], n, mtu)
		r.post(t, 0, n)
		toR := d.ah(t, s, r)
		sent := make([]uint64, n)
		wrs := make([]vrdma.SendWR, n)
		for i := range wrs {
			sent[i] = uint64(5)<<40 | uint64(i)<<1 // even: no immediate
			udMessage(d.buf.Bytes()[i*d.slot:], sent[i], udSize(sent[i]))
			wrs[i] = vrdma.SendWR{ID: sent[i], Opcode: vrdma.OpSend, SGL: sgl(d.buf.SGE(i*d.slot, udSize(sent[i]))),
				AH: toR, RemoteQPN: r.qp.QPN(), RemoteQKey: udQKey}
		}
		postSend(t, d.qp, wrs...)
		if err := d.qp.Destroy(opCtx(t)); err != nil {
			t.Fatal(err)
		}
		got := r.received(t, d, n, wait, sent)
		total := 0
		for _, k := range got {
			total += k
		}
		if !s.lossy() && total != n {
			t.Fatalf("%d of %d datagrams posted before the QP's destroy arrived", total, n)
		}
		t.Logf("%d of %d datagrams posted before the QP's destroy arrived", total, n)
	})

	t.Run("errors", func(t *testing.T) {
		// Longer than the active MTU (UD's max_msg_sz): LOC_LEN_ERR, and
		// the QP in ERR. RDMA WRITE on a UD QP: refused at post.
		pa, err := vms[0].Adapters()[0].QueryPort(opCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		active := int(pa.ActiveMTU)
		e := newUDEnd(t, vms[0], 1, 2*active)
		ah := e.ah(t, s, b)
		err = e.qp.PostSend([]vrdma.SendWR{{ID: 9, Opcode: vrdma.OpRDMAWrite, AH: ah, RemoteQPN: b.qp.QPN(), SGL: sgl(e.srcSGE(8))}})
		if !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("RDMA WRITE on a UD QP: %v, want ErrInvalid", err)
		}
		if err := e.qp.PostSend([]vrdma.SendWR{{ID: 9, Opcode: vrdma.OpSend, RemoteQPN: b.qp.QPN(), SGL: sgl(e.srcSGE(8))}}); !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("a UD SEND without an address handle: %v, want ErrInvalid", err)
		}
		postSend(t, e.qp, vrdma.SendWR{ID: 10, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(e.srcSGE(active + 1)),
			AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: udQKey})
		expectWC(t, waitWC(t, e.scq, 1)[0], e.qp, 10, vrdma.WCLocLenErr, vrdma.WCSend)
		expectState(t, e.qp, vrdma.QPSErr)
		if err := ah.Destroy(opCtx(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// pollWithin returns the next completion of cq, if one comes within d.
func pollWithin(t *testing.T, cq *vrdma.CQ, d time.Duration) (vrdma.WorkCompletion, bool) {
	t.Helper()
	wc := make([]vrdma.WorkCompletion, 1)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(200 * time.Microsecond) {
		n, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0], true
		}
	}
	return vrdma.WorkCompletion{}, false
}

// TestMiddlewareUDMixedPaths: one UD QP talks to three peers at once, each
// on another path — a VM of its own host (memcpy), one of a host with a
// software RoCE uplink (rdma) and one of a host without (tcp): it sends to
// all three through three address handles, and then receives from all
// three sending at once; every datagram arrives whole, from the QP and
// GID it names.
func TestMiddlewareUDMixedPaths(t *testing.T) {
	const per, mtu = 50, 1024
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 3, RDMA: true, NoRDMA: []int{2}, Netns: testenv.NetnsOff})
	b := newUDEnd(t, c.Hosts[1].Open(t, "udB", testenv.VMOptions{MemMB: 64}), 3*per, mtu)
	b.post(t, 0, 3*per)
	want := []vrdma.PathKind{vrdma.PathMemcpy, vrdma.PathRDMA, vrdma.PathTCP}
	var as []*udEnd
	var toA, toB []*vrdma.AH
	for i, h := range []int{1, 0, 2} {
		a := newUDEnd(t, c.Hosts[h].Open(t, fmt.Sprintf("udA%d", i), testenv.VMOptions{MemMB: 64}), per, mtu)
		a.post(t, 0, per)
		for _, x := range []struct {
			from, to *udEnd
			list     *[]*vrdma.AH
		}{{b, a, &toA}, {a, b, &toB}} {
			ah, err := x.from.pd.CreateAH(opCtx(t), vrdma.AHAttr{DGID: x.to.ad.GID()})
			if err != nil {
				t.Fatal(err)
			}
			if p := ah.Path(); p.Path != want[i] {
				t.Fatalf("address handle %s → %s takes %q (%s), want %q", x.from.ad.GID(), x.to.ad.GID(), p.Path, p.Reason, want[i])
			}
			*x.list = append(*x.list, ah)
		}
		as = append(as, a)
	}
	tagOf := func(sender, i, k int) uint64 { return uint64(sender)<<32 | uint64(i)<<16 | uint64(k) }
	send := func(from *udEnd, ah *vrdma.AH, to *udEnd, tag uint64) error {
		n := udSize(tag)
		udMessage(from.src(), tag, n)
		wr := vrdma.SendWR{ID: tag, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(from.srcSGE(n)), AH: ah,
			RemoteQPN: to.qp.QPN(), RemoteQKey: udQKey}
		if tag%2 == 1 {
			wr.Opcode, wr.Imm = vrdma.OpSendWithImm, uint32(tag)
		}
		if err := from.qp.PostSend([]vrdma.SendWR{wr}); err != nil {
			return err
		}
		w, err := pollN(t.Context(), from.scq, 1)
		if err != nil || w[0].Status != vrdma.WCSuccess || w[0].WRID != tag {
			return fmt.Errorf("send 0x%x: %v %s", tag, err, fmtWCs(w))
		}
		return nil
	}
	// B to the three, interleaved.
	sent := make([][]uint64, len(as))
	for k := range per {
		for i, a := range as {
			tag := tagOf(9, i, k)
			sent[i] = append(sent[i], tag)
			if err := send(b, toA[i], a, tag); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, a := range as {
		n := 0
		for _, k := range a.received(t, b, per, waitTimeout, sent[i]) {
			n += k
		}
		if n != per {
			t.Fatalf("peer %d (%s) received %d of %d datagrams", i, want[i], n, per)
		}
	}
	// The three to B at once.
	errs := make(chan error, len(as))
	for i, a := range as {
		go func() {
			for k := range per {
				if err := send(a, toB[i], b, tagOf(i, 0, k)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range as {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	wc := waitWC(t, b.rcq, len(as)*per)
	got := make([]int, len(as))
	for _, w := range wc {
		i := -1
		for k, a := range as {
			if a.qp.QPN() == w.SrcQP {
				i = k
			}
		}
		if i < 0 || w.Status != vrdma.WCSuccess || w.Flags&vrdma.WCGRH == 0 {
			t.Fatalf("B's receive %s: from no peer, or failed", fmtWC(w))
		}
		buf := b.buf.Bytes()[int(w.WRID)*b.slot:][:w.ByteLen]
		if g, err := vrdma.ParseGRH(buf); err != nil || g.SGID != as[i].ad.GID() || g.DGID != b.ad.GID() {
			t.Fatalf("B's receive %s from peer %d: GRH %+v (%v)", fmtWC(w), i, g, err)
		}
		var tags []uint64
		for k := range per {
			tags = append(tags, tagOf(i, 0, k))
		}
		msg := buf[vrdma.GRHSize:]
		tag, ok := udTag(msg, tags, w)
		if !ok {
			t.Fatalf("B's receive %s from peer %d (%s): %d bytes of no datagram it sent", fmtWC(w), i, want[i], len(msg))
		}
		exp := make([]byte, len(msg))
		udMessage(exp, tag, len(msg))
		expectBytes(t, fmt.Sprintf("datagram 0x%x from peer %d", tag, i), msg, exp)
		got[i]++
	}
	t.Logf("B received %v datagrams from its peers on %v", got, want)
}
