// SPDX-License-Identifier: Apache-2.0

package agent

// cmHosts is the agent as cm.Hosts: how rdma_cm's event channels
// (internal/cm, events.go) reach other hosts, through the control plane
// (control.go) and the CM frames of the links to other hosts (package
// hostlink). cm's goroutines call it for
// as long as the agent runs; it reads a.ctl and a.up, set before the
// agent serves sessions.

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

type cmHosts struct{ a *Agent }

// Route is resolveConnect from adapter from, the peer's end as cm.Peer
// (Ref: its *member.End).
func (h cmHosts) Route(from *device.Adapter, remote string) (*device.Adapter, *cm.Peer, error) {
	if p, ok := h.a.nativePeer(from, remote); ok {
		return nil, p, nil // a native endpoint: RDMA CM over QP1 (native.go)
	}
	ad, end, err := h.a.resolveConnect(from, remote)
	if err != nil || end == nil {
		return ad, nil, err
	}
	return nil, &cm.Peer{VM: end.Endpoint.VM, Adapter: end.Endpoint.Adapter, GID: abi.GID(end.Endpoint.GID.As16()),
		Host: end.Host.Host.ID, Ref: end}, nil
}

// DialRemote dials p over the links to other hosts (which Route's peer
// implies).
func (h cmHosts) DialRemote(ctx context.Context, q *device.QP, c *abi.Connect, p *cm.Peer, d cm.Dial) (abi.ConnectReply, error) {
	if n, ok := p.Ref.(nativeRef); ok {
		return h.a.dialNative(ctx, q, c, n.ip, d)
	}
	return h.a.dialRemote(ctx, q, c, p.Ref.(*member.End), d)
}

// dialRemote dials the listener of end, on another host, for q, with
// d's private data: a CM_REQ over the link to end's host. ctx is the
// dialing session's.
func (a *Agent) dialRemote(ctx context.Context, q *device.QP, c *abi.Connect, end *member.End, d cm.Dial) (abi.ConnectReply, error) {
	host := end.Host.Host.ID
	return cm.DialRemote(q, c, end.Endpoint.Name(), d, func(m *tcpwire.ConnReqMsg, timeout time.Duration) (tcpwire.ConnRespMsg, error) {
		return a.up.DialCM(ctx, host, m, timeout)
	})
}

// SendRTU sends a CM_RTU over the tcp path, or the RTU on QP1 of a
// connection to a native endpoint.
func (h cmHosts) SendRTU(host string, qpn, fromQPN uint32, fromGID abi.GID) error {
	a := h.a
	if host == "" && a.gsi != nil && a.gsi.Ready(fromQPN) == nil {
		return nil // an RTU on QP1, to a native endpoint
	}
	if a.up == nil {
		return abi.Errorf(abi.CodeUnavailable, "", "QP 0x%x's peer is on another host and this agent runs no tcp path", fromQPN)
	}
	if err := a.up.Establish(host, qpn, fromQPN, netip.AddrFrom16(fromGID)); err != nil {
		return abi.Errorf(abi.CodeUnavailable, "", "rdma_establish: tell host %s: %v", host, err)
	}
	return nil
}

// SendDisconnect sends a CM_DISC over the tcp path, to host or else the
// host the control plane's cache finds gid on; or the DREQ on QP1 of a
// connection to a native endpoint.
func (h cmHosts) SendDisconnect(host string, qpn uint32, gid abi.GID, fromQPN uint32, fromGID abi.GID) error {
	a := h.a
	if host == "" && a.gsi != nil && a.gsi.Disconnect(fromQPN) {
		return nil // a DREQ on QP1, to a native endpoint
	}
	if a.up == nil || a.ctl == nil {
		return nil
	}
	if host == "" {
		ctx, cancel := context.WithTimeout(context.Background(), a.ctl.cfg.LookupTimeout)
		ep, err := a.ctl.cache.Resolve(ctx, netip.AddrFrom16(gid).String())
		cancel()
		if err != nil {
			return fmt.Errorf("peer's host not found (peer GID %s): %w", netip.AddrFrom16(gid), err)
		}
		host = ep.Host
	}
	if err := a.up.Disconnect(host, qpn, fromQPN, netip.AddrFrom16(fromGID)); err != nil {
		return fmt.Errorf("host %s: %w", host, err)
	}
	return nil
}

// HostOf finds the host of address ip among the control plane's hosts'
// PVRDMA addresses; a loopback address is this host's.
func (h cmHosts) HostOf(ip netip.Addr) (string, bool, bool) {
	a := h.a
	if c := a.ctl; c != nil {
		for _, hs := range c.cache.Hosts() {
			if addr := hs.Host.PVRDMAAddress.Addr(); addr.IsValid() && addr.Unmap() == ip {
				return hs.Host.ID, hs.Host.ID == a.hostID, true
			}
		}
	}
	if ip.IsLoopback() {
		return a.hostID, true, true
	}
	return "", false, false
}

// SelfAddr is this host's PVRDMA address, as its record has it.
func (h cmHosts) SelfAddr() netip.Addr {
	a := h.a
	if a.ctl == nil {
		return netip.Addr{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.ctl.cfg.LookupTimeout)
	defer cancel()
	if hs, err := a.ctl.cache.Host(ctx, a.hostID); err == nil && hs.Host.PVRDMAAddress.IsValid() {
		return hs.Host.PVRDMAAddress.Addr().Unmap()
	}
	return a.ctl.cfg.PVRDMAAddress.Addr().Unmap()
}

// HostListener asks host, over the links to other hosts, who holds port
// of its addresses.
func (h cmHosts) HostListener(ctx context.Context, host string, port uint16, ud bool) (cm.HostListener, error) {
	if h.a.up == nil {
		return cm.HostListener{}, abi.Errorf(abi.CodeUnavailable, "remote", "the address is host %s's, and this agent runs no tcp path to other hosts", host)
	}
	return h.a.up.AskWho(ctx, host, port, ud)
}
