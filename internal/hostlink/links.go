// SPDX-License-Identifier: Apache-2.0

// Package hostlink is the agent's links to the other hosts of its
// distributed switch (docs/wire-tcp.md): TCP connections between agents on
// the hosts' PVRDMA addresses, authenticated by a handshake
// (handshake.go), carrying frames of package tcpwire. It listens, dials,
// keeps the connections with each peer host (Peer), hands every request
// frame of a connection a peer opened to its handler — RC requests to the
// tcp path's responder (package transport/tcp, Config.Responder),
// connection-management frames to connection management (cm.go) — and
// every response to the call that waits for it (Call). It follows this
// host's record in the control plane (config.go), and makes the test
// link of the tests' local paths (testlink.go). It knows nothing of QPs
// or guest memory: the tcp path is a user of its connections.
package hostlink

// Connections. Between two hosts A and B there are two TCP connections:
// the one A opened carries A's requests and B's responses, the one B
// opened carries B's requests and A's responses. A responder thus never
// waits on its own requests to write a response, and two agents flooding
// each other cannot deadlock on full socket buffers. A connection is opened
// on first use, after a handshake that agrees on a version and proves both
// hosts hold the switch's secret (docs/wire-tcp.md).
//
// Goroutines and who owns them:
//
//	Links.serve         accept loop on the PVRDMA address; one per
//	                    listener, owned by the Links, stopped when the
//	                    listener closes (the address changed, or close).
//	Links.watchConfig   follows this host's record in the control plane
//	                    (config.go): a new PVRDMA address moves the
//	                    listener, the pvrdma firewall rule turned off drops
//	                    every connection; stopped by close.
//	Conn.serveRequests  one per accepted connection (responder side): reads
//	                    frames in order (sleeping in the network poller
//	                    between them) and hands each request to its
//	                    handler on this goroutine: RC requests to the tcp
//	                    path's Responder, which executes them against the
//	                    target VM's memory and answers. CM requests go to
//	                    their own goroutine, which may wait for a
//	                    listener's accept (at most cmMaxPending per
//	                    connection); CM_DISC and CM_RTU frames to their own
//	                    goroutine, which looks the sender up (at most
//	                    cmMaxNotes per connection: the reader waits for
//	                    one to end). Each is owned by the connection's
//	                    Links (its wait group) and ends with its lookup and
//	                    answer.
//	Conn.readResponses  one per opened connection (requester side): reads
//	                    responses, hands each to the Call waiting for its
//	                    tag (a READ's data goes straight into the call's
//	                    segments), fails every waiting call when the
//	                    connection ends.
//
// Requesters are QP goroutines (the tcp path's requester): each writes its
// request frames under the connection's write lock (WriteFrames) and
// keeps its window of calls in flight. Flow control is TCP's: a slow
// responder stops reading, the requester's write blocks, the QP waits. No
// buffer grows with traffic: frames go from guest memory to the socket
// (writev) and from the socket to guest memory.

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/hostkey"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// Handshake and connection timing.
const (
	handshakeTimeout = 5 * time.Second
	keepAlive        = 15 * time.Second
	// writeStall bounds a frame write that makes no progress (the peer
	// stopped reading): the connection is then closed.
	writeStall = 10 * time.Second
)

// Config configures the Links.
type Config struct {
	// Responder makes the handler of the RC requests of a connection a
	// peer host opened (the tcp path's responder), once per connection.
	Responder func(c *Conn) Responder
	CM        *cm.Manager // where remote dialers' requests go
	HostID    string      // this host's ID
	Host      string      // this host's name, for messages
	Log       *slog.Logger

	// The control plane: this host's record and its peers' (Cache), the
	// switch's secret (Store).
	Store         *store.Store
	Cache         *member.Cache
	Switch        string        // the distributed switch this host is on
	LookupTimeout time.Duration // bounds a lookup that goes to etcd
	// PVRDMAAddress is where to listen at start (the host record may
	// give another later); Firewall the pvrdma firewall rule at start.
	PVRDMAAddress netip.AddrPort
	Firewall      bool
	// HostKey is this host's key (package hostkey), which signs its side
	// of every handshake; its public half is in the host record. Pins are
	// the keys of the other hosts as first seen (hostkey.Pins).
	HostKey ed25519.PrivateKey
	Pins    *hostkey.Pins
	// OnDisconnect, if set, is told of a CM_DISC from a peer host: its QP
	// fromQPN (GID fromGID), an adapter of that host, disconnected the
	// rdma_cm connection of this host's QP qpn.
	OnDisconnect func(qpn, fromQPN uint32, fromGID abi.GID)
	// OnEstablish, if set, is told of a CM_RTU from a peer host: its QP
	// fromQPN (GID fromGID), which its workload moves itself, established
	// the rdma_cm connection to this host's QP qpn.
	OnEstablish func(qpn, fromQPN uint32, fromGID abi.GID)
	// Handshakes and HandshakesPerSource bound the accepted connections
	// in their handshake at once, in all and from one source address
	// (accept.go); 0 means DefaultHandshakes and
	// DefaultHandshakesPerSource.
	Handshakes, HandshakesPerSource int
	// OnDatagram, if set, is given each datagram frame (UD_SEND,
	// UD_SEND_IMM) a peer host sent: its header and payload (the GIDs
	// and the message), valid during the call, from the connection's
	// reader. Without it datagrams are dropped.
	OnDatagram func(fromHost string, h *tcpwire.Header, payload []byte)
	// Lanes is how many connections this host carries its requests to a
	// peer on, and takes a peer's on, the first included (lanes.go):
	// 1..tcpwire.MaxLanes; 0 means one per two cores, at most 4 (defaultLanes). A peer that
	// offers or takes fewer gets fewer; one of an older release, one.
	// StripeMin is the least stripe a message is cut into (0:
	// DefaultStripeMin): messages under twice that stay on one connection.
	Lanes     int
	StripeMin uint64
}

// Links are the agent's links to the other hosts of its switch.
type Links struct {
	cfg  Config
	log  *slog.Logger
	boot string // this process's boot ID

	// firewall is whether this host's pvrdma firewall rule is on, as its
	// host record last said (vrdmad --firewall-pvrdma at start).
	firewall atomic.Bool
	// adm admits accepted connections to their handshake (accept.go).
	adm admission
	// badKey is the host key this host's record published at the last
	// apply (config.go), so that another key than its own is logged once;
	// only watchConfig's goroutine uses it.
	badKey string
	// hsPanics counts accepted connections closed because their
	// handshake panicked (guard.go).
	hsPanics atomic.Uint64
	// gen counts dropAll calls: a connection whose setup began before one
	// is dropped once set up (see stale).
	gen atomic.Uint64

	secretMu sync.Mutex
	secret   []byte // the switch secret, once read

	mu sync.Mutex
	// nil: no PVRDMA address, or it could not be bound
	ln *net.TCPListener // +checklocks:mu
	// the PVRDMA address, as the host record says
	addr netip.AddrPort // +checklocks:mu
	// why ln is nil although addr is set
	listenErr string // +checklocks:mu
	// by peer host ID
	links  map[string]*Peer // +checklocks:mu
	closed bool             // +checklocks:mu

	stop chan struct{} // closed by close: watchConfig returns
	wg   sync.WaitGroup
}

// Peer is this host's link with one peer host: the connection it opened
// (requests out), the connections the peer opened (requests in), and
// counters. It lives as long as the Links.
type Peer struct {
	u      *Links
	peerID string

	dialMu sync.Mutex // one dial at a time
	out    atomic.Pointer[Conn]

	// The test link (testlink.go): pipe makes connection n (a pipe's two
	// ends); lossy says frames may be lost without the connection.
	pipe  func(n uint64) (req, resp *Conn, err error)
	lossy bool

	mu       sync.Mutex
	in       map[*Conn]struct{} // +checklocks:mu
	peerName string             // +checklocks:mu
	addr     netip.AddrPort     // +checklocks:mu
	peerBoot string             // +checklocks:mu
	lastErr  string             // +checklocks:mu
	down     bool               // +checklocks:mu

	bytesOut, bytesIn, framesOut, framesIn, dials atomic.Uint64
	// The handshakes with the peer by side and result
	// (mgmt.UplinkStatus): this host's dials that succeeded, those
	// refused (by either host) and those that failed; the peer's
	// connections this host accepted and those it refused.
	dialsOK, dialRefused, dialFailed, accepts, acceptRefused atomic.Uint64
	// striped counts the batches of requests written striped over lanes.
	striped atomic.Uint64
	// panics counts the connections with the peer closed because a
	// goroutine serving them panicked (guard.go).
	panics atomic.Uint64
	// dgramFail is when a datagram last found no connection and could
	// not dial one (monotonic ns; 0: it did), ud.go.
	dgramFail atomic.Int64
}

// Start starts the links of an agent with a control plane: it listens
// on the host's PVRDMA address when it has one, and follows the host
// record for changes (a PVRDMA address given later with vrdmactl host
// configure starts it then). A PVRDMA address given at start that cannot
// be bound fails the start.
func Start(cfg Config) (*Links, error) {
	if cfg.Responder == nil {
		return nil, errors.New("host links: no responder for RC requests (Config.Responder)")
	}
	if len(cfg.HostKey) != ed25519.PrivateKeySize || cfg.Pins == nil {
		return nil, errors.New("host links: no host key (Config.HostKey, Config.Pins): the handshake signs with it")
	}
	if cfg.Lanes < 0 || cfg.Lanes > tcpwire.MaxLanes {
		return nil, fmt.Errorf("host links: %d lanes: want 1..%d, or 0 for one per core", cfg.Lanes, tcpwire.MaxLanes)
	}
	if cfg.Handshakes < 0 || cfg.HandshakesPerSource < 0 {
		return nil, fmt.Errorf("host links: handshake limits %d in all, %d per source: want 0 (the default) or more", cfg.Handshakes, cfg.HandshakesPerSource)
	}
	if cfg.Handshakes == 0 {
		cfg.Handshakes = DefaultHandshakes
	}
	if cfg.HandshakesPerSource == 0 {
		cfg.HandshakesPerSource = DefaultHandshakesPerSource
	}
	var b [16]byte
	rand.Read(b[:])
	u := &Links{cfg: cfg, log: cfg.Log.With("component", "uplink"), boot: hex.EncodeToString(b[:]),
		links: map[string]*Peer{}, stop: make(chan struct{})}
	u.firewall.Store(cfg.Firewall)
	if addr := cfg.PVRDMAAddress; addr.IsValid() {
		u.mu.Lock()
		err := u.listenLocked(addr)
		u.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	u.wg.Add(1)
	go u.watchConfig()
	return u, nil
}

// Peer returns the link to host id, making it (no connection is opened
// before one is asked for: Peer.Conn).
func (u *Links) Peer(id string) *Peer { return u.linkTo(id) }

// listenLocked listens on addr, the host's PVRDMA address, and starts its
// accept loop.
//
// +checklocks:u.mu
func (u *Links) listenLocked(addr netip.AddrPort) error {
	u.addr, u.listenErr = addr, ""
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		err = fmt.Errorf("tcp path: listen on the PVRDMA address %s: %w (is the address on this host, the port free?)", addr, err)
		u.listenErr = err.Error()
		return err
	}
	u.ln = ln
	u.wg.Add(1)
	go u.serve(ln)
	u.log.Info("tcp path listening", "address", ln.Addr().String(), "boot", u.boot)
	return nil
}

// localAddr returns the host's PVRDMA address, the source of the
// connections it opens; false when it has none it listens on.
func (u *Links) localAddr() (netip.AddrPort, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.addr, u.ln != nil
}

// Close stops accepting and closes every connection; waiting requesters
// fail over to their retry rules.
func (u *Links) Close() {
	u.mu.Lock()
	u.closed = true
	if u.ln != nil {
		u.ln.Close()
		u.ln = nil
	}
	u.mu.Unlock()
	close(u.stop)
	u.dropAll(errors.New("agent stopping"))
	u.wg.Wait()
}

// dropAll closes every connection with every peer, and those being set
// up when it is called.
func (u *Links) dropAll(why error) {
	u.gen.Add(1)
	u.mu.Lock()
	links := make([]*Peer, 0, len(u.links))
	for _, l := range u.links {
		links = append(links, l)
	}
	u.mu.Unlock()
	for _, l := range links {
		l.closeAll(why)
	}
}

// stale says why a connection whose setup began at generation gen must
// not be used, now that it is registered with its link: the agent stops,
// or dropAll ran meanwhile (the PVRDMA address changed, the firewall rule
// went off). nil when it may.
func (u *Links) stale(gen uint64) error {
	u.mu.Lock()
	closed := u.closed
	u.mu.Unlock()
	switch {
	case closed:
		return errors.New("agent stopping")
	case u.gen.Load() != gen || !u.firewall.Load():
		return errors.New("this host's PVRDMA configuration changed while the connection was set up")
	}
	return nil
}

// linkTo returns the link to host id, creating it.
func (u *Links) linkTo(id string) *Peer {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.links[id]
	if l == nil {
		l = &Peer{u: u, peerID: id, in: map[*Conn]struct{}{}}
		u.links[id] = l
	}
	return l
}

// label names the peer host for messages: its name and ID once a
// handshake told its name, else its ID.
func (l *Peer) label() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peerName == "" {
		return l.peerID
	}
	return l.peerName + " (" + l.peerID + ")"
}

// ID is the peer host's ID.
func (l *Peer) ID() string { return l.peerID }

// Lossy reports whether the link may lose frames without losing the
// connection (the test link): a request unanswered within its timeout
// is then taken as lost, not as a sign of a dead peer.
func (l *Peer) Lossy() bool { return l.lossy }

func (l *Peer) setErr(err error) {
	l.mu.Lock()
	l.lastErr = err.Error()
	l.mu.Unlock()
}

// closeAll closes every connection with the peer.
func (l *Peer) closeAll(why error) {
	if c := l.out.Load(); c != nil {
		c.Close(why)
	}
	l.mu.Lock()
	in := make([]*Conn, 0, len(l.in))
	for c := range l.in {
		in = append(in, c)
	}
	l.mu.Unlock()
	for _, c := range in {
		c.Close(why)
	}
}

// switchSecret returns the switch's secret, creating it in the control
// plane if this is the first host to need it.
func (u *Links) switchSecret(ctx context.Context) ([]byte, error) {
	u.secretMu.Lock()
	defer u.secretMu.Unlock()
	if u.secret != nil {
		return u.secret, nil
	}
	c := &u.cfg
	sw := c.Switch
	if sw == "" {
		return nil, errors.New("this host is on no distributed switch (--switch): it has no tcp path")
	}
	key := records.SwitchSecretKey(sw)
	s, _, err := store.Get[records.SwitchSecret](ctx, c.Store, key)
	if errors.Is(err, store.ErrNotFound) {
		ns := records.SwitchSecret{Switch: sw, Key: make([]byte, records.SwitchSecretLen)}
		rand.Read(ns.Key)
		if _, err = c.Store.Create(ctx, key, ns); err == nil {
			s = ns
		} else if errors.Is(err, store.ErrExists) {
			s, _, err = store.Get[records.SwitchSecret](ctx, c.Store, key)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("switch %s's secret (%s): %w", sw, key, err)
	}
	u.secret = s.Key
	return u.secret, nil
}

// serve accepts connections from other hosts on ln.
func (u *Links) serve(ln *net.TCPListener) {
	defer u.wg.Done()
	for {
		nc, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			u.log.Warn("tcp path: accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		// Each connection admitted holds a goroutine and buffers until
		// its handshake ends: admission bounds them (accept.go).
		from := nc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		verdict := u.admit(from)
		if verdict != admitOK && verdict != admitWait {
			u.refuseAtAccept(nc, from, verdict)
			continue
		}
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			c, err := u.handshake(nc, from, verdict == admitWait)
			if err != nil {
				nc.Close()
				return
			}
			if c.main != nil {
				c.serveLane() // a lane: it reads what its main connection's responder asks
				return
			}
			c.serveRequests() // its own guard
		}()
	}
}

// handshake runs the handshake of accepted connection nc from source
// address from, holding one of the handshake slots, which it gives back;
// unknown says its source must first pass a fresh read of the host
// records (admitWait). A panic in it closes nc (guardHandshake).
func (u *Links) handshake(nc *net.TCPConn, from netip.Addr, unknown bool) (c *Conn, err error) {
	defer u.release(from)
	if unknown && !u.refreshMember(from) {
		u.refuseAtAccept(nc, from, refuseMember)
		return nil, fmt.Errorf("rule host-on-switch: %s is not the PVRDMA address of a host of this switch", from)
	}
	defer func() {
		if c == nil && err == nil {
			err = errors.New("the handshake panicked")
		}
	}()
	defer u.guardHandshake(nc)
	return u.acceptHandshake(nc)
}

// Status reports each link.
func (u *Links) Status() []mgmt.UplinkStatus {
	u.mu.Lock()
	links := make([]*Peer, 0, len(u.links))
	for _, l := range u.links {
		links = append(links, l)
	}
	u.mu.Unlock()
	var out []mgmt.UplinkStatus
	for _, l := range links {
		l.mu.Lock()
		s := mgmt.UplinkStatus{PeerHostID: l.peerID, PeerHost: l.peerName, LastError: l.lastErr, Conns: len(l.in), Panics: l.panics.Load()}
		if l.addr.IsValid() {
			s.Address = l.addr.String()
		}
		down := l.down
		l.mu.Unlock()
		if c := l.out.Load(); c != nil {
			s.Conns++
			s.Lanes = c.Lanes()
		}
		switch {
		case s.Conns > 0:
			s.State = "up"
		case down:
			s.State = "down"
		default:
			s.State = "idle"
		}
		s.BytesOut, s.BytesIn = l.bytesOut.Load(), l.bytesIn.Load()
		s.FramesOut, s.FramesIn = l.framesOut.Load(), l.framesIn.Load()
		s.DialsEstablished, s.DialsRefused, s.DialsFailed = l.dialsOK.Load(), l.dialRefused.Load(), l.dialFailed.Load()
		s.Accepted, s.AcceptsRefused = l.accepts.Load(), l.acceptRefused.Load()
		s.Dials, s.Refused = l.dials.Load(), s.DialsRefused+s.AcceptsRefused
		s.StripedBatches = l.striped.Load()
		out = append(out, s)
	}
	return out
}
