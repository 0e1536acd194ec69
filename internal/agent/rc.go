package agent

// The agent's side of the RC rules (package rc): the retry budget,
// counting into the QP's counters.

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rc"
)

// retryBudget is rc.Budget, counting retries and RNR NAKs received.
type retryBudget struct{ b rc.Budget }

// arm loads the QP's counters at the first retry of an episode.
func (r *retryBudget) arm(a *rcAttrs) { r.b.Arm(a.retryCnt, a.rnrRetry) }

// reset ends the episode.
func (r *retryBudget) reset() { r.b.Reset() }

// transport spends a transport retry (rc.Budget.Transport).
func (r *retryBudget) transport(c *qpCounters) (abi.WCStatus, bool) {
	st, ok := r.b.Transport()
	if ok {
		c.retries.Add(1)
	}
	return st, ok
}

// rnrNak spends an RNR retry for an RNR NAK received (rc.Budget.RNR).
func (r *retryBudget) rnrNak(c *qpCounters) (abi.WCStatus, bool) {
	c.rnrRcvd.Add(1)
	return r.b.RNR()
}
