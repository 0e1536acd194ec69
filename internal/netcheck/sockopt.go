// SPDX-License-Identifier: Apache-2.0

package netcheck

import "github.com/vrdma/vrdma/internal/control/records"

// SocketOptions are the options a RoCE v2 socket of a port group sets so
// that its packets carry the port group's priority on the wire
// (docs/network.md, "On the wire"): the DSCP in the IP header, and the
// socket priority that a VLAN interface's egress-qos-map turns into the
// 802.1Q PCP.
//
// Set TOS first, then Priority: on Linux, setting IP_TOS also sets the
// socket's priority from the TOS (__ip_sock_set_tos calls
// rt_tos2priority), so a priority set before it is lost.
type SocketOptions struct {
	// TOS is the IP_TOS (IPv4) or IPV6_TCLASS (IPv6) value: the DSCP in
	// the upper six bits, the ECN bits 0.
	TOS int
	// Priority is the SO_PRIORITY value: the port group's PFC priority,
	// 0–7. Values up to 6 need no privilege; 7 needs CAP_NET_ADMIN (or
	// CAP_NET_RAW on recent kernels).
	Priority int
}

// SocketOptionsOf returns the socket options of port group pg's RoCE v2
// sockets.
func SocketOptionsOf(pg records.PortGroup) SocketOptions {
	return SocketOptions{TOS: pg.DSCP << 2, Priority: pg.PFCPriority}
}
