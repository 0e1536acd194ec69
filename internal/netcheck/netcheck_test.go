// SPDX-License-Identifier: Apache-2.0

package netcheck

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/records"
)

func ptr[T any](v T) *T { return &v }

var dvs1 = records.Switch{Name: "dvs1", UUID: "501d0b8e-8d95-4e2b-b25c-2f3aa61a9e1d", MTU: 9000, UplinkPolicy: records.UplinkSingle}

func swWith(f func(*records.Switch)) records.Switch { s := dvs1; f(&s); return s }

var pg80 = records.PortGroup{Name: "RoCE", Key: "dvportgroup-80", Switch: "dvs1", VLAN: 100, PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}

func pgWith(f func(*records.PortGroup)) records.PortGroup { p := pg80; f(&p); return p }

// lossless is a declaration that passes every uplink check for pg80.
var lossless = records.NICState{PFC: ptr(records.PrioritiesOf(3)), Pause: &records.Pause{}, Teamed: ptr(false), MTU: 9000}

// endOf returns host name's end with uplink eth1 at address addr.
func endOf(name, addr string, declared, observed records.NICState) End {
	a := netip.MustParseAddr(addr)
	u := records.Uplink{Kind: records.UplinkHCA, Device: "eth1", Address: a, GID: records.GIDOf(a), Declared: declared, Observed: observed}
	h := records.Host{ID: name + "-id", Name: name, Switch: "dvs1", Uplinks: []records.Uplink{u}, AgentVersion: "t", State: records.HostUp}
	return End{Host: h, Uplink: u}
}

func declared(f func(*records.NICState)) records.NICState { s := lossless; f(&s); return s }

type want struct {
	st   Status
	says []string // substrings of the detail
	fix  []string // substrings of the fix
}

func check(t *testing.T, name string, got Result, w want) {
	t.Helper()
	if got.Status != w.st {
		t.Errorf("%s: %s %s: %s (fix %q); want %s", name, got.Check, got.Status, got.Detail, got.Fix, w.st)
		return
	}
	for _, s := range w.says {
		if !strings.Contains(got.Detail, s) {
			t.Errorf("%s: detail %q does not say %q", name, got.Detail, s)
		}
	}
	for _, s := range w.fix {
		if !strings.Contains(got.Fix, s) {
			t.Errorf("%s: fix %q does not say %q", name, got.Fix, s)
		}
	}
	if (got.Status == Pass) != (got.Fix == "") {
		t.Errorf("%s: status %s with fix %q", name, got.Status, got.Fix)
	}
}

func TestNetworkCheckL2Lossless(t *testing.T) {
	off := &records.Pause{}
	tests := []struct {
		name     string
		pg       records.PortGroup
		decl     records.NICState
		observed records.NICState
		w        want
	}{
		{"PFC on the priority, declared", pg80, lossless, records.NICState{}, want{Pass, []string{"PFC on priority 3 on uplink eth1 of host B (declared)"}, nil}},
		{"PFC on the priority, reported", pg80, records.NICState{}, records.NICState{PFC: ptr(records.PrioritiesOf(3, 4))}, want{Pass, []string{"(reported by the kernel)"}, nil}},
		{"priority 0", pgWith(func(p *records.PortGroup) { p.PFCPriority = 0 }), declared(func(s *records.NICState) { s.PFC = ptr(records.PrioritiesOf(0)) }), records.NICState{}, want{Pass, []string{"priority 0"}, nil}},
		{"priority 7", pgWith(func(p *records.PortGroup) { p.PFCPriority = 7 }), declared(func(s *records.NICState) { s.PFC = ptr(records.PrioritiesOf(7)) }), records.NICState{}, want{Pass, []string{"priority 7"}, nil}},
		{"PFC on the neighbouring priority", pgWith(func(p *records.PortGroup) { p.PFCPriority = 4 }), lossless, records.NICState{},
			want{Fail, []string{"PFC not enabled for priority 4 on uplink eth1 of host B (PFC priorities 3, declared)", "global pause is off (declared)"}, []string{"prio-pfc 4:on", "ethtool -A eth1 rx on tx on"}}},
		{"no PFC, global pause", pg80, declared(func(s *records.NICState) {
			s.PFC = ptr(records.PrioritySet(0))
			s.Pause = &records.Pause{RX: true, TX: true}
		}), records.NICState{},
			want{Pass, []string{"global pause rx and tx on uplink eth1 of host B (declared)"}, nil}},
		{"pause rx only", pg80, declared(func(s *records.NICState) { s.PFC = ptr(records.PrioritySet(0)); s.Pause = &records.Pause{RX: true} }), records.NICState{},
			want{Fail, []string{"PFC priorities none", "global pause is rx only"}, nil}},
		{"pause tx only", pg80, declared(func(s *records.NICState) { s.PFC = ptr(records.PrioritySet(0)); s.Pause = &records.Pause{TX: true} }), records.NICState{},
			want{Fail, []string{"global pause is tx only"}, nil}},
		{"the kernel wins over the declaration", pg80, lossless, records.NICState{PFC: ptr(records.PrioritySet(0)), Pause: off},
			want{Fail, []string{"PFC not enabled for priority 3 on uplink eth1 of host B (PFC priorities none, reported by the kernel)"}, nil}},
		{"nothing known", pg80, records.NICState{}, records.NICState{},
			want{Unknown, []string{"the PFC of uplink eth1 of host B is neither reported by its host's kernel nor declared", "global pause"},
				[]string{"vrdmactl host uplink declare B eth1 --pfc PRIORITIES --pause rx,tx|off"}}},
		{"kernel cannot say", pg80, records.NICState{}, records.NICState{Unknown: map[string]string{records.FieldPFC: "RTM_GETDCB: operation not supported"}},
			want{Unknown, []string{"the kernel cannot report the PFC of uplink eth1 of host B (RTM_GETDCB: operation not supported), and none is declared"}, nil}},
		{"PFC off, pause unknown", pg80, records.NICState{PFC: ptr(records.PrioritySet(0))}, records.NICState{},
			want{Unknown, []string{"PFC not enabled for priority 3", "global pause of uplink eth1 of host B is neither"}, []string{"--pause rx,tx|off"}}},
	}
	for _, tt := range tests {
		e := endOf("B", "192.0.2.2", tt.decl, tt.observed)
		check(t, tt.name, l2Lossless(dvs1, tt.pg, e, viewOf(e.Uplink)), tt.w)
	}
}

func TestNetworkCheckVLANPFC(t *testing.T) {
	v1 := func(p *records.PortGroup) { p.RoCEVersion = records.RoCEv1 }
	tests := []struct {
		name string
		pg   records.PortGroup
		decl records.NICState
		w    want
	}{
		{"VLAN 1", pgWith(func(p *records.PortGroup) { p.VLAN = 1 }), lossless, want{Pass, []string{"VLAN 1 of port group dvportgroup-80 has PFC on priority 3"}, nil}},
		{"VLAN 4094", pgWith(func(p *records.PortGroup) { p.VLAN = 4094 }), lossless, want{Pass, []string{"VLAN 4094"}, nil}},
		{"untagged", pgWith(func(p *records.PortGroup) { p.VLAN = 0 }), lossless,
			want{Fail, []string{"port group dvportgroup-80 is untagged (VLAN 0)"}, []string{"vrdmactl portgroup set dvportgroup-80 --vlan N"}}},
		{"PFC elsewhere", pg80, declared(func(s *records.NICState) { s.PFC = ptr(records.PrioritiesOf(2, 4)) }),
			want{Fail, []string{"PFC not enabled for priority 3 on uplink eth1 of host B, in VLAN 100", "PFC priorities 2,4"}, []string{"prio-pfc 3:on"}}},
		{"PFC unknown", pg80, records.NICState{},
			want{Unknown, []string{"PFC of uplink eth1 of host B"}, []string{"vrdmactl host uplink declare B eth1 --pfc 3"}}},
		{"pause alone is not PFC", pg80, declared(func(s *records.NICState) {
			s.PFC = ptr(records.PrioritySet(0))
			s.Pause = &records.Pause{RX: true, TX: true}
		}),
			want{Fail, []string{"PFC not enabled for priority 3"}, nil}},
		{"v1 with DSCP trust", pgWith(v1), declared(func(s *records.NICState) { s.Trust = records.TrustDSCP }),
			want{Fail, []string{"trusts DSCP (declared), but RoCE v1 frames have no IP header"}, []string{"order pcp", "--trust pcp"}}},
		{"v1 with PCP trust", pgWith(v1), declared(func(s *records.NICState) { s.Trust = records.TrustPCP }), want{Pass, nil, nil}},
		{"v2 with DSCP trust", pg80, declared(func(s *records.NICState) { s.Trust = records.TrustDSCP }), want{Pass, []string{"must map DSCP 26 to priority 3"}, nil}},
	}
	for _, tt := range tests {
		e := endOf("B", "192.0.2.2", tt.decl, records.NICState{})
		check(t, tt.name, vlanPFC(dvs1, tt.pg, e, viewOf(e.Uplink)), tt.w)
	}
}

func TestNetworkCheckNoTeaming(t *testing.T) {
	two := func(e End) End {
		e.Host.Uplinks = append(e.Host.Uplinks, records.Uplink{Kind: records.UplinkHCA, Device: "eth2"})
		return e
	}
	failover := swWith(func(s *records.Switch) { s.UplinkPolicy = records.UplinkFailover })
	tests := []struct {
		name string
		sw   records.Switch
		e    End
		w    want
	}{
		{"not teamed", dvs1, endOf("B", "192.0.2.2", lossless, records.NICState{}), want{Pass, []string{"uplink eth1 of host B is not teamed (declared)"}, nil}},
		{"reported not teamed", dvs1, endOf("B", "192.0.2.2", records.NICState{}, records.NICState{Teamed: ptr(false)}), want{Pass, []string{"reported by the kernel"}, nil}},
		{"bonded", dvs1, endOf("B", "192.0.2.2", lossless, records.NICState{Teamed: ptr(true), Team: "bond0"}),
			want{Fail, []string{"uplink eth1 of host B is teamed in bond0 (reported by the kernel)"}, []string{"out of its bond or team"}}},
		{"declared teamed", dvs1, endOf("B", "192.0.2.2", declared(func(s *records.NICState) { s.Teamed = ptr(true) }), records.NICState{}),
			want{Fail, []string{"is teamed (declared)"}, nil}},
		{"not the only uplink", dvs1, endOf("B", "192.0.2.2", declared(func(s *records.NICState) { s.SoleUplink = ptr(false) }), records.NICState{}),
			want{Fail, []string{"is not host B's only uplink on switch dvs1 (declared)"}, []string{"remove host B's other uplinks"}}},
		{"the only uplink", dvs1, endOf("B", "192.0.2.2", declared(func(s *records.NICState) { s.SoleUplink = ptr(true) }), records.NICState{}), want{Pass, nil, nil}},
		{"unknown", dvs1, endOf("B", "192.0.2.2", records.NICState{}, records.NICState{}),
			want{Unknown, []string{"team membership of uplink eth1 of host B"}, []string{"--teamed no"}}},
		{"two RDMA uplinks, single", dvs1, two(endOf("B", "192.0.2.2", lossless, records.NICState{})),
			want{Fail, []string{"host B has 2 RDMA uplinks on switch dvs1, whose uplink policy is \"single\""}, []string{"failover"}}},
		{"two RDMA uplinks, failover", failover, two(endOf("B", "192.0.2.2", lossless, records.NICState{})), want{Pass, nil, nil}},
	}
	for _, tt := range tests {
		check(t, tt.name, noTeaming(tt.sw, tt.e, viewOf(tt.e.Uplink)), tt.w)
	}
}

func prefixes(ps ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func TestNetworkCheckL3Lossless(t *testing.T) {
	good := records.Router{Name: "r1", Subnets: prefixes("10.0.1.0/24", "10.0.2.0/24"), DSCPMap: []records.DSCPMapping{{Priority: 3, DSCP: 26}}, DSCPPreserved: true}
	with := func(r records.Router, f func(*records.Router)) records.Router { f(&r); return r }
	routers := func(rs ...records.Router) records.Switch {
		return swWith(func(s *records.Switch) { s.Routers = rs })
	}
	a, b := "10.0.1.1", "10.0.2.1"
	tests := []struct {
		name string
		sw   records.Switch
		pg   records.PortGroup
		a, b string
		w    want
	}{
		{"no routers", dvs1, pg80, a, b, want{Pass, []string{"one layer-2 segment (no router is declared between them)"}, nil}},
		{"same subnet", routers(good), pg80, "10.0.1.1", "10.0.1.2", want{Pass, []string{"both in subnet 10.0.1.0/24"}, nil}},
		{"one good hop", routers(good), pg80, a, b, want{Pass, []string{"router r1 between uplink eth1 of host A and uplink eth1 of host B keep priority 3 lossless"}, nil}},
		{"IPv4-mapped addresses", routers(good), pg80, "::ffff:10.0.1.1", "::ffff:10.0.2.1", want{Pass, []string{"router r1"}, nil}},
		{"map lacks the DSCP", routers(with(good, func(r *records.Router) { r.DSCPMap = []records.DSCPMapping{{Priority: 3, DSCP: 24}} })), pg80, a, b,
			want{Fail, []string{"router r1 does not map priority 3 to DSCP 26 (its map: 3:24), does not copy PCP"}, []string{"vrdmactl switch router set dvs1 r1 --dscp-map 3:26 --dscp-preserved on"}}},
		{"DSCP rewritten", routers(with(good, func(r *records.Router) { r.DSCPPreserved = false })), pg80, a, b,
			want{Fail, []string{"router r1 does not preserve DSCP, does not copy PCP"}, nil}},
		{"no map at all", routers(with(good, func(r *records.Router) { r.DSCPMap = nil })), pg80, a, b, want{Fail, []string{"(it maps none)"}, nil}},
		{"PCP copied, tagged", routers(with(good, func(r *records.Router) { r.DSCPMap, r.DSCPPreserved, r.PCPCopied = nil, false, true })), pg80, a, b, want{Pass, nil, nil}},
		{"PCP copied, untagged", routers(with(good, func(r *records.Router) { r.DSCPMap, r.DSCPPreserved, r.PCPCopied = nil, false, true })),
			pgWith(func(p *records.PortGroup) { p.VLAN = 0 }), a, b, want{Fail, []string{"copies PCP, but port group dvportgroup-80 is untagged"}, nil}},
		{"RoCE v1 across a router", routers(good), pgWith(func(p *records.PortGroup) { p.RoCEVersion = records.RoCEv1 }), a, b,
			want{Fail, []string{"RoCE v1 is not routable", "(subnet 10.0.1.0/24)", "(subnet 10.0.2.0/24) are joined by router r1"}, []string{"--roce-version v2"}}},
		{"RoCE v1 on one segment", routers(good), pgWith(func(p *records.PortGroup) { p.RoCEVersion = records.RoCEv1 }), "10.0.1.1", "10.0.1.9", want{Pass, nil, nil}},
		{"an address in no subnet", routers(good), pg80, a, "10.9.9.9",
			want{Unknown, []string{"10.9.9.9 is in no subnet of a declared router, while 10.0.1.1 is in 10.0.1.0/24"}, []string{"vrdmactl switch router set dvs1 NAME"}}},
		{"the other address in no subnet", routers(good), pg80, "10.9.9.9", b, want{Unknown, []string{"10.9.9.9 is in no subnet of a declared router, while 10.0.2.1 is in 10.0.2.0/24"}, nil}},
		{"no chain", routers(good, records.Router{Name: "r9", Subnets: prefixes("10.0.8.0/24", "10.0.9.0/24")}), pg80, a, "10.0.9.1",
			want{Unknown, []string{"no chain of declared routers joins subnets 10.0.1.0/24 and 10.0.9.0/24"}, nil}},
		{"two hops, second bad", routers(good, records.Router{Name: "r2", Subnets: prefixes("10.0.2.0/24", "10.0.3.0/24")}), pg80, a, "10.0.3.1",
			want{Fail, []string{"router r2 does not map priority 3"}, nil}},
		{"two good hops", routers(good, with(good, func(r *records.Router) { r.Name = "r2"; r.Subnets = prefixes("10.0.2.0/24", "10.0.3.0/24") })), pg80, a, "10.0.3.1",
			want{Pass, []string{"routers r1, r2 between"}, nil}},
		{"parallel routers, one bad", routers(good, with(good, func(r *records.Router) { r.Name = "r0"; r.DSCPPreserved = false })), pg80, a, b,
			want{Fail, []string{"router r0 does not preserve DSCP"}, nil}},
		{"a longer detour is not on the path", routers(good,
			records.Router{Name: "x1", Subnets: prefixes("10.0.1.0/24", "10.0.7.0/24")},
			records.Router{Name: "x2", Subnets: prefixes("10.0.7.0/24", "10.0.2.0/24")}), pg80, a, b,
			want{Pass, []string{"router r1 between"}, nil}},
		{"the most specific subnet", routers(good, records.Router{Name: "big", Subnets: prefixes("10.0.0.0/16", "172.16.0.0/12")}), pg80, a, b,
			want{Pass, []string{"router r1 between"}, nil}},
	}
	for _, tt := range tests {
		ea := endOf("A", tt.a, lossless, records.NICState{})
		eb := endOf("B", tt.b, lossless, records.NICState{})
		got := l3Lossless(tt.sw, tt.pg, ea, eb)
		check(t, tt.name, got, tt.w)
		if got.Subject != "hosts A and B" || len(got.Hosts) != 2 {
			t.Errorf("%s: subject %q, hosts %v", tt.name, got.Subject, got.Hosts)
		}
	}
}

func TestNetworkCheckMTU(t *testing.T) {
	for mtu, want := range map[int]int{0: 0, 351: 0, 352: 256, 1500: 1024, 2143: 1024, 2144: 2048, 4191: 2048, 4192: 4096, 9000: 4096, 65536: 4096} {
		if got := MaxRoCEMTU(mtu); got != want {
			t.Errorf("MaxRoCEMTU(%d) = %d, want %d", mtu, got, want)
		}
	}
	mtuOf := func(m int) records.NICState { return declared(func(s *records.NICState) { s.MTU = m }) }
	roce := func(m int) records.PortGroup { return pgWith(func(p *records.PortGroup) { p.RoCEMTU = m }) }
	sw1500 := swWith(func(s *records.Switch) { s.MTU = 1500 })
	routed := swWith(func(s *records.Switch) {
		s.Routers = []records.Router{{Name: "r1", Subnets: prefixes("10.0.1.0/24", "10.0.2.0/24"), MTU: 1500}}
	})
	tests := []struct {
		name       string
		sw         records.Switch
		pg         records.PortGroup
		mtuA, mtuB records.NICState
		b          string
		w          want
	}{
		{"4096 over 4192", dvs1, roce(4096), mtuOf(4192), mtuOf(9000), "10.0.1.2", want{Pass, []string{"path MTU 4192 (uplink eth1 of host A, declared) carries RoCE MTU 4096"}, nil}},
		{"4096 over 4191", dvs1, roce(4096), mtuOf(4191), mtuOf(9000), "10.0.1.2",
			want{Fail, []string{"path MTU 4191 (uplink eth1 of host A, declared) carries RoCE MTU 2048 at most, less than 4096, port group dvportgroup-80's RoCE MTU"},
				[]string{"to at least 4192", "--roce-mtu 2048"}}},
		{"the switch's MTU decides the default", dvs1, pg80, mtuOf(1500), mtuOf(9000), "10.0.1.2",
			want{Fail, []string{"less than 4096, the RoCE MTU of switch dvs1's MTU 9000"}, nil}},
		{"a small switch", sw1500, pg80, mtuOf(9000), mtuOf(9000), "10.0.1.2", want{Pass, []string{"path MTU 1500 (switch dvs1) carries RoCE MTU 1024, the RoCE MTU of switch dvs1's MTU 1500"}, nil}},
		{"unknown uplink MTUs are the switch's", sw1500, pg80, records.NICState{}, records.NICState{}, "10.0.1.2", want{Pass, []string{"switch dvs1"}, nil}},
		{"a router limits", routed, pg80, mtuOf(9000), mtuOf(9000), "10.0.2.2", want{Fail, []string{"path MTU 1500 (router r1, declared)"}, []string{"raise the MTU at router r1 to at least 4192"}}},
		{"a router off the path", routed, pg80, mtuOf(9000), mtuOf(9000), "10.0.1.2", want{Pass, nil, nil}},
		{"unknown uplink MTUs, a RoCE MTU given", dvs1, roce(1024), records.NICState{}, records.NICState{}, "10.0.1.2", want{Pass, nil, nil}},
	}
	for _, tt := range tests {
		ea := endOf("A", "10.0.1.1", tt.mtuA, records.NICState{})
		eb := endOf("B", tt.b, tt.mtuB, records.NICState{})
		check(t, tt.name, pathMTU(tt.sw, tt.pg, ea, eb), tt.w)
	}
	// The kernel's MTU wins over the declaration.
	ea := endOf("A", "10.0.1.1", mtuOf(9000), records.NICState{MTU: 1500})
	check(t, "reported beats declared", pathMTU(dvs1, roce(4096), ea, endOf("B", "10.0.1.2", lossless, records.NICState{})),
		want{Fail, []string{"path MTU 1500 (uplink eth1 of host A, reported by the kernel)"}, nil})
}

func TestNetworkCheckPair(t *testing.T) {
	a := endOf("A", "192.0.2.1", lossless, records.NICState{})
	b := endOf("B", "192.0.2.2", lossless, records.NICState{})
	rs := Pair(dvs1, pg80, a, b)
	if len(rs) != 8 || len(Failing(rs)) != 0 {
		t.Fatalf("Pair of lossless ends: %d results, failing %v", len(rs), Failing(rs))
	}
	var checks []string
	for _, r := range rs {
		checks = append(checks, r.Check)
	}
	if got := strings.Join(checks, " "); got != "roce-l2-lossless roce-vlan-pfc roce-no-teaming roce-l2-lossless roce-vlan-pfc roce-no-teaming roce-l3-lossless roce-mtu" {
		t.Errorf("Pair runs %s", got)
	}
	b.Uplink.Declared.PFC = ptr(records.PrioritySet(0))
	f := Failing(Pair(dvs1, pg80, a, b))
	if len(f) != 2 || f[0].Check != CheckL2Lossless || f[1].Check != CheckVLANPFC {
		t.Fatalf("failing: %v", f)
	}
	if s := f[0].String(); !strings.HasPrefix(s, "roce-l2-lossless failed: PFC not enabled for priority 3 on uplink eth1 of host B") {
		t.Errorf("String() = %q", s)
	}
	u := Uplink(dvs1, pg80, endOf("C", "192.0.2.3", records.NICState{}, records.NICState{}))[0]
	if s := u.String(); !strings.HasPrefix(s, "roce-l2-lossless unknown: ") || !strings.HasSuffix(s, ": declare what the NIC does: vrdmactl host uplink declare C eth1 --pfc PRIORITIES --pause rx,tx|off") {
		t.Errorf("unknown String() = %q", s)
	}
	if s := rs[0].String(); !strings.HasPrefix(s, "roce-l2-lossless passed: ") {
		t.Errorf("pass String() = %q", s)
	}
}

func TestNetworkCheckModel(t *testing.T) {
	a := endOf("A", "192.0.2.1", lossless, records.NICState{})
	b := endOf("B", "192.0.2.2", declared(func(s *records.NICState) { s.PFC = ptr(records.PrioritySet(0)) }), records.NICState{})
	none := records.Host{ID: "c-id", Name: "C", Switch: "dvs1", AgentVersion: "t", State: records.HostUp}
	other := endOf("D", "192.0.2.4", lossless, records.NICState{})
	other.Host.Switch = "dvs2"
	pg81 := pgWith(func(p *records.PortGroup) { p.Key = "dvportgroup-81" })
	pgOther := pgWith(func(p *records.PortGroup) { p.Key = "dvportgroup-90"; p.Switch = "dvs2" })
	dvs2 := swWith(func(s *records.Switch) { s.Name = "dvs2"; s.NetworkPolicy = records.NetworkWarn })
	rep := Check(Model{
		Switches:   []records.Switch{dvs2, dvs1},
		PortGroups: []records.PortGroup{pg81, pg80, pgOther},
		Hosts:      []records.Host{b.Host, none, a.Host, other.Host},
	})
	if len(rep.Switches) != 2 || rep.Switches[0].Switch != "dvs1" || rep.Switches[0].Policy != records.NetworkStrict || rep.Switches[1].Policy != records.NetworkWarn {
		t.Fatalf("switches: %+v", rep.Switches)
	}
	s1 := rep.Switches[0]
	// Two port groups × (2 hosts × 2 uplink checks + 1 pair × 2 path checks) + 2 no-teaming.
	if len(s1.Results) != 2*(4+2)+2 {
		t.Errorf("dvs1: %d results", len(s1.Results))
	}
	if s1.Results[0].PortGroup != "dvportgroup-80" || s1.Results[0].Hosts[0] != "A" {
		t.Errorf("first result %+v", s1.Results[0])
	}
	if len(s1.Notes) != 1 || !strings.Contains(s1.Notes[0], "host C has no RDMA uplink") {
		t.Errorf("notes %q", s1.Notes)
	}
	if n := rep.Count(); n[Fail] != 4 || n[Unknown] != 0 || rep.OK() {
		t.Errorf("count %v", n)
	}
	if len(rep.Switches[1].Notes) != 1 || !strings.Contains(rep.Switches[1].Notes[0], "fewer than two hosts") {
		t.Errorf("dvs2 notes %q", rep.Switches[1].Notes)
	}
	if r := Check(Model{Switches: []records.Switch{dvs1}}); !r.OK() || len(r.Switches[0].Notes) != 2 {
		t.Errorf("empty switch: %+v", r)
	}
}
