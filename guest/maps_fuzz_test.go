// SPDX-License-Identifier: Apache-2.0

package guest

import "testing"

// FuzzCMaps feeds each input, as the text of /proc/self/maps, to the C
// drop-in's reader of it (maps.c, which decides what ibv_reg_mr adopts
// and whether adopted pages are still the guest memory's): every line is
// parsed, and every range the lines name, and some around them, is
// checked both as memory to adopt and as adopted memory, with room for
// the reason and with none (ibverbs/tests/maps_fuzz.c). It fails on a
// crash, a sanitizer report or an answer outside the reader's contract.
// The file is the kernel's, but its paths are whatever names a program
// gave the files it mapped. The seed corpus (testdata/fuzz/FuzzCMaps)
// holds real maps files of the drop-in's processes and malformed
// variants. go test runs the seeds; go test -fuzz FuzzCMaps ./guest
// explores.
func FuzzCMaps(f *testing.F) {
	needC(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 1<<20 {
			return
		}
		mapsHarness.feed(t, in)
	})
}
