// SPDX-License-Identifier: Apache-2.0

//go:build !amd64

package bulkcopy

// copyLarge is copy() where there is no string move.
func copyLarge(dst, src []byte) { copy(dst, src) }
