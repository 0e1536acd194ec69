// SPDX-License-Identifier: Apache-2.0

package cm

// The connections made through rdma_cm event channels, agent-wide (Conns),
// and what they need of other hosts (Hosts): DISCONNECTED to both sides
// of a connection either side disconnects, or whose workload goes away;
// the acceptor's ESTABLISHED held until an external dialer's RTU
// (rdma_establish).

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// Hosts is how rdma_cm's event channels reach beyond this host: the
// control plane's lookups and path decisions, and the agent-to-agent
// link that carries CM frames. The agent implements it; its methods are
// called from the goroutines of Events and Conns, concurrently, for as
// long as the agent runs, and must be safe for that. A standalone agent
// (no control plane) answers with this host's adapters only.
type Hosts interface {
	// Route finds where a connect from adapter from to remote ("vm/vrdmaN"
	// or a GID) goes: an adapter of this host (checked against path
	// selection, when the control plane can decide), or a peer on
	// another host. The error explains a refusal or a failed lookup.
	Route(from *device.Adapter, remote string) (*device.Adapter, *Peer, error)
	// DialRemote dials p (from Route) with q over the agent-to-agent
	// link and waits for the answer, at most c's timeout or until ctx
	// ends.
	DialRemote(ctx context.Context, q *device.QP, c *abi.Connect, p *Peer, d Dial) (abi.ConnectReply, error)
	// SendRTU tells host (an ID) that this host's QP fromQPN (GID fromGID)
	// established its connection to that host's QP qpn (a CM_RTU). Its
	// error is cm-establish's.
	SendRTU(host string, qpn, fromQPN uint32, fromGID abi.GID) error
	// SendDisconnect tells the host of the QP (qpn, gid), host when known
	// or else found by gid, that this host's QP fromQPN (GID fromGID)
	// disconnected from it (a CM_DISC). It may block for the lookup and
	// the link's dial timeouts; nil when there is nobody to tell (no
	// link).
	SendDisconnect(host string, qpn uint32, gid abi.GID, fromQPN uint32, fromGID abi.GID) error
	// HostOf finds the host whose address ip is: this host (self) for
	// its PVRDMA address or a loopback address, or another host (its
	// ID) by its PVRDMA address; ok is false when ip is no host's.
	HostOf(ip netip.Addr) (host string, self, ok bool)
	// SelfAddr is this host's PVRDMA address (invalid when it has none).
	SelfAddr() netip.Addr
	// HostListener asks host (an ID, another host) which VM holds port
	// (of the UDP space with ud) of its addresses: a zero HostListener
	// when none does. It waits at most the link's dial and answer
	// timeouts, or until ctx ends.
	HostListener(ctx context.Context, host string, port uint16, ud bool) (HostListener, error)
}

// Peer is an adapter on another host, as Hosts.Route found it.
type Peer struct {
	VM, Adapter string  // its VM's and its own names
	GID         abi.GID // its GID
	Host        string  // its host's ID
	// Ref is Hosts' own record of the peer, for DialRemote; cm does not
	// look into it.
	Ref any
}

// conn is one side of a connection made through an event channel.
type conn struct {
	owner    *Events // the session's events it belongs to
	ch       *Channel
	q        *device.QP
	handle   uint32
	peerQPN  uint32
	peerGID  abi.GID
	peerHost string // the peer's host ID, when it is on another host and known
	// peerRemote: the peer is on another host (peerHost, or found by its
	// GID in the control plane).
	peerRemote bool
	// disconnected: this side got DISCONNECTED (the peer disconnected);
	// its own disconnect then only moves its QP to ERR.
	disconnected bool
	// external: the workload moves q itself (rdma_cm's external QP): the
	// agent never modifies it, not even on disconnect.
	external bool
	// dialer: this side dialed. An external dialer sends the RTU with
	// cm-establish, once (rtuSent).
	dialer, rtuSent bool
	// awaiting: the acceptor's ESTABLISHED, held until the external
	// dialer's RTU; nil once posted.
	awaiting *abi.CMEvent
}

// Conns is the agent's connections made through event channels, by QPN.
// The agent makes one with NewConns and keeps it for its life; every
// session's Events records its connections in it, and the agent-to-agent
// link's CM_DISC and CM_RTU come in through PeerGone and RTU. It is safe
// for concurrent use.
type Conns struct {
	hosts Hosts
	log   *slog.Logger

	mu    sync.Mutex
	conns map[uint32]*conn // +checklocks:mu
	// early are RTUs that came before their acceptor's connection was
	// recorded (the dialer's rdma_establish can overtake the end of the
	// accept-request that answered it), by the acceptor's QPN.
	early map[uint32]earlyRTU // +checklocks:mu
}

// NewConns returns an empty registry that reaches other hosts through
// hosts and logs on log.
func NewConns(hosts Hosts, log *slog.Logger) *Conns {
	return &Conns{hosts: hosts, log: log, conns: map[uint32]*conn{}}
}

// earlyRTU is an RTU from (fromQPN, fromGID) that found no connection.
type earlyRTU struct {
	fromQPN uint32
	fromGID abi.GID
	at      time.Time
}

// Bounds of the early RTUs kept: how many, and how long.
const (
	maxEarlyRTUs = 1024
	earlyRTUTTL  = 10 * time.Second
)

func (r *Conns) add(c *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns[c.q.QPN()] = c
}

// addAwaitingRTU records acceptor c, whose dialer moves its QP itself,
// with its ESTABLISHED ev held until the dialer's RTU, or posted now if
// that RTU came first.
func (r *Conns) addAwaitingRTU(c *conn, ev abi.CMEvent) {
	r.mu.Lock()
	e, ok := r.early[c.q.QPN()]
	ok = ok && e.fromQPN == c.peerQPN && e.fromGID == c.peerGID
	if ok {
		delete(r.early, c.q.QPN())
	} else {
		c.awaiting = &ev
	}
	r.mu.Unlock()
	r.add(c)
	if ok {
		c.ch.Post(ev)
	}
}

// RTU is the RTU of dialer (fromQPN, fromGID) to its acceptor's QP qpn,
// from this host's cm-establish or another host's CM_RTU: the acceptor
// gets its ESTABLISHED. An RTU before the acceptor's record is kept a
// while (early); one that names no awaiting connection of that dialer is
// dropped.
func (r *Conns) RTU(qpn, fromQPN uint32, fromGID abi.GID) {
	r.mu.Lock()
	c := r.conns[qpn]
	if c == nil {
		if r.early == nil {
			r.early = map[uint32]earlyRTU{}
		}
		now := time.Now()
		for k, e := range r.early {
			if now.Sub(e.at) > earlyRTUTTL {
				delete(r.early, k)
			}
		}
		if len(r.early) < maxEarlyRTUs {
			r.early[qpn] = earlyRTU{fromQPN: fromQPN, fromGID: fromGID, at: now}
		}
		r.mu.Unlock()
		return
	}
	ev := c.awaiting
	if ev == nil || c.peerQPN != fromQPN || c.peerGID != fromGID {
		r.mu.Unlock()
		return
	}
	c.awaiting = nil
	r.mu.Unlock()
	c.ch.Post(*ev)
}

// establish is cm-establish of q (rdma_establish): q's workload, which
// moves it itself, has it in RTS; its acceptor gets ESTABLISHED, on this
// host or through a CM_RTU.
func (r *Conns) establish(q *device.QP) error {
	r.mu.Lock()
	c := r.conns[q.QPN()]
	if c == nil || c.q != q || !c.external || !c.dialer {
		r.mu.Unlock()
		return abi.Errorf(abi.CodeState, "qp", "QP 0x%x has no connection to establish: rdma_establish follows the CONNECT_RESPONSE of a connect whose QP the program moves itself", q.QPN())
	}
	if c.rtuSent {
		r.mu.Unlock()
		return abi.Errorf(abi.CodeState, "qp", "QP 0x%x: the connection is established already", q.QPN())
	}
	c.rtuSent = true
	r.mu.Unlock()
	if !c.peerRemote {
		r.RTU(c.peerQPN, q.QPN(), q.GID())
		return nil
	}
	return r.hosts.SendRTU(c.peerHost, c.peerQPN, q.QPN(), q.GID())
}

// Timewait is how long after DISCONNECTED a connection's TIMEWAIT_EXIT
// comes: rdma_cm's RoCE packet lifetime (4.096 µs × 2^16), the time the
// IBTA keeps a closed QP from reuse while its packets drain.
const Timewait = 268 * time.Millisecond

// notify gives c DISCONNECTED now and TIMEWAIT_EXIT after the timewait,
// unless its QP is destroyed by then: programs destroy the QP and then the
// ID on DISCONNECTED, as rping does, and the kernel drops the events of an
// ID that is gone; the agent knows QPs, not IDs.
//
// The timer's function runs once, Timewait later, in a goroutine of its
// own that nobody owns or waits for: it only posts to c's channel, which
// drops the event if its session closed it meanwhile.
func (c *conn) notify() {
	c.ch.Post(abi.CMEvent{Event: abi.CMEventDisconnected, QP: c.handle, RemoteQPN: c.peerQPN, RemoteGID: c.peerGID})
	time.AfterFunc(Timewait, func() {
		if !c.q.Destroyed() {
			c.ch.Post(abi.CMEvent{Event: abi.CMEventTimewaitExit, QP: c.handle})
		}
	})
}

// disconnect is cm-disconnect of q: its QP moves to ERR; it gets
// DISCONNECTED unless it had it, and so does its peer.
func (r *Conns) disconnect(q *device.QP) error {
	r.mu.Lock()
	c := r.conns[q.QPN()]
	if c == nil || c.q != q {
		r.mu.Unlock()
		return abi.Errorf(abi.CodeState, "qp", "QP 0x%x is not connected through rdma_cm (cm-connect, or an accept of a cm-listen request)", q.QPN())
	}
	delete(r.conns, q.QPN())
	peer := r.peerLocked(c)
	if peer != nil && !c.disconnected {
		peer.disconnected = true
	}
	r.mu.Unlock()
	if !c.external {
		q.Shutdown("disconnected (rdma_disconnect)")
	}
	if c.disconnected {
		return nil
	}
	c.notify()
	if peer != nil {
		peer.notify()
	} else if c.peerRemote {
		r.remoteDisconnect(c)
	}
	return nil
}

// peerLocked returns c's peer on this host, if it is connected to c.
// +checklocks:r.mu
func (r *Conns) peerLocked(c *conn) *conn {
	p := r.conns[c.peerQPN]
	if p == nil || p.peerQPN != c.q.QPN() || p.peerGID != c.q.GID() || p.q.GID() != c.peerGID {
		return nil
	}
	return p
}

// PeerGone gives DISCONNECTED to the connection of QP qpn whose peer
// (peerQPN, peerGID) went: disconnected (another host's CM_DISC), or its
// workload ended. It reports whether such a connection was here.
func (r *Conns) PeerGone(qpn, peerQPN uint32, peerGID abi.GID) bool {
	r.mu.Lock()
	c := r.conns[qpn]
	ok := c != nil && !c.disconnected && c.peerQPN == peerQPN && c.peerGID == peerGID
	if ok {
		c.disconnected = true
	}
	r.mu.Unlock()
	if ok {
		c.notify()
	}
	return ok
}

// Failed ends the connection of acceptor QP qpn whose ESTABLISHED still
// waits for the RTU of dialer (peerQPN, peerGID), as rdma_cm ends one whose
// REP timed out or was rejected: its QP moves to ERR, and it gets ev
// (UNREACHABLE or REJECTED) in place of ESTABLISHED. It reports whether
// such a connection was here (one established is PeerGone's).
func (r *Conns) Failed(qpn, peerQPN uint32, peerGID abi.GID, ev abi.CMEvent) bool {
	r.mu.Lock()
	c := r.conns[qpn]
	ok := c != nil && c.awaiting != nil && c.peerQPN == peerQPN && c.peerGID == peerGID
	var held abi.CMEvent
	if ok {
		held, c.awaiting = *c.awaiting, nil
		delete(r.conns, qpn)
	}
	r.mu.Unlock()
	if !ok {
		return false
	}
	if !c.external {
		c.q.Shutdown("connection failed before it was established: " + ev.Message)
	}
	ev.Cookie, ev.Listener, ev.ID, ev.QP, ev.RemoteQPN, ev.RemoteGID = held.Cookie, held.Listener, held.ID, held.QP, held.RemoteQPN, held.RemoteGID
	c.ch.Post(ev)
	return true
}

// sessionEnded forgets owner's connections, and gives their peers
// DISCONNECTED.
func (r *Conns) sessionEnded(owner *Events) {
	r.mu.Lock()
	var peers []*conn
	var remote []*conn
	for qpn, c := range r.conns {
		if c.owner != owner {
			continue
		}
		delete(r.conns, qpn)
		if c.disconnected {
			continue
		}
		if p := r.peerLocked(c); p != nil {
			if !p.disconnected {
				p.disconnected = true
				peers = append(peers, p)
			}
		} else if c.peerRemote {
			remote = append(remote, c)
		}
	}
	r.mu.Unlock()
	for _, p := range peers {
		p.notify()
	}
	for _, c := range remote {
		r.remoteDisconnect(c)
	}
}

// remoteDisconnect tells the peer's host that c disconnected (a CM_DISC
// over the agent-to-agent link), in the background: the peer's host may be
// slow or gone.
//
// The goroutine (one per disconnect of a connection to another host) is
// owned by nobody and waited for by nobody: it ends when Hosts has told
// the peer's host or given up, within its lookup and dial timeouts. A peer
// not told learns of the disconnect when its QP times out.
func (r *Conns) remoteDisconnect(c *conn) {
	go func() {
		if err := r.hosts.SendDisconnect(c.peerHost, c.peerQPN, c.peerGID, c.q.QPN(), c.q.GID()); err != nil {
			r.log.Info("rdma_cm disconnect: peer's host not told; it learns of it when its QP times out", "qpn", c.q.QPN(), "err", err)
		}
	}()
}
