// SPDX-License-Identifier: Apache-2.0

package rules

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/vmx"
)

// fixture is a lint fixture of testdata (see testdata/README.md).
type fixture struct {
	name   string
	data   []byte
	target Target
	want   []string // rule IDs, sorted
}

// readFixtures reads every testdata/*.vmx file and its header comments.
func readFixtures(t testing.TB) []fixture {
	t.Helper()
	names, err := filepath.Glob("testdata/*.vmx")
	if err != nil || len(names) == 0 {
		t.Fatalf("no fixtures in testdata: %v", err)
	}
	var out []fixture
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		fx := fixture{name: filepath.Base(name), data: data}
		sawWant := false
		text := strings.TrimPrefix(string(data), "\xEF\xBB\xBF")
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSuffix(line, "\r")
			if !strings.HasPrefix(line, "#") {
				break
			}
			k, v, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(line, "#")), ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch k {
			case "esxi":
				if fx.target.ESXi, err = ParseVersion(v); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
			case "host":
				fx.target.Host = parseHostSpec(t, name, v)
			case "standalone":
				fx.target.Standalone = v == "yes"
			case "want":
				sawWant = true
				fx.want = strings.Fields(v)
				slices.Sort(fx.want)
			}
		}
		if !sawWant {
			t.Fatalf("%s: no \"# want:\" line at the top", name)
		}
		out = append(out, fx)
	}
	return out
}

// parseHostSpec parses "name=esx1 switch=dvs1 address=10.0.0.1:4791
// firewall=on namespaces=on uplink=on".
func parseHostSpec(t testing.TB, file, spec string) *Host {
	h := &Host{}
	for _, f := range strings.Fields(spec) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "name":
			h.Name = v
		case "switch":
			h.Switch = v
		case "address":
			ap, err := netip.ParseAddrPort(v)
			if err != nil {
				t.Fatalf("%s: host address: %v", file, err)
			}
			h.PVRDMAAddress = ap
		case "firewall":
			h.FirewallPVRDMA = v == "on"
		case "namespaces":
			h.Namespaces = v == "on"
		case "uplink":
			h.RDMAUplink = v == "on"
		default:
			t.Fatalf("%s: unknown host field %q", file, k)
		}
	}
	return h
}

// TestRuleFixtures checks every lint fixture, and that every rule has one.
func TestRuleFixtures(t *testing.T) {
	covered := map[string]bool{}
	clean := 0
	for _, fx := range readFixtures(t) {
		t.Run(fx.name, func(t *testing.T) {
			f, err := vmx.Parse(fx.data)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if !bytes.Equal(f.Bytes(), fx.data) {
				t.Fatalf("the fixture does not round-trip")
			}
			got := Check(f, fx.target)
			if !slices.Equal(ruleIDs(got), fx.want) {
				t.Fatalf("findings %q; want %q\n%s", ruleIDs(got), fx.want, findingsText(got))
			}
			checkFindings(t, f, got)
			for _, id := range fx.want {
				covered[id] = true
			}
			if len(fx.want) == 0 {
				clean++
			}
		})
	}
	for _, r := range Rules() {
		if !covered[r.ID] {
			t.Errorf("no fixture in testdata triggers rule %s", r.ID)
		}
	}
	if clean < 3 {
		t.Errorf("only %d clean fixtures; want the realistic vSphere files among them", clean)
	}
}

// TestRuleBrokenFixtures checks that the files of testdata/broken are rejected
// with a line and a reason.
func TestRuleBrokenFixtures(t *testing.T) {
	names, _ := filepath.Glob("testdata/broken/*.vmx")
	if len(names) < 4 {
		t.Fatalf("want at least 4 broken fixtures, found %d", len(names))
	}
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		_, err = vmx.Parse(data)
		var pe *vmx.ParseError
		if err == nil || !errors.As(err, &pe) || pe.Line < 1 || pe.Msg == "" {
			t.Errorf("%s: Parse error %v; want a *vmx.ParseError with a line", name, err)
		}
	}
}
