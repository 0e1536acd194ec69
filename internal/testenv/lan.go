// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
)

// LAN is hosts in network namespaces of a test's own, each with interface
// eth0 on one subnet, joined by a bridge in one more namespace: machines
// on a LAN, for tests that run their own processes in them (etcd members,
// agents) instead of a Cluster's. Everything is removed at the test's
// cleanup.
type LAN struct {
	// Hosts are the hosts' namespaces (for "ip netns exec"), the first
	// one first.
	Hosts []string
	// Addrs are the hosts' addresses: Addrs[i] is Hosts[i]'s.
	Addrs []netip.Addr
}

// NewLAN creates n hosts (namespaces vrdma-ID-h1, -h2, ...) with
// addresses .1, .2, ... of subnet and an MTU of 1500, and skips tb when
// namespaces cannot be made here (not root), saying why.
func NewLAN(tb testing.TB, n int, subnet netip.Prefix) *LAN {
	tb.Helper()
	if ok, why := netnsUsable(); !ok {
		tb.Skip(why)
	}
	if n < 1 || n > 250 || !subnet.Addr().Is4() {
		tb.Fatalf("NewLAN: %d hosts on %s: want 1..250 hosts on an IPv4 subnet", n, subnet)
	}
	sweepStaleNetns()
	id := clusterID()
	nw, err := newNetnsNetwork(netnsPrefix+id+"-sw", 1500)
	tb.Cleanup(func() {
		if err := nw.close(); err != nil {
			tb.Errorf("LAN cleanup: delete network namespaces: %v (delete them with 'ip netns delete NAME')", err)
		}
	})
	if err != nil {
		tb.Fatalf("NewLAN: %v", err)
	}
	l := &LAN{}
	for i := range n {
		a := subnet.Masked().Addr().As4()
		a[3] += byte(i + 1)
		ns := fmt.Sprintf("%s%s-h%d", netnsPrefix, id, i+1)
		if err := nw.addHost(ns, fmt.Sprintf("p%d", i+1), net.IP(a[:]), subnet.Bits(), 1500); err != nil {
			tb.Fatalf("NewLAN: %v", err)
		}
		l.Hosts = append(l.Hosts, ns)
		l.Addrs = append(l.Addrs, netip.AddrFrom4(a))
	}
	return l
}
