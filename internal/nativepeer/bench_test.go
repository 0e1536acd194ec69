// SPDX-License-Identifier: Apache-2.0

package nativepeer

import (
	"bytes"
	"testing"
)

// FuzzParseBenchLine: any benchmark line from the other side parses or is
// refused with an error, never a panic, and what parses is within the
// limits and survives a round trip.
func FuzzParseBenchLine(f *testing.F) {
	f.Add([]byte(`{"gid":"::ffff:10.0.0.1","qpn":4660,"psn":1,"rkey":4096,"addr":0,"len":65536,"test":"write_bw","size":65536,"iters":1000,"mtu":4096}` + "\n"))
	f.Add([]byte(`{"gid":"fd00::1","qpn":16777215,"psn":16777215,"rkey":0,"addr":18446744073709551599,"len":16,"test":"write_lat","size":8,"iters":1,"mtu":256}`))
	f.Add([]byte(`{"gid":"::ffff:10.0.0.1","qpn":2,"len":8,"test":"read_lat","size":8,"iters":5,"mtu":1000}`))
	f.Add([]byte(`{"gid":"::ffff:10.0.0.1","qpn":2,"len":8,"test":"ib_write_bw","size":8,"iters":5,"mtu":1024}`))
	f.Add([]byte(`{"gid":"::1","qpn":2,"extra":1}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, line []byte) {
		l, err := ParseBenchLine(line)
		if err != nil {
			return
		}
		if l.QPN < 2 || l.QPN > 0xffffff || l.PSN > 0xffffff || l.Size < 1 || l.Size > MaxBenchSize || l.Iters < 1 ||
			l.Len < uint64(l.Test.BufSize(l.Size)) || l.Addr+l.Len < l.Addr || !l.GID.IsValid() {
			t.Fatalf("ParseBenchLine(%q) accepted %+v", line, l)
		}
		back, err := ParseBenchLine(l.line())
		if err != nil || back != l {
			t.Fatalf("round trip of %+v: %+v, %v", l, back, err)
		}
		if !bytes.HasSuffix(l.line(), []byte("\n")) {
			t.Fatalf("line %q does not end in a newline", l.line())
		}
	})
}

// TestParseBenchLine checks the refusals by name.
func TestParseBenchLine(t *testing.T) {
	const ok = `"gid":"::ffff:10.0.0.1","qpn":2,"len":65536,"size":65536,"iters":10,"mtu":1024`
	for _, tt := range []struct{ line, want string }{
		{`{` + ok + `,"test":"bw"}`, "bw"},
		{`{"gid":"::ffff:10.0.0.1","qpn":1,"len":8,"test":"read_lat","size":8,"iters":1,"mtu":1024}`, "24-bit QPN"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"psn":16777216,"len":8,"test":"read_lat","size":8,"iters":1,"mtu":1024}`, "wider than 24 bits"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"len":16777216,"test":"write_bw","size":16777216,"iters":1,"mtu":1024}`, "message size"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"len":8,"test":"read_lat","size":8,"iters":0,"mtu":1024}`, "iteration count"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"len":8,"test":"read_lat","size":8,"iters":1,"mtu":1500}`, "MTU 1500"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"len":8,"test":"write_lat","size":8,"iters":1,"mtu":1024}`, "smaller than write_lat"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"addr":18446744073709551615,"len":8,"test":"read_lat","size":8,"iters":1,"mtu":1024}`, "wraps around"},
		{`{"qpn":2,"len":8,"test":"read_lat","size":8,"iters":1,"mtu":1024}`, "no gid"},
		{`{` + ok + `,"test":"write_bw","x":1}`, "not the JSON"},
	} {
		if _, err := ParseBenchLine([]byte(tt.line)); err == nil || !bytes.Contains([]byte(err.Error()), []byte(tt.want)) {
			t.Errorf("ParseBenchLine(%s) = %v, want an error saying %q", tt.line, err, tt.want)
		}
	}
}
