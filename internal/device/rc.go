// SPDX-License-Identifier: Apache-2.0

package device

// The device's side of the RC rules (package rc): the retry budget,
// counting into the QP's counters.

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rc"
)

// RetryBudget is rc.Budget, counting retries and RNR NAKs received.
type RetryBudget struct{ b rc.Budget }

// Arm loads the QP's counters at the first retry of an episode.
func (r *RetryBudget) Arm(a *RCAttrs) { r.b.Arm(a.RetryCnt, a.RNRRetry) }

// Reset ends the episode.
func (r *RetryBudget) Reset() { r.b.Reset() }

// Transport spends a Transport retry (rc.Budget.Transport).
func (r *RetryBudget) Transport(c *Counters) (abi.WCStatus, bool) {
	st, ok := r.b.Transport()
	if ok {
		c.Retries.Add(1)
	}
	return st, ok
}

// RNRNak spends an RNR retry for an RNR NAK received (rc.Budget.RNR).
func (r *RetryBudget) RNRNak(c *Counters) (abi.WCStatus, bool) {
	c.RNRRcvd.Add(1)
	return r.b.RNR()
}
