package agent

// The RC rules every path's requester shares (IBTA 9.7.5.2, 9.7.6): the
// retry budget of a work request, the local ACK timeout and the RNR NAK
// timer table.

import (
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// retryBudget counts what is left of the retries of the oldest work
// request in flight: retry_cnt transport retries (no response, a lost
// connection, a sequence error) and rnr_retry RNR retries (7: infinite).
// An episode begins at the first retry and ends when the request is
// accepted (reset).
type retryBudget struct {
	armed   bool
	retries uint8
	rnr     uint8
}

// arm loads the QP's counters at the first retry of an episode.
func (b *retryBudget) arm(a *abi.QPAttr) {
	if !b.armed {
		b.retries, b.rnr, b.armed = a.RetryCnt, a.RNRRetry, true
	}
}

// reset ends the episode: the request was accepted.
func (b *retryBudget) reset() { b.armed = false }

// transport spends a transport retry; false, with the status to complete
// the request with, when none is left.
func (b *retryBudget) transport(c *qpCounters) (abi.WCStatus, bool) {
	if b.retries == 0 {
		return abi.WCRetryExcErr, false
	}
	b.retries--
	c.retries.Add(1)
	return abi.WCSuccess, true
}

// rnrNak spends an RNR retry for an RNR NAK received; false, with the
// status to complete the request with, when none is left.
func (b *retryBudget) rnrNak(c *qpCounters) (abi.WCStatus, bool) {
	c.rnrRcvd.Add(1)
	if b.rnr == 0 {
		return abi.WCRNRRetryExcErr, false
	}
	if b.rnr != 7 {
		b.rnr--
	}
	return abi.WCSuccess, true
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
