// SPDX-License-Identifier: Apache-2.0

package member

import (
	"context"
	"errors"
	"fmt"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/rules"
	"github.com/vrdma/vrdma/internal/vmconfig"
	"github.com/vrdma/vrdma/internal/vmx"
)

// Placement check IDs: the power-on checks beyond package rules, which
// need the control plane (docs/control-plane.md).
const (
	CheckHostUp          = "host-up"          // the host holds its lease and is not in maintenance
	CheckHostDatacenter  = "host-datacenter"  // the VM's datacenter is the host's
	CheckPortGroupExists = "portgroup-exists" // each adapter's port group exists, on the host's switch
	CheckPortGroupSwitch = "portgroup-switch" // each adapter's dvs.switchId names its port group's switch
)

// RulesHost is host record h as the host rules of package rules see it.
func RulesHost(h records.Host) *rules.Host {
	return &rules.Host{Name: h.Name, PVRDMAAddress: h.PVRDMAAddress, FirewallPVRDMA: h.FirewallPVRDMA, Switch: h.Switch,
		Namespaces: h.PVRDMANamespaces, RDMAUplink: len(h.Uplinks) > 0}
}

// PlacementFindings runs the placement checks of VM file f (named vm, in
// datacenter dc; "" skips the datacenter check) against host h, as the
// cache sees the control plane: what vm power-on checks beyond the rules,
// and vmx check --host with it. h.State is the effective state (down when
// the host holds no lease).
func (c *Cache) PlacementFindings(ctx context.Context, f *vmx.File, h records.Host, vm, dc string) []rules.Finding {
	var out []rules.Finding
	add := func(id, key, format string, args ...any) {
		fd := rules.Finding{Rule: id, Severity: rules.SeverityError, Key: key, Message: fmt.Sprintf(format, args...)}
		if key != "" {
			fd.Line = f.Line(key)
		}
		out = append(out, fd)
	}
	switch h.State {
	case records.HostDown:
		add(CheckHostUp, "", "host %s is down (its agent holds no lease): start its vrdmad, or power the VM on on another host (--host)", h.Label())
	case records.HostMaintenance:
		add(CheckHostUp, "", "host %s is in maintenance mode: take it out of maintenance, or power the VM on on another host (--host)", h.Label())
	}
	if dc != "" && dc != h.Datacenter {
		in := "in " + h.Datacenter
		if h.Datacenter == "" {
			in = "in no datacenter"
		}
		add(CheckHostDatacenter, "", "VM %s is in datacenter %s, host %s %s: power it on on a host of %s (--host), or place the host there (vrdmactl host configure %s --datacenter %s)",
			vm, dc, h.Label(), in, dc, h.Name, dc)
	}
	cfg, err := vmconfig.FromFile(f)
	if err != nil {
		return out
	}
	for _, ad := range cfg.Adapters {
		if ad.PortGroupID == "" {
			continue // rule distributed-portgroup says so
		}
		key := fmt.Sprintf("ethernet%d.dvs.portgroupId", ad.Index)
		p, err := c.PortGroup(ctx, ad.PortGroupID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			add(CheckPortGroupExists, key, "port group %s of PVRDMA adapter ethernet%d does not exist in the control plane: create it (vrdmactl portgroup create %s --switch SWITCH) or move the adapter to an existing one",
				ad.PortGroupID, ad.Index, ad.PortGroupID)
		case err == nil && h.Switch != "" && p.Switch != h.Switch:
			add(CheckPortGroupExists, key, "port group %s of PVRDMA adapter ethernet%d is on switch %s, and host %s is on switch %s: power the VM on on a host of %s, or move the adapter to a port group of %s",
				ad.PortGroupID, ad.Index, p.Switch, h.Label(), h.Switch, p.Switch, h.Switch)
		}
		if err != nil || ad.SwitchID == "" || ad.SwitchID == p.Switch {
			continue
		}
		// ethernetN.dvs.switchId must name the port group's switch, by its
		// UUID as vSphere writes it (or by name).
		skey := fmt.Sprintf("ethernet%d.dvs.switchId", ad.Index)
		if sw, err := c.Switch(ctx, p.Switch); err == nil && !records.SameUUID(ad.SwitchID, sw.UUID) {
			add(CheckPortGroupSwitch, skey, "PVRDMA adapter ethernet%d names switch %q, but its port group %s is on switch %s (UUID %s): set %s = \"%s\" (vrdmactl vm set), or move the adapter to a port group of its switch",
				ad.Index, ad.SwitchID, ad.PortGroupID, sw.Name, sw.UUID, skey, sw.UUID)
		}
	}
	return out
}
