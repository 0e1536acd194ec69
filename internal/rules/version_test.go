// SPDX-License-Identifier: Apache-2.0

package rules

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRuleParseVersion(t *testing.T) {
	tests := []struct {
		in   string
		want Version
	}{
		{"7.0", Version{7, 0, 0}},
		{"7.0.0", Version{7, 0, 0}},
		{"7.0.1", Version{7, 0, 1}},
		{"7.0U1", Version{7, 0, 1}},
		{"7.0u1", Version{7, 0, 1}},
		{"7.0 U1", Version{7, 0, 1}},
		{"7.0 u1", Version{7, 0, 1}},
		{"7.0 Update 1", Version{7, 0, 1}},
		{"7.0 update 1", Version{7, 0, 1}},
		{"7.0Update1", Version{7, 0, 1}},
		{"7.0 UPDATE 2", Version{7, 0, 2}},
		{"7.0.0 Update 1", Version{7, 0, 1}},
		{"7.0.2 U2", Version{7, 0, 2}},
		{"7.0 U3c", Version{7, 0, 3}},
		{"7.0U3c", Version{7, 0, 3}},
		{"7.0.2", Version{7, 0, 2}},
		{"6.5", Version{6, 5, 0}},
		{"6.7 U2", Version{6, 7, 2}},
		{"8.0", Version{8, 0, 0}},
		{"8.0.2", Version{8, 0, 2}},
		{"8.0 U3", Version{8, 0, 3}},
		{"9.0", Version{9, 0, 0}},
		{"10.0", Version{10, 0, 0}},
		{"  8.0  ", Version{8, 0, 0}},
		{"ESXi 7.0 U1", Version{7, 0, 1}},
		{"esxi7.0u1", Version{7, 0, 1}},
		{"vSphere 8.0 Update 2", Version{8, 0, 2}},
		{"6.0", Version{6, 0, 0}},
		{"8.0\tU1", Version{8, 0, 1}},
	}
	for _, tt := range tests {
		got, err := ParseVersion(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseVersion(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			continue
		}
		// String reads back.
		again, err := ParseVersion(got.String())
		if err != nil || again != got {
			t.Errorf("ParseVersion(%q.String() = %q) = %+v, %v", tt.in, got.String(), again, err)
		}
	}
}

func TestRuleParseVersionErrors(t *testing.T) {
	tests := []struct{ in, msg string }{
		{"", "it is empty"},
		{"   ", "it is empty"},
		{"8", "the minor version is missing"},
		{"latest", "does not start with a version number"},
		{"ESXi", "does not start with a version number"},
		{"v8.0", "does not start with a version number"},
		{"7.0.1.2", "more than three numbers"},
		{"7.0.3-0.50.20036589", `unexpected "-0.50.20036589"`},
		{"7..0", "minor version is empty"},
		{".7", "major version is empty"},
		{"7.0.", "third number is empty"},
		{"0.5", "the major version is 0"},
		{"07.0", `"07" has a leading zero`},
		{"7.00", `"00" has a leading zero`},
		{"700.0", "too large"},
		{"7.0 U", `update number is missing after "u"`},
		{"7.0 Update", `update number is missing after "update"`},
		{"7.0 U0", "update 0 does not exist"},
		{"7.0 U01", "leading zero"},
		{"7.0 U100", "too large"},
		{"7.0.1 U2", "two updates, .1 and U2"},
		{"7.0 U1 U2", `unexpected " u2" after the update number`},
		{"7.0 U3cd", `unexpected "cd"`},
		{"7.0 SP1", `unexpected "sp1" after the version number`},
		{"7.0 U1;rm -rf", "unexpected"},
		{strings.Repeat("9", 1000) + ".0", "too large"},
		{strings.Repeat("9", 1000), "minor version is missing"},
	}
	for _, tt := range tests {
		_, err := ParseVersion(tt.in)
		if err == nil {
			t.Errorf("ParseVersion(%q) succeeded; want an error", tt.in)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tt.msg) || !strings.HasPrefix(msg, "invalid ESXi version") || !strings.Contains(msg, versionHelp) {
			t.Errorf("ParseVersion(%q): %q; want it to say %q and how to write a version", tt.in, msg, tt.msg)
		}
		if len(msg) > 400 {
			t.Errorf("ParseVersion(%q): message of %d bytes", tt.in, len(msg))
		}
	}
}

func TestRuleVersionCompare(t *testing.T) {
	order := []Version{{6, 0, 0}, {6, 5, 0}, {6, 7, 0}, {6, 7, 2}, {7, 0, 0}, {7, 0, 1}, {7, 0, 2}, {7, 0, 3}, {8, 0, 0}, {8, 0, 2}, {10, 0, 0}}
	for i, a := range order {
		for j, b := range order {
			want := 0
			switch {
			case i < j:
				want = -1
			case i > j:
				want = 1
			}
			if got := a.Compare(b); got != want {
				t.Errorf("%v.Compare(%v) = %d; want %d", a, b, got, want)
			}
			if got := a.AtLeast(b); got != (i >= j) {
				t.Errorf("%v.AtLeast(%v) = %v", a, b, got)
			}
		}
	}
	if Default != (Version{8, 0, 0}) || Default.String() != "8.0" {
		t.Errorf("Default = %v; vrdma's level is 8.0", Default)
	}
	if !(Version{}).IsZero() || Default.IsZero() {
		t.Errorf("IsZero is wrong")
	}
	if s := (Version{7, 0, 2}).String(); s != "7.0 U2" {
		t.Errorf("String() = %q; want 7.0 U2", s)
	}
}

func TestRuleVersionJSON(t *testing.T) {
	var v struct{ ESXi Version }
	if err := json.Unmarshal([]byte(`{"ESXi": "7.0 Update 2"}`), &v); err != nil || v.ESXi != (Version{7, 0, 2}) {
		t.Fatalf("Unmarshal: %+v, %v", v, err)
	}
	b, err := json.Marshal(v)
	if err != nil || string(b) != `{"ESXi":"7.0 U2"}` {
		t.Fatalf("Marshal: %s, %v", b, err)
	}
	if err := json.Unmarshal([]byte(`{"ESXi": "seven"}`), &v); err == nil || !strings.Contains(err.Error(), "invalid ESXi version") {
		t.Fatalf("Unmarshal of a bad version: %v", err)
	}
}

func TestRuleMaxHWVersion(t *testing.T) {
	tests := []struct {
		esxi string
		hw   int
		ok   bool
	}{
		{"6.0", 11, true},
		{"6.5", 13, true},
		{"6.7", 14, true},
		{"6.7 U1", 14, true},
		{"6.7 U2", 15, true},
		{"6.7 U3", 15, true},
		{"7.0", 17, true},
		{"7.0 U1", 18, true},
		{"7.0 U2", 19, true},
		{"7.0 U3", 19, true},
		{"8.0", 20, true},
		{"8.0 U1", 20, true},
		{"8.0 U2", 21, true},
		{"8.0 U3", 21, true},
		{"8.1", 0, false},
		{"9.0", 0, false},
		{"2.5", 0, false},
	}
	for _, tt := range tests {
		hw, ok := MaxHWVersion(mustVersion(t, tt.esxi))
		if hw != tt.hw || ok != tt.ok {
			t.Errorf("MaxHWVersion(%s) = %d, %v; want %d, %v", tt.esxi, hw, ok, tt.hw, tt.ok)
		}
	}
	for hw, want := range map[int]Version{13: {6, 5, 0}, 16: {7, 0, 0}, 17: {7, 0, 0}, 18: {7, 0, 1}, 21: {8, 0, 2}} {
		if got, ok := firstESXiFor(hw); !ok || got != want {
			t.Errorf("firstESXiFor(%d) = %v, %v; want %v", hw, got, ok, want)
		}
	}
	if _, ok := firstESXiFor(22); ok {
		t.Errorf("firstESXiFor(22) knows a release")
	}
}
