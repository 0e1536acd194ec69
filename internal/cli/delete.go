// SPDX-License-Identifier: Apache-2.0

package cli

// switch delete and portgroup delete: as the vSphere Client's, they refuse
// while something is on what they would remove (a distributed switch with
// port groups or hosts; a port group with a VM's adapter on it), and name
// what is, with how to take it off.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/vmconfig"
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
			name := args[0]
			return a.deleteRecord(cmd.Context(), "switch "+name, records.SwitchKey(name), func(ctx context.Context, st *store.Store) error {
				pgs, _, _, err := store.List[records.PortGroup](ctx, st, records.PortGroupPrefix)
				if err != nil {
					return err
				}
				var on []string
				for _, p := range pgs {
					if p.Value.Switch == name {
						on = append(on, p.Value.Key)
					}
				}
				if len(on) > 0 {
					return fmt.Errorf("switch delete %s: refused: port groups %s are on it; delete them first (vrdmactl portgroup delete KEY)", name, strings.Join(on, ", "))
				}
				hosts, _, _, err := store.List[records.Host](ctx, st, records.HostPrefix)
				if err != nil {
					return err
				}
				on = on[:0]
				for _, h := range hosts {
					if h.Value.Switch == name {
						on = append(on, h.Value.Name)
					}
				}
				if len(on) > 0 {
					return fmt.Errorf("switch delete %s: refused: hosts %s have joined it; start their agents with another --switch, or remove a host that is down (vrdmactl host remove H)", name, strings.Join(on, ", "))
				}
				return nil
			}, records.SwitchSecretKey(name))
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
			key := args[0]
			return a.deleteRecord(cmd.Context(), "port group "+key, records.PortGroupKey(key), func(ctx context.Context, st *store.Store) error {
				ads, _, _, err := store.List[records.Adapter](ctx, st, records.AdapterPrefix)
				if err != nil {
					return err
				}
				var on []string
				for _, ad := range ads {
					if ad.Value.PortGroup == key {
						on = append(on, ad.Value.VM+"/"+ad.Value.Name())
					}
				}
				vms, _, _, err := store.List[records.VM](ctx, st, records.VMPrefix)
				if err != nil {
					return err
				}
				for _, v := range vms {
					if !v.Value.Managed {
						continue
					}
					c, err := vmconfig.Parse([]byte(v.Value.VMX))
					if err != nil {
						continue // a VMX that does not parse puts no adapter anywhere
					}
					for _, ad := range c.Adapters {
						if ad.PortGroupID == key {
							on = append(on, v.Value.Name+"/"+records.AdapterName(ad.Index))
						}
					}
				}
				if len(on) > 0 {
					slices.Sort(on)
					on = slices.Compact(on)
					return fmt.Errorf("portgroup delete %s: refused: adapters %s are on it; power their VMs off, or move the adapters to another port group (vrdmactl vm edit)", key, strings.Join(on, ", "))
				}
				return nil
			})
		},
	}
}

// deleteRecord deletes the record at key (what names it in messages),
// with the keys also, once check found nothing on it. The record must
// exist.
func (a *app) deleteRecord(ctx context.Context, what, key string, check func(context.Context, *store.Store) error, also ...string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	st, err := a.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	exists := func(tx *store.Tx) error {
		ok, err := tx.Exists(key)
		if err == nil && !ok {
			err = fmt.Errorf("%s: not found in the control plane", what)
		}
		return err
	}
	if _, err := store.Txn(ctx, st, exists); err != nil {
		return err
	}
	if err := check(ctx, st); err != nil {
		return err
	}
	_, err = store.Txn(ctx, st, func(tx *store.Tx) error {
		if err := exists(tx); err != nil {
			return err
		}
		for _, k := range append([]string{key}, also...) {
			if err := tx.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete %s: %w", what, err)
	}
	if a.json() {
		return a.printJSON(map[string]string{"deleted": what})
	}
	fmt.Fprintf(a.stdout, "%s deleted\n", what)
	return nil
}
