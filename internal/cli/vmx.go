// SPDX-License-Identifier: Apache-2.0

package cli

// vrdmactl vmx: the PVRDMA linter for .vmx files (docs/vmx-rules.md). It runs
// the rules of package rules, the same that refuse a power-on in vrdma, on
// real vSphere .vmx files against a target ESXi version, and on a host of
// the control plane when --host names one.
//
// Exit status: 0 when no file has an error (warnings allowed), 1 when a
// rule reports an error in some file, 2 when a file cannot be read or
// parsed, or the command cannot run (bad flags, --host not found). With
// -o json the report is on stdout whatever the status.

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/rules"
	"github.com/vrdma/vrdma/internal/vmx"
)

// vmxFileReport is one file of `vmx check -o json`.
type vmxFileReport struct {
	File     string          `json:"file"`
	Error    string          `json:"error,omitempty"` // the file could not be read or parsed
	Findings []rules.Finding `json:"findings"`        // never null
}

// vmxCommand is "vrdmactl vmx".
func (a *app) vmxCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vmx",
		Short: "Check .vmx files against the PVRDMA prerequisites (a linter)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("vmx: name a subcommand: check or rules")
		},
	}
	cmd.AddCommand(a.vmxCheckCommand(), a.vmxRulesCommand())
	return cmd
}

func (a *app) vmxCheckCommand() *cobra.Command {
	var esxi, host string
	cmd := &cobra.Command{
		Use:   "check FILE.vmx... [--esxi VERSION] [--host ID|NAME]",
		Short: "Lint .vmx files against a target ESXi version ('-' reads stdin)",
		Long: `check runs the PVRDMA rules on each .vmx file, the same rules that refuse a
power-on in vrdma: virtual hardware version, 64-bit Linux guest, all guest
memory reserved and locked, distributed port groups, adapter count, native
endpoints, async mode... Each finding names its rule (a stable ID, see
'vrdmactl vmx rules' and docs/vmx-rules.md), the key and line, and what to
change.

--esxi is the ESXi version the VMs are to run on, written 8.0, 7.0.2,
7.0U2 or "7.0 Update 2" (7.0 U2 is 7.0.2); without it the rules check
against vrdma's own level, ESXi 8.0. --host also runs the host rules against
that host of the control plane (see --etcd-endpoints, --state-dir), and the
checks vm power-on adds there: the host is up (host-up), each adapter's port
group exists on the host's switch (portgroup-exists) and its dvs.switchId
names that switch (portgroup-switch). Only host-datacenter is left to
power-on, since a file does not say the VM's datacenter.

Exit status: 0 when no file has an error (warnings allowed), 1 when a rule
reports an error, 2 when a file cannot be read or parsed. With -o json the
report goes to stdout whatever the exit status: a list with, per file,
{"file", "findings": [{"rule", "severity", "key", "line", "message"}]}, and
"error" for a file that could not be read or parsed.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("%s: name at least one .vmx file (usage: %s)", cmd.CommandPath(), cmd.UseLine())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			target := rules.Target{ESXi: rules.Default}
			if cmd.Flags().Changed("esxi") {
				v, err := rules.ParseVersion(esxi)
				if err != nil {
					return usageErrorf("vmx check: --esxi: %v", err)
				}
				target.ESXi = v
			}
			if host == "" {
				return a.vmxCheck(args, target, nil)
			}
			// The host rules, and power-on's placement checks, against the
			// control plane as it is now.
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				id, err := admin.HostID(c, host)
				if err != nil {
					fmt.Fprintf(a.stderr, "vrdmactl: vmx check: --host: %v\n", err)
					return &exitError{code: exitUsage}
				}
				hs, err := c.Host(cmd.Context(), id)
				if err != nil {
					fmt.Fprintf(a.stderr, "vrdmactl: vmx check: --host: %v\n", err)
					return &exitError{code: exitUsage}
				}
				h := hs.Host
				if hs.Alive == nil {
					h.State = records.HostDown
				}
				target.Host = member.RulesHost(h)
				return a.vmxCheck(args, target, func(f *vmx.File) []rules.Finding {
					return c.PlacementFindings(cmd.Context(), f, h, "", "")
				})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&esxi, "esxi", rules.Default.String(), `target ESXi version: 8.0, 7.0.2, 7.0U2, "7.0 Update 2"...`)
	f.StringVar(&host, "host", "", "also run the host rules against this host of the control plane (ID or name)")
	return cmd
}

// vmxCheck lints files against target, and with extra's checks when it is
// not nil, and reports; see vmxCheckCommand for the exit status.
func (a *app) vmxCheck(files []string, target rules.Target, extra func(*vmx.File) []rules.Finding) error {
	reports := make([]vmxFileReport, 0, len(files))
	unreadable, failed := false, false
	stdinRead := false
	for _, name := range files {
		r := vmxFileReport{File: name, Findings: []rules.Finding{}}
		f, err := a.lintRead(name, &stdinRead)
		if err != nil {
			unreadable = true
			r.Error = err.Error()
			fmt.Fprintf(a.stderr, "vrdmactl: vmx check: %v\n", err)
		} else {
			r.Findings = append(r.Findings, rules.Check(f, target)...)
			if extra != nil {
				r.Findings = append(r.Findings, extra(f)...)
			}
			failed = failed || rules.HasError(r.Findings)
		}
		reports = append(reports, r)
	}
	if a.json() {
		if err := a.printJSON(reports); err != nil {
			return err
		}
	} else {
		a.printVMXReports(reports, target)
	}
	switch {
	case unreadable:
		return &exitError{code: exitUsage} // 2: already reported on stderr
	case failed:
		return &exitError{code: exitFailure}
	}
	return nil
}

// lintRead reads and parses file name ("-" is stdin, read once). Errors
// name the file and, for a parse error, the line.
func (a *app) lintRead(name string, stdinRead *bool) (*vmx.File, error) {
	var r io.Reader
	if name == "-" {
		if *stdinRead {
			return nil, fmt.Errorf("-: standard input is named twice; name it once")
		}
		*stdinRead = true
		r = a.stdin
	} else {
		fh, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("%w: check the path and its permissions", err)
		}
		defer fh.Close()
		if st, err := fh.Stat(); err == nil && st.IsDir() {
			return nil, fmt.Errorf("%s: is a directory, not a .vmx file", name)
		}
		r = fh
	}
	// Read one byte past the limit, so that Parse reports a file that is
	// too large without reading all of it (or /dev/zero) into memory.
	b, err := io.ReadAll(io.LimitReader(r, vmx.MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(b) > vmx.MaxSize {
		return nil, fmt.Errorf("%s: larger than the %d-byte limit for a .vmx file (a .vmx file is normally a few kilobytes): check that this is the right file", name, vmx.MaxSize)
	}
	f, err := vmx.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: cannot parse: %w", name, err)
	}
	return f, nil
}

// printVMXReports prints reports as text: one line per finding, as
// compilers do (FILE:LINE: severity [rule] message), and a summary line per
// file.
func (a *app) printVMXReports(reports []vmxFileReport, target rules.Target) {
	against := "ESXi " + target.ESXi.String()
	if target.ESXi == rules.Default {
		against += " (vrdma's level; --esxi to change)"
	}
	if target.Host != nil {
		against += " and host " + target.Host.Name
	}
	for _, r := range reports {
		if r.Error != "" {
			continue // reported on stderr
		}
		errs, warns := 0, 0
		for _, f := range r.Findings {
			where := r.File
			if f.Line > 0 {
				where = fmt.Sprintf("%s:%d", r.File, f.Line)
			}
			fmt.Fprintf(a.stdout, "%s: %s [%s] %s\n", where, f.Severity, f.Rule, f.Message)
			if f.Severity == rules.SeverityError {
				errs++
			} else {
				warns++
			}
		}
		if errs+warns == 0 {
			fmt.Fprintf(a.stdout, "%s: ok against %s\n", r.File, against)
		} else {
			fmt.Fprintf(a.stdout, "%s: %s, %s against %s\n", r.File, vmxPlural(errs, "error"), vmxPlural(warns, "warning"), against)
		}
	}
}

// vmxPlural returns "1 error", "2 errors".
func vmxPlural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// vmxRulesCommand is "vrdmactl vmx rules": the list of rules.
func (a *app) vmxRulesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rules",
		Short: "List the rules of 'vmx check' with their stable IDs and severities",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			rs := rules.Rules()
			if a.json() {
				return a.printJSON(rs)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "RULE\tSEVERITY\tCHECKS")
			for _, r := range rs {
				d := r.Description
				if r.Host {
					d += " (with --host)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", r.ID, r.Severity, d)
			}
			return tw.Flush()
		},
	}
}
