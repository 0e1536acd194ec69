// SPDX-License-Identifier: Apache-2.0

package device

import (
	"testing"
	"time"
)

// runEpochs drives g through n epochs from epoch first, each with waits
// waits, each closing a cycle whose length wait gives for the epoch's
// mode, and returns how many of them polled.
// byMode is a duration per mode: p when polling, d in doorbell mode.
func byMode(p, d time.Duration) func(polling bool) time.Duration {
	return func(polling bool) time.Duration {
		if polling {
			return p
		}
		return d
	}
}

func runEpochs(g *asyncGovernor, first int64, n, waits int, wait func(polling bool) time.Duration) (polled int) {
	return runEpochsSleeping(g, first, n, waits, true, wait)
}

// runEpochsSleeping is runEpochs whose doorbell-mode waits sleep (until
// the doorbell rings) if sleep.
func runEpochsSleeping(g *asyncGovernor, first int64, n, waits int, sleep bool, wait func(polling bool) time.Duration) (polled int) {
	for e := first; e < first+int64(n); e++ {
		at := time.Unix(0, e*int64(asyncEpoch)+int64(time.Microsecond))
		ep, polling := g.begin(at)
		if ep != e {
			panic("epoch mismatch")
		}
		if polling {
			polled++
		}
		for range waits {
			g.record(ep, !polling && sleep, wait(polling), true)
		}
	}
	return polled
}

// The governor starts in doorbell mode, tries polling, keeps it while it
// wins by more than a quarter, drops it when it stops winning (a try of
// the doorbell every gap epochs, up to asyncTryMax epochs long), and then
// polls only one epoch in asyncProbeMax.
func TestAsyncGovernorFollowsTheWinner(t *testing.T) {
	var g asyncGovernor
	const first = 1_000_001 // not a try of polling (a multiple of asyncProbeMin)
	if _, polling := g.begin(time.Unix(0, first*int64(asyncEpoch))); polling || g.incumbent {
		t.Fatal("the first epoch, not a try, polls; want doorbell mode first")
	}
	// Polling wins: 5 µs waits against 20.
	wins := byMode(5*time.Microsecond, 20*time.Microsecond)
	n := 4 * asyncProbeMax
	polled := runEpochs(&g, first+1, n, 32, wins)
	if !g.incumbent {
		t.Fatalf("polling 4× faster is not the incumbent after %d epochs (%d polled)", n, polled)
	}
	if polled < n*3/4 {
		t.Errorf("polling 4× faster: %d of %d epochs polled, want most", polled, n)
	}
	// Polling now loses: 40 µs against 20.
	loses := byMode(40*time.Microsecond, 20*time.Microsecond)
	e := first + 1 + int64(n)
	runEpochs(&g, e, asyncProbeMax+asyncTryMax, 32, loses)
	if g.incumbent {
		t.Fatal("polling 2× slower is still the incumbent")
	}
	e += asyncProbeMax + asyncTryMax
	// Once the tries have backed off (asyncProbeMin doubling up to
	// asyncProbeMax: fewer than 2*asyncProbeMax epochs), polling only in
	// a try every asyncProbeMax epochs.
	runEpochs(&g, e, 2*asyncProbeMax, 32, loses)
	p := runEpochs(&g, e+2*asyncProbeMax, 8*asyncProbeMax, 32, loses)
	if p > 8+1 {
		t.Errorf("polling 2× slower: %d of %d epochs polled, want at most one in %d", p, 8*asyncProbeMax, asyncProbeMax)
	}
	if s := g.switches; s < 2 {
		t.Errorf("%d switches, want at least 2", s)
	}
}

// A tie, idle queues (every wait at the cap), epochs with too few waits,
// and a polling that wins one try but not the next never make polling
// the incumbent.
func TestAsyncGovernorTiesSleep(t *testing.T) {
	for name, c := range map[string]struct {
		waits int
		wait  func(bool) time.Duration
	}{
		"tie": {32, byMode(30*time.Microsecond, 30*time.Microsecond)},
		"within 10%": {32, func(p bool) time.Duration {
			if p {
				return 28 * time.Microsecond
			}
			return 30 * time.Microsecond
		}},
		"idle":               {32, func(p bool) time.Duration { return time.Second }},
		"a win in two tries": {32, nil},
		"few waits": {asyncMinCycles - 1, func(p bool) time.Duration {
			if p {
				return time.Microsecond
			}
			return time.Millisecond
		}},
	} {
		t.Run(name, func(t *testing.T) {
			if name == "a win in two tries" {
				// Polling wins one try in two: never two in a row.
				tries := 0
				c.wait = func(p bool) time.Duration {
					if !p {
						return 30 * time.Microsecond
					}
					tries++
					if tries/c.waits%2 == 0 {
						return 5 * time.Microsecond
					}
					return 30 * time.Microsecond
				}
			}
			var g asyncGovernor
			n := 8 * asyncProbeMax
			p := runEpochs(&g, 5_000_000, n, c.waits, c.wait)
			if g.incumbent || g.switches != 0 {
				t.Errorf("polling became the incumbent (%d switches)", g.switches)
			}
			if p > n/asyncProbeMin+1 {
				t.Errorf("%d of %d epochs polled, want at most one in %d", p, n, asyncProbeMin)
			}
		})
	}
}

// Two agents' governors that see the same waits try polling in the same
// epochs (aligned to the wall clock), and a wait from an epoch already
// closed, or from a clock that went back, counts nothing.
func TestAsyncGovernorEpochs(t *testing.T) {
	var a, b asyncGovernor
	const first = 7_000_000
	wait := byMode(5*time.Microsecond, 20*time.Microsecond)
	for e := int64(first); e < first+2*asyncProbeMax; e++ {
		at := time.Unix(0, e*int64(asyncEpoch))
		_, pa := a.begin(at)
		_, pb := b.begin(at.Add(asyncEpoch / 2))
		if pa != pb {
			t.Fatalf("epoch %d: agent a polls %v, b %v", e, pa, pb)
		}
		for range 32 {
			a.record(e, !pa, wait(pa), true)
			b.record(e, !pb, wait(pb), true)
		}
	}
	var g asyncGovernor
	e, _ := g.begin(time.Unix(0, first*int64(asyncEpoch)))
	g.begin(time.Unix(0, (first+1)*int64(asyncEpoch)))
	g.record(e, true, time.Microsecond, true)
	if _, polling := g.begin(time.Unix(0, (first-5)*int64(asyncEpoch))); polling {
		t.Error("a clock that went back polls")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waits != 0 {
		t.Errorf("a wait of a closed epoch counted: %d waits", g.waits)
	}
}

// Each cycle length falls in the bucket whose floor is the greatest not
// above it, and the median of an epoch is its middle cycle's floor.
func TestWaitBuckets(t *testing.T) {
	for d := time.Duration(0); d <= asyncCycleCap; d = d + 1 + d/97 {
		b := waitBucket(d)
		if f := bucketFloor(b); f > d || b+1 < waitBuckets && bucketFloor(b+1) <= d {
			t.Fatalf("%v in bucket %d of floor %v, next floor %v", d, b, f, bucketFloor(b+1))
		}
	}
	var g asyncGovernor
	e, _ := g.begin(time.Unix(0, 3*int64(asyncEpoch)))
	for _, d := range []time.Duration{time.Millisecond, 3 * time.Microsecond, 40 * time.Microsecond, 5 * time.Microsecond, time.Second} {
		g.record(e, false, d, true)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if m := medianOf(g.cycles, &g.hist); m > 40*time.Microsecond || 10*m < 9*40*time.Microsecond {
		t.Errorf("median of 3, 5, 40 µs, 1 ms and 1 s (at the cap): %v, want 40 µs within a bucket", m)
	}
}

// Doorbell mode that flips between a fast state (its poll catches the
// next post: 10 µs cycles, no wait sleeps) and a slow one (every wait
// sleeps: 55 µs), as memcpy's ping-pong does on two cores, against
// polling at 22 µs in either: polling is tried in the slow epochs and
// wins against each of them, but loses against what doorbell mode
// typically gives, and must never take over. Where the slow state
// lasts, polling takes over.
func TestAsyncGovernorDoorbellTwoStates(t *testing.T) {
	const fast, slow, polled = 10 * time.Microsecond, 55 * time.Microsecond, 22 * time.Microsecond
	// run drives g through n epochs from first, the doorbell's in the
	// slow state where slowAt says so, with as many cycles as a 10 ms
	// epoch holds.
	run := func(g *asyncGovernor, first int64, n int, slowAt func(e int64) bool) (polls int) {
		for e := first; e < first+int64(n); e++ {
			ep, polling := g.begin(time.Unix(0, e*int64(asyncEpoch)+int64(time.Microsecond)))
			d, sleep := fast, false
			switch {
			case polling:
				polls++
				d = polled
			case slowAt(e):
				d, sleep = slow, true
			}
			for range int(asyncEpoch / d) {
				g.record(ep, sleep, d, true)
			}
		}
		return polls
	}
	var g asyncGovernor
	const first = 11_000_001
	n := 16 * asyncProbeMax
	// Six fast epochs, then four slow, over and over: the slow ones are
	// a fifth of the cycles.
	p := run(&g, first, n, func(e int64) bool { return e%10 >= 6 })
	if g.switches != 0 || g.incumbent {
		t.Errorf("polling at %v took over from doorbell mode at %v four epochs in ten, %v in the others (%d switches)", polled, slow, fast, g.switches)
	}
	if p > n/asyncProbeMin+1 {
		t.Errorf("%d of %d epochs polled, want at most one in %d", p, n, asyncProbeMin)
	}
	// The slow state stays: polling wins.
	run(&g, first+int64(n), 4*asyncProbeMax, func(int64) bool { return true })
	if !g.incumbent {
		t.Errorf("doorbell mode stuck at %v and polling at %v: polling is not the incumbent", slow, polled)
	}
}

// Doorbell mode whose first two epochs after a polling one are slow (55
// µs: every wait sleeps) and the others fast (10 µs), as memcpy's after
// polling held the agent: once polling (22 µs) is the incumbent, the
// tries of the doorbell must last long enough to see its fast state, and
// give the agent back to it. Tries of one epoch saw only the slow state
// and kept polling.
func TestAsyncGovernorDoorbellAfterPolling(t *testing.T) {
	const fast, slow, polled = 10 * time.Microsecond, 55 * time.Microsecond, 22 * time.Microsecond
	var g asyncGovernor
	first := int64(13_000_001)
	// Doorbell mode stuck slow first: polling takes over.
	runEpochs(&g, first, 4*asyncProbeMax, 400, byMode(polled, slow))
	if !g.incumbent {
		t.Fatalf("doorbell mode at %v, polling at %v: polling is not the incumbent", slow, polled)
	}
	lastPoll := int64(0)
	polls := 0
	e := first + 4*asyncProbeMax
	n := 8 * asyncProbeMax
	for ; e < first+4*asyncProbeMax+int64(n); e++ {
		ep, polling := g.begin(time.Unix(0, e*int64(asyncEpoch)+int64(time.Microsecond)))
		d, sleep := fast, false
		switch {
		case polling:
			d, lastPoll = polled, e
			polls++
		case e-lastPoll <= 2:
			d, sleep = slow, true
		}
		for range int(asyncEpoch / d) {
			g.record(ep, sleep, d, true)
		}
	}
	if g.incumbent {
		t.Errorf("polling at %v is still the incumbent after %d epochs of a doorbell fast (%v) but in the two epochs after polling", polled, n, fast)
	}
	if polls > n/4 {
		t.Errorf("%d of %d epochs polled, want few", polls, n)
	}
}

// Polling is first tried once doorbell mode has asyncRefEpochs/2 epochs
// that counted: an agent's first epochs with async QPs are slow in
// either mode.
func TestAsyncGovernorJudgesDoorbellFirst(t *testing.T) {
	var g asyncGovernor
	const first = 15_000_003 // the epoch before a try (a multiple of asyncProbeMin)
	firstPoll := int64(-1)
	for e := int64(first); e < first+4*asyncProbeMin; e++ {
		if runEpochs(&g, e, 1, 32, byMode(time.Microsecond, 50*time.Microsecond)) > 0 && firstPoll < 0 {
			firstPoll = e
		}
	}
	if firstPoll < first+asyncRefEpochs/2 {
		t.Errorf("polling first tried at epoch %d of the governor, want one after %d doorbell epochs", firstPoll-first, asyncRefEpochs/2)
	}
}

// Where doorbell mode's own poll catches the work (no wait sleeps until
// the doorbell), polling is never tried: it could bring nothing sooner.
func TestAsyncGovernorNoTryWithoutSleeps(t *testing.T) {
	var g asyncGovernor
	n := 4 * asyncProbeMax
	p := runEpochsSleeping(&g, 9_000_001, n, 32, false, byMode(time.Microsecond, 5*time.Microsecond)) // polling would win, were it tried
	if p != 0 || g.incumbent {
		t.Errorf("%d of %d epochs polled, incumbent polling %v; want none", p, n, g.incumbent)
	}
	// Once the doorbell's waits sleep, polling is tried, and wins.
	p = runEpochs(&g, 9_000_001+int64(n), n, 32, byMode(time.Microsecond, 50*time.Microsecond))
	if p == 0 || !g.incumbent {
		t.Errorf("doorbell waits that sleep: %d of %d epochs polled, incumbent polling %v; want polling", p, n, g.incumbent)
	}
}

// pingPong drives g with nqp QPs' goroutines (asyncSpin, as waitWork
// drives it) on a clock of its own from epoch first for n epochs: each
// QP in turn waits for work (a doorbell-mode wait sleeps until its
// doorbell rings) and handles it, for the lengths its mode gives. It
// returns the epochs that polled.
func pingPong(g *asyncGovernor, first int64, n, nqp int, wait, handle func(polling bool) time.Duration) (polled int) {
	qps := make([]asyncSpin, nqp)
	now := time.Unix(0, first*int64(asyncEpoch))
	end := now.Add(time.Duration(n) * asyncEpoch)
	last := int64(-1)
	for now.Before(end) {
		for i := range qps {
			s := &qps[i]
			s.begin(g, func() time.Time { return now })
			if e := now.UnixNano() / int64(asyncEpoch); e != last {
				last = e
				if s.polling {
					polled++
				}
			}
			now = now.Add(wait(s.polling))
			if !s.polling {
				s.rung(func() time.Time { return now })
			}
			s.end()
			now = now.Add(handle(s.polling))
		}
	}
	return polled
}

// The governor judges each mode by the round trip, not by the wait: a
// poll that brings the work to the goroutine sooner but slows the rest of
// the round trip more (the goroutine's own handling and the workload's
// reaction, on cores its spinning shares) loses, and one that shortens
// the round trip wins. Judged by the wait, as it was, the first case
// chose polling: the polling waits are 8× shorter.
func TestAsyncGovernorJudgesTheRoundTrip(t *testing.T) {
	n := 8 * asyncProbeMax
	t.Run("shorter waits, longer round trips", func(t *testing.T) {
		var g asyncGovernor
		// Polling: 1 µs waits, 15 µs of handling (16 a cycle);
		// doorbell: 8 µs waits, 3 µs of handling (11).
		p := pingPong(&g, 11_000_001, n, 2, byMode(time.Microsecond, 8*time.Microsecond), byMode(15*time.Microsecond, 3*time.Microsecond))
		if g.incumbent || g.switches != 0 {
			t.Errorf("polling became the incumbent (%d switches) though its round trips are 16 µs against 11", g.switches)
		}
		if p > n/asyncProbeMin+1 {
			t.Errorf("%d of %d epochs polled, want at most one in %d", p, n, asyncProbeMin)
		}
		if p == 0 {
			t.Error("polling was never tried")
		}
	})
	t.Run("shorter round trips", func(t *testing.T) {
		var g asyncGovernor
		// Polling: 1 µs waits, 3 µs of handling (4);
		// doorbell: 20 µs waits, 3 µs of handling (23).
		p := pingPong(&g, 12_000_001, n, 2, byMode(time.Microsecond, 20*time.Microsecond), byMode(3*time.Microsecond, 3*time.Microsecond))
		if !g.incumbent {
			t.Errorf("polling is not the incumbent though its round trips are 4 µs against 23 (%d switches)", g.switches)
		}
		if p < n*3/4 {
			t.Errorf("%d of %d epochs polled, want most", p, n)
		}
	})
}

// Only one wait in asyncSample is timed; its cycle (the wait, then the
// handling of the work that ended it) is closed by the next wait's
// begin. A cycle begun in its epoch's first asyncSettle, one across two
// epochs, and a timed wait that no work ended count no cycle, though the
// timed waits with work count.
func TestAsyncSpinCycles(t *testing.T) {
	var g asyncGovernor
	var s asyncSpin
	// at is us µs after epoch e's settling.
	at := func(e int64, us int) func() time.Time {
		return func() time.Time {
			return time.Unix(0, e*int64(asyncEpoch)+int64(asyncSettle)+int64(us)*int64(time.Microsecond))
		}
	}
	noClock := func() time.Time {
		t.Fatalf("wait %d, not timed, read the clock", s.waits)
		return time.Time{}
	}
	untimed := func(n int, worked bool) {
		for range n {
			s.begin(&g, noClock)
			if worked {
				s.end()
			}
		}
	}
	want := func(waits, cycles int, what string) {
		t.Helper()
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.waits != waits || g.cycles != cycles {
			t.Fatalf("%s: %d waits, %d cycles; want %d, %d", what, g.waits, g.cycles, waits, cycles)
		}
	}
	// timed begins the timed wait at from, which work ends, and the
	// next wait at to, which closes its cycle.
	timed := func(from, to func() time.Time) {
		s.begin(&g, from)
		s.end()
		s.begin(&g, to)
	}
	const e = 20_000_001
	untimed(asyncSample-1, true)
	timed(at(e, -5), at(e, 1))
	want(1, 0, "a cycle begun settling")
	s.end()
	untimed(asyncSample-2, true)
	timed(at(e, 10), at(e, 20))
	want(2, 1, "a timed cycle")
	s.end()
	untimed(asyncSample-2, true)
	s.begin(&g, at(e, 30))
	untimed(1, false)
	want(2, 1, "a timed wait that no work ended")
	// The next timed cycle ends in e+1: it counts in neither, and e+1
	// starts afresh.
	untimed(asyncSample-2, true)
	timed(at(e, 40), at(e+1, 1))
	want(0, 0, "epoch e+1 after a cycle across its start")
	s.end()
	untimed(asyncSample-2, true)
	timed(at(e+1, 5), at(e+1, 9))
	want(1, 1, "a cycle of e+1")
}
