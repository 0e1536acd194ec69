// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/hostkey"
)

// hostReport is one host as host list and host show print it.
type hostReport struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	State          string `json:"state"`    // effective: down when no live lease
	Declared       string `json:"declared"` // as the record says
	Switch         string `json:"switch"`
	PVRDMAAddress  string `json:"pvrdma_address"`
	FirewallPVRDMA bool   `json:"firewall_pvrdma"`
	// PVRDMANamespaces: PVRDMA namespaces are on for the host's RDMA
	// uplink, as native endpoints need.
	PVRDMANamespaces bool             `json:"pvrdma_namespaces"`
	Uplinks          []records.Uplink `json:"uplinks"`
	AgentVersion     string           `json:"agent_version"`
	LeaseAgeS        float64          `json:"lease_age_s"` // how long it has held its lease; 0 when down
	VMs              []string         `json:"vms,omitempty"`
	Datacenter       string           `json:"datacenter,omitempty"` // its place in the inventory
	Cluster          string           `json:"cluster,omitempty"`
	Folder           string           `json:"folder,omitempty"`
	HostKey          string           `json:"host_key,omitempty"` // the public key it signs its handshakes with, hex
}

func hostReportOf(h member.HostStatus) hostReport {
	r := hostReport{ID: h.Host.ID, Name: h.Host.Name, State: string(h.Host.State), Declared: string(h.Declared), Switch: h.Host.Switch,
		FirewallPVRDMA: h.Host.FirewallPVRDMA, PVRDMANamespaces: h.Host.PVRDMANamespaces, Uplinks: h.Host.Uplinks, AgentVersion: h.Host.AgentVersion,
		LeaseAgeS: round2(h.LeaseAge(time.Now()).Seconds()), Datacenter: h.Host.Datacenter, Cluster: h.Host.Cluster, Folder: h.Host.Folder,
		HostKey: h.Host.HostKey}
	if h.Host.PVRDMAAddress.IsValid() {
		r.PVRDMAAddress = h.Host.PVRDMAAddress.String()
	}
	if r.Uplinks == nil {
		r.Uplinks = []records.Uplink{}
	}
	return r
}

func uplinksText(us []records.Uplink) string {
	if len(us) == 0 {
		return "-"
	}
	var s []string
	for _, u := range us {
		t := string(u.Kind) + " " + u.Address.String()
		if u.Device != "" {
			t += " (" + u.Device + ")"
		}
		s = append(s, t)
	}
	return strings.Join(s, ", ")
}

func leaseAge(s float64) string {
	if s == 0 {
		return "-"
	}
	return (time.Duration(s*1000) * time.Millisecond).Round(time.Second).String()
}

// hostCommand is "vrdmactl host": the hosts registered in the control
// plane, with their liveness.
func (a *app) hostCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "List, show and configure the hosts of the control plane",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("host: name a subcommand: list, show, configure, remove, uplink or forget-key")
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the hosts: state (up while the agent holds its lease), switch, uplinks, lease age",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				hosts := []hostReport{}
				for _, h := range c.Hosts() {
					hosts = append(hosts, hostReportOf(h))
				}
				if a.json() {
					return a.printJSON(map[string]any{"hosts": hosts})
				}
				if len(hosts) == 0 {
					fmt.Fprintln(a.stdout, "no hosts: start vrdmad")
					return nil
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tID\tSTATE\tSWITCH\tPVRDMA ADDRESS\tFIREWALL\tUPLINKS\tLEASE AGE\tVERSION")
				for _, h := range hosts {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, h.ID, h.State, orDash(h.Switch), orDash(h.PVRDMAAddress),
						onOff(h.FirewallPVRDMA), uplinksText(h.Uplinks), leaseAge(h.LeaseAgeS), h.AgentVersion)
				}
				return tw.Flush()
			})
		},
	}
	show := &cobra.Command{
		Use:   "show ID|NAME",
		Short: "Show a host, with its uplinks and VMs",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
				id, err := admin.HostID(c, args[0])
				if err != nil {
					return err
				}
				hs, err := c.Host(cmd.Context(), id)
				if err != nil {
					return err
				}
				r := hostReportOf(hs)
				for _, v := range c.VMs() {
					if v.Host == r.ID {
						r.VMs = append(r.VMs, v.Name)
					}
				}
				if a.json() {
					return a.printJSON(r)
				}
				fmt.Fprintf(a.stdout, "host %s (%s)\n  state:          %s (declared %s)\n  lease age:      %s\n  switch:         %s\n  PVRDMA address: %s\n  firewall:       pvrdma %s\n  agent:          %s\n",
					r.Name, r.ID, r.State, r.Declared, leaseAge(r.LeaseAgeS), orDash(r.Switch), orDash(r.PVRDMAAddress), onOff(r.FirewallPVRDMA), r.AgentVersion)
				fmt.Fprintf(a.stdout, "  RDMA uplinks:   %d, PVRDMA namespaces %s\n", len(r.Uplinks), onOff(r.PVRDMANamespaces))
				for _, u := range r.Uplinks {
					fmt.Fprintf(a.stdout, "    %s %s GID %s %s\n", u.Kind, u.Address, u.GID, strings.Join(u.Capabilities, ","))
					if u.Device != "" {
						fmt.Fprintf(a.stdout, "      device:   %s\n", u.Device)
					}
					if u.MAC != "" {
						fmt.Fprintf(a.stdout, "      RoCE v1:  MAC %s\n", u.MAC)
					}
					fmt.Fprintf(a.stdout, "      declared: %s\n", admin.NICText(u.Declared))
					if !u.Observed.IsZero() {
						fmt.Fprintf(a.stdout, "      observed: %s\n", admin.NICText(u.Observed))
					}
				}
				fmt.Fprintf(a.stdout, "  inventory:      datacenter %s, cluster %s, folder %s\n", orDash(r.Datacenter), orDash(r.Cluster), orDash(r.Folder))
				fmt.Fprintf(a.stdout, "  VMs:            %s\n", orDash(strings.Join(r.VMs, ", ")))
				return nil
			})
		},
	}
	cmd.AddCommand(list, show, a.hostConfigureCommand(), a.hostRemoveCommand(), // inventory.go
		a.hostUplinkCommand(), // network.go
		a.hostForgetKeyCommand())
	return cmd
}

// hostForgetKeyCommand is "vrdmactl host forget-key": the local agent
// forgets the host key it pinned for a host, and pins the one the host's
// record publishes at their next handshake.
func (a *app) hostForgetKeyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "forget-key ID|NAME",
		Short: "Forget the host key this host's agent pinned for another host (accept its new key)",
		Long: `forget-key removes the host key that the agent of this machine (the one of
--state-dir) pinned for host H the first time it saw it. Every agent signs its
tcp handshakes with its own host key, publishes the public key in its host
record, and refuses a host whose published key is not the one it pinned (rule
host-key): another host may be posing as it. When host H was reinstalled and
really has a new key, run this on every host that refuses it; the next
handshake pins the key H's record publishes then. Check first, on host H, that
its record's key is its own (vrdmactl host show H -o json, "hostKey", against
the public key of H's STATE-DIR/host-key). H is a host ID, or a host name
resolved in the control plane. Root only: the pins are in the agent's state
directory.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if !hexHostID(id) {
				err := a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
					var err error
					id, err = admin.HostID(c, args[0])
					return err
				})
				if err != nil {
					return fmt.Errorf("host forget-key %s: %w", args[0], err)
				}
			}
			pins := hostkey.NewPins(a.ctl.stateDir)
			found, err := pins.Forget(id)
			if err != nil {
				return fmt.Errorf("host forget-key %s: %w (run it as the agent's user, root, with the agent's --state-dir)", args[0], err)
			}
			if a.json() {
				return a.printJSON(forgetKeyReport{Host: id, Forgotten: found, Pins: pins.Path()})
			}
			if !found {
				fmt.Fprintf(a.stdout, "no key pinned for host %s in %s: nothing to forget\n", id, pins.Path())
				return nil
			}
			fmt.Fprintf(a.stdout, "forgot the key pinned for host %s in %s; the next handshake pins the key its record publishes\n", id, pins.Path())
			return nil
		},
	}
}

// forgetKeyReport is "vrdmactl host forget-key -o json".
type forgetKeyReport struct {
	Host      string `json:"host"`      // the host's ID
	Forgotten bool   `json:"forgotten"` // a key was pinned for it, and is forgotten
	Pins      string `json:"pins"`      // the file of the pinned keys
}

// hostRemoveReport is "vrdmactl host remove -o json".
type hostRemoveReport struct {
	Removed    string   `json:"removed"`     // the host's ID
	Name       string   `json:"name"`        // its name
	VMsRemoved []string `json:"vms_removed"` // the VM records its agent left, removed with it
}

// hexHostID reports whether s has the form of a host ID.
func hexHostID(s string) bool {
	if len(s) != 32 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// hostRemoveCommand is "vrdmactl host remove": vSphere's "Remove from
// Inventory" for a host that is gone.
func (a *app) hostRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID|NAME",
		Short: "Remove a down host from the control plane, with the VM records its agent left",
		Long: `remove deletes a host's record from the control plane, as vSphere's "Remove from
Inventory" does for a host that is gone: a machine retired, or reinstalled with
a new host ID under the same name. The host must be down (its agent holds no
lease: stop its vrdmad first), and no managed VM may be registered on it
(vm undefine them, or create them elsewhere). The records of VMs its agent
published and left behind (it crashed) go with it. An agent that starts again
with the same host ID registers the host anew.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var removed hostReport
			var stale []string
			err := a.withCache(cmd.Context(), func(st *store.Store, c *member.Cache) error {
				ctx := cmd.Context()
				id, err := admin.HostID(c, args[0])
				if err != nil {
					return err
				}
				hs, err := c.Host(ctx, id)
				if err != nil {
					return err
				}
				removed = hostReportOf(hs)
				// The lease, from etcd itself: the cache may lag.
				if _, _, err := store.Get[records.Alive](ctx, st, records.AliveKey(id)); err == nil {
					return fmt.Errorf("host %s (%s) is up: its agent holds a lease; stop its vrdmad first", hs.Host.Name, id)
				} else if !errors.Is(err, store.ErrNotFound) {
					return err
				}
				var managed []string
				for _, v := range c.VMs() {
					switch {
					case v.Host != id:
					case v.Managed:
						managed = append(managed, v.Name)
					default:
						stale = append(stale, v.Name)
					}
				}
				if len(managed) > 0 {
					return fmt.Errorf("host %s (%s) has managed VMs registered on it: %s; move them to another host (vrdmactl vm power-on VM --host H, then vm power-off VM) or delete them (vm power-off, then vm undefine) first",
						hs.Host.Name, id, strings.Join(managed, ", "))
				}
				for _, name := range stale {
					if err := member.RemoveVMOf(ctx, st, name, id); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, member.ErrPlacement) {
						return fmt.Errorf("remove VM %s, left by host %s: %w", name, id, err)
					}
				}
				_, rev, err := store.Get[records.Host](ctx, st, records.HostKey(id))
				if err == nil {
					err = st.Delete(ctx, records.HostKey(id), rev) // not if it changed meanwhile (an agent registered it)
				}
				if err != nil && !errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("remove host %s: %w", id, err)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("host remove %s: %w", args[0], err)
			}
			if stale == nil {
				stale = []string{}
			}
			if a.json() {
				return a.printJSON(hostRemoveReport{Removed: removed.ID, Name: removed.Name, VMsRemoved: stale})
			}
			fmt.Fprintf(a.stdout, "host %s (%s) removed from the control plane", removed.Name, removed.ID)
			if len(stale) > 0 {
				fmt.Fprintf(a.stdout, ", with the VM records it left: %s", strings.Join(stale, ", "))
			}
			fmt.Fprintln(a.stdout)
			return nil
		},
	}
}
