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
// that is taken fails the attach.

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
	return abi.Errorf(abi.CodeExists, "adapter", "VM %s cannot attach: %v; give the adapter another vrdmaN.ipAddress", v.Name(), err)
}
