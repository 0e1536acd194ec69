// SPDX-License-Identifier: Apache-2.0

package pathsel

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/records"
)

// declare returns h with its first uplink's declaration changed by f.
func declare(h records.Host, f func(*records.NICState)) records.Host {
	h.Uplinks = append([]records.Uplink(nil), h.Uplinks...)
	f(&h.Uplinks[0].Declared)
	return h
}

func policy(p records.NetworkPolicy) records.Switch { s := dvs1; s.NetworkPolicy = p; return s }

// TestNetworkPathSelectFlips: a pair's decision goes from rdma to tcp and
// back as the PFC declaration of one host's uplink changes, with the
// failing check in the reason.
func TestNetworkPathSelectFlips(t *testing.T) {
	a := end("vm1/vrdma0", hHCA, pg80)
	steps := []struct {
		name   string
		pfc    *records.PrioritySet // b's declared PFC
		path   Path
		reason []string
	}{
		{"PFC on priority 3", ptr(records.PrioritiesOf(3)), RDMA, []string{"network checks passed"}},
		{"PFC off", ptr(records.PrioritySet(0)), TCP, []string{
			"rdma rejected: roce-l2-lossless failed: PFC not enabled for priority 3 on uplink eth1 of host h-hca2",
			"roce-vlan-pfc failed: PFC not enabled for priority 3 on uplink eth1 of host h-hca2, in VLAN 100",
			": TCP between 198.51.100.1:4792 and 198.51.100.3:4792"}},
		{"PFC on the wrong priority", ptr(records.PrioritiesOf(4)), TCP, []string{"PFC priorities 4"}},
		{"PFC not declared", nil, TCP, []string{"roce-l2-lossless unknown: the PFC of uplink eth1 of host h-hca2 is neither reported by its host's kernel nor declared",
			"vrdmactl host uplink declare h-hca2 eth1 --pfc"}},
		{"PFC on again", ptr(records.PrioritiesOf(3, 4)), RDMA, []string{"network checks passed"}},
	}
	for _, s := range steps {
		b := end("vm2/vrdma0", declare(hHCA2, func(n *records.NICState) { n.PFC = s.pfc }), pg80)
		d, err := Select(dvs1, a, b)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if d.Path != s.path {
			t.Errorf("%s: %s (%s); want %s", s.name, d.Path, d.Reason, s.path)
		}
		for _, w := range s.reason {
			if !strings.Contains(d.Reason, w) {
				t.Errorf("%s: reason %q does not say %q", s.name, d.Reason, w)
			}
		}
		if d.Path == TCP && (d.Rejected[1].Path != RDMA || !strings.HasPrefix(d.Rejected[1].Why, "rdma rejected: roce-")) {
			t.Errorf("%s: rejected %+v", s.name, d.Rejected)
		}
		checkSymmetric(t, dvs1, a, b)
	}
}

func ptr[T any](v T) *T { return &v }

func TestNetworkPathSelectPolicy(t *testing.T) {
	a := end("vm1/vrdma0", hHCA, pg80)
	bad := end("vm2/vrdma0", declare(hHCA2, func(n *records.NICState) { n.PFC = ptr(records.PrioritySet(0)) }), pg80)
	unknown := end("vm2/vrdma0", declare(hHCA2, func(n *records.NICState) { *n = records.NICState{} }), pg80)
	tests := []struct {
		name     string
		sw       records.Switch
		b        End
		path     Path
		reason   []string
		warnings int
	}{
		{"strict is the default", policy(""), bad, TCP, []string{"rdma rejected: roce-l2-lossless failed"}, 0},
		{"strict", policy(records.NetworkStrict), bad, TCP, []string{"rdma rejected"}, 0},
		{"strict, unknown state", policy(records.NetworkStrict), unknown, TCP, []string{"roce-l2-lossless unknown", "roce-no-teaming unknown", "--teamed no"}, 0},
		{"warn keeps rdma", policy(records.NetworkWarn), bad, RDMA, []string{"network policy warn on switch dvs1: roce-l2-lossless failed: PFC not enabled for priority 3"}, 2},
		{"warn, unknown state", policy(records.NetworkWarn), unknown, RDMA, []string{"roce-no-teaming unknown"}, 3},
		{"warn, all well", policy(records.NetworkWarn), end("vm2/vrdma0", hHCA2, pg80), RDMA, []string{"network checks passed"}, 0},
		{"off", policy(records.NetworkOff), unknown, RDMA, []string{"network checks off on switch dvs1"}, 0},
	}
	for _, tt := range tests {
		d, err := Select(tt.sw, a, tt.b)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if d.Path != tt.path || len(d.Warnings) != tt.warnings {
			t.Errorf("%s: %s (%s), warnings %q; want %s with %d warnings", tt.name, d.Path, d.Reason, d.Warnings, tt.path, tt.warnings)
		}
		for _, w := range tt.reason {
			if !strings.Contains(d.Reason, w) {
				t.Errorf("%s: reason %q does not say %q", tt.name, d.Reason, w)
			}
		}
		checkSymmetric(t, tt.sw, a, tt.b)
	}
}

func TestNetworkPathSelectState(t *testing.T) {
	a := end("vm1/vrdma0", hHCA, pg80)
	// The kernel's report wins over the operator's declaration.
	observed := hHCA2
	observed.Uplinks = []records.Uplink{uplink(records.UplinkHCA, 3)}
	observed.Uplinks[0].Observed = records.NICState{PFC: ptr(records.PrioritySet(0)), Pause: &records.Pause{}}
	d, _ := Select(dvs1, a, end("vm2/vrdma0", observed, pg80))
	if d.Path != TCP || !strings.Contains(d.Reason, "PFC priorities none, reported by the kernel") {
		t.Errorf("observed PFC off, declared on: %s (%s)", d.Path, d.Reason)
	}
	// Where the kernel cannot report, the declaration counts.
	observed.Uplinks[0].Observed = records.NICState{Unknown: map[string]string{records.FieldPFC: "RTM_GETDCB: operation not supported"}}
	if d, _ := Select(dvs1, a, end("vm2/vrdma0", observed, pg80)); d.Path != RDMA {
		t.Errorf("declared PFC, the kernel cannot say: %s (%s)", d.Path, d.Reason)
	}
	// A teamed uplink, an MTU too small for the RoCE MTU, a router that
	// rewrites DSCP: each rejects rdma.
	teamed := declare(hHCA2, func(n *records.NICState) { n.Teamed, n.Team = ptr(true), "bond0" })
	small := declare(hHCA2, func(n *records.NICState) { n.MTU = 1500 })
	routed := dvs1
	routed.Routers = []records.Router{{Name: "r1", Subnets: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/31"), netip.MustParsePrefix("192.0.2.2/31")}}}
	for _, tc := range []struct {
		name string
		sw   records.Switch
		b    records.Host
		says string
	}{
		{"teamed", dvs1, teamed, "roce-no-teaming failed: uplink eth1 of host h-hca2 is teamed in bond0 (declared)"},
		{"small MTU", dvs1, small, "roce-mtu failed: path MTU 1500 (uplink eth1 of host h-hca2, declared) carries RoCE MTU 1024 at most"},
		{"router", routed, hHCA2, "roce-l3-lossless failed: between uplink eth1 of host h-hca and uplink eth1 of host h-hca2, router r1 does not map priority 3 to DSCP 26"},
	} {
		d, err := Select(tc.sw, a, end("vm2/vrdma0", tc.b, pg80))
		if err != nil || d.Path != TCP || !strings.Contains(d.Reason, tc.says) {
			t.Errorf("%s: %s (%s), %v; want tcp because %q", tc.name, d.Path, d.Reason, err, tc.says)
		}
	}
	// Two port groups of one VLAN with different priorities: each end's
	// priority must be lossless on the path.
	pg81p4 := pg81
	pg81p4.PFCPriority = 4
	d, _ = Select(dvs1, a, end("vm2/vrdma0", hHCA2, pg81p4))
	if d.Path != TCP || !strings.Contains(d.Reason, "PFC not enabled for priority 4 on uplink eth1 of host h-hca,") {
		t.Errorf("priority 4 of the second port group: %s (%s)", d.Path, d.Reason)
	}
	both := func(h records.Host) records.Host {
		return declare(h, func(n *records.NICState) { n.PFC = ptr(records.PrioritiesOf(3, 4)) })
	}
	if d, _ := Select(dvs1, end("vm1/vrdma0", both(hHCA), pg80), end("vm2/vrdma0", both(hHCA2), pg81p4)); d.Path != RDMA {
		t.Errorf("both priorities lossless: %s (%s)", d.Path, d.Reason)
	}
}
