package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// hostReport is one host as host list and host show print it.
type hostReport struct {
	ID             string           `json:"id"`
	Name           string           `json:"name"`
	State          string           `json:"state"`    // effective: down when no live lease
	Declared       string           `json:"declared"` // as the record says
	Switch         string           `json:"switch"`
	PVRDMAAddress  string           `json:"pvrdmaAddress"`
	FirewallPVRDMA bool             `json:"firewallPvrdma"`
	Uplinks        []records.Uplink `json:"uplinks"`
	AgentVersion   string           `json:"agentVersion"`
	LeaseAgeS      float64          `json:"leaseAgeS"` // how long it has held its lease; 0 when down
	VMs            []string         `json:"vms,omitempty"`
	Datacenter     string           `json:"datacenter,omitempty"` // its place in the inventory
	Cluster        string           `json:"cluster,omitempty"`
	Folder         string           `json:"folder,omitempty"`
}

func hostReportOf(h member.HostStatus) hostReport {
	r := hostReport{ID: h.Host.ID, Name: h.Host.Name, State: string(h.Host.State), Declared: string(h.Declared), Switch: h.Host.Switch,
		FirewallPVRDMA: h.Host.FirewallPVRDMA, Uplinks: h.Host.Uplinks, AgentVersion: h.Host.AgentVersion,
		LeaseAgeS: round2(h.LeaseAge(time.Now()).Seconds()), Datacenter: h.Host.Datacenter, Cluster: h.Host.Cluster, Folder: h.Host.Folder}
	if h.Host.PVRDMAAddress.IsValid() {
		r.PVRDMAAddress = h.Host.PVRDMAAddress.String()
	}
	if r.Uplinks == nil {
		r.Uplinks = []records.Uplink{}
	}
	return r
}

func uplinksText(us []records.Uplink) string {
	if len(us) == 0 {
		return "-"
	}
	var s []string
	for _, u := range us {
		t := string(u.Kind) + " " + u.Address.String()
		if u.Device != "" {
			t += " (" + u.Device + ")"
		}
		s = append(s, t)
	}
	return strings.Join(s, ", ")
}

func leaseAge(s float64) string {
	if s == 0 {
		return "-"
	}
	return (time.Duration(s*1000) * time.Millisecond).Round(time.Second).String()
}

// hostCommand is "vrdmactl host": the hosts registered in the control
// plane, with their liveness.
func (a *app) hostCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "List, show and configure the hosts of the control plane",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("host: name a subcommand: list, show or configure")
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the hosts: state (up while the agent holds its lease), switch, uplinks, lease age",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				hosts := []hostReport{}
				for _, h := range c.Hosts() {
					hosts = append(hosts, hostReportOf(h))
				}
				if a.json() {
					return a.printJSON(map[string]any{"hosts": hosts})
				}
				if len(hosts) == 0 {
					fmt.Fprintln(a.stdout, "no hosts: start vrdmad")
					return nil
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tID\tSTATE\tSWITCH\tPVRDMA ADDRESS\tFIREWALL\tUPLINKS\tLEASE AGE\tVERSION")
				for _, h := range hosts {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, h.ID, h.State, orDash(h.Switch), orDash(h.PVRDMAAddress),
						onOff(h.FirewallPVRDMA), uplinksText(h.Uplinks), leaseAge(h.LeaseAgeS), h.AgentVersion)
				}
				return tw.Flush()
			})
		},
	}
	show := &cobra.Command{
		Use:   "show ID|NAME",
		Short: "Show a host, with its uplinks and VMs",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				var found []member.HostStatus
				for _, h := range c.Hosts() {
					if h.Host.ID == args[0] || h.Host.Name == args[0] {
						found = append(found, h)
					}
				}
				switch {
				case len(found) == 0:
					return fmt.Errorf("host %s: not found in the control plane", args[0])
				case len(found) > 1:
					var ids []string
					for _, h := range found {
						ids = append(ids, h.Host.ID)
					}
					return fmt.Errorf("host name %s is ambiguous: name one of the host IDs %s", args[0], strings.Join(ids, ", "))
				}
				r := hostReportOf(found[0])
				for _, v := range c.VMs() {
					if v.Host == r.ID {
						r.VMs = append(r.VMs, v.Name)
					}
				}
				if a.json() {
					return a.printJSON(r)
				}
				fmt.Fprintf(a.stdout, "host %s (%s)\n  state:          %s (declared %s)\n  lease age:      %s\n  switch:         %s\n  PVRDMA address: %s\n  firewall:       pvrdma %s\n  agent:          %s\n",
					r.Name, r.ID, r.State, r.Declared, leaseAge(r.LeaseAgeS), orDash(r.Switch), orDash(r.PVRDMAAddress), onOff(r.FirewallPVRDMA), r.AgentVersion)
				fmt.Fprintf(a.stdout, "  RDMA uplinks:   %d\n", len(r.Uplinks))
				for _, u := range r.Uplinks {
					fmt.Fprintf(a.stdout, "    %s %s GID %s %s\n", u.Kind, u.Address, u.GID, strings.Join(u.Capabilities, ","))
				}
				fmt.Fprintf(a.stdout, "  inventory:      datacenter %s, cluster %s, folder %s\n", orDash(r.Datacenter), orDash(r.Cluster), orDash(r.Folder))
				fmt.Fprintf(a.stdout, "  VMs:            %s\n", orDash(strings.Join(r.VMs, ", ")))
				return nil
			})
		},
	}
	cmd.AddCommand(list, show, a.hostConfigureCommand()) // inventory.go
	return cmd
}
