// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// The conformance cases of ibv_req_notify_cq(cq, 1), ibv_resize_cq and
// ibv_rereg_mr (the Go library's CQ.ReqNotify/WaitEvent, CQ.Resize,
// MR.Rereg), run on every path by TestConformance.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/testenv"
)

// eventWaiter runs cq.WaitEvent in the background; done closes when it
// returns.
type eventWaiter struct {
	done chan struct{}
	err  error
}

// armEvent arms cq (solicited only or not) before it returns, then waits
// for the event in the background.
func armEvent(t *testing.T, cq *vrdma.CQ, solicitedOnly bool) *eventWaiter {
	t.Helper()
	cq.ReqNotify(solicitedOnly)
	w := &eventWaiter{done: make(chan struct{})}
	ctx := opCtx(t)
	go func() {
		defer close(w.done)
		w.err = cq.WaitEvent(ctx)
	}()
	return w
}

// fired reports whether the event came within d.
func (w *eventWaiter) fired(t *testing.T, d time.Duration) bool {
	t.Helper()
	select {
	case <-w.done:
		if w.err != nil {
			t.Fatalf("WaitEvent: %v", w.err)
		}
		return true
	case <-time.After(d):
		return false
	}
}

// spinWC polls cq for one completion without arming it.
func spinWC(t *testing.T, cq *vrdma.CQ) vrdma.WorkCompletion {
	t.Helper()
	w, ok := pollWithin(t, cq, waitTimeout)
	if !ok {
		t.Fatal("no completion")
	}
	return w
}

// testSolicited: a CQ armed for solicited completions wakes for the
// receive of a message sent with SOLICITED (SEND, SEND with immediate,
// WRITE with immediate), or for an error, and for nothing else. It polls
// without CQ.Wait, which would arm the CQ for every completion.
func testSolicited(t *testing.T, s *suite) {
	a, b := s.pair(t, pairConfig{})
	src := a.mr(t, 4096, vrdma.AccessAll)
	dst := b.mr(t, 4096, vrdma.AccessAll)
	fill(src.Bytes(), 3)
	for i := range 16 {
		postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(100 + i), SGL: sgl(dst.SGE(0, 4096))})
	}
	id, used := uint64(0), 0 // WRs posted; receives used
	send := func(op vrdma.Opcode, flags vrdma.SendFlags, n int) uint64 {
		id++
		used++
		wr := vrdma.SendWR{ID: id, Opcode: op, Flags: vrdma.SendSignaled | flags, SGL: sgl(src.SGE(0, n)), Imm: uint32(id)}
		if op == vrdma.OpRDMAWriteWithImm {
			wr.RemoteAddr, wr.RKey = dst.Addr(), dst.RKey()
		}
		postSend(t, a.qp, wr)
		return id
	}

	// Unsolicited messages of every kind that consumes a receive complete
	// without the event; then a solicited one of each kind raises it.
	for _, op := range []vrdma.Opcode{vrdma.OpSend, vrdma.OpSendWithImm, vrdma.OpRDMAWriteWithImm} {
		w := armEvent(t, b.rcq, true)
		for range 3 {
			send(op, 0, 64)
			spinWC(t, a.scq)
			if r := spinWC(t, b.rcq); r.Status != vrdma.WCSuccess {
				t.Fatalf("%s: receive %s", op, fmtWC(r))
			}
		}
		if w.fired(t, 3*quiet) {
			t.Fatalf("%s: a CQ armed for solicited completions woke for unsolicited ones", op)
		}
		sid := send(op, vrdma.SendSolicited, 64)
		if !w.fired(t, waitTimeout) {
			t.Fatalf("%s with SOLICITED: the armed CQ's event never came", op)
		}
		if w := spinWC(t, a.scq); w.WRID != sid || w.Status != vrdma.WCSuccess {
			t.Fatalf("%s: solicited send %s", op, fmtWC(w))
		}
		if r := spinWC(t, b.rcq); r.Status != vrdma.WCSuccess || r.Imm != uint32(sid) && op != vrdma.OpSend {
			t.Fatalf("%s: solicited receive %s", op, fmtWC(r))
		}
	}

	// Armed for every completion, an unsolicited one raises it.
	w := armEvent(t, b.rcq, false)
	send(vrdma.OpSend, 0, 8)
	if !w.fired(t, waitTimeout) {
		t.Fatal("a CQ armed for every completion did not wake for an unsolicited one")
	}
	spinWC(t, a.scq)
	spinWC(t, b.rcq)

	// Send completions never carry the solicited bit: an error does.
	// A SEND larger than the receive fails both sides: the receiver's
	// receive with an error, the sender's SEND with the NAK.
	ws, wr := armEvent(t, a.scq, true), armEvent(t, b.rcq, true)
	send(vrdma.OpSend, 0, 8)
	spinWC(t, a.scq)
	if ws.fired(t, 3*quiet) {
		t.Fatal("a send CQ armed for solicited completions woke for a successful SEND")
	}
	spinWC(t, b.rcq)
	postRecv(t, b.qp, vrdma.RecvWR{ID: 999, SGL: sgl(dst.SGE(0, 16))})
	// The receives posted earlier come first: use them up with
	// unsolicited SENDs the waiters ignore.
	for used < 16 {
		send(vrdma.OpSend, 0, 8)
		spinWC(t, a.scq)
		spinWC(t, b.rcq)
	}
	if wr.fired(t, 0) || ws.fired(t, 0) {
		t.Fatal("a CQ armed for solicited completions woke for successful ones")
	}
	bad := send(vrdma.OpSend, 0, 64) // into the 16-byte receive
	if !wr.fired(t, waitTimeout) {
		t.Fatal("the receiver's CQ armed for solicited completions did not wake for an error completion")
	}
	if r := spinWC(t, b.rcq); r.Status == vrdma.WCSuccess {
		t.Fatalf("receive of a message larger than its buffer: %s", fmtWC(r))
	}
	if !ws.fired(t, waitTimeout) {
		t.Fatal("the sender's CQ armed for solicited completions did not wake for an error completion")
	}
	s.expectNAK(t, spinWC(t, a.scq), a.qp, bad, vrdma.WCRemInvReqErr)
}

func testResizeCQ(t *testing.T, s *suite) {
	a, b := s.pair(t, pairConfig{})
	ctx, cancel := context.WithTimeout(t.Context(), 3*waitTimeout)
	defer cancel()
	src := a.mr(t, 64, vrdma.AccessAll)
	dst := b.mr(t, 64*256, vrdma.AccessAll)
	const n = 240
	for i := range n {
		postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(i), SGL: sgl(dst.SGE(i%256*64, 64))})
	}

	// Shrink and grow while nothing is queued.
	for _, size := range []int{1, 7, 1000, 16} {
		if err := b.rcq.Resize(ctx, size); err != nil {
			t.Fatalf("Resize(%d): %v", size, err)
		}
		if got := b.rcq.Entries(); got < size {
			t.Fatalf("Resize(%d): %d entries", size, got)
		}
	}

	// Completions waiting survive a resize, in order; a size below them
	// is refused and changes nothing.
	for i := range 10 {
		postSend(t, a.qp, vrdma.SendWR{ID: uint64(i), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 8))})
	}
	waitWC(t, a.scq, 10) // each SEND completes after its receive's completion is in b's CQ
	deadline := time.Now().Add(2 * waitTimeout)
	if err := b.rcq.Resize(ctx, 4); !errors.Is(err, vrdma.ErrInvalid) {
		t.Fatalf("Resize(4) with 10 completions waiting: %v, want ErrInvalid", err)
	}
	if err := b.rcq.Resize(ctx, 64); err != nil {
		t.Fatalf("Resize(64) with 10 completions waiting: %v", err)
	}
	next := uint64(0)
	for _, w := range waitWC(t, b.rcq, 10) {
		expectRecv(t, w, b.qp, next, vrdma.WCRecv, 8, 0, false)
		next++
	}

	// A stream of SENDs into the CQ while it is resized up and down
	// under it: every receive completes once, in order.
	sent := make(chan error, 1)
	go func() {
		for i := 10; i < n; i += 32 {
			k := min(32, n-i)
			for j := i; j < i+k; j++ {
				if err := a.qp.PostSend([]vrdma.SendWR{{ID: uint64(j), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 8))}}); err != nil {
					sent <- err
					return
				}
			}
			if _, err := pollN(ctx, a.scq, k); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	sizes := []int{32, 256, 8, 1024, 64}
	wc := make([]vrdma.WorkCompletion, 8)
	for k := 0; next < n; k++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d receives of %d completed before the deadline", next, n)
		}
		if err := b.rcq.Resize(ctx, sizes[k%len(sizes)]); err != nil && !errors.Is(err, vrdma.ErrInvalid) {
			t.Fatalf("Resize(%d): %v", sizes[k%len(sizes)], err)
		}
		m, err := b.rcq.Poll(wc[:1+k%len(wc)])
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range wc[:m] {
			expectRecv(t, w, b.qp, next, vrdma.WCRecv, 8, 0, false)
			next++
		}
	}
	if err := <-sent; err != nil {
		t.Fatalf("the sender: %v", err)
	}
	expectNoWC(t, b.rcq, quiet, "after the stream")
}

func testReregMR(t *testing.T, s *suite) {
	ctx := opCtx(t)
	write := func(a *end, id uint64, src *vrdma.MR, addr uint64, rkey uint32) vrdma.WorkCompletion {
		t.Helper()
		postSend(t, a.qp, vrdma.SendWR{ID: id, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 256)),
			RemoteAddr: addr, RKey: rkey})
		return waitWC(t, a.scq, 1)[0]
	}

	t.Run("keeps-working", func(t *testing.T) {
		a, b := s.pair(t, pairConfig{})
		src := a.mr(t, 256, vrdma.AccessAll)
		fill(src.Bytes(), 5)
		m := b.mr(t, 256, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
		lkey, rkey := m.LKey(), m.RKey()
		expectWC(t, write(a, 1, src, m.Addr(), rkey), a.qp, 1, vrdma.WCSuccess, vrdma.WCRDMAWrite)
		expectBytes(t, "first WRITE", m.Bytes(), src.Bytes())

		// A new translation: the keys stay, WRITEs land in the new buffer.
		old := m.Bytes()
		buf, err := b.vm.Alloc(512)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Rereg(ctx, vrdma.ReregTranslation, nil, buf, 0); err != nil {
			t.Fatal(err)
		}
		if m.LKey() != lkey || m.RKey() != rkey || m.Addr() == 0 || &m.Bytes()[0] != &buf[0] {
			t.Fatalf("after Rereg: keys 0x%x/0x%x (were 0x%x/0x%x), bytes not the new buffer", m.LKey(), m.RKey(), lkey, rkey)
		}
		clear(old)
		fill(src.Bytes(), 6)
		expectWC(t, write(a, 2, src, m.Addr()+256, rkey), a.qp, 2, vrdma.WCSuccess, vrdma.WCRDMAWrite)
		expectBytes(t, "WRITE after the new translation", buf[256:], src.Bytes())
		expectBytes(t, "the old buffer", old, make([]byte, 256))

		// New access (READ now allowed), and a PD there and back.
		if err := m.Rereg(ctx, vrdma.ReregAccess, nil, nil, vrdma.AccessLocalWrite|vrdma.AccessRemoteRead); err != nil {
			t.Fatal(err)
		}
		pd2, err := b.ad.AllocPD(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, pd := range []*vrdma.PD{pd2, b.pd} {
			if err := m.Rereg(ctx, vrdma.ReregPD, pd, nil, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := pd2.Dealloc(ctx); err != nil {
			t.Fatalf("dealloc the PD the region left: %v", err)
		}
		dstl := a.mr(t, 256, vrdma.AccessAll)
		postSend(t, a.qp, vrdma.SendWR{ID: 3, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(dstl.SGE(0, 256)),
			RemoteAddr: m.Addr() + 256, RKey: rkey})
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 3, vrdma.WCSuccess, vrdma.WCRDMARead)
		expectBytes(t, "READ after rereg", dstl.Bytes(), src.Bytes())

		// Refusals change nothing.
		if err := m.Rereg(ctx, 0, nil, nil, 0); !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("Rereg without flags: %v, want ErrInvalid", err)
		}
		if err := m.Rereg(ctx, vrdma.ReregAccess, nil, nil, vrdma.AccessRemoteWrite); !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("Rereg to REMOTE_WRITE without LOCAL_WRITE: %v, want ErrInvalid", err)
		}
		if err := m.Rereg(ctx, vrdma.ReregTranslation, nil, make([]byte, 64), 0); !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("Rereg to memory outside the guest's: %v, want ErrInvalid", err)
		}
		postSend(t, a.qp, vrdma.SendWR{ID: 4, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(dstl.SGE(0, 256)),
			RemoteAddr: m.Addr() + 256, RKey: rkey})
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 4, vrdma.WCSuccess, vrdma.WCRDMARead)
	})

	// Each change that takes a right away fails the next remote access.
	for _, c := range []struct {
		name   string
		change func(t *testing.T, b *end, m *vrdma.MR) (addr uint64)
	}{
		{"old-translation", func(t *testing.T, b *end, m *vrdma.MR) uint64 {
			addr := m.Addr()
			buf, err := b.vm.Alloc(256)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Rereg(ctx, vrdma.ReregTranslation, nil, buf, 0); err != nil {
				t.Fatal(err)
			}
			return addr // the old range: no longer the region's
		}},
		{"other-pd", func(t *testing.T, b *end, m *vrdma.MR) uint64 {
			pd2, err := b.ad.AllocPD(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Rereg(ctx, vrdma.ReregPD, pd2, nil, 0); err != nil {
				t.Fatal(err)
			}
			return m.Addr()
		}},
		{"no-remote-write", func(t *testing.T, b *end, m *vrdma.MR) uint64 {
			if err := m.Rereg(ctx, vrdma.ReregAccess, nil, nil, vrdma.AccessLocalWrite); err != nil {
				t.Fatal(err)
			}
			return m.Addr()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := s.pair(t, pairConfig{})
			src := a.mr(t, 256, vrdma.AccessAll)
			m := b.mr(t, 256, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
			fill(src.Bytes(), 9)
			expectWC(t, write(a, 1, src, m.Addr(), m.RKey()), a.qp, 1, vrdma.WCSuccess, vrdma.WCRDMAWrite)
			before := append([]byte(nil), m.Bytes()...)
			addr := c.change(t, b, m)
			fill(src.Bytes(), 10)
			s.expectNAK(t, write(a, 2, src, addr, m.RKey()), a.qp, 2, vrdma.WCRemAccessErr)
			if c.name != "old-translation" {
				expectBytes(t, "the region after the refused WRITE", m.Bytes(), before)
			}
		})
	}
}

// testQPEvents: IBV_EVENT_COMM_EST when a QP in RTR receives its first
// message (once), IBV_EVENT_SQ_DRAINED once a QP moved to SQD has finished
// the send it had under way (once per entry into SQD).
func testQPEvents(t *testing.T, s *suite) {
	ctx := opCtx(t)
	vms := s.env.OpenVMs(t, 2)
	a, b := newEnd(t, vms[0], qpConfig{}), newEnd(t, vms[1], qpConfig{})
	if !a.vm.Caps().Has(vrdma.CapQPEvents) {
		t.Fatalf("the agent serves %s: no qp-events", a.vm.Caps())
	}
	evA, err := a.ad.OpenAsyncEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer evA.Close()
	evB, err := b.ad.OpenAsyncEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer evB.Close()
	p := defaultRC
	if s.oob != nil {
		p = *s.oob
	}
	if err := modifyToRTS(ctx, a.qp, a.ad, b.qp.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	init := vrdma.QPAttr{State: vrdma.QPSInit, Port: 1, AccessFlags: vrdma.AccessAll}
	rtr := vrdma.QPAttr{State: vrdma.QPSRTR, DGID: a.ad.GID(), PathMTU: 1024, DestQPN: a.qp.QPN(), RQPSN: a.qp.Endpoint().PSN,
		MaxDestRdAtomic: 1, MinRNRTimer: p.minRNRTimer}
	if err := b.qp.Modify(ctx, &init, initMask); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Modify(ctx, &rtr, rtrMask); err != nil {
		t.Fatal(err)
	}
	src, dst := a.mr(t, 256, vrdma.AccessAll), b.mr(t, 256, vrdma.AccessAll)
	send := func(id uint64) {
		postSend(t, a.qp, vrdma.SendWR{ID: id, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
	}

	if e, ok := nextAsync(t, evB, 3*quiet); ok {
		t.Fatalf("an event before any message: %+v", e)
	}
	postRecv(t, b.qp, vrdma.RecvWR{ID: 1, SGL: sgl(dst.SGE(0, 64))}, vrdma.RecvWR{ID: 2, SGL: sgl(dst.SGE(64, 64))})
	send(1)
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCSend)
	expectRecv(t, waitWC(t, b.rcq, 1)[0], b.qp, 1, vrdma.WCRecv, 64, 0, false)
	if e, ok := nextAsync(t, evB, waitTimeout); !ok || e.Type != vrdma.EventCommEst || e.QPN != b.qp.QPN() {
		t.Fatalf("after the first message to a QP in RTR: %+v (%v), want COMM_EST for QP 0x%x", e, ok, b.qp.QPN())
	}
	send(2)
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 2, vrdma.WCSuccess, vrdma.WCSend)
	waitWC(t, b.rcq, 1)
	if e, ok := nextAsync(t, evB, 3*quiet); ok {
		t.Fatalf("a second event for the second message in RTR: %+v", e)
	}
	rts := vrdma.QPAttr{State: vrdma.QPSRTS, SQPSN: b.qp.Endpoint().PSN, Timeout: p.timeout, RetryCnt: p.retryCnt, RNRRetry: p.rnrRetry, MaxRdAtomic: 1}
	if err := b.qp.Modify(ctx, &rts, rtsMask); err != nil {
		t.Fatal(err)
	}

	// A SEND under way (b has no receive: RNR) when a enters SQD: the
	// send queue drains when it completes, not before.
	if e, ok := nextAsync(t, evA, 0); ok {
		t.Fatalf("QP a had an event already: %+v", e)
	}
	send(3)
	expectNoWC(t, a.scq, quiet, "SEND waiting for a receive")
	if err := a.qp.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSSQD}, vrdma.MaskState); err != nil {
		t.Fatal(err)
	}
	if e, ok := nextAsync(t, evA, 3*quiet); ok {
		t.Fatalf("an event while the SEND is under way in SQD: %+v", e)
	}
	postRecv(t, b.qp, vrdma.RecvWR{ID: 3, SGL: sgl(dst.SGE(0, 64))})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 3, vrdma.WCSuccess, vrdma.WCSend)
	if e, ok := nextAsync(t, evA, waitTimeout); !ok || e.Type != vrdma.EventSQDrained || e.QPN != a.qp.QPN() {
		t.Fatalf("after the SEND under way completed in SQD: %+v (%v), want SQ_DRAINED for QP 0x%x", e, ok, a.qp.QPN())
	}
	// SQD again from SQD: no second event; RTS and SQD again: one more.
	if err := a.qp.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSSQD}, vrdma.MaskState); err != nil {
		t.Fatal(err)
	}
	if e, ok := nextAsync(t, evA, 3*quiet); ok {
		t.Fatalf("SQD to SQD raised %+v", e)
	}
	for _, st := range []vrdma.QPState{vrdma.QPSRTS, vrdma.QPSSQD} {
		if err := a.qp.Modify(ctx, &vrdma.QPAttr{State: st}, vrdma.MaskState); err != nil {
			t.Fatal(err)
		}
	}
	if e, ok := nextAsync(t, evA, waitTimeout); !ok || e.Type != vrdma.EventSQDrained {
		t.Fatalf("SQD with nothing under way: %+v (%v), want SQ_DRAINED", e, ok)
	}
}

// testSolicitedUnreliable: the solicited bit of UC and UD messages reaches
// the receiver's CQ as RC's does. On a lossy path a message may be lost:
// the solicited one is sent again until its event comes.
func testSolicitedUnreliable(t *testing.T, s *suite) {
	check := func(t *testing.T, rcq *vrdma.CQ, post func(id uint64, flags vrdma.SendFlags)) {
		t.Helper()
		w := armEvent(t, rcq, true)
		for i := range 3 {
			post(uint64(i), 0)
		}
		if w.fired(t, 3*quiet) {
			t.Fatal("a CQ armed for solicited completions woke for unsolicited messages")
		}
		for i := 0; ; i++ {
			if i == 20 {
				t.Fatal("20 solicited messages sent: the armed CQ's event never came")
			}
			post(uint64(100+i), vrdma.SendSolicited)
			if w.fired(t, 100*time.Millisecond) {
				break
			}
			if !s.lossy() {
				t.Fatal("a solicited message did not wake the armed CQ")
			}
		}
	}
	t.Run("uc", func(t *testing.T) {
		a, b := s.ucPair(t)
		src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64*64, vrdma.AccessAll)
		for i := range 64 {
			postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(i), SGL: sgl(dst.SGE(i*64, 64))})
		}
		check(t, b.rcq, func(id uint64, flags vrdma.SendFlags) {
			postSend(t, a.qp, vrdma.SendWR{ID: id, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled | flags, SGL: sgl(src.SGE(0, 64))})
			spinWC(t, a.scq) // UC completes once the message has left
		})
	})
	t.Run("ud", func(t *testing.T) {
		vms := s.env.OpenVMs(t, 2)
		a, b := newUDEnd(t, vms[0], 4, 1024), newUDEnd(t, vms[1], 64, 1024)
		b.post(t, 0, 64)
		ah := a.ah(t, s, b)
		check(t, b.rcq, func(id uint64, flags vrdma.SendFlags) {
			postSend(t, a.qp, vrdma.SendWR{ID: id, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled | flags, SGL: sgl(a.srcSGE(64)),
				AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: udQKey})
			spinWC(t, a.scq)
		})
	})
}

// TestCQOverrunEvent: a CQ whose consumer index its workload overwrote
// with garbage has overrun, as hardware sees a CQ whose consumer index is
// not behind its producer: the agent drops its completions, moves the QPs
// completing into it to ERR and reports IBV_EVENT_CQ_ERR (the CQ's handle)
// on the event socket, to a client that knows the QP events, and not to
// one that does not.
func TestCQOverrunEvent(t *testing.T) {
	env := testenv.Start(t)
	for _, c := range []struct {
		name string
		caps abi.Caps
	}{{"qp-events", abi.CapsKnown}, {"no-hello", 0}} {
		t.Run(c.name, func(t *testing.T) {
			env.Define(t, "ov-"+c.name, testenv.VMOptions{MemMB: 4})
			h := lcAttachHostileCaps(t, env.Socket, "ov-"+c.name, c.caps)
			var none abi.Empty
			fds := h.r.must(abi.OpAsyncOpen, &abi.AdapterRef{Adapter: "vrdma0"}, &none)
			if len(fds) != 1 {
				t.Fatalf("async-open sent %d descriptors", len(fds))
			}
			if err := syscall.SetNonblock(fds[0], true); err != nil { // so that read deadlines work
				t.Fatal(err)
			}
			evs := os.NewFile(uintptr(fds[0]), "async")
			defer evs.Close()
			good, bad := h.newCQ(8), h.newCQ(8)
			q := h.newQP(bad, good) // sends complete into bad
			q.connect(h.att.Adapters[0].GID, 0x123456)
			q2 := h.newQP(bad, good) // idle: moved to ERR by the overrun alone
			q2.connect(h.att.Adapters[0].GID, 0x123457)
			bad.word(abi.OffCQHead).Store(0xfffffff0)
			q.post(func(s []byte) { lcSend(abi.SendWQE{WRID: 1, Opcode: 0x7f, Flags: abi.SendSignaled}, nil)(s) }) // fails: a completion
			deadline := time.Now().Add(10 * time.Second)
			for q2.state() != abi.QPSErr {
				if time.Now().After(deadline) {
					t.Fatalf("an idle QP of an overrun CQ is in %s, want ERR", q2.state())
				}
				time.Sleep(100 * time.Microsecond)
			}
			buf := make([]byte, 4096)
			var got []abi.AsyncEvent
			for {
				evs.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				n, err := evs.Read(buf)
				if err != nil {
					break
				}
				var e abi.AsyncEvent
				if err := json.Unmarshal(buf[:n], &e); err != nil {
					t.Fatalf("event %q: %v", buf[:n], err)
				}
				got = append(got, e)
			}
			var cqErr *abi.AsyncEvent
			for i := range got {
				if got[i].Event == abi.EventCQErr && got[i].QP == 0 {
					cqErr = &got[i]
				}
			}
			switch {
			case c.caps == 0 && cqErr != nil:
				t.Fatalf("a client without qp-events got %+v", *cqErr)
			case c.caps != 0 && (cqErr == nil || cqErr.CQ != bad.handle):
				t.Fatalf("events %+v: want CQ_ERR for CQ %d", got, bad.handle)
			}
			if tail := bad.word(abi.OffCQTail).Load(); tail != 0 {
				t.Errorf("%d completions written to the overrun CQ", tail)
			}
		})
	}
}

// testCQOverrun checks CQs made with vrdma.CQOverrun, which overrun as a
// device's do: the completion that finds every entry taken breaks the CQ
// — EventCQErr naming it on the adapter's async events, its QPs moved to
// ERR, nothing written past its entries. a sends three signaled SENDs to
// three posted receives, and nobody polls the victim CQ of 2 entries:
//
//   - recv: b's receive CQ overruns at the third message, and a's third
//     SEND does not complete with success (its receiver is in ERR);
//   - send: a's send CQ overruns at the third SEND's completion.
//
// The overrun CQ then yields the first two completions, in order, and
// nothing else.
func testCQOverrun(t *testing.T, s *suite) {
	caps := defaultCaps
	caps.MaxSendWR, caps.MaxRecvWR = 8, 8
	overrun := qpConfig{caps: caps, cqe: 2, cqOpts: []vrdma.CQOption{vrdma.CQOverrun()}}
	for _, side := range []string{"recv", "send"} {
		t.Run(side, func(t *testing.T) {
			cfg := pairConfig{a: qpConfig{caps: caps}, b: overrun}
			if side == "send" {
				cfg = pairConfig{a: overrun, b: qpConfig{caps: caps}}
			}
			a, b := s.pair(t, cfg)
			victim, cq, op := b, b.rcq, vrdma.WCRecv
			if side == "send" {
				victim, cq, op = a, a.scq, vrdma.WCSend
			}
			if n := cq.Entries(); n != 2 {
				t.Fatalf("CQ of %d entries, want 2", n)
			}
			ev, err := victim.ad.OpenAsyncEvents(opCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			defer ev.Close()
			src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 3*64, vrdma.AccessAll)
			for i := range 3 {
				postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(i), SGL: sgl(dst.SGE(i*64, 64))})
			}
			var sent []vrdma.WorkCompletion
			for i := range 3 {
				postSend(t, a.qp, vrdma.SendWR{ID: uint64(i), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
				if side == "recv" && i == 1 {
					// The first two acknowledged before the third
					// overruns the receiver's CQ: on a lossy path an
					// ACK lost meanwhile would otherwise end in
					// RETRY_EXC_ERR, the receiver's QP in ERR dropping
					// the retransmission, as an HCA's does.
					sent = waitWC(t, a.scq, 2)
				}
			}
			e, ok := nextAsync(t, ev, waitTimeout)
			for ok && e.Type != vrdma.EventCQErr {
				e, ok = nextAsync(t, ev, waitTimeout)
			}
			if !ok || e.CQ != cq {
				t.Fatalf("no CQ_ERR for the overrun CQ: last event %+v (ok %v)", e, ok)
			}
			t.Logf("CQ_ERR: %s", e.Reason)
			waitState(t, victim.qp, vrdma.QPSErr)
			for i, w := range waitWC(t, cq, 2) {
				if w.WRID != uint64(i) || w.Status != vrdma.WCSuccess || w.Opcode != op {
					t.Errorf("the overrun CQ's completion %d: %+v, want ID %d, success, %s", i, w, i, op)
				}
			}
			expectNoWC(t, cq, quiet, "an overrun CQ past its first two completions")
			if side == "recv" {
				w := append(sent, waitWC(t, a.scq, 1)...)
				t.Logf("the sender's third SEND: %s", w[2].Status)
				if w[0].Status != vrdma.WCSuccess || w[1].Status != vrdma.WCSuccess || w[2].Status == vrdma.WCSuccess {
					t.Errorf("the sender's completions %s, %s, %s: want success, success and an error (its receiver's CQ overran)", w[0].Status, w[1].Status, w[2].Status)
				}
			}
		})
	}
}
