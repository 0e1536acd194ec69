// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"net/netip"
)

// The distributed switch and port group quickstart creates in its first
// host's embedded control plane; every VM's adapter is on them, so each
// pair's path is decided by path selection: memcpy on the same host, tcp
// between the two hosts (neither has an RDMA uplink).
const (
	quickstartSwitch    = "quickstart-dvs"
	quickstartPortGroup = "dvportgroup-quickstart"
)

// quickstartHosts are the host agents quickstart starts, each on its own
// loopback address (a free port): host1 runs the embedded etcd, the others
// join it; host3 and host4 have a software RoCEv2 uplink on their
// address (UDP 4791), declared lossless.
var quickstartHosts = []localHostSpec{
	{Name: "host1", Addr: netip.AddrPortFrom(defaultLocalHostAddrs[0], 0)},
	{Name: "host2", Addr: netip.AddrPortFrom(defaultLocalHostAddrs[1], 0)},
	{Name: "host3", Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 4}), 0), RDMA: true},
	{Name: "host4", Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 5}), 0), RDMA: true},
}
