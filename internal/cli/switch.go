package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// switchCommand is "vrdmactl switch": distributed switches in the control
// plane.
func (a *app) switchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "switch",
		Short: "Create, list and show distributed switches (control plane)",
		Long: `switch manages the distributed switches of the control plane: the set of hosts
and port groups between which VMs talk PVRDMA. Hosts join a switch with
vrdmad --switch NAME. See --etcd-endpoints and --state-dir for where the
control plane is.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("switch: name a subcommand: create, list or show")
		},
	}
	var sw records.Switch
	var policy string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create distributed switch NAME",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s := sw
			s.Name, s.UplinkPolicy = args[0], records.UplinkPolicy(policy)
			if s.UUID == "" {
				s.UUID = randomUUID()
			}
			if err := s.Validate(); err != nil {
				return usageErrorf("switch create: %v", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			st, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			if _, err := st.Create(ctx, records.SwitchKey(s.Name), s); err != nil {
				if errors.Is(err, store.ErrExists) {
					return fmt.Errorf("switch create: switch %s already exists", s.Name)
				}
				return fmt.Errorf("switch create %s: %w", s.Name, err)
			}
			if a.json() {
				return a.printJSON(s)
			}
			fmt.Fprintf(a.stdout, "switch %s created (UUID %s, MTU %d, uplink policy %s)\n", s.Name, s.UUID, s.MTU, s.UplinkPolicy)
			return nil
		},
	}
	create.Flags().IntVar(&sw.MTU, "mtu", 9000, "MTU (1280..9000)")
	create.Flags().StringVar(&sw.UUID, "uuid", "", "the vDS UUID (default: a random one)")
	create.Flags().StringVar(&policy, "uplink-policy", string(records.UplinkSingle), "single (each host's RDMA uplink is its only one) or failover")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the distributed switches",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				sws := c.Switches()
				if a.json() {
					if sws == nil {
						sws = []records.Switch{}
					}
					return a.printJSON(map[string]any{"switches": sws})
				}
				if len(sws) == 0 {
					fmt.Fprintln(a.stdout, "no switches: create one with 'vrdmactl switch create NAME'")
					return nil
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tUUID\tMTU\tUPLINK POLICY\tPORT GROUPS\tHOSTS")
				for _, s := range sws {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\n", s.Name, s.UUID, s.MTU, s.UplinkPolicy, len(portGroupsOf(c, s.Name)), len(hostsOf(c, s.Name)))
				}
				return tw.Flush()
			})
		},
	}
	show := &cobra.Command{
		Use:   "show NAME",
		Short: "Show a distributed switch with its port groups and hosts",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				s, err := c.Switch(cmd.Context(), args[0])
				if err != nil {
					return notFound(err, "switch "+args[0])
				}
				pgs := portGroupsOf(c, s.Name)
				var hosts []hostReport
				for _, h := range hostsOf(c, s.Name) {
					hosts = append(hosts, hostReportOf(h))
				}
				if a.json() {
					if pgs == nil {
						pgs = []records.PortGroup{}
					}
					if hosts == nil {
						hosts = []hostReport{}
					}
					return a.printJSON(map[string]any{"switch": s, "portGroups": pgs, "hosts": hosts})
				}
				fmt.Fprintf(a.stdout, "switch %s\n  UUID:          %s\n  MTU:           %d\n  uplink policy: %s\n", s.Name, s.UUID, s.MTU, s.UplinkPolicy)
				fmt.Fprintf(a.stdout, "  port groups:   %d\n", len(pgs))
				for _, p := range pgs {
					fmt.Fprintf(a.stdout, "    %s (%s): VLAN %d, PFC priority %d, DSCP %d, RoCE %s\n", p.Key, p.Name, p.VLAN, p.PFCPriority, p.DSCP, p.RoCEVersion)
				}
				fmt.Fprintf(a.stdout, "  hosts:         %d\n", len(hosts))
				for _, h := range hosts {
					fmt.Fprintf(a.stdout, "    %s (%s): %s, %d RDMA uplinks\n", h.Name, h.ID, h.State, len(h.Uplinks))
				}
				return nil
			})
		},
	}
	cmd.AddCommand(create, list, show)
	return cmd
}

func portGroupsOf(c *member.Cache, sw string) []records.PortGroup {
	var out []records.PortGroup
	for _, p := range c.PortGroups() {
		if p.Switch == sw {
			out = append(out, p)
		}
	}
	return out
}

func hostsOf(c *member.Cache, sw string) []member.HostStatus {
	var out []member.HostStatus
	for _, h := range c.Hosts() {
		if h.Host.Switch == sw {
			out = append(out, h)
		}
	}
	return out
}
