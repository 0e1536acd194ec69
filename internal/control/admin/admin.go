// SPDX-License-Identifier: Apache-2.0

// Package admin is the control plane's administrative writes that
// vrdmactl and its web console share: configure a host for PVRDMA
// (tagged address, pvrdma firewall rule, PVRDMA namespaces, inventory
// place, maintenance), create and delete distributed switches and port
// groups. Both callers go through these functions, so the same checks
// refuse the same changes with the same words; the rights are the
// caller's own access to the control plane's store.
package admin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// InvalidError is a change that is wrong as given (a bad value): the
// caller's to fix, not the control plane's state.
type InvalidError struct{ Err error }

// Error is the wrong value's error.
func (e *InvalidError) Error() string { return e.Err.Error() }

// Unwrap returns the wrong value's error.
func (e *InvalidError) Unwrap() error { return e.Err }

func invalidf(format string, args ...any) error {
	return &InvalidError{fmt.Errorf(format, args...)}
}

// ConflictError is a change the control plane's state refuses: the
// object exists already, or something is on what would be deleted. Its
// text names what is in the way and how to take it off.
type ConflictError struct{ Msg string }

// Error is the refusal's text.
func (e *ConflictError) Error() string { return e.Msg }

// HostChange is what ConfigureHost changes: only the fields that are
// not nil.
type HostChange struct {
	// PVRDMAAddress is ADDR:PORT, ADDR (keeping the current port) or
	// "none" (removes the tag): the address that carries PVRDMA traffic
	// between hosts (Net.PVRDMAVmknic).
	PVRDMAAddress *string
	// Vmknic names the interface that holds the address, for people.
	Vmknic *string
	// FirewallPVRDMA is the host's pvrdma firewall rule.
	FirewallPVRDMA *bool
	// PVRDMANamespaces are PVRDMA namespaces on the host's RDMA uplink.
	PVRDMANamespaces *bool
	// Datacenter, Cluster and Folder place the host in the inventory.
	Datacenter, Cluster, Folder *string
	// Maintenance keeps new VMs and connections off the host.
	Maintenance *bool
}

// Empty reports whether ch changes nothing.
func (ch HostChange) Empty() bool {
	return ch.PVRDMAAddress == nil && ch.Vmknic == nil && ch.FirewallPVRDMA == nil && ch.PVRDMANamespaces == nil &&
		ch.Datacenter == nil && ch.Cluster == nil && ch.Folder == nil && ch.Maintenance == nil
}

// HostID finds a host of c by ID or name.
func HostID(c *member.Cache, ref string) (string, error) {
	var found []string
	for _, h := range c.Hosts() {
		if h.Host.ID == ref {
			return ref, nil
		}
		if h.Host.Name == ref {
			found = append(found, h.Host.ID)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("host %s: %w in the control plane (vrdmactl host list)", ref, store.ErrNotFound)
	case 1:
		return found[0], nil
	}
	return "", invalidf("host name %s is ambiguous: name one of the host IDs %s", ref, strings.Join(found, ", "))
}

// ConfigureHost applies ch to the record of host ref (an ID or a name)
// and returns the host as the cache knows it, with the new record. The
// host's running agent applies a new address or firewall rule at once.
func ConfigureHost(ctx context.Context, st *store.Store, c *member.Cache, ref string, ch HostChange) (member.HostStatus, error) {
	if ch.Empty() {
		return member.HostStatus{}, invalidf("host configure: say what to change (PVRDMA address, pvrdma firewall rule, PVRDMA namespaces, datacenter, cluster, folder, vmknic, maintenance)")
	}
	id, err := HostID(c, ref)
	if err != nil {
		return member.HostStatus{}, err
	}
	h, _, err := store.Update(ctx, st, records.HostKey(id), func(old *records.Host) (*records.Host, error) {
		if old == nil {
			return nil, fmt.Errorf("host %s: %w", id, store.ErrNotFound)
		}
		n := *old
		if ch.PVRDMAAddress != nil {
			if n.PVRDMAAddress, err = ParsePVRDMAAddress(*ch.PVRDMAAddress, old.PVRDMAAddress); err != nil {
				return nil, err
			}
			if !n.PVRDMAAddress.IsValid() {
				n.PVRDMAVmknic = ""
			}
			if err := addressFree(c, id, n.PVRDMAAddress); err != nil {
				return nil, err
			}
		}
		set(&n.PVRDMAVmknic, ch.Vmknic)
		set(&n.FirewallPVRDMA, ch.FirewallPVRDMA)
		set(&n.PVRDMANamespaces, ch.PVRDMANamespaces)
		set(&n.Datacenter, ch.Datacenter)
		set(&n.Cluster, ch.Cluster)
		set(&n.Folder, ch.Folder)
		if ch.Maintenance != nil {
			n.State = records.HostUp
			if *ch.Maintenance {
				n.State = records.HostMaintenance
			}
		}
		if err := n.Validate(); err != nil {
			return nil, &InvalidError{err}
		}
		return &n, nil
	})
	if err != nil {
		return member.HostStatus{}, err
	}
	hs, err := c.Host(ctx, h.ID)
	if err != nil {
		hs = member.HostStatus{Host: h, Declared: h.State}
	}
	hs.Host.Inventory, hs.Host.PVRDMAAddress, hs.Host.PVRDMAVmknic, hs.Host.FirewallPVRDMA, hs.Host.PVRDMANamespaces = h.Inventory, h.PVRDMAAddress, h.PVRDMAVmknic, h.FirewallPVRDMA, h.PVRDMANamespaces
	return hs, nil
}

// set sets *dst to *v when v is not nil.
func set[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// addressFree refuses addr when another host has its IP as PVRDMA
// address.
func addressFree(c *member.Cache, id string, addr netip.AddrPort) error {
	if !addr.IsValid() {
		return nil
	}
	for _, h := range c.Hosts() {
		if o := h.Host; o.ID != id && o.PVRDMAAddress.IsValid() && o.PVRDMAAddress.Addr().Unmap() == addr.Addr().Unmap() {
			return &ConflictError{fmt.Sprintf("PVRDMA address %s: %s is host %s's (%s) PVRDMA address already; each host needs its own", addr, o.PVRDMAAddress.Addr(), o.Name, o.ID)}
		}
	}
	return nil
}

// ParsePVRDMAAddress parses a PVRDMA address: ADDR:PORT, ADDR (keeping
// cur's port), or none (or "").
func ParsePVRDMAAddress(s string, cur netip.AddrPort) (netip.AddrPort, error) {
	if s == "none" || s == "" {
		return netip.AddrPort{}, nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	ad, err := netip.ParseAddr(s)
	if err != nil {
		return netip.AddrPort{}, invalidf("PVRDMA address %q: want ADDRESS:PORT (e.g. 192.0.2.10:4791, [2001:db8::1]:4791) or none", s)
	}
	if cur.Port() == 0 {
		return netip.AddrPort{}, invalidf("PVRDMA address %q: the host has no port yet: give ADDRESS:PORT (e.g. %s)", s, netip.AddrPortFrom(ad, 4791))
	}
	return netip.AddrPortFrom(ad, cur.Port()), nil
}

// CreateSwitch creates distributed switch s (a random UUID if it has
// none) and returns it.
func CreateSwitch(ctx context.Context, st *store.Store, s records.Switch) (records.Switch, error) {
	if s.UUID == "" {
		s.UUID = randomUUID()
	}
	if s.UplinkPolicy == "" {
		s.UplinkPolicy = records.UplinkSingle
	}
	if err := s.Validate(); err != nil {
		return s, invalidf("switch create: %v", err)
	}
	if _, err := st.Create(ctx, records.SwitchKey(s.Name), s); err != nil {
		if errors.Is(err, store.ErrExists) {
			return s, &ConflictError{fmt.Sprintf("switch create: switch %s already exists", s.Name)}
		}
		return s, fmt.Errorf("switch create %s: %w", s.Name, err)
	}
	return s, nil
}

// randomUUID returns a random RFC 4122 (version 4) UUID.
func randomUUID() string {
	var b [16]byte
	f, err := os.Open("/dev/urandom")
	if err == nil {
		f.Read(b[:])
		f.Close()
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// CreatePortGroup creates port group p on its switch (which must exist)
// and returns it; its name defaults to its key.
func CreatePortGroup(ctx context.Context, st *store.Store, p records.PortGroup) (records.PortGroup, error) {
	if p.Name == "" {
		p.Name = p.Key
	}
	if p.Switch == "" {
		return p, invalidf("portgroup create: a switch is required (--switch)")
	}
	if err := p.Validate(); err != nil {
		return p, invalidf("portgroup create: %v", err)
	}
	_, err := store.Txn(ctx, st, func(tx *store.Tx) error {
		if ok, err := tx.Exists(records.SwitchKey(p.Switch)); err != nil {
			return err
		} else if !ok {
			return &ConflictError{fmt.Sprintf("switch %s does not exist: create it first (vrdmactl switch create %s)", p.Switch, p.Switch)}
		}
		if ok, err := tx.Exists(records.PortGroupKey(p.Key)); err != nil {
			return err
		} else if ok {
			return &ConflictError{fmt.Sprintf("port group %s already exists", p.Key)}
		}
		return tx.Put(records.PortGroupKey(p.Key), p)
	})
	if err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) {
			return p, &ConflictError{"portgroup create " + p.Key + ": " + ce.Msg}
		}
		return p, fmt.Errorf("portgroup create %s: %w", p.Key, err)
	}
	return p, nil
}

// DeleteSwitch deletes switch name and its secret; refused while port
// groups are on it or hosts have joined it. A name that is not one is
// refused before any key is made of it.
func DeleteSwitch(ctx context.Context, st *store.Store, name string) error {
	if err := records.CheckName(name); err != nil {
		return invalidf("switch delete: the name: %v", err)
	}
	return deleteRecord(ctx, st, "switch "+name, records.SwitchKey(name), func(ctx context.Context) error {
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
			return &ConflictError{fmt.Sprintf("switch delete %s: refused: port groups %s are on it; delete them first (vrdmactl portgroup delete KEY)", name, strings.Join(on, ", "))}
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
			return &ConflictError{fmt.Sprintf("switch delete %s: refused: hosts %s have joined it; start their agents with another --switch, or remove a host that is down (vrdmactl host remove H)", name, strings.Join(on, ", "))}
		}
		return nil
	}, records.SwitchSecretKey(name))
}

// DeletePortGroup deletes port group key; refused while an adapter of a
// running VM is on it, or a managed VM's configuration puts one there.
func DeletePortGroup(ctx context.Context, st *store.Store, key string) error {
	if err := records.CheckName(key); err != nil {
		return invalidf("portgroup delete: the key: %v", err)
	}
	return deleteRecord(ctx, st, "port group "+key, records.PortGroupKey(key), func(ctx context.Context) error {
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
			return &ConflictError{fmt.Sprintf("portgroup delete %s: refused: adapters %s are on it; power their VMs off, or move the adapters to another port group (vrdmactl vm edit)", key, strings.Join(on, ", "))}
		}
		return nil
	})
}

// deleteRecord deletes the record at key (what names it in messages),
// with the keys also, once check found nothing on it. The record must
// exist.
func deleteRecord(ctx context.Context, st *store.Store, what, key string, check func(context.Context) error, also ...string) error {
	exists := func(tx *store.Tx) error {
		ok, err := tx.Exists(key)
		if err == nil && !ok {
			err = fmt.Errorf("%s: %w in the control plane", what, store.ErrNotFound)
		}
		return err
	}
	if _, err := store.Txn(ctx, st, exists); err != nil {
		return err
	}
	if err := check(ctx); err != nil {
		return err
	}
	_, err := store.Txn(ctx, st, func(tx *store.Tx) error {
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
	return nil
}

// Update changes the record under key with a compare-and-swap
// read-modify-write: edit changes it in place; a record that does not
// validate afterwards is an InvalidError. what names the record in
// messages ("switch dvs1"), list the command that lists its kind.
func Update[T records.Record](ctx context.Context, st *store.Store, key, what, list string, edit func(*T) error) (T, error) {
	v, _, err := store.Update(ctx, st, key, func(old *T) (*T, error) {
		if old == nil {
			return nil, fmt.Errorf("%s: %w in the control plane (%s)", what, store.ErrNotFound, list)
		}
		if err := edit(old); err != nil {
			return nil, err
		}
		if err := (*old).Validate(); err != nil {
			return nil, &InvalidError{err}
		}
		return old, nil
	})
	return v, err
}

// PortGroupChange is what SetPortGroup changes: only the fields that
// are not nil.
type PortGroupChange struct {
	Name        *string
	VLAN        *int
	PFCPriority *int
	DSCP        *int
	RoCEVersion *records.RoCEVersion
	RoCEMTU     *int
	Subnet      *string
}

// SetPortGroup applies ch to port group key and returns it. Agents
// decide new connections with the new settings at once; established QPs
// keep their path.
func SetPortGroup(ctx context.Context, st *store.Store, key string, ch PortGroupChange) (records.PortGroup, error) {
	if ch == (PortGroupChange{}) {
		return records.PortGroup{}, invalidf("portgroup set: say what to change (name, VLAN, PFC priority, DSCP, RoCE version, RoCE MTU, subnet)")
	}
	if err := records.CheckName(key); err != nil {
		return records.PortGroup{}, invalidf("portgroup set: the key: %v", err)
	}
	return Update(ctx, st, records.PortGroupKey(key), "port group "+key, "vrdmactl portgroup list", func(p *records.PortGroup) error {
		set(&p.Name, ch.Name)
		set(&p.VLAN, ch.VLAN)
		set(&p.PFCPriority, ch.PFCPriority)
		set(&p.DSCP, ch.DSCP)
		set(&p.RoCEVersion, ch.RoCEVersion)
		set(&p.RoCEMTU, ch.RoCEMTU)
		set(&p.Subnet, ch.Subnet)
		return nil
	})
}

// SwitchChange is what SetSwitch changes: only the fields that are not
// nil.
type SwitchChange struct {
	MTU           *int
	UplinkPolicy  *records.UplinkPolicy
	NetworkPolicy *records.NetworkPolicy
}

// SetSwitch applies ch to switch name and returns it; agents see the
// change at once.
func SetSwitch(ctx context.Context, st *store.Store, name string, ch SwitchChange) (records.Switch, error) {
	if ch == (SwitchChange{}) {
		return records.Switch{}, invalidf("switch set: say what to change (network policy, MTU, uplink policy)")
	}
	if err := records.CheckName(name); err != nil {
		return records.Switch{}, invalidf("switch set: the name: %v", err)
	}
	return Update(ctx, st, records.SwitchKey(name), "switch "+name, "vrdmactl switch list", func(s *records.Switch) error {
		set(&s.MTU, ch.MTU)
		set(&s.UplinkPolicy, ch.UplinkPolicy)
		set(&s.NetworkPolicy, ch.NetworkPolicy)
		return nil
	})
}
