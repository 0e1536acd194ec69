// SPDX-License-Identifier: Apache-2.0

package console

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
)

// TestAdminAPI checks the control plane's administration through the
// console's API against a running agent and control plane: host
// configure writes the host's record (and the agent applies it), bad
// values and refusals answer with their reason and change nothing,
// switches and port groups are created and deleted only when nothing is
// on them, VMs are created and removed by the agent.
func TestAdminAPI(t *testing.T) {
	f := startFabric(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := f.env.Status(t).HostID
	var hp HostPage
	var e map[string]string
	if code := call(t, f.srv, "POST", "/api/hosts/"+id+"/configure", map[string]any{"pvrdma_address": "nowhere"}, &e); code != 400 || !strings.Contains(e["error"], "ADDRESS:PORT") {
		t.Errorf("a bad PVRDMA address: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/hosts/"+id+"/configure", map[string]any{}, &e); code != 400 || !strings.Contains(e["error"], "say what to change") {
		t.Errorf("no change: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/hosts/nosuch/configure", map[string]any{"firewall_pvrdma": false}, &e); code != 404 || !strings.Contains(e["error"], "host nosuch: not found") {
		t.Errorf("an unknown host: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/hosts/"+id+"/configure", map[string]any{"pvrdma_address": testAddr + ":4792", "vmknic": "vmk1", "firewall_pvrdma": false, "pvrdma_namespaces": true}, &hp); code != 200 ||
		hp.PVRDMAAddress != testAddr+":4792" || hp.PVRDMAVmknic != "vmk1" || hp.FirewallPVRDMA || !hp.PVRDMANamespaces {
		t.Fatalf("configure: %d %+v", code, hp)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, err := f.cache.Host(ctx, id)
		if err == nil && h.Host.PVRDMAAddress.String() == testAddr+":4792" && !h.Host.FirewallPVRDMA && h.Host.PVRDMANamespaces && h.Host.PVRDMAVmknic == "vmk1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the host's record 10 s after configure: %+v %v", h.Host, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The agent applies the rule and the address.
	for p := f.env.Status(t).PVRDMA; p == nil || p.Firewall || p.Address != testAddr+":4792"; p = f.env.Status(t).PVRDMA {
		if time.Now().After(deadline) {
			t.Fatalf("the agent's PVRDMA status 10 s after configure: %+v", p)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if code := call(t, f.srv, "POST", "/api/hosts/"+id+"/uplinks/"+testAddr+"/declare", map[string]any{"pfc": "3", "pause": "off"}, &hp); code != 200 ||
		len(hp.Uplinks) != 1 || hp.Uplinks[0].Name != testAddr || hp.Uplinks[0].Declared != "pfc 3, pause off" {
		t.Errorf("declare the uplink: %d %+v", code, hp.Uplinks)
	}
	if code := call(t, f.srv, "POST", "/api/hosts/"+id+"/uplinks/"+testAddr+"/declare", map[string]any{"pfc": "9"}, &e); code != 400 || !strings.Contains(e["error"], "--pfc") {
		t.Errorf("declare a bad PFC priority: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/hosts/"+id+"/uplinks/eth9/declare", map[string]any{"pfc": "3"}, &e); code != 404 || !strings.Contains(e["error"], `no uplink "eth9"`) {
		t.Errorf("declare an uplink that is not there: %d %v", code, e)
	}
	var sw records.Switch
	if code := call(t, f.srv, "POST", "/api/switches", map[string]any{"name": "dvs2", "mtu": 1500}, &sw); code != 200 || sw.Name != "dvs2" || sw.UUID == "" || sw.UplinkPolicy != records.UplinkSingle {
		t.Fatalf("create switch: %d %+v", code, sw)
	}
	if code := call(t, f.srv, "POST", "/api/switches", map[string]any{"name": "dvs2", "mtu": 1500}, &e); code != 409 || !strings.Contains(e["error"], "already exists") {
		t.Errorf("create it again: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/switches", map[string]any{"name": "dvs3", "mtu": 100}, &e); code != 400 || !strings.Contains(e["error"], "mtu") {
		t.Errorf("a bad MTU: %d %v", code, e)
	}
	var pg records.PortGroup
	if code := call(t, f.srv, "POST", "/api/portgroups", map[string]any{"key": "dvportgroup-30", "switch": "dvs2", "vlan": 30, "pfc_priority": 4, "dscp": 34, "roce_version": "v1"}, &pg); code != 200 ||
		pg != (records.PortGroup{Key: "dvportgroup-30", Name: "dvportgroup-30", Switch: "dvs2", VLAN: 30, PFCPriority: 4, DSCP: 34, RoCEVersion: records.RoCEv1}) {
		t.Fatalf("create port group: %d %+v", code, pg)
	}
	if code := call(t, f.srv, "POST", "/api/portgroups", map[string]any{"key": "dvportgroup-31", "switch": "nosuch", "roce_version": "v2"}, &e); code != 409 || !strings.Contains(e["error"], "switch nosuch does not exist") {
		t.Errorf("a port group on no switch: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/portgroups", map[string]any{"key": "dvportgroup-32", "switch": "dvs2", "vlan": 5000, "roce_version": "v2"}, &e); code != 400 || !strings.Contains(e["error"], "vlan") {
		t.Errorf("a bad VLAN: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/portgroups/dvportgroup-30/set", map[string]any{"vlan": 31, "roce_version": "v2", "subnet": "10.9.0.0/24"}, &pg); code != 200 ||
		pg.VLAN != 31 || pg.RoCEVersion != records.RoCEv2 || pg.Subnet != "10.9.0.0/24" || pg.PFCPriority != 4 || pg.DSCP != 34 {
		t.Errorf("set the port group: %d %+v", code, pg)
	}
	if code := call(t, f.srv, "POST", "/api/portgroups/dvportgroup-30/set", map[string]any{"dscp": 64}, &e); code != 400 || !strings.Contains(e["error"], "dscp") {
		t.Errorf("a bad DSCP: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/portgroups/dvportgroup-99/set", map[string]any{"vlan": 1}, &e); code != 404 || !strings.Contains(e["error"], "port group dvportgroup-99: not found") {
		t.Errorf("set a port group that is not there: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/switches/dvs2/set", map[string]any{"network_policy": "warn", "mtu": 9000}, &sw); code != 200 || sw.NetworkPolicy != records.NetworkPolicy("warn") || sw.MTU != 9000 {
		t.Errorf("set the switch: %d %+v", code, sw)
	}
	if code := call(t, f.srv, "POST", "/api/switches/dvs2/set", map[string]any{}, &e); code != 400 || !strings.Contains(e["error"], "say what to change") {
		t.Errorf("set nothing: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/switches/dvs2/delete", map[string]any{}, &e); code != 409 || !strings.Contains(e["error"], "refused: port groups dvportgroup-30 are on it") {
		t.Errorf("delete a switch with a port group: %d %v", code, e)
	}

	var in vrdma.VMInfo
	if code := call(t, f.srv, "POST", "/api/vms", map[string]any{"name": "web", "memory_mb": 4, "guest_os": "ubuntu-64", "hw_version": 20}, &in); code != 200 || in.Name != "web" || !in.Managed || in.Power != "poweredOff" {
		t.Fatalf("create VM: %d %+v", code, in)
	}
	if code := call(t, f.srv, "POST", "/api/vms", map[string]any{"name": "bad", "memory_mb": 0, "guest_os": "ubuntu-64", "hw_version": 20}, &e); code != 400 || !strings.Contains(e["error"], "memSize") {
		t.Errorf("a VM with no memory: %d %v", code, e)
	}
	if r, err := f.ag.EditVM(ctx, "web", vrdma.VMEdit{AddAdapters: []vrdma.NewAdapter{{PortGroup: "dvportgroup-30"}}}); err != nil || r.Refused {
		t.Fatalf("add an adapter on dvportgroup-30: %+v %v", r, err)
	}
	if code := call(t, f.srv, "POST", "/api/portgroups/dvportgroup-30/delete", map[string]any{}, &e); code != 409 || !strings.Contains(e["error"], "refused: adapters web/vrdma0 are on it") {
		t.Errorf("delete a port group with an adapter on it: %d %v", code, e)
	}
	var d deleted
	if code := call(t, f.srv, "POST", "/api/vms/web/delete", map[string]any{}, &d); code != 200 || d.Deleted != "VM web" {
		t.Fatalf("delete VM web: %d %+v", code, d)
	}
	if code := call(t, f.srv, "POST", "/api/portgroups/dvportgroup-30/delete", map[string]any{}, &d); code != 200 || d.Deleted != "port group dvportgroup-30" {
		t.Errorf("delete the port group once its VM is gone: %d %+v", code, d)
	}
	if code := call(t, f.srv, "POST", "/api/switches/dvs2/delete", map[string]any{}, &d); code != 200 {
		t.Errorf("delete the switch once its port group is gone: %d %+v", code, d)
	}
	if code := call(t, f.srv, "POST", "/api/switches/dvs1/delete", map[string]any{}, &e); code != 409 || !strings.Contains(e["error"], "refused: port groups dvportgroup-10, dvportgroup-20 are on it") {
		t.Errorf("delete dvs1: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/switches/dvs9/delete", map[string]any{}, &e); code != 404 || !strings.Contains(e["error"], "switch dvs9: not found") {
		t.Errorf("delete a switch that is not there: %d %v", code, e)
	}
	if code := call(t, f.srv, "POST", "/api/portgroups/..%2Fswitches%2Fdvs1/delete", map[string]any{}, &e); code != 400 || !strings.Contains(e["error"], "the key") {
		t.Errorf("delete a port group whose key is a path: %d %v", code, e)
	}
	// An agent that cannot be read is named in the live view, which
	// still shows the others.
	f.reconfigure(t, func(c *Config) { c.Agents = []string{"/nonexistent/agent.sock"} })
	var l Live
	if code := call(t, f.srv, "GET", "/api/live", nil, &l); code != 200 || len(l.Errors) != 1 || !strings.Contains(l.Errors[0], "/nonexistent/agent.sock (--agent)") ||
		len(l.Hosts) != 1 || !l.Hosts[0].Agent || l.Hosts[0].Name != "esx1" {
		t.Errorf("GET /api/live with an agent that is not there: %d %+v", code, l)
	}
	// Writes need the console's header, as every write.
	if code := call(t, f.srv, "POST", "/api/switches/dvs1/delete", nil, &e); code != 403 {
		t.Errorf("a delete without the write header: %d %v", code, e)
	}
}
