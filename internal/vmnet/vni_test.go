// SPDX-License-Identifier: Apache-2.0

package vmnet

import (
	"strconv"
	"strings"
	"testing"
)

// TestVNI checks the rule: dvportgroup-N in VLAN V is N<<12 | V, and a
// key of another form, a number out of 1..4095 or a VLAN out of 0..4094
// has none, with an error that says what to do.
func TestVNI(t *testing.T) {
	for _, c := range []struct {
		key  string
		vlan int
		want uint32
	}{
		{"dvportgroup-10", 0, 10 << 12},
		{"dvportgroup-10", 5, 10<<12 | 5},
		{"dvportgroup-1", 4094, 1<<12 | 4094},
		{"dvportgroup-4095", 0, 4095 << 12},
	} {
		if got, err := VNI(c.key, c.vlan); err != nil || got != c.want {
			t.Errorf("VNI(%q, %d) = %d, %v; want %d", c.key, c.vlan, got, err, c.want)
		}
	}
	for _, c := range []struct {
		key  string
		vlan int
	}{
		{"pg-blue", 0}, {"dvportgroup-0", 0}, {"dvportgroup-4096", 0}, {"dvportgroup-010", 0},
		{"dvportgroup-+1", 0}, {"dvportgroup-", 0}, {"dvportgroup-10", -1}, {"dvportgroup-10", 4095},
	} {
		if got, err := VNI(c.key, c.vlan); err == nil {
			t.Errorf("VNI(%q, %d) = %d, want an error", c.key, c.vlan, got)
		} else if c.vlan == 0 && !strings.Contains(err.Error(), "without --vm-netns") {
			t.Errorf("VNI(%q): %v: does not say what to do", c.key, err)
		}
	}
}

// FuzzVNI checks that no key or VLAN makes VNI panic, that every VNI is
// 24 bits and not 0, and that two inputs that get one VNI are the same.
func FuzzVNI(f *testing.F) {
	f.Add("dvportgroup-10", 0)
	f.Add("dvportgroup-4095", 4094)
	f.Add("pg", 3)
	f.Fuzz(func(t *testing.T, key string, vlan int) {
		v, err := VNI(key, vlan)
		if err != nil {
			return
		}
		if v == 0 || v >= 1<<24 {
			t.Fatalf("VNI(%q, %d) = %d: not a nonzero 24-bit VNI", key, vlan, v)
		}
		if int(v&0xfff) != vlan || key != portGroupPrefix+strconv.Itoa(int(v>>12)) {
			t.Fatalf("VNI(%q, %d) = %d does not give its inputs back", key, vlan, v)
		}
	})
}
