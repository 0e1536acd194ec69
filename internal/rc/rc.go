// SPDX-License-Identifier: Apache-2.0

// Package rc holds the rules of the InfiniBand Reliable Connected
// transport that every vrdma path shares (IBTA vol. 1, chapter 9): 24-bit
// PSN arithmetic; the requester's retry budget, local ACK timeout and RNR
// NAK timer table; the NAKs a responder answers with and the completion
// status each gives the requester; and the responder's sequence state,
// which tells a new request from a duplicate (answered again, never
// executed twice: an atomic's result is kept in the responder resources,
// max_dest_rd_atomic of them) and from one that is ahead. It is pure: no
// goroutines, no I/O, no clocks; the paths (tcp today, the software RoCEv2
// engine next) bring those.
package rc

import (
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// PSNMask keeps the 24 bits of a PSN.
const PSNMask = 0xffffff

// MaxSpan bounds the PSNs a requester has taken and not had
// acknowledged, from the oldest to the newest, and so the PSNs of one
// message: a quarter of the 2^24 PSN space. PSNs are compared modulo
// 2^24 within half of it (PSNDiff), so a span of 2^23 or more makes a new
// PSN look old — a new request taken for a duplicate, a retransmission
// for a new one; a quarter leaves the other half's margin to stale
// packets still in the network. At the smallest path MTU, 256 bytes, a
// message of MaxSpan packets is 1 GiB; a larger one is refused with
// LOC_LEN_ERR (it would span half the space at 2 GiB), and from 512
// bytes up every message of up to 2 GiB fits.
const MaxSpan = 1 << 22

// PSNNext returns the PSN after p.
func PSNNext(p uint32) uint32 { return (p + 1) & PSNMask }

// PSNDiff returns a − b in 24-bit PSN arithmetic, in [−2^23, 2^23): how
// far a is ahead of b (negative: behind).
func PSNDiff(a, b uint32) int32 { return int32((a-b)&PSNMask<<8) >> 8 }

// Budget counts what is left of the retries of a requester's oldest
// request in flight: retry_cnt transport retries (no response, a lost
// connection, a sequence error) and rnr_retry RNR retries (7: infinite).
// An episode begins at the first retry and ends when the request is
// accepted (Reset).
type Budget struct {
	armed   bool
	retries uint8
	rnr     uint8
}

// Arm loads the QP's retry_cnt and rnr_retry at the first retry of an
// episode; later calls in the same episode do nothing.
func (b *Budget) Arm(retryCnt, rnrRetry uint8) {
	if !b.armed {
		b.retries, b.rnr, b.armed = retryCnt, rnrRetry, true
	}
}

// Reset ends the episode: the request was accepted.
func (b *Budget) Reset() { b.armed = false }

// Transport spends a transport retry. When none is left it returns
// false and the status to complete the request with (RETRY_EXC_ERR).
func (b *Budget) Transport() (abi.WCStatus, bool) {
	if b.retries == 0 {
		return abi.WCRetryExcErr, false
	}
	b.retries--
	return abi.WCSuccess, true
}

// RNR spends an RNR retry for an RNR NAK received. When none is left it
// returns false and the status to complete the request with
// (RNR_RETRY_EXC_ERR).
func (b *Budget) RNR() (abi.WCStatus, bool) {
	if b.rnr == 0 {
		return abi.WCRNRRetryExcErr, false
	}
	if b.rnr != 7 {
		b.rnr--
	}
	return abi.WCSuccess, true
}

// LocalACKTimeout is IBTA's local ACK timeout for the QP attribute
// timeout: 4.096 µs × 2^timeout. IBTA reads 0 as infinite; vrdma never
// waits forever and reads it as 14 (67 ms).
func LocalACKTimeout(timeout uint8) time.Duration {
	if timeout == 0 {
		timeout = 14
	}
	return time.Duration(4096<<min(timeout, 31)) * time.Nanosecond
}

// rnrTimes is IBTA's RNR NAK timer table (9.7.5.2.8), in microseconds.
var rnrTimes = [32]uint32{655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560,
	3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

// RNRDelay is the delay an RNR NAK with timer code t asks for (IBTA's
// table; only the low 5 bits count).
func RNRDelay(t uint8) time.Duration { return time.Duration(rnrTimes[t&31]) * time.Microsecond }

// NAK is how a responder refuses a request (IBTA 9.7.5.2: the AETH
// syndromes), or NAKNone for an ACK.
type NAK uint8

// The NAKs.
const (
	NAKNone      NAK = iota // ACK: executed
	NAKRNR                  // receiver not ready: no receive posted (or its CQ full); retried after the RNR delay
	NAKSeqErr               // PSN sequence error: an earlier request is missing; the requester goes back
	NAKInvReq               // invalid request: the requester completes REM_INV_REQ_ERR, the responder is in ERR
	NAKRemAccess            // remote access error: REM_ACCESS_ERR
	NAKRemOp                // remote operational error: REM_OP_ERR
)

var nakNames = [...]string{"ACK", "RNR", "PSN_SEQ_ERR", "INV_REQ", "REM_ACCESS_ERR", "REM_OP_ERR"}

func (n NAK) String() string {
	if int(n) < len(nakNames) {
		return nakNames[n]
	}
	return "NAK(?)"
}

// Status is the completion status a NAK gives the request it refuses;
// NAKRNR and NAKSeqErr give none (the requester retries).
func (n NAK) Status() abi.WCStatus {
	switch n {
	case NAKNone:
		return abi.WCSuccess
	case NAKInvReq:
		return abi.WCRemInvReqErr
	case NAKRemAccess:
		return abi.WCRemAccessErr
	case NAKRemOp:
		return abi.WCRemOpErr
	}
	return abi.WCGeneralErr
}

// NAKOf is the NAK a responder answers with when a request ended with
// status st at its end (success: NAKNone). Any status other than the
// remote access and operational errors is an invalid request.
func NAKOf(st abi.WCStatus) NAK {
	switch st {
	case abi.WCSuccess:
		return NAKNone
	case abi.WCRemAccessErr:
		return NAKRemAccess
	case abi.WCRemOpErr:
		return NAKRemOp
	}
	return NAKInvReq
}

// MaxResources is the most responder resources a QP can have: the
// device's max_qp_rd_atom, the bound of max_dest_rd_atomic.
const MaxResources = abi.MaxRdAtom

// NAKUnheld is how a responder answers a duplicate atomic whose result it
// no longer holds (nor a refusal): an invalid request. IBTA gives the
// responder max_dest_rd_atomic resources for the RDMA READs and atomics it
// executed, and forbids the requester more than that many in flight
// (max_rd_atomic, at most the peer's max_dest_rd_atomic); a duplicate of
// one older than the responder's last max_dest_rd_atomic READs and atomics
// can only come from a requester that broke that limit, the condition rxe
// answers with NAK Invalid Request ("too many RDMA READ or atomic
// requests", a class C error). An atomic is never executed twice, and an
// unanswered one would leave the requester retrying until its budget is
// spent; the NAK ends that WR at once with REM_INV_REQ_ERR. Unlike a
// class C error of a new request, it does not move the responder to ERR:
// the duplicate may be a stale copy of a request the requester completed
// long ago, which then ignores the NAK.
const NAKUnheld = NAKInvReq

// Verdict is what a responder's sequence state says of a request's PSN.
type Verdict uint8

// The verdicts.
const (
	New       Verdict = iota // the expected PSN: execute it
	Duplicate                // behind: a retry whose response was lost; answer, do not execute again
	Ahead                    // ahead: an earlier request is missing; NAK PSN_SEQ_ERR
)

// Resource is one RDMA READ or atomic a responder executed, kept in its
// responder resources for duplicates: an atomic's original value, replayed
// and never executed again; a READ's range, executed again from memory
// (IBTA allows it; rxe does the same).
type Resource struct {
	Atomic bool   // an atomic; otherwise an RDMA READ
	PSN    uint32 // its first PSN (Seq.Executed sets it)
	N      uint32 // the PSNs it takes: a READ one per response packet, an atomic one
	Value  uint64 // an atomic's original value
	// A READ's request: its R_Key, remote address and length.
	RKey uint32
	VA   uint64
	Len  uint64
}

// holds reports whether psn is one of r's PSNs.
func (r *Resource) holds(psn uint32) bool {
	d := PSNDiff(psn, r.PSN)
	return r.N > 0 && d >= 0 && uint32(d) < r.N
}

// Seq is a responder QP's sequence state: the expected PSN (ePSN), the
// responder resources (the last max_dest_rd_atomic RDMA READs and atomics
// executed, IBTA's responder resources; rxe's resp.resources[]) and the
// last refusal. A SEND or a WRITE takes no resource: a duplicate of one is
// acknowledged again, whatever came after it, so no number of them evicts
// an atomic's result. The zero Seq is not started; Start gives it the QP's
// rq_psn and max_dest_rd_atomic.
type Seq struct {
	started bool
	epsn    uint32
	depth   int // max_dest_rd_atomic, at most MaxResources
	next    int // the resource the next READ or atomic takes (round robin)
	res     [MaxResources]Resource

	refused bool // the last final response was a NAK: of nakPSN
	nakPSN  uint32
	nak     NAK
}

// Started reports whether Start has been called.
func (s *Seq) Started() bool { return s.started }

// Start sets the expected PSN (rq_psn) and the number of responder
// resources (max_dest_rd_atomic; more than MaxResources counts as
// MaxResources), and forgets every response.
func (s *Seq) Start(rqPSN uint32, maxDestRdAtomic uint8) {
	*s = Seq{started: true, epsn: rqPSN & PSNMask, depth: min(int(maxDestRdAtomic), MaxResources)}
}

// Expected returns the expected PSN.
func (s *Seq) Expected() uint32 { return s.epsn }

// Check says what psn is to the responder.
func (s *Seq) Check(psn uint32) Verdict {
	switch d := PSNDiff(psn&PSNMask, s.epsn); {
	case d > 0:
		return Ahead
	case d < 0:
		return Duplicate
	}
	return New
}

// Done records the final response to the SEND or WRITE packet at the
// expected PSN, or the refusal (a NAK) of any request there, and moves the
// expected PSN on. RNR and sequence errors are not final: the requester
// sends the request again, so they do not move it.
func (s *Seq) Done(nak NAK) {
	if nak == NAKRNR || nak == NAKSeqErr {
		return
	}
	s.refused = nak != NAKNone
	if s.refused {
		s.nakPSN, s.nak = s.epsn, nak
	}
	s.epsn = PSNNext(s.epsn)
}

// Executed records the RDMA READ or atomic r executed at the expected PSN
// in the next responder resource, evicting the oldest when all
// max_dest_rd_atomic are taken, and moves the expected PSN past its r.N
// PSNs (at least one). With no resources (max_dest_rd_atomic 0: the
// device refuses every READ and atomic) it only moves the expected PSN.
func (s *Seq) Executed(r Resource) {
	r.PSN, r.N = s.epsn, max(r.N, 1)
	s.refused = false
	s.epsn = (s.epsn + r.N) & PSNMask
	if s.depth == 0 {
		return
	}
	s.res[s.next] = r
	s.next = (s.next + 1) % s.depth
}

// find returns the resource that holds psn, or nil.
func (s *Seq) find(psn uint32) *Resource {
	for i := range s.depth {
		if r := &s.res[i]; r.holds(psn) {
			return r
		}
	}
	return nil
}

// Atomic returns the original value of the atomic executed at psn, for a
// duplicate of it, if a responder resource still holds it. When none
// does, the duplicate is answered with Refused's NAK if it was refused,
// else with NAKUnheld; never executed again, never left unanswered.
func (s *Seq) Atomic(psn uint32) (uint64, bool) {
	if r := s.find(psn & PSNMask); r != nil && r.Atomic {
		return r.Value, true
	}
	return 0, false
}

// Read returns the RDMA READ whose response holds psn, for a duplicate
// that asks for it (from that packet on), if a responder resource still
// holds it. A duplicate READ without one is dropped (IBTA class D): the
// requester asks again after its timeout, within its retry budget.
func (s *Seq) Read(psn uint32) (Resource, bool) {
	if r := s.find(psn & PSNMask); r != nil && !r.Atomic {
		return *r, true
	}
	return Resource{}, false
}

// Refused returns the NAK the request at psn was refused with, if it was
// the last final response: a refusal ends the connection (the responder
// is in ERR), so the last one is the one a duplicate can ask for again.
func (s *Seq) Refused(psn uint32) (NAK, bool) {
	if s.refused && s.nakPSN == psn&PSNMask {
		return s.nak, true
	}
	return NAKNone, false
}
