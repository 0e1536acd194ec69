// SPDX-License-Identifier: Apache-2.0

package device

// Send-queue pipeline of one QP (RoutineQPSender, qp.runSQ):
//
//	workload: writes WQE into SQ slot, bumps SQ tail, rings the doorbell
//	          if the agent said it sleeps (OffSQDoorbell)
//	runSQ:    waits (polls for the path's pollBudget in doorbell mode,
//	          for a window it learns in async mode, spin.go, then sleeps
//	          on the doorbell), then hands
//	          the queue to the QP's path (path.go) in RTS and SQD, which
//	          copies each new slot into a private buffer before looking at
//	          it (the workload may rewrite the slot at any time), decodes
//	          and checks it, moves it, frees the slot and then writes the
//	          completion to the send CQ (execOne, completeSend).
//	path:     memcpy (package transport/memcpy) executes each WQE at
//	          the responder before it looks at the next; tcp (package
//	          transport/tcp) keeps a window in flight to another host.
//
// In ERR the same goroutine completes everything queued, on both queues,
// with WR_FLUSH_ERR; in RESET it drops it and unbinds the path. Nothing
// here allocates per work request.

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/bulkcopy"
)

// In doorbell mode the goroutine polls for its path's pollBudget after its
// last work before it sleeps: a burst of posts then costs one wake-up, not
// one per post. DoorbellPoll is the budget of a path with short round
// trips (memcpy). Async mode's window adapts (spin.go).
const DoorbellPoll = 20 * time.Microsecond

// maxMessage is the largest message (max_msg_sz), 2 GiB as on RoCE HCAs.
const maxMessage = 1 << 31

func (q *QP) runSQ() {
	defer close(q.done)
	// Requests in flight must not land in guest memory once the QP is
	// gone.
	defer q.dropPath()
	for q.waitWork() {
		q.safeDrain()
	}
}

// safeDrain is drain, except that a panic — a bug — moves the QP to ERR
// and is logged; the loop goes on and flushes what the QP holds.
func (q *QP) safeDrain() {
	defer func() {
		if r := recover(); r != nil {
			buf := make([]byte, 8192)
			buf = buf[:runtime.Stack(buf, false)]
			q.vm.d.log.Error("QP goroutine failed; QP moved to ERR", "vm", q.vm.name, "qpn", q.qpn, "panic", r, "stack", string(buf))
			q.MoveToErr(fmt.Sprint("internal error: ", r))
		}
	}()
	q.drain()
}

// hasWork reports whether the goroutine has something to do: it must stop,
// or a queue holds entries that drain acts on in the QP's state. It
// compares the workload's tails with the agent's own heads (the head words
// in shared memory are the workload's to overwrite). A tail that drain
// found invalid is not work until the workload changes it, and neither is
// the send queue in SQD (the move to RTS rings the doorbell): otherwise
// the goroutine would spin on them. A QP that entered SQD is work until
// drain has raised its SQ_DRAINED.
func (q *QP) hasWork(tail uint32) bool {
	if q.stop.Load() {
		return true
	}
	s := q.State()
	if tail != q.sqHead && s != abi.QPSSQD && !(q.sqBad && tail == q.sqBadTail) {
		return true
	}
	if s == abi.QPSSQD && q.drainedDue.Load() {
		return true // drain raises SQ_DRAINED once nothing is in flight
	}
	if s == abi.QPSErr || s == abi.QPSReset {
		mem := q.ring.Bytes()
		rt := abi.Word(mem, abi.OffRQTail).Load()
		q.rqMu.Lock()
		head := q.rqHead
		if q.chanRQ.Load() && !q.rqBroken {
			// Its library consumes receives too (§4.22): the head is
			// the RQ-head word it stores. The agent's own lags by what
			// the library took, and may equal the tail modulo the
			// ring's indices with a receive still posted (rping's
			// one-receive queue after four SENDs).
			head = abi.Word(mem, abi.OffRQHead).Load()
		}
		idle := rt == head || q.rqBad && rt == q.rqBadTail
		if q.sharedRQ() {
			// Its own RQ is never read; what it holds of the SRQ is.
			idle = !q.srqHeld && (s != abi.QPSErr || q.lastWQESent)
		}
		q.rqMu.Unlock()
		return !idle
	}
	return false
}

// waitWork returns when there may be work, false when the QP is stopping.
// It polls first — briefly in doorbell mode, to catch back-to-back posts
// without a wake-up; in async mode for as long as polling wins (spin.go)
// — then sets the doorbell flag, looks once more, and sleeps until rung.
func (q *QP) waitWork() bool {
	mem := q.ring.Bytes()
	tailW := abi.Word(mem, abi.OffSQTail)
	dbW := abi.Word(mem, abi.OffSQDoorbell)
	q.PublishHead()
	if q.vm.async {
		q.spin.begin(&q.vm.d.gov, time.Now)
	}
	for {
		if q.stop.Load() {
			return false
		}
		if q.poll(tailW) {
			if q.vm.async {
				q.spin.end()
			}
			return !q.stop.Load()
		}
		abi.StoreFenced(dbW, 1) // §6 pair 1: before the tail's load
		if q.hasWork(tailW.Load()) {
			dbW.Store(0)
			continue
		}
		q.doorbell.Wait()
		q.ctr.Doorbells.Add(1)
		dbW.Store(0)
		if q.vm.async {
			q.spin.rung(time.Now)
		}
	}
}

// poll looks for work without sleeping, for the QP's polling budget, and
// reports whether it found some.
func (q *QP) poll(tailW *atomic.Uint32) bool {
	if q.hasWork(tailW.Load()) {
		return true
	}
	poll := DoorbellPoll
	if q.cur != nil {
		poll = q.cur.PollBudget()
	}
	if q.vm.async && q.spin.polling {
		// The agent's governor has polling win (spin.go): poll for the
		// window this QP learned, and at least what doorbell mode
		// polls.
		if !tryAsyncSpin() {
			return false // enough goroutines poll already: sleep
		}
		defer asyncSpinners.Add(-1)
		start := time.Now()
		found := q.spinFor(tailW, max(q.spin.window, poll))
		q.spin.polledFor(start, time.Since(start), found)
		return found
	}
	if poll <= 0 {
		return false // the path does not poll: sleep until rung
	}
	if !TrySpin() {
		return false // enough goroutines poll already: sleep
	}
	defer EndSpin()
	return q.spinFor(tailW, poll)
}

// drain processes what the queues hold, according to the QP's state.
func (q *QP) drain() {
	mem := q.ring.Bytes()
	size := q.layout.SQEntries
	for !q.stop.Load() {
		if r := q.resets.Load(); r != q.sqResets {
			q.dropPath()
			q.cur = nil // RESET unbinds the path
			q.sqResets = r
			if t := q.resetSQTail.Load(); validPending(t, q.sqHead, size) {
				q.moveHead(t) // what was posted before the reset goes
				q.sqCompleted.Store(t)
			}
			q.rqMu.Lock()
			q.rqCatchUpLocked()
			q.rqMu.Unlock()
		}
		s := q.State()
		tail := abi.Word(mem, abi.OffSQTail).Load()
		n, ok := abi.Pending(tail, q.sqHead, size)
		if !ok {
			if !q.sqBad || tail != q.sqBadTail {
				q.sqBad, q.sqBadTail = true, tail
				q.vm.d.log.Warn("send queue tail index is invalid: the workload wrote garbage; QP moved to ERR",
					"vm", q.vm.name, "qpn", q.qpn, "tail", tail, "head", q.sqHead, "size", size)
			}
			// Skip the garbage: nothing queued can be trusted.
			if s == abi.QPSReset {
				q.dropPath()
				q.dropRQ()
				return
			}
			q.MoveToErr(fmt.Sprintf("send queue tail %d invalid for %d slots", tail, size))
			q.flushPath()
			q.flushRQ()
			return
		}
		q.sqBad = false
		switch s {
		case abi.QPSReset:
			q.dropPath()
			q.moveHead(tail)
			q.sqCompleted.Store(tail)
			q.dropRQ()
			return
		case abi.QPSErr:
			q.flushPath()
			q.flushSQ()
			q.flushRQ()
			return
		}
		if q.cur == nil {
			q.cur = q.BoundPath()
		}
		if p := q.cur; p != nil && (s == abi.QPSRTS || s == abi.QPSSQD) {
			p.Pump()
			if q.State() == s && !p.Busy() {
				if s == abi.QPSSQD {
					q.noteDrained()
				}
				return
			}
			continue
		}
		if s == abi.QPSSQD {
			q.noteDrained() // no path: nothing in flight
			return
		}
		if n == 0 {
			return
		}
		// The library refuses posts before RTS (and RTS always has a
		// path): a WQE here was written by hand. Refuse it the way
		// hardware would.
		q.execOne(nil)
	}
}

// dropPath drops what the QP's path has in flight (RESET, the QP's end).
func (q *QP) dropPath() {
	if q.cur != nil {
		q.cur.Drop()
	}
}

// flushPath flushes what the QP's path has in flight (ERR).
func (q *QP) flushPath() {
	if q.cur != nil {
		q.cur.Flush()
	}
}

// ExecPending executes the WQEs posted when it starts, one after the
// other, while the QP stays in RTS, and again while more were posted. It
// reads the workload's SQ tail once per batch, not once per WQE: the
// tail's cache line is the one the workload writes at each post, and a
// read per WQE moved that line between the two cores at each (about a
// quarter of the 4 KiB write rate on the memcpy path).
func (q *QP) ExecPending(ex SyncExecutor) {
	for q.Sending() && q.State() == abi.QPSRTS {
		n, ok := q.SQPending()
		if !ok || n == 0 {
			return // an invalid tail: the device handles it
		}
		for ; n > 0 && q.Sending() && q.State() == abi.QPSRTS; n-- {
			q.execOne(ex)
		}
	}
}

// execOne executes the WQE at the SQ head with ex, or fails it (ex nil).
func (q *QP) execOne(ex SyncExecutor) {
	if ch := q.chanP.Load(); ch != nil && ex != nil && !q.drainChannel(ch) {
		return // the QP left RTS while its send channel drained: drain flushes or drops the WQE (direct_send.go)
	}
	w := &q.wqe
	st := q.ReadWQE(q.sqHead, q.sqSlot, w)
	var n uint32
	switch {
	case ex == nil:
		st = abi.WCLocQPOpErr
	case st == abi.WCSuccess && w.Opcode.IsLocal():
		st = q.ExecLocal(w)
	case st == abi.WCSuccess:
		st, n = ex.Execute(w, q.sqSlot)
	}
	if q.resets.Load() != q.sqResets {
		// The QP was reset while the WR ran or waited (RNR, retries):
		// RESET empties the queues without completions; drain drops it
		// and the rest.
		return
	}
	q.CompleteHead(w, st, n)
}

func (q *QP) completeSend(w *abi.SendWQE, st abi.WCStatus, n uint32) {
	q.ctr.noteCompletion(st)
	if st == abi.WCSuccess && w.Opcode.Valid() {
		q.ctr.Ops[w.Opcode].Add(1)
	}
	if st == abi.WCSuccess && w.Flags&abi.SendSignaled == 0 && !q.sqSigAll {
		return
	}
	if w.Opcode == abi.OpAtomicWrite && st == abi.WCSuccess {
		n = 8 // the 8 bytes it wrote, as an atomic's completion counts them (and the memcpy-direct path's, wire-local.md §4.21)
	}
	q.cqe = abi.CQE{WRID: w.WRID, QPNum: q.qpn, Opcode: abi.WCOpcodeOf(w.Opcode), Status: st, ByteLen: n}
	q.sendCQ.push(&q.cqe, &q.stop, &q.destroyed)
}

// Local is the local side of a send WQE, resolved (GatherLocal): the
// status of the local checks and, when they pass, the guest memory its
// scatter/gather list names. Segs[:NSeg] belong to the VM's memory; the
// caller keeps them only while the WQE is in flight and clears them when
// it completes.
type Local struct {
	Status abi.WCStatus // not success: the WR fails before it leaves the host
	NSeg   int          // segments filled in
	Total  uint64       // bytes: the message length
}

// GatherLocal resolves the local side of w (slot is its private copy) into
// segs. The QP's send-queue goroutine calls it.
func (q *QP) GatherLocal(w *abi.SendWQE, slot []byte, segs *[abi.MaxSGE][]byte) Local {
	var need abi.Access
	if w.Opcode == abi.OpRDMARead || w.Opcode.IsAtomic() {
		need = abi.AccessLocalWrite // the local side is written
	}
	nseg := 0
	var total uint64
	if w.Flags&abi.SendInline != 0 {
		segs[0] = abi.Inline(slot, w)
		nseg, total = 1, uint64(w.InlineLen)
	} else {
		for i := 0; i < int(w.NumSGE); i++ {
			sge := &w.SGE[i]
			b, ok := q.vm.resolve(q.pd, sge.LKey, sge.Addr, uint64(sge.Length), need)
			if !ok {
				return Local{Status: abi.WCLocProtErr}
			}
			segs[nseg] = b
			nseg++
			total += uint64(sge.Length)
		}
	}
	if total > maxMessage {
		return Local{Status: abi.WCLocLenErr}
	}
	if w.Opcode.IsAtomic() && (nseg != 1 || total != 8) {
		return Local{Status: abi.WCLocLenErr} // an atomic returns 8 bytes into one SGE
	}
	if w.Opcode == abi.OpAtomicWrite && (nseg != 0 || total != 0) {
		return Local{Status: abi.WCLocLenErr} // an atomic write's 8 bytes are the WQE's Swap
	}
	return Local{Status: abi.WCSuccess, NSeg: nseg, Total: total}
}

// Sleep waits d, returning false early when the QP stops or leaves the
// states in which it sends.
func (q *QP) Sleep(d time.Duration) bool {
	clk := q.vm.d.clk
	deadline := clk.Now().Add(d)
	q.PublishHead() // the workload may need the slots meanwhile
	for {
		if q.stop.Load() {
			return false
		}
		if s := q.State(); s == abi.QPSErr || s == abi.QPSReset || q.resets.Load() != q.sqResets {
			return false
		}
		left := deadline.Sub(clk.Now())
		if left <= 0 {
			return true
		}
		// A timer, not a polling loop: a QP waiting out an RNR or retry
		// delay costs nothing until it fires or a state change pokes it.
		q.timer.Reset(left)
		select {
		case <-q.timer.C():
		case <-q.wakeCh:
			q.timer.Stop()
		}
	}
}

// ScatterBytes copies src across the segments dst and returns what is left
// of dst.
func ScatterBytes(dst [][]byte, src []byte) [][]byte {
	for len(src) > 0 {
		for len(dst[0]) == 0 {
			dst = dst[1:]
		}
		n := bulkcopy.Copy(dst[0], src)
		src = src[n:]
		dst[0] = dst[0][n:]
	}
	return dst
}

type recvState uint8

const (
	recvReady recvState = iota
	recvNone
	recvBroken
)

// peekRecvLocked decodes the receive WQE at the RQ head into p.rwqe
// without consuming it. The caller holds rqMu and keeps the VM mapped.
//
// +checklocks:p.rqMu
func (p *QP) peekRecvLocked(srcQPN uint32) recvState {
	if p.sharedRQ() {
		return p.peekSRQLocked(srcQPN)
	}
	p.rqCatchUpLocked()
	if p.rqBroken || !p.resyncRQLocked() { // a channel's library consumes receives too (direct_send.go)
		return recvBroken
	}
	mem := p.ring.Bytes()
	size := p.layout.RQEntries
	tail := abi.Word(mem, abi.OffRQTail).Load()
	n, ok := abi.Pending(tail, p.rqHead, size)
	if !ok {
		p.rqBroken = true
		p.vm.d.log.Warn("receive queue tail index is invalid: the workload wrote garbage; QP moved to ERR",
			"vm", p.vm.name, "qpn", p.qpn, "tail", tail, "head", p.rqHead)
		p.MoveToErr(fmt.Sprintf("receive queue tail %d invalid for %d slots", tail, size))
		return recvBroken
	}
	if n == 0 {
		return recvNone
	}
	off := p.layout.RQOffset + abi.Slot(p.rqHead, size)*p.layout.RQStride
	copy(p.rqSlot, mem[off:off+p.layout.RQStride])
	if abi.DecodeRecv(p.rqSlot, &p.rwqe, p.caps.MaxRecvSGE) != abi.WCSuccess {
		p.MoveToErr("receive work request has too many SGEs")
		p.completeRecvLocked(abi.WCLocLenErr, abi.WCRecv, 0, 0, 0, srcQPN, false)
		return recvBroken
	}
	return recvReady
}

// completeRecvLocked consumes the peeked receive WQE with a completion for
// a message from QP srcQPN, with flags (WCWithImm: imm is the immediate;
// WCWithInv: imm is the rkey it invalidated); se: the message carried the
// solicited-event bit.
// It reports false, consuming nothing, when p's receive CQ is full: the
// sender then treats p as not ready (RNR) and retries later.
//
// +checklocks:p.rqMu
func (p *QP) completeRecvLocked(st abi.WCStatus, op abi.WCOpcode, n, imm uint32, flags abi.WCFlags, srcQPN uint32, se bool) bool {
	p.ctr.noteCompletion(st)
	if st == abi.WCSuccess {
		p.ctr.Recvs.Add(1)
		p.ctr.RecvBytes.Add(uint64(n))
	}
	e := abi.CQE{WRID: p.rwqe.WRID, QPNum: p.qpn, Opcode: op, Status: st, ByteLen: n, SrcQP: srcQPN, Flags: flags}
	if flags != 0 {
		e.Imm = imm
	}
	return p.recvCQLocked().tryPushRecv(&e, p, se)
}

// flushSQ completes every queued send WQE with WR_FLUSH_ERR. It reads
// the SQ tail and checks it against the head itself: the path's flush
// (flushPath) has just moved the head past its window, so a tail checked
// before it may be behind the head now (the workload moved it back), and
// flushing up to it would run round the ring through slots that hold no
// posted WQE. Such a tail is garbage, as in drain: nothing more is
// flushed, and the goroutine waits for the workload to change it.
func (q *QP) flushSQ() {
	if q.sendCQ == nil {
		return // an XRC target QP: no send queue the workload can reach
	}
	mem := q.ring.Bytes()
	size, stride := q.layout.SQEntries, q.layout.SQStride
	tail := abi.Word(mem, abi.OffSQTail).Load()
	if !validPending(tail, q.sqHead, size) {
		if !q.sqBad || tail != q.sqBadTail {
			q.sqBad, q.sqBadTail = true, tail
			q.vm.d.log.Warn("send queue tail index is behind the WQEs the QP's path had in flight: the workload wrote garbage; the ERR flush stops at the head",
				"vm", q.vm.name, "qpn", q.qpn, "tail", tail, "head", q.sqHead, "size", size)
		}
		return
	}
	for q.sqHead != tail && !q.stop.Load() {
		off := q.layout.SQOffset + abi.Slot(q.sqHead, size)*stride
		copy(q.sqSlot, mem[off:off+stride])
		w := &q.wqe
		abi.DecodeSend(q.sqSlot, w, q.caps.MaxSendSGE, q.caps.MaxInlineData)
		q.cqe = abi.CQE{WRID: w.WRID, QPNum: q.qpn, Opcode: abi.WCOpcodeOf(w.Opcode), Status: abi.WCWRFlushErr}
		q.ctr.noteCompletion(abi.WCWRFlushErr)
		// A broken CQ drops the completion; the WQE is consumed all the
		// same, or the goroutine would come back to it forever.
		q.moveHead(abi.Next(q.sqHead, size))
		q.sendCQ.push(&q.cqe, &q.stop, &q.destroyed)
		q.sqCompleted.Store(q.sqHead)
	}
}

// flushRQ completes every queued receive WQE with WR_FLUSH_ERR.
func (q *QP) flushRQ() {
	if q.typ == abi.QPTypeXRCRecv {
		q.flushTarget() // xrc.go
		return
	}
	if q.sharedRQ() {
		q.rqMu.Lock()
		q.rqCatchUpLocked()
		last := q.flushSRQLocked()
		q.rqMu.Unlock()
		if f := q.onLastWQE.Load(); last && f != nil {
			(*f)()
		}
		return
	}
	q.waitChannelGone() // no library takes receives while they are flushed (direct_send.go)
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	q.rqCatchUpLocked()
	if !q.rqBroken {
		q.resyncRQLocked() // a bad word moves nothing: the flush starts at the agent's own head
	}
	mem := q.ring.Bytes()
	size := q.layout.RQEntries
	tail := abi.Word(mem, abi.OffRQTail).Load()
	if _, ok := abi.Pending(tail, q.rqHead, size); !ok {
		q.rqBad, q.rqBadTail = true, tail // see hasWork
		return
	}
	q.rqBad = false
	for q.rqHead != tail && !q.stop.Load() {
		off := q.layout.RQOffset + abi.Slot(q.rqHead, size)*q.layout.RQStride
		copy(q.rqSlot, mem[off:off+q.layout.RQStride])
		e := abi.CQE{WRID: binary.LittleEndian.Uint64(q.rqSlot), QPNum: q.qpn, Opcode: abi.WCRecv, Status: abi.WCWRFlushErr}
		q.ctr.noteCompletion(abi.WCWRFlushErr)
		q.rqHead = abi.Next(q.rqHead, size)
		q.rqSeq++
		abi.Word(mem, abi.OffRQHead).Store(q.rqHead)
		q.recvCQ.push(&e, &q.stop, &q.destroyed) // as in flushSQ
	}
}

// validPending reports whether tail is a valid index at most size entries
// ahead of head.
func validPending(tail, head, size uint32) bool {
	_, ok := abi.Pending(tail, head, size)
	return ok
}

// rqCatchUpLocked skips the receives posted before the last move to RESET,
// once per reset (see qp.resets). The caller holds rqMu and keeps the
// rings mapped.
//
// +checklocks:q.rqMu
func (q *QP) rqCatchUpLocked() {
	r := q.resets.Load()
	if r == q.rqResets {
		return
	}
	q.rqResets = r
	if q.sharedRQ() {
		q.dropSRQHeldLocked()
		return
	}
	if t := q.resetRQTail.Load(); validPending(t, q.rqHead, q.layout.RQEntries) {
		q.rqHead = t
		q.rqSeq++
		abi.Word(q.ring.Bytes(), abi.OffRQHead).Store(t)
	}
	q.rqBroken = false
}

// dropRQ discards the receive queue (transition to RESET).
func (q *QP) dropRQ() {
	q.waitChannelGone() // direct_send.go
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	if q.chanP.Load() == nil {
		q.chanRQ.Store(false) // a new incarnation: the RQ head is the agent's alone until its next channel
	}
	q.rqCatchUpLocked() // acknowledge the reset: it must not move the head later
	if q.sharedRQ() {
		q.dropSRQHeldLocked()
		return
	}
	mem := q.ring.Bytes()
	tail := abi.Word(mem, abi.OffRQTail).Load()
	q.rqBad, q.rqBadTail = !abi.ValidIndex(tail, q.layout.RQEntries), tail // see hasWork
	if !q.rqBad {
		q.rqHead = tail
		q.rqSeq++
		abi.Word(mem, abi.OffRQHead).Store(tail)
	}
	q.rqBroken = false
}

// spinners counts the goroutines of this process that poll for work or
// a response instead of sleeping (doorbell mode, and the rc engines'
// polls for responses; async mode's own polls count in asyncSpinners,
// spin.go). Polling pays while a waiter is one of a few: what it waits
// for comes within microseconds, and a sleep and wake-up of a thread is
// saved. With a thousand QPs on two cores it is all cost: measured on
// the 1,024-QP tcp round (BenchmarkScale), 1.22 s with every QP polling
// for 200 µs, 0.42 s with none. So at most maxSpinners poll at once; the
// others sleep at once.
var spinners atomic.Int32

// maxSpinners is one poller per CPU.
var maxSpinners = int32(max(1, runtime.NumCPU()))

// TrySpin takes a polling slot; false when all are taken.
func TrySpin() bool {
	for {
		n := spinners.Load()
		if n >= maxSpinners {
			return false
		}
		if spinners.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// EndSpin gives the slot back.
func EndSpin() { spinners.Add(-1) }

// YieldCPU gives the CPU to another thread of the machine (a workload, a
// peer agent) without blocking: sched_yield(2) as a raw system call, so
// that the Go scheduler does not hand the P to a new OS thread meanwhile.
// Many QPs yielding at once must not grow the agent by a thread each.
func YieldCPU() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
