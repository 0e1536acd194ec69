// SPDX-License-Identifier: Apache-2.0

package clock

import (
	"testing"
	"time"
)

func TestFakeTimers(t *testing.T) {
	f := NewFake(time.Unix(100, 0))
	a := f.NewTimer(10 * time.Millisecond)
	b := f.NewTimer(5 * time.Millisecond)
	fired := make(chan time.Time, 1)
	f.AfterFunc(7*time.Millisecond, func() { fired <- f.Now() })
	if f.Armed() != 3 {
		t.Fatalf("Armed() = %d, want 3", f.Armed())
	}
	f.Advance(4 * time.Millisecond)
	select {
	case <-a.C():
		t.Fatal("a fired early")
	case <-b.C():
		t.Fatal("b fired early")
	default:
	}
	f.Advance(4 * time.Millisecond) // now +8 ms: b (5) and the func (7)
	if got := <-b.C(); !got.Equal(time.Unix(100, 0).Add(5 * time.Millisecond)) {
		t.Errorf("b fired at %v, want its deadline", got)
	}
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterFunc did not run")
	}
	if a.Stop() != true || a.Stop() != false {
		t.Error("Stop of an armed timer, then again: want true, false")
	}
	f.Advance(time.Hour)
	select {
	case <-a.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	// Reset drops a value not yet received.
	b.Reset(time.Millisecond)
	f.Advance(time.Millisecond)
	b.Reset(time.Second)
	select {
	case <-b.C():
		t.Fatal("a stale value survived Reset")
	default:
	}
	if !f.WaitArmed(1, time.Second) || f.WaitArmed(2, 10*time.Millisecond) {
		t.Error("WaitArmed: want 1 armed timer, not 2")
	}
}

// TestFakeNoStaleValue: a timer stopped or reset right after it fired,
// while Advance runs in another goroutine, never delivers the old value
// later.
func TestFakeNoStaleValue(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	for i := range 2000 {
		tm := f.NewTimer(time.Millisecond)
		done := make(chan struct{})
		go func() { f.Advance(time.Millisecond); close(done) }()
		for f.Armed() != 0 {
		}
		tm.Reset(time.Hour)
		<-done
		select {
		case <-tm.C():
			t.Fatalf("run %d: a value arrived after Reset", i)
		default:
		}
		tm.Stop()
	}
}
