// SPDX-License-Identifier: Apache-2.0

package agent

// The agent as the device's Router: when a QP enters RTR, the path to
// its remote end is what the control plane decides (control.go), or, for
// a standalone agent, memcpy to an adapter of this host. The agent is the
// only place that knows every path by name.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostkey"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/netcheck"
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/transport/memcpy"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/tcp"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// linksConfig is the configuration of the links to other hosts, with
// the tcp path's responder (the control-plane half is zero without a
// control plane: a test's local paths need none of it).
func (a *Agent) linksConfig() hostlink.Config {
	cfg := hostlink.Config{Responder: tcp.Responder(a.dev), CM: a.cm, HostID: a.hostID, Host: a.cfg.Host, Log: a.log}
	cfg.OnDisconnect = func(qpn, fromQPN uint32, fromGID abi.GID) { a.cmreg.PeerGone(qpn, fromQPN, fromGID) }
	cfg.OnEstablish = func(qpn, fromQPN uint32, fromGID abi.GID) { a.cmreg.RTU(qpn, fromQPN, fromGID) }
	cfg.OnDatagram = tcp.DatagramReceiver(a.dev) // ud.go
	if c := a.ctl; c != nil {
		cfg.Store, cfg.Cache, cfg.Switch, cfg.LookupTimeout = c.st, c.cache, c.cfg.Switch, c.cfg.LookupTimeout
		cfg.PVRDMAAddress, cfg.Firewall = c.cfg.PVRDMAAddress, c.cfg.FirewallPVRDMA
		cfg.HostKey, cfg.Pins = a.hostKey, hostkey.NewPins(a.cfg.StateDir)
		cfg.Handshakes, cfg.HandshakesPerSource = c.cfg.Handshakes, c.cfg.HandshakesPerSource
	}
	return cfg
}

// startLinks starts the links to other hosts of an agent with a control
// plane: the tcp path, and the CM frames of every path across hosts.
func (a *Agent) startLinks() error {
	up, err := hostlink.Start(a.linksConfig())
	if err != nil {
		return err
	}
	a.up = up
	return nil
}

// startRDMA starts the engines of the host's software RoCE uplink, if
// the host has one: the rdma path to other hosts that have one on the
// switch, RoCE v2 on UDP and, where prepareRoCEv1 opened its socket,
// RoCE v1 on the uplink's interface. A hardware HCA uplink is recorded
// only (no driver yet).
func (a *Agent) startRDMA() error {
	for _, u := range a.ctl.cfg.Uplinks {
		if u.Kind != records.UplinkSoftRoCEv2 {
			continue
		}
		c, err := rdma.ListenUDP(netip.AddrPortFrom(u.Address, rocewire.UDPPort))
		if err != nil {
			return err
		}
		members := (&uplinkMembers{c: a.ctl}).has
		var eng atomic.Pointer[rdma.Engine]
		a.rdma = rdma.Start(rdma.Config{Device: a.dev, Conn: c, Log: a.log, Members: members, GSI: a.newGSI(u.Address, &eng)})
		eng.Store(a.rdma)
		a.log.Info("rdma uplink listening", "address", c.LocalAddr().String())
		if fc := a.rdmaV1Conn; fc != nil {
			a.rdmaV1Conn = nil
			a.rdma1 = rdma.Start(rdma.Config{Device: a.dev, Frames: fc, GID: u.GID, Log: a.log, Members: members})
			a.log.Info("rdma uplink listening for RoCE v1", "interface", fc.Link().Name, "mac", u.MAC, "gid", u.GID.String())
		}
		return nil
	}
	return nil
}

// uplinkMembers tells the rdma engines which addresses are vrdma hosts'
// RDMA uplinks on this host's switch (rdma.Config.Members), as the
// control plane's cache says, computed again when the cache changes.
type uplinkMembers struct {
	c  *control
	mu sync.Mutex
	// the uplinks' addresses and GIDs (unmapped) as of the cache's
	// revision rev (set nil: never computed)
	set map[netip.Addr]struct{} // +checklocks:mu
	rev int64                   // +checklocks:mu
}

// has reports whether addr (unmapped) is the address or the GID of an
// RDMA uplink of a host on this host's switch, this host's included.
func (m *uplinkMembers) has(addr netip.Addr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rev := m.c.cache.Rev(); rev != m.rev || m.set == nil {
		set := map[netip.Addr]struct{}{}
		for _, h := range m.c.cache.Hosts() {
			if h.Host.Switch == "" || h.Host.Switch != m.c.cfg.Switch {
				continue
			}
			for _, u := range h.Host.Uplinks {
				set[u.Address.Unmap()] = struct{}{}
				if u.GID.IsValid() {
					set[u.GID.Unmap()] = struct{}{}
				}
			}
		}
		m.set, m.rev = set, rev
	}
	_, ok := m.set[addr]
	return ok
}

// prepareRoCEv1 opens the RoCE v1 socket of the host's software RoCE
// uplink, before the host registers: on the interface that holds the
// uplink's address (or its Device), which must be an Ethernet interface
// (not loopback), as root. Where it can, the uplink's record publishes
// the interface's MAC, which is how peers address its frames and how
// path selection knows the uplink carries RoCE v1 (records.Uplink.Carries);
// where it cannot, the host offers RoCE v2 only, and says why.
func (a *Agent) prepareRoCEv1() {
	ups := slices.Clone(a.cfg.Control.Uplinks)
	for i, u := range ups {
		if u.Kind != records.UplinkSoftRoCEv2 {
			continue
		}
		ifname := u.Device
		if ifname == "" {
			n, err := rdma.InterfaceOf(u.Address)
			if err != nil {
				a.log.Info("rdma uplink: no RoCE v1", "address", u.Address.String(), "why", err)
				return
			}
			ifname = n
		}
		fc, err := rdma.ListenFrames(ifname)
		if err != nil {
			a.log.Info("rdma uplink: no RoCE v1", "address", u.Address.String(), "why", err)
			return
		}
		mac := fc.Link().MAC
		ups[i].MAC = net.HardwareAddr(mac[:]).String()
		cfg := *a.cfg.Control
		cfg.Uplinks = ups
		a.cfg.Control = &cfg
		a.rdmaV1Conn = fc
		return
	}
}

// rdmaFor is the engine of the rdma path for port group pg's RoCE
// version; nil if the agent has none.
func (a *Agent) rdmaFor(pg records.PortGroup) *rdma.Engine {
	if pg.RoCEVersion == records.RoCEv1 {
		return a.rdma1
	}
	return a.rdma
}

// peerRDMA is the address of the RDMA uplink of host h the rdma path
// reaches (the one path selection counted: the first).
func peerRDMA(h records.Host) (netip.AddrPort, bool) {
	for _, u := range h.Uplinks {
		if u.Kind == records.UplinkSoftRoCEv2 {
			return netip.AddrPortFrom(u.Address, rocewire.UDPPort), true
		}
	}
	return netip.AddrPort{}, false
}

// peerRoCEv1 is the MAC and GID of the RDMA uplink of host h that the
// RoCE v1 path reaches (the first software one, which publishes its MAC
// when it carries RoCE v1).
func peerRoCEv1(h records.Host) ([6]byte, netip.Addr, bool) {
	for _, u := range h.Uplinks {
		if u.Kind == records.UplinkSoftRoCEv2 {
			m, err := net.ParseMAC(u.MAC)
			if err != nil || len(m) != 6 || !u.GID.IsValid() {
				return [6]byte{}, netip.Addr{}, false
			}
			return [6]byte(m), u.GID, true
		}
	}
	return [6]byte{}, netip.Addr{}, false
}

// route decides the path of q to the remote end (dgid, dqpn), for Route
// (decisions.go).
func (a *Agent) route(q *device.QP, dgid abi.GID, dqpn uint32) (device.Route, error) {
	ad := a.dev.AdapterByGID(dgid)
	if ad == nil {
		if r, ok, err := a.routeNative(q, dgid); ok || err != nil {
			return r, err
		}
	}
	var dec pathsel.Decision
	decided := false
	if c := a.ctl; c != nil {
		if ad != nil {
			d, ok, err := c.decideLocal(q.Adapter(), ad)
			if err != nil {
				return device.Route{}, err
			}
			dec, decided = d, ok
		} else {
			end, d, err := c.lookupRemote(q.Adapter(), dgid.String(), "dgid")
			if err != nil {
				return device.Route{}, err
			}
			if d.Path == pathsel.RDMA && end.PortGroup.RoCEVersion == records.RoCEv1 && a.rdma1 != nil {
				mac, gid, ok := peerRoCEv1(end.Host.Host)
				if !ok {
					return device.Route{}, refusedBy(reasonPathUnavailable, abi.Errorf(abi.CodeUnavailable, "dgid", "QP 0x%x: path selection chose rdma (RoCE v1) to host %s, whose software uplink publishes no MAC and GID", q.QPN(), end.Host.Host.Label()))
				}
				// RoCE v1 frames carry the port group's VLAN and PFC priority in
				// their 802.1Q tag and its DSCP as their GRH traffic class.
				so := netcheck.SocketOptionsOf(end.PortGroup)
				m := rdma.Marks{TOS: uint8(so.TOS), Priority: uint8(so.Priority), VLAN: uint16(end.PortGroup.VLAN)}
				return device.Route{Info: decisionInfo(d), New: a.rdma1.BindFrames(mac, gid, m)}, nil
			}
			if d.Path == pathsel.RDMA && end.PortGroup.RoCEVersion != records.RoCEv1 && a.rdma != nil {
				peer, ok := peerRDMA(end.Host.Host)
				if !ok {
					return device.Route{}, refusedBy(reasonPathUnavailable, abi.Errorf(abi.CodeUnavailable, "dgid", "QP 0x%x: path selection chose rdma to host %s, which has no software RoCEv2 uplink the engine can reach", q.QPN(), end.Host.Host.Label()))
				}
				// RoCE v2 packets carry the port group's DSCP and priority (the pair's:
				// path selection checked both ends share its VLAN).
				so := netcheck.SocketOptionsOf(end.PortGroup)
				return device.Route{Info: decisionInfo(d), New: a.rdma.Bind(peer, rdma.Marks{TOS: uint8(so.TOS), Priority: uint8(so.Priority)})}, nil
			}
			if a.up != nil {
				return device.Route{Info: decisionInfo(d), New: tcp.Bind(a.up.Peer(end.Host.Host.ID))}, nil
			}
		}
	}
	if ad != nil && a.local != nil {
		if r, ok := a.local.Route(q, ad); ok {
			return r, nil
		}
	}
	if ad == nil {
		return device.Route{}, refusedBy(reasonNoControlPlane, abi.Errorf(abi.CodeUnavailable, "dgid",
			"QP 0x%x: GID %s is not an adapter on host %s; paths to other hosts (tcp, rdma) need the control plane and a PVRDMA address (rejected: memcpy: the remote VM is not on this host)",
			q.QPN(), dgid, a.cfg.Host))
	}
	info := abi.PathInfo{Path: abi.PathMemcpy, Reason: fmt.Sprintf("memcpy: both VMs (%s, %s) on host %s", q.Context().Name(), ad.Context().Name(), a.cfg.Host)}
	if decided && dec.Path == pathsel.Memcpy {
		info = decisionInfo(dec)
	}
	if t := a.dev.QP(dqpn); t != nil && t.Adapter().GID() == dgid {
		// memcpy-direct (direct.go): the relayed path underneath, the
		// library's own copies beside it.
		if ok, apply, why := directVerdict(q, t); ok {
			info = abi.PathInfo{Path: abi.PathMemcpyDirect, Reason: why, Rejected: info.Rejected}
		} else if apply {
			info.Rejected = append(slices.Clone(info.Rejected), abi.PathRejection{Path: abi.PathMemcpyDirect, Why: why})
		}
	}
	return device.Route{Info: info, New: memcpy.Bind(a.dev)}, nil
}

// routeNative routes q to a native endpoint: a RoCE peer that is not a
// vrdma VM, at the IP address of GID dgid (an IPv4-mapped GID for IPv4),
// through the RoCEv2 engine of the host's uplink; the peer addresses q
// by its QPN, the device's, at the uplink's address. It applies (ok) to
// a QP of an adapter with native endpoints (vrdmaX.nativeEndpointSupport)
// whose dgid no vrdma adapter holds, and to every QP of a native peer
// (Config.NativePeer).
func (a *Agent) routeNative(q *device.QP, dgid abi.GID) (device.Route, bool, error) {
	ip := netip.AddrFrom16(dgid).Unmap()
	if !a.nativeAddr(q.Adapter(), ip) {
		// Not a native endpoint (a vrdma adapter, or an address the
		// engine does not reach): the other paths' rules and errors apply.
		return device.Route{}, false, nil
	}
	var m rdma.Marks
	if c := a.ctl; c != nil {
		vc, _ := adapterConfig(q.Adapter())
		if pg, err := c.cache.PortGroup(context.Background(), vc.PortGroupID); err == nil {
			so := netcheck.SocketOptionsOf(pg)
			m = rdma.Marks{TOS: uint8(so.TOS), Priority: uint8(so.Priority)}
		}
	}
	info := abi.PathInfo{Path: abi.PathRDMA, Reason: fmt.Sprintf("rdma: native endpoint %s, a RoCE peer that is not a vrdma VM, through the RoCEv2 engine on %s",
		ip, a.rdma.LocalAddr())}
	return device.Route{Info: info, New: a.rdma.Bind(netip.AddrPortFrom(ip, rocewire.UDPPort), m)}, true, nil
}

// adapterConfig returns adapter ad's configuration in its VM's file.
func adapterConfig(ad *device.Adapter) (vmconfig.Adapter, bool) {
	cfg := ad.Context().Config()
	if cfg == nil {
		return vmconfig.Adapter{}, false
	}
	for _, c := range cfg.Adapters {
		if c.Index == ad.Index() {
			return c, true
		}
	}
	return vmconfig.Adapter{}, false
}

// decisionInfo is the path report of a control-plane decision.
func decisionInfo(d pathsel.Decision) abi.PathInfo {
	return abi.PathInfo{Path: d.Path, Reason: d.String(), Rejected: d.Rejected}
}
