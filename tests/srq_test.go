// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Shared receive queues on every path (the conformance case "srq"), and a
// workload that writes garbage into an SRQ's ring (TestMiddlewareSRQHostile).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/testlink"
)

// srqSide is one VM's side of an SRQ case: a PD, one SRQ, one receive CQ
// and QPs that all take their receives from the SRQ, each with a send CQ
// of its own (ends, for the suite's connect).
type srqSide struct {
	pd   *vrdma.PD
	srq  *vrdma.SRQ
	rcq  *vrdma.CQ
	ends []*end
	buf  *vrdma.MR // receive buffers: slot i at i*srqSlot
}

const srqSlot = 256

// newSRQSide creates, in a new PD of vm's first adapter, an SRQ of maxWR
// receives and n QPs on it.
func newSRQSide(t *testing.T, vm *vrdma.VM, maxWR uint32, n int) *srqSide {
	t.Helper()
	ctx := opCtx(t)
	ad := vm.Adapters()[0]
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd.CreateSRQ(ctx, vrdma.SRQAttr{MaxWR: maxWR, MaxSGE: 2})
	if err != nil {
		t.Fatal(err)
	}
	if a := srq.Attr(); a.MaxWR < maxWR || a.MaxSGE < 2 {
		t.Fatalf("SRQ attributes %+v, want at least %d WRs and 2 SGEs", a, maxWR)
	}
	rcq, err := ad.CreateCQ(ctx, 512)
	if err != nil {
		t.Fatal(err)
	}
	side := &srqSide{pd: pd, srq: srq, rcq: rcq}
	for range n {
		scq, err := ad.CreateCQ(ctx, 64)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: scq, RecvCQ: rcq, SRQ: srq,
			Caps: vrdma.QPCaps{MaxSendWR: 32, MaxSendSGE: 2, MaxInlineData: 64}})
		if err != nil {
			t.Fatal(err)
		}
		if c := qp.Caps(); c.MaxRecvWR != 0 || c.MaxRecvSGE != 0 {
			t.Fatalf("QP on an SRQ reports receive caps %+v, want 0", c)
		}
		side.ends = append(side.ends, &end{vm: vm, ad: ad, pd: pd, scq: scq, rcq: rcq, qp: qp})
	}
	buf, err := vm.Alloc(int(maxWR) * srqSlot)
	if err != nil {
		t.Fatal(err)
	}
	if side.buf, err = pd.RegMR(ctx, buf, vrdma.AccessAll); err != nil {
		t.Fatal(err)
	}
	return side
}

// post posts receives with wr_ids from..to-1 into the slots of the same
// numbers, each split over two SGEs.
func (s *srqSide) post(t *testing.T, from, to int) {
	t.Helper()
	var wrs []vrdma.RecvWR
	for i := from; i < to; i++ {
		wrs = append(wrs, vrdma.RecvWR{ID: uint64(i), SGL: sgl(s.buf.SGE(i*srqSlot, 100), s.buf.SGE(i*srqSlot+100, srqSlot-100))})
	}
	if err := s.srq.PostRecv(wrs); err != nil {
		t.Fatalf("SRQ.PostRecv: %v", err)
	}
}

// slot is receive slot i of the side's buffer.
func (s *srqSide) slot(i uint64) []byte { return s.buf.Bytes()[i*srqSlot:][:srqSlot] }

// srqPair opens two VMs: in the first n plain QPs, in the second an SRQ
// of maxWR receives with n QPs on it, the i-th QPs connected (with pa and
// pb as in pairWith when p is set, else the suite's way).
func (s *suite) srqPair(t *testing.T, n int, maxWR uint32, p *[2]rcParams) ([]*end, *srqSide) {
	t.Helper()
	vms := s.env.OpenVMs(t, 2)
	b := newSRQSide(t, vms[1], maxWR, n)
	var as []*end
	for i := range n {
		a := newEnd(t, vms[0], qpConfig{})
		if p != nil {
			ctx := opCtx(t)
			if err := modifyToRTS(ctx, a.qp, a.ad, b.ends[i].qp.Endpoint(), p[0]); err != nil {
				t.Fatal(err)
			}
			if err := modifyToRTS(ctx, b.ends[i].qp, b.ends[i].ad, a.qp.Endpoint(), p[1]); err != nil {
				t.Fatal(err)
			}
			s.checkConnected(t, a, b.ends[i])
		} else {
			s.connect(t, a, b.ends[i], connDefault)
		}
		as = append(as, a)
	}
	return as, b
}

// nextAsync waits up to d for the next asynchronous event.
func nextAsync(t *testing.T, ev *vrdma.AsyncEvents, d time.Duration) (vrdma.AsyncEvent, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	e, err := ev.Next(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return e, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return e, true
}

// srqShared connects qps QPs on one SRQ to senders in another VM, which
// send msgs messages each at once (SEND, every fourth with immediate, of
// 1..256 bytes over the receives' two SGEs): every receive is taken once,
// its completion names the QP it came to and its sender, and each QP's
// messages arrive in order with their bytes.
func srqShared(t *testing.T, s *suite, qps, msgs int) {
	t.Helper()
	as, b := s.srqPair(t, qps, uint32(qps*msgs), nil)
	srqTraffic(t, as, b, msgs)
}

// srqTraffic is srqShared's traffic and checks, between senders as and
// the QPs of side b (connected in pairs), b's SRQ holding room for all.
func srqTraffic(t *testing.T, as []*end, b *srqSide, msgs int) {
	t.Helper()
	qps := len(as)
	b.post(t, 0, qps*msgs)
	src := make([]*vrdma.MR, qps)
	for i, a := range as {
		src[i] = a.mr(t, msgs*srqSlot, vrdma.AccessAll)
		fill(src[i].Bytes(), uint64(100+i))
	}
	size := func(k int) int { return 1 + k*37%srqSlot } // 1..256 bytes, across both SGEs
	var wg sync.WaitGroup
	errs := make(chan error, qps)
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range msgs {
				wr := vrdma.SendWR{ID: uint64(k), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src[i].SGE(k*srqSlot, size(k)))}
				if k%4 == 3 {
					wr.Opcode, wr.Imm = vrdma.OpSendWithImm, uint32(i<<8|k)
				}
				if err := a.qp.PostSend([]vrdma.SendWR{wr}); err != nil {
					errs <- err
					return
				}
			}
			wc, err := pollN(t.Context(), a.scq, msgs)
			if err == nil {
				for _, w := range wc {
					if w.Status != vrdma.WCSuccess {
						err = fmt.Errorf("sender %d: %s", i, fmtWC(w))
					}
				}
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wc := waitWC(t, b.rcq, qps*msgs)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	used := map[uint64]bool{}
	next := make([]int, qps) // the next message of each QP: RC keeps each QP's order
	for _, w := range wc {
		i := -1
		for j, e := range b.ends {
			if w.QPNum == e.qp.QPN() {
				i = j
			}
		}
		if i < 0 || w.SrcQP != as[i].qp.QPN() {
			t.Fatalf("completion %s names no QP on the SRQ (or the wrong sender 0x%x)", fmtWC(w), w.SrcQP)
		}
		if used[w.WRID] || w.WRID >= uint64(qps*msgs) {
			t.Fatalf("completion %s: receive %d taken twice or never posted", fmtWC(w), w.WRID)
		}
		used[w.WRID] = true
		k := next[i]
		next[i]++
		expectRecv(t, w, b.ends[i].qp, w.WRID, vrdma.WCRecv, size(k), uint32(i<<8|k), k%4 == 3)
		expectBytes(t, fmt.Sprintf("QP %d's message %d in receive %d", i, k, w.WRID), b.slot(w.WRID)[:size(k)], src[i].Bytes()[k*srqSlot:][:size(k)])
	}
	expectNoWC(t, b.rcq, quiet, "receives beyond the messages")
}

// testSRQ checks shared receive queues: several QPs taking receives from
// one SRQ at once, each completion in the receive CQ naming its QP; RNR
// while the SRQ is empty; the one-shot limit event; a QP in ERR raising
// the last-WQE event without flushing the SRQ; destroy refused while in
// use; posting to a QP on an SRQ refused.
func testSRQ(t *testing.T, s *suite) {
	t.Run("shared", func(t *testing.T) { srqShared(t, s, 3, 16) })

	t.Run("rnr", func(t *testing.T) {
		pa, pb := defaultRC, defaultRC
		pa.rnrRetry, pb.minRNRTimer = 7, 1 // forever, 0.01 ms
		as, b := s.srqPair(t, 1, 16, &[2]rcParams{pa, pb})
		a := as[0]
		src := a.mr(t, 64, vrdma.AccessAll)
		fill(src.Bytes(), 7)
		postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
		// The responder answers the SEND with an RNR NAK (again and
		// again: rnr_retry 7 is forever) until a receive is posted. On
		// the lossy link the SEND itself may be lost and sent again only
		// after the local ACK timeout: wait for the first RNR NAK rather
		// than for a fixed time.
		for deadline := time.Now().Add(10 * time.Second); s.qpCounters(t, b.ends[0]).RNRNaksSent == 0; time.Sleep(quiet / 4) {
			if time.Now().After(deadline) {
				t.Fatalf("responder on an empty SRQ sent no RNR NAK in 10 s: %+v", s.qpCounters(t, b.ends[0]))
			}
		}
		expectNoWC(t, a.scq, quiet, "a SEND to an empty SRQ")
		b.post(t, 0, 1)
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCSend)
		expectRecv(t, waitWC(t, b.rcq, 1)[0], b.ends[0].qp, 0, vrdma.WCRecv, 64, 0, false)
		expectBytes(t, "message", b.slot(0)[:64], src.Bytes())

		pa.rnrRetry = 0
		as, b = s.srqPair(t, 1, 16, &[2]rcParams{pa, pb})
		a = as[0]
		src = a.mr(t, 64, vrdma.AccessAll)
		postSend(t, a.qp, vrdma.SendWR{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 2, vrdma.WCRNRRetryExcErr, 0)
		expectNoWC(t, b.rcq, 0, "responder on an empty SRQ")
	})

	t.Run("limit", func(t *testing.T) {
		as, b := s.srqPair(t, 1, 16, nil)
		a := as[0]
		ctx := opCtx(t)
		ev, err := b.ends[0].ad.OpenAsyncEvents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer ev.Close()
		ev.Watch(b.srq)
		b.post(t, 0, 8)
		if err := b.srq.Modify(ctx, vrdma.SRQAttr{Limit: 4}, vrdma.SRQLimit); err != nil {
			t.Fatal(err)
		}
		if at, err := b.srq.Query(ctx); err != nil || at.Limit != 4 || at.MaxWR < 16 {
			t.Fatalf("Query after arming: %+v, %v; want limit 4", at, err)
		}
		src := a.mr(t, 8, vrdma.AccessAll)
		send := func(n int) {
			t.Helper()
			for k := range n {
				postSend(t, a.qp, vrdma.SendWR{ID: uint64(k), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 8))})
			}
			for _, w := range waitWC(t, a.scq, n) {
				if w.Status != vrdma.WCSuccess {
					t.Fatalf("send: %s", fmtWC(w))
				}
			}
			waitWC(t, b.rcq, n)
		}
		send(4) // 4 left: not below the limit
		if e, ok := nextAsync(t, ev, 3*quiet); ok {
			t.Fatalf("event %+v with 4 receives left and the limit at 4", e)
		}
		send(1) // 3 left
		e, ok := nextAsync(t, ev, waitTimeout)
		if !ok || e.Type != vrdma.EventSRQLimit || e.SRQ != b.srq {
			t.Fatalf("after the SRQ fell below its limit: event %+v (%v), want SRQ_LIMIT_REACHED of the SRQ", e, ok)
		}
		if at, err := b.srq.Query(ctx); err != nil || at.Limit != 0 {
			t.Fatalf("Query after the event: %+v, %v; want limit 0 (disarmed)", at, err)
		}
		send(1) // one-shot: no second event
		if e, ok := nextAsync(t, ev, 3*quiet); ok {
			t.Fatalf("second event %+v without re-arming", e)
		}
		b.post(t, 8, 16) // 10 left
		if err := b.srq.Modify(ctx, vrdma.SRQAttr{Limit: 9}, vrdma.SRQLimit); err != nil {
			t.Fatal(err)
		}
		send(2) // 8 left
		if e, ok := nextAsync(t, ev, waitTimeout); !ok || e.Type != vrdma.EventSRQLimit {
			t.Fatalf("after re-arming: event %+v (%v), want SRQ_LIMIT_REACHED", e, ok)
		}
		// The device does not resize an SRQ, and a limit above its size
		// is refused.
		if err := b.srq.Modify(ctx, vrdma.SRQAttr{MaxWR: 64}, vrdma.SRQMaxWR); !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("resize: %v, want ErrInvalid", err)
		}
		if err := b.srq.Modify(ctx, vrdma.SRQAttr{Limit: 1 << 20}, vrdma.SRQLimit); !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("limit above max_wr: %v, want ErrInvalid", err)
		}
	})

	t.Run("last-wqe", func(t *testing.T) {
		as, b := s.srqPair(t, 2, 16, nil)
		ctx := opCtx(t)
		ev, err := b.ends[0].ad.OpenAsyncEvents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer ev.Close()
		b.post(t, 0, 4)
		if err := b.ends[0].qp.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSErr}, vrdma.MaskState); err != nil {
			t.Fatal(err)
		}
		e, ok := nextAsync(t, ev, waitTimeout)
		if !ok || e.Type != vrdma.EventQPLastWQE || e.QPN != b.ends[0].qp.QPN() {
			t.Fatalf("after moving a QP on the SRQ to ERR: event %+v (%v), want QP_LAST_WQE_REACHED of QP 0x%x", e, ok, b.ends[0].qp.QPN())
		}
		// The SRQ's receives are not the QP's: none is flushed, and the
		// other QP takes them.
		expectNoWC(t, b.rcq, 3*quiet, "receives of the SRQ after one of its QPs entered ERR")
		a := as[1]
		src := a.mr(t, 32, vrdma.AccessAll)
		fill(src.Bytes(), 3)
		postSend(t, a.qp, vrdma.SendWR{ID: 5, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 32))})
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 5, vrdma.WCSuccess, vrdma.WCSend)
		w := waitWC(t, b.rcq, 1)[0]
		expectRecv(t, w, b.ends[1].qp, 0, vrdma.WCRecv, 32, 0, false)
		expectBytes(t, "message", b.slot(0)[:32], src.Bytes())
	})

	t.Run("destroy", func(t *testing.T) {
		vms := s.env.OpenVMs(t, 1)
		b := newSRQSide(t, vms[0], 16, 2)
		ctx := opCtx(t)
		b.post(t, 0, 4)
		if err := b.ends[0].qp.PostRecv([]vrdma.RecvWR{{ID: 1, SGL: sgl(b.buf.SGE(0, 8))}}); !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("PostRecv on a QP on an SRQ: %v, want ErrInvalid", err)
		}
		for i, e := range b.ends {
			if err := b.srq.Destroy(ctx); !errors.Is(err, vrdma.ErrState) {
				t.Fatalf("Destroy of an SRQ %d QPs use: %v, want ErrState (EBUSY)", len(b.ends)-i, err)
			}
			if err := e.qp.Destroy(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// The receives still posted go without completions.
		if err := b.srq.Destroy(ctx); err != nil {
			t.Fatalf("Destroy of an unused SRQ: %v", err)
		}
		expectNoWC(t, b.rcq, quiet, "an SRQ's receives after its destroy")
	})
}

// TestMiddlewareSRQHostile: a workload that writes garbage into its SRQ's
// ring. The agent checks the SRQ tail it reads as it checks an RQ tail:
// an invalid one (not an index of the ring, or more than the ring's size
// ahead of the agent's head) is never used — the QP whose message needed
// a receive fails it (the sender gets REM_OP_ERR, the QP moves to ERR),
// logged once — and the SRQ works again once the tail is good; the head
// word, the agent's, is ignored when the workload overwrites it;
// malformed WQEs complete with the status hardware gives, in the
// receiving QP's CQ; the ring's memfd cannot be resized.
func TestMiddlewareSRQHostile(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tg := lcNewSide(t, ctx, env.Open(t, "target", testenv.VMOptions{}))
	env.Define(t, "hostile", testenv.VMOptions{MemMB: 4})
	h := lcAttachHostile(t, env.Socket, "hostile")
	gid := h.att.Adapters[0].GID
	cq := h.newCQ(64)
	lkey := h.mr.LKey

	var rep abi.CreateSRQReply
	fds := h.r.must(abi.OpCreateSRQ, &abi.CreateSRQ{PD: h.pd, Attr: abi.SRQAttr{MaxWR: 8, MaxSGE: 2}}, &rep)
	if len(fds) != 1 {
		t.Fatalf("create-srq sent %d descriptors, want 1", len(fds))
	}
	l := rep.Layout
	ring, err := sys.Map(fds[0], int(l.Size), false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ring.Unmap(); sys.CloseFD(fds[0]) })
	for _, size := range []int64{0, 4096, 1 << 30} {
		if err := unix.Ftruncate(fds[0], size); !errors.Is(err, unix.EPERM) {
			t.Errorf("ftruncate of the SRQ ring's memfd to %d: %v, want EPERM (sealed)", size, err)
		}
	}
	word := func(off int) *atomic.Uint32 { return abi.Word(ring.Bytes(), off) }
	var tail uint32
	postSRQ := func(fill func(slot []byte)) {
		slot := ring.Bytes()[l.Offset+abi.Slot(tail, l.Entries)*l.Stride:][:l.Stride]
		clear(slot)
		fill(slot)
		tail = abi.Next(tail, l.Entries)
		word(abi.OffSRQTail).Store(tail)
	}
	sge := func(addr uint64, n, key uint32) abi.SGE { return abi.SGE{Addr: addr, Length: n, LKey: key} }
	recv := func(id uint64, sges ...abi.SGE) func([]byte) {
		w := abi.RecvWQE{WRID: id, NumSGE: uint8(len(sges))}
		copy(w.SGE[:], sges)
		return func(s []byte) { abi.EncodeRecv(s, &w) }
	}
	// pair returns a hostile QP on the SRQ in RTS, connected to a new
	// target QP.
	pair := func() (*lcRawQP, *vrdma.QP) {
		t.Helper()
		var qr abi.CreateQPReply
		fds := h.r.must(abi.OpCreateQP, &abi.CreateQP{PD: h.pd, SendCQ: cq.handle, RecvCQ: cq.handle, Type: abi.QPTypeRC, SQSigAll: true,
			SRQ: rep.Handle, Caps: abi.QPCaps{MaxSendWR: 8, MaxSendSGE: 2}}, &qr)
		q := &lcRawQP{h: h, handle: qr.Handle, qpn: qr.QPN, caps: qr.Caps, layout: qr.Layout, fd: fds[0]}
		if q.ring, err = sys.Map(fds[0], int(qr.Layout.Size), false); err != nil {
			t.Fatal(err)
		}
		if q.db, err = sys.BellFrom(fds[1]); err != nil {
			t.Fatal(err)
		}
		h.undo = append(h.undo, func() { q.ring.Unmap(); q.db.Close(); sys.CloseFD(q.fd) })
		tq := tg.newQP(t, ctx)
		q.connect(tg.vm.Adapters()[0].GID(), tq.QPN())
		if err := tq.ConnectTo(ctx, vrdma.Endpoint{GID: gid, QPN: q.qpn}); err != nil {
			t.Fatal(err)
		}
		return q, tq
	}
	var nextID uint64 = 0x100
	// sendFrom sends n bytes from the target QP tq and returns its
	// completion.
	sendFrom := func(tq *vrdma.QP, n uint32) vrdma.WorkCompletion {
		t.Helper()
		nextID++
		if err := tq.PostSend([]vrdma.SendWR{{ID: nextID, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{tg.mr.SGE(0, int(n))}}}); err != nil {
			t.Fatal(err)
		}
		return lcWaitWR(t, ctx, tg.cq, nextID)
	}
	expectRecvCQE := func(what string, q *lcRawQP, id uint64, st abi.WCStatus) {
		t.Helper()
		if e := cq.next(t); e.WRID != id || e.Status != st || e.QPNum != q.qpn {
			t.Errorf("%s: completion %+v (%s), want wr_id 0x%x %s on QP 0x%x", what, e, e.Status, id, st, q.qpn)
		}
	}

	// Well-formed: the receive completes in the QP's CQ.
	q, tq := pair()
	postSRQ(recv(0xa1, sge(lcMRAddr, 64, lkey)))
	if c := sendFrom(tq, 8); c.Status != vrdma.WCSuccess {
		t.Fatalf("SEND to a QP on a good SRQ: %+v", c)
	}
	expectRecvCQE("good receive", q, 0xa1, abi.WCSuccess)

	// The head word is the agent's: garbage there changes nothing.
	word(abi.OffSRQHead).Store(0xdeadbeef)
	postSRQ(recv(0xa2, sge(lcMRAddr, 64, lkey)))
	if c := sendFrom(tq, 8); c.Status != vrdma.WCSuccess {
		t.Fatalf("SEND after garbage in the SRQ head word: %+v", c)
	}
	expectRecvCQE("receive after a garbage head word", q, 0xa2, abi.WCSuccess)

	// Garbage tails: not an index, and an index more than the ring's size
	// ahead. Every QP that needs a receive fails; the agent logs it once.
	for _, badOf := range []func() uint32{
		func() uint32 { return 0x80000001 },
		func() uint32 { return (tail + l.Entries + 1) & (2*l.Entries - 1) }, // an index, 9 ahead of the head
	} {
		bad := badOf()
		for range 2 {
			q, tq := pair()
			word(abi.OffSRQTail).Store(bad)
			if c := sendFrom(tq, 8); c.Status != vrdma.WCRemOpErr {
				t.Errorf("SEND to a QP whose SRQ tail is 0x%x: %+v, want REM_OP_ERR", bad, c)
			}
			q.waitState(t, abi.QPSErr)
		}
		word(abi.OffSRQTail).Store(tail)
		q, tq := pair()
		postSRQ(recv(0xa3, sge(lcMRAddr, 64, lkey)))
		if c := sendFrom(tq, 8); c.Status != vrdma.WCSuccess {
			t.Fatalf("SEND once the SRQ tail is good again: %+v", c)
		}
		expectRecvCQE("receive once the tail is good", q, 0xa3, abi.WCSuccess)
	}
	n := 0
	for _, line := range env.Logs(slog.LevelWarn) {
		if strings.Contains(line, "shared receive queue tail index is invalid") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("the two garbage SRQ tails were logged %d times, want once each", n)
	}

	// Malformed receive WQEs: each is consumed and completes with its
	// status on the receiving QP; the sender gets an error NAK.
	for _, c := range []struct {
		name   string
		fill   func([]byte)
		id     uint64
		want   abi.WCStatus
		sender vrdma.WCStatus
	}{
		{"receive with 200 SGEs", func(s []byte) { binary.LittleEndian.PutUint64(s, 0xb1); s[8] = 200 }, 0xb1, abi.WCLocLenErr, vrdma.WCRemOpErr},
		{"receive with a bad lkey", recv(0xb2, sge(lcMRAddr, 64, 0x12345678)), 0xb2, abi.WCLocProtErr, vrdma.WCRemOpErr},
		{"receive outside memory", recv(0xb3, sge(1<<62, 64, lkey)), 0xb3, abi.WCLocProtErr, vrdma.WCRemOpErr},
		{"receive too small", recv(0xb4, sge(lcMRAddr, 4, lkey)), 0xb4, abi.WCLocLenErr, vrdma.WCRemInvReqErr},
	} {
		q, tq := pair()
		postSRQ(c.fill)
		if got := sendFrom(tq, 8); got.Status != c.sender {
			t.Errorf("%s: sender's completion %+v, want %s", c.name, got, c.sender)
		}
		expectRecvCQE(c.name, q, c.id, c.want)
		q.waitState(t, abi.QPSErr)
	}
	// The SRQ still serves a good QP after all that.
	q, tq = pair()
	postSRQ(recv(0xc1, sge(lcMRAddr, 64, lkey)))
	if c := sendFrom(tq, 8); c.Status != vrdma.WCSuccess {
		t.Fatalf("SEND after the malformed receives: %+v", c)
	}
	expectRecvCQE("receive after the malformed ones", q, 0xc1, abi.WCSuccess)
}

// TestMiddlewareSRQStress is the srq case's sharing at scale: 8 QPs on
// one SRQ, 200 messages from each of their senders at once, over memcpy,
// the lossy test link (messages retransmitted, duplicated, reordered) and
// the rdma engine on a loopback socket: no receive is taken twice or
// lost, each completion names its QP, each QP's messages arrive in order
// with their bytes.
func TestMiddlewareSRQStress(t *testing.T) {
	t.Run("memcpy", func(t *testing.T) {
		srqShared(t, &suite{env: &memcpyEnv{env: testenv.Start(t), prefix: "ss"}, how: connOOB}, 8, 200)
	})
	t.Run("lossy", func(t *testing.T) {
		faults := testlink.Faults{Drop: 0.02, Dup: 0.02, Reorder: 0.02, Delay: 0.02, DelayBy: 2 * time.Millisecond, Seed: 21}
		env := testenv.StartWith(t, testenv.Options{TestLink: &faults})
		srqShared(t, &suite{env: &lossyEnv{memcpyEnv{env: env, prefix: "sl"}}, how: connOOB, oob: &lossyRC}, 8, 200)
	})
	t.Run("rdma-loop", func(t *testing.T) {
		env := testenv.StartWith(t, testenv.Options{RDMALoop: netip.MustParseAddrPort("127.0.33.7:4791")})
		srqShared(t, &suite{env: &rdmaLoopEnv{memcpyEnv{env: env, prefix: "sr"}}, how: connOOB}, 8, 200)
	})
}

// TestMiddlewareSRQMixedPaths: one SRQ whose QPs are bound to three paths
// at once — a sender in a VM of the same host (memcpy), one on a host
// with an RDMA uplink (rdma) and one on a host without (tcp) — each
// sending 100 messages at once: the SRQ's one consumer lock serves the
// three responders.
func TestMiddlewareSRQMixedPaths(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 3, RDMA: true, NoRDMA: []int{2}, Netns: testenv.NetnsOff})
	vmB := c.Hosts[1].Open(t, "mxB", testenv.VMOptions{MemMB: 64})
	b := newSRQSide(t, vmB, 512, 3)
	var as []*end
	want := []vrdma.PathKind{vrdma.PathMemcpy, vrdma.PathRDMA, vrdma.PathTCP}
	for i, h := range []int{1, 0, 2} {
		a := newEnd(t, c.Hosts[h].Open(t, fmt.Sprintf("mxA%d", i), testenv.VMOptions{MemMB: 64}), qpConfig{})
		ctx := opCtx(t)
		if err := a.qp.ConnectTo(ctx, b.ends[i].qp.Endpoint()); err != nil {
			t.Fatal(err)
		}
		if err := b.ends[i].qp.ConnectTo(ctx, a.qp.Endpoint()); err != nil {
			t.Fatal(err)
		}
		if p := b.ends[i].qp.Path(); p.Path != want[i] {
			t.Fatalf("QP %d on the SRQ took path %q (%s), want %q", i, p.Path, p.Reason, want[i])
		}
		as = append(as, a)
	}
	srqTraffic(t, as, b, 100)
}
