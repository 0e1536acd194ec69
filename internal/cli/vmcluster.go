// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// The control plane's side of "vrdmactl vm": "vm list" stays the local
// agent's list (defined and attached VMs, over --socket); "vm list
// --cluster" lists every VM the control plane knows, on every host, and
// the inventory filters (--datacenter, --cluster C, --folder,
// --resource-pool, --host) narrow it; "vm show NAME" shows one with its
// adapters, where they are, and its VMX (from the local agent when the
// control plane does not know it).

// vmAdapterReport is one adapter of vm show.
type vmAdapterReport struct {
	records.Adapter
	Name   string `json:"name"`
	Switch string `json:"switch,omitempty"`
	VLAN   int    `json:"vlan"`
	// IPv4 is the adapter's address: its GID's IPv4 form while attached,
	// else its VMX's vrdmaN.ipAddress; omitted when it has none.
	IPv4 string `json:"ipv4,omitempty"`
}

// vmReport is one VM of vm list --cluster and vm show.
type vmReport struct {
	Name     string            `json:"name"`
	Host     string            `json:"host"`
	HostName string            `json:"host_name,omitempty"`
	HostUp   bool              `json:"host_up"`
	Power    string            `json:"power"`
	Owner    records.Owner     `json:"owner"`
	Managed  bool              `json:"managed"` // lives in the control plane (vm create); else on its host's agent (vm define)
	Adapters []vmAdapterReport `json:"adapters"`
	VMX      string            `json:"vmx,omitempty"`
	// Where it sits in the inventory; Datacenter is the VM's own or its
	// host's, Cluster its host's.
	Datacenter   string `json:"datacenter,omitempty"`
	Cluster      string `json:"cluster,omitempty"`
	Folder       string `json:"folder,omitempty"`
	ResourcePool string `json:"resource_pool,omitempty"`
}

func vmReportOf(cmd *cobra.Command, c *member.Cache, v records.VM, withVMX bool) vmReport {
	r := vmReport{Name: v.Name, Host: v.Host, Power: string(v.Power), Owner: v.Owner, Managed: v.Managed, Adapters: []vmAdapterReport{},
		Datacenter: v.Datacenter, Folder: v.Folder, ResourcePool: v.ResourcePool}
	if h, err := c.Host(cmd.Context(), v.Host); err == nil {
		r.HostName, r.HostUp = h.Host.Name, h.Host.State == records.HostUp
		r.Cluster = h.Host.Cluster
		if r.Datacenter == "" {
			r.Datacenter = h.Host.Datacenter
		}
	}
	if len(v.Adapters) == 0 {
		// Not attached: the adapters its VMX declares.
		r.Adapters = vmxAdapters(v.VMX)
	}
	for _, name := range v.Adapters {
		ad, err := c.Adapter(cmd.Context(), v.Name, name)
		if err != nil {
			continue
		}
		ar := vmAdapterReport{Adapter: ad, Name: name}
		if ad.GID.Is4In6() {
			ar.IPv4 = ad.GID.Unmap().String()
		}
		r.Adapters = append(r.Adapters, ar)
	}
	for i := range r.Adapters { // the port group's switch and VLAN
		ar := &r.Adapters[i]
		if p, err := c.PortGroup(cmd.Context(), ar.PortGroup); ar.PortGroup != "" && err == nil {
			ar.Switch, ar.VLAN = p.Switch, p.VLAN
		}
	}
	if withVMX {
		r.VMX = v.VMX
	}
	return r
}

// vmxAdapters lists the PVRDMA adapters a VMX declares, with their port
// groups (no GID or MAC: those exist while a workload is attached).
func vmxAdapters(vmxText string) []vmAdapterReport {
	out := []vmAdapterReport{}
	cfg, err := vmconfig.Parse([]byte(vmxText))
	if err != nil {
		return out
	}
	for _, ad := range cfg.Adapters {
		ar := vmAdapterReport{Adapter: records.Adapter{Index: ad.Index, PortGroup: ad.PortGroupID, NativeEndpoint: ad.NativeEndpoint}, Name: ad.Name()}
		if ad.IPv4.IsValid() {
			ar.IPv4 = ad.IPv4.String()
		}
		out = append(out, ar)
	}
	return out
}

// allClusters is --cluster given without a value: every VM of the
// control plane.
const allClusters = "*"

// vmFilter selects VMs of the inventory.
type vmFilter struct {
	datacenter, cluster, folder, pool, host string
}

// set reports whether any filter (or a bare --cluster) was given.
func (f *vmFilter) set() bool { return *f != vmFilter{} }

// under reports whether path is p or below it ("" matches all).
func under(path, p string) bool {
	return p == "" || path == p || strings.HasPrefix(path, p+"/")
}

func (f *vmFilter) match(r vmReport) bool {
	return (f.datacenter == "" || r.Datacenter == f.datacenter) &&
		(f.cluster == "" || f.cluster == allClusters || r.Cluster == f.cluster) &&
		under(r.Folder, f.folder) && under(r.ResourcePool, f.pool) &&
		(f.host == "" || r.Host == f.host || r.HostName == f.host)
}

// withClusterList adds --cluster and the inventory filters to the agent's
// vm list.
func (a *app) withClusterList(list *cobra.Command) *cobra.Command {
	var f vmFilter
	fl := list.Flags()
	fl.StringVar(&f.cluster, "cluster", "", "list the VMs of the control plane whose host is in cluster C; without C every VM, on every host")
	fl.Lookup("cluster").NoOptDefVal = allClusters
	fl.StringVar(&f.datacenter, "datacenter", "", "list the VMs of the control plane in datacenter D")
	fl.StringVar(&f.folder, "folder", "", "list the VMs of the control plane in folder F or below")
	fl.StringVar(&f.pool, "resource-pool", "", "list the VMs of the control plane in resource pool P or below")
	fl.StringVar(&f.host, "host", "", "list the VMs of the control plane on host H (name or ID)")
	list.Use = "list [--cluster [C]] [--datacenter D] [--folder F] [--resource-pool P] [--host H]"
	list.Long = `list shows the local agent's VMs (defined, or attached to a workload, or
managed and registered on its host). With --cluster it shows every VM the
control plane knows, on every host; --cluster C, --datacenter D, --folder F,
--resource-pool P and --host H keep those in that part of the inventory (the
cluster is the VM's host's; a folder or pool includes its sub-folders).`
	list.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) == 1 && f.cluster == allClusters {
			return nil // "--cluster C": C came out as an argument
		}
		return exactArgs(0)(cmd, args)
	}
	local := list.RunE
	list.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 1 {
			f.cluster = args[0]
		}
		if !f.set() {
			return local(cmd, args)
		}
		return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
			vms := []vmReport{}
			for _, v := range c.VMs() {
				if r := vmReportOf(cmd, c, v, false); f.match(r) {
					vms = append(vms, r)
				}
			}
			if a.json() {
				return a.printJSON(map[string]any{"vms": vms})
			}
			if len(vms) == 0 {
				if f != (vmFilter{cluster: allClusters}) {
					fmt.Fprintln(a.stdout, "no VMs of the control plane match")
				} else {
					fmt.Fprintln(a.stdout, "no VMs in the control plane (vm create makes one; a defined VM appears when its workload attaches)")
				}
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOST\tPOWER\tDATACENTER\tCLUSTER\tFOLDER\tPOOL\tADAPTERS")
			for _, v := range vms {
				var ads []string
				for _, ad := range v.Adapters {
					ads = append(ads, ad.Name+" "+ad.PortGroup)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, orDash(v.HostName), v.Power, orDash(v.Datacenter), orDash(v.Cluster),
					orDash(v.Folder), orDash(v.ResourcePool), orDash(strings.Join(ads, ", ")))
			}
			return tw.Flush()
		})
	}
	return list
}

// vmReportFromAgent is vm show's report of a VM the local agent knows and
// the control plane does not.
func vmReportFromAgent(in vrdma.VMInfo) vmReport {
	return vmReport{Name: in.Name, Host: in.HostID, HostName: in.Host, HostUp: true, Power: in.Power, Owner: records.Owner{UID: in.Owner.UID, GID: in.Owner.GID},
		Managed: in.Managed, Adapters: vmxAdapters(in.VMX), VMX: in.VMX, Datacenter: in.Datacenter, Folder: in.Folder, ResourcePool: in.ResourcePool}
}

func (a *app) vmShowCommand() *cobra.Command {
	var vmxOnly bool
	cmd := &cobra.Command{
		Use:   "show NAME [--vmx]",
		Short: "Show a VM: its host, power state, owner, inventory, adapters (GID, MAC, port group) and VMX",
		Long: `show prints a VM as the control plane knows it (its adapters' GIDs and MACs
while a workload is attached), or, for a VM the control plane does not know
(defined on this agent and not attached, or a standalone agent's), as the
local agent does. --vmx prints the VMX alone, byte for byte.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var r vmReport
			cpErr := a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				v, err := c.VM(cmd.Context(), args[0])
				if err != nil {
					return notFound(err, "VM "+args[0])
				}
				r = vmReportOf(cmd, c, v, true)
				return nil
			})
			if cpErr != nil {
				ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
				defer cancel()
				ag, err := a.dialAgent(ctx)
				if err != nil {
					return fmt.Errorf("vm show %s: %v; and no local agent to ask: %v", args[0], cpErr, err)
				}
				defer ag.Close()
				in, err := ag.VM(ctx, args[0])
				if err != nil {
					return fmt.Errorf("vm show %s: %v; nor on the local agent: %w", args[0], cpErr, err)
				}
				r = vmReportFromAgent(in)
			}
			if vmxOnly {
				_, err := io.WriteString(a.stdout, r.VMX)
				return err
			}
			if a.json() {
				return a.printJSON(r)
			}
			up := "down"
			if r.HostUp {
				up = "up"
			}
			kind := "no (kept by its host's agent)"
			if r.Managed {
				kind = "yes (in the control plane)"
			}
			fmt.Fprintf(a.stdout, "VM %s\n  host:      %s (%s, %s)\n  power:     %s\n  owner:     uid %d gid %d\n  managed:   %s\n",
				r.Name, orDash(r.HostName), orDash(r.Host), up, r.Power, r.Owner.UID, r.Owner.GID, kind)
			fmt.Fprintf(a.stdout, "  inventory: datacenter %s, cluster %s, folder %s, resource pool %s\n",
				orDash(r.Datacenter), orDash(r.Cluster), orDash(r.Folder), orDash(r.ResourcePool))
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  ADAPTER\tIPV4\tGID\tMAC\tPORT GROUP\tSWITCH\tVLAN")
			for _, ad := range r.Adapters {
				gid := "-"
				if ad.GID.IsValid() {
					gid = ad.GID.String()
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%d\n", ad.Name, orDash(ad.IPv4), gid, orDash(ad.MAC), orDash(ad.PortGroup), orDash(ad.Switch), ad.VLAN)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if r.VMX != "" {
				fmt.Fprintln(a.stdout, "  VMX:")
				for _, l := range strings.SplitAfter(strings.TrimSuffix(r.VMX, "\n"), "\n") {
					fmt.Fprintf(a.stdout, "    %s", strings.TrimSuffix(l, "\n")+"\n")
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&vmxOnly, "vmx", false, "print the VMX alone, byte for byte")
	return cmd
}
