// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/rules"
	"github.com/vrdma/vrdma/internal/vmx"
)

func (a *app) vmCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vm",
		Short: "Create, configure, power on and off, define, list and show VMs",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("vm: name a subcommand: create, show, edit, set, reserve-memory, power-on, power-off, connect, disconnect, define, undefine or list")
		},
	}
	cmd.AddCommand(a.vmDefineCommand(), a.vmUndefineCommand(), a.withClusterList(a.vmListCommand()), a.vmShowCommand(), // vmcluster.go
		a.vmCreateCommand(), addDryRun(a.vmEditCommand()), addDryRun(a.vmSetCommand()), addDryRun(a.vmReserveMemoryCommand()), a.vmPowerOnCommand(), a.vmPowerOffCommand(), // vmproc.go
		a.vmConnectCommand(true), a.vmConnectCommand(false))
	return cmd
}

func (a *app) vmDefineCommand() *cobra.Command {
	var owner string
	cmd := &cobra.Command{
		Use:   "define NAME FILE.vmx",
		Short: "Store (or replace) VM NAME's VMX on the agent, powered on on its host ('-' reads stdin)",
		Long: `define stores VM NAME's configuration, a VMX file (key = "value" lines), on
the agent. The agent checks that it can run it: memSize, the PVRDMA adapters
(ethernetN with ethernetN.virtualDev = "vrdma"), the reservation
(sched.mem.min, sched.mem.pin), vrdma.asyncMode... A VM attached to a workload
cannot be redefined.

A defined VM lives on this agent's host and is powered on there at once, so a
workload attaches it without further steps. The prerequisites that vm power-on
enforces (docs/vmx-rules.md) are not: define lists the ones the VM breaks as a
warning ("findings" with -o json); vm create and vm power-on are the checked
procedure. The caller owns it (--owner, as root, gives it to another
user): only processes of its owner, of its group, or of root may attach.`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, file := args[0], args[1]
			o, err := parseOwner(owner)
			if err != nil {
				return err
			}
			var b []byte
			if file == "-" {
				b, err = io.ReadAll(a.stdin)
			} else {
				b, err = os.ReadFile(file)
			}
			if err != nil {
				return fmt.Errorf("vm define: %w", err)
			}
			ctx, ag, done, err := a.openAgent(cmd)
			if err != nil {
				return err
			}
			defer done()
			if o != nil {
				err = ag.DefineVMFor(ctx, name, b, *o)
			} else {
				err = ag.DefineVM(ctx, name, b)
			}
			if err != nil {
				return fmt.Errorf("vm define %s: %w", name, err)
			}
			// The power-on rules are not enforced here; say which the VM
			// breaks, as vmx check would.
			findings := []vrdma.Finding{}
			if f, err := vmx.Parse(b); err == nil {
				for _, fd := range rules.Check(f, rules.Target{}) {
					findings = append(findings, vrdma.Finding{Rule: fd.Rule, Severity: fd.Severity, Key: fd.Key, Line: fd.Line, Message: fd.Message})
				}
			}
			if a.json() {
				return a.printJSON(map[string]any{"name": name, "defined": true, "findings": findings})
			}
			fmt.Fprintf(a.stdout, "VM %s defined\n", name)
			printFindings(a.stderr, fmt.Sprintf("vrdmactl: warning: VM %s breaks %d of the rules that vm power-on enforces (vm define does not; 'vrdmactl vmx check' explains them):", name, len(findings)), findings)
			return nil
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "UID[:GID] who may attach (default: you; root only)")
	return cmd
}

func (a *app) vmUndefineCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "undefine NAME",
		Short: "Remove VM NAME (defined here: not attached; managed: powered off)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, ag, done, err := a.openAgent(cmd)
			if err != nil {
				return err
			}
			defer done()
			if err := ag.UndefineVM(ctx, args[0]); err != nil {
				return fmt.Errorf("vm undefine %s: %w", args[0], err)
			}
			if a.json() {
				return a.printJSON(map[string]any{"name": args[0], "defined": false})
			}
			fmt.Fprintf(a.stdout, "VM %s undefined\n", args[0])
			return nil
		},
	}
}

func (a *app) vmListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the agent's VMs",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, _, err := a.agentStatus(cmd, "vm list")
			if err != nil {
				return err
			}
			if a.json() {
				vms := st.VMs
				if vms == nil {
					vms = []vrdma.VMStatus{}
				}
				return a.printJSON(map[string]any{"vms": vms})
			}
			if len(st.VMs) == 0 {
				fmt.Fprintln(a.stdout, "no VMs")
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tPOWER\tMEMORY\tASYNC\tADAPTERS\tQPS")
			for i := range st.VMs {
				v := &st.VMs[i]
				var ads []string
				for _, ad := range v.Adapters {
					ads = append(ads, ad.Name)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", v.Name, vmState(v), orDash(v.Power), vmMemory(v), onOff(v.AsyncMode), strings.Join(ads, ","), len(v.QPs))
			}
			return tw.Flush()
		},
	}
}
