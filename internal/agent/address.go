// SPDX-License-Identifier: Apache-2.0

package agent

// Adapter addresses. An adapter's IPv4 address comes from its VM's
// configuration (vrdmaN.ipAddress) or, when it has none and its port
// group declares a subnet, from the control plane: the agent picks the
// first address of the subnet, from a start derived from "vm/vrdmaN" (so
// an adapter keeps its address across attaches while nobody takes it),
// that no other adapter's GID has in the endpoint directory. The
// adapter's GID is the address's IPv4-mapped form, and the directory
// (member.PublishVM, in one transaction) refuses a GID another adapter
// holds: that is what keeps addresses unique, and a configured address
// that is taken fails the attach. Before the publish, checkAddresses
// refuses every adapter's GID — on a port group or not — that the
// directory, as the cache holds it, gives to another VM, also while etcd
// is out of reach; and a connect or RTR that resolves a local adapter
// takes it only if the directory agrees (checkLocalTarget).

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/device"
)

// maxProbes bounds how many addresses of a subnet an assignment tries.
const maxProbes = 256

// assignIPv4 gives ad, which has no address, a free address of subnet pr,
// skipping the addresses in taken.
func (c *control) assignIPv4(ctx context.Context, ad *device.Adapter, pr netip.Prefix, taken map[netip.Addr]bool) error {
	size := uint64(1) << (32 - pr.Bits())
	if size < 4 {
		return fmt.Errorf("subnet %s has no addresses to assign", pr)
	}
	hosts := size - 2 // not the network's nor the broadcast address
	h := fnv.New64a()
	h.Write([]byte(ad.Context().Name() + "/" + ad.Name()))
	start := h.Sum64() % hosts
	base := pr.Addr().As4()
	b := uint64(base[0])<<24 | uint64(base[1])<<16 | uint64(base[2])<<8 | uint64(base[3])
	for i := uint64(0); i < min(hosts, maxProbes); i++ {
		n := b + 1 + (start+i)%hosts
		ip := netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
		if taken[ip] {
			continue
		}
		gid := netip.AddrFrom16(ip.As16())
		if o := c.a.dev.AdapterByGID(abi.GID(gid.As16())); o != nil {
			continue
		}
		e, _, err := store.Get[records.Endpoint](ctx, c.st, records.EndpointGIDKey(gid))
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return fmt.Errorf("look up address %s in the control plane: %w", ip, err)
		case e.VM != ad.Context().Name() || e.Adapter != ad.Name():
			continue
		}
		ad.SetIPv4(ip)
		return nil
	}
	return fmt.Errorf("no free address in subnet %s (tried %d): widen the port group's subnet (vrdmactl portgroup set KEY --subnet CIDR) or set vrdma%d.ipAddress", pr, min(hosts, maxProbes), ad.Index())
}

// addressConflict turns the directory's refusal of a configured address
// into the attach's error.
func addressConflict(v *device.Context, err error) error {
	if !errors.Is(err, member.ErrGIDInUse) {
		return nil
	}
	return abi.Errorf(abi.CodeExists, "adapter", "rule address-unique: VM %s cannot attach: %v; choose another address (vrdmaN.ipAddress)", v.Name(), err)
}

// Rule address-unique (docs/SECURITY.md, "Addresses, keys and QP
// numbers"): an adapter's GID — its IPv4 address's mapped form, or the
// link-local GID of its MAC — belongs to one adapter across the switch,
// as the endpoint directory says, not as one host sees it. The checks
// below read the directory through the cache, which keeps serving while
// etcd is out of reach, so a host cut off from etcd still refuses an
// address it knows another host's VM holds.

// addrWhat names ad's address for messages: its IPv4 address, or its GID.
func addrWhat(ad *device.Adapter) string {
	if ip := ad.IPv4(); ip.IsValid() {
		return ip.String()
	}
	return "GID " + netip.AddrFrom16(ad.GID()).String()
}

// holderLabel names the host that holds directory entry e, for messages.
func (c *control) holderLabel(e records.Endpoint) string {
	if e.Host == c.a.hostID {
		return c.a.cfg.Host + " (this host)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
	defer cancel()
	if h, err := c.cache.Host(ctx, e.Host); err == nil {
		return h.Host.Label()
	}
	return e.Host
}

// addressTaken is rule address-unique's refusal of ad's address, which
// directory entry e gives to another adapter.
func (c *control) addressTaken(ad *device.Adapter, e records.Endpoint) error {
	return abi.Errorf(abi.CodeExists, "adapter", "rule address-unique: %s/%s cannot have %s: it is held by %s on host %s; choose another address (vrdma%d.ipAddress%s)",
		ad.Context().Name(), ad.Name(), addrWhat(ad), e.Name(), c.holderLabel(e), ad.Index(), macHint(ad))
}

// macHint is the other VMX key that sets ad's GID when it has no IPv4
// address: its MAC, whose link-local GID it is.
func macHint(ad *device.Adapter) string {
	if ad.IPv4().IsValid() {
		return ""
	}
	return fmt.Sprintf(", or another ethernet%d.address", ad.Index())
}

// cacheSynced reports whether the cache has listed the directory once.
func (c *control) cacheSynced() bool {
	select {
	case <-c.cache.Synced():
		return true
	default:
		return false
	}
}

// checkAddresses applies rule address-unique to the adapters of VM v
// before it is published, those on no port group (which are never
// published) included: the directory must give none of their GIDs to an
// adapter of another VM. It reads the cache; a GID the cache does not
// hold is looked up in etcd only while the cache has not listed the
// directory yet, and then a lookup that fails refuses the attach (the
// address cannot be checked). The publish's transaction checks the
// adapters on a port group once more, in etcd.
func (c *control) checkAddresses(ctx context.Context, v *device.Context) error {
	synced := c.cacheSynced()
	for _, ad := range v.Adapters() {
		gid := netip.AddrFrom16(ad.GID())
		e, ok := c.cache.HolderOf(gid)
		if !ok && !synced {
			var err error
			e, err = c.cache.Resolve(ctx, gid.String())
			switch {
			case errors.Is(err, store.ErrNotFound):
				continue
			case err != nil:
				return abi.Errorf(abi.CodeUnavailable, "adapter", "rule address-unique: cannot check that no other adapter holds %s (%s/%s): the control plane is unreachable and host %s has not read its directory yet (%v); attach again once etcd answers",
					addrWhat(ad), v.Name(), ad.Name(), c.a.cfg.Host, err)
			}
			ok = true
		}
		if ok && (e.VM != v.Name() || e.Adapter != ad.Name()) {
			return c.addressTaken(ad, e)
		}
	}
	return nil
}

// portGroupOf returns the port group of adapter ad (its VM's
// ethernetN.dvs.portgroupId), "" when it is on none.
func portGroupOf(ad *device.Adapter) string {
	v := ad.Context()
	for i, a := range v.Adapters() {
		if a == ad {
			if cfg := v.Config(); cfg != nil && i < len(cfg.Adapters) {
				return cfg.Adapters[i].PortGroupID
			}
		}
	}
	return ""
}

// checkLocalTarget applies rule address-unique to ad, an attached adapter
// of this host that a connect or a QP's RTR resolved (by name or GID),
// and fails closed: ad is the target only if the directory, as the cache
// holds it, gives ad's GID to no other adapter (nor to a VM of ad's name
// on another host), and, when ad is on a port group, gives it to ad (ad
// was published: its address was checked across the switch). A GID
// another host's VM holds is that VM's, not a local adapter's that has it
// too.
func (c *control) checkLocalTarget(ad *device.Adapter, field string) error {
	gid := netip.AddrFrom16(ad.GID())
	e, ok := c.cache.HolderOf(gid)
	if ok && (e.VM != ad.Context().Name() || e.Adapter != ad.Name() || e.Host != c.a.hostID) {
		return refusedBy(reasonAddressUnique, abi.Errorf(abi.CodeRefused, field, "rule address-unique: %s is held by %s on host %s in the control plane's directory, and %s/%s of this host has it too: it reaches neither; give %s/%s another address (vrdma%d.ipAddress%s)",
			addrWhat(ad), e.Name(), c.holderLabel(e), ad.Context().Name(), ad.Name(), ad.Context().Name(), ad.Name(), ad.Index(), macHint(ad)))
	}
	if ok {
		return nil
	}
	if portGroupOf(ad) != "" {
		return refusedBy(reasonAddressUnique, abi.Errorf(abi.CodeUnavailable, field, "rule address-unique: %s/%s (%s) is not in the control plane's directory yet, so its address is not checked across the switch (the control plane was unreachable when it attached, or its publish failed: see the agent's log); connect once it is published",
			ad.Context().Name(), ad.Name(), addrWhat(ad)))
	}
	if !c.cacheSynced() {
		return refusedBy(reasonAddressUnique, abi.Errorf(abi.CodeUnavailable, field, "rule address-unique: host %s has not read the control plane's directory yet, so it cannot tell whether another host's VM holds %s (%s/%s); retry in a moment",
			c.a.cfg.Host, addrWhat(ad), ad.Context().Name(), ad.Name()))
	}
	return nil
}
