// SPDX-License-Identifier: Apache-2.0

package device

import (
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
)

// TestSecurityKeysNotReused registers and deregisters a region over and
// over, holding another: every key is new, none has the bit of memory
// windows' rkeys, none of the old ones finds a region, and slots come back
// least recently freed first.
func TestSecurityKeysNotReused(t *testing.T) {
	h := newRingHarness(t)
	v := h.v
	reg := func() abi.RegMRReply {
		t.Helper()
		r, err := v.RegMR(&abi.RegMR{PD: h.pd.handle, Addr: harnessRW, Length: 64, Access: abi.AccessAll})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	seen := map[uint32]int{harnessKeyRW: -1, harnessKeyRO: -1}
	var old []uint32
	const n = 3 * 4096 // every slot used three times over
	for i := range n {
		r := reg()
		if r.LKey != r.RKey {
			t.Fatalf("registration %d: lkey 0x%x, rkey 0x%x", i, r.LKey, r.RKey)
		}
		if r.RKey&abi.MWKeyBit != 0 {
			t.Fatalf("registration %d: key 0x%x has the memory windows' bit", i, r.RKey)
		}
		if j, dup := seen[r.RKey]; dup {
			t.Fatalf("registration %d: key 0x%x again (registration %d had it)", i, r.RKey, j)
		}
		seen[r.RKey] = i
		if err := v.DeregMR(r.Handle); err != nil {
			t.Fatal(err)
		}
		old = append(old, r.RKey)
	}
	last := reg()
	for _, k := range old {
		if v.lookupMR(k) != nil {
			t.Fatalf("stale key 0x%x finds a region (the live one has 0x%x)", k, last.RKey)
		}
	}
	// Least recently freed first: with the slots all used, the next
	// registration takes the slot freed longest ago, whatever its number.
	if got, want := v.keySlot(last.RKey), v.keySlot(old[len(old)-4094]); got != want {
		t.Fatalf("slot %d taken, want %d (the one freed longest ago)", got, want)
	}
}

// TestKeyBits checks the key layout's widths against max_mr.
func TestKeyBits(t *testing.T) {
	for _, c := range []struct {
		maxMR int
		bits  uint
	}{{1, 0}, {2, 1}, {3, 2}, {4096, 12}, {4097, 13}, {65536, 16}} {
		if got := keyBits(c.maxMR); got != c.bits {
			t.Errorf("keyBits(%d) = %d, want %d", c.maxMR, got, c.bits)
		}
	}
}

// TestKeyWidth: a slot's generation wraps within the width it is given,
// so that a region's key (31 bits) never gets the memory windows' bit
// and a window's index (23 bits) never spills into it either.
func TestKeyWidth(t *testing.T) {
	for _, width := range []uint{mrKeyWidth, mwIndexWidth} {
		k := keySlots{bits: 12, n: 1}
		id, ok := k.take(width)
		if !ok || id>>12 != 1 {
			t.Fatalf("width %d: first id 0x%x, %v; want generation 1", width, id, ok)
		}
		k.put(id)
		k.gens[0] = uint32(1)<<(width-12) - 1 // the widest generation
		if id, _ = k.take(width); id != 1<<12 {
			t.Fatalf("width %d: the slot after its widest generation is 0x%x, want generation 1 again", width, id)
		}
		k.put(id)
		k.gens[0] = uint32(1)<<(width-12) - 2
		if id, _ = k.take(width); id>>width != 0 {
			t.Fatalf("width %d: id 0x%x is wider", width, id)
		}
	}
}
