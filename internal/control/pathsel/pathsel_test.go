// SPDX-License-Identifier: Apache-2.0

package pathsel

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/control/records"
)

var (
	dvs1 = records.Switch{Name: "dvs1", UUID: "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d", MTU: 9000, UplinkPolicy: records.UplinkSingle}
	dvs2 = records.Switch{Name: "dvs2", UUID: "501d0b8e-8d95-4e2b-b25c-2f3aa61a9e1e", MTU: 1500, UplinkPolicy: records.UplinkSingle}
	// dvs1 with failover order for hosts with several uplinks.
	dvs1Failover = func() records.Switch { s := dvs1; s.UplinkPolicy = records.UplinkFailover; return s }()

	pg80   = pg("dvportgroup-80", "dvs1", 100, records.RoCEv2)
	pg81   = pg("dvportgroup-81", "dvs1", 100, records.RoCEv2) // same VLAN as pg80
	pg90   = pg("dvportgroup-90", "dvs1", 200, records.RoCEv2)
	pgV1   = pg("dvportgroup-70", "dvs1", 100, records.RoCEv1)
	pgDVS2 = pg("dvportgroup-5", "dvs2", 100, records.RoCEv2)
)

func pg(key, sw string, vlan int, v records.RoCEVersion) records.PortGroup {
	return records.PortGroup{Name: "pg-" + key, Key: key, Switch: sw, VLAN: vlan, PFCPriority: 3, DSCP: 26, RoCEVersion: v}
}

// uplink returns an uplink whose operator declares it lossless for
// priority 3 (see lossless), so that the network checks pass.
func uplink(kind records.UplinkKind, last byte) records.Uplink {
	a := netip.AddrFrom4([4]byte{192, 0, 2, last})
	return records.Uplink{Kind: kind, Device: "eth1", Address: a, GID: records.GIDOf(a), Declared: lossless()}
}

// lossless is a declaration that passes every network check of the
// fixtures' port groups: PFC on priority 3, no global pause, not teamed,
// MTU 9000.
func lossless() records.NICState {
	pfc, teamed := records.PrioritiesOf(3), false
	return records.NICState{PFC: &pfc, Pause: &records.Pause{}, Teamed: &teamed, MTU: 9000}
}

// host returns an up host on dvs1, with a PVRDMA address and the firewall
// rule enabled, and the given uplinks.
func host(id string, last byte, ups ...records.Uplink) records.Host {
	return records.Host{
		ID: id, Name: id,
		PVRDMAAddress:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, last}), 4792),
		FirewallPVRDMA: true,
		Uplinks:        ups,
		Switch:         "dvs1",
		AgentVersion:   "0.1.0",
		State:          records.HostUp,
	}
}

func with(h records.Host, f func(*records.Host)) records.Host { f(&h); return h }

var (
	hHCA   = host("h-hca", 1, uplink(records.UplinkHCA, 1))
	hSoft  = host("h-soft", 2, uplink(records.UplinkSoftRoCEv2, 2))
	hHCA2  = host("h-hca2", 3, uplink(records.UplinkHCA, 3))
	hNone  = host("h-none", 4)
	hNone2 = host("h-none2", 5)
	hTwo   = host("h-two", 6, uplink(records.UplinkHCA, 6), uplink(records.UplinkHCA, 7))
	hDown  = with(host("h-down", 8, uplink(records.UplinkHCA, 8)), func(h *records.Host) { h.State = records.HostDown })
	hMaint = with(host("h-maint", 9, uplink(records.UplinkHCA, 9)), func(h *records.Host) { h.State = records.HostMaintenance })
	hNoVmk = with(host("h-novmk", 10, uplink(records.UplinkHCA, 10)), func(h *records.Host) { h.PVRDMAAddress = netip.AddrPort{} })
	hNoFW  = with(host("h-nofw", 11, uplink(records.UplinkHCA, 11)), func(h *records.Host) { h.FirewallPVRDMA = false })
	hDVS2  = with(host("h-dvs2", 12, uplink(records.UplinkHCA, 12)), func(h *records.Host) { h.Switch = "dvs2" })
	hNoSw  = with(host("h-nosw", 13), func(h *records.Host) { h.Switch = "" })
	hSoft1 = with(host("h-soft1", 14, uplink(records.UplinkSoftRoCEv2, 14)), func(h *records.Host) { h.Uplinks[0].MAC = "02:00:00:00:00:0e" })
)

func end(name string, h records.Host, p records.PortGroup) End {
	return End{Name: name, Host: h, PortGroup: p}
}

type rej struct {
	path Path
	why  string // substring
}

func TestPathSelect(t *testing.T) {
	tests := []struct {
		name     string
		sw       records.Switch
		a, b     End
		path     Path
		err      error    // errors.Is target
		reason   []string // substrings of Reason, or of the error
		rejected []rej    // exactly these paths, in order, each Why containing why
	}{
		{
			name: "same host with RDMA uplink: memcpy",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hHCA, pg80),
			path: Memcpy, reason: []string{"same host h-hca", "memcpy"},
			rejected: []rej{{RDMA, "same host: memcpy"}, {TCP, "same host: memcpy"}},
		},
		{
			name: "same host without uplink: memcpy",
			sw:   dvs1, a: end("vm1/vrdma0", hNone, pg80), b: end("vm2/vrdma1", hNone, pg80),
			path: Memcpy, reason: []string{"same host h-none"},
			rejected: []rej{{RDMA, "same host: memcpy"}, {TCP, "same host: memcpy"}},
		},
		{
			name: "same host, two port groups of one VLAN: memcpy",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hHCA, pg81),
			path: Memcpy, rejected: []rej{{RDMA, "same host: memcpy"}, {TCP, "same host: memcpy"}},
		},
		{
			name: "same VM, two adapters: memcpy",
			sw:   dvs1, a: end("vm1/vrdma0", hSoft, pg80), b: end("vm1/vrdma1", hSoft, pg80),
			path: Memcpy, rejected: []rej{{RDMA, "same host: memcpy"}, {TCP, "same host: memcpy"}},
		},
		{
			name: "different hosts, both with uplinks: rdma",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hSoft, pg80),
			path: RDMA, reason: []string{"h-hca and h-soft both have an RDMA uplink on switch dvs1", "hca 192.0.2.1", "rocev2-soft 192.0.2.2", "RoCE v2", "network checks passed"},
			rejected: []rej{{Memcpy, "different hosts h-hca and h-soft"}, {TCP, "rdma available"}},
		},
		{
			name: "different hosts, one without uplink: tcp",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hNone, pg80),
			path: TCP, reason: []string{"host h-none has no RDMA uplink on switch dvs1", "198.51.100.1:4792", "198.51.100.4:4792"},
			rejected: []rej{{Memcpy, "different hosts"}, {RDMA, "host h-none has no RDMA uplink on switch dvs1"}},
		},
		{
			name: "different hosts, neither with uplink: tcp names both",
			sw:   dvs1, a: end("vm1/vrdma0", hNone, pg80), b: end("vm2/vrdma0", hNone2, pg81),
			path:     TCP,
			rejected: []rej{{Memcpy, "different hosts"}, {RDMA, "host h-none has no RDMA uplink on switch dvs1; host h-none2 has no RDMA uplink on switch dvs1"}},
		},
		{
			name: "different switches: error names both",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hDVS2, pgDVS2),
			err:    ErrDifferentSwitch,
			reason: []string{"vm1/vrdma0", "vm2/vrdma0", "on switch dvs1", "on switch dvs2", "they must be on the same distributed switch"},
		},
		{
			name: "different VLANs: isolation names port groups and VLANs",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hHCA2, pg90),
			err:    ErrVLANIsolation,
			reason: []string{"port group dvportgroup-80 (VLAN 100)", "port group dvportgroup-90 (VLAN 200)"},
		},
		{
			name: "different VLANs on the same host: still isolated",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hHCA, pg90),
			err: ErrVLANIsolation, reason: []string{"VLAN 100", "VLAN 200"},
		},
		{
			name: "peer host down: no new connection",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hDown, pg80),
			err: ErrHostDown, reason: []string{"host h-down is down", "no new connections"},
		},
		{
			name: "same host down: no new connection",
			sw:   dvs1, a: end("vm1/vrdma0", hDown, pg80), b: end("vm2/vrdma0", hDown, pg80),
			err: ErrHostDown, reason: []string{"host h-down is down"},
		},
		{
			name: "host in maintenance: no new connection",
			sw:   dvs1, a: end("vm1/vrdma0", hMaint, pg80), b: end("vm2/vrdma0", hHCA, pg80),
			err: ErrHostDown, reason: []string{"host h-maint is maintenance"},
		},
		{
			name: "host on another switch",
			sw:   dvs1, a: end("vm1/vrdma0", hDVS2, pg80), b: end("vm2/vrdma0", hHCA, pg80),
			err: ErrNotOnSwitch, reason: []string{"host h-dvs2 is on switch dvs2, not on dvs1"},
		},
		{
			name: "host on no switch",
			sw:   dvs1, a: end("vm1/vrdma0", hNoSw, pg80), b: end("vm2/vrdma0", hNoSw, pg80),
			err: ErrNotOnSwitch, reason: []string{"host h-nosw is on no distributed switch"},
		},
		{
			name: "two uplinks under policy single: no teaming, tcp",
			sw:   dvs1, a: end("vm1/vrdma0", hTwo, pg80), b: end("vm2/vrdma0", hHCA, pg80),
			path:     TCP,
			rejected: []rej{{Memcpy, "different hosts"}, {RDMA, "host h-two has 2 RDMA uplinks on switch dvs1"}},
		},
		{
			name: "two uplinks under policy failover: rdma on the first",
			sw:   dvs1Failover, a: end("vm1/vrdma0", hTwo, pg80), b: end("vm2/vrdma0", hHCA, pg80),
			path: RDMA, reason: []string{"hca 192.0.2.6"},
			rejected: []rej{{Memcpy, "different hosts"}, {TCP, "rdma available"}},
		},
		{
			name: "software RoCEv2 uplink on a RoCE v1 port group: tcp",
			sw:   dvs1, a: end("vm1/vrdma0", hSoft, pgV1), b: end("vm2/vrdma0", hHCA, pgV1),
			path:     TCP,
			rejected: []rej{{Memcpy, "different hosts"}, {RDMA, "rocev2-soft, which cannot carry RoCE v1 (its agent publishes no MAC"}},
		},
		{
			name: "software uplink with a published MAC on a RoCE v1 port group: rdma",
			sw:   dvs1, a: end("vm1/vrdma0", hSoft1, pgV1), b: end("vm2/vrdma0", hHCA, pgV1),
			path: RDMA, reason: []string{"RoCE v1"},
			rejected: []rej{{Memcpy, "different hosts"}, {TCP, "rdma available"}},
		},
		{
			name: "HCAs on a RoCE v1 port group: rdma",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pgV1), b: end("vm2/vrdma0", hHCA2, pgV1),
			path: RDMA, reason: []string{"RoCE v1"},
			rejected: []rej{{Memcpy, "different hosts"}, {TCP, "rdma available"}},
		},
		{
			name: "port groups of one VLAN with different RoCE versions: tcp",
			sw:   dvs1, a: end("vm1/vrdma0", hHCA, pgV1), b: end("vm2/vrdma0", hHCA2, pg80),
			path:     TCP,
			rejected: []rej{{Memcpy, "different hosts"}, {RDMA, "is RoCE v1 and dvportgroup-80 is RoCE v2"}},
		},
		{
			name: "no PVRDMA address on one host: no path",
			sw:   dvs1, a: end("vm1/vrdma0", hNoVmk, pg80), b: end("vm2/vrdma0", hHCA, pg80),
			err: ErrNoPath, reason: []string{"host h-novmk has no PVRDMA address (Net.PVRDMAVmknic is not set; rule host-rdma-configured"},
			rejected: []rej{{Memcpy, "different hosts"}, {RDMA, "Net.PVRDMAVmknic"}, {TCP, "Net.PVRDMAVmknic"}},
		},
		{
			name: "pvrdma firewall ruleset disabled: no path",
			sw:   dvs1, a: end("vm1/vrdma0", hNoFW, pg80), b: end("vm2/vrdma0", hNone, pg80),
			err: ErrNoPath, reason: []string{"host h-nofw has the pvrdma firewall ruleset disabled"},
			rejected: []rej{{Memcpy, "different hosts"}, {RDMA, "firewall"}, {TCP, "firewall"}},
		},
		{
			name: "same host without PVRDMA address: memcpy needs none",
			sw:   dvs1, a: end("vm1/vrdma0", hNoVmk, pg80), b: end("vm2/vrdma0", hNoVmk, pg80),
			path: Memcpy, rejected: []rej{{RDMA, "same host: memcpy"}, {TCP, "same host: memcpy"}},
		},
		{
			name: "end without host ID",
			sw:   dvs1, a: end("vm1/vrdma0", records.Host{}, pg80), b: end("vm2/vrdma0", hHCA, pg80),
			err: ErrInput,
		},
		{
			name: "switch given is not the port groups' switch",
			sw:   dvs2, a: end("vm1/vrdma0", hHCA, pg80), b: end("vm2/vrdma0", hHCA2, pg80),
			err: ErrInput, reason: []string{"given switch dvs2"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Select(tt.sw, tt.a, tt.b)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Select = %v, %v; want error %v", d, err, tt.err)
				}
				if d.Path != "" {
					t.Errorf("failed Select chose %q", d.Path)
				}
				for _, s := range tt.reason {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not say %q", err, s)
					}
				}
			} else {
				if err != nil {
					t.Fatalf("Select: %v", err)
				}
				if d.Path != tt.path {
					t.Errorf("path = %s (%s); want %s", d.Path, d.Reason, tt.path)
				}
				for _, s := range tt.reason {
					if !strings.Contains(d.Reason, s) {
						t.Errorf("reason %q does not say %q", d.Reason, s)
					}
				}
			}
			if tt.rejected != nil || err == nil {
				if len(d.Rejected) != len(tt.rejected) {
					t.Fatalf("rejected = %+v; want %d entries %+v", d.Rejected, len(tt.rejected), tt.rejected)
				}
				for i, r := range tt.rejected {
					if d.Rejected[i].Path != r.path || !strings.Contains(d.Rejected[i].Why, r.why) {
						t.Errorf("rejected[%d] = %+v; want %s because of %q", i, d.Rejected[i], r.path, r.why)
					}
				}
			}
			// Every candidate is either chosen or rejected, once.
			if err == nil {
				seen := map[Path]int{d.Path: 1}
				for _, r := range d.Rejected {
					seen[r.Path]++
				}
				for _, p := range Candidates {
					if seen[p] != 1 {
						t.Errorf("candidate %s appears %d times in %+v", p, seen[p], d)
					}
				}
			}
			// Symmetric and deterministic: the other way round, and again,
			// gives the same answer in every field.
			checkSymmetric(t, tt.sw, tt.a, tt.b)
		})
	}
}

func checkSymmetric(t *testing.T, sw records.Switch, a, b End) {
	t.Helper()
	d1, err1 := Select(sw, a, b)
	d2, err2 := Select(sw, b, a)
	d3, err3 := Select(sw, a, b)
	if !reflect.DeepEqual(d1, d2) || errString(err1) != errString(err2) {
		t.Errorf("not symmetric:\n f(a,b) = %+v, %v\n f(b,a) = %+v, %v", d1, err1, d2, err2)
	}
	if !reflect.DeepEqual(d1, d3) || errString(err1) != errString(err3) {
		t.Errorf("not deterministic: %+v, %v then %+v, %v", d1, err1, d3, err3)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestPathSelectSymmetryExhaustive checks symmetry over every pair of ends
// built from the fixtures (hosts × port groups), on both switches and both
// uplink policies.
func TestPathSelectSymmetryExhaustive(t *testing.T) {
	hs := []records.Host{hHCA, hSoft, hHCA2, hNone, hNone2, hTwo, hDown, hMaint, hNoVmk, hNoFW, hDVS2, hNoSw}
	pgs := []records.PortGroup{pg80, pg81, pg90, pgV1, pgDVS2}
	var ends []End
	for _, h := range hs {
		for _, p := range pgs {
			ends = append(ends, end(fmt.Sprintf("vm-%s-%s/vrdma0", h.ID, p.Key), h, p))
		}
	}
	paths := map[Path]int{}
	for _, sw := range []records.Switch{dvs1, dvs1Failover, dvs2} {
		for i := range ends {
			for j := i; j < len(ends); j++ {
				d, _ := Select(sw, ends[i], ends[j])
				paths[d.Path]++
				d2, _ := Select(sw, ends[j], ends[i])
				if !reflect.DeepEqual(d, d2) {
					t.Fatalf("not symmetric for %s, %s on %s:\n%+v\n%+v", ends[i].Name, ends[j].Name, sw.Name, d, d2)
				}
			}
		}
	}
	for _, p := range append(Candidates[:], "") {
		if paths[p] == 0 {
			t.Errorf("no pair gave path %q: the fixtures do not cover it", p)
		}
	}
}

// TestPathSelectValues pins the path names: they must stay those of the
// agent's ABI (abi.PathMemcpy, abi.PathRDMA, abi.PathTCP).
func TestPathSelectValues(t *testing.T) {
	if Memcpy != "memcpy" || RDMA != "rdma" || TCP != "tcp" {
		t.Fatalf("path names changed: %q %q %q", Memcpy, RDMA, TCP)
	}
}

// TestPathSelectFixturesValid makes sure the fixtures are valid records,
// so that the table tests what a real store can hold.
func TestPathSelectFixturesValid(t *testing.T) {
	for _, r := range []records.Record{dvs1, dvs2, dvs1Failover, pg80, pg81, pg90, pgV1, pgDVS2,
		hHCA, hSoft, hHCA2, hNone, hNone2, hTwo, hDown, hMaint, hNoVmk, hNoFW, hDVS2, hNoSw} {
		if err := r.Validate(); err != nil {
			t.Errorf("%v", err)
		}
	}
}

func BenchmarkPathSelect(b *testing.B) {
	cases := []struct {
		name string
		a, b End
	}{
		{"memcpy", end("vm1/vrdma0", hHCA, pg80), end("vm2/vrdma0", hHCA, pg80)},
		{"rdma", end("vm1/vrdma0", hHCA, pg80), end("vm2/vrdma0", hSoft, pg80)},
		{"tcp", end("vm1/vrdma0", hHCA, pg80), end("vm2/vrdma0", hNone, pg80)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Select(dvs1, c.a, c.b); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
