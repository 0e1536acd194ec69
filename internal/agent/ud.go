// SPDX-License-Identifier: Apache-2.0

package agent

// The agent as the device's UDRouter: an address handle's datagrams take
// the path a connection between the two adapters would (route.go), by
// the same rules — same switch, port group and VLAN, address-unique,
// fail closed — and a datagram that arrives is delivered only if its
// source, as the path that carried it authenticates it, could have
// connected to the destination that way: the same decision, the same
// path, from the host that holds the source's address.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/netcheck"
	"github.com/vrdma/vrdma/internal/transport/memcpy"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/tcp"
)

var _ device.UDRouter = (*Agent)(nil)

// LocalDatagramPaths is what LocalPaths add to carry datagrams between
// two VMs of this host in place of memcpy (tests only: the test link, the
// rdma loop).
type LocalDatagramPaths interface {
	// RouteAH returns the path of datagrams from adapter from to peer, an
	// adapter of this host; ok false leaves them to memcpy.
	RouteAH(from, peer *device.Adapter) (p device.DatagramPath, info abi.PathInfo, ok bool)
	// Carries reports whether via is one of these paths, which carry
	// only this host's datagrams.
	Carries(via device.Via) bool
}

// routeAH decides how datagrams from adapter from reach the adapter with
// GID dgid, for RouteAH (decisions.go).
func (a *Agent) routeAH(from *device.Adapter, dgid abi.GID) (device.DatagramPath, abi.PathInfo, error) {
	if dgid.IsMulticast() {
		return a.routeGroup(from, dgid) // mcast.go
	}
	ad := a.dev.AdapterByGID(dgid)
	if c := a.ctl; c != nil {
		if ad == nil {
			end, d, err := c.lookupRemote(from, dgid.String(), "dgid")
			if err != nil {
				return nil, abi.PathInfo{}, err
			}
			if d.Path == pathsel.RDMA {
				if p, ok := a.rdmaDatagrams(end.Host.Host, end.PortGroup); ok {
					return p, decisionInfo(d), nil
				}
				return nil, abi.PathInfo{}, refusedBy(reasonPathUnavailable, abi.Errorf(abi.CodeUnavailable, "dgid", "path selection chose rdma to host %s, which has no software RoCE uplink this agent's engine reaches", end.Host.Host.Label()))
			}
			if a.up == nil {
				return nil, abi.PathInfo{}, refusedBy(reasonPathUnavailable, abi.Errorf(abi.CodeUnavailable, "dgid", "%s is on host %s, and this agent has no tcp path to other hosts yet", dgid, end.Host.Host.Label()))
			}
			peer := a.up.Peer(end.Host.Host.ID)
			go peer.Conn(c.cfg.LookupTimeout) // the first datagram need not wait for the dial
			return tcp.Datagrams(peer), decisionInfo(d), nil
		}
		d, decided, err := c.decideLocal(from, ad)
		if err != nil {
			return nil, abi.PathInfo{}, err
		}
		if p, info, ok := a.localAH(from, ad); ok {
			return p, info, nil
		}
		if decided {
			return memcpy.Datagrams(a.dev), directAH(from, ad, decisionInfo(d)), nil
		}
	}
	if p, info, ok := a.localAH(from, ad); ok {
		return p, info, nil
	}
	if ad == nil {
		return nil, abi.PathInfo{}, refusedBy(reasonNoControlPlane, abi.Errorf(abi.CodeUnavailable, "dgid",
			"GID %s is not an adapter on host %s; paths to other hosts (tcp, rdma) need the control plane and a PVRDMA address (rejected: memcpy: the remote VM is not on this host)",
			dgid, a.cfg.Host))
	}
	info := abi.PathInfo{Path: abi.PathMemcpy, Reason: fmt.Sprintf("memcpy: both VMs (%s, %s) on host %s", from.Context().Name(), ad.Context().Name(), a.cfg.Host)}
	return memcpy.Datagrams(a.dev), directAH(from, ad, info), nil
}

// localAH is the local paths' route of datagrams from adapter from to
// ad, an adapter of this host (nil: none), if they have one.
func (a *Agent) localAH(from, ad *device.Adapter) (device.DatagramPath, abi.PathInfo, bool) {
	lp, ok := a.local.(LocalDatagramPaths)
	if !ok || ad == nil {
		return nil, abi.PathInfo{}, false
	}
	return lp.RouteAH(from, ad)
}

// rdmaDatagrams is the rdma path's datagrams to host h on port group pg
// (RoCE v1 or v2, as pg says), if this agent has that engine and h an
// uplink it reaches.
func (a *Agent) rdmaDatagrams(h records.Host, pg records.PortGroup) (device.DatagramPath, bool) {
	so := netcheck.SocketOptionsOf(pg)
	if pg.RoCEVersion == records.RoCEv1 {
		mac, gid, ok := peerRoCEv1(h)
		if !ok || a.rdma1 == nil {
			return nil, false
		}
		return a.rdma1.DatagramFrames(mac, gid, rdma.Marks{TOS: uint8(so.TOS), Priority: uint8(so.Priority), VLAN: uint16(pg.VLAN)}), true
	}
	peer, ok := peerRDMA(h)
	if !ok || a.rdma == nil {
		return nil, false
	}
	return a.rdma.Datagrams(peer, rdma.Marks{TOS: uint8(so.TOS), Priority: uint8(so.Priority)}), true
}

// AdmitDatagram reports whether a datagram from GID sgid, received
// through via, may reach adapter to: a connection between them would be
// allowed, on that path, and the datagram came from the host that holds
// sgid. Verdicts are cached for a few seconds (admitTTL): the first
// datagram between two adapters may wait for the control plane, the next
// ones do not. A refusal is cached only when it is final (settled).
func (a *Agent) AdmitDatagram(to *device.Adapter, sgid abi.GID, via device.Via) bool {
	k := admitKey{to: to.GID(), sgid: sgid, via: via}
	if ok, hit := a.admits.get(k); hit {
		return ok
	}
	if !a.admits.takeLookup() {
		return false // too many sources unknown this second (a flood of made-up ones): dropped, not cached
	}
	err := a.admitDatagram(to, sgid, via)
	if err != nil {
		a.log.Debug("datagram dropped: its source may not reach the destination", "to", to.Context().Name()+"/"+to.Name(),
			"sgid", sgid.String(), "path", via.Path, "why", err)
	}
	if settled(err) {
		a.admits.put(k, err == nil)
	}
	return err == nil
}

// settled reports whether an admission verdict holds until the control
// plane changes: an admission, or a refusal by a rule. A source the
// control plane does not know yet (a VM that just attached, whose
// endpoint record has not reached this host's cache) or a lookup that
// timed out is not settled: caching it would drop every datagram of that
// source for admitTTL, where the next lookup may well admit it.
func settled(err error) bool {
	return !errors.Is(err, abi.ErrUnavailable) && !errors.Is(err, abi.ErrNotFound)
}

func (a *Agent) admitDatagram(to *device.Adapter, sgid abi.GID, via device.Via) error {
	c := a.ctl
	refuse := func(format string, args ...any) error {
		return abi.Errorf(abi.CodeRefused, "sgid", format, args...)
	}
	if lp, ok := a.local.(LocalDatagramPaths); ok && via.Path != abi.PathMemcpy && lp.Carries(via) {
		if a.dev.AdapterByGID(sgid) == nil {
			return refuse("no adapter of this host has the source GID")
		}
		return nil
	}
	if via.Path == abi.PathMemcpy {
		from := a.dev.AdapterByGID(sgid)
		if from == nil {
			return refuse("no adapter of this host has the source GID")
		}
		if c == nil {
			return nil
		}
		_, _, err := c.decideLocal(to, from)
		return err
	}
	if c == nil {
		return refuse("no control plane: only this host's adapters are known")
	}
	end, d, err := c.lookupRemote(to, sgid.String(), "sgid")
	if err != nil {
		return err
	}
	switch {
	case via.Path == abi.PathTCP && d.Path == pathsel.TCP:
		if end.Host.Host.ID != via.Host {
			return refuse("the datagram came from host %s, and the source GID is on host %s", via.Host, end.Host.Host.ID)
		}
		return nil
	case via.Path == abi.PathRDMA && d.Path == pathsel.RDMA:
		if end.PortGroup.RoCEVersion == records.RoCEv1 {
			_, gid, ok := peerRoCEv1(end.Host.Host)
			if !ok || gid.Unmap() != via.Addr.Unmap() {
				return refuse("the RoCE v1 frame came from %s, not from host %s's uplink", via.Addr, end.Host.Host.Label())
			}
			return nil
		}
		peer, ok := peerRDMA(end.Host.Host)
		if !ok || peer.Addr().Unmap() != via.Addr.Unmap() {
			return refuse("the RoCE v2 packet came from %s, not from host %s's uplink", via.Addr, end.Host.Host.Label())
		}
		return nil
	}
	return refuse("the datagram came on the %s path, and a connection between them takes %s", via.Path, d.Path)
}

// admitTTL is how long an admission verdict is kept; admitMax bounds the
// cache (a flood of made-up sources empties it rather than grow it);
// admitLookups bounds the verdicts not in the cache a second, each of
// which may read the control plane: a peer that sends datagrams from
// ever new made-up sources costs the reader that serves it at most that
// many lookups a second, and the rest are dropped.
const (
	admitTTL     = 5 * time.Second
	admitMax     = 4096
	admitLookups = 64
)

type admitKey struct {
	to, sgid abi.GID
	via      device.Via
}

type admitVerdict struct {
	ok      bool
	expires time.Time
}

// admitCache holds recent admission verdicts, and counts the verdicts
// made this second.
type admitCache struct {
	mu      sync.Mutex
	m       map[admitKey]admitVerdict // +checklocks:mu
	second  time.Time                 // +checklocks:mu
	lookups int                       // +checklocks:mu
}

// takeLookup reports whether a verdict not in the cache may be made now
// (admitLookups a second).
func (c *admitCache) takeLookup() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.second) >= time.Second {
		c.second, c.lookups = now, 0
	}
	if c.lookups >= admitLookups {
		return false
	}
	c.lookups++
	return true
}

func (c *admitCache) get(k admitKey) (ok, hit bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, found := c.m[k]
	if !found || time.Now().After(v.expires) {
		return false, false
	}
	return v.ok, true
}

func (c *admitCache) put(k admitKey, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= admitMax {
		c.m = map[admitKey]admitVerdict{}
	}
	c.m[k] = admitVerdict{ok: ok, expires: time.Now().Add(admitTTL)}
}

// privileged reports whether the session's process may set a privileged
// Q_Key (abi.PrivilegedQKey): root, or CAP_NET_RAW in its effective set,
// as Linux asks of ibv_modify_qp.
func (s *session) privileged() bool {
	if !s.cred {
		return false
	}
	if s.uid == 0 {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<capNetRaw) != 0
		}
	}
	return false
}

// capNetRaw is CAP_NET_RAW's bit.
const capNetRaw = 13

// checkQKey refuses a privileged Q_Key to a process that may not set it.
func (s *session) checkQKey(m *abi.ModifyQP) error {
	if m.Mask&abi.MaskQKey != 0 && m.Attr.QKey&abi.PrivilegedQKey != 0 && !s.privileged() {
		return abi.Errorf(abi.CodePermission, "qkey", "Q_Key 0x%x has the privileged bit 0x80000000: only root or a process with CAP_NET_RAW may set it (EPERM, as on Linux)", m.Attr.QKey)
	}
	return nil
}
