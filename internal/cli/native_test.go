// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"strings"
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestNativeRulesManagement: PVRDMA namespaces are a setting of the host
// record (host configure, host show), a VM with native endpoints powers
// on only on a host with an RDMA uplink and namespaces on (rule
// host-native-endpoint), and native endpoints do not change on a
// powered-on VM.
func TestNativeRulesManagement(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	a := testenv.StartControl(t, "esx1", hostCfg(ep, "127.0.0.1", true))
	testenv.StartControl(t, "esx3", hostCfg(ep, "127.0.0.3", false)) // no RDMA uplink
	fabric(t, ep)
	cp := []string{"--etcd-endpoints", ep}
	onA := []string{"--socket", a.Socket, "--etcd-endpoints", ep}

	// Off by default, in text and JSON.
	var hr hostReport
	runJSON(t, &hr, append(cp, "-o", "json", "host", "show", "esx1")...)
	if hr.PVRDMANamespaces || len(hr.Uplinks) != 1 {
		t.Errorf("host show esx1 -o json before configure: %+v; want namespaces off, one uplink", hr)
	}
	if out := ctlOn(t, cp, "host", "show", "esx1"); !strings.Contains(out, "RDMA uplinks:   1, PVRDMA namespaces off") {
		t.Errorf("host show esx1:\n%s", out)
	}
	ctlUsage(t, cp, "on or off", "host", "configure", "esx1", "--pvrdma-namespaces", "maybe")

	// A VM with native endpoints on its adapter vrdma0.
	ctlOn(t, onA, "vm", "create", "web", "--memory", "4")
	ctlOn(t, onA, "vm", "edit", "web", "--add-adapter", "--portgroup", "dvportgroup-10")
	ctlOn(t, onA, "vm", "reserve-memory", "web", "--all")
	ctlOn(t, onA, "vm", "set", "web", "vrdma0.nativeEndpointSupport=TRUE")

	// Refused on esx1 while its namespaces are off, with the rule, the
	// key and the command that fixes it.
	out := ctlFail(t, onA, []string{"cannot power on", "host-native-endpoint", "vrdma0.nativeEndpointSupport", "PVRDMA namespaces are off",
		"vrdmactl host configure esx1 --pvrdma-namespaces on"}, "vm", "power-on", "web", "--host", "esx1")
	if strings.Contains(out, "no RDMA uplink") {
		t.Errorf("esx1 has an RDMA uplink, and power-on says it has none:\n%s", out)
	}
	// vm define powers a VM on here: the same rule.
	nativeVMX := vmxOn("dvportgroup-10") + "vrdma0.nativeEndpointSupport = \"TRUE\"\n"
	if _, errs, code := run(t, nativeVMX, append(onA, "vm", "define", "local", "-")...); code != exitFailure ||
		!strings.Contains(errs, "host-native-endpoint") || !strings.Contains(errs, "--pvrdma-namespaces on") {
		t.Errorf("vm define of a VM with native endpoints on a host without namespaces: exit %d, %s", code, errs)
	}
	if out := ctlOn(t, cp, "host", "configure", "esx1", "--pvrdma-namespaces", "on"); !strings.Contains(out, "PVRDMA namespaces on") {
		t.Errorf("host configure esx1 --pvrdma-namespaces on:\n%s", out)
	}
	runJSON(t, &hr, append(cp, "-o", "json", "host", "show", "esx1")...)
	if !hr.PVRDMANamespaces || !hr.FirewallPVRDMA {
		t.Errorf("host show esx1 -o json after configure: %+v; want namespaces on, the firewall rule kept", hr)
	}
	if out := ctlOn(t, cp, "host", "show", "esx1"); !strings.Contains(out, "PVRDMA namespaces on") {
		t.Errorf("host show esx1 after configure:\n%s", out)
	}
	var listed struct{ Hosts []hostReport }
	runJSON(t, &listed, append(cp, "-o", "json", "host", "list")...)
	for _, h := range listed.Hosts {
		if h.PVRDMANamespaces != (h.Name == "esx1") {
			t.Errorf("host list -o json: %s has namespaces %v", h.Name, h.PVRDMANamespaces)
		}
	}

	if _, errs, code := run(t, nativeVMX, append(onA, "vm", "define", "local", "-")...); code != 0 {
		t.Errorf("vm define of a VM with native endpoints on a host with namespaces: exit %d, %s", code, errs)
	}
	// esx3 has namespaces on, and no RDMA uplink: refused for that.
	ctlOn(t, cp, "host", "configure", "esx3", "--pvrdma-namespaces", "on")
	ctlFail(t, onA, []string{"host-native-endpoint", "has no RDMA uplink", "--rdma-uplink"}, "vm", "power-on", "web", "--host", "esx3")
	// vmx check --host runs the same rule.
	vmxText := ctlOn(t, onA, "vm", "show", "web", "--vmx")
	if _, _, code := run(t, vmxText, append(cp, "vmx", "check", "--host", "esx3", "-")...); code != exitFailure {
		t.Errorf("vmx check --host esx3 of a VM with native endpoints: exit %d, want 1", code)
	}

	// Powered on on esx1; native endpoints then stay as they are.
	var pr vrdma.PowerResult
	runJSON(t, &pr, append(onA, "-o", "json", "vm", "power-on", "web", "--host", "esx1")...)
	if !pr.Changed || pr.VM.Power != "poweredOn" || errorCount(pr.Findings) != 0 {
		t.Errorf("vm power-on web --host esx1 with namespaces on: %+v", pr)
	}
	ctlFail(t, onA, []string{"powered on", "turns native endpoints on or off", "vrdmactl vm power-off web"},
		"vm", "set", "web", "vrdma0.nativeEndpointSupport=FALSE")
	ctlFail(t, onA, []string{"turns native endpoints on or off"}, "vm", "set", "web", "--unset", "vrdma0.nativeEndpointSupport")
	if got := ctlOn(t, onA, "vm", "show", "web", "--vmx"); !strings.Contains(got, `vrdma0.nativeEndpointSupport = "TRUE"`) {
		t.Errorf("a refused vm set changed the VMX:\n%s", got)
	}
	ctlOn(t, onA, "vm", "power-off", "web")
	ctlOn(t, onA, "vm", "set", "web", "vrdma0.nativeEndpointSupport=FALSE")
}
