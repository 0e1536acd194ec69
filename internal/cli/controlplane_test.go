// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// Tests of the control plane wired into the agent and vrdmactl: agents
// with different host IDs (in this process) sharing one embedded etcd.

// hostCfg is the control-plane configuration of a test host on switch
// dvs1 at loopback address addr, with a software RoCEv2 uplink if rdma,
// declared lossless for priority 3 (see lossless).
func hostCfg(endpoint, addr string, rdma bool) agent.ControlConfig {
	c := agent.ControlConfig{Endpoints: []string{endpoint}, Switch: "dvs1", FirewallPVRDMA: true,
		PVRDMAAddress: netip.MustParseAddrPort(addr + ":4791")}
	if rdma {
		u, err := agent.ParseUplink("rocev2-soft/" + addr)
		if err != nil {
			panic(err)
		}
		u.Declared = lossless()
		c.Uplinks = []records.Uplink{u}
	}
	return c
}

// lossless declares what the network checks want of an uplink for the
// port groups of fabric (PFC priority 3): the loopback's declaration, as
// no kernel reports DCB for it.
func lossless() records.NICState {
	pfc, teamed := records.PrioritiesOf(3), false
	return records.NICState{PFC: &pfc, Pause: &records.Pause{}, Teamed: &teamed}
}

// fabric creates switch dvs1 with port groups dvportgroup-10 (VLAN 10)
// and dvportgroup-20 (VLAN 20, subnet 10.20.0.0/24) through vrdmactl.
func fabric(t *testing.T, endpoint string) {
	t.Helper()
	runOK(t, "--etcd-endpoints", endpoint, "switch", "create", "dvs1")
	runOK(t, "--etcd-endpoints", endpoint, "portgroup", "create", "dvportgroup-10", "--switch", "dvs1", "--vlan", "10")
	runOK(t, "--etcd-endpoints", endpoint, "portgroup", "create", "dvportgroup-20", "--switch", "dvs1", "--vlan", "20", "--roce-version", "v2", "--subnet", "10.20.0.0/24")
}

func vmxOn(pg string) string { return testenv.VMXOn(testenv.VMOptions{}, "dvs1", pg) }

func adapter0(t *testing.T, v *vrdma.VM) *vrdma.Adapter {
	t.Helper()
	ad, err := v.Adapter("vrdma0")
	if err != nil {
		t.Fatal(err)
	}
	return ad
}

func wantAbiErr(t *testing.T, what string, err error, code string, substrs ...string) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	var ae *vrdma.Error
	if !errors.As(err, &ae) {
		t.Fatalf("%s: got %v, want a %s error", what, err, code)
	}
	if ae.Code != code {
		t.Errorf("%s: code %s, want %s: %v", what, ae.Code, code, err)
	}
	for _, s := range substrs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %q does not say %q", what, err, s)
		}
	}
}

func TestControlPlaneHostsPathsAndCrossHostConnect(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	a := testenv.StartControl(t, "esx1", hostCfg(ep, "127.0.0.1", true))
	b := testenv.StartControl(t, "esx2", hostCfg(ep, "127.0.0.2", true))
	c := testenv.StartControl(t, "esx3", hostCfg(ep, "127.0.0.3", false))
	if a.Agent.HostID() == b.Agent.HostID() {
		t.Fatal("two agents share a host ID")
	}
	fabric(t, ep)

	// Every host is up.
	var hl struct{ Hosts []hostReport }
	runJSON(t, &hl, "--etcd-endpoints", ep, "-o", "json", "host", "list")
	up := map[string]hostReport{}
	for _, h := range hl.Hosts {
		if h.State == "up" {
			up[h.Name] = h
		}
	}
	for _, n := range []string{"esx1", "esx2", "esx3"} {
		if _, ok := up[n]; !ok {
			t.Errorf("host list: %s not up: %+v", n, hl.Hosts)
		}
	}
	if h := up["esx1"]; h.ID != a.Agent.HostID() || len(h.Uplinks) != 1 || h.Switch != "dvs1" || h.PVRDMAAddress != "127.0.0.1:4791" || h.LeaseAgeS <= 0 {
		t.Errorf("host list: esx1 is %+v", h)
	}
	if out := runOK(t, "--etcd-endpoints", ep, "host", "show", "esx2"); !strings.Contains(out, b.Agent.HostID()) || !strings.Contains(out, "rocev2-soft 127.0.0.2") {
		t.Errorf("host show esx2:\n%s", out)
	}

	vm1 := a.OpenVMX(t, "vm1", vmxOn("dvportgroup-10"))
	vm3 := a.OpenVMX(t, "vm3", vmxOn("dvportgroup-10"))
	vm2 := b.OpenVMX(t, "vm2", vmxOn("dvportgroup-10"))
	c.OpenVMX(t, "vm4", vmxOn("dvportgroup-10"))
	vm5 := a.OpenVMX(t, "vm5", vmxOn("dvportgroup-20"))

	// vm list --cluster and vm show see VMs of every host.
	var vl struct{ VMs []vmReport }
	runJSON(t, &vl, "--etcd-endpoints", ep, "-o", "json", "vm", "list", "--cluster")
	if len(vl.VMs) != 5 {
		t.Errorf("vm list --cluster: %d VMs, want 5: %+v", len(vl.VMs), vl.VMs)
	}
	var vs vmReport
	runJSON(t, &vs, "--etcd-endpoints", ep, "-o", "json", "vm", "show", "vm2")
	if vs.Host != b.Agent.HostID() || len(vs.Adapters) != 1 || vs.Adapters[0].PortGroup != "dvportgroup-10" || vs.Adapters[0].VLAN != 10 ||
		vs.Adapters[0].GID.String() != adapter0(t, vm2).GID().String() {
		t.Errorf("vm show vm2: %+v", vs)
	}
	// vm5's port group has a subnet: its adapter got an address from it.
	runJSON(t, &vs, "--etcd-endpoints", ep, "-o", "json", "vm", "show", "vm5")
	if ip := adapter0(t, vm5).IPv4(); len(vs.Adapters) != 1 || vs.Adapters[0].IPv4 != ip.String() || !strings.HasPrefix(ip.String(), "10.20.0.") {
		t.Errorf("vm show vm5: %+v, want the address vm5/vrdma0 has (%v) from 10.20.0.0/24", vs, ip)
	}
	if out := runOK(t, "--etcd-endpoints", ep, "vm", "show", "vm5"); !strings.Contains(out, "IPV4") || !strings.Contains(out, adapter0(t, vm5).IPv4().String()) {
		t.Errorf("vm show vm5 lacks its address:\n%s", out)
	}
	if out := runOK(t, "--etcd-endpoints", ep, "portgroup", "show", "dvportgroup-20"); !strings.Contains(out, "subnet:       10.20.0.0/24") {
		t.Errorf("portgroup show dvportgroup-20 lacks its subnet:\n%s", out)
	}

	// path explain, as path selection decides.
	for _, tc := range []struct {
		a, b string
		path string
	}{
		{"vm1/vrdma0", "vm3/vrdma0", "memcpy"},
		{"vm1/vrdma0", "vm2/vrdma0", "rdma"},
		{"vm1/vrdma0", "vm4/vrdma0", "tcp"},
		{adapter0(t, vm2).GID().String(), "vm1/vrdma0", "rdma"},
	} {
		var pr pathReport
		runJSON(t, &pr, "--etcd-endpoints", ep, "-o", "json", "path", "explain", tc.a, tc.b)
		if !pr.OK || string(pr.Path) != tc.path || pr.Reason == "" || len(pr.Rejected) != 2 {
			t.Errorf("path explain %s %s: %+v, want %s with 2 rejected candidates", tc.a, tc.b, pr, tc.path)
		}
		for _, r := range pr.Rejected {
			if r.Why == "" {
				t.Errorf("path explain %s %s: rejected %s without why", tc.a, tc.b, r.Path)
			}
		}
	}
	out, _, code := run(t, "", "--etcd-endpoints", ep, "path", "explain", "vm1/vrdma0", "vm5/vrdma0")
	if code != exitFailure || !strings.Contains(out, "VLAN") {
		t.Errorf("path explain across VLANs: exit %d\n%s", code, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Same host: memcpy, with path selection's reason.
	p, err := perf.Connect(ctx, adapter0(t, vm1), adapter0(t, vm3), perf.PairConfig{})
	if err != nil {
		t.Fatalf("connect vm1 → vm3 (same host): %v", err)
	}
	if path := p.A.QP.Path(); path.Path != vrdma.PathMemcpy || !strings.Contains(path.Reason, "same host") {
		t.Errorf("vm1 → vm3: path %+v", path)
	}
	for _, r := range p.CheckOpcodes(ctx) {
		if r.Err != nil {
			t.Errorf("vm1 → vm3 %s: %v", r.Opcode, r.Err)
		}
	}
	p.Close(ctx)

	// Another host, both with a software RoCEv2 uplink on the switch:
	// the rdma path, every opcode over the engines.
	p2, err := perf.Connect(ctx, adapter0(t, vm1), adapter0(t, vm2), perf.PairConfig{})
	if err != nil {
		t.Fatalf("connect vm1 → vm2 (other host): %v", err)
	}
	if path := p2.A.QP.Path(); path.Path != vrdma.PathRDMA || !strings.Contains(path.Reason, "RDMA uplink") || len(path.Rejected) == 0 {
		t.Errorf("vm1 → vm2: path %+v, want rdma with the reason and the rejected candidates", path)
	}
	for _, r := range p2.CheckOpcodes(ctx) {
		if r.Err != nil {
			t.Errorf("vm1 → vm2 %s: %v", r.Opcode, r.Err)
		}
	}
	p2.Close(ctx)
	_, err = perf.Connect(ctx, adapter0(t, vm1), adapter0(t, vm5), perf.PairConfig{})
	wantAbiErr(t, "connect vm1 → vm5 (other VLAN)", err, abi.CodeRefused, "VLAN")

	// An RTR modify with the GID of an adapter on another host.
	q := testenv.NewQP(t, adapter0(t, vm1))
	q4 := testenv.NewQP(t, adapter0(t, vm2))
	if err := q.ConnectTo(ctx, q4.Endpoint()); err != nil {
		t.Errorf("RTR facing vm2's GID: %v", err)
	} else if q.Path().Path != vrdma.PathRDMA {
		t.Errorf("RTR facing vm2's GID: path %+v, want rdma", q.Path())
	}

	// A GID nobody has.
	err = testenv.NewQP(t, adapter0(t, vm1)).ConnectTo(ctx, vrdma.Endpoint{GID: abi.GID{0xfe, 0x80, 15: 1}, QPN: 0x1234})
	wantAbiErr(t, "RTR facing an unknown GID", err, abi.CodeNotFound, "not attached on any host")

	// A VM that detaches leaves the control plane.
	vm2.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, code := run(t, "", "--etcd-endpoints", ep, "vm", "show", "vm2")
		if code != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("vm2 is still in the control plane after it detached")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestControlPlaneOutage(t *testing.T) {
	isolate(t)
	emb := etcdtest.Start(t)
	proxy := etcdtest.NewProxy(t, emb.ClientURL())
	a := testenv.StartControl(t, "esx1", hostCfg(proxy.URL(), "127.0.0.1", true))
	b := testenv.StartControl(t, "esx2", hostCfg(emb.ClientURL(), "127.0.0.2", true))
	fabric(t, emb.ClientURL())
	vm1 := a.OpenVMX(t, "vm1", vmxOn("dvportgroup-10"))
	vm2 := a.OpenVMX(t, "vm2", vmxOn("dvportgroup-10"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// An established QP pair, before the outage.
	before, err := perf.Connect(ctx, adapter0(t, vm1), adapter0(t, vm2), perf.PairConfig{Port: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close(ctx)

	proxy.Cut()
	// vm3 attaches on esx2 while esx1 cannot see etcd: esx1's cache misses it.
	vm3 := b.OpenVMX(t, "vm3", vmxOn("dvportgroup-10"))
	// vm6 attaches on esx1, which cannot publish it: the attach works, and
	// esx1 publishes it once etcd is back.
	a.OpenVMX(t, "vm6", vmxOn("dvportgroup-10"))

	// Established QPs keep moving data.
	for _, r := range before.CheckOpcodes(ctx) {
		if r.Err != nil {
			t.Errorf("established QP during the outage, %s: %v", r.Opcode, r.Err)
		}
	}
	// A connect to a cached (same-host) peer works.
	p, err := perf.Connect(ctx, adapter0(t, vm1), adapter0(t, vm2), perf.PairConfig{Port: 2})
	if err != nil {
		t.Fatalf("connect to a cached peer during the outage: %v", err)
	}
	if path := p.A.QP.Path(); path.Path != vrdma.PathMemcpy || !strings.Contains(path.Reason, "same host") {
		t.Errorf("path during the outage: %+v", path)
	}
	for _, r := range p.CheckOpcodes(ctx) {
		if r.Err != nil {
			t.Errorf("new QP during the outage, %s: %v", r.Opcode, r.Err)
		}
	}
	p.Close(ctx)
	// A lookup of an unknown peer fails, and says why.
	_, err = perf.Connect(ctx, adapter0(t, vm1), adapter0(t, vm3), perf.PairConfig{Port: 3})
	wantAbiErr(t, "connect to an unknown peer during the outage", err, abi.CodeUnavailable, "vm3/vrdma0", "control plane is unreachable")

	proxy.Heal()
	// It works again once etcd is back: the lookup succeeds, and the
	// pair connects over the rdma path.
	deadline := time.Now().Add(20 * time.Second)
	for {
		p3, err := perf.Connect(ctx, adapter0(t, vm1), adapter0(t, vm3), perf.PairConfig{Port: 4})
		if err == nil {
			if path := p3.A.QP.Path(); path.Path != vrdma.PathRDMA {
				t.Errorf("connect across hosts after the outage: path %+v, want rdma", path)
			}
			p3.Close(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after etcd returned: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		var vs vmReport
		out, _, code := run(t, "", "--etcd-endpoints", emb.ClientURL(), "-o", "json", "vm", "show", "vm6")
		if code == 0 && unmarshalPrinted([]byte(out), &vs) == nil && vs.Host == a.Agent.HostID() && len(vs.Adapters) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("vm6, attached during the outage, is not published after it: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestControlPlaneCLIWithoutEtcd(t *testing.T) {
	isolate(t)
	_, errs, code := run(t, "", "host", "list")
	if code != exitFailure || !strings.Contains(errs, "no control plane") || !strings.Contains(errs, "--etcd-endpoints") {
		t.Errorf("host list without a control plane: exit %d, %q", code, errs)
	}
	_, errs, code = run(t, "", "portgroup", "create", "pg1")
	if code != exitUsage {
		t.Errorf("portgroup create without --switch: exit %d, %q", code, errs)
	}
}

func TestControlPlaneAgentFlags(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-control-plane", "--switch", "dvs1"}, "--no-control-plane excludes"},
		{[]string{"--rdma-uplink", "bogus"}, "KIND/ADDRESS"},
		{[]string{"--rdma-uplink", "ib/192.0.2.1", "--switch", "dvs1"}, "is not"},
		{[]string{"--rdma-uplink", "hca/192.0.2.1"}, "needs --switch"},
		{[]string{"--pvrdma-address", "192.0.2.1"}, "ADDRESS:PORT"},
		{[]string{"--switch", "a/b"}, "--switch"},
		{[]string{"--etcd-cert", "c.pem"}, "go together"},
	} {
		_, errs, code := run(t, "", append([]string{"agent"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("agent %s: exit %d, %q; want exit 2 and %q", strings.Join(tc.args, " "), code, errs, tc.want)
		}
	}
	u, err := agent.ParseUplink("hca/192.0.2.1/fe80::1@mlx5_0")
	if err != nil || u.Kind != records.UplinkHCA || u.Device != "mlx5_0" || u.GID.String() != "fe80::1" || u.Address.String() != "192.0.2.1" {
		t.Errorf("ParseUplink: %+v, %v", u, err)
	}
}
