package cli

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

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
		Short:   "Create, list and show distributed port groups (control plane)",
		Long: `portgroup manages the distributed port groups of the control plane: the VLAN
an adapter lives in and the lossless-Ethernet settings of its RoCE traffic.
A VM's adapter ethernetN joins port group KEY with
ethernetN.dvs.portgroupId = "KEY" in its VMX.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("portgroup: name a subcommand: create, list or show")
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
			if p.Name == "" {
				p.Name = p.Key
			}
			if p.Switch == "" {
				return usageErrorf("portgroup create: --switch is required")
			}
			if err := p.Validate(); err != nil {
				return usageErrorf("portgroup create: %v", err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			st, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer st.Close()
			_, err = store.Txn(ctx, st, func(tx *store.Tx) error {
				if ok, err := tx.Exists(records.SwitchKey(p.Switch)); err != nil {
					return err
				} else if !ok {
					return fmt.Errorf("switch %s does not exist: create it first (vrdmactl switch create %s)", p.Switch, p.Switch)
				}
				if ok, err := tx.Exists(records.PortGroupKey(p.Key)); err != nil {
					return err
				} else if ok {
					return fmt.Errorf("port group %s already exists", p.Key)
				}
				return tx.Put(records.PortGroupKey(p.Key), p)
			})
			if err != nil {
				return fmt.Errorf("portgroup create %s: %w", p.Key, err)
			}
			if a.json() {
				return a.printJSON(p)
			}
			fmt.Fprintf(a.stdout, "port group %s (%s) created on switch %s: VLAN %d, PFC priority %d, DSCP %d, RoCE %s\n",
				p.Key, p.Name, p.Switch, p.VLAN, p.PFCPriority, p.DSCP, p.RoCEVersion)
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
					return a.printJSON(map[string]any{"portGroups": pgs})
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
				fmt.Fprintf(a.stdout, "port group %s\n  name:         %s\n  switch:       %s\n  VLAN:         %d\n  PFC priority: %d\n  DSCP:         %d\n  RoCE:         %s\n",
					p.Key, p.Name, p.Switch, p.VLAN, p.PFCPriority, p.DSCP, p.RoCEVersion)
				return nil
			})
		},
	}
	cmd.AddCommand(create, list, show)
	return cmd
}
