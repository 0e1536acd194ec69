// SPDX-License-Identifier: Apache-2.0

// Package clock is the time source of the agent's RC timers: the real
// clock in production, a fake one that a test advances by hand, so that
// retry and RNR timeouts can be tested step by step rather than by
// waiting.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that sends the time on its channel once d
	// has passed.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a single event, as time.Timer (with Go 1.23's semantics: after
// Stop or Reset returns, no stale value is received).
type Timer interface {
	// C is the channel the time is sent on; nil for an AfterFunc timer.
	C() <-chan time.Time
	// Reset makes the timer fire d from now; it reports whether it was
	// armed.
	Reset(d time.Duration) bool
	// Stop disarms the timer; it reports whether it was armed.
	Stop() bool
}

// Real is the system clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }
func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
func (t realTimer) Stop() bool                 { return t.t.Stop() }

// Fake is a clock that moves only when Advance is called. Timers that
// come due fire in the order of their deadlines.
type Fake struct {
	mu    sync.Mutex
	now   time.Time    // +checklocks:mu
	armed []*fakeTimer // +checklocks:mu
	// closed and replaced when a timer is armed
	change chan struct{} // +checklocks:mu
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start, change: make(chan struct{})} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer of the fake clock.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// AfterFunc returns a timer of the fake clock that calls fn.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{f: f, fn: fn}
	t.Reset(d)
	return t
}

// Armed returns how many timers are waiting to fire.
func (f *Fake) Armed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.armed)
}

// WaitArmed waits, in real time up to limit, until at least n timers are
// armed: the goroutines under test have reached their waits. It reports
// whether they did.
func (f *Fake) WaitArmed(n int, limit time.Duration) bool {
	deadline := time.After(limit)
	for {
		f.mu.Lock()
		ok, ch := len(f.armed) >= n, f.change
		f.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-deadline:
			return false
		}
	}
}

// Advance moves the clock forward by d, firing every timer that comes due
// on the way, each at its own deadline.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	end := f.now.Add(d)
	// The armed timers' fields are guarded by their t.f.mu, which is f.mu:
	// checklocks cannot see that t.f is f, nor that SliceStable calls its
	// function here, under the lock, so those lines are exempt.
	for {
		sort.SliceStable(f.armed, func(i, j int) bool { return f.armed[i].when.Before(f.armed[j].when) }) // +checklocksignore
		if len(f.armed) == 0 || f.armed[0].when.After(end) {                                              // +checklocksignore
			break
		}
		t := f.armed[0]
		f.armed = f.armed[1:]
		t.armed = false          // +checklocksignore
		if t.when.After(f.now) { // +checklocksignore
			f.now = t.when // +checklocksignore
		}
		// Fire under the lock: a Stop or Reset that follows cannot miss
		// the value and let it be received later. The channel has room
		// for one; the function runs in its own goroutine.
		if t.fn != nil {
			go t.fn()
		} else {
			select {
			case t.ch <- f.now:
			default:
			}
		}
	}
	f.now = end
	f.mu.Unlock()
}

type fakeTimer struct {
	f     *Fake
	ch    chan time.Time
	fn    func()
	when  time.Time // +checklocks:f.mu
	armed bool      // +checklocks:f.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.f
	f.mu.Lock()
	defer f.mu.Unlock()
	was := t.disarmLocked()
	t.when, t.armed = f.now.Add(d), true
	f.armed = append(f.armed, t)
	close(f.change)
	f.change = make(chan struct{})
	return was
}

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.disarmLocked()
}

// disarmLocked takes the timer out of the armed set and drops a value not
// yet received.
//
// +checklocks:t.f.mu
func (t *fakeTimer) disarmLocked() bool {
	if t.ch != nil {
		select {
		case <-t.ch:
		default:
		}
	}
	if !t.armed {
		return false
	}
	t.armed = false
	for i, a := range t.f.armed {
		if a == t {
			t.f.armed = append(t.f.armed[:i], t.f.armed[i+1:]...)
			break
		}
	}
	return true
}
