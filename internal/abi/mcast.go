// SPDX-License-Identifier: Apache-2.0

package abi

import "net/netip"

// UD multicast (ops 64..66, docs/wire-local.md §4.19, capability bit
// mcast). A UD QP attaches to a multicast group by its GID
// (attach-mcast, ibv_attach_mcast); a SEND through an address handle
// whose GID is a group's, to QPN MulticastQPN, reaches every QP attached
// to that group on the sender's switch and port group, the sender's own
// QP only if it is attached too. rdma_cm's joins (cm-join) give the
// group's address handle attributes in a MULTICAST_JOIN event; the
// library attaches the ID's QP when it reads it, as librdmacm does.

// MulticastQPN is the destination QPN of a datagram to a multicast group
// (IBTA: the permissive QPN 0xFFFFFF).
const MulticastQPN = 0xffffff

// Multicast limits of an adapter (DeviceAttr): groups its QPs are
// attached to, QPs attached to one group, and attachments in all.
const (
	MaxMcastGrp           = 1024
	MaxMcastQPAttach      = 64
	MaxTotalMcastQPAttach = MaxMcastGrp * MaxMcastQPAttach
)

// UDPQKey is the Q_Key rdma_cm gives RDMA_PS_UDP IDs and their multicast
// groups (RDMA_UDP_QKEY).
const UDPQKey = 0x01234567

// IsMulticast reports whether g is a multicast GID: an IPv6 multicast
// address (ff00::/8, as ff0e::…) or an IPv4-mapped one (::ffff:224.0.0.0/4),
// the form RoCE v2 gives IPv4 groups.
func (g GID) IsMulticast() bool {
	return netip.AddrFrom16(g).Unmap().IsMulticast()
}

// MulticastGID is the GID of the multicast group of IP address a, as
// rdma_cm gives it on RoCE: an IPv6 group's own address, an IPv4 group's
// IPv4-mapped form; ok is false for an address that is not multicast.
func MulticastGID(a netip.Addr) (g GID, ok bool) {
	if !a.Unmap().IsMulticast() {
		return GID{}, false
	}
	return GID(a.As16()), true
}

// Mcast attaches QP (a UD QP's handle) to the multicast group GID, or
// detaches it (ibv_attach_mcast, ibv_detach_mcast). LID is ignored: RoCE
// has none.
type Mcast struct {
	QP  uint32 `json:"qp"`
	GID GID    `json:"gid"`
	LID uint16 `json:"lid,omitempty"`
}

// Validate checks that the GID is a multicast one.
func (m *Mcast) Validate() error {
	if !m.GID.IsMulticast() {
		return Errorf(CodeInvalid, "gid", "%s is not a multicast GID (ff00::/8, or ::ffff:224.0.0.0/4 for an IPv4 group): ibv_attach_mcast fails with EINVAL", m.GID)
	}
	return nil
}

// CMJoin joins an rdma_cm ID to the multicast group of IP address Group
// (rdma_join_multicast): MULTICAST_JOIN follows with Cookie on Channel,
// carrying the group's GID (RemoteGID), QPN MulticastQPN and the Q_Key
// UDPQKey, from which the workload makes its address handle; or
// MULTICAST_ERROR when the ID's adapter may not join it. Adapter is the
// ID's adapter (its bound or resolved source); "" picks the VM's first.
type CMJoin struct {
	Channel uint32 `json:"channel"`
	Cookie  uint64 `json:"cookie"`
	Adapter string `json:"adapter,omitempty"`
	Group   string `json:"group"`
}

// Validate checks that Group is a multicast IP address, and the adapter.
func (j *CMJoin) Validate() error {
	a, err := netip.ParseAddr(j.Group)
	if err != nil {
		return Errorf(CodeInvalid, "group", "group %q is not an IP address: %v", j.Group, err)
	}
	if _, ok := MulticastGID(a); !ok {
		return Errorf(CodeInvalid, "group", "group %s is not a multicast address (224.0.0.0/4 or ff00::/8)", j.Group)
	}
	if j.Adapter != "" {
		return ValidAdapter(j.Adapter)
	}
	return nil
}

// The multicast events, numbered as rdma_cm's enum rdma_cm_event_type.
const (
	CMEventMulticastJoin  = 12
	CMEventMulticastError = 13
)
