// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// Tests of the vSphere procedures (vm create, edit, set, reserve-memory,
// power-on, power-off), the inventory and the access rules, end to end
// against running agents.

// ctlOn runs vrdmactl with leading flags pre, which must exit 0.
func ctlOn(t *testing.T, pre []string, args ...string) string {
	t.Helper()
	return runOK(t, append(slices.Clone(pre), args...)...)
}

// ctlFail runs vrdmactl with leading flags pre, which must exit 1 with
// every one of want in its stdout or stderr; it returns both.
func ctlFail(t *testing.T, pre []string, want []string, args ...string) string {
	t.Helper()
	all := append(slices.Clone(pre), args...)
	out, errs, code := run(t, "", all...)
	if code != exitFailure {
		t.Errorf("vrdmactl %s: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", strings.Join(all, " "), code, out, errs)
	}
	for _, w := range want {
		if !strings.Contains(out+errs, w) {
			t.Errorf("vrdmactl %s does not say %q:\nstdout:\n%s\nstderr:\n%s", strings.Join(all, " "), w, out, errs)
		}
	}
	return out + errs
}

// ctlUsage runs vrdmactl, which must exit 2 (a usage error) saying want.
func ctlUsage(t *testing.T, pre []string, want string, args ...string) {
	t.Helper()
	all := append(slices.Clone(pre), args...)
	out, errs, code := run(t, "", all...)
	if code != exitUsage || !strings.Contains(errs, want) {
		t.Errorf("vrdmactl %s: exit %d, want 2 and %q\nstdout:\n%s\nstderr:\n%s", strings.Join(all, " "), code, want, out, errs)
	}
}

// waitQPErr waits until q is in the error state (its peer went away).
func waitQPErr(t *testing.T, q *vrdma.QP, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for q.State() != vrdma.QPSErr {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the peer's QP is in %v, not ERR, 10 s after the power-off", what, q.State())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The procedures on a standalone agent: the VM lives in its state
// directory and the host rules do not run (there is no host record).
func TestVMProceduresStandalone(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	on := []string{"--socket", env.Socket}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var in vrdma.VMInfo
	runJSON(t, &in, append(on, "-o", "json", "vm", "create", "web", "--memory", "4")...)
	if in.Power != "poweredOff" || in.Managed || in.Owner.UID != uint32(os.Getuid()) || in.Owner.GID != uint32(os.Getgid()) ||
		!strings.Contains(in.VMX, `memSize = "4"`) || !strings.Contains(in.VMX, `guestOS = "ubuntu-64"`) || !strings.Contains(in.VMX, `virtualHW.version = "20"`) {
		t.Errorf("vm create: %+v", in)
	}
	ctlFail(t, on, []string{"already defined"}, "vm", "create", "web")

	// A powered-off VM cannot be attached.
	_, err := vrdma.Open(ctx, "web", vrdma.WithSocket(env.Socket))
	wantAbiErr(t, "attach a powered-off VM", err, abi.CodeState, "powered off", "vrdmactl vm power-on web")

	// Adapters: a standalone agent cannot look a port group's switch up.
	ctlFail(t, on, []string{"--switch"}, "vm", "edit", "web", "--add-adapter", "--portgroup", "dvportgroup-10")
	if out := ctlOn(t, on, "vm", "edit", "web", "--add-adapter", "--portgroup", "dvportgroup-10", "--switch", "dvs1"); !strings.Contains(out, "added PVRDMA adapter vrdma0 (ethernet0)") {
		t.Errorf("vm edit --add-adapter:\n%s", out)
	}
	if out := ctlOn(t, on, "vm", "edit", "web", "--add-adapter", "--portgroup", "dvportgroup-10", "--switch", "dvs1"); !strings.Contains(out, "added PVRDMA adapter vrdma1 (ethernet1)") ||
		!strings.Contains(out, "memory-reservation") {
		t.Errorf("second vm edit --add-adapter (should list what is left to fix):\n%s", out)
	}
	ctlFail(t, on, []string{"ethernet7 is not a PVRDMA adapter"}, "vm", "edit", "web", "--remove-adapter", "7")
	ctlUsage(t, on, "--remove-adapter", "vm", "edit", "web")
	ctlUsage(t, on, "--portgroup PG is required", "vm", "edit", "web", "--add-adapter")

	// vm set: new keys are appended, a key already set keeps its line,
	// and nothing else of the VMX moves.
	before := ctlOn(t, on, "vm", "show", "web", "--vmx")
	ctlOn(t, on, "vm", "set", "web", "vrdma1.nativeEndpointSupport=TRUE", "vrdma.asyncMode=TRUE")
	after := ctlOn(t, on, "vm", "show", "web", "--vmx")
	if after != before+"vrdma1.nativeEndpointSupport = \"TRUE\"\nvrdma.asyncMode = \"TRUE\"\n" {
		t.Errorf("vm set changed more than it set:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	ctlOn(t, on, "vm", "set", "web", "memSize=8")
	if got := ctlOn(t, on, "vm", "show", "web", "--vmx"); got != strings.Replace(after, `memSize = "4"`, `memSize = "8"`, 1) {
		t.Errorf("vm set memSize=8 rewrote more than its value:\n%s", got)
	}
	// A setting that breaks a rule that held is refused, with the rule.
	ctlFail(t, on, []string{"native-endpoint-index", "vrdma5", "nothing changed"}, "vm", "set", "web", "vrdma5.nativeEndpointSupport=TRUE")
	ctlFail(t, on, []string{"memSize"}, "vm", "set", "web", "memSize=lots")
	if got := ctlOn(t, on, "vm", "show", "web", "--vmx"); strings.Contains(got, "vrdma5") || strings.Contains(got, "lots") {
		t.Errorf("a refused vm set changed the VMX:\n%s", got)
	}

	// Power-on runs every rule and refuses with the whole list: here the
	// memory reservation (an error) and async mode's latency sensitivity
	// (a warning).
	// Native endpoints need a host of the control plane (rule
	// host-native-endpoint): a standalone agent has no RDMA uplink.
	out := ctlFail(t, on, []string{"cannot power on", "memory-reservation", "async-latency-sensitivity", "warning",
		"host-native-endpoint", "agent without a control plane"}, "vm", "power-on", "web")
	if strings.Contains(out, "host-rdma-configured") {
		t.Errorf("a standalone power-on ran the host rules:\n%s", out)
	}
	var pr vrdma.PowerResult
	jout, _, code := run(t, "", append(on, "-o", "json", "vm", "power-on", "web")...)
	if err := unmarshalPrinted([]byte(jout), &pr); code != exitFailure || err != nil || !pr.Refused || pr.Changed || len(pr.Findings) < 2 {
		t.Errorf("vm power-on -o json of a VM that fails a rule: exit %d, %+v, %v\n%s", code, pr, err, jout)
	}
	if out := ctlOn(t, on, "vm", "reserve-memory", "web", "--all"); !strings.Contains(out, "reserved and locked") {
		t.Errorf("vm reserve-memory:\n%s", out)
	}
	if got := ctlOn(t, on, "vm", "show", "web", "--vmx"); !strings.Contains(got, `sched.mem.pin = "TRUE"`) || !strings.Contains(got, `sched.mem.min = "8"`) {
		t.Errorf("after reserve-memory:\n%s", got)
	}
	ctlUsage(t, on, "--all", "vm", "reserve-memory", "web")
	ctlOn(t, on, "vm", "set", "web", "vrdma1.nativeEndpointSupport=FALSE")
	if out := ctlOn(t, on, "vm", "power-on", "web"); !strings.Contains(out, "powered on on host hostA") || !strings.Contains(out, "async-latency-sensitivity") {
		t.Errorf("vm power-on:\n%s", out)
	}
	if out := ctlOn(t, on, "vm", "power-on", "web"); !strings.Contains(out, "already powered on") {
		t.Errorf("second vm power-on:\n%s", out)
	}
	// A powered-on VM is not edited.
	ctlFail(t, on, []string{"power off the VM first"}, "vm", "edit", "web", "--remove-adapter", "1")
	ctlFail(t, on, []string{"power off the VM first"}, "vm", "set", "web", "vrdma.asyncMode=FALSE")

	// It attaches now, and talks to a peer.
	web, err := vrdma.Open(ctx, "web", vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatalf("attach the powered-on VM: %v", err)
	}
	defer web.Close()
	if n := len(web.Adapters()); n != 2 || !web.MemoryLocked() {
		t.Errorf("web: %d adapters, memory locked %v", n, web.MemoryLocked())
	}
	peer := env.OpenVMX(t, "peer", testenv.VMXOn(testenv.VMOptions{Locked: true}, "dvs1", "dvportgroup-10"))
	p, err := perf.Connect(ctx, adapter0(t, peer), adapter0(t, web), perf.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	var vs struct{ VMs []vrdma.VMStatus }
	runJSON(t, &vs, append(on, "-o", "json", "vm", "list")...)
	for _, v := range vs.VMs {
		if v.Name == "web" && (!v.Attached || v.Power != "poweredOn") {
			t.Errorf("vm list: web is %+v", v)
		}
	}

	// Disconnecting an adapter downs its port, by either of its names;
	// connecting brings it back.
	ad1 := web.Adapters()[1]
	eth := "ethernet" + strings.TrimPrefix(ad1.Name(), "vrdma")
	if out := ctlOn(t, on, "vm", "disconnect", "web", eth); !strings.Contains(out, "VM web adapter "+ad1.Name()+" disconnected; 1 workloads told") {
		t.Errorf("vm disconnect:\n%s", out)
	}
	if pa, err := ad1.QueryPort(ctx); err != nil || pa.State != "PORT_DOWN" {
		t.Errorf("port of a disconnected adapter: %+v %v", pa, err)
	}
	if out := ctlOn(t, on, "vm", "disconnect", "web", ad1.Name()); !strings.Contains(out, "already disconnected") {
		t.Errorf("second vm disconnect:\n%s", out)
	}
	if out := ctlOn(t, on, "vm", "connect", "web", ad1.Name()); !strings.Contains(out, "connected; 1 workloads told") {
		t.Errorf("vm connect:\n%s", out)
	}
	if pa, err := ad1.QueryPort(ctx); err != nil || pa.State != "PORT_ACTIVE" {
		t.Errorf("port of a connected adapter: %+v %v", pa, err)
	}
	// The same with -o json: what changed, and how many workloads were told.
	for _, connected := range []bool{false, true} {
		verb := map[bool]string{false: "disconnect", true: "connect"}[connected]
		var r vrdma.ConnectResult
		runJSON(t, &r, append(slices.Clone(on), "-o", "json", "vm", verb, "web", ad1.Name())...)
		if r != (vrdma.ConnectResult{VM: "web", Adapter: ad1.Name(), Connected: connected, Changed: true, Workloads: 1}) {
			t.Errorf("vm %s -o json: %+v", verb, r)
		}
	}
	ctlFail(t, on, []string{`has no adapter "vrdma7"`}, "vm", "disconnect", "web", "vrdma7")

	// Power-off detaches the workload; its peer's QP flushes.
	if out := ctlOn(t, on, "vm", "power-off", "web"); !strings.Contains(out, "its workload was detached") {
		t.Errorf("vm power-off:\n%s", out)
	}
	waitQPErr(t, p.A.QP, "peer of web")
	if _, err := adapter0(t, web).AllocPD(ctx); err == nil {
		t.Error("the detached workload can still allocate a PD")
	}
	if out := ctlOn(t, on, "vm", "power-off", "web"); !strings.Contains(out, "already powered off") {
		t.Errorf("second vm power-off:\n%s", out)
	}
	ctlFail(t, on, []string{"has no running workload", "startConnected"}, "vm", "disconnect", "web", "vrdma0")
	// vm show asks the agent when there is no control plane.
	if out := ctlOn(t, on, "vm", "show", "web"); !strings.Contains(out, "power:     poweredOff") || !strings.Contains(out, "vrdma1") ||
		!strings.Contains(out, `vrdma.asyncMode = "TRUE"`) {
		t.Errorf("vm show:\n%s", out)
	}
	// Defined VMs are powered on at once, and can be powered off and on.
	ctlOn(t, on, "vm", "power-off", "peer")
	_, err = vrdma.Open(ctx, "peer", vrdma.WithSocket(env.Socket))
	wantAbiErr(t, "attach a powered-off defined VM", err, abi.CodeState, "powered off")
	ctlFail(t, on, []string{"lives on host hostA"}, "vm", "power-on", "peer", "--host", "elsewhere")
	ctlOn(t, on, "vm", "power-on", "peer")
	ctlOn(t, on, "vm", "undefine", "web")
	ctlFail(t, on, []string{"not defined"}, "vm", "show", "web")
}

// The procedures with a control plane: a managed VM created through one
// host's agent, checked against another host's record, powered on there,
// attached there only, and powered off from the first host. And the
// inventory: hosts and VMs placed in datacenters, clusters, folders and
// resource pools, listed and filtered.
func TestVMProceduresControlPlane(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	a := testenv.StartControl(t, "esx1", hostCfg(ep, "127.0.0.1", false))
	cfg3 := hostCfg(ep, "127.0.0.3", false)
	cfg3.PVRDMAAddress, cfg3.FirewallPVRDMA = netip.AddrPort{}, false // not configured for PVRDMA yet
	b := testenv.StartControl(t, "esx3", cfg3)
	fabric(t, ep)
	cp := []string{"--etcd-endpoints", ep}
	onA := []string{"--socket", a.Socket, "--etcd-endpoints", ep}
	onB := []string{"--socket", b.Socket, "--etcd-endpoints", ep}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Place the hosts.
	var hr hostReport
	runJSON(t, &hr, append(cp, "-o", "json", "host", "configure", "esx1", "--datacenter", "dc1", "--cluster", "c1", "--folder", "rack1")...)
	if hr.Datacenter != "dc1" || hr.Cluster != "c1" || hr.Folder != "rack1" || hr.PVRDMAAddress != "127.0.0.1:4791" {
		t.Errorf("host configure esx1: %+v", hr)
	}
	ctlOn(t, cp, "host", "configure", "esx3", "--datacenter", "dc1", "--cluster", "c2")
	ctlFail(t, cp, []string{"not found"}, "host", "configure", "esx9", "--cluster", "c1")
	if _, errs, code := run(t, "", append(cp, "host", "configure", "esx3", "--pvrdma-address", "nowhere")...); code != exitUsage || !strings.Contains(errs, "ADDRESS:PORT") {
		t.Errorf("host configure --pvrdma-address nowhere: exit %d, %s", code, errs)
	}

	// Create managed VMs through esx1's agent.
	var in vrdma.VMInfo
	runJSON(t, &in, append(onA, "-o", "json", "vm", "create", "web", "--memory", "4", "--folder", "prod/web", "--resource-pool", "gold")...)
	if !in.Managed || in.Host != "esx1" || in.HostID != a.Agent.HostID() || in.Datacenter != "dc1" || in.Power != "poweredOff" {
		t.Errorf("vm create web: %+v", in)
	}
	ctlOn(t, onA, "vm", "create", "db", "--memory", "4", "--host", "esx3", "--folder", "prod")
	ctlOn(t, onA, "vm", "create", "app", "--memory", "4")
	ctlFail(t, onB, []string{"taken in the control plane"}, "vm", "create", "web")
	ctlFail(t, onA, []string{"datacenter"}, "vm", "create", "stray", "--datacenter", "dc2")
	// Names are global: a defined VM may not take a managed VM's name.
	if _, errs, code := run(t, testenv.VMX(testenv.VMOptions{}), append(onB, "vm", "define", "db", "-")...); code != exitFailure || !strings.Contains(errs, "managed VM") {
		t.Errorf("vm define over a managed VM: exit %d, %s", code, errs)
	}

	// Edit it through the other host's agent: the port group's switch is
	// found in the control plane.
	ctlFail(t, onB, []string{"dvportgroup-99 does not exist"}, "vm", "edit", "web", "--add-adapter", "--portgroup", "dvportgroup-99")
	ctlOn(t, onB, "vm", "edit", "web", "--add-adapter", "--portgroup", "dvportgroup-10")
	var sw struct{ Switch struct{ UUID string } }
	runJSON(t, &sw, append(cp, "-o", "json", "switch", "show", "dvs1")...)
	if got := ctlOn(t, onA, "vm", "show", "web", "--vmx"); sw.Switch.UUID == "" || !strings.Contains(got, fmt.Sprintf("ethernet0.dvs.switchId = %q", sw.Switch.UUID)) ||
		!strings.Contains(got, `ethernet0.dvs.portgroupId = "dvportgroup-10"`) || !strings.Contains(got, `ethernet0.virtualDev = "vrdma"`) {
		t.Errorf("after vm edit --add-adapter (switch %s):\n%s", sw.Switch.UUID, got)
	}
	var shown vmReport // powered off: the adapters of its VMX, where their port groups are
	runJSON(t, &shown, append(onA, "-o", "json", "vm", "show", "web")...)
	if len(shown.Adapters) != 1 || shown.Adapters[0].PortGroup != "dvportgroup-10" || shown.Adapters[0].Switch != "dvs1" || shown.Adapters[0].VLAN != 10 {
		t.Errorf("vm show web -o json adapters: %+v; want vrdma0 on dvportgroup-10, switch dvs1, VLAN 10", shown.Adapters)
	}

	// A VM of dc1 does not power on on a host in no datacenter.
	ctlOn(t, cp, "host", "configure", "esx3", "--datacenter", "")
	ctlFail(t, onA, []string{"host-datacenter", "in no datacenter"}, "vm", "power-on", "web", "--host", "esx3")
	ctlOn(t, cp, "host", "configure", "esx3", "--datacenter", "dc1")

	// Power-on on esx3 runs every rule against the VM and esx3's record,
	// and refuses with the whole list.
	ctlFail(t, onA, []string{"memory-reservation", "host-rdma-configured", "PVRDMA address", "firewall"}, "vm", "power-on", "web", "--host", "esx3")
	ctlOn(t, onA, "vm", "reserve-memory", "web", "--all")
	// An adapter whose switchId is not its port group's switch.
	ctlOn(t, onA, "vm", "set", "web", "ethernet0.dvs.switchId=00000000-0000-0000-0000-000000000000")
	ctlFail(t, onA, []string{"portgroup-switch", "ethernet0.dvs.switchId", sw.Switch.UUID}, "vm", "power-on", "web", "--host", "esx3")
	ctlOn(t, onA, "vm", "set", "web", "ethernet0.dvs.switchId="+strings.ToUpper(strings.ReplaceAll(sw.Switch.UUID, " ", "")))
	out := ctlFail(t, onA, []string{"host-rdma-configured"}, "vm", "power-on", "web", "--host", "esx3")
	if strings.Contains(out, "portgroup-switch") {
		t.Errorf("portgroup-switch fails on the switch's UUID written another way:\n%s", out)
	}
	if strings.Contains(out, "memory-reservation") {
		t.Errorf("memory-reservation still fails after reserve-memory:\n%s", out)
	}
	runJSON(t, &hr, append(cp, "-o", "json", "host", "configure", "esx3", "--pvrdma-address", "127.0.0.3:4791", "--firewall-pvrdma", "on")...)
	if hr.PVRDMAAddress != "127.0.0.3:4791" || !hr.FirewallPVRDMA || hr.Cluster != "c2" {
		t.Errorf("host configure esx3: %+v", hr)
	}
	var pr vrdma.PowerResult
	runJSON(t, &pr, append(onA, "-o", "json", "vm", "power-on", "web", "--host", "esx3")...)
	if !pr.Changed || pr.VM.Host != "esx3" || pr.VM.Power != "poweredOn" || errorCount(pr.Findings) != 0 {
		t.Errorf("vm power-on web --host esx3: %+v", pr)
	}
	ctlFail(t, onA, []string{"power it off first"}, "vm", "power-on", "web", "--host", "esx1")
	ctlFail(t, onA, []string{"power off the VM first"}, "vm", "undefine", "web")

	// It attaches on esx3 only.
	_, err := vrdma.Open(ctx, "web", vrdma.WithSocket(a.Socket))
	wantAbiErr(t, "attach web on esx1", err, abi.CodeState, "powered on on host esx3", "not on this host (esx1)")
	web, err := vrdma.Open(ctx, "web", vrdma.WithSocket(b.Socket))
	if err != nil {
		t.Fatalf("attach web on esx3: %v", err)
	}
	defer web.Close()
	var vs vmReport
	runJSON(t, &vs, append(cp, "-o", "json", "vm", "show", "web")...)
	if vs.HostName != "esx3" || vs.Power != "poweredOn" || !vs.Managed || len(vs.Adapters) != 1 || !vs.Adapters[0].GID.IsValid() ||
		vs.Cluster != "c2" || vs.Datacenter != "dc1" || vs.Folder != "prod/web" || vs.ResourcePool != "gold" {
		t.Errorf("vm show web while attached: %+v", vs)
	}
	peer := b.OpenVMX(t, "peer", vmxOn("dvportgroup-10"))
	// A defined VM is published with its owner, whoever attaches it (root
	// here).
	if _, errs, code := run(t, vmxOn("dvportgroup-10"), append(onB, "vm", "define", "owned", "-", "--owner", "1000:1001")...); code != 0 {
		t.Fatalf("vm define owned --owner 1000:1001: exit %d, %s", code, errs)
	}
	owned, err := vrdma.Open(ctx, "owned", vrdma.WithSocket(b.Socket))
	if err != nil {
		t.Fatal(err)
	}
	var ov vmReport
	runJSON(t, &ov, append(cp, "-o", "json", "vm", "show", "owned")...)
	if ov.Owner != (records.Owner{UID: 1000, GID: 1001}) || ov.HostName != "esx3" {
		t.Errorf("vm show owned while attached: owner %+v on %s; want 1000:1001 on esx3", ov.Owner, ov.HostName)
	}
	owned.Close()
	for t0 := time.Now(); ; time.Sleep(20 * time.Millisecond) { // its agent unpublishes it as the detach ends
		if _, _, code := run(t, "", append(cp, "vm", "show", "owned")...); code != 0 {
			break
		}
		if time.Since(t0) > 10*time.Second {
			t.Fatal("VM owned is still in the control plane 10 s after its workload closed it")
		}
	}
	// Its name is taken across the control plane while it runs on esx3.
	if _, errs, code := run(t, vmxOn("dvportgroup-10"), append(onA, "vm", "define", "peer", "-")...); code != exitFailure || !strings.Contains(errs, "runs on host esx3") {
		t.Errorf("vm define on esx1 of a VM name running on esx3: exit %d, %s", code, errs)
	}
	p, err := perf.Connect(ctx, adapter0(t, peer), adapter0(t, web), perf.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)

	// Inventory: filters and the tree.
	names := func(args ...string) []string {
		var l struct{ VMs []vmReport }
		runJSON(t, &l, append(append(slices.Clone(cp), "-o", "json", "vm", "list"), args...)...)
		var n []string
		for _, v := range l.VMs {
			n = append(n, v.Name)
		}
		slices.Sort(n)
		return n
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cluster"}, "app,db,peer,web"},
		{[]string{"--datacenter", "dc1", "--cluster", "c1"}, "app"},
		{[]string{"--cluster", "c2"}, "db,peer,web"},
		{[]string{"--cluster=c2", "--folder", "prod"}, "db,web"},
		{[]string{"--folder", "prod/web"}, "web"},
		{[]string{"--resource-pool", "gold"}, "web"},
		{[]string{"--host", "esx1"}, "app"},
		{[]string{"--datacenter", "dc2"}, ""},
	} {
		if got := strings.Join(names(tc.args...), ","); got != tc.want {
			t.Errorf("vm list %s: %s, want %s", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	var tree struct{ Datacenters []invDatacenter }
	runJSON(t, &tree, append(cp, "-o", "json", "inventory")...)
	if len(tree.Datacenters) != 1 || tree.Datacenters[0].Name != "dc1" || len(tree.Datacenters[0].Clusters) != 2 {
		t.Fatalf("inventory: %+v", tree)
	}
	dc := tree.Datacenters[0]
	c1, c2 := dc.Clusters[0], dc.Clusters[1]
	if c1.Name != "c1" || len(c1.Hosts) != 1 || c1.Hosts[0].Name != "esx1" || c1.Hosts[0].Folder != "rack1" || len(c1.Hosts[0].VMs) != 1 ||
		c2.Name != "c2" || len(c2.Hosts) != 1 || len(c2.Hosts[0].VMs) != 3 || len(c2.ResourcePools) != 1 || c2.ResourcePools[0].Path != "gold" ||
		len(dc.Folders) != 2 || dc.Folders[0].Path != "prod" || dc.Folders[1].Path != "prod/web" {
		t.Errorf("inventory: %+v", dc)
	}
	if out := ctlOn(t, cp, "inventory"); !strings.Contains(out, "datacenter dc1") || !strings.Contains(out, "  cluster c2") ||
		!strings.Contains(out, "vm web (poweredOn, folder prod/web, pool gold)") || !strings.Contains(out, "resource pool gold: web") {
		t.Errorf("inventory:\n%s", out)
	}

	// Power-off from esx1's agent: esx3's agent detaches the workload,
	// and the peer's QP flushes.
	runJSON(t, &pr, append(onA, "-o", "json", "vm", "power-off", "web")...)
	if !pr.Changed || !pr.Detached || pr.VM.Power != "poweredOff" {
		t.Errorf("vm power-off web from esx1: %+v", pr)
	}
	waitQPErr(t, p.A.QP, "peer of web")
	runJSON(t, &vs, append(cp, "-o", "json", "vm", "show", "web")...)
	if vs.Power != "poweredOff" || vs.HostName != "esx3" || len(vs.Adapters) != 1 || vs.Adapters[0].GID.IsValid() || vs.Adapters[0].PortGroup != "dvportgroup-10" {
		t.Errorf("vm show web after power-off: %+v", vs)
	}
	// Powered off, it can be changed again, and deleted.
	ctlOn(t, onB, "vm", "edit", "web", "--remove-adapter", "vrdma0")
	ctlOn(t, onA, "vm", "undefine", "web")
	ctlFail(t, cp, []string{"not found"}, "vm", "show", "web")

	// Each host has its own PVRDMA address.
	ctlFail(t, cp, []string{"host esx1", "already"}, "host", "configure", "esx3", "--pvrdma-address", "127.0.0.1:4800")

	// Removing a host: refused while its agent is up, and while managed
	// VMs are registered on it; done once it is down and they are gone.
	ctlFail(t, cp, []string{"is up", "stop its vrdmad"}, "host", "remove", "esx3")
	b.Agent.Close()
	for t0 := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		runJSON(t, &hr, append(cp, "-o", "json", "host", "show", "esx3")...)
		if hr.State == "down" {
			break
		}
		if time.Since(t0) > 15*time.Second {
			t.Fatalf("esx3 still %s 15 s after its agent stopped", hr.State)
		}
	}
	ctlFail(t, cp, []string{"managed VMs", "db"}, "host", "remove", "esx3")
	ctlOn(t, onA, "vm", "undefine", "db")
	if out := ctlOn(t, cp, "host", "remove", "esx3"); !strings.Contains(out, "host esx3 ("+b.Agent.HostID()+") removed") {
		t.Errorf("host remove esx3: %s", out)
	}
	ctlFail(t, cp, []string{"not found"}, "host", "show", "esx3")
}

// accessHelperEnv names what the child process of TestVMAccessPeerCred
// does, as uid and gid 65534.
const accessHelperEnv = "VRDMA_CLI_ACCESS_HELPER"

// TestVMAccessHelper is not a test: it is the child process of
// TestVMAccessPeerCred. It drops to uid and gid 65534, then either
// attaches VM $VRDMA_TEST_VM ("attach") and prints "attached" or the
// agent's error, or runs vrdmactl with its arguments ("ctl").
func TestVMAccessHelper(t *testing.T) {
	mode := os.Getenv(accessHelperEnv)
	if mode == "" {
		return
	}
	if err := syscall.Setgroups(nil); err != nil {
		fmt.Println("setgroups:", err)
		os.Exit(3)
	}
	if err := syscall.Setgid(65534); err != nil {
		fmt.Println("setgid:", err)
		os.Exit(3)
	}
	if err := syscall.Setuid(65534); err != nil {
		fmt.Println("setuid:", err)
		os.Exit(3)
	}
	switch mode {
	case "attach":
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		v, err := vrdma.Open(ctx, os.Getenv("VRDMA_TEST_VM"), vrdma.WithSocket(os.Getenv("VRDMA_TEST_SOCKET")))
		var e *vrdma.Error
		switch {
		case errors.As(err, &e):
			fmt.Printf("refused %s: %s\n", e.Code, e.Message)
		case err != nil:
			fmt.Println("failed:", err)
		default:
			fmt.Println("attached")
			v.Close()
		}
		os.Exit(0)
	case "ctl":
		var args []string
		json.Unmarshal([]byte(os.Getenv("VRDMA_TEST_ARGS")), &args)
		os.Exit(Main(args, os.Stdin, os.Stdout, os.Stdout))
	}
	os.Exit(3)
}

// TestVMAccessPeerCred checks the owner rule with a second uid: the agent
// reads a client's credentials with SO_PEERCRED, refuses to attach a VM
// to a process of another user, and refuses changes to a VM from anyone
// but its owner and root.
func TestVMAccessPeerCred(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a client as uid 65534 (setuid in a child process) to check the agent's SO_PEERCRED refusal")
	}
	isolate(t)
	env := testenv.Start(t)
	// uid 65534 must reach the socket (it is world-connectable; its
	// directory and the one above are the test's).
	for _, d := range []string{filepath.Dir(env.Socket), filepath.Dir(filepath.Dir(env.Socket))} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	on := []string{"--socket", env.Socket}
	env.Define(t, "rootvm", testenv.VMOptions{}) // owned by root: this test
	if _, errs, code := run(t, testenv.VMXOn(testenv.VMOptions{Locked: true}, "dvs1", "dvportgroup-10"), append(on, "vm", "define", "nobodyvm", "-", "--owner", "65534:65534")...); code != 0 {
		t.Fatalf("vm define --owner 65534:65534: exit %d, %s", code, errs)
	}
	child := func(mode string, env2 ...string) string {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestVMAccessHelper$")
		cmd.Env = append(os.Environ(), append([]string{accessHelperEnv + "=" + mode, "VRDMA_TEST_SOCKET=" + env.Socket}, env2...)...)
		out, err := cmd.CombinedOutput()
		t.Logf("as uid 65534, %s %v: %s", mode, env2, out)
		if _, ok := err.(*exec.ExitError); err != nil && !ok {
			t.Fatalf("run the child: %v", err)
		}
		return string(out)
	}
	ctlAs := func(args ...string) string {
		b, _ := json.Marshal(append(slices.Clone(on), args...))
		return child("ctl", "VRDMA_TEST_ARGS="+string(b))
	}
	if out := child("attach", "VRDMA_TEST_VM=rootvm"); !strings.Contains(out, "refused "+abi.CodePermission) || !strings.Contains(out, "owner rule") ||
		!strings.Contains(out, "only by its owner, uid 0,") || !strings.Contains(out, "uid 65534 gid 65534") {
		t.Errorf("uid 65534 attaching root's VM: %s", out)
	}
	if out := child("attach", "VRDMA_TEST_VM=nobodyvm"); !strings.Contains(out, "attached") {
		t.Errorf("uid 65534 attaching its own VM: %s", out)
	}
	// Writes need the owner's rights, or root's.
	for _, args := range [][]string{{"vm", "power-off", "rootvm"}, {"vm", "set", "rootvm", "vrdma.asyncMode=TRUE"}, {"vm", "undefine", "rootvm"}} {
		if out := ctlAs(args...); !strings.Contains(out, "belongs to uid 0: only its owner or root may change it") || !strings.Contains(out, "uid 65534") {
			t.Errorf("uid 65534: vrdmactl %s: %s", strings.Join(args, " "), out)
		}
	}
	if out := ctlAs("vm", "create", "theirs", "--memory", "4", "--owner", "0:0"); !strings.Contains(out, "only root may give a VM to uid 0") {
		t.Errorf("uid 65534 creating a VM for root: %s", out)
	}
	if out := ctlAs("vm", "power-off", "nobodyvm"); !strings.Contains(out, "VM nobodyvm powered off") {
		t.Errorf("uid 65534 powering its own VM off: %s", out)
	}
	// Root may do anything.
	ctlOn(t, on, "vm", "power-on", "nobodyvm")
	ctlOn(t, on, "vm", "power-off", "rootvm")
}
