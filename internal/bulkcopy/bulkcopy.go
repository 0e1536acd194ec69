// SPDX-License-Identifier: Apache-2.0

// Package bulkcopy copies large buffers the way glibc's memcpy does on
// amd64: with the CPU's string move (REP MOVSB), which keeps the
// destination in the cache and streams whole lines. Go's copy() runs an
// AVX loop, and from 1 MiB on non-temporal stores around the cache; for a
// memcpy-direct WRITE of 64 KiB or more, between two shared mappings,
// REP MOVSB is up to twice as fast here (bench/analysis/direct-bw.md).
package bulkcopy

// Min is the size from which Copy uses the string move: below it,
// copy()'s vector loop is as fast or faster.
const Min = 64 << 10

// Copy copies min(len(dst), len(src)) bytes from src to dst and returns
// how many, as copy() does; the two must not overlap. Messages of at
// least Min bytes use the string move where the CPU has fast string
// moves (ERMS), the rest copy().
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < Min {
		return copy(dst, src)
	}
	copyLarge(dst[:n], src[:n])
	return n
}
