// SPDX-License-Identifier: Apache-2.0

package device

import (
	"testing"
	"time"
)

// runEpochs drives g through n epochs from epoch first, each with waits
// waits whose length wait gives for the epoch's mode, and returns how
// many of them polled.
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
			g.record(ep, wait(polling), !polling && sleep)
		}
	}
	return polled
}

// The governor starts in doorbell mode, tries polling, keeps it while it
// wins by more than a tenth, drops it when it stops winning, and then
// polls only one epoch in asyncProbeMax.
func TestAsyncGovernorFollowsTheWinner(t *testing.T) {
	var g asyncGovernor
	const first = 1_000_001 // not a try of polling (a multiple of asyncProbeMin)
	if _, polling := g.begin(time.Unix(0, first*int64(asyncEpoch))); polling || g.incumbent {
		t.Fatal("the first epoch, not a try, polls; want doorbell mode first")
	}
	// Polling wins: 5 µs waits against 20.
	wins := func(polling bool) time.Duration {
		if polling {
			return 5 * time.Microsecond
		}
		return 20 * time.Microsecond
	}
	n := 4 * asyncProbeMax
	polled := runEpochs(&g, first+1, n, 32, wins)
	if !g.incumbent {
		t.Fatalf("polling 4× faster is not the incumbent after %d epochs (%d polled)", n, polled)
	}
	if polled < n*3/4 {
		t.Errorf("polling 4× faster: %d of %d epochs polled, want most", polled, n)
	}
	// Polling now loses: 40 µs against 20.
	loses := func(polling bool) time.Duration {
		if polling {
			return 40 * time.Microsecond
		}
		return 20 * time.Microsecond
	}
	runEpochs(&g, first+1+int64(n), asyncProbeMax, 32, loses)
	if g.incumbent {
		t.Fatal("polling 2× slower is still the incumbent")
	}
	// Once the tries have backed off (asyncProbeMin doubling up to
	// asyncProbeMax: fewer than 2*asyncProbeMax epochs), polling only in
	// a try every asyncProbeMax epochs.
	runEpochs(&g, first+1+int64(n)+asyncProbeMax, 2*asyncProbeMax, 32, loses)
	p := runEpochs(&g, first+1+int64(n)+3*asyncProbeMax, 8*asyncProbeMax, 32, loses)
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
		"tie": {32, func(bool) time.Duration { return 30 * time.Microsecond }},
		"within 10%": {32, func(p bool) time.Duration {
			if p {
				return 28 * time.Microsecond
			}
			return 30 * time.Microsecond
		}},
		"idle":               {32, func(p bool) time.Duration { return time.Second }},
		"a win in two tries": {32, nil},
		"few waits": {asyncMinWaits - 1, func(p bool) time.Duration {
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
	wait := func(polling bool) time.Duration {
		if polling {
			return 5 * time.Microsecond
		}
		return 20 * time.Microsecond
	}
	for e := int64(first); e < first+2*asyncProbeMax; e++ {
		at := time.Unix(0, e*int64(asyncEpoch))
		_, pa := a.begin(at)
		_, pb := b.begin(at.Add(asyncEpoch / 2))
		if pa != pb {
			t.Fatalf("epoch %d: agent a polls %v, b %v", e, pa, pb)
		}
		for range 32 {
			a.record(e, wait(pa), !pa)
			b.record(e, wait(pb), !pb)
		}
	}
	var g asyncGovernor
	e, _ := g.begin(time.Unix(0, first*int64(asyncEpoch)))
	g.begin(time.Unix(0, (first+1)*int64(asyncEpoch)))
	g.record(e, time.Microsecond, true)
	if _, polling := g.begin(time.Unix(0, (first-5)*int64(asyncEpoch))); polling {
		t.Error("a clock that went back polls")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waits != 0 {
		t.Errorf("a wait of a closed epoch counted: %d waits", g.waits)
	}
}

// Each wait length falls in the bucket whose floor is the greatest not
// above it, and the median of an epoch is its middle wait's floor.
func TestWaitBuckets(t *testing.T) {
	for d := time.Duration(0); d <= asyncWaitCap; d = d + 1 + d/97 {
		b := waitBucket(d)
		if f := bucketFloor(b); f > d || b+1 < waitBuckets && bucketFloor(b+1) <= d {
			t.Fatalf("%v in bucket %d of floor %v, next floor %v", d, b, f, bucketFloor(b+1))
		}
	}
	var g asyncGovernor
	e, _ := g.begin(time.Unix(0, 3*int64(asyncEpoch)))
	for _, d := range []time.Duration{time.Millisecond, 3 * time.Microsecond, 40 * time.Microsecond, 5 * time.Microsecond, time.Second} {
		g.record(e, d, false)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if m := g.medianLocked(); m > 40*time.Microsecond || 10*m < 9*40*time.Microsecond {
		t.Errorf("median of 3, 5, 40 µs, 1 ms and 1 s (at the cap): %v, want 40 µs within a bucket", m)
	}
}

// Where doorbell mode's own poll catches the work (no wait sleeps until
// the doorbell), polling is never tried: it could bring nothing sooner.
func TestAsyncGovernorNoTryWithoutSleeps(t *testing.T) {
	var g asyncGovernor
	n := 4 * asyncProbeMax
	p := runEpochsSleeping(&g, 9_000_001, n, 32, false, func(polling bool) time.Duration {
		if polling {
			return time.Microsecond // would win, were it tried
		}
		return 5 * time.Microsecond
	})
	if p != 0 || g.incumbent {
		t.Errorf("%d of %d epochs polled, incumbent polling %v; want none", p, n, g.incumbent)
	}
	// Once the doorbell's waits sleep, polling is tried, and wins.
	p = runEpochs(&g, 9_000_001+int64(n), n, 32, func(polling bool) time.Duration {
		if polling {
			return time.Microsecond
		}
		return 50 * time.Microsecond
	})
	if p == 0 || !g.incumbent {
		t.Errorf("doorbell waits that sleep: %d of %d epochs polled, incumbent polling %v; want polling", p, n, g.incumbent)
	}
}
