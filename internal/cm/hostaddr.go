// SPDX-License-Identifier: Apache-2.0

package cm

// The host's own addresses, as rdma_cm uses them on a device of the
// host's network (Linux's software RoCE): a process in the host's network
// that listens on a host address, or on the any address, holds that port
// of the host (one VM at a time, as one TCP listener); a connect or
// resolve to a host's address — 127.0.0.1 for this host, or a host's
// PVRDMA address — and a port reaches the VM that holds that port on that
// host, by one of its adapters, under the same path rules as a connect to
// that adapter. Another host is asked over the agents' link (a CM_WHO).

import (
	"cmp"
	"context"
	"net/netip"
	"slices"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// hostPort is a port of this host's addresses, in rdma_cm's TCP or UDP
// port space.
type hostPort struct {
	port uint16
	ud   bool
}

// HostListener is the VM that holds a port of a host's addresses, and
// the adapters it listens on there.
type HostListener struct {
	VM       string
	Adapters []string
}

// hostClaim is a held host port: its listener, and the cm-listen that
// holds it (to release it with).
type hostClaim struct {
	HostListener
	owner *listen
}

// claimHostPort makes l, a cm-listen of VM vm on adapters, the holder of
// hp; another holder is CodeExists (EADDRINUSE).
func (m *Manager) claimHostPort(hp hostPort, vm string, adapters []string, l *listen) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, held := m.hostPorts[hp]; held {
		return abi.Errorf(abi.CodeExists, "port", "port %d of host %s's addresses is held by VM %s, which listens on it: one listener per port, as with TCP", hp.port, m.host, c.VM)
	}
	m.hostPorts[hp] = hostClaim{HostListener{vm, adapters}, l}
	return nil
}

// releaseHostPort frees hp if l holds it.
func (m *Manager) releaseHostPort(hp hostPort, l *listen) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, held := m.hostPorts[hp]; held && c.owner == l {
		delete(m.hostPorts, hp)
	}
}

// HostListener returns the holder of port (in the UDP space with ud) of
// this host's addresses.
func (m *Manager) HostListener(port uint16, ud bool) (HostListener, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.hostPorts[hostPort{port, ud}]
	return c.HostListener, ok
}

// hostTarget is where a connect or resolve to a host's address goes.
type hostTarget struct {
	// remote is the listening adapter ("vm/vrdmaN") that from reaches,
	// "" when no VM holds the port.
	remote string
	// localIP is the address the dialer dials from: 127.0.0.1 to this
	// host's loopback, else its host's PVRDMA address. peerIP is the
	// address it dials.
	localIP, peerIP netip.Addr
}

// toHost finds what remote on port (in the UDP space with ud) is when
// remote is an address of a host; ok false when it is not one (an
// adapter's address, a GID, "vm/vrdmaN"). The listening VM's adapter is
// the first that from may reach (Hosts.Route); none is the last refusal.
func (e *Events) toHost(ctx context.Context, from *device.Adapter, remote string, port uint16, ud bool) (t hostTarget, ok bool, err error) {
	ip, perr := netip.ParseAddr(remote)
	if perr != nil {
		return t, false, nil
	}
	ip = ip.Unmap()
	host, self, ok := e.hosts.HostOf(ip)
	if !ok {
		return t, false, nil
	}
	// From this host to itself the address dialed is the one dialed
	// from, as with Linux's own addresses; to another, this host's.
	t.peerIP, t.localIP = ip, ip
	if !self {
		t.localIP = e.hosts.SelfAddr()
	}
	var hl HostListener
	var found bool
	if self {
		hl, found = e.c.m.HostListener(port, ud)
	} else if hl, err = e.hosts.HostListener(ctx, host, port, ud); err == nil {
		found = hl.VM != ""
	}
	if err != nil || !found {
		return t, true, err
	}
	var last error
	for _, ad := range hl.Adapters {
		name := hl.VM + "/" + ad
		if _, _, err := e.hosts.Route(from, name); err != nil {
			last = err
			continue
		}
		t.remote = name
		return t, true, nil
	}
	if last == nil {
		last = abi.Errorf(abi.CodeNotFound, "remote", "VM %s holds port %d of %s but listens on no adapter", hl.VM, port, remote)
	}
	return t, true, last
}

// refusedHostPort is a connect's error when no VM holds port of host
// address remote: nothing listens there (IBTA reason 8).
func refusedHostPort(remote string, port uint16, ud bool) error {
	space := "TCP"
	if ud {
		space = "UDP (RDMA_PS_UDP)"
	}
	return Refused(abi.RejectInvalidServiceID, nil, "connection refused: nothing listens on %s %s port %d (no VM holds that port of the host)", remote, space, port)
}

// ipString is ip as text, "" when invalid.
func ipString(ip netip.Addr) string {
	if !ip.IsValid() {
		return ""
	}
	return ip.String()
}

// Listening returns the adapters that listen on port of rdma_cm's TCP
// port space, in the order of their VMs' and their own names: the
// candidates of a native peer's REQ, which names a port of the host's
// uplink address.
func (m *Manager) Listening(port uint16) []*device.Adapter {
	m.mu.Lock()
	var keys []listenKey
	for k := range m.listeners {
		if k.port == port && !k.ud {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b listenKey) int {
		return cmp.Or(cmp.Compare(a.vm, b.vm), cmp.Compare(a.adapter, b.adapter))
	})
	ads := make([]*device.Adapter, len(keys))
	for i, k := range keys {
		ads[i] = m.listeners[k].ad
	}
	m.mu.Unlock()
	return ads
}
