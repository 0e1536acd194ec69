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
