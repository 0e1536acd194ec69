// SPDX-License-Identifier: Apache-2.0

package rules

import (
	"slices"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/vmx"
)

// FuzzCheck runs every rule on any file that parses, against several
// targets: Check never panics, every finding is of a listed rule with its
// severity and a message, and its Line is that of its Key.
func FuzzCheck(f *testing.F) {
	for _, fx := range readFixtures(f) {
		f.Add(fx.data)
	}
	f.Add([]byte(goodVM + "vrdma1.nativeEndpointSupport = \"TRUE\"\nvrdma.asyncMode = \"TRUE\"\n"))
	f.Add([]byte("ethernet9999.virtualDev = vrdma\nvrdma9999.nativeEndpointSupport = 1\n"))
	f.Add([]byte("ethernet1.virtualDev = vrdma\nethernet1.present = maybe\nmemSize = 99999999999999999999\n"))
	hosts := []*Host{nil, goodHost, bareHost, dvs2Host}
	versions := []Version{{}, {6, 0, 0}, {6, 5, 0}, {7, 0, 1}, {7, 0, 2}, {9, 0, 0}}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := vmx.Parse(data)
		if err != nil {
			return
		}
		before := string(file.Bytes())
		for i, v := range versions {
			fs := Check(file, Target{ESXi: v, Host: hosts[i%len(hosts)]})
			for _, fd := range fs {
				r := slices.IndexFunc(rules, func(r Rule) bool { return r.ID == fd.Rule })
				fmtBug := strings.Contains(fd.Message, "%!") && !strings.Contains(before, "%!") // a fmt mistake, not the input's text
				if r < 0 || fd.Severity != rules[r].Severity || fd.Message == "" || fmtBug {
					t.Fatalf("bad finding %+v", fd)
				}
				if fd.Key != "" && fd.Rule != RuleDuplicateKey && fd.Line != file.Line(fd.Key) {
					t.Fatalf("finding %+v: %s is on line %d", fd, fd.Key, file.Line(fd.Key))
				}
			}
		}
		if string(file.Bytes()) != before {
			t.Fatalf("Check modified the file")
		}
	})
}

// FuzzParseVersion checks that ParseVersion never panics, that what it
// accepts is within bounds and reads back from its String, and that its
// errors say how to write a version.
func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"8.0", "7.0.1", "7.0U1", "7.0 Update 1", "7.0u1", "ESXi 6.7 U2", "7.0 U3c", "7.0.1 U2", "", "8", "v8.0", "7.0 U"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseVersion(s)
		if err != nil {
			if v != (Version{}) || !strings.Contains(err.Error(), versionHelp) {
				t.Fatalf("ParseVersion(%q) = %+v, %v", s, v, err)
			}
			return
		}
		if v.Major < 1 || v.Major > maxVersionNumber || v.Minor < 0 || v.Minor > maxVersionNumber || v.Update < 0 || v.Update > maxVersionNumber {
			t.Fatalf("ParseVersion(%q) = %+v: out of bounds", s, v)
		}
		again, err := ParseVersion(v.String())
		if err != nil || again != v {
			t.Fatalf("ParseVersion(%q) = %+v, whose String %q reads back as %+v, %v", s, v, v.String(), again, err)
		}
	})
}
