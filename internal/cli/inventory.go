// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// The inventory tree, as vSphere's Hosts and Clusters
// view shows it: datacenter > cluster > host > VM, with each cluster's
// resource pools and each datacenter's VM folders. It is derived from the
// host and VM records: a host's datacenter, cluster and folder (vrdmactl
// host configure), a VM's datacenter, folder and resource pool (vrdmactl
// vm create); a VM's cluster is its host's.

// invVM is a VM in the inventory tree.
type invVM struct {
	Name         string `json:"name"`
	Power        string `json:"power"`
	Managed      bool   `json:"managed"`
	Folder       string `json:"folder,omitempty"`
	ResourcePool string `json:"resource_pool,omitempty"`
}

// invHost is a host in the inventory tree, with the VMs on it.
type invHost struct {
	Name   string  `json:"name"`
	ID     string  `json:"id"`
	State  string  `json:"state"`
	Folder string  `json:"folder,omitempty"` // its host folder
	VMs    []invVM `json:"vms"`
}

// invGroup is a resource pool or VM folder and the VMs in it.
type invGroup struct {
	Path string   `json:"path"`
	VMs  []string `json:"vms"`
}

// invCluster is a cluster: its hosts and resource pools.
type invCluster struct {
	Name          string     `json:"name"`
	Hosts         []invHost  `json:"hosts"`
	ResourcePools []invGroup `json:"resource_pools"`
}

// invDatacenter is a datacenter ("" for what is in none): its clusters,
// its hosts in no cluster, and its VM folders.
type invDatacenter struct {
	Name     string       `json:"name"`
	Clusters []invCluster `json:"clusters"`
	Hosts    []invHost    `json:"hosts"`
	Folders  []invGroup   `json:"folders"`
}

// inventoryOf builds the tree from the cache's hosts and VMs.
func inventoryOf(c *member.Cache) []invDatacenter {
	type hostAt struct {
		dc, cluster string
		h           *invHost
	}
	dcs := map[string]*invDatacenter{}
	dcOf := func(name string) *invDatacenter {
		d := dcs[name]
		if d == nil {
			d = &invDatacenter{Name: name, Clusters: []invCluster{}, Hosts: []invHost{}, Folders: []invGroup{}}
			dcs[name] = d
		}
		return d
	}
	hosts := map[string]*hostAt{}
	for _, h := range c.Hosts() {
		dcOf(h.Host.Datacenter)
		hosts[h.Host.ID] = &hostAt{dc: h.Host.Datacenter, cluster: h.Host.Cluster,
			h: &invHost{Name: h.Host.Name, ID: h.Host.ID, State: string(h.Host.State), Folder: h.Host.Folder, VMs: []invVM{}}}
	}
	pools := map[[2]string]map[string][]string{} // (dc, cluster) → pool → VMs
	folders := map[string]map[string][]string{}  // dc → folder → VMs
	for _, v := range c.VMs() {
		at := hosts[v.Host]
		if at == nil {
			// Its host has no record: show it under its ID.
			at = &hostAt{dc: v.Datacenter, h: &invHost{Name: orDash(v.Host), ID: v.Host, State: "unknown", VMs: []invVM{}}}
			hosts[v.Host] = at
		}
		dc := v.Datacenter
		if dc == "" {
			dc = at.dc
		}
		dcOf(dc)
		at.h.VMs = append(at.h.VMs, invVM{Name: v.Name, Power: string(v.Power), Managed: v.Managed, Folder: v.Folder, ResourcePool: v.ResourcePool})
		if v.ResourcePool != "" {
			k := [2]string{at.dc, at.cluster}
			if pools[k] == nil {
				pools[k] = map[string][]string{}
			}
			pools[k][v.ResourcePool] = append(pools[k][v.ResourcePool], v.Name)
		}
		if v.Folder != "" {
			if folders[dc] == nil {
				folders[dc] = map[string][]string{}
			}
			folders[dc][v.Folder] = append(folders[dc][v.Folder], v.Name)
		}
	}
	groups := func(m map[string][]string) []invGroup {
		out := []invGroup{}
		for p, vms := range m {
			slices.Sort(vms)
			out = append(out, invGroup{Path: p, VMs: vms})
		}
		slices.SortFunc(out, func(a, b invGroup) int { return strings.Compare(a.Path, b.Path) })
		return out
	}
	for _, at := range hosts {
		slices.SortFunc(at.h.VMs, func(a, b invVM) int { return strings.Compare(a.Name, b.Name) })
		d := dcOf(at.dc)
		if at.cluster == "" {
			d.Hosts = append(d.Hosts, *at.h)
			continue
		}
		i := slices.IndexFunc(d.Clusters, func(c invCluster) bool { return c.Name == at.cluster })
		if i < 0 {
			d.Clusters = append(d.Clusters, invCluster{Name: at.cluster, Hosts: []invHost{}, ResourcePools: groups(pools[[2]string{at.dc, at.cluster}])})
			i = len(d.Clusters) - 1
		}
		d.Clusters[i].Hosts = append(d.Clusters[i].Hosts, *at.h)
	}
	var out []invDatacenter
	for _, d := range dcs {
		d.Folders = groups(folders[d.Name])
		byName := func(a, b invHost) int { return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID)) }
		slices.SortFunc(d.Hosts, byName)
		slices.SortFunc(d.Clusters, func(a, b invCluster) int { return strings.Compare(a.Name, b.Name) })
		for i := range d.Clusters {
			slices.SortFunc(d.Clusters[i].Hosts, byName)
		}
		out = append(out, *d)
	}
	// Named datacenters first, then what is in none.
	slices.SortFunc(out, func(a, b invDatacenter) int {
		if (a.Name == "") != (b.Name == "") {
			if a.Name == "" {
				return 1
			}
			return -1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

func (a *app) inventoryCommand() *cobra.Command {
	var dc string
	cmd := &cobra.Command{
		Use:   "inventory [--datacenter D]",
		Short: "Show the inventory tree: datacenters, clusters, hosts, resource pools, folders and VMs",
		Long: `inventory shows the control plane's inventory as vSphere's Hosts and Clusters
view does: each datacenter, its clusters, their hosts and the VMs on each host
(with their folder and resource pool), each cluster's resource pools, and each
datacenter's VM folders. Hosts are placed with 'vrdmactl host configure H
--datacenter D --cluster C', VMs with 'vrdmactl vm create --datacenter D
--folder F --resource-pool P'; 'vrdmactl vm list --datacenter D --cluster C'
lists the VMs of one part.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				tree := []invDatacenter{}
				for _, d := range inventoryOf(c) {
					if dc == "" || d.Name == dc {
						tree = append(tree, d)
					}
				}
				if a.json() {
					return a.printJSON(map[string]any{"datacenters": tree})
				}
				if len(tree) == 0 {
					fmt.Fprintln(a.stdout, "nothing in the inventory")
					return nil
				}
				for _, d := range tree {
					if d.Name == "" {
						fmt.Fprintln(a.stdout, "(no datacenter)")
					} else {
						fmt.Fprintf(a.stdout, "datacenter %s\n", d.Name)
					}
					for _, c := range d.Clusters {
						fmt.Fprintf(a.stdout, "  cluster %s\n", c.Name)
						for _, h := range c.Hosts {
							a.printInvHost(h, "    ")
						}
						for _, p := range c.ResourcePools {
							fmt.Fprintf(a.stdout, "    resource pool %s: %s\n", p.Path, strings.Join(p.VMs, ", "))
						}
					}
					for _, h := range d.Hosts {
						a.printInvHost(h, "  ")
					}
					for _, f := range d.Folders {
						fmt.Fprintf(a.stdout, "  folder %s: %s\n", f.Path, strings.Join(f.VMs, ", "))
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&dc, "datacenter", "", "show datacenter D only")
	return cmd
}

func (a *app) printInvHost(h invHost, indent string) {
	folder := ""
	if h.Folder != "" {
		folder = ", folder " + h.Folder
	}
	fmt.Fprintf(a.stdout, "%shost %s (%s%s)\n", indent, h.Name, h.State, folder)
	for _, v := range h.VMs {
		var at []string
		if v.Folder != "" {
			at = append(at, "folder "+v.Folder)
		}
		if v.ResourcePool != "" {
			at = append(at, "pool "+v.ResourcePool)
		}
		extra := ""
		if len(at) > 0 {
			extra = ", " + strings.Join(at, ", ")
		}
		fmt.Fprintf(a.stdout, "%s  vm %s (%s%s)\n", indent, v.Name, v.Power, extra)
	}
}

// hostConfigureCommand is "vrdmactl host configure": ESXi's "Configure an
// ESXi host for PVRDMA" (tag a vmknic, enable the pvrdma firewall rule),
// and the host's place in the inventory.
func (a *app) hostConfigureCommand() *cobra.Command {
	var addr, vmknic, firewall, maint, namespaces string
	var inv records.Inventory
	cmd := &cobra.Command{
		Use:   "configure ID|NAME [--pvrdma-address ADDR:PORT|none] [--firewall-pvrdma on|off] [--pvrdma-namespaces on|off] [--datacenter D] [--cluster C] [--folder F]",
		Short: "Configure a host for PVRDMA (tagged address, pvrdma firewall rule) and place it in the inventory",
		Long: `configure changes a host's record in the control plane, as vSphere's
"Configure an ESXi host for PVRDMA" does: --pvrdma-address tags the address
that carries PVRDMA traffic between hosts (Net.PVRDMAVmknic; "none" removes the
tag; an address without a port keeps the current port), --firewall-pvrdma
turns the host's pvrdma firewall rule on or off, --pvrdma-namespaces turns PVRDMA
namespaces on or off for the host's RDMA uplink (native endpoints need them: a
VM with vrdmaX.nativeEndpointSupport = "TRUE" powers on only on a host with an
RDMA uplink and namespaces on, rule host-native-endpoint; turning them off
changes no VM already powered on). --datacenter, --cluster and
--folder place the host in the inventory; --maintenance on keeps new VMs and
connections off it. Only the flags given change.

The host's running agent applies a change of its PVRDMA address or firewall
rule at once: it moves its listener to the new address (dropping connections
made from the old one, which QPs remake within their retry budget), or drops
every connection with other hosts and refuses new ones while the rule is off.
'vrdmactl status' on that host shows where it listens. What configure sets survives
a restart of the host's agent, unless the agent is started with its own
--pvrdma-address or --firewall-pvrdma, which then win.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			var fw, mt, ns bool
			var err error
			if fl.Changed("pvrdma-namespaces") {
				if ns, err = parseOnOff("pvrdma-namespaces", namespaces); err != nil {
					return err
				}
			}
			if fl.Changed("firewall-pvrdma") {
				if fw, err = parseOnOff("firewall-pvrdma", firewall); err != nil {
					return err
				}
			}
			if fl.Changed("maintenance") {
				if mt, err = parseOnOff("maintenance", maint); err != nil {
					return err
				}
			}
			ch := admin.HostChange{PVRDMAAddress: ifChanged(fl, "pvrdma-address", &addr), Vmknic: ifChanged(fl, "vmknic", &vmknic),
				FirewallPVRDMA: ifChanged(fl, "firewall-pvrdma", &fw), PVRDMANamespaces: ifChanged(fl, "pvrdma-namespaces", &ns), Maintenance: ifChanged(fl, "maintenance", &mt),
				Datacenter: ifChanged(fl, "datacenter", &inv.Datacenter), Cluster: ifChanged(fl, "cluster", &inv.Cluster), Folder: ifChanged(fl, "folder", &inv.Folder)}
			if ch.Empty() {
				return usageErrorf("host configure: say what to change (--pvrdma-address, --firewall-pvrdma, --pvrdma-namespaces, --datacenter, --cluster, --folder, --vmknic, --maintenance)")
			}
			var out hostReport
			err = a.withCache(cmd.Context(), func(st *store.Store, c *member.Cache) error {
				hs, err := admin.ConfigureHost(cmd.Context(), st, c, args[0], ch)
				if err != nil {
					return adminErr(err)
				}
				out = hostReportOf(hs)
				return nil
			})
			if err != nil {
				return cmdErr("host configure "+args[0], err)
			}
			if a.json() {
				return a.printJSON(out)
			}
			fmt.Fprintf(a.stdout, "host %s (%s) configured: PVRDMA address %s, pvrdma firewall rule %s, PVRDMA namespaces %s, datacenter %s, cluster %s, folder %s\n",
				out.Name, out.ID, orDash(out.PVRDMAAddress), onOff(out.FirewallPVRDMA), onOff(out.PVRDMANamespaces), orDash(out.Datacenter), orDash(out.Cluster), orDash(out.Folder))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "pvrdma-address", "", "ADDR:PORT that carries PVRDMA traffic between hosts (Net.PVRDMAVmknic), or none")
	f.StringVar(&vmknic, "vmknic", "", "the interface that holds the PVRDMA address (e.g. vmk1), for people")
	f.StringVar(&firewall, "firewall-pvrdma", "", "the host's pvrdma firewall rule: on or off")
	f.StringVar(&namespaces, "pvrdma-namespaces", "", "PVRDMA namespaces on the host's RDMA uplink, as native endpoints need: on or off")
	f.StringVar(&inv.Datacenter, "datacenter", "", "the host's datacenter (\"\" removes it)")
	f.StringVar(&inv.Cluster, "cluster", "", "the host's cluster (\"\" removes it)")
	f.StringVar(&inv.Folder, "folder", "", "the host's folder, a path such as rack1/row2")
	f.StringVar(&maint, "maintenance", "", "maintenance mode: on or off")
	return cmd
}
