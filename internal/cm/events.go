// SPDX-License-Identifier: Apache-2.0

package cm

// rdma_cm's event channels (ops 40..47, docs/wire-local.md §4.12): the
// shape librdmacm has. A session opens channels; each is a socketpair
// (Channel) whose far end the workload polls and reads, one abi.CMEvent
// per message. Listens, resolutions, connects and disconnects answer at
// once; their outcome arrives on the channel: CONNECT_REQUEST for every
// dialer (accepted or rejected with accept-request and reject-request,
// which then send ESTABLISHED to the acceptor's channel), ESTABLISHED,
// REJECTED or UNREACHABLE to a dialer, DISCONNECTED then TIMEWAIT_EXIT
// to both sides of a connection either side disconnects (or whose
// workload goes away; conns.go). Underneath is the same connection
// management as ops 15..20's (Client).

import (
	"errors"
	"log/slog"
	"sync"
	"syscall"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// MaxChannels bounds one session's event channels.
const MaxChannels = 64

// listen is a cm-listen: one Client listener per adapter it covers.
type listen struct {
	ch     *Channel
	cookie uint64
	ids    []uint32 // the Client's listeners
	// ud: the UDP port space's: its accepts connect nothing and give the
	// acceptor no event.
	ud bool
	// hostPort: it holds its port of the host's addresses (hostaddr.go).
	hostPort bool
	port     uint16
}

// release frees the host port l holds, if it holds one.
func (l *listen) release(m *Manager) {
	if l.hostPort {
		m.releaseHostPort(hostPort{l.port, l.ud}, l)
	}
}

func (l *listen) idsOrNil() []uint32 {
	if l == nil {
		return nil
	}
	return l.ids
}

// Events is one session's event channels and cm-listens. The session
// makes it with NewEvents when it starts, calls its methods from its op
// handlers (with the VM it is attached to), and ends it with Close. It is
// safe for concurrent use.
type Events struct {
	c     *Client // the session's connection management; its context is the session's
	conns *Conns  // the agent's
	hosts Hosts
	log   *slog.Logger

	mu      sync.Mutex
	chans   map[uint32]*Channel // +checklocks:mu
	listens map[uint32]*listen  // +checklocks:mu
	// Client listener ID → its cm-listen
	byCM   map[uint32]*listen // +checklocks:mu
	nextID uint32             // +checklocks:mu

	// wg counts the goroutines Events starts (go); Close waits for them.
	wg sync.WaitGroup
}

// NewEvents returns the event channels of the session whose connection
// management is c: its connections are recorded in conns, other hosts are
// reached through hosts, and what goes wrong is logged on log (the
// session's logger).
func NewEvents(c *Client, conns *Conns, hosts Hosts, log *slog.Logger) *Events {
	return &Events{c: c, conns: conns, hosts: hosts, log: log,
		chans: map[uint32]*Channel{}, listens: map[uint32]*listen{}, byCM: map[uint32]*listen{}}
}

// goroutine runs fn in a goroutine of e.
//
// These goroutines (a cm-listen's loop per listener; one per cm-resolve
// and per cm-connect) are owned by e, and Close waits for them. A listen
// loop ends when its listener is closed (cm-close-listen) or the Client's
// context ends; a resolve ends within the control plane's lookup timeout;
// a connect within its timeout, or when the Client's context ends.
func (e *Events) goroutine(fn func()) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		fn()
	}()
}

func (e *Events) channel(id uint32) (*Channel, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.chans[id]
	if !ok {
		return nil, abi.Errorf(abi.CodeNotFound, "channel", "no CM event channel with handle %d", id)
	}
	return c, nil
}

// OpenChannel is cm-open-channel: a new channel, its handle, and the
// workload's end of its socket, a descriptor the caller sends to the
// workload and then closes.
func (e *Events) OpenChannel() (handle uint32, fd int, err error) {
	e.mu.Lock()
	n := len(e.chans)
	e.mu.Unlock()
	if n >= MaxChannels {
		return 0, -1, abi.Errorf(abi.CodeLimit, "", "this session has %d CM event channels, the limit", n)
	}
	c, peer, err := NewChannel("cm-channel")
	if err != nil {
		return 0, -1, err
	}
	e.mu.Lock()
	e.nextID++
	c.id = e.nextID
	e.chans[c.id] = c
	e.mu.Unlock()
	c.Start(e.log)
	return c.id, peer, nil
}

// CloseChannel is cm-close-channel of channel id.
func (e *Events) CloseChannel(id uint32) error {
	e.mu.Lock()
	c, ok := e.chans[id]
	delete(e.chans, id)
	e.mu.Unlock()
	if !ok {
		return abi.Errorf(abi.CodeNotFound, "channel", "no CM event channel with handle %d", id)
	}
	c.Close()
	return nil
}

// Listen is cm-listen of r for v: a listener on r.Adapter of v, or on
// every adapter of v, whose requests come as CONNECT_REQUEST on channel
// r.Channel, holding its port of the host's addresses too with
// r.HostPort, if the session's process is in the host's network (hostNet).
// It returns the listen's handle.
func (e *Events) Listen(v *device.Context, r *abi.CMListen, hostNet bool) (uint32, error) {
	c, err := e.channel(r.Channel)
	if err != nil {
		return 0, err
	}
	if r.HostPort == abi.HostPortAddr && !hostNet {
		return 0, abi.Errorf(abi.CodeInvalid, "host_port", "a host address is bound, and this process is not in the host's network (it runs in another network namespace, a VM's): bind an adapter's address or the any address")
	}
	var ads []string
	if r.Adapter != "" {
		ads = []string{r.Adapter}
	} else {
		for _, ad := range v.Adapters() {
			ads = append(ads, ad.Name())
		}
	}
	l := &listen{ch: c, cookie: r.Cookie, ud: r.UD, port: r.Port}
	for _, name := range ads {
		id, err := e.c.listen(v, name, r.Port, r.UD)
		if err != nil {
			for _, cid := range l.ids {
				e.c.CloseListener(cid)
			}
			return 0, err
		}
		l.ids = append(l.ids, id)
	}
	if r.HostPort != "" && hostNet {
		if err := e.c.m.claimHostPort(hostPort{r.Port, r.UD}, v.Name(), ads, l); err != nil {
			for _, cid := range l.ids {
				e.c.CloseListener(cid)
			}
			return 0, err
		}
		l.hostPort = true
	}
	e.mu.Lock()
	e.nextID++
	h := e.nextID
	e.listens[h] = l
	for _, cid := range l.ids {
		e.byCM[cid] = l
	}
	e.mu.Unlock()
	for _, cid := range l.ids {
		e.goroutine(func() {
			for {
				req, err := e.c.GetRequest(cid)
				if err != nil {
					return // closed, or the session ends
				}
				if !c.Post(abi.CMEvent{Event: abi.CMEventConnectRequest, Cookie: l.cookie, Listener: cid, ID: req.ID,
					RemoteVM: req.RemoteVM, RemoteAdapter: req.RemoteAdapter, RemoteGID: req.RemoteGID, RemoteQPN: req.RemoteQPN,
					Adapter: req.Adapter, Port: req.Port, PrivateData: req.PrivateData, SQPSN: req.SQPSN, RQPSN: req.RQPSN, MTU: req.MTU,
					LocalIP: req.LocalIP, PeerIP: req.PeerIP}) {
					e.c.Reject(&abi.RejectRequest{Listener: cid, ID: req.ID, Reason: "the listener's event channel is closed"})
				}
			}
		})
	}
	return h, nil
}

// CloseListen is cm-close-listen of listen id.
func (e *Events) CloseListen(id uint32) error {
	e.mu.Lock()
	l, ok := e.listens[id]
	delete(e.listens, id)
	for _, cid := range l.idsOrNil() {
		delete(e.byCM, cid)
	}
	e.mu.Unlock()
	if !ok {
		return abi.Errorf(abi.CodeNotFound, "listener", "no CM listen with handle %d", id)
	}
	l.release(e.c.m)
	for _, cid := range l.ids {
		e.c.CloseListener(cid)
	}
	return nil
}

// Resolve is cm-resolve of r for v: ADDR_RESOLVED or ADDR_ERROR follows
// on channel r.Channel.
func (e *Events) Resolve(v *device.Context, r *abi.CMResolve) error {
	c, err := e.channel(r.Channel)
	if err != nil {
		return err
	}
	var src *device.Adapter
	if r.Adapter != "" {
		if src, err = v.Adapter(r.Adapter); err != nil {
			return err
		}
	}
	e.goroutine(func() { c.Post(e.resolve(v, src, r)) })
	return nil
}

// Route is cm-route of r: ROUTE_RESOLVED follows on channel r.Channel.
func (e *Events) Route(r *abi.CMRoute) error {
	c, err := e.channel(r.Channel)
	if err != nil {
		return err
	}
	c.Post(abi.CMEvent{Event: abi.CMEventRouteResolved, Cookie: r.Cookie})
	return nil
}

// Connect is cm-connect of r for v: the outcome (ESTABLISHED,
// CONNECT_RESPONSE, REJECTED or UNREACHABLE) follows on channel
// r.Channel.
func (e *Events) Connect(v *device.Context, r *abi.CMConnect) error {
	c, err := e.channel(r.Channel)
	if err != nil {
		return err
	}
	q, err := ConnQP(e.c.m.dev, v, r.QP, r.QPN)
	if err != nil {
		return err
	}
	if err := CheckDialer(q, r.UD, r.QPN != 0); err != nil {
		return err
	}
	e.goroutine(func() { c.Post(e.connect(c, q, r)) })
	return nil
}

// Establish is cm-establish of r for v (rdma_establish).
func (e *Events) Establish(v *device.Context, r *abi.CMEstablish) error {
	q, err := v.QPByHandle(r.QP)
	if err != nil {
		return abi.Errorf(abi.CodeNotFound, "qp", "no QP with handle %d", r.QP)
	}
	return e.conns.establish(q)
}

// Disconnect is cm-disconnect of r for v (rdma_disconnect).
func (e *Events) Disconnect(v *device.Context, r *abi.CMDisconnect) error {
	q, err := v.QPByHandle(r.QP)
	if err != nil {
		return abi.Errorf(abi.CodeNotFound, "qp", "no QP with handle %d", r.QP)
	}
	return e.conns.disconnect(q)
}

// Accept is accept-request (op 18) of r for v, for any listener of the
// session: the Client's Accept and, for a request of a cm-listen, the
// acceptor's ESTABLISHED, on channel r.Channel or else the listen's, and
// the connection's record for disconnects. With an external dialer (it
// moves its QP itself) ESTABLISHED waits for the dialer's RTU (Conns.RTU).
func (e *Events) Accept(v *device.Context, r *abi.AcceptRequest) (abi.ConnectReply, error) {
	var ch *Channel
	if r.Channel != 0 {
		c, err := e.channel(r.Channel) // checked before the request is accepted
		if err != nil {
			return abi.ConnectReply{}, err
		}
		ch = c
	}
	rep, awaitRTU, err := e.c.Accept(v, r)
	if err == nil {
		e.accepted(v, r, ch, rep, awaitRTU)
	}
	return rep, err
}

func (e *Events) accepted(v *device.Context, r *abi.AcceptRequest, ch *Channel, rep abi.ConnectReply, awaitRTU bool) {
	e.mu.Lock()
	l := e.byCM[r.Listener]
	e.mu.Unlock()
	if l == nil || l.ud {
		return // a service ID resolution: nothing connected, no event (as rdma_cm's SIDR REP)
	}
	if ch == nil {
		ch = l.ch
	}
	q, err := ConnQP(e.c.m.dev, v, r.QP, r.QPN)
	if err != nil {
		return
	}
	cc := &conn{owner: e, ch: ch, q: q, handle: q.Handle(), peerQPN: rep.RemoteQPN, peerGID: rep.RemoteGID, external: r.QPN != 0}
	if p := e.c.m.dev.QP(rep.RemoteQPN); p == nil || p.GID() != rep.RemoteGID {
		cc.peerRemote = true // on another host: found by its GID when it is told
	}
	path := rep.Path
	ev := abi.CMEvent{Event: abi.CMEventEstablished, Cookie: l.cookie, Listener: r.Listener, ID: r.ID, QP: q.Handle(),
		RemoteQPN: rep.RemoteQPN, RemoteGID: rep.RemoteGID, Adapter: q.Adapter().Name(), Path: &path}
	if awaitRTU {
		e.conns.addAwaitingRTU(cc, ev)
		return
	}
	e.conns.add(cc)
	ch.Post(ev)
}

// Close ends the session's event channels: it waits for e's goroutines
// (call it after the Client's context ended and Client.Close, which end
// them), closes the channels, and gives the peers of the session's
// connections DISCONNECTED.
func (e *Events) Close() {
	e.wg.Wait()
	e.mu.Lock()
	for id, c := range e.chans {
		c.Close()
		delete(e.chans, id)
	}
	for _, l := range e.listens {
		l.release(e.c.m)
	}
	e.mu.Unlock()
	e.conns.sessionEnded(e)
}

// errno values of CM event statuses (negative, as rdma_cm's).
const (
	statusTimedOut    = -int(syscall.ETIMEDOUT)
	statusUnreachable = -int(syscall.EHOSTUNREACH)
	statusInvalid     = -int(syscall.EINVAL)
)

// resolve finds r.Remote: an adapter of this host or, through the
// control plane, of another, that src (or, when nil, the first of v's
// adapters that may reach it) can connect to.
func (e *Events) resolve(v *device.Context, src *device.Adapter, r *abi.CMResolve) abi.CMEvent {
	if gid, ok := multicastGroup(r.Remote); ok {
		return resolveGroup(v, src, gid, r.Cookie) // mcast.go
	}
	cands := v.Adapters()
	if src != nil {
		cands = []*device.Adapter{src}
	}
	var last error
	for _, from := range cands {
		ev, err := e.resolveHost(from, r)
		if err == nil {
			ev.Cookie = r.Cookie
			return ev
		}
		last = err
	}
	e.log.Info("rdma_cm address resolution refused", "vm", v.Name(), "remote", r.Remote, "err", last)
	return abi.CMEvent{Event: abi.CMEventAddrError, Status: statusUnreachable, Cookie: r.Cookie, Message: last.Error()}
}

// resolveHost resolves r.Remote from adapter from: when it is a host's
// address, the adapter of the VM that holds r.Port there, or the host
// alone while none does; else as resolveFrom.
func (e *Events) resolveHost(from *device.Adapter, r *abi.CMResolve) (abi.CMEvent, error) {
	t, isHost, err := e.toHost(e.c.ctx, from, r.Remote, r.Port, r.UD)
	switch {
	case !isHost:
		return e.resolveFrom(from, r.Remote)
	case err != nil:
		return abi.CMEvent{}, err
	}
	ev := abi.CMEvent{Event: abi.CMEventAddrResolved, Adapter: from.Name()}
	if t.remote != "" {
		if ev, err = e.resolveFrom(from, t.remote); err != nil {
			return ev, err
		}
	}
	ev.LocalIP, ev.PeerIP = ipString(t.localIP), ipString(t.peerIP)
	return ev, nil
}

// resolveFrom resolves remote for a connect from adapter from, as a
// connect would (Hosts.Route), into an ADDR_RESOLVED event. An adapter
// resolving itself (loopback) needs no path decision.
func (e *Events) resolveFrom(from *device.Adapter, remote string) (abi.CMEvent, error) {
	ev := abi.CMEvent{Event: abi.CMEventAddrResolved, Adapter: from.Name()}
	if ad, err := e.c.m.Resolve(remote); err == nil && ad == from {
		ev.RemoteVM, ev.RemoteAdapter, ev.RemoteGID = ad.Context().Name(), ad.Name(), ad.GID()
		return ev, nil
	}
	ad, p, err := e.hosts.Route(from, remote)
	switch {
	case err != nil:
		return ev, err
	case p != nil:
		ev.RemoteVM, ev.RemoteAdapter, ev.RemoteGID = p.VM, p.Adapter, p.GID
	default:
		ev.RemoteVM, ev.RemoteAdapter, ev.RemoteGID = ad.Context().Name(), ad.Name(), ad.GID()
	}
	return ev, nil
}

// connect dials for a cm-connect and returns its outcome's event.
func (e *Events) connect(c *Channel, q *device.QP, r *abi.CMConnect) abi.CMEvent {
	cr := &abi.Connect{QP: q.Handle(), Remote: r.Remote, Port: r.Port, TimeoutMS: r.TimeoutMS, AckTimeout: r.AckTimeout}
	dial := Dial{PrivateData: r.PrivateData, External: r.QPN != 0 && !r.UD, UD: r.UD}
	remote := r.Remote
	t, isHost, err := e.toHost(e.c.ctx, q.Adapter(), r.Remote, r.Port, r.UD)
	if isHost && err == nil {
		remote, dial.ToIP, dial.FromIP = t.remote, t.peerIP, t.localIP
		if remote == "" {
			err = refusedHostPort(r.Remote, r.Port, r.UD)
		}
	}
	var ad *device.Adapter
	var peer *Peer
	if err == nil {
		ad, peer, err = e.hosts.Route(q.Adapter(), remote)
	}
	var rep abi.ConnectReply
	if err == nil {
		if peer != nil {
			rep, err = e.hosts.DialRemote(e.c.ctx, q, cr, peer, dial)
		} else {
			rep, err = e.c.ConnectWith(q, ad, cr, dial)
		}
	}
	e.c.m.CountDial(err)
	if err != nil {
		ev := failure(err)
		ev.Cookie = r.Cookie
		e.log.Info("rdma_cm connect failed", "vm", q.Context().Name(), "remote", r.Remote, "port", r.Port, "event", ev.Event, "status", ev.Status, "err", err)
		return ev
	}
	if dial.UD {
		// The SIDR REP: the listener's UD QP; nothing to disconnect.
		return abi.CMEvent{Event: abi.CMEventEstablished, Cookie: r.Cookie, QP: q.Handle(), RemoteQPN: rep.RemoteQPN, RemoteGID: rep.RemoteGID,
			Adapter: q.Adapter().Name(), Port: r.Port, PrivateData: rep.PrivateData, QKey: rep.QKey}
	}
	cc := &conn{owner: e, ch: c, q: q, handle: q.Handle(), peerQPN: rep.RemoteQPN, peerGID: rep.RemoteGID, external: dial.External, dialer: true}
	if peer != nil {
		cc.peerHost, cc.peerRemote = peer.Host, true
	}
	e.conns.add(cc)
	path := rep.Path
	ev := abi.CMEvent{Event: abi.CMEventEstablished, Cookie: r.Cookie, QP: q.Handle(), RemoteQPN: rep.RemoteQPN, RemoteGID: rep.RemoteGID,
		Adapter: q.Adapter().Name(), Port: r.Port, PrivateData: rep.PrivateData, Path: &path}
	if dial.External {
		ev.Event, ev.Path = abi.CMEventConnectResponse, nil
		ev.SQPSN, ev.RQPSN, ev.MTU = rep.SQPSN, rep.RQPSN, rep.MTU
	}
	return ev
}

// failure is the event a failed connect gives, as rdma_cm's: REJECTED
// with the IBTA reason and the REJ's private data; UNREACHABLE with
// -ETIMEDOUT for a timeout, -EHOSTUNREACH for no way to the peer.
func failure(err error) abi.CMEvent {
	var ae *abi.Error
	if !errors.As(err, &ae) {
		return abi.CMEvent{Event: abi.CMEventUnreachable, Status: statusUnreachable, Message: err.Error()}
	}
	ev := abi.CMEvent{Message: ae.Message}
	switch {
	case ae.Code == abi.CodeRefused && ae.Reject != nil:
		ev.Event, ev.Status, ev.PrivateData = abi.CMEventRejected, int(ae.Reject.Reason), ae.Reject.PrivateData
	case ae.Code == abi.CodeRefused, ae.Code == abi.CodeNotFound && ae.Field == "remote":
		ev.Event, ev.Status = abi.CMEventUnreachable, statusUnreachable
	case ae.Code == abi.CodeUnavailable:
		ev.Event, ev.Status = abi.CMEventUnreachable, statusTimedOut
	default:
		ev.Event, ev.Status = abi.CMEventUnreachable, statusInvalid
	}
	return ev
}
