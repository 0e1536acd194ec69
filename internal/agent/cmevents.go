package agent

// rdma_cm's event channels (ops 40..47, docs/wire-local.md §4.12): the
// shape librdmacm has. A session opens channels; each is a socketpair
// whose far end the workload polls and reads, one abi.CMEvent per
// message. Listens, resolutions, connects and disconnects answer at once;
// their outcome arrives on the channel: CONNECT_REQUEST for every dialer
// (accepted or rejected with accept-request and reject-request, which
// then send ESTABLISHED to the acceptor's channel), ESTABLISHED,
// REJECTED or UNREACHABLE to a dialer, DISCONNECTED then TIMEWAIT_EXIT
// to both sides of a connection either side disconnects (or whose
// workload goes away). The connection manager underneath is package cm's,
// the same as for ops 15..20.

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/device"
)

// Bounds on one session's event channels.
const (
	maxCMChannels = 64
	cmQueueLen    = 1024 // events waiting for the writer; beyond, the channel is dead
)

// cmChannel is one event channel: the agent's end of the socketpair, and
// a writer goroutine that drains the queue into it, one JSON message per
// event (abi.CMEvent; abi.AsyncEvent on an async-open socket, events.go).
type cmChannel struct {
	id   uint32
	f    *os.File
	q    chan any
	quit chan struct{}
	once sync.Once
}

func (c *cmChannel) close() { c.once.Do(func() { close(c.quit) }) }

// post queues e; a channel whose reader fell cmQueueLen events behind
// loses them (and says so once in the log).
func (c *cmChannel) post(e any) bool {
	select {
	case <-c.quit:
		return false
	default:
	}
	select {
	case c.q <- e:
		return true
	default:
		return false
	}
}

func (c *cmChannel) run(s *session) {
	defer c.f.Close()
	for {
		select {
		case e := <-c.q:
			b, err := json.Marshal(e)
			if err == nil {
				_, err = c.f.Write(b)
			}
			if err != nil {
				s.log.Info("CM event channel: write failed, closing it", "channel", c.id, "err", err)
				c.close()
				return
			}
		case <-c.quit:
			return
		}
	}
}

// cmListen is a cm-listen: one cm listener per adapter it covers.
type cmListen struct {
	ch     *cmChannel
	cookie uint64
	ids    []uint32 // the cm listeners
}

// cmEvents is a session's channels and listens.
type cmEvents struct {
	mu       sync.Mutex
	chans    map[uint32]*cmChannel // +checklocks:mu
	listens  map[uint32]*cmListen  // +checklocks:mu
	byCM     map[uint32]*cmListen  // cm listener ID → its cm-listen; +checklocks:mu
	nextID   uint32                // +checklocks:mu
	inflight sync.WaitGroup
}

func (s *session) cmev() *cmEvents {
	s.cmOnce.Do(func() {
		s.cmEv = &cmEvents{chans: map[uint32]*cmChannel{}, listens: map[uint32]*cmListen{}, byCM: map[uint32]*cmListen{}}
	})
	return s.cmEv
}

func (e *cmEvents) channel(id uint32) (*cmChannel, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.chans[id]
	if !ok {
		return nil, abi.Errorf(abi.CodeNotFound, "channel", "no CM event channel with handle %d", id)
	}
	return c, nil
}

// The handlers of rdma_cm's ops (ops.go), for attached VM v.

func (s *session) cmOpenChannel(_ *device.VM, _ *abi.Empty) (any, []int, error) {
	return s.cmev().open(s)
}

func (s *session) cmCloseChannel(_ *device.VM, r *abi.Handle) (any, []int, error) {
	e := s.cmev()
	id := r.Handle
	e.mu.Lock()
	c, ok := e.chans[id]
	delete(e.chans, id)
	e.mu.Unlock()
	if !ok {
		return nil, nil, abi.Errorf(abi.CodeNotFound, "channel", "no CM event channel with handle %d", id)
	}
	c.close()
	return abi.Empty{}, nil, nil
}

func (s *session) cmCloseListen(_ *device.VM, r *abi.Handle) (any, []int, error) {
	e := s.cmev()
	id := r.Handle
	e.mu.Lock()
	l, ok := e.listens[id]
	delete(e.listens, id)
	for _, cid := range l.idsOrNil() {
		delete(e.byCM, cid)
	}
	e.mu.Unlock()
	if !ok {
		return nil, nil, abi.Errorf(abi.CodeNotFound, "listener", "no CM listen with handle %d", id)
	}
	for _, cid := range l.ids {
		s.cm.CloseListener(cid)
	}
	return abi.Empty{}, nil, nil
}

func (s *session) cmResolveOp(v *device.VM, r *abi.CMResolve) (any, []int, error) {
	c, err := s.cmev().channel(r.Channel)
	if err != nil {
		return nil, nil, err
	}
	var src *device.Adapter
	if r.Adapter != "" {
		if src, err = v.Adapter(r.Adapter); err != nil {
			return nil, nil, err
		}
	}
	s.cmAsync(func() { c.post(s.cmResolve(v, src, r)) })
	return abi.Empty{}, nil, nil
}

func (s *session) cmRoute(_ *device.VM, r *abi.CMRoute) (any, []int, error) {
	c, err := s.cmev().channel(r.Channel)
	if err != nil {
		return nil, nil, err
	}
	c.post(abi.CMEvent{Event: abi.CMEventRouteResolved, Cookie: r.Cookie})
	return abi.Empty{}, nil, nil
}

func (s *session) cmConnectOp(v *device.VM, r *abi.CMConnect) (any, []int, error) {
	c, err := s.cmev().channel(r.Channel)
	if err != nil {
		return nil, nil, err
	}
	q, err := cm.ConnQP(s.a.dev, v, r.QP, r.QPN)
	if err != nil {
		return nil, nil, err
	}
	if err := cm.CheckDialer(q); err != nil {
		return nil, nil, err
	}
	s.cmAsync(func() { c.post(s.cmConnect(c, q, r)) })
	return abi.Empty{}, nil, nil
}

func (s *session) cmEstablish(v *device.VM, r *abi.CMEstablish) (any, []int, error) {
	q, err := v.QPByHandle(r.QP)
	if err != nil {
		return nil, nil, abi.Errorf(abi.CodeNotFound, "qp", "no QP with handle %d", r.QP)
	}
	return abi.Empty{}, nil, s.a.cmreg.establish(s.a, q)
}

func (s *session) cmDisconnect(v *device.VM, r *abi.CMDisconnect) (any, []int, error) {
	q, err := v.QPByHandle(r.QP)
	if err != nil {
		return nil, nil, abi.Errorf(abi.CodeNotFound, "qp", "no QP with handle %d", r.QP)
	}
	return abi.Empty{}, nil, s.a.cmreg.disconnect(s.a, q)
}

func (l *cmListen) idsOrNil() []uint32 {
	if l == nil {
		return nil
	}
	return l.ids
}

// cmAsync runs fn in a goroutine the session's end waits for.
func (s *session) cmAsync(fn func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		fn()
	}()
}

func (e *cmEvents) open(s *session) (any, []int, error) {
	e.mu.Lock()
	n := len(e.chans)
	e.mu.Unlock()
	if n >= maxCMChannels {
		return nil, nil, abi.Errorf(abi.CodeLimit, "", "this session has %d CM event channels, the limit", n)
	}
	c, peer, err := newEventSocket("cm-channel")
	if err != nil {
		return nil, nil, err
	}
	e.mu.Lock()
	e.nextID++
	c.id = e.nextID
	e.chans[c.id] = c
	e.mu.Unlock()
	go c.run(s)
	return givenAway{abi.Handle{Handle: c.id}, []int{peer}}, nil, nil
}

// newEventSocket makes an event channel's socketpair: the agent's end in
// c (its writer not started), the workload's returned.
func newEventSocket(name string) (*cmChannel, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, -1, abi.Errorf(abi.CodeLimit, "", "socketpair for an event channel: %v", err)
	}
	// Events are small; the default buffer holds hundreds. The workload
	// may not write on its end: the agent never reads it.
	unix.Shutdown(fds[0], unix.SHUT_RD)
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, -1, abi.Errorf(abi.CodeInternal, "", "event channel: %v", err)
	}
	return &cmChannel{f: os.NewFile(uintptr(fds[0]), name), q: make(chan any, cmQueueLen), quit: make(chan struct{})}, fds[1], nil
}

// closeCM ends the session's channels (its end) and disconnects its
// connections' peers.
func (s *session) closeCM() {
	if s.cmEv == nil {
		return
	}
	e := s.cmEv
	e.mu.Lock()
	for id, c := range e.chans {
		c.close()
		delete(e.chans, id)
	}
	e.mu.Unlock()
	s.a.cmreg.sessionEnded(s.a, s)
}

func (s *session) cmListen(v *device.VM, r *abi.CMListen) (any, []int, error) {
	e := s.cmev()
	c, err := e.channel(r.Channel)
	if err != nil {
		return nil, nil, err
	}
	var ads []string
	if r.Adapter != "" {
		ads = []string{r.Adapter}
	} else {
		for _, ad := range v.Adapters() {
			ads = append(ads, ad.Name())
		}
	}
	l := &cmListen{ch: c, cookie: r.Cookie}
	for _, name := range ads {
		id, err := s.cm.Listen(v, &abi.Listen{Adapter: name, Port: r.Port})
		if err != nil {
			for _, cid := range l.ids {
				s.cm.CloseListener(cid)
			}
			return nil, nil, err
		}
		l.ids = append(l.ids, id)
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
		s.cmAsync(func() {
			for {
				req, err := s.cm.GetRequest(cid)
				if err != nil {
					return // closed, or the session ends
				}
				if !c.post(abi.CMEvent{Event: abi.CMEventConnectRequest, Cookie: l.cookie, Listener: cid, ID: req.ID,
					RemoteVM: req.RemoteVM, RemoteAdapter: req.RemoteAdapter, RemoteGID: req.RemoteGID, RemoteQPN: req.RemoteQPN,
					Adapter: req.Adapter, Port: req.Port, PrivateData: req.PrivateData, SQPSN: req.SQPSN, RQPSN: req.RQPSN, MTU: req.MTU}) {
					s.cm.Reject(&abi.RejectRequest{Listener: cid, ID: req.ID, Reason: "the listener's event channel is closed"})
				}
			}
		})
	}
	return abi.Handle{Handle: h}, nil, nil
}

// acceptChannel returns the channel an accept-request names (nil for
// none: the listen's), checked before the request is accepted.
func (s *session) acceptChannel(r *abi.AcceptRequest) (*cmChannel, error) {
	if r.Channel == 0 {
		return nil, nil
	}
	return s.cmev().channel(r.Channel)
}

// cmAccepted is accept-request's sequel for a request of a cm-listen: the
// acceptor's ESTABLISHED, on ch or else the listen's channel, and the
// connection's record for disconnects. With awaitRTU (the dialer moves its
// QP itself) ESTABLISHED waits for the dialer's RTU (cmRegistry.rtu).
func (s *session) cmAccepted(v *device.VM, r *abi.AcceptRequest, ch *cmChannel, rep abi.ConnectReply, awaitRTU bool) {
	if s.cmEv == nil {
		return
	}
	e := s.cmEv
	e.mu.Lock()
	l := e.byCM[r.Listener]
	e.mu.Unlock()
	if l == nil {
		return
	}
	if ch == nil {
		ch = l.ch
	}
	q, err := cm.ConnQP(s.a.dev, v, r.QP, r.QPN)
	if err != nil {
		return
	}
	cc := &cmConn{s: s, ch: ch, q: q, handle: q.Handle(), peerQPN: rep.RemoteQPN, peerGID: rep.RemoteGID, external: r.QPN != 0}
	if p := s.a.dev.QP(rep.RemoteQPN); p == nil || p.GID() != rep.RemoteGID {
		cc.peerRemote = true // on another host: found by its GID when it is told
	}
	path := rep.Path
	ev := abi.CMEvent{Event: abi.CMEventEstablished, Cookie: l.cookie, Listener: r.Listener, ID: r.ID, QP: q.Handle(),
		RemoteQPN: rep.RemoteQPN, RemoteGID: rep.RemoteGID, Adapter: q.Adapter().Name(), Path: &path}
	if awaitRTU {
		s.a.cmreg.addAwaitingRTU(cc, ev)
		return
	}
	s.a.cmreg.add(cc)
	ch.post(ev)
}

// errno values of CM event statuses (negative, as rdma_cm's).
const (
	statusTimedOut    = -int(syscall.ETIMEDOUT)
	statusUnreachable = -int(syscall.EHOSTUNREACH)
	statusInvalid     = -int(syscall.EINVAL)
)

// cmResolve finds r.Remote: an adapter of this host or, through the
// control plane, of another, that src (or, when nil, the first of v's
// adapters that may reach it) can connect to.
func (s *session) cmResolve(v *device.VM, src *device.Adapter, r *abi.CMResolve) abi.CMEvent {
	cands := v.Adapters()
	if src != nil {
		cands = []*device.Adapter{src}
	}
	var last error
	for _, from := range cands {
		ev, err := s.a.resolveFrom(from, r.Remote)
		if err == nil {
			ev.Cookie = r.Cookie
			return ev
		}
		last = err
	}
	s.log.Info("rdma_cm address resolution refused", "vm", v.Name(), "remote", r.Remote, "err", last)
	return abi.CMEvent{Event: abi.CMEventAddrError, Status: statusUnreachable, Cookie: r.Cookie, Message: last.Error()}
}

// resolveFrom resolves remote for a connect from adapter from, as
// resolveConnect does, into an ADDR_RESOLVED event.
func (a *Agent) resolveFrom(from *device.Adapter, remote string) (abi.CMEvent, error) {
	ev := abi.CMEvent{Event: abi.CMEventAddrResolved, Adapter: from.Name()}
	ad, err := a.cm.Resolve(remote)
	if err == nil {
		if ad.VM() == from.VM() && ad == from {
			ev.RemoteVM, ev.RemoteAdapter, ev.RemoteGID = ad.VM().Name(), ad.Name(), ad.GID()
			return ev, nil // loopback
		}
		if c := a.ctl; c != nil {
			if _, _, perr := c.decideLocal(from, ad); perr != nil {
				return ev, perr
			}
		}
		ev.RemoteVM, ev.RemoteAdapter, ev.RemoteGID = ad.VM().Name(), ad.Name(), ad.GID()
		return ev, nil
	}
	var ae *abi.Error
	if a.ctl == nil || !errors.As(err, &ae) || ae.Code != abi.CodeUnavailable {
		return ev, err
	}
	end, _, err := a.ctl.lookupRemote(from, remote, "remote")
	if err != nil {
		return ev, err
	}
	ev.RemoteVM, ev.RemoteAdapter, ev.RemoteGID = end.Endpoint.VM, end.Endpoint.Adapter, abi.GID(end.Endpoint.GID.As16())
	return ev, nil
}

// cmConnect dials for a cm-connect and returns its outcome's event.
func (s *session) cmConnect(c *cmChannel, q *device.QP, r *abi.CMConnect) abi.CMEvent {
	conn := &abi.Connect{QP: q.Handle(), Remote: r.Remote, Port: r.Port, TimeoutMS: r.TimeoutMS, AckTimeout: r.AckTimeout}
	ad, end, err := s.a.resolveConnect(q, r.Remote)
	dial := cm.Dial{PrivateData: r.PrivateData, External: r.QPN != 0}
	var rep abi.ConnectReply
	if err == nil {
		if end != nil {
			rep, err = s.a.up.ConnectWith(s.ctx, q, conn, end, dial)
		} else {
			rep, err = s.cm.ConnectWith(q, ad, conn, dial)
		}
	}
	if err != nil {
		ev := cmFailure(err)
		ev.Cookie = r.Cookie
		s.log.Info("rdma_cm connect failed", "vm", q.VM().Name(), "remote", r.Remote, "port", r.Port, "event", ev.Event, "status", ev.Status, "err", err)
		return ev
	}
	cc := &cmConn{s: s, ch: c, q: q, handle: q.Handle(), peerQPN: rep.RemoteQPN, peerGID: rep.RemoteGID, external: dial.External, dialer: true}
	if end != nil {
		cc.peerHost, cc.peerRemote = end.Host.Host.ID, true
	}
	s.a.cmreg.add(cc)
	path := rep.Path
	ev := abi.CMEvent{Event: abi.CMEventEstablished, Cookie: r.Cookie, QP: q.Handle(), RemoteQPN: rep.RemoteQPN, RemoteGID: rep.RemoteGID,
		Adapter: q.Adapter().Name(), Port: r.Port, PrivateData: rep.PrivateData, Path: &path}
	if dial.External {
		ev.Event, ev.Path = abi.CMEventConnectResponse, nil
		ev.SQPSN, ev.RQPSN, ev.MTU = rep.SQPSN, rep.RQPSN, rep.MTU
	}
	return ev
}

// cmFailure is the event a failed connect gives, as rdma_cm's: REJECTED
// with the IBTA reason and the REJ's private data; UNREACHABLE with
// -ETIMEDOUT for a timeout, -EHOSTUNREACH for no way to the peer.
func cmFailure(err error) abi.CMEvent {
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

// cmConn is one side of a connection made through an event channel.
type cmConn struct {
	s        *session
	ch       *cmChannel
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

// cmRegistry is the agent's connections made through event channels,
// by QPN.
type cmRegistry struct {
	mu    sync.Mutex
	conns map[uint32]*cmConn // +checklocks:mu
	// early are RTUs that came before their acceptor's connection was
	// recorded (the dialer's rdma_establish can overtake the end of the
	// accept-request that answered it), by the acceptor's QPN.
	early map[uint32]earlyRTU // +checklocks:mu
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

func (r *cmRegistry) add(c *cmConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		r.conns = map[uint32]*cmConn{}
	}
	r.conns[c.q.QPN()] = c
}

// addAwaitingRTU records acceptor c, whose dialer moves its QP itself,
// with its ESTABLISHED ev held until the dialer's RTU, or posted now if
// that RTU came first.
func (r *cmRegistry) addAwaitingRTU(c *cmConn, ev abi.CMEvent) {
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
		c.ch.post(ev)
	}
}

// rtu is the RTU of dialer (fromQPN, fromGID) to its acceptor's QP qpn:
// the acceptor gets its ESTABLISHED. An RTU before the acceptor's record
// is kept a while (early); one that names no awaiting connection of that
// dialer is dropped.
func (r *cmRegistry) rtu(qpn, fromQPN uint32, fromGID abi.GID) {
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
	c.ch.post(*ev)
}

// establish is cm-establish of q (rdma_establish): q's workload, which
// moves it itself, has it in RTS; its acceptor gets ESTABLISHED, on this
// host or through a CM_RTU.
func (r *cmRegistry) establish(a *Agent, q *device.QP) error {
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
		r.rtu(c.peerQPN, q.QPN(), q.GID())
		return nil
	}
	if a.up == nil {
		return abi.Errorf(abi.CodeUnavailable, "", "QP 0x%x's peer is on another host and this agent runs no tcp path", q.QPN())
	}
	if err := a.up.Establish(c.peerHost, c.peerQPN, q.QPN(), netip.AddrFrom16(q.GID())); err != nil {
		return abi.Errorf(abi.CodeUnavailable, "", "rdma_establish: tell host %s: %v", c.peerHost, err)
	}
	return nil
}

// cmTimewait is how long after DISCONNECTED a connection's TIMEWAIT_EXIT
// comes: rdma_cm's RoCE packet lifetime (4.096 µs × 2^16), the time the
// IBTA keeps a closed QP from reuse while its packets drain.
const cmTimewait = 268 * time.Millisecond

// notify gives c DISCONNECTED now and TIMEWAIT_EXIT after the timewait,
// unless its QP is destroyed by then: programs destroy the QP and then the
// ID on DISCONNECTED, as rping does, and the kernel drops the events of an
// ID that is gone; the agent knows QPs, not IDs.
func (c *cmConn) notify() {
	c.ch.post(abi.CMEvent{Event: abi.CMEventDisconnected, QP: c.handle, RemoteQPN: c.peerQPN, RemoteGID: c.peerGID})
	time.AfterFunc(cmTimewait, func() {
		if !c.q.Destroyed() {
			c.ch.post(abi.CMEvent{Event: abi.CMEventTimewaitExit, QP: c.handle})
		}
	})
}

// disconnect is cm-disconnect of q: its QP moves to ERR; it gets
// DISCONNECTED unless it had it, and so does its peer.
func (r *cmRegistry) disconnect(a *Agent, q *device.QP) error {
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
		a.remoteDisconnect(c)
	}
	return nil
}

// peerLocked returns c's peer on this host, if it is connected to c.
// +checklocks:r.mu
func (r *cmRegistry) peerLocked(c *cmConn) *cmConn {
	p := r.conns[c.peerQPN]
	if p == nil || p.peerQPN != c.q.QPN() || p.peerGID != c.q.GID() || p.q.GID() != c.peerGID {
		return nil
	}
	return p
}

// peerGone gives DISCONNECTED to the connection of QP qpn whose peer
// (peerQPN, peerGID) went: disconnected, or its workload ended.
func (r *cmRegistry) peerGone(qpn, peerQPN uint32, peerGID abi.GID) bool {
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

// sessionEnded forgets s's connections, and gives their peers
// DISCONNECTED.
func (r *cmRegistry) sessionEnded(a *Agent, s *session) {
	r.mu.Lock()
	var peers []*cmConn
	var remote []*cmConn
	for qpn, c := range r.conns {
		if c.s != s {
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
		a.remoteDisconnect(c)
	}
}

// remoteDisconnect tells the peer's host that c disconnected (a CM_DISC
// over the tcp path), in the background: the peer's host may be slow or
// gone.
func (a *Agent) remoteDisconnect(c *cmConn) {
	if a.up == nil || a.ctl == nil {
		return
	}
	go func() {
		host := c.peerHost
		if host == "" {
			ctx, cancel := context.WithTimeout(context.Background(), a.ctl.cfg.LookupTimeout)
			ep, err := a.ctl.cache.Resolve(ctx, netip.AddrFrom16(c.peerGID).String())
			cancel()
			if err != nil {
				a.log.Info("rdma_cm disconnect: peer's host not found; it learns of it when its QP times out", "qpn", c.q.QPN(), "peer_gid", netip.AddrFrom16(c.peerGID), "err", err)
				return
			}
			host = ep.Host
		}
		if err := a.up.Disconnect(host, c.peerQPN, c.q.QPN(), netip.AddrFrom16(c.q.GID())); err != nil {
			a.log.Info("rdma_cm disconnect: peer's host not told; it learns of it when its QP times out", "host", host, "qpn", c.q.QPN(), "err", err)
		}
	}()
}
