// SPDX-License-Identifier: Apache-2.0

package hostlink

// The tcp path's handshake (docs/wire-tcp.md, "Handshake"): HELLO,
// CHALLENGE, AUTH, READY. Each side checks the other is a live host of its
// own switch, with a tagged PVRDMA address and the pvrdma firewall rule on,
// proves it holds the switch's secret with an HMAC over both nonces, and
// proves it is the host it says it is with a signature of the same
// transcript under its host key, which the other side checks against the
// key the host record publishes and this host pinned (package hostkey). A
// refusal names the rule, is sent to the peer in a REFUSE frame when it
// can be, and is logged.

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/hostkey"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// handshakeVersion is the version field of handshake frames, whatever the
// versions offered: the handshake's own format never changes.
const handshakeVersion = 1

// supportedVersions are the protocol versions this build speaks.
var supportedVersions = []uint8{tcpwire.Version}

func nonce() string {
	var b [tcpwire.NonceLen]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// checkPeerHost checks that host id may exchange PVRDMA traffic with this
// host, as the control plane describes it; from is where its connection
// comes from (invalid when this host dialed).
func (u *Links) checkPeerHost(ctx context.Context, id string, from netip.Addr) (records.Host, *records.Alive, error) {
	c := &u.cfg
	hs, err := c.Cache.Host(ctx, id)
	if err != nil {
		return records.Host{}, nil, fmt.Errorf("rule host-known: host %s is not in the control plane: %w", id, err)
	}
	h := hs.Host
	switch {
	case h.State == records.HostDown || hs.Alive == nil:
		return h, nil, fmt.Errorf("rule host-up: host %s holds no live lease in the control plane (down or restarting)", h.Label())
	case c.Switch == "" || h.Switch != c.Switch:
		return h, nil, fmt.Errorf("rule host-on-switch: host %s is on switch %q, this host on %q: only hosts of one distributed switch exchange PVRDMA traffic", h.Label(), h.Switch, c.Switch)
	case !h.PVRDMAAddress.IsValid():
		return h, nil, fmt.Errorf("rule host-rdma-configured: host %s has no tagged PVRDMA address (vrdmactl host configure %s --pvrdma-address ADDR:PORT)", h.Label(), h.Name)
	case !h.FirewallPVRDMA:
		return h, nil, fmt.Errorf("rule host-rdma-configured: host %s's pvrdma firewall rule is off (vrdmactl host configure %s --firewall-pvrdma on)", h.Label(), h.Name)
	case !u.firewall.Load():
		return h, nil, fmt.Errorf("rule host-rdma-configured: this host's pvrdma firewall rule is off (vrdmactl host configure %s --firewall-pvrdma on): no PVRDMA traffic with other hosts", u.cfg.Host)
	case from.IsValid() && from.Unmap() != h.PVRDMAAddress.Addr().Unmap():
		return h, nil, fmt.Errorf("rule pvrdma-address: the connection comes from %s, but host %s's PVRDMA address is %s", from, h.Label(), h.PVRDMAAddress.Addr())
	}
	return h, hs.Alive, nil
}

// peerKey returns the key host h signs its handshakes with: the one its
// record publishes, which must be the one this host pinned for it (pinned
// now, at first sight).
func (u *Links) peerKey(h records.Host) (ed25519.PublicKey, error) {
	if h.HostKey == "" {
		return nil, fmt.Errorf("rule host-key: host %s publishes no host key in the control plane: its agent is older than "+
			"protocol version 2 (host keys); upgrade it", h.Label())
	}
	k, err := hostkey.Parse(h.HostKey)
	if err != nil {
		return nil, fmt.Errorf("rule host-key: host %s's record: %v", h.Label(), err)
	}
	if err := u.cfg.Pins.Check(h.ID, h.Name, k); err != nil {
		return nil, err
	}
	return k, nil
}

// dialRefusal is an error of a dial that one of the two hosts refused
// by a rule (as opposed to no answer or a broken handshake), for the
// counters (mgmt.UplinkStatus.DialsRefused).
type dialRefusal struct{ error }

func (r dialRefusal) Unwrap() error { return r.error }

// refuse tells the peer why (best effort) and returns the error.
func (c *Conn) refuse(err error) error {
	c.writeControl(tcpwire.Refuse, 0, tcpwire.RefuseMsg{Reason: err.Error()})
	return err
}

// dial opens a connection to the link's peer, whose host record is h, at
// its PVRDMA address and runs the initiator's side of the handshake: a
// main connection that offers lanes named group when lane is 0, else lane
// lane of group's main connection.
func (l *Peer) dial(ctx context.Context, h records.Host, group string, lane int) (_ *Conn, err error) {
	l.dials.Add(1)
	defer func() {
		switch {
		case err == nil:
			l.dialsOK.Add(1)
		case errors.As(err, new(dialRefusal)):
			l.dialRefused.Add(1)
		default:
			l.dialFailed.Add(1)
		}
	}()
	addr := h.PVRDMAAddress
	pk, err := l.u.peerKey(h)
	if err != nil {
		l.u.log.Warn("tcp path: refused a host", "err", err)
		return nil, dialRefusal{err}
	}
	// Traffic leaves from this host's PVRDMA address, which the peer
	// checks against the control plane (rule pvrdma-address).
	local, ok := l.u.localAddr()
	if !ok {
		return nil, dialRefusal{fmt.Errorf("rule host-rdma-configured: this host has no PVRDMA address it listens on (vrdmactl host configure %s --pvrdma-address ADDR:PORT)", l.u.cfg.Host)}
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: local.Addr().AsSlice()}}
	nc, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, fmt.Errorf("connect to host %s's PVRDMA address %s: %w", l.peerID, addr, err)
	}
	c := newConn(l, nc, true, handshakeVersion)
	c.group = group
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(handshakeTimeout)
	}
	nc.SetDeadline(deadline)
	err = l.initiate(ctx, c, pk, lane)
	if err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	c.wdeadline, c.rdeadline, c.handshaking = 0, 0, false // +checklocksignore: the handshake's goroutine is c's only writer until it returns c
	return c, nil
}

// initiate runs the initiator's side of the handshake on c; pk is the
// peer's host key, lane c's index among its group's lanes (0: c is a main
// connection, which offers lanes).
func (l *Peer) initiate(ctx context.Context, c *Conn, pk ed25519.PublicKey, lane int) error {
	u := l.u
	secret, err := u.switchSecret(ctx)
	if err != nil {
		return err
	}
	a := &u.cfg
	hello := tcpwire.HelloMsg{Versions: supportedVersions, HostID: a.HostID, Host: a.Host, Switch: a.Switch,
		Boot: u.boot, Nonce: nonce(), Target: l.peerID}
	if lane > 0 {
		hello.Group, hello.Lane = c.group, uint8(lane)
	} else if n := u.lanes(); n > 1 {
		hello.Group, hello.Lanes = c.group, uint8(n)
	}
	if err := c.writeControl(tcpwire.Hello, 0, hello); err != nil {
		return err
	}
	var h tcpwire.Header
	if err := c.readHeader(&h); err != nil {
		return fmt.Errorf("handshake with host %s: %w", l.peerID, err)
	}
	if h.Type == tcpwire.Refuse {
		var r tcpwire.RefuseMsg
		c.readControl(&h, &r)
		u.log.Warn("tcp path: a host refused this host's connection", "peer", l.peerID, "reason", r.Reason)
		return dialRefusal{fmt.Errorf("host %s refused the connection: %s", l.peerID, r.Reason)}
	}
	if h.Type != tcpwire.Challenge {
		return fmt.Errorf("handshake with host %s: %s frame where CHALLENGE was expected", l.peerID, h.Type)
	}
	var ch tcpwire.ChallengeMsg
	if err := c.readControl(&h, &ch); err != nil {
		return fmt.Errorf("handshake with host %s: %w", l.peerID, err)
	}
	if err := ch.Validate(); err != nil {
		return fmt.Errorf("handshake with host %s: %w", l.peerID, err)
	}
	if ch.HostID != l.peerID {
		return dialRefusal{c.refuse(fmt.Errorf("rule host-identity: dialed host %s at its PVRDMA address, host %s answered", l.peerID, ch.HostID))}
	}
	if !slices.Contains(supportedVersions, ch.Version) {
		return dialRefusal{c.refuse(fmt.Errorf("rule version: host %s chose version %d, this agent speaks %v", l.peerID, ch.Version, supportedVersions))}
	}
	if ch.Lanes > hello.Lanes {
		return c.refuse(fmt.Errorf("rule handshake: host %s took %d lanes, %d were offered", l.peerID, ch.Lanes, hello.Lanes))
	}
	if !tcpwire.ProofOK(ch.Proof, tcpwire.Proof(secret, "acceptor", ch.Version, a.HostID, ch.HostID, hello.Nonce, ch.Nonce)) {
		err := fmt.Errorf("rule switch-secret: host %s (%s) does not hold switch %s's secret", ch.Host, ch.HostID, a.Switch)
		u.log.Warn("tcp path: refused a host", "err", err)
		return dialRefusal{c.refuse(err)}
	}
	if !tcpwire.SigOK(pk, ch.Sig, "acceptor", ch.Version, a.HostID, ch.HostID, hello.Nonce, ch.Nonce) {
		err := fmt.Errorf("rule host-key: host %s (%s) did not sign the handshake with its host key (the one its record publishes and this host pinned): "+
			"another host may be answering at its PVRDMA address", ch.Host, ch.HostID)
		u.log.Warn("tcp path: refused a host", "err", err)
		return dialRefusal{c.refuse(err)}
	}
	auth := tcpwire.AuthMsg{Proof: tcpwire.Proof(secret, "initiator", ch.Version, a.HostID, ch.HostID, hello.Nonce, ch.Nonce),
		Sig: tcpwire.Sign(a.HostKey, "initiator", ch.Version, a.HostID, ch.HostID, hello.Nonce, ch.Nonce)}
	if err := c.writeControl(tcpwire.Auth, 0, auth); err != nil {
		return err
	}
	if err := c.readHeader(&h); err != nil {
		return fmt.Errorf("handshake with host %s: %w", l.peerID, err)
	}
	switch h.Type {
	case tcpwire.Ready:
	case tcpwire.Refuse:
		var r tcpwire.RefuseMsg
		c.readControl(&h, &r)
		u.log.Warn("tcp path: a host refused this host's connection", "peer", l.peerID, "reason", r.Reason)
		return dialRefusal{fmt.Errorf("host %s refused the connection: %s", l.peerID, r.Reason)}
	default:
		return fmt.Errorf("handshake with host %s: %s frame where READY was expected", l.peerID, h.Type)
	}
	if h.PayloadLen != 0 {
		return fmt.Errorf("handshake with host %s: READY carries a payload", l.peerID)
	}
	c.ver = ch.Version
	c.nlanes.Store(int32(max(ch.Lanes, 1)))
	l.notePeer(ch.Host, ch.Boot)
	return nil
}

// notePeer records the peer's name and boot ID; a new boot ID means the
// peer agent restarted, and every connection from its previous run is
// stale.
func (l *Peer) notePeer(name, boot string) {
	l.mu.Lock()
	old := l.peerBoot
	l.peerName, l.peerBoot, l.down = name, boot, false
	var stale []*Conn
	if old != "" && old != boot {
		for c := range l.in {
			if c.peerBoot != boot {
				stale = append(stale, c)
			}
		}
	}
	l.mu.Unlock()
	if old != "" && old != boot {
		l.u.log.Info("tcp path: peer agent restarted; dropping its stale connections", "peer", name, "stale", len(stale))
		for _, c := range stale {
			c.Close(errors.New("peer agent restarted"))
		}
		if c := l.out.Load(); c != nil && c.peerBoot != boot {
			c.Close(errors.New("peer agent restarted"))
		}
	}
}

// replaceIn closes the connections the peer opened before c in this boot
// of its agent. A peer keeps one connection for its requests (Peer.out,
// one dial at a time) and dials again only after it closed the last one;
// when the close does not arrive — its RST lost on a lossy network — the
// old connection would sit here until TCP keepalive gave up on it, minutes
// later, holding a descriptor and a reader.
func (l *Peer) replaceIn(c *Conn) {
	var old []*Conn
	l.mu.Lock()
	for o := range l.in {
		if o != c && o.peerBoot == c.peerBoot {
			old = append(old, o)
		}
	}
	l.mu.Unlock()
	for _, o := range old {
		o.Close(errors.New("replaced by the peer's newer connection: it closed this one"))
	}
}

// acceptHandshake runs the acceptor's side of the handshake on nc.
func (u *Links) acceptHandshake(nc *net.TCPConn) (*Conn, error) {
	gen := u.gen.Load()
	remote := nc.RemoteAddr().(*net.TCPAddr).AddrPort()
	nc.SetDeadline(time.Now().Add(handshakeTimeout))
	// The link is not known until HELLO names the peer.
	tmp := &Peer{u: u, peerID: "(unknown)", in: map[*Conn]struct{}{}}
	c := newConn(tmp, nc, false, handshakeVersion)
	known := "" // the host, once the control plane knows it
	fail := func(err error) (*Conn, error) {
		u.log.Warn("tcp path: refused a connection", "from", remote, "err", err)
		if known != "" {
			u.linkTo(known).acceptRefused.Add(1)
		}
		return nil, c.refuse(err)
	}
	var h tcpwire.Header
	if err := c.readHeader(&h); err != nil {
		u.log.Warn("tcp path: bad first frame", "from", remote, "err", err)
		return nil, err
	}
	if testHookFrame != nil {
		testHookFrame(c, &h)
	}
	if h.Type != tcpwire.Hello {
		return fail(fmt.Errorf("rule handshake: first frame is %s, not HELLO", h.Type))
	}
	var hello tcpwire.HelloMsg
	if err := c.readControl(&h, &hello); err != nil {
		return fail(fmt.Errorf("rule handshake: %w", err))
	}
	if err := hello.Validate(); err != nil {
		return fail(fmt.Errorf("rule handshake: %w", err))
	}
	a := &u.cfg
	if hello.Target != a.HostID {
		return fail(fmt.Errorf("rule host-identity: the connection is for host %s, this is host %s (%s)", hello.Target, a.HostID, a.Host))
	}
	ver := uint8(0)
	for _, v := range hello.Versions {
		if slices.Contains(supportedVersions, v) && v > ver {
			ver = v
		}
	}
	if ver == 0 {
		return fail(fmt.Errorf("rule version: host %s offers versions %v, this agent speaks %v: upgrade one of them", hello.Host, hello.Versions, supportedVersions))
	}
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	ph, _, err := u.checkPeerHost(ctx, hello.HostID, remote.Addr())
	if ph.ID == hello.HostID {
		known = ph.ID
	}
	if err != nil {
		return fail(err)
	}
	pk, err := u.peerKey(ph)
	if err != nil {
		return fail(err)
	}
	secret, err := u.switchSecret(ctx)
	if err != nil {
		return fail(err)
	}
	ch := tcpwire.ChallengeMsg{Version: ver, HostID: a.HostID, Host: a.Host, Boot: u.boot, Nonce: nonce()}
	if hello.Lanes > 0 { // an initiator that offers none refuses the key
		ch.Lanes = uint8(min(int(hello.Lanes), u.lanes()))
	}
	ch.Proof = tcpwire.Proof(secret, "acceptor", ver, hello.HostID, a.HostID, hello.Nonce, ch.Nonce)
	ch.Sig = tcpwire.Sign(a.HostKey, "acceptor", ver, hello.HostID, a.HostID, hello.Nonce, ch.Nonce)
	if err := c.writeControl(tcpwire.Challenge, 0, ch); err != nil {
		return nil, err
	}
	if err := c.readHeader(&h); err != nil {
		return nil, err
	}
	if h.Type == tcpwire.Refuse {
		var r tcpwire.RefuseMsg
		c.readControl(&h, &r)
		u.log.Warn("tcp path: the dialing host refused this host", "from", remote, "host", hello.Host, "reason", r.Reason)
		return nil, errors.New(r.Reason)
	}
	if h.Type != tcpwire.Auth {
		return fail(fmt.Errorf("rule handshake: %s frame where AUTH was expected", h.Type))
	}
	var auth tcpwire.AuthMsg
	if err := c.readControl(&h, &auth); err != nil {
		return fail(fmt.Errorf("rule handshake: %w", err))
	}
	if !tcpwire.ProofOK(auth.Proof, tcpwire.Proof(secret, "initiator", ver, hello.HostID, a.HostID, hello.Nonce, ch.Nonce)) {
		return fail(fmt.Errorf("rule switch-secret: host %s (%s) does not hold switch %s's secret: not a member of the switch", hello.Host, hello.HostID, a.Switch))
	}
	if !tcpwire.SigOK(pk, auth.Sig, "initiator", ver, hello.HostID, a.HostID, hello.Nonce, ch.Nonce) {
		return fail(fmt.Errorf("rule host-key: the dialer presents the ID of host %s but did not sign the handshake with that host's key "+
			"(the one its record publishes and this host pinned): another host posing as it?", ph.Label()))
	}
	l := u.linkTo(hello.HostID)
	l.bytesIn.Add(tmp.bytesIn.Load())
	l.framesIn.Add(tmp.framesIn.Load())
	l.bytesOut.Add(tmp.bytesOut.Load())
	l.framesOut.Add(tmp.framesOut.Load())
	c.l, c.ver, c.peerBoot = l, handshakeVersion, hello.Boot
	if hello.Lane > 0 {
		// A lane joins its main connection (before READY: the peer
		// stripes over it once it has READY), and closes with it.
		if !l.attachLane(c, hello.Group, int(hello.Lane)) {
			return fail(fmt.Errorf("rule lane: host %s opened lane %d of group %s, but none of its connections has that group with that lane free", hello.Host, hello.Lane, hello.Group))
		}
	} else {
		c.group = hello.Group
		c.nlanes.Store(int32(max(ch.Lanes, 1)))
		// Registered, and the peer's boot noted, before READY: once the
		// peer has READY it may connect again (a restarted agent, a new
		// boot ID), and that connection's notePeer must find this one to
		// drop it.
		l.mu.Lock()
		l.in[c] = struct{}{}
		l.mu.Unlock()
	}
	if err := u.stale(gen); err != nil {
		c.Close(err)
		return nil, err
	}
	l.notePeer(hello.Host, hello.Boot)
	if hello.Lane == 0 {
		l.replaceIn(c)
	}
	h = tcpwire.Header{Type: tcpwire.Ready}
	if err := c.WriteFrame(&h, nil); err != nil {
		c.Close(err)
		return nil, err
	}
	c.ver = ver
	nc.SetDeadline(time.Time{})
	c.wdeadline, c.rdeadline, c.handshaking = 0, 0, false // +checklocksignore: the handshake's goroutine is c's only writer until it returns c (l.in's other users only close it)
	l.accepts.Add(1)
	u.log.Debug("tcp path: accepted a connection", "from", remote, "host", hello.Host, "version", ver)
	return c, nil
}

// Conn returns the link's connection for requests, dialing (within
// wait) if there is none.
func (l *Peer) Conn(wait time.Duration) (*Conn, error) {
	if c := l.out.Load(); c != nil {
		return c, nil
	}
	l.dialMu.Lock()
	defer l.dialMu.Unlock()
	if c := l.out.Load(); c != nil {
		return c, nil
	}
	if l.pipe != nil {
		return l.pipeConn()
	}
	u := l.u
	u.mu.Lock()
	closed := u.closed
	u.mu.Unlock()
	if closed {
		return nil, errors.New("agent stopping")
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(wait, 100*time.Millisecond))
	defer cancel()
	gen := u.gen.Load()
	h, _, err := u.checkPeerHost(ctx, l.peerID, netip.Addr{})
	if err == nil {
		l.mu.Lock()
		l.addr = h.PVRDMAAddress
		l.mu.Unlock()
		var c *Conn
		c, err = l.dial(ctx, h, newGroup(), 0)
		if err == nil {
			want := c.Lanes()
			c.nlanes.Store(1) // until its lanes join it (openLanes)
			c.peerBoot = l.bootOf()
			l.out.Store(c)
			if err = u.stale(gen); err == nil {
				err = u.goReader(c)
			}
			if err == nil && want > 1 {
				err = u.goOpenLanes(func(ctx context.Context, lane int) (*Conn, error) { return l.dial(ctx, h, c.group, lane) }, c, want)
			}
			if err == nil {
				return c, nil
			}
			c.Close(err)
		}
	}
	l.mu.Lock()
	l.lastErr, l.down = err.Error(), true
	l.mu.Unlock()
	return nil, err
}

// goReader starts c's response reader, unless the agent stops: the
// uplink's wait group must not grow once close waits on it.
func (u *Links) goReader(c *Conn) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return errors.New("agent stopping")
	}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		c.readResponses()
	}()
	return nil
}

func (l *Peer) bootOf() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peerBoot
}
