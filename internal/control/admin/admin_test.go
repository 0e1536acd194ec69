// SPDX-License-Identifier: Apache-2.0

package admin

import (
	"errors"
	"net/netip"
	"testing"
)

// TestParsePVRDMAAddress checks the forms of a PVRDMA address: with a
// port, without one (the host's current port), none; and refusals that
// say what to give.
func TestParsePVRDMAAddress(t *testing.T) {
	cur := netip.MustParseAddrPort("192.0.2.1:4791")
	for _, c := range []struct {
		in   string
		cur  netip.AddrPort
		want string // "" for none; "error" for an InvalidError
	}{
		{"192.0.2.10:4800", cur, "192.0.2.10:4800"},
		{"[2001:db8::1]:4791", cur, "[2001:db8::1]:4791"},
		{"192.0.2.10", cur, "192.0.2.10:4791"},
		{"192.0.2.10", netip.AddrPort{}, "error"},
		{"none", cur, ""},
		{"", cur, ""},
		{"nowhere", cur, "error"},
		{"192.0.2.10:99999", cur, "error"},
	} {
		got, err := ParsePVRDMAAddress(c.in, c.cur)
		var ie *InvalidError
		switch {
		case c.want == "error":
			if !errors.As(err, &ie) {
				t.Errorf("ParsePVRDMAAddress(%q, %v) = %v, %v: want an InvalidError", c.in, c.cur, got, err)
			}
		case err != nil || (c.want == "" && got.IsValid()) || (c.want != "" && got.String() != c.want):
			t.Errorf("ParsePVRDMAAddress(%q, %v) = %v, %v: want %q", c.in, c.cur, got, err, c.want)
		}
	}
}

// FuzzParsePVRDMAAddress checks that any text gives an address or an
// InvalidError, and that an address given back parses to itself.
func FuzzParsePVRDMAAddress(f *testing.F) {
	f.Add("192.0.2.10:4791")
	f.Add("192.0.2.10")
	f.Add("none")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParsePVRDMAAddress(s, netip.MustParseAddrPort("192.0.2.1:4791"))
		var ie *InvalidError
		if err != nil {
			if !errors.As(err, &ie) {
				t.Fatalf("%q: %v is no InvalidError", s, err)
			}
			return
		}
		if !got.IsValid() {
			return
		}
		again, err := ParsePVRDMAAddress(got.String(), netip.AddrPort{})
		if err != nil || again != got {
			t.Fatalf("%q gave %v, which parses to %v, %v", s, got, again, err)
		}
	})
}
