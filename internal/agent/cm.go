package agent

// Connection management, in the manner of rdma_cm: a workload listens on
// (adapter, service port); a peer dials "vm/vrdmaN" (or a GID) and port
// with a QP in RESET or INIT; the listener's workload gets the request and
// accepts it with a QP of its own; the agent then brings both QPs to RTS
// facing each other and answers both sides.

import (
	"crypto/rand"
	"encoding/binary"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

type listenKey struct {
	vm      string
	adapter string
	port    uint16
}

type listener struct {
	id    uint32
	key   listenKey
	ad    *Adapter
	owner *session
	reqs  chan *connReq // backlog
	quit  chan struct{}
	once  sync.Once

	mu      sync.Mutex
	pending map[uint32]*connReq // handed to the workload, not yet answered; +checklocks:mu
	nextReq uint32              // +checklocks:mu
}

type connResult struct {
	reply abi.ConnectReply
	err   error
	// A remote dialer's PSNs: its send PSN and its receive PSN.
	sqPSN, rqPSN uint32
}

// remoteDialer is the QP that dials from another host (uplink_cm.go).
type remoteDialer struct {
	vm, adapter string
	gid         abi.GID
	qpn         uint32
	host        string // its host ID
}

type connReq struct {
	id     uint32
	from   *QP             // a dialer on this host, or
	remote *remoteDialer   // one on another host
	reply  chan connResult // buffered 1: whoever answers never blocks
	// state: reqPending, then reqAnswered (an accept or reject took it) or
	// reqAbandoned (the dialer gave up). Whoever moves it first decides.
	state atomic.Uint32
	// canceled, for a remote dialer's request, is closed when its dialer
	// cancels it (CM_CANCEL) while it is pending.
	canceled chan struct{}
}

const (
	reqPending uint32 = iota
	reqAnswered
	reqAbandoned
)

// answer claims the request for an answer; false if the dialer gave up.
func (r *connReq) answer() bool { return r.state.CompareAndSwap(reqPending, reqAnswered) }

func (l *listener) close() {
	l.once.Do(func() { close(l.quit) })
}

const backlog = 64

func (s *session) listen(r *abi.Listen) (*listener, error) {
	v := s.vm
	ad, err := v.Adapter(r.Adapter)
	if err != nil {
		return nil, err
	}
	a := s.a
	key := listenKey{v.name, ad.name, r.Port}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, busy := a.listeners[key]; busy {
		return nil, abi.Errorf(abi.CodeExists, "port", "%s/%s already listens on port %d", v.name, ad.name, r.Port)
	}
	n := 0
	for k := range a.listeners {
		if k.vm == v.name {
			n++
		}
	}
	if n >= a.cfg.Limits.MaxListeners {
		return nil, abi.Errorf(abi.CodeLimit, "", "VM %q listens on %d ports, the limit", v.name, n)
	}
	l := &listener{id: a.nextListener.Add(1), key: key, ad: ad, owner: s, reqs: make(chan *connReq, backlog),
		quit: make(chan struct{}), pending: map[uint32]*connReq{}}
	a.listeners[key] = l
	s.lmu.Lock()
	s.listeners[l.id] = l
	s.lmu.Unlock()
	return l, nil
}

func (a *Agent) closeListener(l *listener) {
	a.mu.Lock()
	if a.listeners[l.key] == l {
		delete(a.listeners, l.key)
	}
	a.mu.Unlock()
	l.close()
	refuse := func(r *connReq) {
		if !r.answer() {
			return
		}
		r.reply <- connResult{err: abi.Errorf(abi.CodeRefused, "port", "%s/%s stopped listening on port %d", l.key.vm, l.key.adapter, l.key.port)}
	}
	l.mu.Lock()
	for id, r := range l.pending {
		refuse(r)
		delete(l.pending, id)
	}
	l.mu.Unlock()
	for {
		select {
		case r := <-l.reqs:
			refuse(r)
		default:
			return
		}
	}
}

func (s *session) listenerByID(id uint32) (*listener, error) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	l, ok := s.listeners[id]
	if !ok {
		return nil, abi.Errorf(abi.CodeNotFound, "listener", "no listener with handle %d", id)
	}
	return l, nil
}

func (s *session) closeListener(id uint32) error {
	l, err := s.listenerByID(id)
	if err != nil {
		return err
	}
	s.lmu.Lock()
	delete(s.listeners, id)
	s.lmu.Unlock()
	s.a.closeListener(l)
	return nil
}

func (s *session) getRequest(id uint32) (abi.ConnRequest, error) {
	l, err := s.listenerByID(id)
	if err != nil {
		return abi.ConnRequest{}, err
	}
	for {
		select {
		case r := <-l.reqs:
			if r.state.Load() != reqPending {
				continue // the dialer gave up while it waited in the backlog
			}
			l.mu.Lock()
			l.nextReq++
			r.id = l.nextReq
			l.pending[r.id] = r
			l.mu.Unlock()
			if d := r.remote; d != nil {
				return abi.ConnRequest{ID: r.id, RemoteVM: d.vm, RemoteAdapter: d.adapter, RemoteGID: d.gid,
					RemoteQPN: d.qpn, Port: l.key.port}, nil
			}
			from := r.from
			return abi.ConnRequest{ID: r.id, RemoteVM: from.vm.name, RemoteAdapter: from.ad.name, RemoteGID: from.ad.gid,
				RemoteQPN: from.qpn, Port: l.key.port}, nil
		case <-l.quit:
			return abi.ConnRequest{}, abi.Errorf(abi.CodeState, "listener", "the listener was closed")
		case <-s.ctx.Done():
			return abi.ConnRequest{}, errAgentClosing
		}
	}
}

func (s *session) takeRequest(lid, id uint32) (*listener, *connReq, error) {
	l, err := s.listenerByID(lid)
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.pending[id]
	if !ok {
		return nil, nil, abi.Errorf(abi.CodeNotFound, "id", "no pending connection request %d on this listener (already answered, or the dialer gave up)", id)
	}
	delete(l.pending, id)
	if !r.answer() {
		return nil, nil, abi.Errorf(abi.CodeState, "id", "connection request %d was withdrawn: the dialer gave up", id)
	}
	return l, r, nil
}

func (s *session) rejectRequest(r *abi.RejectRequest) error {
	l, req, err := s.takeRequest(r.Listener, r.ID)
	if err != nil {
		return err
	}
	why := r.Reason
	if why == "" {
		why = "rejected by the listener"
	}
	req.reply <- connResult{err: abi.Errorf(abi.CodeRefused, "", "%s/%s port %d rejected the connection: %s", l.key.vm, l.key.adapter, l.key.port, why)}
	return nil
}

func (s *session) acceptRequest(r *abi.AcceptRequest) (abi.ConnectReply, error) {
	q, err := s.vm.QPByHandle(r.QP)
	if err != nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeNotFound, "qp", "no QP with handle %d", r.QP)
	}
	if st := q.State(); st != abi.QPSReset && st != abi.QPSInit {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeState, "qp", "QP 0x%x is in %s: accept with a QP in RESET or INIT", q.qpn, st)
	}
	_, req, err := s.takeRequest(r.Listener, r.ID)
	if err != nil {
		return abi.ConnectReply{}, err
	}
	if d := req.remote; d != nil {
		return acceptRemote(q, req, d)
	}
	from := req.from
	if err := connectPair(from, q); err != nil {
		req.reply <- connResult{err: err}
		return abi.ConnectReply{}, err
	}
	req.reply <- connResult{reply: abi.ConnectReply{RemoteQPN: q.qpn, RemoteGID: q.ad.gid, Path: from.Query().Path}}
	return abi.ConnectReply{RemoteQPN: from.qpn, RemoteGID: from.ad.gid, Path: q.Query().Path}, nil
}

// connectPair brings a and b to RTS facing each other, with the defaults
// rdma_cm uses.
func connectPair(a, b *QP) error {
	var psn [8]byte
	rand.Read(psn[:])
	psnA := binary.LittleEndian.Uint32(psn[:]) & 0xffffff
	psnB := binary.LittleEndian.Uint32(psn[4:]) & 0xffffff
	for _, step := range []func() error{
		func() error { return toInit(a) },
		func() error { return toInit(b) },
		func() error { return toRTR(a, b.ad.gid, b.qpn, psnB) },
		func() error { return toRTR(b, a.ad.gid, a.qpn, psnA) },
		func() error { return toRTS(a, psnA) },
		func() error { return toRTS(b, psnB) },
	} {
		if err := step(); err != nil {
			a.MoveToErr("connection setup failed")
			b.MoveToErr("connection setup failed")
			return err
		}
	}
	return nil
}

func toInit(q *QP) error {
	if q.State() != abi.QPSReset {
		return q.Modify(&abi.ModifyQP{Mask: abi.MaskAccessFlags, Attr: abi.QPAttr{AccessFlags: abi.AccessAll}})
	}
	return q.Modify(&abi.ModifyQP{Mask: abi.MaskState | abi.MaskPort | abi.MaskAccessFlags,
		Attr: abi.QPAttr{State: abi.QPSInit, Port: 1, AccessFlags: abi.AccessAll}})
}

func toRTR(q *QP, gid abi.GID, qpn, rqPSN uint32) error {
	return q.Modify(&abi.ModifyQP{
		Mask: abi.MaskState | abi.MaskAV | abi.MaskPathMTU | abi.MaskDestQPN | abi.MaskRQPSN | abi.MaskMaxDestRdAtomic | abi.MaskMinRNRTimer,
		Attr: abi.QPAttr{State: abi.QPSRTR, DGID: gid, PathMTU: abi.DefaultPathMTU, DestQPN: qpn, RQPSN: rqPSN,
			MaxDestRdAtomic: abi.MaxRdAtom, MinRNRTimer: abi.DefaultMinRNRTimer}})
}

func toRTS(q *QP, sqPSN uint32) error {
	return q.Modify(&abi.ModifyQP{
		Mask: abi.MaskState | abi.MaskSQPSN | abi.MaskTimeout | abi.MaskRetryCnt | abi.MaskRNRRetry | abi.MaskMaxRdAtomic,
		Attr: abi.QPAttr{State: abi.QPSRTS, SQPSN: sqPSN, Timeout: abi.DefaultTimeout, RetryCnt: abi.DefaultRetryCnt,
			RNRRetry: abi.DefaultRNRRetry, MaxRdAtomic: abi.MaxRdAtom}})
}

// resolveRemote finds the adapter "vm/vrdmaN" or GID names on this host.
func (a *Agent) resolveRemote(remote string) (*Adapter, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if vmName, adName, ok := strings.Cut(remote, "/"); ok {
		v, attached := a.vms[vmName]
		if !attached || !v.ready.Load() {
			return nil, abi.Errorf(abi.CodeUnavailable, "remote",
				"VM %q is not attached on host %s: start its workload (a VM on another host needs the control plane: this agent runs standalone, --no-control-plane)", vmName, a.cfg.Host)
		}
		for _, ad := range v.adapters {
			if ad.name == adName {
				return ad, nil
			}
		}
		return nil, abi.Errorf(abi.CodeNotFound, "remote", "VM %q has no adapter %q", vmName, adName)
	}
	gid, err := abi.ParseGID(remote)
	if err != nil {
		return nil, abi.Errorf(abi.CodeInvalid, "remote", "remote %q is neither \"vm/vrdmaN\" nor a GID", remote)
	}
	if ad := a.findAdapterByGIDLocked(gid); ad != nil {
		return ad, nil
	}
	return nil, abi.Errorf(abi.CodeUnavailable, "remote", "GID %s is not an adapter on host %s (other hosts need the control plane: this agent runs standalone, --no-control-plane)", gid, a.cfg.Host)
}

func (s *session) connect(c *abi.Connect) (abi.ConnectReply, error) {
	q, err := s.vm.QPByHandle(c.QP)
	if err != nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeNotFound, "qp", "no QP with handle %d", c.QP)
	}
	if st := q.State(); st != abi.QPSReset && st != abi.QPSInit {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeState, "qp", "QP 0x%x is in %s: connect with a QP in RESET or INIT", q.qpn, st)
	}
	ad, end, err := s.a.resolveConnect(q, c.Remote) // control.go
	if err != nil {
		return abi.ConnectReply{}, err
	}
	if end != nil {
		return s.remoteConnect(q, c, end) // uplink_cm.go
	}
	s.a.mu.Lock()
	l := s.a.listeners[listenKey{ad.vm.name, ad.name, c.Port}]
	s.a.mu.Unlock()
	if l == nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeRefused, "port", "connection refused: nothing listens on %s/%s port %d", ad.vm.name, ad.name, c.Port)
	}
	timeout := time.Duration(c.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	req := &connReq{from: q, reply: make(chan connResult, 1)}
	select {
	case l.reqs <- req:
	case <-l.quit:
		return abi.ConnectReply{}, abi.Errorf(abi.CodeRefused, "port", "connection refused: %s/%s stopped listening on port %d", ad.vm.name, ad.name, c.Port)
	case <-t.C:
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "port", "connect timed out after %v: the listener's backlog is full", timeout)
	case <-s.ctx.Done():
		return abi.ConnectReply{}, errAgentClosing
	}
	select {
	case res := <-req.reply:
		return res.reply, res.err
	case <-t.C:
	case <-s.ctx.Done():
	}
	// Withdraw the request, unless an answer is already under way.
	if !req.state.CompareAndSwap(reqPending, reqAbandoned) {
		res := <-req.reply
		return res.reply, res.err
	}
	l.mu.Lock()
	delete(l.pending, req.id)
	l.mu.Unlock()
	return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s port %d timed out after %v: the listener did not accept", c.Remote, c.Port, timeout)
}
