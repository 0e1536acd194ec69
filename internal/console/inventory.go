// SPDX-License-Identifier: Apache-2.0

package console

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// The inventory as the console's tree shows it: switches → port groups →
// hosts → VMs. A host is under each port group of its switch; under a
// port group it shows the VMs with an adapter on that port group. VMs
// with no adapter on a port group of a known switch are listed
// apart (Unplaced), by host, so that a new VM can be found and given
// one.

// Inventory is GET /api/inventory.
type Inventory struct {
	// Control says there is a control plane; ControlError why not.
	Control      bool         `json:"control"`
	ControlError string       `json:"control_error,omitempty"`
	Switches     []SwitchNode `json:"switches"`
	Unplaced     []HostNode   `json:"unplaced"`
	// Hosts are the control plane's hosts, for the new VM form's choice.
	Hosts []HostChoice `json:"hosts"`
	// Local are the local agent's VMs (without a control plane, all
	// there is to show).
	LocalHost  string    `json:"local_host,omitempty"`
	Local      []VMNode  `json:"local"`
	LocalError string    `json:"local_error,omitempty"`
	Time       time.Time `json:"time"`
}

// SwitchNode is a distributed switch and its port groups.
type SwitchNode struct {
	Name          string          `json:"name"`
	UUID          string          `json:"uuid"`
	MTU           int             `json:"mtu"`
	UplinkPolicy  string          `json:"uplink_policy"`
	NetworkPolicy string          `json:"network_policy"` // the effective one: strict, warn or off
	PortGroups    []PortGroupNode `json:"portgroups"`
}

// PortGroupNode is a port group with the hosts of its switch.
type PortGroupNode struct {
	Key         string     `json:"key"`
	Name        string     `json:"name"`
	VLAN        int        `json:"vlan"`
	PFCPriority int        `json:"pfc_priority"`
	DSCP        int        `json:"dscp"`
	RoCEVersion string     `json:"roce_version"`
	RoCEMTU     int        `json:"roce_mtu"` // 0: the largest the switch's MTU carries
	Subnet      string     `json:"subnet,omitempty"`
	Hosts       []HostNode `json:"hosts"`
}

// HostNode is a host with the VMs on it that belong where it is shown.
type HostNode struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	State     string   `json:"state"`
	LeaseAgeS float64  `json:"lease_age_s"`
	Uplinks   []string `json:"uplinks"`
	VMs       []VMNode `json:"vms"`
}

// VMNode is a VM: its power state and its PVRDMA adapters.
type VMNode struct {
	Name     string        `json:"name"`
	Power    string        `json:"power"`
	Adapters []AdapterNode `json:"adapters"`
}

// AdapterNode is one PVRDMA adapter of a VM, its port group's key, and
// whether it is connected at power on (ethernetN.startConnected; vm
// connect and disconnect change a running adapter, not this).
type AdapterNode struct {
	Name           string `json:"name"`
	PortGroup      string `json:"portgroup"`
	StartConnected bool   `json:"start_connected"`
}

// adaptersOfVMX returns a VMX's PVRDMA adapters (none if it does not
// parse).
func adaptersOfVMX(text string) []AdapterNode {
	out := []AdapterNode{}
	cfg, err := vmconfig.Parse([]byte(text))
	if err != nil {
		return out
	}
	for _, ad := range cfg.Adapters {
		out = append(out, AdapterNode{Name: ad.Name(), PortGroup: ad.PortGroupID, StartConnected: ad.StartConnected})
	}
	return out
}

func (s *server) inventory(ctx context.Context, _ *http.Request) (any, error) {
	inv := Inventory{Control: s.cfg.Cache != nil, ControlError: s.cfg.ControlErr, Switches: []SwitchNode{}, Unplaced: []HostNode{}, Local: []VMNode{}, Time: time.Now().UTC()}
	inv.Hosts = hostChoices(s.cfg.Cache)
	if s.cfg.Cache != nil {
		inv.Switches, inv.Unplaced = tree(s.cfg.Cache, inv.Time)
	}
	if ag, err := s.agent(ctx); err != nil {
		inv.LocalError = err.Error()
	} else {
		defer ag.Close()
		st, err := ag.Status(ctx)
		if err != nil {
			inv.LocalError = "the agent's status: " + err.Error()
		}
		inv.LocalHost = st.Host
		for _, v := range st.VMs {
			n := VMNode{Name: v.Name, Power: v.Power, Adapters: []AdapterNode{}}
			for _, ad := range v.Adapters {
				n.Adapters = append(n.Adapters, AdapterNode{Name: ad.Name})
			}
			inv.Local = append(inv.Local, n)
		}
	}
	return inv, nil
}

// hostNode returns h's node, with no VMs.
func hostNode(h member.HostStatus, now time.Time) HostNode {
	n := HostNode{ID: h.Host.ID, Name: h.Host.Name, State: string(h.Host.State), LeaseAgeS: h.LeaseAge(now).Round(10 * time.Millisecond).Seconds(), Uplinks: []string{}, VMs: []VMNode{}}
	for _, u := range h.Host.Uplinks {
		t := string(u.Kind) + " " + u.Address.String()
		if u.Device != "" {
			t += " (" + u.Device + ")"
		}
		n.Uplinks = append(n.Uplinks, t)
	}
	return n
}

// tree builds the switches' tree and the unplaced VMs from the cache.
func tree(c *member.Cache, now time.Time) ([]SwitchNode, []HostNode) {
	hosts := c.Hosts()
	vms := c.VMs()
	adapters := map[string][]AdapterNode{}
	for _, v := range vms {
		adapters[v.Name] = adaptersOfVMX(v.VMX)
	}
	pgSwitch := map[string]string{}
	for _, pg := range c.PortGroups() {
		pgSwitch[pg.Key] = pg.Switch
	}
	// vmsOn returns the VMs on host h with an adapter that satisfies in.
	vmsOn := func(h string, in func(AdapterNode) bool) []VMNode {
		out := []VMNode{}
		for _, v := range vms {
			if v.Host != h || !slices.ContainsFunc(adapters[v.Name], in) {
				continue
			}
			out = append(out, VMNode{Name: v.Name, Power: string(v.Power), Adapters: adapters[v.Name]})
		}
		return out
	}
	switches := []SwitchNode{}
	for _, sw := range c.Switches() {
		sn := SwitchNode{Name: sw.Name, UUID: sw.UUID, MTU: sw.MTU, UplinkPolicy: string(sw.UplinkPolicy), NetworkPolicy: string(sw.NetworkPolicy.Effective()), PortGroups: []PortGroupNode{}}
		for _, pg := range c.PortGroups() {
			if pg.Switch != sw.Name {
				continue
			}
			pn := PortGroupNode{Key: pg.Key, Name: pg.Name, VLAN: pg.VLAN, PFCPriority: pg.PFCPriority, DSCP: pg.DSCP, RoCEVersion: string(pg.RoCEVersion), RoCEMTU: pg.RoCEMTU, Subnet: pg.Subnet, Hosts: []HostNode{}}
			for _, h := range hosts {
				if h.Host.Switch != sw.Name {
					continue
				}
				hn := hostNode(h, now)
				hn.VMs = vmsOn(h.Host.ID, func(a AdapterNode) bool { return a.PortGroup == pg.Key })
				pn.Hosts = append(pn.Hosts, hn)
			}
			sn.PortGroups = append(sn.PortGroups, pn)
		}
		slices.SortFunc(sn.PortGroups, func(a, b PortGroupNode) int { return cmp.Compare(a.Key, b.Key) })
		switches = append(switches, sn)
	}
	unplaced := []HostNode{}
	for _, h := range hosts {
		hn := hostNode(h, now)
		for _, v := range vms {
			if v.Host != h.Host.ID || slices.ContainsFunc(adapters[v.Name], func(a AdapterNode) bool { return pgSwitch[a.PortGroup] != "" }) {
				continue
			}
			hn.VMs = append(hn.VMs, VMNode{Name: v.Name, Power: string(v.Power), Adapters: adapters[v.Name]})
		}
		if len(hn.VMs) > 0 {
			unplaced = append(unplaced, hn)
		}
	}
	return switches, unplaced
}

// PortGroupChoice is a port group an adapter may be added on.
type PortGroupChoice struct {
	Key    string `json:"key"`
	Name   string `json:"name"`
	Switch string `json:"switch"`
	VLAN   int    `json:"vlan"`
}

// portGroups lists the control plane's port groups, for the adapter
// form's choice.
func portGroups(c *member.Cache) []PortGroupChoice {
	out := []PortGroupChoice{}
	if c == nil {
		return out
	}
	for _, pg := range c.PortGroups() {
		out = append(out, PortGroupChoice{Key: pg.Key, Name: pg.Name, Switch: pg.Switch, VLAN: pg.VLAN})
	}
	slices.SortFunc(out, func(a, b PortGroupChoice) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// HostChoice is a host a VM may be powered on on.
type HostChoice struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	State string `json:"state"`
}

// hostChoices lists the control plane's hosts by name, for the power-on
// form's choice.
func hostChoices(c *member.Cache) []HostChoice {
	out := []HostChoice{}
	if c == nil {
		return out
	}
	for _, h := range c.Hosts() {
		out = append(out, HostChoice{ID: h.Host.ID, Name: h.Host.Name, State: string(h.Host.State)})
	}
	slices.SortFunc(out, func(a, b HostChoice) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID)) })
	return out
}
