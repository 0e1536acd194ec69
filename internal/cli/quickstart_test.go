// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vrdma/vrdma/internal/perf"
)

func TestQuickstart(t *testing.T) {
	tmp := isolate(t)
	var rep quickstartReport
	runJSON(t, &rep, "quickstart", "-o", "json")
	t.Logf("%+v", rep)
	if !rep.OK || len(rep.Pairs) != 4 {
		t.Fatalf("report %+v", rep)
	}
	// The same-host pair: memcpy, as path selection decided it on the
	// switch and port group quickstart created.
	p := rep.Pairs[0]
	if !p.OK || p.A != "vm1/vrdma0" || p.B != "vm2/vrdma0" || p.HostA != "host1" || p.HostB != "host1" ||
		p.Path != "memcpy" || p.Want != "memcpy" || !strings.HasPrefix(p.Reason, "memcpy: ") {
		t.Errorf("pair %+v", p)
	}
	if rep.Switch != quickstartSwitch || rep.PortGroup != quickstartPortGroup || !strings.Contains(p.Reason, "same host host1") {
		t.Errorf("switch %q, port group %q, reason %q: want %s, %s and path selection's reason", rep.Switch, rep.PortGroup, p.Reason, quickstartSwitch, quickstartPortGroup)
	}
	// The pair across hosts: tcp between the two agents' loopback
	// addresses; neither host has an RDMA uplink.
	q := rep.Pairs[1]
	if !q.OK || q.A != "vm1/vrdma0" || q.B != "vm3/vrdma0" || q.HostA != "host1" || q.HostB != "host2" ||
		q.Path != "tcp" || q.Want != "tcp" || !strings.HasPrefix(q.Reason, "tcp: ") || !strings.Contains(q.Reason, "no RDMA uplink") {
		t.Errorf("pair %+v", q)
	}
	// The pair between the hosts with RDMA uplinks: rdma, through the
	// two agents' RoCEv2 engines.
	r := rep.Pairs[2]
	if !r.OK || r.A != "vm4/vrdma0" || r.B != "vm5/vrdma0" || r.HostA != "host3" || r.HostB != "host4" ||
		r.Path != "rdma" || r.Want != "rdma" || !strings.HasPrefix(r.Reason, "rdma: ") || !strings.Contains(r.Reason, "RDMA uplink") {
		t.Errorf("pair %+v", r)
	}
	// The same-host pair whose VMs list each other in vrdma.directPeers:
	// memcpy-direct, every opcode done by the libraries.
	d := rep.Pairs[3]
	if !d.OK || d.A != "vm6/vrdma0" || d.B != "vm7/vrdma0" || d.HostA != "host1" || d.HostB != "host1" ||
		d.Path != "memcpy-direct" || d.Want != "memcpy-direct" || !strings.HasPrefix(d.Reason, "memcpy-direct: ") || !strings.Contains(d.Reason, "vrdma.directPeers") {
		t.Errorf("pair %+v", d)
	}
	if len(rep.Hosts) != 4 {
		t.Fatalf("hosts %+v", rep.Hosts)
	}
	for i, h := range rep.Hosts {
		addr := fmt.Sprintf("127.0.0.%d:", 2+i)
		if h.Name != fmt.Sprintf("host%d", i+1) || h.PID <= 0 || h.Error != "" || !strings.HasPrefix(h.PVRDMAAddress, addr) {
			t.Errorf("host %d: %+v", i, h)
		}
		if rdma := h.RDMAUplink != ""; rdma != (i >= 2) || rdma && h.RDMAUplink != addr+"4791" {
			t.Errorf("host %d: RDMA uplink %q", i, h.RDMAUplink)
		}
	}
	for _, h := range rep.Hosts[:2] {
		if !strings.Contains(q.Reason, h.PVRDMAAddress) {
			t.Errorf("host %s: the tcp pair's reason %q lacks its address", h.Name, q.Reason)
		}
	}
	if h := rep.Hosts; h[0].ControlPlane != "embedded etcd" || !strings.HasPrefix(h[1].ControlPlane, "joined unix://") ||
		!slices.Equal(h[0].VMs, []string{"vm1", "vm2", "vm6", "vm7"}) || !slices.Equal(h[1].VMs, []string{"vm3"}) {
		t.Errorf("hosts %+v", h)
	}
	if rep.AgentPID != rep.Hosts[0].PID || rep.Host != "host1" {
		t.Errorf("agent pid %d host %q, hosts %+v", rep.AgentPID, rep.Host, rep.Hosts)
	}
	for _, p := range rep.Pairs {
		if len(p.Opcodes) != len(perf.Opcodes) {
			t.Errorf("%s → %s: %d opcodes, want %d: %v", p.A, p.B, len(p.Opcodes), len(perf.Opcodes), p.Opcodes)
		}
		for _, op := range perf.Opcodes {
			if p.Opcodes[op.String()] != "ok" {
				t.Errorf("%s → %s: %s: %q", p.A, p.B, op, p.Opcodes[op.String()])
			}
		}
		if p.BWMiBs <= 0 || p.LatUs <= 0 {
			t.Errorf("%s → %s: bandwidth %v MiB/s, latency %v µs", p.A, p.B, p.BWMiBs, p.LatUs)
		}
	}
	if !strings.Contains(rep.Agent, "vrdmactl agent") {
		t.Errorf("agent %q: want the re-executed vrdmactl", rep.Agent)
	}
	// Nothing is left: the agents have exited and their directories are
	// gone.
	for _, h := range rep.Hosts {
		if err := syscall.Kill(h.PID, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("host %s's agent pid %d still exists (kill 0: %v)", h.Name, h.PID, err)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("quickstart left %v in TMPDIR", left)
	}
}

func TestQuickstartText(t *testing.T) {
	isolate(t)
	out := runOK(t, "quickstart")
	for _, want := range []string{"PAIR", "HOSTS", "PATH", "vm1/vrdma0 → vm2/vrdma0  host1 → host1  memcpy         7/7 opcodes ok, ",
		"vm1/vrdma0 → vm3/vrdma0  host1 → host2  tcp            7/7 opcodes ok, ",
		"vm6/vrdma0 → vm7/vrdma0  host1 → host1  memcpy-direct  7/7 opcodes ok, ", "MiB/s", "µs",
		"starting host agent host2 on 127.0.0.3, joined to host1's control plane", "vm1, vm2, vm6 and vm7 on host1, vm3 on host2", "ok: every pair works"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestQuickstartNoAgent(t *testing.T) {
	isolate(t)
	t.Setenv(agentEnv, "/nonexistent/vrdmad")
	out, _, code := run(t, "", "quickstart")
	if code != exitFailure || !strings.Contains(out, "could not start a host agent") || !strings.Contains(out, "/nonexistent/vrdmad") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
}

// A second host that cannot start fails the tcp pair only: the memcpy pair
// still runs, and the report says why the other failed.
func TestQuickstartSecondHostFails(t *testing.T) {
	tmp := isolate(t)
	saved := quickstartHosts
	t.Cleanup(func() { quickstartHosts = saved })
	quickstartHosts = slices.Clone(saved)
	quickstartHosts[1].Addr = netip.MustParseAddrPort("192.0.2.1:0") // TEST-NET-1: not this machine's
	out, _, code := run(t, "", "quickstart")
	if code != exitFailure {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	for _, want := range []string{"vm1/vrdma0 → vm2/vrdma0  host1 → host1  memcpy         7/7 opcodes ok",
		"\nFAIL host host2: cannot listen on 192.0.2.1", "FAIL vm1/vrdma0 → vm3/vrdma0: vm3's host did not start: host host2: cannot listen", "FAILED ("} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("quickstart left %v in TMPDIR", left)
	}
}

func TestAndList(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{{nil, ""}, {[]string{"vm1"}, "vm1"}, {[]string{"vm1", "vm2"}, "vm1 and vm2"}, {[]string{"vm1", "vm2", "vm6"}, "vm1, vm2 and vm6"}} {
		if got := andList(c.in); got != c.want {
			t.Errorf("andList(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
