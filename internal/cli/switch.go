// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// switchCommand is "vrdmactl switch": distributed switches in the control
// plane.
func (a *app) switchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "switch",
		Short: "Create, list, show, change and delete distributed switches and their routers (control plane)",
		Long: `switch manages the distributed switches of the control plane: the set of hosts
and port groups between which VMs talk PVRDMA. Hosts join a switch with
vrdmad --switch NAME. See --etcd-endpoints and --state-dir for where the
control plane is.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("switch: name a subcommand: create, list, show, set, router or delete")
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
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			st, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			if s, err = admin.CreateSwitch(ctx, st, s); err != nil {
				return adminErr(err)
			}
			if a.json() {
				return a.printJSON(s)
			}
			fmt.Fprintf(a.stdout, "switch %s created (UUID %s, MTU %d, uplink policy %s, network policy %s)\n", s.Name, s.UUID, s.MTU, s.UplinkPolicy, s.NetworkPolicy.Effective())
			return nil
		},
	}
	create.Flags().IntVar(&sw.MTU, "mtu", 9000, "MTU (1280..9000)")
	create.Flags().StringVar(&sw.UUID, "uuid", "", "the vDS UUID (default: a random one)")
	create.Flags().StringVar(&policy, "uplink-policy", string(records.UplinkSingle), "single (each host's RDMA uplink is its only one) or failover")
	create.Flags().StringVar((*string)(&sw.NetworkPolicy), "network-policy", "", "how path selection obeys the network checks: strict (the default), warn or off")
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
					return a.printJSON(map[string]any{"switch": s, "port_groups": pgs, "hosts": hosts})
				}
				fmt.Fprintf(a.stdout, "switch %s\n  UUID:           %s\n  MTU:            %d\n  uplink policy:  %s\n  network policy: %s\n", s.Name, s.UUID, s.MTU, s.UplinkPolicy, s.NetworkPolicy.Effective())
				fmt.Fprintf(a.stdout, "  routers:        %d\n", len(s.Routers))
				for _, r := range s.Routers {
					fmt.Fprintf(a.stdout, "    %s\n", routerText(r))
				}
				fmt.Fprintf(a.stdout, "  port groups:    %d\n", len(pgs))
				for _, p := range pgs {
					fmt.Fprintf(a.stdout, "    %s (%s): %s\n", p.Key, p.Name, portGroupText(p))
				}
				fmt.Fprintf(a.stdout, "  hosts:          %d\n", len(hosts))
				for _, h := range hosts {
					fmt.Fprintf(a.stdout, "    %s (%s): %s, %d RDMA uplinks\n", h.Name, h.ID, h.State, len(h.Uplinks))
				}
				return nil
			})
		},
	}
	cmd.AddCommand(create, list, show, a.switchSetCommand(), a.switchRouterCommand(), a.switchDeleteCommand())
	return cmd
}

// updateSwitch changes switch name's record (see updateRecord).
func (a *app) updateSwitch(cmd *cobra.Command, name string, edit func(s *records.Switch) error) (records.Switch, error) {
	return updateRecord(a, cmd, records.SwitchKey(name), "switch "+name, "vrdmactl switch list", edit)
}

// switchSetCommand is "vrdmactl switch set": change a switch's MTU,
// uplink policy or network policy.
func (a *app) switchSetCommand() *cobra.Command {
	var mtu int
	var uplinkPolicy, networkPolicy string
	cmd := &cobra.Command{
		Use:   "set NAME [--network-policy strict|warn|off] [--mtu N] [--uplink-policy single|failover]",
		Short: "Change a switch's network policy, MTU or uplink policy",
		Long: `set changes a switch's record. --network-policy says how path selection obeys
the RoCE network checks (vrdmactl network check) between the switch's hosts:
strict (the default) gives a pair rdma only when every check passes, and tcp
otherwise, with the failing check in the reason; warn gives rdma anyway and
says what failed; off runs no check. Only the flags given change; agents see
the change at once.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			up, np := records.UplinkPolicy(uplinkPolicy), records.NetworkPolicy(networkPolicy)
			ch := admin.SwitchChange{MTU: ifChanged(fl, "mtu", &mtu), UplinkPolicy: ifChanged(fl, "uplink-policy", &up), NetworkPolicy: ifChanged(fl, "network-policy", &np)}
			if ch == (admin.SwitchChange{}) {
				return usageErrorf("switch set: say what to change (--network-policy, --mtu, --uplink-policy)")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			st, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			s, err := admin.SetSwitch(ctx, st, args[0], ch)
			if err != nil {
				return cmdErr("switch set", adminErr(err))
			}
			if a.json() {
				return a.printJSON(s)
			}
			fmt.Fprintf(a.stdout, "switch %s: MTU %d, uplink policy %s, network policy %s\n", s.Name, s.MTU, s.UplinkPolicy, s.NetworkPolicy.Effective())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&networkPolicy, "network-policy", "", "strict, warn or off")
	f.IntVar(&mtu, "mtu", 0, "MTU (1280..9000)")
	f.StringVar(&uplinkPolicy, "uplink-policy", "", "single or failover")
	return cmd
}

// switchRouterCommand is "vrdmactl switch router": the layer-3 hops an
// operator declares between a switch's hosts.
func (a *app) switchRouterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Declare the routers between a switch's hosts (layer-3 hops of RoCE v2)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("switch router: name a subcommand: set or remove")
		},
	}
	var subnets, maps []string
	var preserved, copied string
	var mtu int
	set := &cobra.Command{
		Use:   "set SWITCH ROUTER [--subnet A/N]... [--dscp-map PRIORITY:DSCP]... [--dscp-preserved on|off] [--pcp-copied on|off] [--mtu N]",
		Short: "Declare a router, or change one: the subnets it joins and what it does with RoCE's priority",
		Long: `set declares router ROUTER between the hosts of SWITCH, or changes it: the
subnets it joins (--subnet, twice or more; uplinks whose addresses lie in
different subnets reach each other through routers), its priority ↔ DSCP map
(--dscp-map 3:26, repeatable; "none" empties it), whether it forwards DSCP
unchanged (--dscp-preserved) and whether it copies the PCP of tagged packets
(--pcp-copied), and its MTU (0: the switch's). The check roce-l3-lossless wants,
at every router between two hosts, the port group's priority mapped to its
DSCP with DSCP preserved, or PCP copied on a tagged port group. What a router
does not declare it does not do. Only the flags given change.`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			var r records.Router
			var err error
			var ps []netip.Prefix
			for _, p := range subnets {
				pf, err := netip.ParsePrefix(p)
				if err != nil {
					return usageErrorf("switch router set --subnet %q: want a subnet such as 10.0.1.0/24", p)
				}
				ps = append(ps, pf)
			}
			var dm []records.DSCPMapping
			for _, m := range maps {
				if m == "none" {
					continue
				}
				e, err := records.ParseDSCPMapping(m)
				if err != nil {
					return usageErrorf("switch router set --dscp-map: %v", err)
				}
				dm = append(dm, e)
			}
			var keep, pcp bool
			if fl.Changed("dscp-preserved") {
				if keep, err = parseOnOff("dscp-preserved", preserved); err != nil {
					return err
				}
			}
			if fl.Changed("pcp-copied") {
				if pcp, err = parseOnOff("pcp-copied", copied); err != nil {
					return err
				}
			}
			s, err := a.updateSwitch(cmd, args[0], func(s *records.Switch) error {
				s.Routers = slices.Clone(s.Routers)
				i := s.RouterIndex(args[1])
				if i < 0 {
					if !fl.Changed("subnet") {
						return usageErrorf("switch router set: router %s is new: give the subnets it joins (--subnet, twice or more)", args[1])
					}
					s.Routers = append(s.Routers, records.Router{Name: args[1]})
					i = len(s.Routers) - 1
				}
				rt := &s.Routers[i]
				if fl.Changed("subnet") {
					rt.Subnets = ps
				}
				if fl.Changed("dscp-map") {
					rt.DSCPMap = dm
				}
				if fl.Changed("dscp-preserved") {
					rt.DSCPPreserved = keep
				}
				if fl.Changed("pcp-copied") {
					rt.PCPCopied = pcp
				}
				if fl.Changed("mtu") {
					rt.MTU = mtu
				}
				r = *rt
				return nil
			})
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(map[string]any{"switch": s.Name, "router": r})
			}
			fmt.Fprintf(a.stdout, "switch %s router %s\n", s.Name, routerText(r))
			return nil
		},
	}
	f := set.Flags()
	f.StringArrayVar(&subnets, "subnet", nil, "a subnet the router joins, e.g. 10.0.1.0/24 (repeat: at least two)")
	f.StringArrayVar(&maps, "dscp-map", nil, "PRIORITY:DSCP the router maps, e.g. 3:26 (repeatable; none for an empty map)")
	f.StringVar(&preserved, "dscp-preserved", "", "the router forwards DSCP unchanged: on or off")
	f.StringVar(&copied, "pcp-copied", "", "the router copies the PCP of tagged packets: on or off")
	f.IntVar(&mtu, "mtu", 0, "the router's MTU (0: the switch's)")
	remove := &cobra.Command{
		Use:   "remove SWITCH ROUTER",
		Short: "Remove a router's declaration",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := a.updateSwitch(cmd, args[0], func(s *records.Switch) error {
				i := s.RouterIndex(args[1])
				if i < 0 {
					return fmt.Errorf("switch %s has no router %s", args[0], args[1])
				}
				s.Routers = slices.Delete(slices.Clone(s.Routers), i, i+1)
				return nil
			})
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(map[string]any{"switch": args[0], "removed": args[1]})
			}
			fmt.Fprintf(a.stdout, "switch %s: router %s removed\n", args[0], args[1])
			return nil
		},
	}
	cmd.AddCommand(set, remove)
	return cmd
}

// routerText is a router for people.
func routerText(r records.Router) string {
	var sn, dm []string
	for _, p := range r.Subnets {
		sn = append(sn, p.String())
	}
	for _, m := range r.DSCPMap {
		dm = append(dm, m.String())
	}
	mtu := "the switch's"
	if r.MTU != 0 {
		mtu = fmt.Sprint(r.MTU)
	}
	return fmt.Sprintf("%s: subnets %s, DSCP map %s, DSCP preserved %s, PCP copied %s, MTU %s",
		r.Name, strings.Join(sn, " "), orDash(strings.Join(dm, " ")), onOff(r.DSCPPreserved), onOff(r.PCPCopied), mtu)
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
