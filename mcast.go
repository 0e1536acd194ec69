// SPDX-License-Identifier: Apache-2.0

package vrdma

// UD multicast (docs/verbs-compat.md, "Multicast"): a UD QP attaches to a
// group by its multicast GID; a SEND through an address handle to the
// group's GID, to QPN MulticastQPN, reaches every QP attached to it on
// the sender's switch and port group, on every path. JoinMulticast is
// rdma_join_multicast: its MULTICAST_JOIN event gives the group's GID,
// QPN and Q_Key to make the address handle with.

import (
	"context"
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
)

// MulticastQPN is the remote QPN of a SEND to a multicast group.
const MulticastQPN = abi.MulticastQPN

// UDPQKey is the Q_Key of rdma_cm's UD port space and of its multicast
// groups (RDMA_UDP_QKEY).
const UDPQKey = abi.UDPQKey

// The multicast events of an event channel.
const (
	CMMulticastJoin  CMEventType = abi.CMEventMulticastJoin
	CMMulticastError CMEventType = abi.CMEventMulticastError
)

// AttachMcast attaches UD QP q to the multicast group gid
// (ibv_attach_mcast): a multicast GID, ff00::/8 or an IPv4 group's
// IPv4-mapped form (::ffff:224.0.0.0/4). Attaching again succeeds.
func (q *QP) AttachMcast(ctx context.Context, gid GID) error {
	if _, err := q.vm.c.call(ctx, abi.OpAttachMcast, &abi.Mcast{QP: q.handle, GID: gid}, nil); err != nil {
		return fmt.Errorf("vrdma: attach QP 0x%x to multicast group %s: %w", q.qpn, gid, err)
	}
	return nil
}

// DetachMcast detaches q from group gid (ibv_detach_mcast); q no longer
// receives the group's datagrams.
func (q *QP) DetachMcast(ctx context.Context, gid GID) error {
	if _, err := q.vm.c.call(ctx, abi.OpDetachMcast, &abi.Mcast{QP: q.handle, GID: gid}, nil); err != nil {
		return fmt.Errorf("vrdma: detach QP 0x%x from multicast group %s: %w", q.qpn, gid, err)
	}
	return nil
}

// JoinMulticast joins the multicast group of IP address group (an IPv4
// or IPv6 multicast address) from adapter ("" for the VM's first), as
// rdma_join_multicast: MULTICAST_JOIN arrives with the returned cookie,
// its RemoteGID the group's GID, RemoteQPN MulticastQPN and QKey UDPQKey.
// Attaching a QP to the group (AttachMcast) is the caller's, as it is
// librdmacm's when it reads the event.
func (ch *EventChannel) JoinMulticast(ctx context.Context, group, adapter string) (uint64, error) {
	c := ch.cookie()
	if _, err := ch.vm.c.call(ctx, abi.OpCMJoin, &abi.CMJoin{Channel: ch.handle, Cookie: c, Adapter: adapter, Group: group}, nil); err != nil {
		return 0, fmt.Errorf("vrdma: join multicast group %s: %w", group, err)
	}
	return c, nil
}
