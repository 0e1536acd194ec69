// SPDX-License-Identifier: Apache-2.0

package abi_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
)

// TestStoreFencedDekker runs the store-buffering litmus test on a shared
// mapping, as the agent and a library share a ring: two goroutines, each
// in round i stores i in its own word with StoreFenced and then loads the
// other's. With the store ordered before the load, at least one of them
// sees the other's i in every round; if both see an older value, a
// doorbell or an event would have been lost. The two views of one memfd
// are the agent's and the library's mappings of a ring.
//
// Under the race detector a plain atomic Store in StoreFenced's place
// fails this within a few thousand rounds on a two-core machine (the
// race build makes it a MOV without a fence on memory outside the Go
// heap); without the race detector Store is an XCHG and passes too.
func TestStoreFencedDekker(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 || runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs: the litmus test races two goroutines on two cores")
	}
	fd, err := unix.MemfdCreate("vrdma-litmus", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	var views [2][]byte
	for i := range views {
		m, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(m)
		views[i] = m
	}
	const rounds = 200000
	var seen [2][]uint32
	var done [2]atomic.Uint32 // the last round each side finished (Go heap)
	var wg sync.WaitGroup
	for side := range 2 {
		seen[side] = make([]uint32, rounds+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Side 0 stores the SQ tail's word and loads the doorbell
			// flag's; side 1 the reverse, each through its own view.
			mine := abi.Word(views[side], abi.OffSQTail+side*abi.OffSQDoorbell)
			theirs := abi.Word(views[side], abi.OffSQDoorbell-side*abi.OffSQDoorbell)
			other := &done[1-side]
			for i := uint32(1); i <= rounds; i++ {
				for other.Load() < i-1 {
					// Both sides start round i together.
				}
				abi.StoreFenced(mine, i)
				seen[side][i] = theirs.Load()
				done[side].Store(i)
			}
		}()
	}
	wg.Wait()
	lost := 0
	for i := uint32(1); i <= rounds; i++ {
		if seen[0][i] < i && seen[1][i] < i {
			if lost == 0 {
				t.Errorf("round %d: side 0 read %d and side 1 read %d: each missed the other's store of %d (a lost wake-up)", i, seen[0][i], seen[1][i], i)
			}
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d rounds lost both stores", lost, rounds)
	}
}
