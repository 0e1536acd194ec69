// SPDX-License-Identifier: Apache-2.0

package nativepeer

import (
	"bytes"
	"net/netip"
	"testing"
)

// FuzzParseInfo: any exchange line from the other side parses or is
// refused with an error, never a panic, and what parses is within the
// limits and survives a round trip.
func FuzzParseInfo(f *testing.F) {
	f.Add([]byte(`{"gid":"::ffff:10.0.0.1","qpn":4660,"psn":1,"rkey":4096,"addr":0,"size":4096}` + "\n"))
	f.Add([]byte(`{"gid":"fd00::1","qpn":16777215,"psn":16777215,"rkey":0,"addr":18446744073709551615,"size":64}`))
	f.Add([]byte(`{"gid":"::ffff:10.0.0.1","qpn":1,"psn":0,"rkey":0,"addr":0,"size":4096}`))
	f.Add([]byte(`{"gid":"","qpn":2}`))
	f.Add([]byte(`{"gid":"::1","qpn":2,"size":64,"extra":1}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, line []byte) {
		in, err := ParseInfo(line)
		if err != nil {
			return
		}
		if in.QPN < 2 || in.QPN > 0xffffff || in.PSN > 0xffffff || in.Size < MinSize || in.Size > MaxSize || !in.GID.IsValid() {
			t.Fatalf("ParseInfo(%q) accepted %+v", line, in)
		}
		back, err := ParseInfo(in.line())
		if err != nil || back != in {
			t.Fatalf("round trip of %+v: %+v, %v", in, back, err)
		}
		if !bytes.HasSuffix(in.line(), []byte("\n")) {
			t.Fatalf("line %q does not end in a newline", in.line())
		}
	})
}

// TestParseInfo checks the refusals by name.
func TestParseInfo(t *testing.T) {
	for _, tt := range []struct{ line, want string }{
		{`{"gid":"::ffff:10.0.0.1","qpn":1,"size":64}`, "24-bit QPN"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"psn":16777216,"size":64}`, "wider than 24 bits"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"size":63}`, "outside"},
		{`{"qpn":2,"size":64}`, "no gid"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"size":64,"addr":18446744073709551615}`, "wraps around"},
		{`{"gid":"::ffff:10.0.0.1","qpn":2,"size":64,"mtu":1}`, "not the JSON"},
	} {
		if _, err := ParseInfo([]byte(tt.line)); err == nil || !bytes.Contains([]byte(err.Error()), []byte(tt.want)) {
			t.Errorf("ParseInfo(%s) = %v, want an error saying %q", tt.line, err, tt.want)
		}
	}
}

// FuzzParseRegion: any private data from the other side's REQ or REP
// parses into a region within the limits, or is refused, never a panic.
func FuzzParseRegion(f *testing.F) {
	gid := netip.MustParseAddr("::ffff:10.0.0.1")
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x10, 0}, uint32(0x1234))
	f.Add(make([]byte, 56), uint32(2))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 64}, uint32(0xffffff))
	f.Add([]byte{1, 2, 3}, uint32(1))
	f.Fuzz(func(t *testing.T, priv []byte, qpn uint32) {
		in, err := ParseRegion(priv, gid, qpn)
		if err != nil {
			return
		}
		if in.QPN != qpn || in.QPN < 2 || in.QPN > 0xffffff || in.Size < MinSize || in.Size > MaxSize || in.Addr > ^uint64(0)-uint64(Layout{uint64(in.Size)}.Len()) {
			t.Fatalf("ParseRegion(%x, %#x) accepted %+v", priv, qpn, in)
		}
	})
}
