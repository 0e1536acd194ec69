// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// portgroupCommand is "vrdmactl portgroup": distributed port groups in
// the control plane. An adapter joins one with ethernetN.dvs.portgroupId =
// "KEY" in its VM's VMX.
func (a *app) portgroupCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "portgroup",
		Aliases: []string{"pg"},
		Short:   "Create, list, show, change and delete distributed port groups (control plane)",
		Long: `portgroup manages the distributed port groups of the control plane: the VLAN
an adapter lives in and the lossless-Ethernet settings of its RoCE traffic.
A VM's adapter ethernetN joins port group KEY with
ethernetN.dvs.portgroupId = "KEY" in its VMX.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("portgroup: name a subcommand: create, list, show, set or delete")
		},
	}
	var pg records.PortGroup
	var roce string
	create := &cobra.Command{
		Use:   "create KEY",
		Short: "Create port group KEY (e.g. dvportgroup-80) on --switch",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := pg
			p.Key, p.RoCEVersion = args[0], records.RoCEVersion(roce)
			if p.Switch == "" {
				return usageErrorf("portgroup create: --switch is required")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			st, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			if p, err = admin.CreatePortGroup(ctx, st, p); err != nil {
				return adminErr(err)
			}
			if a.json() {
				return a.printJSON(p)
			}
			fmt.Fprintf(a.stdout, "port group %s (%s) created on switch %s: %s\n", p.Key, p.Name, p.Switch, portGroupText(p))
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&pg.Switch, "switch", "", "the distributed switch (required)")
	f.StringVar(&pg.Name, "name", "", "display name (default: KEY)")
	f.IntVar(&pg.VLAN, "vlan", 0, "VLAN ID, 0 (untagged) .. 4094")
	f.IntVar(&pg.PFCPriority, "pfc-priority", 3, "PFC priority (802.1Q PCP) kept lossless, 0..7")
	f.IntVar(&pg.DSCP, "dscp", 26, "DSCP of RoCEv2 packets, 0..63")
	f.StringVar(&roce, "roce-version", string(records.RoCEv2), "RoCE version: v1 or v2")
	f.IntVar(&pg.RoCEMTU, "roce-mtu", 0, "RoCE MTU: 256, 512, 1024, 2048 or 4096 (0: the largest the switch's MTU carries)")
	f.StringVar(&pg.Subnet, "subnet", "", "IPv4 subnet (e.g. 10.1.0.0/24) the control plane assigns adapter addresses from")
	var onSwitch string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the port groups",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				pgs := c.PortGroups()
				if onSwitch != "" {
					pgs = portGroupsOf(c, onSwitch)
				}
				if a.json() {
					if pgs == nil {
						pgs = []records.PortGroup{}
					}
					return a.printJSON(map[string]any{"port_groups": pgs})
				}
				if len(pgs) == 0 {
					fmt.Fprintln(a.stdout, "no port groups: create one with 'vrdmactl portgroup create KEY --switch NAME'")
					return nil
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "KEY\tNAME\tSWITCH\tVLAN\tPFC\tDSCP\tROCE")
				for _, p := range pgs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", p.Key, p.Name, p.Switch, p.VLAN, p.PFCPriority, p.DSCP, p.RoCEVersion)
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().StringVar(&onSwitch, "switch", "", "only the port groups of this switch")
	show := &cobra.Command{
		Use:   "show KEY",
		Short: "Show a port group",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				p, err := c.PortGroup(cmd.Context(), args[0])
				if err != nil {
					return notFound(err, "port group "+args[0])
				}
				if a.json() {
					return a.printJSON(p)
				}
				fmt.Fprintf(a.stdout, "port group %s\n  name:         %s\n  switch:       %s\n  VLAN:         %d\n  PFC priority: %d\n  DSCP:         %d\n  RoCE:         %s\n  RoCE MTU:     %s\n  subnet:       %s\n",
					p.Key, p.Name, p.Switch, p.VLAN, p.PFCPriority, p.DSCP, p.RoCEVersion, roceMTUText(p.RoCEMTU), subnetText(p.Subnet))
				return nil
			})
		},
	}
	cmd.AddCommand(create, list, show, a.portgroupSetCommand(), a.portgroupDeleteCommand())
	return cmd
}

// portgroupSetCommand is "vrdmactl portgroup set": change a port group's
// network settings.
func (a *app) portgroupSetCommand() *cobra.Command {
	var p records.PortGroup
	var roce string
	cmd := &cobra.Command{
		Use:   "set KEY [--vlan N] [--pfc-priority P] [--dscp D] [--roce-version v1|v2] [--roce-mtu N] [--subnet CIDR] [--name NAME]",
		Short: "Change a port group's VLAN, PFC priority, DSCP, RoCE version or RoCE MTU",
		Long: `set changes a port group's record: the VLAN its adapters live in, the 802.1Q
priority (PCP) that PFC keeps lossless for its RoCE traffic, the DSCP its RoCE
v2 packets carry, its RoCE version and RoCE MTU. Only the flags given change.
Agents decide new connections with the new settings at once; established QPs
keep their path.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			rv := records.RoCEVersion(roce)
			ch := admin.PortGroupChange{VLAN: ifChanged(fl, "vlan", &p.VLAN), PFCPriority: ifChanged(fl, "pfc-priority", &p.PFCPriority), DSCP: ifChanged(fl, "dscp", &p.DSCP),
				RoCEVersion: ifChanged(fl, "roce-version", &rv), RoCEMTU: ifChanged(fl, "roce-mtu", &p.RoCEMTU), Subnet: ifChanged(fl, "subnet", &p.Subnet), Name: ifChanged(fl, "name", &p.Name)}
			if ch == (admin.PortGroupChange{}) {
				return usageErrorf("portgroup set: say what to change (--vlan, --pfc-priority, --dscp, --roce-version, --roce-mtu, --subnet, --name)")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			st, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := admin.SetPortGroup(ctx, st, args[0], ch)
			if err != nil {
				return cmdErr("portgroup set", adminErr(err))
			}
			if a.json() {
				return a.printJSON(n)
			}
			fmt.Fprintf(a.stdout, "port group %s (%s) on switch %s: %s\n", n.Key, n.Name, n.Switch, portGroupText(n))
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&p.VLAN, "vlan", 0, "VLAN ID, 0 (untagged) .. 4094")
	f.IntVar(&p.PFCPriority, "pfc-priority", 0, "PFC priority (802.1Q PCP) kept lossless, 0..7")
	f.IntVar(&p.DSCP, "dscp", 0, "DSCP of RoCEv2 packets, 0..63")
	f.StringVar(&roce, "roce-version", "", "RoCE version: v1 or v2")
	f.IntVar(&p.RoCEMTU, "roce-mtu", 0, "RoCE MTU: 256, 512, 1024, 2048 or 4096 (0: the largest the switch's MTU carries)")
	f.StringVar(&p.Subnet, "subnet", "", "IPv4 subnet adapter addresses are assigned from (\"\" for none); adapters already attached keep theirs")
	f.StringVar(&p.Name, "name", "", "display name")
	return cmd
}

// subnetText is a port group's subnet for people.
func subnetText(s string) string {
	if s == "" {
		return "none (adapters have the addresses their VMs configure)"
	}
	return s
}

// portGroupText is a port group's network settings for people.
func portGroupText(p records.PortGroup) string {
	return fmt.Sprintf("VLAN %d, PFC priority %d, DSCP %d, RoCE %s, RoCE MTU %s", p.VLAN, p.PFCPriority, p.DSCP, p.RoCEVersion, roceMTUText(p.RoCEMTU))
}

// roceMTUText is a port group's RoCE MTU for people.
func roceMTUText(m int) string {
	if m == 0 {
		return "the switch's largest"
	}
	return fmt.Sprint(m)
}
