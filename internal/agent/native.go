// SPDX-License-Identifier: Apache-2.0

package agent

// RDMA CM with native endpoints (package gsi): the CM MADs on QP1 of the
// host's RoCEv2 engine. A native peer's REQ to the uplink's address and
// port P reaches the rdma_cm listener on P of an adapter with native
// endpoints (vrdmaX.nativeEndpointSupport), as a dialer on another host
// does (cm.ServeRemote); an rdma_connect from such an adapter to an
// address no vrdma adapter or host holds dials it with a REQ (cmHosts,
// cmhosts.go). A native peer's agent (Config.NativePeer) does both for
// every adapter of its own.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/gsi"
	"github.com/vrdma/vrdma/internal/netcheck"
	"github.com/vrdma/vrdma/internal/transport/rdma"
)

// newGSI makes the agent's RDMA CM over QP1 for the RoCEv2 engine at
// local, which eng holds once it runs, and returns the engine's MAD
// receiver (rdma.Config.GSI).
func (a *Agent) newGSI(local netip.Addr, eng *atomic.Pointer[rdma.Engine]) func(netip.Addr, uint32, []byte) {
	a.gsi = gsi.New(gsi.Config{
		Send: func(peer netip.Addr, mad []byte) {
			if e := eng.Load(); e != nil {
				e.SendGSI(peer, mad)
			}
		},
		Local:           local.Unmap(),
		Serve:           a.serveNative,
		Established:     func(qpn, peerQPN uint32, gid abi.GID) { a.cmreg.RTU(qpn, peerQPN, gid) },
		Gone:            func(qpn, peerQPN uint32, gid abi.GID) { a.cmreg.PeerGone(qpn, peerQPN, gid) },
		Failed:          a.nativeFailed,
		ResponseTimeout: a.cfg.CMResponseTimeout,
		MaxRetries:      a.cfg.CMMaxRetries,
		Log:             a.log,
	})
	return a.gsi.Receive
}

// nativeEnabled reports whether adapter ad talks to native endpoints: it
// has them enabled, or it is a native peer's.
func (a *Agent) nativeEnabled(ad *device.Adapter) bool {
	if a.ctl == nil {
		return a.cfg.NativePeer.IsValid()
	}
	vc, _ := adapterConfig(ad)
	return vc.NativeEndpoint
}

// nativeAddr reports whether from, an adapter with native endpoints,
// reaches ip as a native endpoint through the RoCEv2 engine: an address
// of the engine's family that no vrdma adapter holds, and no link-local,
// multicast or unspecified one (vrdma adapters' GIDs are link local).
func (a *Agent) nativeAddr(from *device.Adapter, ip netip.Addr) bool {
	if a.rdma == nil || !a.nativeEnabled(from) {
		return false
	}
	if c := a.ctl; c != nil {
		if _, held := c.cache.HolderOf(netip.AddrFrom16(ip.As16())); held {
			return false
		}
	}
	ip, local := ip.Unmap(), a.rdma.LocalAddr().Addr().Unmap()
	return !ip.IsUnspecified() && !ip.IsMulticast() && !ip.IsLinkLocalUnicast() && ip.Is4() == local.Is4() && ip != local
}

// nativeRef is a cm.Peer's Ref for a native endpoint: its address.
type nativeRef struct{ ip netip.Addr }

// nativePeer is the cm.Peer of remote, an IP address or GID, when from
// reaches it as a native endpoint.
func (a *Agent) nativePeer(from *device.Adapter, remote string) (*cm.Peer, bool) {
	ip, err := netip.ParseAddr(remote)
	if err != nil || a.gsi == nil || !a.nativeAddr(from, ip) {
		return nil, false
	}
	ip = ip.Unmap()
	return &cm.Peer{GID: abi.GID(ip.As16()), Ref: nativeRef{ip}}, true
}

// dialNative connects q to the listener on c.Port of native endpoint ip:
// a REQ on QP1, then q to RTS facing the QP of the REP, and the RTU (for
// a QP its workload moves itself, at its rdma_establish: SendRTU).
func (a *Agent) dialNative(ctx context.Context, q *device.QP, c *abi.Connect, ip netip.Addr, d cm.Dial) (abi.ConnectReply, error) {
	ctx, cancel := context.WithTimeout(ctx, cm.Timeout(c.TimeoutMS))
	defer cancel()
	psn, mtu, ack := cm.RandomPSN(), min(q.Adapter().ActiveMTU(), 4096), abi.AckTimeoutOr(c.AckTimeout)
	rep, err := a.gsi.Dial(ctx, gsi.DialParams{Peer: ip, Port: c.Port, SrcPort: uint16(32768 + rand.IntN(28232)),
		QPN: q.QPN(), PSN: psn, MTU: mtu, AckTimeout: ack, PrivateData: d.PrivateData})
	if err != nil {
		return abi.ConnectReply{}, err
	}
	gid := abi.GID(ip.As16())
	if d.External {
		return abi.ConnectReply{RemoteQPN: rep.QPN, RemoteGID: gid, PrivateData: rep.PrivateData, SQPSN: psn, RQPSN: rep.PSN, MTU: mtu}, nil
	}
	if err := cm.Establish(q, gid, rep.QPN, rep.PSN, psn, mtu, ack); err != nil {
		a.gsi.Fail(q.QPN())
		return abi.ConnectReply{}, err
	}
	if err := a.gsi.Ready(q.QPN()); err != nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s port %d: %v", ip, c.Port, err)
	}
	return abi.ConnectReply{RemoteQPN: rep.QPN, RemoteGID: gid, Path: q.Query().Path, PrivateData: rep.PrivateData}, nil
}

// serveNative is a native peer's REQ (gsi.Config.Serve): it waits on the
// first listener on r.Port of an adapter with native endpoints, as a
// dialer on another host does. A port whose listeners are all on
// adapters without native endpoints is refused as one nobody listens on,
// and counted (isolation).
func (a *Agent) serveNative(r *gsi.Request) (gsi.Accepted, error) {
	var target string
	others := 0
	for _, ad := range a.cm.Listening(r.Port) {
		if !a.nativeEnabled(ad) {
			others++
			continue
		}
		if target == "" {
			target = ad.Context().Name() + "/" + ad.Name()
		}
	}
	if target == "" {
		if others > 0 {
			a.nativeRefused.Add(1)
		}
		return gsi.Accepted{}, cm.Refused(abi.RejectInvalidServiceID, nil, "connection refused: no adapter with native endpoints listens on port %d (%d without them do)", r.Port, others)
	}
	priv := r.PrivateData[:min(len(r.PrivateData), abi.MaxPrivateDataREQ)]
	remote := cm.NewRemote(cm.RemoteDialer{GID: r.GID(), QPN: r.QPN, PSN: r.PSN, HasPSN: true, MTU: r.MTU, PathMTU: true, PrivateData: priv,
		External: true, ToIP: r.Header.Dst, FromIP: r.Header.Src})
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-r.Canceled:
			remote.Cancel()
		case <-done:
		}
	}()
	ans, err := a.cm.ServeRemote(remote, target, r.Port, 0, nil, nil)
	if err != nil {
		return gsi.Accepted{}, fmt.Errorf("%s port %d: %w", target, r.Port, err)
	}
	return gsi.Accepted{QPN: ans.QPN, PSN: ans.RQPSN, PrivateData: ans.PrivateData}, nil
}

// cmStatus adds the counters of RDMA CM over QP1 to the RoCEv2 engine's
// status r.
func (a *Agent) cmStatus(r *mgmt.RDMAStatus) {
	c := a.gsi.Counters()
	r.CMIn, r.CMOut, r.CMDropped, r.CMDuplicates = c.In.Load(), c.Out.Load(), c.Dropped.Load(), c.Duplicates.Load()
	r.CMResent, r.CMTimedOut, r.CMRejected, r.CMRefusedNotNative = c.Resent.Load(), c.TimedOut.Load(), c.Rejected.Load(), a.nativeRefused.Load()
}

// nativeGID is the GID of adapter ad's entry for native endpoints
// (abi.PortAttr.NativeGID): its host's RoCEv2 engine's address, when ad
// has native endpoints; nil otherwise.
func (a *Agent) nativeGID(ad *device.Adapter) *abi.GID {
	if a.rdma == nil || !a.nativeEnabled(ad) {
		return nil
	}
	g := abi.GID(a.rdma.LocalAddr().Addr().As16())
	return &g
}

// nativeFailed is an accepted connection to a native peer that failed
// before its RTU (gsi.Config.Failed): the acceptor gets UNREACHABLE
// (-ETIMEDOUT) when the RTU never came, REJECTED with the dialer's reason
// otherwise, as rdma_cm gives them.
func (a *Agent) nativeFailed(qpn, peerQPN uint32, gid abi.GID, reason uint16) {
	ev := abi.CMEvent{Event: abi.CMEventRejected, Status: int(reason), Message: fmt.Sprintf("the native peer rejected the connection after the accept (IBTA reason %d)", reason)}
	if reason == 0 {
		ev = abi.CMEvent{Event: abi.CMEventUnreachable, Status: -int(syscall.ETIMEDOUT), Message: "the native peer never confirmed the accept (no RTU after the REP's retries)"}
	}
	if !a.cmreg.Failed(qpn, peerQPN, gid, ev) {
		a.cmreg.PeerGone(qpn, peerQPN, gid)
	}
}

// nativeMTU is the RoCE MTU of the interface that holds address addr
// (netcheck.MaxRoCEMTU of its MTU), 0 when none does.
func nativeMTU(addr netip.Addr) uint32 {
	ifc, err := net.InterfaceByName(interfaceOf(addr))
	if err != nil {
		return 0
	}
	return uint32(netcheck.MaxRoCEMTU(ifc.MTU))
}
