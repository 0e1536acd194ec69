// SPDX-License-Identifier: Apache-2.0

package cm

// rdma_cm's multicast: an address to resolve that is a multicast group
// resolves to the ID's adapter with the group's GID as the remote
// (rdma_resolve_addr to a group, as mckey does), and cm-join answers with
// MULTICAST_JOIN: the group's GID, the multicast QPN and the Q_Key of
// RDMA_PS_UDP, from which the workload makes the group's address handle.
// The library attaches the ID's QP when it reads the event, as librdmacm
// does; the group's datagrams then follow the device's multicast rules
// (internal/device/mcast.go).

import (
	"net/netip"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// multicastGroup returns the GID of remote when it is a multicast IP
// address.
func multicastGroup(remote string) (abi.GID, bool) {
	a, err := netip.ParseAddr(remote)
	if err != nil {
		return abi.GID{}, false
	}
	return abi.MulticastGID(a)
}

// resolveGroup is ADDR_RESOLVED of a multicast group from adapter src, or
// the VM's first adapter.
func resolveGroup(v *device.Context, src *device.Adapter, gid abi.GID, cookie uint64) abi.CMEvent {
	if src == nil {
		src = v.Adapters()[0]
	}
	return abi.CMEvent{Event: abi.CMEventAddrResolved, Cookie: cookie, Adapter: src.Name(), RemoteGID: gid}
}

// Join is cm-join of r for v (rdma_join_multicast): MULTICAST_JOIN
// follows on channel r.Channel.
func (e *Events) Join(v *device.Context, r *abi.CMJoin) error {
	c, err := e.channel(r.Channel)
	if err != nil {
		return err
	}
	ad := v.Adapters()[0]
	if r.Adapter != "" {
		if ad, err = v.Adapter(r.Adapter); err != nil {
			return err
		}
	}
	gid, _ := multicastGroup(r.Group) // checked by Validate
	c.Post(abi.CMEvent{Event: abi.CMEventMulticastJoin, Cookie: r.Cookie, Adapter: ad.Name(), RemoteGID: gid,
		RemoteQPN: abi.MulticastQPN, QKey: abi.UDPQKey})
	return nil
}
