// SPDX-License-Identifier: Apache-2.0

package netfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/netcheck"
)

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNetworkFileExample parses the example of docs/network.md, in YAML
// and in JSON, and checks it.
func TestNetworkFileExample(t *testing.T) {
	y, err := Parse(read(t, "testdata/network.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := Parse(read(t, "testdata/network.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(y, j) {
		t.Fatalf("YAML and JSON differ:\n%+v\n%+v", y, j)
	}
	if len(y.Switches) != 1 || len(y.PortGroups) != 1 || len(y.Hosts) != 3 {
		t.Fatalf("model %+v", y)
	}
	// Defaults: the one switch, host IDs, GIDs.
	h := y.Hosts[2]
	if h.ID != "esx3" || h.Switch != "dvs1" || h.State != records.HostUp || h.Uplinks[0].GID.String() != "::ffff:10.0.2.13" {
		t.Errorf("host esx3: %+v", h)
	}
	if pg := y.PortGroups[0]; pg.Switch != "dvs1" || pg.RoCEMTU != 4096 {
		t.Errorf("port group %+v", pg)
	}
	if d := y.Hosts[1].Uplinks[0].Declared; d.PFC == nil || *d.PFC != 0 || d.Teamed == nil || *d.Teamed {
		t.Errorf("esx2 declares %+v", d)
	}
	rep := netcheck.Check(y)
	got := map[string]netcheck.Status{}
	for _, r := range rep.Switches[0].Results {
		got[r.Check+" "+r.Subject] = r.Status
	}
	for k, want := range map[string]netcheck.Status{
		"roce-l2-lossless uplink eth1 of host esx1": netcheck.Pass,
		"roce-l2-lossless uplink eth1 of host esx2": netcheck.Fail,
		"roce-vlan-pfc uplink eth1 of host esx2":    netcheck.Fail,
		"roce-l3-lossless hosts esx1 and esx2":      netcheck.Pass,
		"roce-l3-lossless hosts esx1 and esx3":      netcheck.Pass,
		"roce-mtu hosts esx1 and esx2":              netcheck.Pass,
		"roce-mtu hosts esx1 and esx3":              netcheck.Fail,
		"roce-no-teaming uplink ens5 of host esx3":  netcheck.Pass,
	} {
		if got[k] != want {
			t.Errorf("%s: %s, want %s", k, got[k], want)
		}
	}
}

func TestNetworkFileErrors(t *testing.T) {
	const sw = "switches: [{name: dvs1}]\n"
	tests := []struct {
		name string
		in   string
		says []string
	}{
		{"empty", "", []string{"empty"}},
		{"only a comment", "# nothing\n", []string{"empty"}},
		{"no switch", "hosts: []\n", []string{"switches: none"}},
		{"unknown field", sw + "portGroups: [{key: pg, roceVersion: v2, colour: red}]\n", []string{`unknown field "colour"`}},
		{"unknown field, JSON", `{"switches": [{"name": "dvs1", "mtus": 9000}]}`, []string{`unknown field "mtus"`}},
		{"duplicate key", "switches: [{name: dvs1, name: dvs2}]\n", []string{"YAML", `key "name" already set`}},
		{"YAML syntax", "switches: [\n", []string{"YAML"}},
		{"JSON syntax, with its line", "{\n\"switches\": [\n{\"name\": \"dvs1\",}\n]}", []string{"line 3", "invalid character"}},
		{"a list at the top", "- a\n- b\n", []string{"the top level is a JSON array: want an object"}},
		{"trailing JSON", `{"switches": [{"name": "dvs1"}]} {}`, []string{"more after the top-level object"}},
		{"wrong type", sw + "portGroups: [{key: pg, vlan: ten, roceVersion: v2}]\n", []string{"portGroups.vlan: want int, not a JSON string"}},
		{"priority out of range", sw + "hosts: [{name: h, uplinks: [{kind: hca, address: 10.0.0.1, declared: {pfc: [9]}}]}]\n", []string{"9 is not a priority 0–7"}},
		{"bad address", sw + "hosts: [{name: h, uplinks: [{kind: hca, address: 10.0.0.300}]}]\n", []string{"10.0.0.300"}},
		{"validation, with where", sw + "portGroups: [{key: pg, vlan: 5000, roceVersion: v3, roceMtu: 1500}]\n",
			[]string{"portGroups[0]: portgroup \"pg\": vlan: 5000 is out of range", `roceVersion: "v3"`, "roceMtu: 1500 is not a RoCE MTU"}},
		{"hostile names", "switches: [{name: \"dvs/../x\", networkPolicy: yolo}]\n", []string{"switches[0]", `'/' at offset 3`, `networkPolicy: "yolo"`}},
		{"unknown switch", "switches: [{name: dvs1}, {name: dvs2}]\nportGroups: [{key: pg, switch: dvs9, roceVersion: v2}]\nhosts: [{name: h}]\n",
			[]string{`portGroups[0]: switch "dvs9" is not in the file`}},
		{"no switch to default to", "switches: [{name: dvs1}, {name: dvs2}]\nhosts: [{name: h, uplinks: [{kind: hca, address: 10.0.0.1}]}]\n",
			[]string{"RDMA uplinks but no switch"}},
		{"twice", "switches: [{name: dvs1}, {name: dvs1}]\nportGroups: [{key: pg, roceVersion: v2}, {key: pg, roceVersion: v2}]\nhosts: [{name: h}, {name: h}]\n",
			[]string{`switches[1]: switch "dvs1" is declared twice`, `portGroups[1]: port group "pg" is declared twice`, `hosts[1]: host ID "h" is declared twice`, `host name "h" is declared twice`}},
		{"router", sw[:len(sw)-3] + ", routers: [{name: r1, subnets: [10.0.1.5/24]}]}]\n", []string{"routers[0].subnets: 1 subnets", "routers[0].subnets[0]: 10.0.1.5/24 has host bits set"}},
		{"too large", strings.Repeat(" ", MaxBytes+1), []string{"more than 1048576"}},
		{"aliases", "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
			[]string{"excessive aliasing"}},
	}
	for _, tt := range tests {
		m, err := Parse([]byte(tt.in))
		if err == nil {
			t.Errorf("%s: parsed: %+v", tt.name, m)
			continue
		}
		if !errors.Is(err, ErrBadFile) {
			t.Errorf("%s: %v does not match ErrBadFile", tt.name, err)
		}
		if !reflect.DeepEqual(m, netcheck.Model{}) {
			t.Errorf("%s: error with a model %+v", tt.name, m)
		}
		for _, s := range tt.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", tt.name, err, s)
			}
		}
	}
}

// encode returns m as a JSON network file.
func encode(m netcheck.Model) ([]byte, error) {
	return json.Marshal(File{Switches: m.Switches, PortGroups: m.PortGroups, Hosts: m.Hosts})
}

// FuzzParse: Parse never panics; it returns a model exactly when it
// returns no error; and a model it returns, written as JSON, reads back
// the same.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/network.yaml", "testdata/network.json"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			if !reflect.DeepEqual(m, netcheck.Model{}) {
				t.Fatalf("error %v with a model", err)
			}
			return
		}
		j, err := encode(m)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		m2, err := Parse(j)
		if err != nil {
			t.Fatalf("what Parse returned does not parse again: %v\n%s", err, j)
		}
		j2, _ := encode(m2)
		if !bytes.Equal(j, j2) {
			t.Fatalf("not the same after a round trip:\n%s\n%s", j, j2)
		}
		netcheck.Check(m) // must not panic
	})
}
