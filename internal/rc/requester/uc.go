// SPDX-License-Identifier: Apache-2.0

package requester

// UC mode (device.RCAttrs.UC): the engine without its reliability. A UC
// QP's requester sends as an RC one does — the window, one PSN per
// packet, the batches, the outstanding bound — but expects no response:
// a work request is settled with success once its packets left (the
// wire's Flush returned, whatever it said: a packet that could not go is
// lost, as one lost on the way), so nothing is retransmitted, no timeout
// runs and no retry budget is spent. The responder drops a message a lost
// packet broke (the paths' UC responders).

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rc"
)

// settleUC settles, oldest first, the WQEs whose packets all left, and
// counts the packets of one that left in part as acknowledged (the
// outstanding and span bounds then let the rest go); when one is left
// with packets not sent, the engine sends again at once (more).
func (r *Engine) settleUC() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 0; i < r.n; i++ {
		e := r.at(i)
		if e.done {
			continue
		}
		if e.local != abi.WCSuccess {
			return
		}
		end := (e.PSN + e.sent) & rc.PSNMask
		if rc.PSNDiff(end, r.ackPSN) > 0 {
			r.ackPSN, r.seenPSN = end, end
			r.moved = true
		}
		if e.sent < e.Packets() {
			// Stopped at a bound (the batch, the outstanding PSNs):
			// nothing but the engine itself holds it back.
			r.more, r.blocked = true, false
			return
		}
		e.done, e.st = true, abi.WCSuccess
	}
}
