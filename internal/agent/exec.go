package agent

// Send-queue pipeline of one QP (RoutineQPSender, qp.runSQ):
//
//	workload: writes WQE into SQ slot, bumps SQ tail, rings the doorbell
//	          if the agent said it sleeps (OffSQDoorbell)
//	runSQ:    waits (doorbell mode: polls 20 µs (200 µs on the tcp path), then sleeps on the
//	          doorbell socket; async mode: spins briefly, then sleeps while
//	          the VM's poller watches its tails), frees each slot before completing it, copies each new slot into a
//	          private buffer before looking at it (the workload may rewrite
//	          the slot at any time), decodes and checks it, executes it over
//	          the QP's path, advances the SQ head, then writes the
//	          completion to the send CQ.
//	path:     memcpy: the sender's goroutine acts as the responder too: it
//	          takes the remote VM's memMu for reading, checks rkey, bounds
//	          and access there, consumes the remote receive queue for SEND,
//	          and copies once between the two guest memories.
//
// In ERR the same goroutine completes everything queued, on both queues,
// with WR_FLUSH_ERR. Nothing here allocates per work request.

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
)

// Async-mode polling budget: a QP goroutine spins asyncSpins polls of its
// own queues, then hands them to its VM's poller (asyncpoll.go), which
// spins asyncSpins empty rounds over all of them, then yields the CPU
// (sched_yield) between rounds up to asyncYields, then gives them back to
// their doorbells. On a machine with fewer cores than spinners, yielding
// is what lets the workloads run.
//
// In doorbell mode the goroutine polls for doorbellPoll after its last
// work before it sleeps: a burst of posts then costs one wake-up, not one
// per post. A QP on the tcp path polls longer (doorbellPollTCP): its round
// trips are longer, and a sleep and wake-up of a thread is most of the
// cost of one on a small or virtual machine (measured: 8-byte write
// latency 111–131 µs typical with 20 µs, 67–105 µs with 200 µs).
const (
	asyncSpins      = 64
	asyncYields     = 20000
	doorbellPoll    = 20 * time.Microsecond
	doorbellPollTCP = 200 * time.Microsecond
)

// maxMessage is the largest message (max_msg_sz), 2 GiB as on RoCE HCAs.
const maxMessage = 1 << 31

func (q *qp) runSQ() {
	defer close(q.done)
	// Requests in flight on the tcp path must not land in guest memory
	// once the QP is gone.
	defer q.txDrop()
	for q.waitWork() {
		q.safeDrain()
	}
}

// safeDrain is drain, except that a panic — a bug — moves the QP to ERR
// and is logged; the loop goes on and flushes what the QP holds.
func (q *qp) safeDrain() {
	defer func() {
		if r := recover(); r != nil {
			buf := make([]byte, 8192)
			buf = buf[:runtime.Stack(buf, false)]
			q.vm.a.log.Error("QP goroutine failed; QP moved to ERR", "vm", q.vm.name, "qpn", q.qpn, "panic", r, "stack", string(buf))
			q.moveToErr(fmt.Sprint("internal error: ", r))
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
// the goroutine would spin on them.
func (q *qp) hasWork(tail uint32) bool {
	if q.stop.Load() {
		return true
	}
	s := q.State()
	if tail != q.sqHead && s != abi.QPSSQD && !(q.sqBad && tail == q.sqBadTail) {
		return true
	}
	if s == abi.QPSErr || s == abi.QPSReset {
		rt := abi.Word(q.ring.Bytes(), abi.OffRQTail).Load()
		q.rqMu.Lock()
		idle := rt == q.rqHead || q.rqBad && rt == q.rqBadTail
		q.rqMu.Unlock()
		return !idle
	}
	return false
}

// waitWork returns when there may be work, false when the QP is stopping.
// It polls first — briefly in doorbell mode, to catch back-to-back posts
// without a wake-up; long in async mode (spin, then yield) — then sets
// the doorbell flag, looks once more, and sleeps until rung.
func (q *qp) waitWork() bool {
	mem := q.ring.Bytes()
	tailW := abi.Word(mem, abi.OffSQTail)
	dbW := abi.Word(mem, abi.OffSQDoorbell)
	for {
		if q.stop.Load() {
			return false
		}
		if q.poll(tailW) {
			return !q.stop.Load()
		}
		if q.vm.poller != nil && !q.idle.released.Swap(false) {
			// Async mode: the VM's poller watches the tails published
			// here; the doorbell flag stays clear (asyncpoll.go).
			t := tailW.Load()
			q.idle.sqTail.Store(t)
			s := q.State()
			q.idle.rq.Store(s == abi.QPSErr || s == abi.QPSReset)
			q.idle.rqTail.Store(abi.Word(mem, abi.OffRQTail).Load())
			if q.hasWork(t) {
				continue
			}
			q.vm.poller.watch(q)
			select {
			case <-q.idle.ch:
			case <-q.wakeCh:
			}
			continue
		}
		dbW.Store(1)
		if q.hasWork(tailW.Load()) {
			dbW.Store(0)
			continue
		}
		q.doorbell.Wait()
		dbW.Store(0)
	}
}

// poll looks for work without sleeping, for the QP's polling budget, and
// reports whether it found some.
func (q *qp) poll(tailW *atomic.Uint32) bool {
	if q.vm.async {
		for range asyncSpins {
			if q.hasWork(tailW.Load()) {
				return true
			}
		}
		return false // the VM's poller takes over
	}
	// Yield between looks: on a small machine the thread that must run
	// next (a workload, or another QP's goroutine waking) may need this
	// core.
	poll := doorbellPoll
	if q.viaTCP.Load() {
		poll = doorbellPollTCP
	}
	deadline := time.Now().Add(poll)
	for i := 0; ; i++ {
		if q.hasWork(tailW.Load()) {
			return true
		}
		if i&7 == 7 {
			yieldCPU()
			if time.Now().After(deadline) {
				return false
			}
		}
	}
}

// drain processes what the queues hold, according to the QP's state.
func (q *qp) drain() {
	mem := q.ring.Bytes()
	size := q.layout.SQEntries
	for !q.stop.Load() {
		if r := q.resets.Load(); r != q.sqResets {
			q.txDrop()
			q.sqResets = r
			if t := q.resetSQTail.Load(); validPending(t, q.sqHead, size) {
				q.sqHead = t // what was posted before the reset goes
				abi.Word(mem, abi.OffSQHead).Store(t)
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
				q.vm.a.log.Warn("send queue tail index is invalid: the workload wrote garbage; QP moved to ERR",
					"vm", q.vm.name, "qpn", q.qpn, "tail", tail, "head", q.sqHead, "size", size)
			}
			// Skip the garbage: nothing queued can be trusted.
			if s == abi.QPSReset {
				q.txDrop()
				q.dropRQ()
				return
			}
			q.moveToErr(fmt.Sprintf("send queue tail %d invalid for %d slots", tail, size))
			q.txFlush()
			q.flushRQ()
			return
		}
		q.sqBad = false
		switch s {
		case abi.QPSReset:
			q.txDrop()
			q.sqHead = tail
			abi.Word(mem, abi.OffSQHead).Store(tail)
			q.dropRQ()
			return
		case abi.QPSErr:
			q.txFlush()
			q.flushSQ(tail)
			q.flushRQ()
			return
		}
		if q.viaTCP.Load() && (s == abi.QPSRTS || s == abi.QPSSQD) {
			q.tcpPump(mem)
			if q.State() == s && q.tx.n == 0 {
				return
			}
			continue
		}
		switch s {
		case abi.QPSSQD, abi.QPSInit, abi.QPSRTR:
			if s != abi.QPSSQD && n > 0 {
				// The library refuses posts before RTS; a WQE here was
				// written by hand. Refuse it the way hardware would.
				q.execOne(mem, true)
				continue
			}
			return // SQD: hold the queue until RTS
		}
		if n == 0 {
			return
		}
		q.execOne(mem, false)
	}
}

// execOne executes (or, with refuse, fails) the WQE at the SQ head.
func (q *qp) execOne(mem []byte, refuse bool) {
	size, stride := q.layout.SQEntries, q.layout.SQStride
	off := q.layout.SQOffset + abi.Slot(q.sqHead, size)*stride
	copy(q.sqSlot, mem[off:off+stride])
	w := &q.wqe
	st := abi.DecodeSend(q.sqSlot, w, q.caps.MaxSendSGE, q.caps.MaxInlineData)
	var n uint32
	switch {
	case refuse:
		st = abi.WCLocQPOpErr
	case st == abi.WCSuccess:
		st, n = q.execute(w)
	}
	if q.resets.Load() != q.sqResets {
		// The QP was reset while the WR ran or waited (RNR, retries):
		// RESET empties the queues without completions; drain drops it
		// and the rest.
		return
	}
	// An error moves the QP to ERR before its completion is visible: a
	// workload that sees the error and queries the QP finds it in ERR.
	if st != abi.WCSuccess && st != abi.WCWRFlushErr {
		q.moveToErr(fmt.Sprintf("work request 0x%x (%s) failed: %s", w.WRID, w.Opcode, st))
	}
	// Free the slot before the completion is visible: a workload that
	// sees the completion may post into the slot at once.
	q.sqHead = abi.Next(q.sqHead, size)
	abi.Word(mem, abi.OffSQHead).Store(q.sqHead)
	q.completeSend(w, st, n)
}

func (q *qp) completeSend(w *abi.SendWQE, st abi.WCStatus, n uint32) {
	if st == abi.WCSuccess && w.Flags&abi.SendSignaled == 0 && !q.sqSigAll {
		return
	}
	q.cqe = abi.CQE{WRID: w.WRID, QPNum: q.qpn, Opcode: abi.WCOpcodeOf(w.Opcode), Status: st, ByteLen: n}
	q.sendCQ.push(&q.cqe, &q.stop, &q.destroyed)
}

// execute gathers the local side of w and delivers it over the memcpy
// path.
func (q *qp) execute(w *abi.SendWQE) (abi.WCStatus, uint32) {
	st, nseg, total := q.gatherLocal(w, q.sqSlot, &q.segs)
	if st != abi.WCSuccess {
		return st, 0
	}
	return q.deliver(w, q.segs[:nseg], total)
}

// delivery outcomes that are not completions.
type outcome uint8

const (
	outDone   outcome = iota // the status is final
	outNoPeer                // nothing answered: transport retry
	outRNR                   // the responder had no receive posted
)

// deliver runs the RC retry rules around the path: transport retries
// (timeout × retry_cnt) when the responder does not answer, RNR retries
// (min_rnr_timer × rnr_retry, 7 = infinite) when it has no receive posted.
func (q *qp) deliver(w *abi.SendWQE, segs [][]byte, total uint64) (abi.WCStatus, uint32) {
	q.mu.Lock()
	retries, rnr, timeout := q.attr.RetryCnt, q.attr.RNRRetry, q.attr.Timeout
	q.mu.Unlock()
	for {
		out, st, n, rnrTimer := q.memcpyDeliver(w, segs, total)
		switch out {
		case outDone:
			if st == abi.WCSuccess {
				q.bytesSent.Add(total)
			}
			return st, n
		case outNoPeer:
			if retries == 0 {
				return abi.WCRetryExcErr, 0
			}
			retries--
			q.ctr.retries.Add(1)
			if !q.sleep(retryTimeout(timeout)) {
				return abi.WCWRFlushErr, 0
			}
		case outRNR:
			q.ctr.rnrRcvd.Add(1)
			if rnr == 0 {
				return abi.WCRNRRetryExcErr, 0
			}
			if rnr != 7 {
				rnr--
			}
			if !q.sleep(rnrDelay(rnrTimer)) {
				return abi.WCWRFlushErr, 0
			}
		}
	}
}

// retryTimeout is IBTA's local ACK timeout, 4.096 µs × 2^timeout. IBTA
// reads 0 as infinite; vrdma never waits forever and reads it as 14 (67 ms).
func retryTimeout(t uint8) time.Duration {
	if t == 0 {
		t = 14
	}
	return time.Duration(4096<<t) * time.Nanosecond
}

// rnrTimes is IBTA's RNR NAK timer table (9.7.5.2.8), in microseconds.
var rnrTimes = [32]uint32{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560,
	3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

func rnrDelay(t uint8) time.Duration { return time.Duration(rnrTimes[t&31]) * time.Microsecond }

// sleep waits d, returning false early when the QP stops or leaves the
// states in which it sends.
func (q *qp) sleep(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if q.stop.Load() {
			return false
		}
		if s := q.State(); s == abi.QPSErr || s == abi.QPSReset || q.resets.Load() != q.sqResets {
			return false
		}
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		// A timer, not a polling loop: a QP waiting out an RNR or retry
		// delay costs nothing until it fires or a state change pokes it.
		q.timer.Reset(left)
		select {
		case <-q.timer.C:
		case <-q.wakeCh:
			q.timer.Stop()
		}
	}
}

// peerQP returns the QP at the remote end, resolving it on first use.
func (q *qp) peerQP() *qp {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.peer != nil && !q.peer.destroyed.Load() {
		return q.peer
	}
	q.peer = nil
	a := q.vm.a
	a.mu.Lock()
	p := a.qps[q.remoteQPN]
	a.mu.Unlock()
	if p == nil || p.ad.gid != q.remoteGID {
		return nil
	}
	q.peer = p
	return p
}

// memcpyDeliver is the memcpy path: q's goroutine plays the responder p
// against p's VM's memory. Checks happen before any byte moves, so a
// refused request leaves the target untouched.
func (q *qp) memcpyDeliver(w *abi.SendWQE, segs [][]byte, total uint64) (outcome, abi.WCStatus, uint32, uint8) {
	p := q.peerQP()
	if p == nil {
		return outNoPeer, 0, 0, 0
	}
	pv := p.vm
	pv.memMu.RLock()
	defer pv.memMu.RUnlock()
	if pv.dead || p.destroyed.Load() {
		return outNoPeer, 0, 0, 0
	}
	if s := p.State(); s != abi.QPSRTR && s != abi.QPSRTS && s != abi.QPSSQD {
		p.ctr.dropped.Add(1)
		return outNoPeer, 0, 0, 0 // a responder outside RTR..SQD drops what it gets
	}
	p.mu.Lock()
	bound := p.remoteQPN == q.qpn && p.remoteGID == q.ad.gid
	p.mu.Unlock()
	if !bound {
		p.ctr.dropped.Add(1)
		return outNoPeer, 0, 0, 0 // p is connected to another QP: it ignores us
	}
	if w.Opcode == abi.OpRDMARead || w.Opcode.IsAtomic() {
		q.ctr.notePeak(1) // the memcpy path executes one WR at a time
	}
	q.mreq = rcRequest{op: w.Opcode, srcQPN: q.qpn, rkey: w.RKey, raddr: w.RemoteAddr, total: total, imm: w.Imm,
		compare: w.CompareAdd, swap: w.Swap}
	q.mpay.reset(segs)
	out, st, n, rnrTimer, _ := p.respond(&q.mreq, &q.mpay)
	return out, st, n, rnrTimer
}

// scatterBytes copies src across the segments dst and returns what is left
// of dst.
func scatterBytes(dst [][]byte, src []byte) [][]byte {
	for len(src) > 0 {
		for len(dst[0]) == 0 {
			dst = dst[1:]
		}
		n := copy(dst[0], src)
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
func (p *qp) peekRecvLocked(srcQPN uint32) recvState {
	p.rqCatchUpLocked()
	if p.rqBroken {
		return recvBroken
	}
	mem := p.ring.Bytes()
	size := p.layout.RQEntries
	tail := abi.Word(mem, abi.OffRQTail).Load()
	n, ok := abi.Pending(tail, p.rqHead, size)
	if !ok {
		p.rqBroken = true
		p.vm.a.log.Warn("receive queue tail index is invalid: the workload wrote garbage; QP moved to ERR",
			"vm", p.vm.name, "qpn", p.qpn, "tail", tail, "head", p.rqHead)
		p.moveToErr(fmt.Sprintf("receive queue tail %d invalid for %d slots", tail, size))
		return recvBroken
	}
	if n == 0 {
		return recvNone
	}
	off := p.layout.RQOffset + abi.Slot(p.rqHead, size)*p.layout.RQStride
	copy(p.rqSlot, mem[off:off+p.layout.RQStride])
	if abi.DecodeRecv(p.rqSlot, &p.rwqe, p.caps.MaxRecvSGE) != abi.WCSuccess {
		p.moveToErr("receive work request has too many SGEs")
		p.completeRecvLocked(abi.WCLocLenErr, abi.WCRecv, 0, 0, false, srcQPN)
		return recvBroken
	}
	return recvReady
}

// completeRecvLocked consumes the peeked receive WQE with a completion for
// a message from QP srcQPN.
// It reports false, consuming nothing, when p's receive CQ is full: the
// sender then treats p as not ready (RNR) and retries later.
func (p *qp) completeRecvLocked(st abi.WCStatus, op abi.WCOpcode, n, imm uint32, withImm bool, srcQPN uint32) bool {
	e := abi.CQE{WRID: p.rwqe.WRID, QPNum: p.qpn, Opcode: op, Status: st, ByteLen: n, SrcQP: srcQPN}
	if withImm {
		e.Imm, e.Flags = imm, abi.WCWithImm
	}
	return p.recvCQ.tryPushRecv(&e, p)
}

// flushSQ completes every queued send WQE with WR_FLUSH_ERR.
func (q *qp) flushSQ(tail uint32) {
	mem := q.ring.Bytes()
	size, stride := q.layout.SQEntries, q.layout.SQStride
	for q.sqHead != tail && !q.stop.Load() {
		off := q.layout.SQOffset + abi.Slot(q.sqHead, size)*stride
		copy(q.sqSlot, mem[off:off+stride])
		w := &q.wqe
		abi.DecodeSend(q.sqSlot, w, q.caps.MaxSendSGE, q.caps.MaxInlineData)
		q.cqe = abi.CQE{WRID: w.WRID, QPNum: q.qpn, Opcode: abi.WCOpcodeOf(w.Opcode), Status: abi.WCWRFlushErr}
		// A broken CQ drops the completion; the WQE is consumed all the
		// same, or the goroutine would come back to it forever.
		q.sqHead = abi.Next(q.sqHead, size)
		abi.Word(mem, abi.OffSQHead).Store(q.sqHead)
		q.sendCQ.push(&q.cqe, &q.stop, &q.destroyed)
	}
}

// flushRQ completes every queued receive WQE with WR_FLUSH_ERR.
func (q *qp) flushRQ() {
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	q.rqCatchUpLocked()
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
		q.rqHead = abi.Next(q.rqHead, size)
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
func (q *qp) rqCatchUpLocked() {
	r := q.resets.Load()
	if r == q.rqResets {
		return
	}
	q.rqResets = r
	if t := q.resetRQTail.Load(); validPending(t, q.rqHead, q.layout.RQEntries) {
		q.rqHead = t
		abi.Word(q.ring.Bytes(), abi.OffRQHead).Store(t)
	}
	q.rqBroken = false
}

// dropRQ discards the receive queue (transition to RESET).
func (q *qp) dropRQ() {
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	q.rqCatchUpLocked() // acknowledge the reset: it must not move the head later
	mem := q.ring.Bytes()
	tail := abi.Word(mem, abi.OffRQTail).Load()
	q.rqBad, q.rqBadTail = !abi.ValidIndex(tail, q.layout.RQEntries), tail // see hasWork
	if !q.rqBad {
		q.rqHead = tail
		abi.Word(mem, abi.OffRQHead).Store(tail)
	}
	q.rqBroken = false
}

// yieldCPU gives the CPU to another thread of the machine (a workload, a
// peer agent) without blocking: sched_yield(2) as a raw system call, so
// that the Go scheduler does not hand the P to a new OS thread meanwhile.
// Many QPs yielding at once must not grow the agent by a thread each.
func yieldCPU() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
