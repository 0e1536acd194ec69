// SPDX-License-Identifier: Apache-2.0

package rules

import (
	"fmt"
	"strconv"
	"strings"
)

// Version is an ESXi (or vSphere) release: Major.Minor plus an update
// number. Update n is the same release as the third version component n:
// 7.0 U1 is 7.0.1 and 7.0 U2 is 7.0.2, the convention of the vSphere
// documentation ("7.0.2 and later") and of govmomi.
//
// The zero Version stands for [Default] wherever a Target is checked.
// Versions are comparable with ==.
type Version struct {
	Major  int // 8 in 8.0 U2
	Minor  int // 0 in 8.0 U2
	Update int // 2 in 8.0 U2 (8.0.2); 0 for the first release of Major.Minor
}

// Default is vrdma's own level, vSphere 8.0: the version the rules check
// against when no target ESXi version is given. vrdma itself offers every
// feature of that release.
var Default = Version{Major: 8, Minor: 0}

// Versions the rules compare against.
var (
	// minPVRDMA is the first ESXi with PVRDMA.
	minPVRDMA = Version{6, 5, 0}
	// minMultiAdapter is the first ESXi that allows more than one PVRDMA
	// adapter per VM (up to MaxAdapters).
	minMultiAdapter = Version{7, 0, 2}
	// minNativeEndpoint is the first ESXi with native endpoints.
	minNativeEndpoint = Version{7, 0, 1}
	// minAsyncMode is the first ESXi with async mode.
	minAsyncMode = Version{8, 0, 0}
)

// String returns the version as VMware writes it: "8.0", "7.0 U2".
// ParseVersion reads it back.
func (v Version) String() string {
	s := strconv.Itoa(v.Major) + "." + strconv.Itoa(v.Minor)
	if v.Update > 0 {
		s += " U" + strconv.Itoa(v.Update)
	}
	return s
}

// IsZero reports whether v is the zero Version.
func (v Version) IsZero() bool { return v == Version{} }

// Compare returns -1, 0 or +1 as v is older than, the same as or newer
// than w.
func (v Version) Compare(w Version) int {
	for _, d := range [...]int{v.Major - w.Major, v.Minor - w.Minor, v.Update - w.Update} {
		switch {
		case d < 0:
			return -1
		case d > 0:
			return 1
		}
	}
	return 0
}

// AtLeast reports whether v is w or newer.
func (v Version) AtLeast(w Version) bool { return v.Compare(w) >= 0 }

// MarshalText returns v.String(), so that a Version reads well in JSON.
func (v Version) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText parses text with ParseVersion.
func (v *Version) UnmarshalText(text []byte) error {
	w, err := ParseVersion(string(text))
	if err != nil {
		return err
	}
	*v = w
	return nil
}

// versionHelp ends every ParseVersion error: the forms it accepts.
const versionHelp = `write an ESXi version such as 8.0, 7.0.2, 7.0U1 or "7.0 Update 1"`

// maxVersionNumber bounds each number of a version: real ones have one or
// two digits.
const maxVersionNumber = 99

// ParseVersion parses an ESXi version. These are the same release:
//
//	7.0.1   7.0U1   7.0u1   7.0 U1   7.0 Update 1   7.0.0 Update 1
//
// "ESXi " or "vSphere " may come first, letters and spaces are compared
// without regard to case, and a letter after the update number (7.0 U3c) is
// accepted and ignored: it names a patch of the same update. Before 7.0,
// ESXi did not number its updates in the version (6.7 U2 reports 6.7.0), so
// write the update explicitly: "6.7 U2".
//
// On failure the error says what is wrong with s and which forms are
// accepted.
func ParseVersion(s string) (Version, error) {
	v, msg := parseVersion(s)
	if msg != "" {
		return Version{}, fmt.Errorf("invalid ESXi version %q: %s; %s", shortVersion(s), msg, versionHelp)
	}
	return v, nil
}

// shortVersion cuts a hostile version string for an error message.
func shortVersion(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// parseVersion parses s; on failure it returns what is wrong.
func parseVersion(s string) (Version, string) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return Version{}, "it is empty"
	}
	for _, prefix := range []string{"esxi", "vsphere"} {
		if rest, ok := strings.CutPrefix(t, prefix); ok {
			t = strings.TrimLeft(rest, " \t")
			break
		}
	}
	// The dotted part: digits and dots.
	i := 0
	for i < len(t) && (t[i] == '.' || '0' <= t[i] && t[i] <= '9') {
		i++
	}
	dotted, rest := t[:i], strings.TrimLeft(t[i:], " \t")
	if dotted == "" {
		return Version{}, "it does not start with a version number"
	}
	parts := strings.Split(dotted, ".")
	if len(parts) < 2 {
		return Version{}, "the minor version is missing (ESXi versions have at least two numbers)"
	}
	if len(parts) > 3 {
		return Version{}, "it has more than three numbers (a build number is not a version)"
	}
	var nums [3]int
	names := [3]string{"major version", "minor version", "third number"}
	for j, p := range parts {
		n, msg := versionNumber(p, names[j])
		if msg != "" {
			return Version{}, msg
		}
		nums[j] = n
	}
	if nums[0] == 0 {
		return Version{}, "the major version is 0"
	}
	v := Version{Major: nums[0], Minor: nums[1], Update: nums[2]}
	if rest == "" {
		return v, ""
	}

	// The update: "u1", "update 1", with an optional patch letter.
	word := ""
	switch {
	case strings.HasPrefix(rest, "update"):
		word = "update"
	case strings.HasPrefix(rest, "u"):
		word = "u"
	default:
		return Version{}, fmt.Sprintf("unexpected %q after the version number", shortVersion(rest))
	}
	rest = strings.TrimLeft(rest[len(word):], " \t")
	j := 0
	for j < len(rest) && '0' <= rest[j] && rest[j] <= '9' {
		j++
	}
	if j == 0 {
		return Version{}, "the update number is missing after \"" + word + "\""
	}
	u, msg := versionNumber(rest[:j], "update number")
	if msg != "" {
		return Version{}, msg
	}
	rest = rest[j:]
	if len(rest) == 1 && 'a' <= rest[0] && rest[0] <= 'z' {
		rest = "" // a patch letter: 7.0 U3c
	}
	if rest != "" {
		return Version{}, fmt.Sprintf("unexpected %q after the update number", shortVersion(rest))
	}
	if u == 0 {
		return Version{}, "update 0 does not exist (write the version without an update)"
	}
	if len(parts) == 3 && v.Update != 0 && v.Update != u {
		return Version{}, fmt.Sprintf("it names two updates, .%d and U%d (7.0.2 and 7.0 U2 are the same release: write one)", v.Update, u)
	}
	v.Update = u
	return v, ""
}

// versionNumber parses one number of a version; what names it for errors.
func versionNumber(p, what string) (int, string) {
	if p == "" {
		return 0, "the " + what + " is empty"
	}
	if len(p) > 1 && p[0] == '0' {
		return 0, "the " + what + " " + strconv.Quote(p) + " has a leading zero"
	}
	if len(p) > 2 {
		return 0, "the " + what + " " + strconv.Quote(shortVersion(p)) + " is too large"
	}
	n, err := strconv.Atoi(p)
	if err != nil || n > maxVersionNumber {
		return 0, "the " + what + " " + strconv.Quote(p) + " is not a number"
	}
	return n, ""
}

// hwTable maps ESXi releases to the newest virtual hardware version they
// run, oldest first (govmomi
// vim25/types/hardware_version.go, from VMware KB 1003746). A release runs
// every hardware version up to its own.
var hwTable = []struct {
	esxi Version
	hw   int
}{
	{Version{3, 0, 0}, 4},
	{Version{4, 0, 0}, 7},
	{Version{5, 0, 0}, 8},
	{Version{5, 1, 0}, 9},
	{Version{5, 5, 0}, 10},
	{Version{6, 0, 0}, 11},
	{Version{6, 5, 0}, 13},
	{Version{6, 7, 0}, 14},
	{Version{6, 7, 2}, 15},
	{Version{7, 0, 0}, 17},
	{Version{7, 0, 1}, 18},
	{Version{7, 0, 2}, 19},
	{Version{8, 0, 0}, 20},
	{Version{8, 0, 2}, 21},
}

// lastKnownLine is the newest Major.Minor line hwTable knows in full: a
// target beyond it (9.0) may run hardware versions the table does not
// list.
var lastKnownLine = Version{8, 0, 0}

// MaxHWVersion returns the newest virtual hardware version that ESXi v
// runs, and false if the table of releases does not know: v is older than
// ESXi 3.0 or newer than the 8.0 line.
func MaxHWVersion(v Version) (int, bool) {
	if v.Major > lastKnownLine.Major || v.Major == lastKnownLine.Major && v.Minor > lastKnownLine.Minor {
		return 0, false
	}
	hw, ok := 0, false
	for _, e := range hwTable {
		if v.AtLeast(e.esxi) {
			hw, ok = e.hw, true
		}
	}
	return hw, ok
}

// firstESXiFor returns the oldest ESXi that runs hardware version hw, and
// false if no known release does.
func firstESXiFor(hw int) (Version, bool) {
	for _, e := range hwTable {
		if e.hw >= hw {
			return e.esxi, true
		}
	}
	return Version{}, false
}
