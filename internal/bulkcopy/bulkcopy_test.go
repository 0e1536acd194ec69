// SPDX-License-Identifier: Apache-2.0

package bulkcopy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestCopy checks Copy against copy() on both sides of Min, at unaligned
// offsets and with a shorter destination or source: the same count, the
// same bytes, and nothing written past the count.
func TestCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 3*Min)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	for _, n := range []int{0, 1, 63, Min - 1, Min, Min + 1, 2*Min + 77} {
		for _, off := range []int{0, 1, 7, 63} {
			for _, short := range []int{0, 1, 100} {
				name := fmt.Sprintf("n=%d/off=%d/short=%d", n, off, short)
				dst := bytes.Repeat([]byte{0xa5}, n+off+8)
				want := bytes.Clone(dst)
				d, s := dst[off:off+n], src[off:off+max(n-short, 0)]
				wn := copy(want[off:off+n], s)
				if got := Copy(d, s); got != wn {
					t.Errorf("%s: Copy = %d, want %d", name, got, wn)
				}
				if !bytes.Equal(dst, want) {
					t.Errorf("%s: bytes differ from copy()'s", name)
				}
			}
		}
	}
}

// BenchmarkCopy compares Copy with copy() at the sizes of the
// memcpy-direct targets.
func BenchmarkCopy(b *testing.B) {
	src, dst := make([]byte, 64<<20), make([]byte, 64<<20)
	for _, n := range []int{4 << 10, 64 << 10, 1 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("Copy/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				Copy(dst[:n], src[:n])
			}
		})
		b.Run(fmt.Sprintf("copy/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(dst[:n], src[:n])
			}
		})
	}
}
