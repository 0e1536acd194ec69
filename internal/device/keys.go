package device

// Memory region keys. A key (lkey == rkey, 32 bits) is a slot of the
// context's key table in its low bits and that slot's generation above
// them: keyBits(max_mr) bits of slot (12 with the default 4,096), the
// rest generation (20 bits then). Each slot counts its own generations
// from 1 (so no key is 0) and wraps past the widest; a freed slot goes
// to the back of a queue, and a registration takes a never-used slot
// first, then the slot freed longest ago. So a stale key can name a
// region again only after its slot was used 2^genBits − 1 more times,
// and every slot free meanwhile had its turn before each of those: with
// the defaults, 2^20 − 1 registrations when the workload holds every
// other region, and about 4 billion when it holds none
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

// newKeyLocked takes a slot for a new region and returns its key, or
// false when all maxMR slots hold regions.
//
// +checklocks:v.objMu
func (v *Context) newKeyLocked() (uint32, bool) {
	var slot uint32
	switch {
	case int(v.keyFresh) < len(v.mrs):
		slot = v.keyFresh
		v.keyFresh++
		v.keyGens = append(v.keyGens, 0)
	case len(v.keyFree) > 0:
		slot = v.keyFree[0]
		v.keyFree = v.keyFree[1:]
	default:
		return 0, false
	}
	maxGen := uint32(uint64(1)<<(32-v.keyBits) - 1)
	g := v.keyGens[slot] + 1
	if g > maxGen || g == 0 {
		g = 1
	}
	v.keyGens[slot] = g
	return uint32(uint64(g)<<v.keyBits) | slot, true
}

// freeKeyLocked puts the slot of key, whose region was deregistered, at
// the back of the queue.
//
// +checklocks:v.objMu
func (v *Context) freeKeyLocked(key uint32) {
	v.keyFree = append(v.keyFree, v.keySlot(key))
}

// keySlot returns the slot that key names.
func (v *Context) keySlot(key uint32) uint32 {
	return key & uint32(uint64(1)<<v.keyBits-1)
}
