// Package rc holds the rules of the InfiniBand Reliable Connected
// transport that every vrdma path shares (IBTA vol. 1, chapter 9): 24-bit
// PSN arithmetic; the requester's retry budget, local ACK timeout and RNR
// NAK timer table; the NAKs a responder answers with and the completion
// status each gives the requester; and the responder's sequence state,
// which tells a new request from a duplicate (answered from its replay
// cache, never executed twice) and from one that is ahead. It is pure: no
// goroutines, no I/O, no clocks; the paths (tcp today, the software RoCEv2
// engine next) bring those.
package rc

import (
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// PSNMask keeps the 24 bits of a PSN.
const PSNMask = 0xffffff

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

// ReplayDepth is how many final responses a responder keeps for
// duplicates: at least the requester's window.
const ReplayDepth = 64

// Verdict is what a responder's sequence state says of a request's PSN.
type Verdict uint8

// The verdicts.
const (
	New       Verdict = iota // the expected PSN: execute it
	Duplicate                // behind: a retry whose response was lost; answer, do not execute again
	Ahead                    // ahead: an earlier request is missing; NAK PSN_SEQ_ERR
)

// Response is a final response a responder sent, kept for duplicates.
type Response struct {
	NAK   NAK
	Value uint64 // an atomic's original value
}

// Seq is a responder QP's sequence state: the expected PSN (ePSN) and the
// last ReplayDepth final responses. The zero Seq is not started; Start
// gives it the QP's rq_psn.
type Seq struct {
	started bool
	epsn    uint32
	valid   [ReplayDepth]bool
	psns    [ReplayDepth]uint32
	last    [ReplayDepth]Response
}

// Started reports whether Start has been called.
func (s *Seq) Started() bool { return s.started }

// Start sets the expected PSN (rq_psn) and forgets every response.
func (s *Seq) Start(rqPSN uint32) {
	*s = Seq{started: true, epsn: rqPSN & PSNMask}
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

// Replay returns the response sent for psn, if it is still kept. A
// duplicate without one (older than ReplayDepth) is answered with an ACK:
// the requester only retries what it has not seen acknowledged, and it
// completes in order.
func (s *Seq) Replay(psn uint32) (Response, bool) {
	i := psn % ReplayDepth
	if s.valid[i] && s.psns[i] == psn {
		return s.last[i], true
	}
	return Response{}, false
}

// Done records the final response to the request at the expected PSN and
// moves the expected PSN on. RNR and sequence errors are not final: the
// requester sends the request again, so they do not move it.
func (s *Seq) Done(r Response) {
	if r.NAK == NAKRNR || r.NAK == NAKSeqErr {
		return
	}
	i := s.epsn % ReplayDepth
	s.valid[i], s.psns[i], s.last[i] = true, s.epsn, r
	s.epsn = PSNNext(s.epsn)
}

// DoneN is Done for a request that takes n PSNs (an RDMA READ of n
// response packets): the response is kept for its first PSN, and the
// expected PSN moves past all n.
func (s *Seq) DoneN(r Response, n uint32) {
	if n == 0 {
		return
	}
	s.Done(r)
	if r.NAK == NAKRNR || r.NAK == NAKSeqErr {
		return
	}
	s.epsn = (s.epsn + n - 1) & PSNMask
}
