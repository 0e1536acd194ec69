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
// loopback address (a free port): host1 runs the embedded etcd, host2
// joins it.
var quickstartHosts = []localHostSpec{
	{Name: "host1", Addr: netip.AddrPortFrom(defaultLocalHostAddrs[0], 0)},
	{Name: "host2", Addr: netip.AddrPortFrom(defaultLocalHostAddrs[1], 0)},
}
