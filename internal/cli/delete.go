// SPDX-License-Identifier: Apache-2.0

package cli

// switch delete and portgroup delete: as the vSphere Client's, they refuse
// while something is on what they would remove (a distributed switch with
// port groups or hosts; a port group with a VM's adapter on it), and name
// what is, with how to take it off.

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/store"
)

// switchDeleteCommand is "vrdmactl switch delete NAME".
func (a *app) switchDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete distributed switch NAME (refused while port groups or hosts are on it)",
		Long: `delete removes distributed switch NAME and its secret from the control plane.
It is refused while port groups are on the switch (delete them first) or hosts
have joined it (start their agents with another --switch, or remove a host that
is down with vrdmactl host remove).`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.deleted(cmd.Context(), "switch "+args[0], func(ctx context.Context, st *store.Store) error {
				return admin.DeleteSwitch(ctx, st, args[0])
			})
		},
	}
}

// portgroupDeleteCommand is "vrdmactl portgroup delete KEY".
func (a *app) portgroupDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete KEY",
		Short: "Delete distributed port group KEY (refused while a VM's adapter is on it)",
		Long: `delete removes distributed port group KEY from the control plane. It is
refused while an adapter of a running VM is on it, or a managed VM's
configuration puts an adapter on it (ethernetN.dvs.portgroupId = "KEY"): power
the VM off, or move its adapter (vrdmactl vm edit). A VM defined on an agent
and not running is not known to the control plane: its next power-on fails,
naming the missing port group.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.deleted(cmd.Context(), "port group "+args[0], func(ctx context.Context, st *store.Store) error {
				return admin.DeletePortGroup(ctx, st, args[0])
			})
		},
	}
}

// deleted runs del against the control plane and reports what it
// deleted.
func (a *app) deleted(ctx context.Context, what string, del func(context.Context, *store.Store) error) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	st, err := a.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := del(ctx, st); err != nil {
		return err
	}
	if a.json() {
		return a.printJSON(map[string]string{"deleted": what})
	}
	fmt.Fprintf(a.stdout, "%s deleted\n", what)
	return nil
}
