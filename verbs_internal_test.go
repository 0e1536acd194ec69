// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"errors"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// TestPollBrokenTail writes CQ tails the agent never writes into a CQ
// ring and polls: each must give ErrBrokenRing and no completion, as C's
// poll_cq gives EIO (both check with the rule of wire-local.md §5.1), and
// a valid tail afterwards works again. Without the check, Poll returned
// slots the agent never wrote.
func TestPollBrokenTail(t *testing.T) {
	const entries = 4
	layout, err := abi.NewCQLayout(entries)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := sys.Memfd("vrdma-test-cq", int64(layout.Size))
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	ring, err := sys.Map(fd.Int(), int(layout.Size), false)
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Unmap()
	cq := &CQ{vm: &VM{c: &conn{}}, layout: layout, ring: ring}
	mem := ring.Bytes()
	tail := abi.Word(mem, abi.OffCQTail)
	for i := uint32(0); i < entries; i++ {
		off := layout.Offset + i*abi.CQESize
		abi.EncodeCQE(mem[off:off+abi.CQESize], &abi.CQE{WRID: uint64(100 + i)})
	}
	wc := make([]WorkCompletion, 2*entries)
	for _, bad := range []uint32{
		entries + 1,    // a valid index, but more than entries ahead of head 0
		2*entries - 1,  // likewise (one behind head: a rewound tail)
		2 * entries,    // not an index of the ring
		0xffffffff,     // nor this
		0x80000000 | 1, // high bits set
	} {
		tail.Store(bad)
		n, err := cq.Poll(wc)
		if n != 0 || !errors.Is(err, ErrBrokenRing) {
			t.Errorf("tail %#x: Poll = %d, %v; want 0, ErrBrokenRing", bad, n, err)
		}
	}
	tail.Store(entries) // a full CQ: every slot
	n, err := cq.Poll(wc)
	if err != nil || n != entries || wc[0].WRID != 100 || wc[entries-1].WRID != 100+entries-1 {
		t.Fatalf("full CQ: Poll = %d, %v (first %d)", n, err, wc[0].WRID)
	}
	if h := abi.Word(mem, abi.OffCQHead).Load(); h != entries {
		t.Fatalf("head word %d after polling %d, want %d", h, entries, entries)
	}
}

// TestIncRKey: IncRKey moves a window rkey's low 8 bits on, wrapping
// within them, and keeps the rest (ibv_inc_rkey).
func TestIncRKey(t *testing.T) {
	for _, c := range [][2]uint32{{0x80000100, 0x80000101}, {0x800001ff, 0x80000100}, {0xffffffff, 0xffffff00}, {0, 1}} {
		if got := IncRKey(c[0]); got != c[1] {
			t.Errorf("IncRKey(0x%x) = 0x%x, want 0x%x", c[0], got, c[1])
		}
	}
}

// TestLocalQueueReusesRoom pushes completions into a CQ's local queue (the
// memcpy-direct path's) and takes fewer than it pushed each round, as
// write_bw does when it signals every WRITE (128 posted for each Poll of
// 64): every completion comes out once and in order, and the queue's
// slice stays a few times the completions waiting instead of growing by
// one a push (it did: the room of those taken was reused only once the
// queue was empty).
func TestLocalQueueReusesRoom(t *testing.T) {
	cq := &CQ{}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	var pushed, taken uint64
	for round := range 10000 {
		for range 64 + round%3 {
			cq.pushLocal(WorkCompletion{WRID: pushed})
			pushed++
		}
		for range 64 {
			if wc := cq.popLocal(); wc.WRID != taken {
				t.Fatalf("round %d: took completion %d, want %d", round, wc.WRID, taken)
			}
			taken++
		}
		if waiting := cq.localLen(); uint64(waiting) != pushed-taken {
			t.Fatalf("round %d: %d completions waiting, want %d", round, waiting, pushed-taken)
		}
		if c := cap(cq.local); c > 4*(cq.localLen()+64) {
			t.Fatalf("round %d: the queue's slice has room for %d completions with %d waiting: it grows with every push", round, c, cq.localLen())
		}
	}
	for cq.localLen() > 0 {
		if wc := cq.popLocal(); wc.WRID != taken {
			t.Fatalf("took completion %d, want %d", wc.WRID, taken)
		}
		taken++
	}
	if taken != pushed {
		t.Fatalf("took %d completions of %d", taken, pushed)
	}
}
