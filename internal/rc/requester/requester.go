// SPDX-License-Identifier: Apache-2.0

// Package requester is the RC requester every windowed vrdma path runs
// (IBTA vol. 1, 9.7; rocev2.md §4.4): a window of send WQEs taken from a
// QP's send queue (device.SendQueue), the PSNs each takes, the fence and
// max_rd_atomic gates, acknowledgements (coalesced or one per request),
// go-back-N from a NAK, an implicit NAK, a lost connection or the local ACK
// timeout, the retry and RNR budgets, and the poll-then-sleep wait. It
// completes WQEs in order.
//
// A path brings only a Wire: its framing and I/O. The engine hands the
// wire request packets to send (Wire.Send, Wire.Flush) and the wire hands
// the engine what the responder said through the upcalls (Ack, Nak,
// AtomicAck, ReadResponse, ReadLanded, Lost), from whichever goroutine
// reads its responses. wireguard-go's device/send.go over conn/conn.go is
// the model: one engine, thin transports.
//
// Goroutines: the engine runs on its QP's send-queue goroutine (runSQ, in
// Path.Pump, Drop and Flush), which owns the window's order, the WQE
// copies and the budgets. Upcalls come from the wire's response reader (the
// rdma engine's reader goroutine) or from the QP goroutine itself (tcp,
// in Wire.Collect); they record under Engine.mu and poke the QP's WakeCh.
// The engine starts no goroutine.
package requester

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
)

// Window is how many WQEs a QP keeps in flight.
const Window = 16

// Entry is one WQE in the window. The QP goroutine writes its exported
// fields when it takes the WQE, before it is sent; a wire reads them in
// Send (QP goroutine) and, for a READ's data, under the engine's upcalls.
type Entry struct {
	WQE   abi.SendWQE        // the decoded WQE
	Slot  []byte             // the engine's private copy of its SQ slot
	Segs  [abi.MaxSGE][]byte // its local buffers (guest memory), Segs[:NSeg]
	NSeg  int                // segments in Segs
	Total uint64             // message length
	PSN   uint32             // its first PSN
	NPSN  uint32             // the PSNs it takes: a SEND or WRITE one per packet, a READ one per response packet, an atomic one
	MTU   uint32             // payload of each packet but the last (0: one PSN per WR)
	Index int                // its place in the engine's array, [0, Window): the index of the wire's per-entry state
	local abi.WCStatus       // the local checks' verdict
	// The rest is guarded by Engine.mu (which the analyzer cannot name
	// from here): request packets sent since the last rewind (written by
	// the QP goroutine), and what the responses said.
	sent uint32
	done bool         // the responses settled it
	st   abi.WCStatus // ... with this status
	got  uint32       // READ: response packets received in order
	lim  uint32       // READ, with a ReadCredit: the response packet the requests sent let the responder send up to (exclusive)
	old  uint64       // an atomic's original value
}

// Packets is how many request packets e sends: one per PSN for a SEND or
// a WRITE, one for a READ or an atomic.
func (e *Entry) Packets() uint32 {
	if e.WQE.Opcode.IsRdAtomic() {
		return 1
	}
	return e.NPSN
}

// Outcome is what became of the packets a Flush sent.
type Outcome uint8

// The outcomes.
const (
	// Sent: they left (or were lost on the way: the timeout finds out).
	Sent Outcome = iota
	// Dropped: some could not be sent; the local ACK timeout retransmits.
	Dropped
	// Failed: the wire is down (no connection); nothing of them is in
	// flight. The engine spends a transport retry and sends again after
	// the local ACK timeout.
	Failed
	// FailedWaited is Failed after the wire already waited the timeout
	// out (a connect that timed out): the engine sends again at once.
	FailedWaited
)

// Verdict is what a wire says of a request whose response is overdue.
type Verdict uint8

// The verdicts.
const (
	// GoBack: the request or its response was lost; go back (a
	// transport retry).
	GoBack Verdict = iota
	// WaitAgain: wait another timeout (the connection makes progress, the
	// peer is slow); or the wire closed its connection and reports Lost.
	WaitAgain
)

// Wire is a path's framing and I/O under the engine. All of its methods
// are called from the QP's send-queue goroutine.
type Wire interface {
	// Send queues request packet i of e, asking a READ's responses from
	// response packet got on. An error stops the batch (Flush follows).
	Send(e *Entry, i, got uint32, at *device.RCAttrs) error
	// Flush sends what Send queued.
	Flush() Outcome
	// Collect delivers, as upcalls, the responses the wire hands over on
	// the QP goroutine (tcp's calls); a wire whose reader makes the
	// upcalls itself does nothing.
	Collect()
	// Recall tells the wire that e is to be sent again from its start, or
	// leaves the window: it forgets what it holds of e's last sending (a
	// response that comes later is dropped), and its reader stops writing
	// into e's buffers before Recall returns.
	Recall(e *Entry)
	// Timeout says what to do about e, the oldest request not settled,
	// when nothing was heard of it in the local ACK timeout.
	Timeout(e *Entry) Verdict
}

// Config is what differs between wires in the engine's rules.
type Config struct {
	// MTU returns the payload of a packet for the QP's attributes; nil:
	// every WR takes one PSN whatever its length (tcp's frames).
	MTU func(at *device.RCAttrs) uint32
	// Outstanding bounds the PSNs sent and not acknowledged; 0: only the
	// window bounds them.
	Outstanding int32
	// ReadCredit is how many response packets a READ request lets a
	// responder that paces by it send, from the packet it asks from; 0:
	// all the rest. For a READ whose responder paces (ReadResponse's
	// credited), the engine asks for more before they have all come: the
	// READ request again, from the end of the credit granted (a
	// continuation, ReadMore), once half of the credit has landed.
	ReadCredit uint32
	// BatchBytes bounds the payload of one Flush (at least one WR goes);
	// 0: none.
	BatchBytes uint64
	// ProbeAfterRNR: after an RNR wait only the oldest WR goes out until
	// it is accepted (the rest would be refused with PSN sequence errors).
	ProbeAfterRNR bool
	// Poll is how long the engine polls for a response before it sleeps
	// (while a polling slot is free, device.TrySpin).
	Poll time.Duration
	// Retransmits, if set, counts request packets sent again.
	Retransmits *atomic.Uint64
}

// Engine is the requester of one QP on one wire, made at RTR and dropped
// at RESET.
type Engine struct {
	q    device.SendQueue
	wire Wire
	cfg  Config

	// Owned by the QP's send-queue goroutine.
	budget  device.RetryBudget
	next    uint32 // SQ index of the next WQE to take
	blocked bool   // the last send stopped at a limit (fence, max_rd_atomic, outstanding) or failed
	// the last fill left the next WQE in the SQ: taking it would make the
	// window span more than rc.MaxSpan PSNs
	spanFull bool
	more     bool // the last send stopped at the batch bound: send again at once
	// the last fill stopped at a local work request (BIND_MW, LOCAL_INV):
	// it runs once the window is empty (execLocal)
	localNext bool
	probe     bool // after an RNR wait: only the oldest goes out until accepted
	due       time.Time
	attrs     device.RCAttrs // the QP's attributes as fill last read them

	inflight atomic.Int32

	mu   sync.Mutex
	win  [Window]Entry // mu guards the ring indices (the QP goroutine reads the WQE fields it wrote without it)
	head int           // +checklocks:mu
	n    int           // +checklocks:mu
	// the PSNs below are set (from the first WQE's)
	started bool // +checklocks:mu
	// the PSN after the last one sent
	sendPSN uint32 // +checklocks:mu
	// the PSN after the furthest one ever sent
	maxPSN uint32 // +checklocks:mu
	// the PSN after the last one acknowledged
	ackPSN uint32 // +checklocks:mu
	// seenPSN: the PSN after the furthest one a response acknowledged,
	// even past a READ or atomic still waiting for its own (which holds
	// ackPSN back).
	//
	// +checklocks:mu
	seenPSN uint32
	// go back to rewPSN
	rewind bool   // +checklocks:mu
	rewPSN uint32 // +checklocks:mu
	// an RNR NAK asked to wait rnrT
	rnr  bool  // +checklocks:mu
	rnrT uint8 // +checklocks:mu
	// the wire lost what was in flight
	lost bool // +checklocks:mu
	// ... after waiting the timeout out
	waited bool // +checklocks:mu
	// a response came since the goroutine last looked
	heard bool // +checklocks:mu
	// something was sent or acknowledged: the timeout starts again
	moved bool // +checklocks:mu
	// retrying: a go-back-N for a NAK, an implicit NAK or the timeout
	// was taken and nothing progressed since; until something does, only
	// the timeout starts another (rxe's started_retry): the responses to
	// what went before it, and to its own duplicates, ask for nothing
	// new and spend no retry, and a go-back-N that never progresses ends
	// after retry_cnt timeouts.
	//
	// +checklocks:mu
	retrying bool
	// progress: ackPSN or seenPSN moved since the goroutine last looked;
	// a retry episode ends with progress, as rxe's retry count is
	// reloaded by an acknowledgement (a 1 MiB READ that loses a packet in
	// every attempt still gets there). Duplicate ACKs, which acknowledge
	// nothing new, are none; every go-back-N spends a transport retry.
	// +checklocks:mu
	progress bool
}

// New makes the requester of q's send queue over w.
func New(q device.SendQueue, w Wire, cfg Config) *Engine {
	r := &Engine{q: q, wire: w, cfg: cfg}
	for i := range r.win {
		r.win[i].Slot = make([]byte, q.SlotSize())
		r.win[i].Index = i
	}
	// next is the QP goroutine's to read from the queue: its first Pump
	// sets it (New runs on the goroutine that moves the QP to RTR, while
	// the QP's goroutine may still be moving the head of a reset).
	return r
}

// InFlight is how many WQEs the window holds; any goroutine.
func (r *Engine) InFlight() int { return int(r.inflight.Load()) }

// Busy reports whether the window holds WQEs.
func (r *Engine) Busy() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n > 0
}

// Len is how many WQEs the window holds; the QP goroutine (a wire's
// Collect) only: it is the only writer of the window's indices, so it
// reads them without the lock.
//
// +checklocksignore
func (r *Engine) Len() int { return r.n }

// At is the window's i-th entry, oldest first; the QP goroutine only
// (as Len).
//
// +checklocksignore
func (r *Engine) At(i int) *Entry { return &r.win[(r.head+i)%Window] }

// at is At under mu.
//
// +checklocks:r.mu
func (r *Engine) at(i int) *Entry { return &r.win[(r.head+i)%Window] }

// Drop forgets the window, without completions (RESET).
func (r *Engine) Drop() {
	for i := 0; i < r.Len(); i++ {
		r.wire.Recall(r.At(i))
	}
	r.mu.Lock()
	for r.n > 0 {
		e := &r.win[r.head]
		clear(e.Segs[:e.NSeg])
		r.head = (r.head + 1) % Window
		r.n--
	}
	r.started, r.retrying, r.rewind, r.rnr, r.lost, r.heard = false, false, false, false, false, false
	r.mu.Unlock()
	r.inflight.Store(0)
	r.probe, r.more, r.blocked, r.spanFull = false, false, false, false
	r.budget.Reset()
	r.next = r.q.SQHead()
}

// Flush completes the window with WR_FLUSH_ERR, oldest first (ERR).
func (r *Engine) Flush() {
	for r.Busy() {
		r.complete(abi.WCWRFlushErr, 0)
	}
	r.mu.Lock()
	r.retrying, r.rewind, r.rnr, r.lost = false, false, false, false
	r.mu.Unlock()
	r.probe, r.more = false, false
	r.budget.Reset()
	r.next = r.q.SQHead()
}

// Pump runs the send queue while the QP is in RTS or SQD: in RTS it takes
// new WQEs, in SQD it finishes what the window holds.
func (r *Engine) Pump() {
	q := r.q
	if !r.Busy() {
		r.next = q.SQHead()
	}
	for q.Sending() {
		s := q.State()
		if s != abi.QPSRTS && s != abi.QPSSQD {
			return
		}
		r.wire.Collect()
		r.reap()
		// A completion may have moved the QP to ERR: nothing more goes out.
		if s = q.State(); s != abi.QPSRTS && s != abi.QPSSQD {
			return
		}
		if !r.retry() {
			continue
		}
		if !r.fill(s == abi.QPSRTS) {
			return // an invalid tail: the device deals with it
		}
		if !r.Busy() {
			if r.localNext {
				r.execLocal()
				continue
			}
			return
		}
		r.wait()
	}
}

// reap completes the WQEs at the window's head that are settled, in
// order, up to and including the first that completes with an error.
func (r *Engine) reap() {
	for {
		r.mu.Lock()
		if r.n == 0 {
			r.mu.Unlock()
			return
		}
		e := r.at(0)
		if e.local != abi.WCSuccess {
			r.mu.Unlock()
			r.complete(e.local, 0)
			return // the QP is in ERR: the WRs behind flush (Flush)
		}
		if !e.done {
			r.mu.Unlock()
			return
		}
		st, old := e.st, e.old
		r.mu.Unlock()
		n := uint32(e.Total)
		if st == abi.WCSuccess {
			if e.WQE.Opcode.IsAtomic() {
				binary.LittleEndian.PutUint64(e.Segs[0], old)
				n = 8
			}
			r.q.NoteSent(e.Total)
			r.budget.Reset()
			r.probe = false
		}
		r.complete(st, n)
		if st != abi.WCSuccess {
			// The QP is in ERR: every WR behind flushes (Flush), also
			// one whose response came already.
			return
		}
	}
}

// complete takes the head entry out of the window and completes its WQE.
func (r *Engine) complete(st abi.WCStatus, n uint32) {
	r.mu.Lock()
	e := r.at(0)
	r.head = (r.head + 1) % Window
	r.n--
	r.inflight.Store(int32(r.n))
	r.mu.Unlock()
	r.wire.Recall(e)
	clear(e.Segs[:e.NSeg])
	r.q.CompleteHead(&e.WQE, st, n)
}

// fill takes new WQEs into the window (when takeNew: in RTS) and sends
// what may go. It reports false when the SQ tail is invalid.
func (r *Engine) fill(takeNew bool) bool {
	q := r.q
	pending, ok := q.SQPending()
	if !ok {
		return false
	}
	r.attrs = q.RCAttrs() // in the Engine: a pointer to it goes to the wire without escaping a local
	at := &r.attrs
	var mtu uint32
	if r.cfg.MTU != nil {
		mtu = r.cfg.MTU(at)
	}
	r.spanFull = false
	r.mu.Lock()
	for takeNew && r.n < Window && uint32(r.n) < pending {
		if r.n > 0 && r.at(r.n-1).local != abi.WCSuccess {
			break // nothing after a WR that failed locally: the QP goes to ERR there
		}
		e := r.at(r.n)
		e.local = q.ReadWQE(r.next, e.Slot, &e.WQE)
		if r.localNext = e.local == abi.WCSuccess && e.WQE.Opcode.IsLocal(); r.localNext {
			break // it runs when everything before it has completed
		}
		e.NSeg, e.Total, e.sent, e.done, e.st, e.got, e.lim, e.old = 0, 0, 0, false, 0, 0, 0, 0
		if e.local == abi.WCSuccess {
			l := q.GatherLocal(&e.WQE, e.Slot, &e.Segs)
			e.local, e.NSeg, e.Total = l.Status, l.NSeg, l.Total
		}
		if e.local == abi.WCSuccess {
			npsn := uint64(1)
			if op := e.WQE.Opcode; mtu > 0 && !op.IsAtomic() && e.Total > uint64(mtu) {
				npsn = (e.Total + uint64(mtu) - 1) / uint64(mtu)
			}
			if npsn > rc.MaxSpan {
				// More PSNs than a window may span: refused, not sent
				// (a message of 2 GiB at MTU 256 would span half the
				// PSN space).
				e.local = abi.WCLocLenErr
			} else if r.n > 0 && uint64(max(rc.PSNDiff(r.endPSNLocked(), r.ackPSN), 0))+npsn > rc.MaxSpan {
				// The window would span more than MaxSpan PSNs: the WQE
				// is not taken; it waits for the acknowledgements of
				// those before it (wait sleeps for them).
				clear(e.Segs[:e.NSeg])
				r.spanFull = true
				break
			} else {
				e.NPSN = uint32(npsn)
				e.PSN, e.MTU = q.TakePSNs(e.NPSN), mtu
			}
		}
		r.next = q.SQNext(r.next)
		if e.local == abi.WCSuccess {
			if !r.started {
				r.started, r.sendPSN, r.maxPSN, r.ackPSN, r.seenPSN = true, e.PSN, e.PSN, e.PSN, e.PSN
			}
		}
		r.n++
		r.inflight.Store(int32(r.n))
	}
	r.mu.Unlock()
	r.send(at)
	return true
}

// execLocal executes the local work request at the SQ head (BIND_MW,
// LOCAL_INV) once the window is empty: every work request before it has
// completed, so a bind or an invalidation takes effect in the order the
// workload posted it, and before its own completion.
func (r *Engine) execLocal() {
	r.localNext = false
	e := r.At(0) // the window is empty: its head entry is free
	st := r.q.ReadWQE(r.next, e.Slot, &e.WQE)
	if st == abi.WCSuccess && !e.WQE.Opcode.IsLocal() {
		return // the workload rewrote the slot: fill takes it as it is now
	}
	if st == abi.WCSuccess {
		st = r.q.ExecLocal(&e.WQE)
	}
	r.next = r.q.SQNext(r.next)
	r.q.CompleteHead(&e.WQE, st, 0)
}

// send sends the window's packets not sent yet, within the fence, the
// max_rd_atomic limit, the outstanding bound and the batch bound.
func (r *Engine) send(at *device.RCAttrs) {
	r.queue(at)
	o := r.wire.Flush()
	if at.UC {
		r.settleUC()
		return
	}
	switch o {
	case Dropped:
		r.blocked = true // the timeout retransmits
	case Failed, FailedWaited:
		r.mu.Lock()
		r.lost, r.waited, r.heard = true, o == FailedWaited, true
		r.mu.Unlock()
	}
}

// queue hands the wire the packets send sends.
func (r *Engine) queue(at *device.RCAttrs) {
	depth := max(int(at.MaxRdAtomic), 1) // 0 allows one, as mlx5 and rxe
	r.blocked, r.more = false, false
	r.mu.Lock()
	n := r.n
	r.mu.Unlock()
	rd := 0
	var bytes uint64
	queued := false
	for i := 0; i < n; i++ {
		r.mu.Lock()
		e := r.at(i)
		done, sent, got := e.done, e.sent, e.got
		r.mu.Unlock()
		if e.local != abi.WCSuccess {
			return
		}
		w := &e.WQE
		if done {
			if w.Opcode.IsRdAtomic() {
				// Done but not completed (an older WQE still waits): it
				// keeps its max_rd_atomic credit until it completes, in
				// order, as rxe returns it. Then no READ or atomic still
				// waiting ever has more than max_rd_atomic-1 executed after
				// it, and the responder (max_dest_rd_atomic ≥ max_rd_atomic
				// resources) still holds its result when it is retried.
				rd++
			}
			continue
		}
		if sent == 0 {
			if r.probe && i > 0 {
				r.blocked = true
				return // after an RNR wait, the oldest alone until it is accepted
			}
			if w.Flags&abi.SendFence != 0 && rd > 0 {
				r.blocked = true
				return // a fenced WR waits for every earlier READ and atomic
			}
			if r.cfg.BatchBytes > 0 && queued && bytes >= r.cfg.BatchBytes {
				r.more = true
				return // the rest in the next batch
			}
		}
		if w.Opcode.IsRdAtomic() {
			if rd >= depth && sent == 0 {
				r.blocked = true
				return // max_rd_atomic outstanding
			}
			rd++
			r.q.Counters().NotePeak(uint32(rd))
		}
		if sent < e.Packets() {
			bytes += e.Total
		}
		for sent < e.Packets() {
			r.mu.Lock()
			full := r.cfg.Outstanding > 0 && rc.PSNDiff(r.sendPSN, r.ackPSN) >= r.cfg.Outstanding
			r.mu.Unlock()
			if full {
				r.blocked = true
				return // wait for acknowledgements
			}
			// The packet counts as sent before it goes: its response may
			// come back before the wire's write returns.
			i := sent
			sent++
			end := (e.PSN + sent) & rc.PSNMask
			if w.Opcode == abi.OpRDMARead {
				end = (e.PSN + e.NPSN) & rc.PSNMask
			}
			r.mu.Lock()
			again := rc.PSNDiff(end, r.maxPSN) <= 0
			e.sent = sent
			if w.Opcode == abi.OpRDMARead && r.cfg.ReadCredit > 0 {
				e.lim = got + r.cfg.ReadCredit
			}
			if rc.PSNDiff(end, r.sendPSN) > 0 {
				r.sendPSN = end
			}
			if !again {
				r.maxPSN = end
			}
			r.moved = true
			r.mu.Unlock()
			if again && r.cfg.Retransmits != nil {
				r.cfg.Retransmits.Add(1)
			}
			queued = true
			if err := r.wire.Send(e, i, got, at); err != nil {
				r.blocked = true
				return // Flush says what became of it
			}
		}
	}
}

// retry acts on what the responses asked for: a go-back-N now, after the
// timeout (a lost connection) or after an RNR wait, spending the retry
// budget. false when the goroutine should look at the queue again first
// (it slept, or completed a WQE).
func (r *Engine) retry() bool {
	r.mu.Lock()
	rewind, psn, rnr, t, lost, waited, progress := r.rewind, r.rewPSN, r.rnr, r.rnrT, r.lost, r.waited, r.progress
	r.rewind, r.rnr, r.lost = false, false, false
	if rewind || rnr || lost {
		r.progress = false
	}
	if lost {
		psn = r.oldestPSN()
	}
	r.mu.Unlock()
	if !rewind && !rnr && !lost {
		return true
	}
	q := r.q
	at := q.RCAttrs()
	if progress {
		r.budget.Reset()
	}
	r.budget.Arm(&at)
	if rnr && !lost {
		if st, ok := r.budget.RNRNak(q.Counters()); !ok {
			r.failOldest(st)
			return false
		}
		// Go back before the wait: a PSN sequence error NAK of the
		// requests after the refused one, which comes meanwhile, then
		// finds it taken (in Nak).
		r.rewindTo(psn)
		r.probe = r.cfg.ProbeAfterRNR
		q.Sleep(rc.RNRDelay(t))
		return false
	}
	if st, ok := r.budget.Transport(q.Counters()); !ok {
		// A go-back-N spends a transport retry (IBTA: a PSN sequence
		// error NAK or an implicit NAK decrements retry_cnt, as the
		// timeout does): responses that keep asking for one without
		// progress (duplicate ACKs past an atomic whose response never
		// comes) end in RETRY_EXC_ERR, not a livelock.
		r.failOldest(st)
		return false
	}
	r.mu.Lock()
	r.retrying = true
	r.mu.Unlock()
	r.rewindTo(psn)
	if lost && !waited {
		q.Sleep(rc.LocalACKTimeout(at.Timeout))
	}
	return false
}

// failOldest completes the oldest WQE not settled with st (a retry budget
// spent), after the settled ones before it.
func (r *Engine) failOldest(st abi.WCStatus) {
	r.mu.Lock()
	for i := 0; i < r.n; i++ {
		if e := r.at(i); !e.done {
			e.done, e.st = true, st
			break
		}
	}
	r.mu.Unlock()
	r.reap()
}

// rewindTo makes every unsettled packet from PSN psn on go out again: a
// SEND or WRITE from that packet, a READ from its first response packet
// not received (the responder executes it again from memory), an atomic
// whole (the responder replays its result). The wire recalls each entry
// that goes again from its start.
func (r *Engine) rewindTo(psn uint32) {
	r.mu.Lock()
	for i := 0; i < r.n; i++ {
		e := r.at(i)
		if e.done || e.local != abi.WCSuccess {
			continue
		}
		switch d := rc.PSNDiff(psn, e.PSN); {
		case e.WQE.Opcode.IsRdAtomic():
			if rc.PSNDiff(psn, e.PSN+e.NPSN-1) <= 0 {
				e.sent = 0
			}
		case d <= 0:
			e.sent = 0
		case d < int32(e.NPSN):
			e.sent = min(e.sent, uint32(d))
		}
	}
	r.sendPSN = psn
	n := r.n
	r.mu.Unlock()
	for i := 0; i < n; i++ {
		e := r.At(i)
		r.mu.Lock()
		again := !e.done && e.sent == 0
		r.mu.Unlock()
		if again {
			r.wire.Recall(e)
		}
	}
}

// endPSNLocked is the PSN after the newest one the window took (its
// newest entry's last); the window is not empty.
//
// +checklocks:r.mu
func (r *Engine) endPSNLocked() uint32 {
	e := r.at(r.n - 1)
	return (e.PSN + e.NPSN) & rc.PSNMask
}

// oldestPSN is the PSN a go-back-N from the oldest unsettled WQE starts
// at: its first, or the first not acknowledged of a SEND or WRITE the
// responder acknowledged in part.
//
// +checklocks:r.mu
func (r *Engine) oldestPSN() uint32 {
	psn := r.ackPSN
	for i := 0; i < r.n; i++ {
		e := r.at(i)
		if e.done {
			continue
		}
		psn = e.PSN
		if !e.WQE.Opcode.IsRdAtomic() && rc.PSNDiff(r.ackPSN, e.PSN) > 0 && rc.PSNDiff(r.ackPSN, e.PSN+e.NPSN) < 0 {
			psn = r.ackPSN
		}
		break
	}
	return psn
}

// wait sleeps until a response comes, a new WQE may be taken, or the
// local ACK timeout passes with nothing sent or acknowledged; then the
// wire says whether to go back (spending a transport retry, or failing
// the oldest WQE when the budget is spent) or to wait again.
func (r *Engine) wait() {
	q := r.q
	at := q.RCAttrs()
	d := rc.LocalACKTimeout(at.Timeout)
	clk := q.Clock()
	r.mu.Lock()
	if r.heard || r.rewind || r.rnr || r.lost || r.n > 0 && r.at(0).done {
		r.heard = false
		r.mu.Unlock()
		return
	}
	if r.moved || r.due.IsZero() {
		r.moved, r.due = false, clk.Now().Add(d)
	}
	full := r.n >= Window || r.spanFull
	r.mu.Unlock()
	if r.more || !r.blocked && !full && q.State() == abi.QPSRTS && q.PostedBeyond(r.next) {
		return // more to send or to take
	}
	if r.poll() {
		return
	}
	if left := r.due.Sub(clk.Now()); left > 0 {
		t := q.Timer()
		t.Reset(left)
		select {
		case <-q.WakeCh():
			t.Stop()
			return
		case <-t.C():
		}
	}
	r.mu.Lock()
	if r.heard || r.moved || r.n == 0 || r.rewind || r.rnr || r.lost {
		r.heard = false
		r.mu.Unlock()
		return
	}
	var oldest *Entry
	for i := 0; i < r.n; i++ {
		if e := r.at(i); !e.done {
			oldest = e
			break
		}
	}
	r.mu.Unlock()
	if oldest == nil {
		return
	}
	if r.wire.Timeout(oldest) == WaitAgain {
		r.due = clk.Now().Add(d)
		return
	}
	r.due = time.Time{}
	r.mu.Lock()
	psn, progress := r.oldestPSN(), r.progress
	r.progress = false
	r.mu.Unlock()
	if progress {
		r.budget.Reset()
	}
	r.budget.Arm(&at)
	if st, ok := r.budget.Transport(q.Counters()); !ok {
		r.failOldest(st)
		return
	}
	r.mu.Lock()
	r.retrying = true
	r.mu.Unlock()
	r.rewindTo(psn)
}

// poll waits for a response or a new post for up to the Config's Poll
// without sleeping, while a polling slot is free (device.TrySpin): one
// that comes within it costs no sleep and wake-up of this goroutine's
// thread. It reports whether one came.
func (r *Engine) poll() bool {
	if r.cfg.Poll <= 0 || !device.TrySpin() {
		return false
	}
	defer device.EndSpin()
	q := r.q
	deadline := time.Now().Add(r.cfg.Poll)
	for {
		select {
		case <-q.WakeCh():
			return true
		default:
		}
		if !q.Sending() || !r.blocked && !r.spanFull && q.State() == abi.QPSRTS && q.PostedBeyond(r.next) && r.inflight.Load() < Window {
			return true
		}
		device.YieldCPU() // at every turn: the threads this one waits for share the CPUs
		if time.Now().After(deadline) {
			return false
		}
	}
}
