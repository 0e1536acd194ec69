// SPDX-License-Identifier: Apache-2.0

package device

// The send queue as a path sees it: the device's half of the path
// interface (path.go). A path reads WQEs, takes PSNs, reads the QP's RC
// attributes and completes work requests only through these methods,
// called from the QP's send-queue goroutine; none of them knows a path.

import (
	"fmt"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/rc"
)

// RCAttrs are the RC attributes a requester or a responder works with,
// read together.
type RCAttrs struct {
	Timeout, RetryCnt, RNRRetry, MaxRdAtomic uint8
	RemoteQPN                                uint32
	RQPSN                                    uint32 // the PSN the responder expects first (rq_psn)
	PathMTU                                  uint32 // bytes: 256 … 4096
	MinRNRTimer                              uint8  // the RNR timer code a responder asks for
	MaxDestRdAtomic                          uint8  // the responder resources for RDMA READs and atomics (max_dest_rd_atomic)
	UC                                       bool   // an unreliable connected QP: no ACKs, no retransmission (uc.go)
	XRC                                      bool   // an XRC initiator QP: each request names an XRC SRQ (SendWQE.XRCSRQN, xrc.go)
}

// RCAttrs returns the QP's current RC attributes.
func (q *QP) RCAttrs() RCAttrs {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := &q.attr
	return RCAttrs{Timeout: a.Timeout, RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry, MaxRdAtomic: a.MaxRdAtomic, RemoteQPN: q.remoteQPN, RQPSN: a.RQPSN, PathMTU: a.PathMTU, MinRNRTimer: a.MinRNRTimer,
		MaxDestRdAtomic: a.MaxDestRdAtomic, UC: q.typ == abi.QPTypeUC, XRC: q.typ == abi.QPTypeXRCSend}
}

// Sending reports whether the goroutine may go on Sending: the QP is not
// stopping and no RESET came since it last caught up.
func (q *QP) Sending() bool { return !q.stop.Load() && q.resets.Load() == q.sqResets }

// SlotSize is the size of one SQ slot, for a path's private copies.
func (q *QP) SlotSize() uint32 { return q.layout.SQStride }

// SQHead is the index of the oldest WQE not completed.
func (q *QP) SQHead() uint32 { return q.sqHead }

// SQNext is the index after idx.
func (q *QP) SQNext(idx uint32) uint32 { return abi.Next(idx, q.layout.SQEntries) }

// SQPending returns how many WQEs are posted beyond the head; false when
// the workload's tail is invalid (drain deals with it).
func (q *QP) SQPending() (uint32, bool) {
	return abi.Pending(abi.Word(q.ring.Bytes(), abi.OffSQTail).Load(), q.sqHead, q.layout.SQEntries)
}

// PostedBeyond reports whether the workload posted past index idx.
func (q *QP) PostedBeyond(idx uint32) bool {
	return abi.Word(q.ring.Bytes(), abi.OffSQTail).Load() != idx
}

// ReadWQE copies SQ slot idx into slot, the path's private copy (the
// workload may rewrite the shared one at any time), and decodes it into w.
func (q *QP) ReadWQE(idx uint32, slot []byte, w *abi.SendWQE) abi.WCStatus {
	size, stride := q.layout.SQEntries, q.layout.SQStride
	off := q.layout.SQOffset + abi.Slot(idx, size)*stride
	copy(slot, q.ring.Bytes()[off:off+stride])
	st := abi.DecodeSend(slot, w, q.caps.MaxSendSGE, q.caps.MaxInlineData)
	if q.typ != abi.QPTypeXRCSend {
		w.XRCSRQN = 0 // only an XRC initiator's requests name an XRC SRQ
	}
	return q.ucRefuse(w, st)
}

// NextPSN takes the PSN of the next request.
func (q *QP) NextPSN() uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	p := q.npsn
	q.npsn = rc.PSNNext(p)
	return p
}

// TakePSNs takes n PSNs for the next request (a message of n packets, or
// a READ of n response packets) and returns the first.
func (q *QP) TakePSNs(n uint32) uint32 {
	q.mu.Lock()
	defer q.mu.Unlock()
	p := q.npsn
	q.npsn = (p + n) & rc.PSNMask
	return p
}

// CompleteHead completes the WQE at the head, w, with status st and n
// bytes, in the one order every path keeps: an error moves the QP to ERR
// first (a workload that sees the error and queries the QP finds it in
// ERR), then the slot is freed (a workload that sees the completion may
// post into it at once), then the completion is written.
//
// The head moves only here, after the path executed the WQE to its end
// (memcpy: after the target side consumed its receive and wrote its
// completion), or at a flush or reset: the memcpy-direct libraries' rule 2
// (wire-local.md §4.21, and §4.22's send channel) takes an SQ-head word
// equal to their tail to mean that nothing relayed is still to land.
//
// The head word is published before every completion that is written,
// and otherwise every headBatch WQEs and whenever the goroutine stops
// executing (PublishHead): a workload that posts one unsignaled WQE per
// call would otherwise read the line the agent stores for every WQE, and
// each of the two moves it between cores.
func (q *QP) CompleteHead(w *abi.SendWQE, st abi.WCStatus, n uint32) {
	if st != abi.WCSuccess && st != abi.WCWRFlushErr {
		q.MoveToErr(fmt.Sprintf("work request 0x%x (%s) failed: %s", w.WRID, w.Opcode, st))
	}
	q.sqHead = abi.Next(q.sqHead, q.layout.SQEntries)
	q.sqUnpublished++
	if st != abi.WCSuccess || w.Flags&abi.SendSignaled != 0 || q.sqSigAll || q.sqUnpublished >= q.headBatch() {
		q.PublishHead()
	}
	q.completeSend(w, st, n)
	q.sqCompleted.Store(q.sqHead)
}

// PublishHead stores the SQ head the agent has reached in the ring, if it
// has not yet: the slots before it are the workload's again. The QP's
// goroutine calls it before it waits, for work or out a delay.
func (q *QP) PublishHead() {
	if q.sqUnpublished != 0 {
		q.sqUnpublished = 0
		abi.Word(q.ring.Bytes(), abi.OffSQHead).Store(q.sqHead)
	}
}

// moveHead moves the SQ head to h and publishes it at once (a reset, a
// flush).
func (q *QP) moveHead(h uint32) {
	q.sqHead = h
	q.sqUnpublished = 1
	q.PublishHead()
}

// headBatch is how many completed WQEs the head may lag: a quarter of
// the queue, at most 16.
func (q *QP) headBatch() uint32 { return max(1, min(16, q.layout.SQEntries/4)) }

// Remote returns the Remote end the QP was connected to at RTR.
func (q *QP) Remote() (qpn uint32, gid abi.GID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.remoteQPN, q.remoteGID
}

// Clock is the device's clock, on which the QP's Timer runs.
func (q *QP) Clock() clock.Clock { return q.vm.d.clk }

// SendQueue is the requester side of a send queue, as a path's requester
// engine (internal/rc/requester) sees it; *QP implements it. Every method
// is called from the QP's send-queue goroutine (runSQ, through Path.Pump,
// Drop and Flush), which owns what they return, unless its comment names
// another caller. The engine's state lives from RTR to RESET (the path's
// lifetime); the queue's lives as long as the QP.
type SendQueue interface {
	// Sending reports whether the goroutine may go on sending (no stop,
	// no RESET since it caught up).
	Sending() bool
	// State is the QP's state; any goroutine.
	State() abi.QPState
	// SlotSize is the size of one SQ slot, for the engine's private copies.
	SlotSize() uint32
	// SQHead is the index of the oldest WQE not completed.
	SQHead() uint32
	// SQNext is the index after idx.
	SQNext(idx uint32) uint32
	// SQPending is how many WQEs are posted beyond the head; false: the
	// workload's tail is invalid (the device deals with it).
	SQPending() (uint32, bool)
	// PostedBeyond reports whether the workload posted past idx.
	PostedBeyond(idx uint32) bool
	// ReadWQE copies slot idx into slot (the caller's private copy, which
	// it keeps until the WQE completes) and decodes it into w.
	ReadWQE(idx uint32, slot []byte, w *abi.SendWQE) abi.WCStatus
	// GatherLocal resolves w's local side into segs (guest memory, kept
	// until the WQE completes, then cleared by the caller).
	GatherLocal(w *abi.SendWQE, slot []byte, segs *[abi.MaxSGE][]byte) Local
	// ExecLocal executes a BIND_MW or LOCAL_INV work request at the QP
	// and returns its status; the caller completes it.
	ExecLocal(w *abi.SendWQE) abi.WCStatus
	// TakePSNs takes n PSNs for the next request and returns the first.
	TakePSNs(n uint32) uint32
	// RCAttrs reads the QP's RC attributes together.
	RCAttrs() RCAttrs
	// CompleteHead completes the WQE at the head (w, the caller's copy)
	// with st and n bytes; an error moves the QP to ERR first.
	CompleteHead(w *abi.SendWQE, st abi.WCStatus, n uint32)
	// NoteSent counts n bytes of a WR that completed successfully.
	NoteSent(n uint64)
	// Sleep waits d; false early when the QP stops or leaves the sending
	// states.
	Sleep(d time.Duration) bool
	// Clock is the clock Timer runs on.
	Clock() clock.Clock
	// Timer is the QP's RC timer, the goroutine's alone.
	Timer() clock.Timer
	// WakeCh is poked (without blocking) when a response arrives or the
	// state changes; any goroutine may poke it.
	WakeCh() chan struct{}
	// Counters are the QP's counters; any goroutine.
	Counters() *Counters
	// HoldMemory takes the VM's memory for a response that lands in a
	// WQE's local buffers from another goroutine (a READ's data); false,
	// holding nothing, when the VM or the QP is gone. Release ends it.
	// The goroutine that delivers responses calls both, never across I/O.
	HoldMemory() bool
	// Release ends HoldMemory.
	Release()
}

var _ SendQueue = (*QP)(nil)

// Source is the requester's QP as the path made for it sees it: its send
// queue (SendQueue, which a windowed path hands to the RC requester
// engine) and what the path's own requester asks of the QP besides: the
// QP's number and address, the remote end it was connected to, its port,
// and ExecPending for a path that executes one WR at a time. *QP implements
// it. A path gets it when it is made (Route.New, under the QP's lock at
// RTR) and may keep it as long as it lives (until RESET or the QP's end);
// like SendQueue's, its methods are called from the QP's send-queue
// goroutine unless their comment names another caller. A path's
// responder never uses it: it finds its Target by QPN (Targets).
type Source interface {
	SendQueue
	// QPN is the QP's number (the requester's source QPN); any
	// goroutine.
	QPN() uint32
	// GID is the GID of the QP's adapter; any goroutine.
	GID() abi.GID
	// Remote is the remote end the QP was connected to at RTR; any
	// goroutine.
	Remote() (qpn uint32, gid abi.GID)
	// PortUp reports whether the port of the QP's adapter is up: a
	// request sent while it is down is lost (the requester's timeout
	// retries it); any goroutine.
	PortUp() bool
	// ExecPending executes the WQEs from the SQ head with ex, each to
	// its end, and completes them, while the QP is in RTS (the path
	// implements SyncExecutor: memcpy, UD). Called from Path.Pump.
	ExecPending(ex SyncExecutor)
}

var _ Source = (*QP)(nil)

// PortUp reports whether the port of the QP's adapter is up.
func (q *QP) PortUp() bool { return q.ad.Connected() }
