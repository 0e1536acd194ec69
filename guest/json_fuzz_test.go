// SPDX-License-Identifier: Apache-2.0

package guest

import "testing"

// FuzzCJSON feeds each input to the C drop-in's JSON reader (json.c, the
// parser of every agent reply and event) and calls each of its accessors
// on every token; it fails on a crash or a sanitizer report. The seed
// corpus (testdata/fuzz/FuzzCJSON) holds real replies and events of the
// agent and malformed variants. go test runs the seeds;
// go test -fuzz FuzzCJSON ./guest explores.
func FuzzCJSON(f *testing.F) {
	needC(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 1<<20 {
			return // the agent's messages are at most 1 MiB
		}
		jsonHarness.feed(t, in)
	})
}
