// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/netcheck"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// exampleNetwork is the network file of docs/network.md.
const exampleNetwork = "../netcheck/netfile/testdata/network.yaml"

// losslessFile declares two hosts whose uplinks pass every check.
const losslessFile = `
switches: [{name: dvs1}]
portGroups: [{key: pg, vlan: 100, pfcPriority: 3, dscp: 26, roceVersion: v2}]
hosts:
  - {name: h1, uplinks: [{kind: hca, device: eth1, address: 10.0.1.1, declared: {pfc: [3], teamed: no}}]}
  - {name: h2, uplinks: [{kind: hca, device: eth1, address: 10.0.1.2, declared: {pfc: [3, 4], pause: {rx: true, tx: true}, teamed: no}}]}
`

func wantRun(t *testing.T, stdin string, code int, says []string, args ...string) string {
	t.Helper()
	out, errs, got := run(t, stdin, args...)
	if got != code {
		t.Errorf("vrdmactl %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), got, code, out, errs)
	}
	for _, s := range says {
		if !strings.Contains(out+errs, s) {
			t.Errorf("vrdmactl %s: output does not say %q\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), s, out, errs)
		}
	}
	return out
}

// TestNetworkCheckConfigFile checks networks declared in files: the
// example of docs/network.md fails with fixes, a lossless one passes, and
// bad input exits 2.
func TestNetworkCheckConfigFile(t *testing.T) {
	isolate(t)
	wantRun(t, "", exitFailure, []string{
		"switch dvs1 (network policy strict)",
		"PASS    roce-l2-lossless: port group dvportgroup-80, uplink eth1 of host esx1: PFC on priority 3 on uplink eth1 of host esx1 (declared)",
		"FAIL    roce-l2-lossless: port group dvportgroup-80, uplink eth1 of host esx2: PFC not enabled for priority 3 on uplink eth1 of host esx2",
		"fix: enable PFC on priority 3 (dcb pfc set dev eth1 prio-pfc 3:on)",
		"FAIL    roce-mtu: port group dvportgroup-80, hosts esx1 and esx3: path MTU 1500 (uplink ens5 of host esx3, declared)",
		"PASS    roce-l3-lossless: port group dvportgroup-80, hosts esx1 and esx3: router spine1",
		"network check: ",
	}, "network", "check", "--config", exampleNetwork)

	out, _, code := run(t, "", "-o", "json", "network", "check", "--config", exampleNetwork)
	var rep networkReport
	if err := unmarshalPrinted([]byte(out), &rep); err != nil || code != exitFailure {
		t.Fatalf("-o json: exit %d, %v\n%s", code, err, out)
	}
	if rep.OK || rep.Source != "file "+exampleNetwork || rep.Counts[netcheck.Fail] != 4 || rep.Counts[netcheck.Unknown] != 0 || len(rep.Switches) != 1 {
		t.Errorf("report: %+v", rep)
	}

	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(losslessFile), 0o644); err != nil {
		t.Fatal(err)
	}
	wantRun(t, "", exitOK, []string{"0 fail, 0 unknown"}, "network", "check", "--config", good)
	wantRun(t, losslessFile, exitOK, []string{"0 fail, 0 unknown"}, "network", "check", "--config", "-", "--switch", "dvs1")

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("switches: [{name: dvs1, mtu: 100000}]\nhosts: [{name: h, uplinks: [{kind: hca, address: 10.0.1.1, declared: {pfc: [8]}}]}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantRun(t, "", exitUsage, []string{"bad network file", "8 is not a priority 0–7"}, "network", "check", "--config", bad)
	wantRun(t, "", exitUsage, []string{"no such file"}, "network", "check", "--config", filepath.Join(dir, "missing.yaml"))
	wantRun(t, "", exitUsage, []string{"switch dvs9: not in the file"}, "network", "check", "--config", good, "--switch", "dvs9")
	wantRun(t, "", exitUsage, []string{"--config reads none"}, "network", "check", "--config", good, "--local-host", "h1")
	wantRun(t, "", exitUsage, []string{"name a subcommand"}, "network")
}

// startUplinkHost starts an in-process agent for host name with a
// software RoCEv2 uplink on lo at addr, declaring nothing of it.
func startUplinkHost(t *testing.T, ep, name, addr string) *testenv.Env {
	t.Helper()
	ip := netip.MustParseAddr(addr)
	port, err := freeHostPort(ip)
	if err != nil {
		t.Fatal(err)
	}
	u, err := agent.ParseUplink("rocev2-soft/" + addr + "@lo")
	if err != nil {
		t.Fatal(err)
	}
	return testenv.StartControl(t, name, agent.ControlConfig{Endpoints: []string{ep}, Switch: "dvs1", FirewallPVRDMA: true,
		PVRDMAAddress: netip.AddrPortFrom(ip, port), Uplinks: []records.Uplink{u}})
}

// TestNetworkCommandsControlPlane edits the network model with vrdmactl
// and checks the control plane's network, with the local host's kernel
// state: the loopback reports no DCB, so what is declared counts.
func TestNetworkCommandsControlPlane(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	a := startUplinkHost(t, ep, "esx1", "127.0.13.1")
	startUplinkHost(t, ep, "esx2", "127.0.13.2")
	fabric(t, ep)
	cp := []string{"--etcd-endpoints", ep}
	check := append(cp[:2:2], "network", "check", "--local-host", "none")

	// Nothing declared: unknown, and what to declare; the agents
	// published what their kernels report (lo: not teamed, no DCB).
	wantRun(t, "", exitFailure, []string{"UNKNOWN roce-l2-lossless: port group dvportgroup-10, uplink lo of host esx1",
		"fix: declare what the NIC does: vrdmactl host uplink declare esx1 lo --pfc PRIORITIES --pause rx,tx|off",
		"PASS    roce-no-teaming: uplink lo of host esx2: uplink lo of host esx2 is not teamed (reported by the kernel)",
		"PASS    roce-l3-lossless", "PASS    roce-mtu"}, check...)

	// The local host's kernel: lo has no DCB, and says so.
	out, _, code := run(t, "", append(cp, "--state-dir", a.StateDir, "-o", "json", "network", "check")...)
	var rep networkReport
	if err := unmarshalPrinted([]byte(out), &rep); err != nil || code != exitFailure {
		t.Fatalf("network check with the local kernel: exit %d, %v\n%s", code, err, out)
	}
	if rep.Local == nil || rep.Local.Host != "esx1" || len(rep.Local.Uplinks) != 1 || !strings.Contains(rep.Local.Uplinks[0].Unknown[records.FieldPFC], "(EOPNOTSUPP)") ||
		rep.Local.Uplinks[0].MTU != 65536 {
		t.Errorf("local NICs: %+v", rep.Local)
	}
	results := map[string]netcheck.Result{}
	for _, r := range rep.Switches[0].Results {
		results[r.Check+" "+r.PortGroup+" "+r.Subject] = r
	}
	if r := results["roce-l2-lossless dvportgroup-10 uplink lo of host esx1"]; r.Status != netcheck.Unknown ||
		!strings.Contains(r.Detail, "the kernel cannot report the PFC of uplink lo of host esx1 (RTM_GETDCB DCB_CMD_IEEE_GET for lo: operation not supported (EOPNOTSUPP)") {
		t.Errorf("esx1's roce-l2-lossless: %+v", r)
	}
	if r := results["roce-no-teaming  uplink lo of host esx1"]; r.Status != netcheck.Pass || !strings.Contains(r.Detail, "reported by the kernel") {
		t.Errorf("esx1's roce-no-teaming: %+v", r)
	}
	if r := results["roce-no-teaming  uplink lo of host esx2"]; r.Status != netcheck.Pass || !strings.Contains(r.Detail, "reported by the kernel") {
		t.Errorf("esx2's roce-no-teaming (its agent publishes what its kernel reports): %+v", r)
	}

	// Declared lossless, everything passes.
	for _, h := range []string{"esx1", "esx2"} {
		wantRun(t, "", exitOK, []string{"host " + h + " uplink lo declares: pfc 3, pause off, not teamed"},
			append(cp, "host", "uplink", "declare", h, "lo", "--pfc", "3", "--pause", "off", "--teamed", "no")...)
	}
	wantRun(t, "", exitOK, []string{"0 fail, 0 unknown"}, check...)
	wantRun(t, "", exitOK, []string{"declared: pfc 3, pause off, not teamed"}, append(cp, "host", "show", "esx1")...)
	wantRun(t, "", exitOK, []string{"pfc 3,4, pause off, trust dscp, mtu 9000, not teamed, sole uplink on"},
		append(cp, "host", "uplink", "declare", "esx1", "127.0.13.1", "--pfc", "3,4", "--trust", "dscp", "--mtu", "9000", "--sole-uplink", "yes")...)
	wantRun(t, "", exitOK, []string{"declares: pfc 3,4, pause off, not teamed"},
		append(cp, "host", "uplink", "declare", "esx1", "lo", "--trust", "unknown", "--mtu", "unknown", "--sole-uplink", "unknown")...)

	// A router between the two: l3 fails until it maps and preserves DSCP,
	// as the fix says.
	wantRun(t, "", exitOK, []string{"router r1: subnets 127.0.13.0/31 127.0.13.2/31, DSCP map -, DSCP preserved off"},
		append(cp, "switch", "router", "set", "dvs1", "r1", "--subnet", "127.0.13.0/31", "--subnet", "127.0.13.2/31")...)
	wantRun(t, "", exitFailure, []string{"FAIL    roce-l3-lossless: port group dvportgroup-10, hosts esx1 and esx2: between uplink lo of host esx1 and uplink lo of host esx2, router r1 does not map priority 3 to DSCP 26",
		"vrdmactl switch router set dvs1 r1 --dscp-map 3:26 --dscp-preserved on"}, check...)
	wantRun(t, "", exitOK, nil, append(cp, "switch", "router", "set", "dvs1", "r1", "--dscp-map", "3:26", "--dscp-preserved", "on", "--mtu", "9000")...)
	wantRun(t, "", exitOK, []string{"PASS    roce-l3-lossless: port group dvportgroup-10, hosts esx1 and esx2: router r1 between"}, check...)
	wantRun(t, "", exitOK, []string{"network policy: strict", "r1: subnets 127.0.13.0/31 127.0.13.2/31, DSCP map 3:26, DSCP preserved on, PCP copied off, MTU 9000"},
		append(cp, "switch", "show", "dvs1")...)
	wantRun(t, "", exitOK, []string{"router r1 removed"}, append(cp, "switch", "router", "remove", "dvs1", "r1")...)

	// Port group and switch edits.
	wantRun(t, "", exitOK, []string{"VLAN 0, PFC priority 3, DSCP 26, RoCE v2, RoCE MTU 4096"},
		append(cp, "portgroup", "set", "dvportgroup-10", "--vlan", "0", "--roce-mtu", "4096")...)
	wantRun(t, "", exitFailure, []string{"FAIL    roce-vlan-pfc: port group dvportgroup-10, uplink lo of host esx1: port group dvportgroup-10 is untagged (VLAN 0)",
		"vrdmactl portgroup set dvportgroup-10 --vlan N"}, check...)
	wantRun(t, "", exitOK, nil, append(cp, "portgroup", "set", "dvportgroup-10", "--vlan", "10")...)
	wantRun(t, "", exitOK, []string{"network policy warn"}, append(cp, "switch", "set", "dvs1", "--network-policy", "warn")...)
	wantRun(t, "", exitOK, []string{"switch dvs1 (network policy warn)", "0 fail"}, check...)

	// Bad input.
	for _, tc := range []struct {
		code int
		says string
		args []string
	}{
		{exitFailure, `no uplink "eth9" (its uplinks: lo)`, []string{"host", "uplink", "declare", "esx1", "eth9", "--pfc", "3"}},
		{exitFailure, "host nohost: not found", []string{"host", "uplink", "declare", "nohost", "lo", "--pfc", "3"}},
		{exitUsage, "--pfc", []string{"host", "uplink", "declare", "esx1", "lo", "--pfc", "9"}},
		{exitUsage, "is not an MTU", []string{"host", "uplink", "declare", "esx1", "lo", "--mtu", "12"}},
		{exitUsage, "want yes, no or unknown", []string{"host", "uplink", "declare", "esx1", "lo", "--teamed", "maybe"}},
		{exitUsage, "names a team, but teamed is not true", []string{"host", "uplink", "declare", "esx1", "lo", "--teamed", "no", "--team", "bond0"}},
		{exitUsage, "say what to declare", []string{"host", "uplink", "declare", "esx1", "lo"}},
		{exitUsage, `networkPolicy: "yolo"`, []string{"switch", "set", "dvs1", "--network-policy", "yolo"}},
		{exitUsage, "say what to change", []string{"switch", "set", "dvs1"}},
		{exitFailure, "switch dvs9: not found", []string{"switch", "set", "dvs9", "--mtu", "1500"}},
		{exitUsage, "router r9 is new", []string{"switch", "router", "set", "dvs1", "r9", "--dscp-map", "3:26"}},
		{exitUsage, "a router joins at least two", []string{"switch", "router", "set", "dvs1", "r9", "--subnet", "10.0.0.0/24"}},
		{exitUsage, "want a subnet", []string{"switch", "router", "set", "dvs1", "r9", "--subnet", "10.0.0.0"}},
		{exitUsage, "PRIORITY:DSCP", []string{"switch", "router", "set", "dvs1", "r9", "--subnet", "10.0.0.0/24", "--dscp-map", "26"}},
		{exitFailure, "has no router nope", []string{"switch", "router", "remove", "dvs1", "nope"}},
		{exitUsage, "roceMtu: 1500 is not a RoCE MTU", []string{"portgroup", "set", "dvportgroup-10", "--roce-mtu", "1500"}},
		{exitFailure, "port group nope: not found", []string{"portgroup", "set", "nope", "--vlan", "1"}},
		{exitUsage, "switch dvs9: not in the control plane", []string{"network", "check", "--switch", "dvs9"}},
		{exitUsage, "host nohost: not found", []string{"network", "check", "--local-host", "nohost"}},
	} {
		wantRun(t, "", tc.code, []string{tc.says}, append(cp, tc.args...)...)
	}
}

// TestNetworkAgentDecisionFlips: running agents decide a pair's path from
// the network checks as the control plane's declarations change: rdma
// while both loopback uplinks are declared lossless (refused for now:
// the rdma path does not exist yet, and the refusal carries the
// decision), tcp with the failing check in the QP's path reason once one
// declares PFC off, and rdma again when it declares PFC on.
func TestNetworkAgentDecisionFlips(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	a := startUplinkHost(t, ep, "esx1", "127.0.14.1")
	b := startUplinkHost(t, ep, "esx2", "127.0.14.2")
	fabric(t, ep)
	cp := []string{"--etcd-endpoints", ep}
	for _, h := range []string{"esx1", "esx2"} {
		runOK(t, append(cp, "host", "uplink", "declare", h, "lo", "--pfc", "3", "--pause", "off", "--teamed", "no")...)
	}
	vm1 := a.OpenVMX(t, "vm1", vmxOn("dvportgroup-10"))
	vm2 := b.OpenVMX(t, "vm2", vmxOn("dvportgroup-10"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	port := 100
	// connect tries until the agent's decision is path, with reason in it.
	connect := func(path vrdma.PathKind, reason string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			port++
			p, err := perf.Connect(ctx, adapter0(t, vm1), adapter0(t, vm2), perf.PairConfig{Port: uint16(port)})
			var got string
			switch {
			case err == nil:
				qp := p.A.QP.Path()
				got = string(qp.Path) + ": " + qp.Reason
				ok := qp.Path == path && strings.Contains(qp.Reason, reason)
				if ok {
					for _, r := range p.CheckOpcodes(ctx) {
						if r.Err != nil {
							t.Errorf("over %s, %s: %v", qp.Path, r.Opcode, r.Err)
						}
					}
				}
				p.Close(ctx)
				if ok {
					t.Logf("connected over %s", got)
					return
				}
			case path == vrdma.PathRDMA && strings.Contains(err.Error(), "path not available yet") &&
				strings.Contains(err.Error(), "decision: rdma") && strings.Contains(err.Error(), reason):
				t.Logf("refused with the decision: %v", err)
				return
			default:
				got = err.Error()
			}
			if time.Now().After(deadline) {
				t.Fatalf("the agent does not decide %s (%q): %s", path, reason, got)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	connect(vrdma.PathRDMA, "network checks passed")
	runOK(t, append(cp, "host", "uplink", "declare", "esx2", "lo", "--pfc", "none")...)
	connect(vrdma.PathTCP, "rdma rejected: roce-l2-lossless failed: PFC not enabled for priority 3 on uplink lo of host esx2")
	wantRun(t, "", exitOK, []string{"tcp", "rdma rejected: roce-l2-lossless failed"}, append(cp, "path", "explain", "vm1/vrdma0", "vm2/vrdma0")...)
	runOK(t, append(cp, "host", "uplink", "declare", "esx2", "lo", "--pfc", "3")...)
	connect(vrdma.PathRDMA, "network checks passed")
	// Policy warn keeps rdma with the failure as a warning; off skips the checks.
	runOK(t, append(cp, "host", "uplink", "declare", "esx2", "lo", "--pfc", "none")...)
	runOK(t, append(cp, "switch", "set", "dvs1", "--network-policy", "warn")...)
	connect(vrdma.PathRDMA, "network policy warn on switch dvs1: roce-l2-lossless failed")
	wantRun(t, "", exitOK, []string{"warning: roce-l2-lossless failed: PFC not enabled for priority 3 on uplink lo of host esx2"},
		append(cp, "path", "explain", "vm1/vrdma0", "vm2/vrdma0")...)
	runOK(t, append(cp, "switch", "set", "dvs1", "--network-policy", "off")...)
	connect(vrdma.PathRDMA, "network checks off on switch dvs1")
}
