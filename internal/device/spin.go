// SPDX-License-Identifier: Apache-2.0

package device

// Adaptive polling in async mode (qp.waitWork, asyncSpin).
//
// An async-mode QP's goroutine waits for work in one of two ways, and
// keeps to the one that brings work sooner on this machine:
//
//   - polling: after its work it polls its own queues with the doorbell
//     flag clear (the workload does not ring), yielding the CPU between
//     looks, for a window it learns — twice the wait that last ended
//     within it, or twice the wait the doorbell ended soon after it
//     passed (asyncSpinMin … asyncSpinMax) — and then sleeps on its
//     doorbell;
//   - doorbell: what doorbell mode does (the path's short poll, then the
//     doorbell).
//
// It measures how long its waits take in each, in epochs of asyncEpoch
// waits (each wait counted up to asyncWaitCap: a queue left idle says
// nothing about either), and polls only while polling's mean wait is
// shorter by a tenth. A poller that takes the core of the thread that
// posts the next work (a workload, a peer's agent) on a machine with
// fewer cores than threads makes the waits longer, and so loses. The
// mode that lost is tried again for one epoch after asyncEpoch, then
// twice as many, up to asyncProbeMax epochs while the other keeps
// winning: so where polling cannot win, async mode is doorbell mode but
// for one epoch in asyncProbeMax, and with a core to spare it saves the
// workload's doorbell system call and the agent's wake-up. An idle queue
// ties and so sleeps. The goroutine polls only in one of the process's
// polling slots (TrySpin): a thousand idle async QPs cost no more than a
// few.

import (
	"runtime"
	"sync/atomic"
	"time"
)

// The bounds of async mode's polling window, the epoch of its choice
// between polling and the doorbell, the longest wait it counts, and the
// most epochs between two tries of the mode that lost.
const (
	asyncSpinMin  = 5 * time.Microsecond
	asyncSpinMax  = 500 * time.Microsecond
	asyncEpoch    = 32
	asyncWaitCap  = time.Millisecond
	asyncProbeMax = 64
)

// asyncSpin is what an async-mode QP's goroutine learned about waiting;
// the goroutine's own.
type asyncSpin struct {
	window time.Duration // the next poll's window
	start  time.Time     // the start of the last poll that found nothing
	polled bool          // the wait polled and found nothing (start is set)

	begun     time.Time        // the start of the wait in progress
	polling   bool             // the epoch in progress polls
	incumbent bool             // the mode that won last: polling
	probing   bool             // the epoch in progress tries the mode that lost
	waits     int              // waits in the epoch in progress
	sum       time.Duration    // their durations, each up to asyncWaitCap
	mean      [2]time.Duration // the last epoch's mean wait: [0] doorbell, [1] polling; 0: none yet
	left      int              // epochs until the mode that lost is tried
	gap       int              // epochs between its tries
}

// begin starts a wait; it polls when s.polling.
func (s *asyncSpin) begin() {
	if s.window == 0 { // the first wait: poll first, then try the doorbell
		s.window, s.polling, s.incumbent, s.left, s.gap = asyncSpinMin, true, true, 1, 1
	}
	s.begun = time.Now()
}

// end ends the wait begun last: work came.
func (s *asyncSpin) end() {
	s.sum += min(time.Since(s.begun), asyncWaitCap)
	if s.waits++; s.waits < asyncEpoch {
		return
	}
	i := 0
	if s.polling {
		i = 1
	}
	s.mean[i] = s.sum / time.Duration(s.waits)
	s.waits, s.sum = 0, 0
	if s.probing {
		s.probing = false
		if won := s.pollingWins(); won != s.incumbent {
			s.incumbent, s.gap = won, 1
		} else {
			s.gap = min(2*s.gap, asyncProbeMax)
		}
		s.left = s.gap
	} else if s.left--; s.left <= 0 {
		s.probing = true
	}
	s.polling = s.incumbent != s.probing
}

// pollingWins reports whether polling's mean wait is shorter than the
// doorbell's by a tenth.
func (s *asyncSpin) pollingWins() bool {
	return s.mean[1] > 0 && (s.mean[0] == 0 || 10*s.mean[1] < 9*s.mean[0])
}

// polledFor learns from a poll that started at start: found, work came
// after waited.
func (s *asyncSpin) polledFor(start time.Time, waited time.Duration, found bool) {
	s.start, s.polled = start, !found
	if found {
		s.window = clampSpin(2 * waited)
	}
}

// rung learns from the doorbell that ended a wait whose poll found
// nothing: work that came soon after the window is a window too short.
func (s *asyncSpin) rung() {
	if !s.polled {
		return
	}
	s.polled = false
	s.window = clampSpin(2 * time.Since(s.start))
}

func clampSpin(d time.Duration) time.Duration { return min(max(d, asyncSpinMin), asyncSpinMax) }

// spinFor looks for work without sleeping for up to d, yielding the CPU
// between looks, and reports whether it found some.
func (q *QP) spinFor(tailW *atomic.Uint32, d time.Duration) bool {
	// Yield between looks: on a small machine the thread that must run
	// next (a workload, or another QP's goroutine waking) may need this
	// core.
	// With one P, the goroutines that wait for it (another QP's, a
	// reader's) run only when this one yields it too.
	one := runtime.GOMAXPROCS(0) == 1
	start := time.Now()
	defer func() { q.ctr.PollNanos.Add(uint64(time.Since(start))) }()
	deadline := start.Add(d)
	for i := 0; ; i++ {
		if q.hasWork(tailW.Load()) {
			return true
		}
		if i&7 == 7 {
			YieldCPU()
			if one {
				runtime.Gosched()
			}
			if time.Now().After(deadline) {
				return false
			}
		}
	}
}

// asyncSpinners counts the async-mode goroutines polling, at most
// asyncSlotsPerCPU per CPU: more than the doorbell mode's one per CPU
// (TrySpin), as polling has shown it wins where it is chosen, and on a
// machine of one core the QPs of a ping-pong must all poll for any to
// win; fewer than a thousand.
var asyncSpinners atomic.Int32

const asyncSlotsPerCPU = 4

// tryAsyncSpin takes an async-mode polling slot; false when all are
// taken. asyncSpinners.Add(-1) gives it back.
func tryAsyncSpin() bool {
	if asyncSpinners.Add(1) > int32(asyncSlotsPerCPU*runtime.NumCPU()) {
		asyncSpinners.Add(-1)
		return false
	}
	return true
}
