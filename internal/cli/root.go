// SPDX-License-Identifier: Apache-2.0

// Package cli is vrdmactl, the command line of vrdma: one file per
// subcommand, built on cobra. Main is the whole program; cmd/vrdmactl
// only calls it.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/fault"
	"github.com/vrdma/vrdma/internal/locations"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed
	exitUsage   = 2 // the command line is wrong
)

// app is the state shared by the subcommands: the global flags and where
// output goes.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	socket string       // --socket
	output string       // -o/--output: text or json
	ctl    controlFlags // where etcd is (control.go)
	// command is the running command's path without "vrdmactl"
	// ("switch show"), for jsonPrinted.
	command string
}

// exitError makes Main exit with code, printing err if it is not nil.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// Main runs vrdmactl with args (without the program name) and returns the
// process exit code. SIGINT and SIGTERM cancel the command's context, so
// that commands which started an agent or attached VMs clean up.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if fault.WorkloadRequested() { // a workload process of vrdmactl soak
		return fault.WorkloadMain()
	}
	if len(args) > 0 && args[0] == viewHelperArg { // exec's device view, in the program's namespaces
		return viewMain(args[1:], stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitFailure
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		if ee.err == nil {
			return code
		}
	} else if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") {
		code = exitUsage
	}
	fmt.Fprintf(stderr, "vrdmactl: %v\n", err)
	if code == exitUsage {
		fmt.Fprintln(stderr, "Run 'vrdmactl --help' for usage.")
	}
	return code
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "vrdmactl",
		Short: "Manage and measure vrdma, a paravirtual RDMA fabric",
		Long: `vrdmactl manages vrdma: the host agent (vrdmad), its VMs and their RDMA
adapters, and measures the paths between them.

Start with 'vrdmactl quickstart': it needs no root and no installed agent, and
shows VMs talking RDMA on this machine in a few seconds: on one host (memcpy)
and between two hosts (tcp).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.command = strings.TrimPrefix(strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()), " ")
			if a.output != "text" && a.output != "json" && a.output != "yaml" {
				return usageErrorf("--output %q: want text, json or yaml", a.output)
			}
			return nil
		},
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: exitUsage, err: err}
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.socket, "socket", locations.Socket(), "the agent's Unix socket (env VRDMA_SOCKET)")
	pf.StringVarP(&a.output, "output", "o", "text", "output format: text, json or yaml (the JSON documents' fields, as YAML)")
	a.addControlFlags(root)
	root.AddCommand(
		a.agentCommand(),
		a.quickstartCommand(),
		a.soakCommand(), // soak.go
		a.devinfoCommand(),
		a.execCommand(), // exec.go
		a.statusCommand(),
		a.statCommand(),
		a.resCommand(), // res.go
		a.vmCommand(),
		a.perfCommand(),
		a.nativePeerCommand(), // nativepeer.go
		a.switchCommand(),
		a.portgroupCommand(),
		a.hostCommand(),
		a.pathCommand(),
		a.vmxCommand(),       // vmx.go
		a.inventoryCommand(), // inventory.go
		a.networkCommand(),   // network.go
		a.versionCommand(),   // version.go
		a.doctorCommand(),    // doctor.go
		a.consoleCommand(),   // console.go
	)
	addManual(root)        // help.go
	a.addCompletions(root) // complete.go
	return root
}

// json reports whether -o json or -o yaml was given: output for
// programs, printed by printJSON.
func (a *app) json() bool { return a.output == "json" || a.output == "yaml" }

// printJSON writes v to stdout, indented, its field names in snake_case
// (snakeJSON); with -o yaml as YAML, the same fields under the same names.
func (a *app) printJSON(v any) error {
	if jsonPrinted != nil {
		jsonPrinted(a.command, v)
	}
	v = snakeJSON(reflect.ValueOf(v))
	if a.output == "yaml" {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(append([]byte("---\n"), y...))
		return err
	}
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// jsonPrinted, if set, sees every value printJSON prints, with the
// command that printed it (tests check the output against its schema).
var jsonPrinted func(command string, v any)

// dialAgent connects to the agent at --socket, for management commands.
func (a *app) dialAgent(ctx context.Context) (*vrdma.Agent, error) {
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(a.socket))
	if errors.Is(err, fs.ErrPermission) {
		return nil, fmt.Errorf("no agent at %s (the socket is its group's: join the group, usermod -aG vrdma USER, or ask root): %w", a.socket, errors.Unwrap(err))
	}
	if err != nil {
		return nil, fmt.Errorf("no agent at %s (is vrdmad running? --socket or VRDMA_SOCKET names another socket): %w", a.socket, errors.Unwrap(err))
	}
	return ag, nil
}

// openAgent connects to the agent for a management command, both bounded
// by callTimeout; done closes the connection and releases the context.
func (a *app) openAgent(cmd *cobra.Command) (context.Context, *vrdma.Agent, func(), error) {
	ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
	ag, err := a.dialAgent(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, ag, func() { ag.Close(); cancel() }, nil
}

// agentStatus returns the agent's status report and its release, for
// command what ("status") of cmd.
func (a *app) agentStatus(cmd *cobra.Command, what string) (vrdma.Status, string, error) {
	ctx, ag, done, err := a.openAgent(cmd)
	if err != nil {
		return vrdma.Status{}, "", err
	}
	defer done()
	st, err := ag.Status(ctx)
	if err != nil {
		return st, "", fmt.Errorf("%s: %w", what, err)
	}
	return st, ag.Info.AgentVersion, nil
}

// callTimeout bounds management commands against a running agent.
const callTimeout = 15 * time.Second

// exactArgs is cobra.ExactArgs with a usage error that shows the usage.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("%s: want %d arguments, got %d (usage: %s)", cmd.CommandPath(), n, len(args), cmd.UseLine())
		}
		return nil
	}
}

// rangeArgs is cobra.RangeArgs with a usage error that shows the usage.
func rangeArgs(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usageErrorf("%s: want %d to %d arguments, got %d (usage: %s)", cmd.CommandPath(), lo, hi, len(args), cmd.UseLine())
		}
		return nil
	}
}

// mib formats a byte count in MiB.
func mib(n uint64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// Command returns vrdmactl's command tree, for documentation that cobra
// generates from it (man pages): every command's usage, description,
// examples and flags, the same as --help prints. Its output goes to the
// process's standard streams.
func Command() *cobra.Command {
	a := &app{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr}
	return a.rootCommand()
}
