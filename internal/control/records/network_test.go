// SPDX-License-Identifier: Apache-2.0

package records

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

func validSwitch() Switch {
	return Switch{Name: "dvs1", UUID: "501d0b8e-8d95-4e2b-b25c-2f3aa61a9e1d", MTU: 9000, UplinkPolicy: UplinkSingle}
}

func TestNetworkRecordsValidate(t *testing.T) {
	r1 := Router{Name: "r1", Subnets: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("10.0.2.0/24")},
		DSCPMap: []DSCPMapping{{Priority: 3, DSCP: 26}}, DSCPPreserved: true, MTU: 9000}
	sw := func(f func(*Switch)) Switch { s := validSwitch(); f(&s); return s }
	host := func(f func(*Uplink)) Host { h := validHost(); f(&h.Uplinks[0]); return h }
	tests := []struct {
		name string
		r    Record
		says []string
	}{
		{"switch with routers and policy", sw(func(s *Switch) { s.NetworkPolicy = NetworkWarn; s.Routers = []Router{r1} }), nil},
		{"switch policy off", sw(func(s *Switch) { s.NetworkPolicy = NetworkOff }), nil},
		{"switch bad policy", sw(func(s *Switch) { s.NetworkPolicy = "lenient" }), []string{`networkPolicy: "lenient" is not "strict", "warn" or "off"`}},
		{"router with one subnet", sw(func(s *Switch) { r := r1; r.Subnets = r.Subnets[:1]; s.Routers = []Router{r} }),
			[]string{"routers[0].subnets: 1 subnets: a router joins at least two"}},
		{"router host bits", sw(func(s *Switch) {
			r := r1
			r.Subnets = []netip.Prefix{netip.MustParsePrefix("10.0.1.7/24"), netip.MustParsePrefix("10.0.2.0/24"), netip.MustParsePrefix("10.0.2.0/24"), {}}
			s.Routers = []Router{r}
		}), []string{"routers[0].subnets[0]: 10.0.1.7/24 has host bits set: write 10.0.1.0/24", "subnets[2]: 10.0.2.0/24 is listed twice", "subnets[3]: missing"}},
		{"router mapped IPv4", sw(func(s *Switch) {
			r := r1
			r.Subnets = []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.1.0/120"), netip.MustParsePrefix("10.0.2.0/24")}
			s.Routers = []Router{r}
		}), []string{"write IPv4 subnets as a.b.c.d/n"}},
		{"router map ranges", sw(func(s *Switch) {
			r := r1
			r.Name = "-r"
			r.DSCPMap = []DSCPMapping{{8, 64}, {-1, 26}, {3, 26}}
			r.MTU = 100
			s.Routers = []Router{r}
		}), []string{"routers[0].name:", "dscpMap[0].priority: 8 is out of range 0–7", "dscpMap[0].dscp: 64 is out of range 0–63",
			"dscpMap[1].priority: -1", "dscpMap[2].dscp: DSCP 26 is mapped twice", "routers[0].mtu: 100 is out of range"}},
		{"router twice", sw(func(s *Switch) { s.Routers = []Router{r1, r1} }), []string{`routers[1].name: router "r1" is declared twice`}},
		{"too many routers", sw(func(s *Switch) { s.Routers = make([]Router, MaxRouters+1) }), []string{"65 routers, more than 64"}},
		{"portgroup roce mtu", PortGroup{Name: "RoCE", Key: "pg", Switch: "dvs1", RoCEVersion: RoCEv2, RoCEMTU: 4096}, nil},
		{"portgroup bad roce mtu", PortGroup{Name: "RoCE", Key: "pg", Switch: "dvs1", RoCEVersion: RoCEv2, RoCEMTU: 1500},
			[]string{"roceMtu: 1500 is not a RoCE MTU"}},
		{"uplink declared", host(func(u *Uplink) {
			u.Declared = NICState{PFC: ptr(PrioritiesOf(3)), Pause: &Pause{}, Trust: TrustDSCP, MTU: 9000, Teamed: ptr(false), SoleUplink: ptr(true)}
		}), nil},
		{"uplink observed with why", host(func(u *Uplink) {
			u.Observed = NICState{MTU: 65536, Teamed: ptr(true), Team: "bond0", Unknown: map[string]string{FieldPFC: "EOPNOTSUPP"}}
		}), nil},
		{"uplink hostile state", host(func(u *Uplink) {
			u.Declared = NICState{Trust: "cos", MTU: 67, Team: "bond/0", Unknown: map[string]string{"pfc": "x"}}
			u.Observed = NICState{MTU: 1 << 20, Unknown: map[string]string{"colour": strings.Repeat("x", MaxUnknownWhy+1)}}
		}), []string{`uplinks[0].declared.trust: "cos" is not "pcp" or "dscp"`, "declared.mtu: 67 is out of range 68–65536",
			`declared.team: "bond/0" has '/'`, `"bond/0" names a team, but teamed is not true`, "declared.unknown: only observed state",
			"observed.mtu: 1048576 is out of range", `observed.unknown: "colour" is not a field`, "observed.unknown.colour: 513 characters"}},
	}
	for _, tt := range tests {
		err := tt.r.Validate()
		if len(tt.says) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: valid; want %q", tt.name, tt.says)
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v does not match ErrInvalid", tt.name, err)
		}
		for _, s := range tt.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %q does not say %q", tt.name, err, s)
			}
		}
	}
}

func TestNetworkPrioritySet(t *testing.T) {
	s := PrioritiesOf(3, 4, 9, -1)
	if s.String() != "3,4" || !s.Has(3) || s.Has(5) || s.Has(8) || s.Has(-1) {
		t.Errorf("PrioritiesOf(3,4) = %v", s)
	}
	b, _ := json.Marshal(s)
	if string(b) != "[3,4]" {
		t.Errorf("JSON %s", b)
	}
	b, _ = json.Marshal(PrioritySet(0))
	if string(b) != "[]" {
		t.Errorf("empty set JSON %s", b)
	}
	var got PrioritySet
	if err := json.Unmarshal([]byte("[0, 7, 7]"), &got); err != nil || got != PrioritiesOf(0, 7) {
		t.Errorf("unmarshal [0,7,7] = %v, %v", got, err)
	}
	for _, bad := range []string{"[8]", "[-1]", `"3"`, "3", "[3.5]", "{}"} {
		if err := json.Unmarshal([]byte(bad), &got); err == nil || !strings.Contains(err.Error(), "priorit") {
			t.Errorf("unmarshal %s: %v", bad, err)
		}
	}
	for in, want := range map[string]PrioritySet{"none": 0, "3": PrioritiesOf(3), "3,4": PrioritiesOf(3, 4), " 0 , 7": PrioritiesOf(0, 7)} {
		if got, err := ParsePrioritySet(in); err != nil || got != want {
			t.Errorf("ParsePrioritySet(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "8", "3,", "x", "-1", "none,3"} {
		if _, err := ParsePrioritySet(bad); err == nil {
			t.Errorf("ParsePrioritySet(%q) accepted", bad)
		}
	}
}

func TestNetworkParseFlags(t *testing.T) {
	for in, want := range map[string]Pause{"off": {}, "rx": {RX: true}, "tx": {TX: true}, "rx,tx": {true, true}, "tx,rx": {true, true}} {
		if got, err := ParsePause(in); err != nil || got != want || (in != "tx,rx" && got.String() != in) {
			t.Errorf("ParsePause(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "on", "rx,", "both"} {
		if _, err := ParsePause(bad); err == nil {
			t.Errorf("ParsePause(%q) accepted", bad)
		}
	}
	if m, err := ParseDSCPMapping("3:26"); err != nil || m != (DSCPMapping{3, 26}) || m.String() != "3:26" {
		t.Errorf("ParseDSCPMapping(3:26) = %v, %v", m, err)
	}
	for _, bad := range []string{"", "3", "8:26", "3:64", "a:b", "3:26:1", "-1:2"} {
		if _, err := ParseDSCPMapping(bad); err == nil {
			t.Errorf("ParseDSCPMapping(%q) accepted", bad)
		}
	}
	for _, ok := range []string{"strict", "warn", "off"} {
		if p, err := ParseNetworkPolicy(ok); err != nil || string(p) != ok {
			t.Errorf("ParseNetworkPolicy(%q) = %v, %v", ok, p, err)
		}
	}
	if _, err := ParseNetworkPolicy(""); err == nil {
		t.Error("ParseNetworkPolicy(\"\") accepted")
	}
	if NetworkPolicy("").Effective() != NetworkStrict || NetworkOff.Effective() != NetworkOff {
		t.Error("Effective")
	}
	if _, err := ParseTrust("cos"); err == nil {
		t.Error("ParseTrust(cos) accepted")
	}
}

func TestNetworkUplinkNames(t *testing.T) {
	h := validHost()
	a := netip.MustParseAddr("192.0.2.9")
	h.Uplinks = append(h.Uplinks, Uplink{Kind: UplinkSoftRoCEv2, Address: a, GID: GIDOf(a)}, Uplink{Kind: UplinkHCA, Device: "eth1"}, Uplink{Kind: UplinkHCA, Device: "eth1"})
	if i, err := h.UplinkIndex("mlx5_0"); i != 0 || err != nil {
		t.Errorf("UplinkIndex(mlx5_0) = %d, %v", i, err)
	}
	if i, err := h.UplinkIndex("192.0.2.9"); i != 1 || err != nil || h.Uplinks[1].Name() != "192.0.2.9" {
		t.Errorf("UplinkIndex(192.0.2.9) = %d, %v", i, err)
	}
	if _, err := h.UplinkIndex("eth1"); err == nil || !strings.Contains(err.Error(), "2 uplinks named") {
		t.Errorf("UplinkIndex(eth1): %v", err)
	}
	if _, err := h.UplinkIndex("eth9"); !errors.Is(err, ErrNoSuchUplink) || !strings.Contains(err.Error(), "mlx5_0, 192.0.2.9, eth1") {
		t.Errorf("UplinkIndex(eth9): %v", err)
	}
	if !SameUplink(Uplink{Device: "eth1", Address: a}, Uplink{Device: "eth1"}) || SameUplink(Uplink{Device: "eth1", Address: a}, Uplink{Device: "eth2", Address: a}) ||
		!SameUplink(Uplink{Address: a}, Uplink{Device: "eth2", Address: a}) || SameUplink(Uplink{}, Uplink{}) {
		t.Error("SameUplink")
	}
}

// An uplink and a switch without network state encode as before.
func TestNetworkRecordsEncodeAsBefore(t *testing.T) {
	b, _ := json.Marshal(validHost().Uplinks[0])
	if strings.Contains(string(b), "declared") || strings.Contains(string(b), "observed") {
		t.Errorf("uplink JSON %s", b)
	}
	b, _ = json.Marshal(validSwitch())
	if strings.Contains(string(b), "routers") || strings.Contains(string(b), "networkPolicy") {
		t.Errorf("switch JSON %s", b)
	}
	u := validHost().Uplinks[0]
	u.Declared.PFC = ptr(PrioritySet(0))
	b, _ = json.Marshal(u)
	var back Uplink
	if err := json.Unmarshal(b, &back); err != nil || back.Declared.PFC == nil || *back.Declared.PFC != 0 {
		t.Errorf("declared empty PFC set does not survive JSON: %s → %+v, %v", b, back.Declared, err)
	}
}
