// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// pathReport is what path explain prints (-o json).
type pathReport struct {
	A        string              `json:"a"`
	B        string              `json:"b"`
	OK       bool                `json:"ok"`
	Path     pathsel.Path        `json:"path"`
	Reason   string              `json:"reason"`
	Rejected []pathsel.Rejection `json:"rejected"`
	Warnings []string            `json:"warnings,omitempty"` // network checks that failed on an rdma path kept by network policy warn
	Error    string              `json:"error,omitempty"`
}

// pathCommand is "vrdmactl path explain A B": the control plane's path
// decision between two adapters, as the agents make it at connect time.
func (a *app) pathCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "path",
		Short: "Explain the path (memcpy, rdma, tcp) between two adapters",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("path: name a subcommand: explain")
		},
	}
	explain := &cobra.Command{
		Use:   "explain VM1/vrdmaN VM2/vrdmaM",
		Short: "Print the path two adapters get, why, and every rejected candidate with why",
		Long: `explain decides the path between two adapters, each named "vm/vrdmaN" or by
GID, exactly as the agents do when they connect: from the two hosts' records,
the switch and the port groups in the control plane. It prints the path, the
reason, and every candidate it rejected with why. It exits 1 when the two
cannot connect at all (different switches, VLAN isolation, a host down).`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				d, err := c.Decide(cmd.Context(), args[0], args[1])
				if err == nil && d.Path == pathsel.Memcpy {
					d = explainDirect(cmd.Context(), c, args[0], args[1], d)
				}
				r := pathReport{A: args[0], B: args[1], OK: err == nil, Path: d.Path, Reason: d.Reason, Rejected: d.Rejected, Warnings: d.Warnings}
				if r.Rejected == nil {
					r.Rejected = []pathsel.Rejection{}
				}
				if err != nil {
					if errors.Is(err, store.ErrNotFound) {
						err = fmt.Errorf("%w (is the VM attached? 'vrdmactl vm list --cluster')", err)
					}
					r.Error = err.Error()
				}
				if a.json() {
					if err := a.printJSON(r); err != nil {
						return err
					}
				} else {
					if r.OK {
						fmt.Fprintf(a.stdout, "%s ↔ %s: %s\n  reason: %s\n", r.A, r.B, r.Path, r.Reason)
					} else {
						fmt.Fprintf(a.stdout, "%s ↔ %s: cannot connect\n  error: %s\n", r.A, r.B, r.Error)
					}
					for _, rj := range r.Rejected {
						fmt.Fprintf(a.stdout, "  rejected %s: %s\n", rj.Path, rj.Why)
					}
					for _, w := range r.Warnings {
						fmt.Fprintf(a.stdout, "  warning: %s\n", w)
					}
				}
				if err != nil {
					return &exitError{code: exitFailure, err: fmt.Errorf("path explain: %w", err)}
				}
				return nil
			})
		},
	}
	cmd.AddCommand(explain)
	return cmd
}

// explainDirect turns a memcpy decision between a and b into memcpy-direct
// when both VMs list each other in vrdma.directPeers (their VMX records),
// or adds the rule that refused it when either sets the key
// (docs/wire-local.md §4.21). The sessions' capability, the agent's last
// check, is said in the reason.
func explainDirect(ctx context.Context, c *member.Cache, a, b string, d pathsel.Decision) pathsel.Decision {
	cfg := func(target string) (string, *vmconfig.Config, bool) {
		e, err := c.Resolve(ctx, target)
		if err != nil {
			return "", nil, false
		}
		vm, err := c.VM(ctx, e.VM)
		if err != nil {
			return "", nil, false
		}
		vc, err := vmconfig.Parse([]byte(vm.VMX))
		if err != nil {
			return "", nil, false
		}
		return e.VM, vc, true
	}
	na, ca, oka := cfg(a)
	nb, cb, okb := cfg(b)
	if !oka || !okb {
		return d
	}
	ok, apply, why := vmconfig.DirectVerdict(na, nb, ca, cb)
	switch {
	case ok:
		d.Path, d.Reason = abi.PathMemcpyDirect, why+" (RC QPs between workloads whose libraries set capability memcpy-direct; otherwise memcpy)"
	case apply:
		d.Rejected = append(d.Rejected, pathsel.Rejection{Path: abi.PathMemcpyDirect, Why: why})
	}
	return d
}
