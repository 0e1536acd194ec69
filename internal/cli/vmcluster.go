package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// The control plane's side of "vrdmactl vm": "vm list" stays the local
// agent's list (defined and attached VMs, over --socket); "vm list
// --cluster" lists every VM the control plane knows, on every host; "vm
// show NAME" shows one with its adapters and where they are.

// vmAdapterReport is one adapter of vm show.
type vmAdapterReport struct {
	records.Adapter
	Name   string `json:"name"`
	Switch string `json:"switch,omitempty"`
	VLAN   int    `json:"vlan"`
}

// vmReport is one VM of vm list --cluster and vm show.
type vmReport struct {
	Name     string            `json:"name"`
	Host     string            `json:"host"`
	HostName string            `json:"hostName,omitempty"`
	HostUp   bool              `json:"hostUp"`
	Power    string            `json:"power"`
	Owner    records.Owner     `json:"owner"`
	Adapters []vmAdapterReport `json:"adapters"`
	VMX      string            `json:"vmx,omitempty"`
}

func vmReportOf(cmd *cobra.Command, c *member.Cache, v records.VM, withVMX bool) vmReport {
	r := vmReport{Name: v.Name, Host: v.Host, Power: string(v.Power), Owner: v.Owner, Adapters: []vmAdapterReport{}}
	if h, err := c.Host(cmd.Context(), v.Host); err == nil {
		r.HostName, r.HostUp = h.Host.Name, h.Host.State == records.HostUp
	}
	for _, name := range v.Adapters {
		ad, err := c.Adapter(cmd.Context(), v.Name, name)
		if err != nil {
			continue
		}
		ar := vmAdapterReport{Adapter: ad, Name: name}
		if p, err := c.PortGroup(cmd.Context(), ad.PortGroup); err == nil {
			ar.Switch, ar.VLAN = p.Switch, p.VLAN
		}
		r.Adapters = append(r.Adapters, ar)
	}
	if withVMX {
		r.VMX = v.VMX
	}
	return r
}

// withClusterList adds --cluster to the agent's vm list.
func (a *app) withClusterList(list *cobra.Command) *cobra.Command {
	var cluster bool
	list.Flags().BoolVar(&cluster, "cluster", false, "list every VM of the control plane, on every host (not only this agent's)")
	list.Long = `list shows the local agent's VMs (defined, or attached to a workload). With
--cluster it shows every VM the control plane knows, on every host.`
	local := list.RunE
	list.RunE = func(cmd *cobra.Command, args []string) error {
		if !cluster {
			return local(cmd, args)
		}
		return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
			vms := []vmReport{}
			for _, v := range c.VMs() {
				vms = append(vms, vmReportOf(cmd, c, v, false))
			}
			if a.json() {
				return a.printJSON(map[string]any{"vms": vms})
			}
			if len(vms) == 0 {
				fmt.Fprintln(a.stdout, "no VMs in the control plane (a VM appears when its workload attaches)")
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tHOST\tPOWER\tADAPTERS")
			for _, v := range vms {
				var ads []string
				for _, ad := range v.Adapters {
					ads = append(ads, ad.Name+" "+ad.PortGroup)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Name, orDash(v.HostName), v.Power, orDash(strings.Join(ads, ", ")))
			}
			return tw.Flush()
		})
	}
	return list
}

func (a *app) vmShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Show a VM of the control plane: its host, adapters (GID, MAC, port group) and VMX",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				v, err := c.VM(cmd.Context(), args[0])
				if err != nil {
					return notFound(err, "VM "+args[0])
				}
				r := vmReportOf(cmd, c, v, true)
				if a.json() {
					return a.printJSON(r)
				}
				up := "down"
				if r.HostUp {
					up = "up"
				}
				fmt.Fprintf(a.stdout, "VM %s\n  host:  %s (%s, %s)\n  power: %s\n  owner: uid %d\n", r.Name, orDash(r.HostName), r.Host, up, r.Power, r.Owner.UID)
				tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "  ADAPTER\tGID\tMAC\tPORT GROUP\tSWITCH\tVLAN")
				for _, ad := range r.Adapters {
					fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\n", ad.Name, ad.GID, ad.MAC, ad.PortGroup, orDash(ad.Switch), ad.VLAN)
				}
				return tw.Flush()
			})
		},
	}
}
