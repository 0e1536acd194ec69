// SPDX-License-Identifier: Apache-2.0

package bulkcopy

import "golang.org/x/sys/cpu"

// erms: the CPU has enhanced REP MOVSB, fast for large copies.
var erms = cpu.X86.HasERMS

// copyLarge copies len(dst) == len(src) > 0 bytes.
func copyLarge(dst, src []byte) {
	if !erms {
		copy(dst, src)
		return
	}
	move(&dst[0], &src[0], uintptr(len(dst)))
}

// move copies n > 0 bytes from src to dst with REP MOVSB.
//
//go:noescape
func move(dst, src *byte, n uintptr)
