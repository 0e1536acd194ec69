// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"sync/atomic"
	"unsafe"
)

// Word returns the 32-bit ring-state word at off in a shared mapping, for
// atomic loads and stores. off must be 4-byte aligned and inside mem; both
// are constants of this package's layouts, so a violation is a bug here,
// never input.
func Word(mem []byte, off int) *atomic.Uint32 {
	_ = mem[off+3]
	if off&3 != 0 {
		panic("abi: misaligned ring word")
	}
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

// StoreFenced stores v in w so that the store is ordered before every
// load that follows it, in every build: the store of a Dekker pair
// (wire-local.md §6), where each side stores one word and then loads the
// word the other side stored, and a wake-up is lost if both loads miss.
//
// It is a swap: a read-modify-write is a full barrier on every
// architecture Go supports. sync/atomic's Store is sequentially consistent
// too, but not under the race detector for memory outside the Go heap —
// these rings are shared mappings — where it becomes a plain store that
// can pass a later load (golang/go#58020): in race-enabled tests one
// doorbell in a few thousand went unheard and a QP hung with work posted.
// On x86-64 the swap is the XCHG that Store compiles to anyway.
func StoreFenced(w *atomic.Uint32, v uint32) { w.Swap(v) }

// Word64 returns the 64-bit word at off in a shared mapping, for atomic
// operations. The caller has checked that off+8 <= len(mem) and that
// &mem[off] is 8-byte aligned.
func Word64(mem []byte, off uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&mem[off]))
}

// Aligned8 reports whether &mem[off] is 8-byte aligned.
func Aligned8(mem []byte, off uint64) bool {
	return (uintptr(unsafe.Pointer(unsafe.SliceData(mem)))+uintptr(off))&7 == 0
}
