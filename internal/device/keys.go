// SPDX-License-Identifier: Apache-2.0

package device

// Memory region keys. A key (lkey == rkey, 32 bits) is a slot of the
// context's key table in its low bits and that slot's generation above
// them: keyBits(max_mr) bits of slot (12 with the default 4,096), the
// rest generation below the top bit, which is memory windows' (19 bits
// then). Each slot counts its own generations
// from 1 (so no key is 0) and wraps past the widest; a freed slot goes
// to the back of a queue, and a registration takes a never-used slot
// first, then the slot freed longest ago. So a stale key can name a
// region again only after its slot was used 2^genBits − 1 more times,
// and every slot free meanwhile had its turn before each of those: with
// the defaults, 2^19 − 1 registrations when the workload holds every
// other region, and about 2 billion when it holds none
// (docs/SECURITY.md, "Addresses, keys and QP numbers").

import "math/bits"

// keyBits is how many low bits of a key number its slot when a context
// may hold maxMR regions.
func keyBits(maxMR int) uint {
	if maxMR <= 1 {
		return 0
	}
	return uint(bits.Len(uint(maxMR - 1)))
}

// keySlots hands out the slots of a key table: a key (or a window's
// index) is a slot in its low bits and that slot's generation above them,
// width bits in all.
type keySlots struct {
	bits  uint     // the low bits that number the slot
	n     int      // how many slots the table has
	gens  []uint32 // each used slot's last generation
	free  []uint32 // freed slots, the one freed longest ago first
	fresh uint32   // the next slot never used
}

// take takes a slot and returns its new id (generation and slot, within
// width bits, never 0), or false when all n slots are taken.
func (k *keySlots) take(width uint) (uint32, bool) {
	var slot uint32
	switch {
	case int(k.fresh) < k.n:
		slot = k.fresh
		k.fresh++
		k.gens = append(k.gens, 0)
	case len(k.free) > 0:
		slot = k.free[0]
		k.free = k.free[1:]
	default:
		return 0, false
	}
	maxGen := uint32(uint64(1)<<(width-k.bits) - 1)
	g := k.gens[slot] + 1
	if g > maxGen || g == 0 {
		g = 1
	}
	k.gens[slot] = g
	return uint32(uint64(g)<<k.bits) | slot, true
}

// put puts the slot of id at the back of the queue.
func (k *keySlots) put(id uint32) { k.free = append(k.free, k.slot(id)) }

// slot returns the slot that id names.
func (k *keySlots) slot(id uint32) uint32 { return id & uint32(uint64(1)<<k.bits-1) }

// mrKeyWidth is how many bits a region's key has: the top bit of a
// 32-bit key is memory windows' (abi.MWKeyBit).
const mrKeyWidth = 31

// newKeyLocked takes a slot for a new region and returns its key, or
// false when all maxMR slots hold regions.
//
// +checklocks:v.objMu
func (v *Context) newKeyLocked() (uint32, bool) { return v.mrKeys.take(mrKeyWidth) }

// freeKeyLocked puts the slot of key, whose region was deregistered, at
// the back of the queue.
//
// +checklocks:v.objMu
func (v *Context) freeKeyLocked(key uint32) { v.mrKeys.put(key) }

// keySlot returns the slot that key names.
func (v *Context) keySlot(key uint32) uint32 {
	return key & uint32(uint64(1)<<v.keyBits-1)
}
