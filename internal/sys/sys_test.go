package sys

import (
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
	defer CloseFD(fd)
	if _, err := BellFrom(fd); err == nil {
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
