// SPDX-License-Identifier: Apache-2.0

package sys

import (
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitReturns runs b.Wait and reports whether it returned within d.
func waitReturns(b *Bell, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		b.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func TestBellRingWakesThePeer(t *testing.T) {
	agent, err := NewBellPair()
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	// The workload gets its own copy of the peer end, as SCM_RIGHTS gives.
	fd, err := unix.Dup(agent.PeerFD())
	if err != nil {
		t.Fatal(err)
	}
	workload, err := BellFrom(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer workload.Close()
	if err := workload.Ring(); err != nil {
		t.Fatal(err)
	}
	if !waitReturns(agent, 5*time.Second) {
		t.Fatal("the agent's Wait did not return after the workload rang")
	}
	if err := agent.Ring(); err != nil {
		t.Fatal(err)
	}
	if !waitReturns(workload, 5*time.Second) {
		t.Fatal("the workload's Wait did not return after the agent rang")
	}
}

// TestBellFloodNeverBlocks checks the property the agent relies on: a
// peer that never reads cannot make Ring block, and a peer that floods
// cannot keep the agent from waking itself.
func TestBellFloodNeverBlocks(t *testing.T) {
	agent, err := NewBellPair()
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	done := make(chan struct{})
	go func() {
		for range 100000 { // far more than a socket buffer holds
			if err := agent.Ring(); err != nil {
				t.Error(err)
				break
			}
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Ring blocked on a peer that never reads")
	}
	// Wake interrupts this side's own Wait whatever the peer does.
	returned := make(chan struct{})
	go func() {
		agent.Wait()
		close(returned)
	}()
	time.Sleep(10 * time.Millisecond)
	agent.Wake()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("Wake did not interrupt Wait")
	}
}

func TestBellFromRefusesANonSocket(t *testing.T) {
	fd, err := Memfd("not-a-socket", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if _, err := BellFrom(fd.Int()); err == nil {
		t.Fatal("BellFrom accepted a memfd")
	}
}

func TestInBounds(t *testing.T) {
	for _, c := range []struct {
		off, n, size uint64
		want         bool
	}{
		{0, 0, 0, true}, {0, 10, 10, true}, {1, 10, 10, false}, {10, 0, 10, true}, {11, 0, 10, false},
		{^uint64(0), 2, 10, false}, {2, ^uint64(0), 10, false}, {5, 5, 10, true},
	} {
		if got := InBounds(c.off, c.n, c.size); got != c.want {
			t.Errorf("InBounds(%d, %d, %d) = %v, want %v", c.off, c.n, c.size, got, c.want)
		}
	}
}

// TestBellWake checks that Wake interrupts a parked Wait, that a Wake
// before Wait makes it return at once, that one Wake is consumed by one
// Wait, and that a closed peer end is io.EOF.
func TestBellWake(t *testing.T) {
	b, err := NewBellPair()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Wake()
	if !waitReturns(b, 5*time.Second) {
		t.Fatal("Wait did not return after an earlier Wake")
	}
	left := make(chan error, 1)
	go func() { left <- b.Wait() }()
	select {
	case <-left:
		t.Fatal("a second Wait returned on a Wake the first one consumed")
	case <-time.After(50 * time.Millisecond):
	}
	// Every Wait in progress returns on one Wake (two pollers of one CQ).
	go func() { left <- b.Wait() }()
	time.Sleep(10 * time.Millisecond)
	b.Wake()
	for range 2 {
		select {
		case <-left:
		case <-time.After(5 * time.Second):
			t.Fatal("one of two parked Waits did not return after Wake")
		}
	}
	for i := 0; i < 100; i++ {
		done := make(chan error, 1)
		go func() { done <- b.Wait() }()
		if i%2 == 0 {
			time.Sleep(time.Millisecond) // parked, or about to be
		}
		b.Wake()
		b.Wake() // a second Wake before the Wait returns is merged
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Wait: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Wait did not return after Wake", i)
		}
	}
	b.peer.Close()
	time.Sleep(10 * time.Millisecond)
	if err := b.Wait(); err != io.EOF {
		t.Fatalf("Wait with the peer's end closed: %v, want io.EOF", err)
	}
}

// TestBellWaitHoldsNoThread checks that goroutines waiting on doorbells
// park on the network poller: 512 of them add no OS threads to the
// process, where a Wait in poll(2) would hold one each.
func TestBellWaitHoldsNoThread(t *testing.T) {
	const n = 512
	before := threads(t)
	bells := make([]*Bell, n)
	done := make(chan struct{}, n)
	for i := range bells {
		b, err := NewBellPair()
		if err != nil {
			t.Fatal(err)
		}
		bells[i] = b
		go func() {
			b.Wait()
			done <- struct{}{}
		}()
	}
	time.Sleep(100 * time.Millisecond) // every goroutine parks
	during := threads(t)
	for _, b := range bells {
		b.Wake()
	}
	for range bells {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a Wait did not return after Wake")
		}
	}
	for _, b := range bells {
		b.Close()
	}
	if during > before+16 {
		t.Fatalf("%d goroutines waiting on doorbells took the process from %d to %d OS threads, want at most %d", n, before, during, before+16)
	}
}

// threads returns the OS threads of this process (/proc/self/status).
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

func TestFD(t *testing.T) {
	var zero FD
	if zero.Valid() || zero.Int() != -1 || zero.Close() != nil {
		t.Fatal("the zero FD holds a descriptor")
	}
	if Own(-1).Valid() {
		t.Fatal("Own(-1) holds a descriptor")
	}
	f, err := Memfd("fd-test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	n := f.Int()
	if !f.Valid() || n < 0 {
		t.Fatal("Memfd returned no descriptor")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Valid() || f.Close() != nil {
		t.Fatal("Close twice: the FD still holds its descriptor")
	}
	if _, err := FileSize(n); err == nil {
		t.Fatal("the descriptor is still open after Close")
	}
}
