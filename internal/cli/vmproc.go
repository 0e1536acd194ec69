// SPDX-License-Identifier: Apache-2.0

package cli

// vSphere's VM procedures, as vrdmactl commands (docs/control-plane.md):
// vm create, edit, set, reserve-memory, power-on and power-off. They
// all go through the local agent (--socket), which checks the caller's
// credentials (SO_PEERCRED) against the VM's owner and applies the change
// to wherever the VM lives: the control plane's inventory, or the agent's
// state directory.

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// parseOwner parses --owner UID[:GID]; without GID the group is UID's
// number too (a user's private group).
func parseOwner(s string) (*vrdma.Owner, error) {
	if s == "" {
		return nil, nil
	}
	us, gs, hasG := strings.Cut(s, ":")
	uid, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return nil, usageErrorf("--owner %q: want UID[:GID], numbers", s)
	}
	gid := uid
	if hasG {
		if gid, err = strconv.ParseUint(gs, 10, 32); err != nil {
			return nil, usageErrorf("--owner %q: want UID[:GID], numbers", s)
		}
	}
	return &vrdma.Owner{UID: uint32(uid), GID: uint32(gid)}, nil
}

func (a *app) vmCreateCommand() *cobra.Command {
	var spec vrdma.VMSpec
	var mem, hw int
	var guest, owner string
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a powered-off VM (memory, guest OS, hardware version) with no adapter yet",
		Long: `create makes a new VM, powered off, with no network adapter: add PVRDMA adapters
with 'vm edit NAME --add-adapter --portgroup PG', reserve its memory with
'vm reserve-memory NAME --all', then 'vm power-on NAME'.

With a control plane the VM lives there (a managed VM): it is registered on
--host (default: this agent's host) and any host of the control plane can run
it once it is powered on there. A standalone agent keeps it in its state
directory. The caller owns the VM (--owner, as root, gives it to another
user): only processes of its owner, of its group, or of root may attach.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := parseOwner(owner)
			if err != nil {
				return err
			}
			vmxText, err := vmconfig.NewVMX(args[0], mem, hw, guest)
			if err != nil {
				return usageErrorf("vm create: %v (--memory, --hw-version, --guest-os)", err)
			}
			s := spec
			s.Name, s.Owner, s.VMX = args[0], o, vmxText
			ctx, ag, done, err := a.openAgent(cmd)
			if err != nil {
				return err
			}
			defer done()
			in, err := ag.CreateVM(ctx, s)
			if err != nil {
				return fmt.Errorf("vm create %s: %w", s.Name, err)
			}
			if a.json() {
				return a.printJSON(in)
			}
			where := "on host " + a.orThis(in.Host)
			if in.Managed {
				where = "in the control plane, registered on host " + in.Host
			}
			fmt.Fprintf(a.stdout, "VM %s created %s, powered off: %d MB, guestOS %s, virtual hardware %d, owner uid %d gid %d\n",
				in.Name, where, mem, guest, hw, in.Owner.UID, in.Owner.GID)
			fmt.Fprintf(a.stdout, "next: vrdmactl vm edit %s --add-adapter --portgroup PG; vrdmactl vm reserve-memory %s --all; vrdmactl vm power-on %s\n", in.Name, in.Name, in.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&mem, "memory", 1024, "guest memory in MB (memSize)")
	f.StringVar(&guest, "guest-os", "ubuntu-64", "guest OS ID (guestOS); PVRDMA needs a 64-bit Linux")
	f.IntVar(&hw, "hw-version", 20, "virtual hardware version (virtualHW.version); PVRDMA needs 13+, native endpoints 18+")
	f.StringVar(&spec.Host, "host", "", "register the VM on this host (name or ID; default this agent's)")
	f.StringVar(&spec.Datacenter, "datacenter", "", "the VM's datacenter (default its host's)")
	f.StringVar(&spec.Folder, "folder", "", "the VM's folder, a path such as prod/web")
	f.StringVar(&spec.ResourcePool, "resource-pool", "", "the VM's resource pool in its host's cluster, a path such as gold")
	f.StringVar(&owner, "owner", "", "UID[:GID] who may attach (default: you; root only)")
	return cmd
}

// orThis returns host, or "this agent's" when it is empty.
func (a *app) orThis(host string) string {
	if host == "" {
		return "(this agent's)"
	}
	return host
}

// adaptersOf returns the PVRDMA adapters' names of a VMX (none if it does
// not parse).
func adaptersOf(vmxText string) []string {
	cfg, err := vmconfig.Parse([]byte(vmxText))
	if err != nil {
		return nil
	}
	var out []string
	for _, ad := range cfg.Adapters {
		out = append(out, ad.Name())
	}
	return out
}

// printFindings writes findings, one per line, under a title.
func printFindings(w io.Writer, title string, fs []vrdma.Finding) {
	if len(fs) == 0 {
		return
	}
	fmt.Fprintln(w, title)
	for _, f := range fs {
		where := ""
		if f.Key != "" {
			where = " " + f.Key
			if f.Line > 0 {
				where += fmt.Sprintf(" (line %d)", f.Line)
			}
		}
		fmt.Fprintf(w, "  %-7s %s%s: %s\n", f.Severity, f.Rule, where, f.Message)
	}
}

// errorCount counts the errors among fs.
func errorCount(fs []vrdma.Finding) int {
	n := 0
	for _, f := range fs {
		if f.Severity == "error" {
			n++
		}
	}
	return n
}

// addDryRun gives an edit command --dry-run, which editVM reads.
func addDryRun(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().Bool("dry-run", false, "check the change as saving would (rights, power state, every rule) and say what it would do; store nothing")
	return cmd
}

// editVM runs one edit and reports it; what describes the change. With
// --dry-run the agent checks it and stores nothing.
func (a *app) editVM(cmd *cobra.Command, name, what string, e vrdma.VMEdit) error {
	e.DryRun, _ = cmd.Flags().GetBool("dry-run")
	if e.DryRun {
		what = "the change would be saved (--dry-run: nothing stored): " + what
	}
	ctx, ag, done, err := a.openAgent(cmd)
	if err != nil {
		return err
	}
	defer done()
	var before []string
	adapters := false
	if len(e.AddAdapters)+len(e.RemoveAdapters) > 0 {
		if in, err := ag.VM(ctx, name); err == nil {
			before, adapters = adaptersOf(in.VMX), true
		}
	}
	r, err := ag.EditVM(ctx, name, e)
	var rf *vrdma.RefusedError
	if errors.As(err, &rf) {
		if a.json() {
			a.printJSON(r)
			return &exitError{code: exitFailure}
		}
		printFindings(a.stdout, fmt.Sprintf("VM %s: the change would break %d rules, so nothing changed:", name, len(rf.Findings)), rf.Findings)
		return &exitError{code: exitFailure, err: fmt.Errorf("vm %s %s: refused by the rules (see above)", cmd.Name(), name)}
	}
	if err != nil {
		return fmt.Errorf("vm %s %s: %w", cmd.Name(), name, err)
	}
	if a.json() {
		return a.printJSON(r)
	}
	fmt.Fprintf(a.stdout, "VM %s: %s\n", name, what)
	if adapters {
		after := adaptersOf(r.VM.VMX)
		for _, ad := range after {
			if !slices.Contains(before, ad) {
				fmt.Fprintf(a.stdout, "  added PVRDMA adapter %s (ethernet%s)\n", ad, strings.TrimPrefix(ad, "vrdma"))
			}
		}
		for _, ad := range before {
			if !slices.Contains(after, ad) {
				fmt.Fprintf(a.stdout, "  removed PVRDMA adapter %s\n", ad)
			}
		}
		fmt.Fprintf(a.stdout, "  PVRDMA adapters: %s\n", orDash(strings.Join(after, ", ")))
	}
	if n := errorCount(r.Findings); n > 0 {
		printFindings(a.stdout, fmt.Sprintf("still to fix before it can power on (%d):", n), r.Findings)
	} else {
		printFindings(a.stdout, "warnings:", r.Findings)
	}
	return nil
}

func (a *app) vmEditCommand() *cobra.Command {
	var add bool
	var pg, sw string
	var remove []string
	cmd := &cobra.Command{
		Use:   "edit NAME (--add-adapter --portgroup PG [--switch ID] | --remove-adapter N)",
		Short: "Add or remove a powered-off VM's PVRDMA adapters (Edit Settings > Virtual Hardware)",
		Long: `edit adds a PVRDMA adapter on a distributed port group, at the lowest free
ethernetN (the adapter is then vrdmaN, "Network adapter N+1" in vSphere), or
removes adapter N (as in vrdmaN) with its vrdmaN.* settings. The VM must be
powered off ("power off the VM first"). The adapter's ethernetN.dvs.switchId
is the port group's switch's UUID, looked up in the control plane; a
standalone agent needs --switch. An edit that breaks a rule that held before
is refused, with the rules it breaks.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var e vrdma.VMEdit
			var what []string
			if add {
				if pg == "" {
					return usageErrorf("vm edit --add-adapter: --portgroup PG is required (a PVRDMA adapter is on a distributed port group)")
				}
				e.AddAdapters = []vrdma.NewAdapter{{PortGroup: pg, Switch: sw}}
				what = append(what, "PVRDMA adapter added on port group "+pg)
			} else if pg != "" || sw != "" {
				return usageErrorf("vm edit: --portgroup and --switch go with --add-adapter")
			}
			for _, r := range remove {
				n, err := strconv.Atoi(strings.TrimPrefix(r, "vrdma"))
				if err != nil || n < 0 {
					return usageErrorf("--remove-adapter %q: want N or vrdmaN", r)
				}
				e.RemoveAdapters = append(e.RemoveAdapters, n)
				what = append(what, "adapter vrdma"+strconv.Itoa(n)+" removed")
			}
			if len(what) == 0 {
				return usageErrorf("vm edit: say what to change: --add-adapter --portgroup PG, or --remove-adapter N")
			}
			return a.editVM(cmd, args[0], strings.Join(what, ", "), e)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&add, "add-adapter", false, "add a PVRDMA adapter (New device > Network, adapter type PVRDMA)")
	f.StringVar(&pg, "portgroup", "", "the distributed port group of the new adapter (its key, e.g. dvportgroup-80)")
	f.StringVar(&sw, "switch", "", "the new adapter's switch ID (ethernetN.dvs.switchId; default: the port group's switch's UUID)")
	f.StringSliceVar(&remove, "remove-adapter", nil, "remove PVRDMA adapter N (as in vrdmaN), repeatable")
	return cmd
}

func (a *app) vmSetCommand() *cobra.Command {
	var unset []string
	cmd := &cobra.Command{
		Use:   "set NAME KEY=VALUE... [--unset KEY]",
		Short: "Set advanced configuration parameters of a powered-off VM (VM Options > Advanced)",
		Long: `set writes configuration parameters into a powered-off VM's VMX, such as
vrdma1.nativeEndpointSupport=TRUE (native endpoints on adapter vrdma1, that is
"Network adapter 2") or vrdma.asyncMode=TRUE. A key already set keeps its line;
a new key is appended; every other line of the VMX stays as it was, byte for
byte. --unset removes a key.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || (len(args) < 2 && len(unset) == 0) {
				return usageErrorf("vm set: want NAME and KEY=VALUE (or --unset KEY) (usage: %s)", cmd.UseLine())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var e vrdma.VMEdit
			var what []string
			for _, kv := range args[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || strings.TrimSpace(k) == "" {
					return usageErrorf("vm set: %q is not KEY=VALUE", kv)
				}
				e.Set = append(e.Set, vrdma.KeyValue{Key: strings.TrimSpace(k), Value: v})
				what = append(what, fmt.Sprintf("%s = %q", strings.TrimSpace(k), v))
			}
			for _, k := range unset {
				e.Unset = append(e.Unset, k)
				what = append(what, k+" unset")
			}
			return a.editVM(cmd, args[0], strings.Join(what, ", "), e)
		},
	}
	cmd.Flags().StringSliceVar(&unset, "unset", nil, "remove KEY from the VMX, repeatable")
	return cmd
}

func (a *app) vmReserveMemoryCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "reserve-memory NAME --all",
		Short: "Reserve all guest memory (All locked) of a powered-off VM",
		Long: `reserve-memory --all is vSphere's "Reserve all guest memory (All locked)", which
PVRDMA needs: sched.mem.pin = "TRUE" and sched.mem.min (and sched.mem.minSize)
= memSize. The agent then locks the VM's guest memory when it attaches.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !all {
				return usageErrorf("vm reserve-memory: say --all (reserve all guest memory, all locked: what PVRDMA needs)")
			}
			return a.editVM(cmd, args[0], "all guest memory reserved and locked (sched.mem.pin, sched.mem.min = memSize)", vrdma.VMEdit{ReserveAllMemory: true})
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "reserve all guest memory, all locked")
	return cmd
}

func (a *app) vmPowerOnCommand() *cobra.Command {
	var host string
	cmd := &cobra.Command{
		Use:   "power-on NAME [--host H]",
		Short: "Check every rule against the VM and the host, then power the VM on there",
		Long: `power-on runs every rule (vrdmactl vmx check's, plus the host rules against
the host's record, and that the host is up, in the VM's datacenter and that
the adapters' port groups exist on its switch) and powers the VM on on --host
(name or ID; default the host it is registered on, or this agent's). If any
rule fails it refuses and prints the whole list. Once powered on, a workload
on that host attaches the VM (vrdma.Open).`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, ag, done, err := a.openAgent(cmd)
			if err != nil {
				return err
			}
			defer done()
			r, err := ag.PowerOnVM(ctx, args[0], host)
			var rf *vrdma.RefusedError
			if errors.As(err, &rf) {
				if a.json() {
					a.printJSON(r)
					return &exitError{code: exitFailure}
				}
				n := errorCount(rf.Findings)
				on := host
				if on == "" {
					on = r.VM.Host
				}
				printFindings(a.stdout, fmt.Sprintf("VM %s cannot power on on host %s: %d errors", args[0], a.orThis(on), n), rf.Findings)
				return &exitError{code: exitFailure, err: fmt.Errorf("vm power-on %s: refused: %d rules failed (see above)", args[0], n)}
			}
			if err != nil {
				return fmt.Errorf("vm power-on %s: %w", args[0], err)
			}
			if a.json() {
				return a.printJSON(r)
			}
			if r.Changed {
				fmt.Fprintf(a.stdout, "VM %s powered on on host %s\n", r.VM.Name, r.VM.Host)
			} else {
				fmt.Fprintf(a.stdout, "VM %s is already powered on on host %s\n", r.VM.Name, r.VM.Host)
			}
			printFindings(a.stdout, "warnings:", r.Findings)
			return nil
		},
	}
	cmd.Flags().StringVar(&host, "host", "", "the host to power on on (name or ID)")
	return cmd
}

func (a *app) vmPowerOffCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "power-off NAME",
		Short: "Power a VM off, detaching its workload (its peers' QPs flush)",
		Long: `power-off records the VM as powered off and detaches its running workload,
wherever it runs: the workload's calls fail from then on, and its peers' QPs
go to the error state and flush, as when a workload exits. A powered-off VM
can be edited, and powered on again (on any host, for a managed VM).`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, ag, done, err := a.openAgent(cmd)
			if err != nil {
				return err
			}
			defer done()
			r, err := ag.PowerOffVM(ctx, args[0])
			if err != nil {
				return fmt.Errorf("vm power-off %s: %w", args[0], err)
			}
			if a.json() {
				return a.printJSON(r)
			}
			switch {
			case !r.Changed:
				fmt.Fprintf(a.stdout, "VM %s is already powered off\n", r.VM.Name)
			case r.Detached:
				fmt.Fprintf(a.stdout, "VM %s powered off; its workload was detached\n", r.VM.Name)
			default:
				fmt.Fprintf(a.stdout, "VM %s powered off\n", r.VM.Name)
			}
			return nil
		},
	}
}

// vmConnectCommand is vm connect (connected) or vm disconnect.
func (a *app) vmConnectCommand(connected bool) *cobra.Command {
	verb, short := "connect", "Connect a running VM's adapter: its port comes up (IBV_EVENT_PORT_ACTIVE)"
	long := `connect connects adapter ADAPTER (vrdmaN, or ethernetN as in the VMX) of VM
NAME, whose workload runs on this agent's host, as the "Connected" box of a
network adapter in the vSphere Client: its port comes back up (PORT_ACTIVE in
ibv_devinfo and ibv_query_port), its QPs' requests are answered again, and
every context of the adapter gets IBV_EVENT_PORT_ACTIVE.`
	if !connected {
		verb, short = "disconnect", "Disconnect a running VM's adapter: its port goes down (IBV_EVENT_PORT_ERR)"
		long = `disconnect disconnects adapter ADAPTER (vrdmaN, or ethernetN as in the VMX) of
VM NAME, whose workload runs on this agent's host, as clearing the "Connected"
box of a network adapter in the vSphere Client, or pulling its cable: its
port goes down (PORT_DOWN in ibv_devinfo and ibv_query_port), no request
leaves or reaches its QPs, which retry and then fail with RETRY_EXC_ERR, and
every context of the adapter gets IBV_EVENT_PORT_ERR. vm connect undoes it;
ethernetN.startConnected = "FALSE" attaches the adapter disconnected.`
	}
	return &cobra.Command{
		Use:   verb + " NAME ADAPTER",
		Short: short,
		Long:  long,
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			adapter := args[1]
			if n, ok := strings.CutPrefix(adapter, "ethernet"); ok {
				adapter = "vrdma" + n
			}
			ctx, ag, done, err := a.openAgent(cmd)
			if err != nil {
				return err
			}
			defer done()
			r, err := ag.ConnectAdapter(ctx, args[0], adapter, connected)
			if err != nil {
				return fmt.Errorf("vm %s %s %s: %w", verb, args[0], args[1], err)
			}
			if a.json() {
				return a.printJSON(r)
			}
			state := "connected"
			if !connected {
				state = "disconnected"
			}
			if !r.Changed {
				fmt.Fprintf(a.stdout, "VM %s adapter %s is already %s\n", r.VM, r.Adapter, state)
				return nil
			}
			fmt.Fprintf(a.stdout, "VM %s adapter %s %s; %d workloads told\n", r.VM, r.Adapter, state, r.Workloads)
			return nil
		},
	}
}
