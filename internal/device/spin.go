// SPDX-License-Identifier: Apache-2.0

package device

// Adaptive polling in async mode (qp.waitWork, asyncGovernor, asyncSpin).
//
// An async-mode QP's goroutine waits for work in one of two ways:
//
//   - polling: after its work it polls its own queues with the doorbell
//     flag clear (the workload does not ring), yielding the CPU between
//     looks, for a window it learns — twice the wait that last ended
//     within it, or twice the wait the doorbell ended soon after it
//     passed, at least the path's doorbell-mode poll (asyncSpinMin …
//     asyncSpinMax) — and then sleeps on its doorbell;
//   - doorbell: exactly what doorbell mode does (the path's short poll,
//     then the doorbell).
//
// Which one is not the QP's choice but the agent's (the Device's
// asyncGovernor, one per agent process): whether polling wins depends on
// what every spinner of the machine does — the workloads' threads, the
// other QPs' goroutines, a peer agent's — and QPs that chose each for
// itself polled where all of them sleeping was faster (each one's poll
// won given that the others polled: on two cores, 2× slower than
// doorbell mode on memcpy). The governor runs the whole agent in one
// mode for an epoch of asyncEpoch, aligned to the wall clock so that two
// agents of one machine (the two ends of a tcp or rdma pair) switch
// together, and measures the async QPs' median cycle: the time from one
// work the QP's goroutine picked up to its next — the handling of the
// work, then the wait for more. For a workload that posts once its last
// work completed (a ping-pong, any request-response loop) that is its
// round trip as the library sees it, post to post, measured with nothing
// the library reports; for one that posts on its own clock it is that
// clock in either mode, a tie. A cycle counts up to asyncCycleCap (a
// queue left idle says nothing about either mode), and only when it lay
// in one epoch (one mode). It used to measure the wait alone, which
// misjudged: polling shortens the wait (the goroutine is on a core when
// the post lands) while it stretches the rest of the round trip (the
// goroutine's own handling, the workload's reaction, each delayed by the
// spinners that share its cores), so the wait said polling won where the
// round trip was 2× doorbell mode's (memcpy, two cores, two spinning
// workloads). The median, not the mean: a poll that keeps more threads
// spinning than there are cores can shorten the tail and still double
// the typical cycle.
//
// Doorbell mode is the incumbent at first. Every gap epochs the other is
// tried (gap from asyncProbeMin, doubling up to asyncProbeMax while the
// incumbent keeps winning, back to asyncProbeMin on a switch): polling
// for one epoch, the doorbell for doorbellTry epochs; polling is tried
// only once doorbell mode has asyncRefEpochs/2 epochs to be judged by,
// and only if at least one wait in asyncSleepy of the last doorbell
// epoch slept until its doorbell rang — otherwise doorbell mode's own
// poll caught the work and a longer one cannot bring it sooner.
// Doorbell mode's median cycle is that of its last epochs pooled
// (doorbellMedianLocked), polling's that of its last epoch. Polling
// becomes the incumbent when its median cycle was shorter than the
// doorbell's by a quarter in asyncWinsToPoll tries in a row, and stays
// it only while every try of the doorbell confirms that. A quarter, not
// a tenth: medians are known to a bucket (9 %), a tenth was one or two,
// and on memcpy a try at 8.2 µs against the doorbell's 10.2 won polling
// its second try in a row, and the epochs it then polled gave 22 µs. A
// poll that takes the core of the thread that posts the next work, or
// of the goroutine that handles it, makes the cycles longer, and so
// loses: where polling cannot win (fewer cores than spinners, work that
// comes later than the window), async mode is doorbell mode but for one
// epoch in asyncProbeMax, and with a core to spare it saves the
// workload's doorbell system call and the agent's wake-up. On two cores
// shared by two spinning workloads, doorbell mode itself has two states:
// its poll catches the next post (memcpy round trip ~11 µs) or every
// post finds both goroutines asleep (~55 µs), and which one a run falls
// into changes with the machine's load; polling for longer gives ~27 µs
// in either. The cycles tell the three apart, the waits did not.
//
// The cores: a poller yields the CPU (sched_yield) between looks, and
// the Go scheduler too when the agent has one P (GOMAXPROCS 1), so that
// the thread or goroutine it waits for can run; at most asyncSlotsPerCPU
// goroutines per usable CPU (runtime.NumCPU: the agent's affinity mask,
// sched_getaffinity) poll at once, the others sleep at once, so a
// thousand idle async QPs cost no more than a few.

import (
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The bounds of async mode's polling window; the epoch of the agent's
// choice between polling and the doorbell, and the start of each epoch
// whose cycles do not count (the machine settling into the epoch's mode:
// cycles that follow a polling epoch are polling's length, too long for
// doorbell mode's short poll, until every QP of the round trip has slept
// once or caught its work); the cycles an epoch needs to count, the
// longest cycle it counts, the fewest and the most epochs
// between two tries of the mode that lost (powers of two: two agents
// with different gaps still try together at the larger one's), and the
// tries in a row polling must win to take over.
const (
	asyncSpinMin    = 5 * time.Microsecond
	asyncSpinMax    = 500 * time.Microsecond
	asyncEpoch      = 10 * time.Millisecond
	asyncSettle     = 2 * time.Millisecond
	asyncMinCycles  = 16
	asyncCycleCap   = time.Millisecond
	asyncProbeMin   = 4
	asyncProbeMax   = 64
	asyncWinsToPoll = 2
	asyncSleepy     = 8
	asyncRefEpochs  = 8
	asyncTryMax     = 4
)

// asyncGovernor is an agent's choice between polling and the doorbell
// for its async-mode QPs (see the top of the file); a Device's. Every
// async QP's goroutine reads the mode at the start of each wait (begin)
// and reports the wait and the cycle it closes when work ends it
// (record); the first goroutine to begin a wait in a new epoch closes
// the last one.
type asyncGovernor struct {
	// state is the epoch in progress and its mode, epoch<<1 | polling:
	// what begin reads without the lock.
	state atomic.Uint64

	mu sync.Mutex
	// The epoch in progress (wall-clock nanoseconds / asyncEpoch): its
	// waits so far, those that slept until the doorbell, and its cycles
	// and their lengths (waitBucket).
	epoch  int64               // +checklocks:mu
	waits  int                 // +checklocks:mu
	slept  int                 // +checklocks:mu
	cycles int                 // +checklocks:mu
	hist   [waitBuckets]uint32 // +checklocks:mu
	// sleepy: in the last doorbell epoch that counted, at least one wait
	// in asyncSleepy ended by the doorbell (slept). Otherwise doorbell
	// mode's own poll catches the work, polling longer cannot bring it
	// sooner, and the tries of polling are skipped.
	sleepy bool // +checklocks:mu
	// The median cycle of each mode as the governor judges it: [0]
	// doorbell, [1] polling; 0: none yet; and the last epoch of that
	// mode that counted. Polling's is its last epoch's; the doorbell's
	// is that of the cycles of its last asyncRefEpochs epochs pooled
	// (ref), those of the last asyncProbeMax epochs.
	med [2]time.Duration // +checklocks:mu
	at  [2]int64         // +checklocks:mu
	// ref holds the cycle lengths of the doorbell epochs that counted
	// last (waitBucket), a ring from refNext, and refAt their epochs
	// (0: none).
	ref     [asyncRefEpochs][waitBuckets]uint32 // +checklocks:mu
	refAt   [asyncRefEpochs]int64               // +checklocks:mu
	refNext int                                 // +checklocks:mu
	// Polling won the last try (the incumbent); gap is how many epochs
	// between tries of the other; 0: nothing began yet. wins counts the
	// tries in a row that polling won while the doorbell is the
	// incumbent.
	incumbent bool  // +checklocks:mu
	gap       int64 // +checklocks:mu
	wins      int   // +checklocks:mu
	// switches counts the switches of the incumbent.
	switches uint64 // +checklocks:mu
}

// begin returns the epoch a wait starting at now belongs to and whether
// it polls, closing the epoch before if now is past it.
func (g *asyncGovernor) begin(now time.Time) (int64, bool) {
	e := now.UnixNano() / int64(asyncEpoch)
	s := g.state.Load()
	if int64(s>>1) != e {
		g.mu.Lock()
		if e > g.epoch || g.gap == 0 {
			g.rollLocked(e)
		}
		s = g.state.Load()
		g.mu.Unlock()
		if int64(s>>1) != e {
			return e, false // a clock that went back: sleep, count nothing
		}
	}
	return e, s&1 == 1
}

// probe reports whether epoch e tries the mode that did not win, with
// tries every gap epochs.
func probe(e, gap int64) bool { return e%gap == 0 }

// doorbellTry is how many epochs a try of the doorbell lasts, with tries
// every gap epochs: a quarter of the gap, from one up to asyncTryMax.
// One is not enough once polling held the agent a while: on memcpy the
// doorbell epochs right after polling ones were in doorbell mode's slow
// state (every wait sleeping, ~50 µs cycles) in every try traced, and
// its fast state (~10 µs) came back one to three epochs later, so tries
// of one epoch kept polling (~22 µs) the incumbent for the whole run.
func doorbellTry(gap int64) int64 { return min(max(gap/4, 1), asyncTryMax) }

// rollLocked closes the epoch in progress and begins e: it learns from
// the closed epoch's median cycle, and from a try of the other mode which
// mode wins.
//
// +checklocks:g.mu
func (g *asyncGovernor) rollLocked(e int64) {
	if g.gap == 0 { // the first wait: doorbell mode first
		g.gap = asyncProbeMin
	} else if g.cycles >= asyncMinCycles {
		polled := g.state.Load()&1 == 1
		i := 0
		if polled {
			i = 1
		}
		g.med[i], g.at[i] = medianOf(g.cycles, &g.hist), g.epoch
		if !polled {
			g.sleepy = g.slept*asyncSleepy >= g.waits
			g.med[0] = g.doorbellMedianLocked()
		}
		inc := 0
		if g.incumbent {
			inc = 1
		}
		// A try of the doorbell is judged at its last epoch, on the
		// cycles of all of them (doorbellMedianLocked).
		ends := polled || g.epoch%g.gap == doorbellTry(g.gap)-1
		if polled != g.incumbent && ends && g.med[inc] > 0 && g.epoch-g.at[inc] <= g.gap {
			// A try that counted, against the incumbent's last epoch
			// (one since the last try).
			// Polling takes over after asyncWinsToPoll tries in a
			// row (one epoch's median is noisy, and a false win costs
			// the epochs until the next try), and gives up at its
			// first try that does not win.
			won := 4*g.med[1] < 3*g.med[0]
			if won && !g.incumbent {
				if g.wins++; g.wins < asyncWinsToPoll {
					won = false
				}
			} else {
				g.wins = 0
			}
			if won != g.incumbent {
				g.incumbent, g.gap, g.wins = won, asyncProbeMin, 0
				g.switches++
			} else if g.wins == 0 {
				g.gap = min(2*g.gap, asyncProbeMax)
			}
		}
	}
	g.epoch, g.waits, g.slept, g.cycles, g.hist = e, 0, 0, 0, [waitBuckets]uint32{}
	var polling uint64
	switch {
	case g.incumbent:
		if e%g.gap >= doorbellTry(g.gap) {
			polling = 1
		}
	case probe(e, g.gap) && g.sleepy && g.freshRefLocked(e) >= asyncRefEpochs/2:
		// Tried only once doorbell mode has epochs enough to judge it
		// by: an agent's first epochs with async QPs are slow in
		// either mode (connections, first touches), and polling won
		// against them and then held the agent.
		polling = 1
	}
	g.state.Store(uint64(e)<<1 | polling)
}

// freshRefLocked is how many doorbell epochs of ref are fresh at e.
//
// +checklocks:g.mu
func (g *asyncGovernor) freshRefLocked(e int64) int {
	n := 0
	for _, at := range g.refAt {
		if freshRef(at, e) {
			n++
		}
	}
	return n
}

// freshRef reports whether ref's epoch at (0: none) is of the last
// asyncProbeMax epochs at e: one that judges doorbell mode.
func freshRef(at, e int64) bool { return at != 0 && e-at < asyncProbeMax }

// record counts a wait of epoch e that ended with work (slept: it slept
// until the doorbell rang) and, if cycled, the cycle it closed, of
// length d.
func (g *asyncGovernor) record(e int64, slept bool, d time.Duration, cycled bool) {
	g.mu.Lock()
	if e == g.epoch {
		g.waits++
		if slept {
			g.slept++
		}
		if cycled {
			g.cycles++
			g.hist[waitBucket(min(d, asyncCycleCap))]++
		}
	}
	g.mu.Unlock()
}

// Cycle lengths are counted in buckets of an eighth of an octave
// (2^(1/8), 9 %): a length of n ≥ 4 bits whose three bits after the
// leading one are k is in bucket 8(n-3)+k; lengths below 8 ns have a
// bucket each. Up to 2^21 ns (asyncCycleCap is less).
const waitBuckets = 8 * 19

// waitBucket is the bucket of length d.
func waitBucket(d time.Duration) int {
	ns := uint64(max(d, 0))
	n := bits.Len64(ns)
	if n < 4 {
		return int(ns)
	}
	return min(8*(n-3)+int(ns>>(n-4)&7), waitBuckets-1)
}

// bucketFloor is the shortest length of bucket b.
func bucketFloor(b int) time.Duration {
	if b < 8 {
		return time.Duration(b)
	}
	n, k := b/8+3, b%8
	return time.Duration((8 | uint64(k)) << (n - 4))
}

// doorbellMedianLocked adds the doorbell epoch in progress to ref and
// returns the median of the cycles ref holds from the last
// asyncProbeMax epochs: doorbell mode's typical cycle.
//
// Not the epoch's own median: on two cores shared by two spinning
// workloads doorbell mode flips between two states that last a few
// epochs each (its poll catches the next post, ~10 µs memcpy cycles, or
// every post finds the QPs' goroutines asleep, ~55 µs), while polling
// gives ~22 µs in most tries. A try of polling judged against the doorbell
// epoch before it won whenever that epoch was a slow one — the slow
// epochs are also the ones after which polling is tried (sleepy) — and
// polling then held the agent at twice the fast state's cycle. Pooled
// by cycle, as a workload's median round trip is, a few slow epochs
// among fast ones leave the median fast: polling must beat what
// doorbell mode typically gives, not its worst moments.
//
// +checklocks:g.mu
func (g *asyncGovernor) doorbellMedianLocked() time.Duration {
	g.ref[g.refNext], g.refAt[g.refNext] = g.hist, g.epoch
	g.refNext = (g.refNext + 1) % asyncRefEpochs
	var pooled [waitBuckets]uint32
	n := 0
	for i, at := range g.refAt {
		if !freshRef(at, g.epoch) {
			continue
		}
		for b, c := range g.ref[i] {
			pooled[b] += c
			n += int(c)
		}
	}
	return medianOf(n, &pooled)
}

// medianOf is the median length of the n > 0 cycles counted by bucket in
// hist, to a bucket's precision.
func medianOf(n int, hist *[waitBuckets]uint32) time.Duration {
	seen := 0
	for b, c := range hist {
		if seen += int(c); 2*seen >= n {
			return max(bucketFloor(b), 1)
		}
	}
	return asyncCycleCap
}

// asyncSpin is what an async-mode QP's goroutine knows of its waits; the
// goroutine's own.
type asyncSpin struct {
	window time.Duration // the next poll's window; 0: none learned yet
	start  time.Time     // the start of the last poll that found nothing
	polled bool          // the wait polled and found nothing (start is set)

	waits   uint32    // waits begun
	timed   bool      // the wait in progress is timed (asyncSample): its start is last
	last    time.Time // when the timed wait in progress began: its cycle's start
	epoch   int64     // the governor's epoch of the timed wait in progress
	polling bool      // it polls
	slept   bool      // it slept until the doorbell rang
	worked  bool      // work ended it (end): the next begin closes its cycle if timed
}

// asyncSample: a QP's goroutine times one wait in asyncSample (reads the
// clock at its start, and at the next wait's start to close its cycle);
// the other waits take the mode of the governor's epoch in progress
// without reading the clock or taking its lock. Enough cycles still
// count: a path's round trip is at most ~150 µs where async mode matters
// (tcp), 16 or more timed cycles a QP in a 10 ms epoch.
const asyncSample = 4

// begin starts a wait under g, and first closes the wait before if it
// was timed and work ended it; it reads clock only then or if this wait
// is timed (one in asyncSample). The cycle it closes (that wait, then
// the handling of the work that ended it: from its start to now) counts
// if all of it lay in the wait's epoch, asyncSettle or more after the
// epoch's start: one mode, settled. The cycles of each epoch's first
// asyncSettle do not count, nor does one across two epochs, though
// their waits do.
//
// A cycle is closed here, after the work's handling, rather than when the
// work is found: what is between the two is the response the
// workload waits for, and on memcpy the governor's clock read and lock
// there (a lock the agent's QPs share) made async mode's round trip
// 1.3× doorbell mode's with the governor never polling (20 rounds
// alternated; 1.03 once moved here, 16 rounds): the two spinning
// workloads and the agent's two QP threads on two cores settle into a
// fast or a slow schedule run by run, and the work on the path tipped
// most runs into the slow one.
func (s *asyncSpin) begin(g *asyncGovernor, clock func() time.Time) {
	if s.window == 0 {
		s.window = asyncSpinMin
	}
	s.waits++
	closes, timing := s.timed && s.worked, s.waits%asyncSample == 0
	s.timed, s.worked = timing, false
	if !closes && !timing {
		s.slept, s.polling = false, g.state.Load()&1 == 1
		return
	}
	now := clock()
	if closes {
		from, to := s.last.UnixNano(), now.UnixNano()
		cycled := from/int64(asyncEpoch) == s.epoch && to/int64(asyncEpoch) == s.epoch && from%int64(asyncEpoch) >= int64(asyncSettle)
		g.record(s.epoch, s.slept, now.Sub(s.last), cycled)
	}
	s.slept, s.last = false, now
	s.epoch, s.polling = g.begin(now)
}

// end ends the wait begun last: work came. It reads no clock and takes no
// lock; the next begin closes the cycle.
func (s *asyncSpin) end() { s.worked = true }

// polledFor learns from a poll that started at start: found, work came
// after waited.
func (s *asyncSpin) polledFor(start time.Time, waited time.Duration, found bool) {
	s.start, s.polled = start, !found
	if found {
		s.window = clampSpin(2 * waited)
	}
}

// rung learns from the doorbell that rang (at now()) and ended a wait
// whose poll found nothing: work that came soon after the window is a
// window too short. It reads the clock only then.
func (s *asyncSpin) rung(now func() time.Time) {
	s.slept = true
	if !s.polled {
		return
	}
	s.polled = false
	s.window = clampSpin(2 * now().Sub(s.start))
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
// asyncSlotsPerCPU per usable CPU: more than the doorbell mode's one per
// CPU (TrySpin), as the governor has measured that polling wins when it
// polls, and on a machine of one core the QPs of a ping-pong must all
// poll for any to win; fewer than a thousand.
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
