// SPDX-License-Identifier: Apache-2.0

// Package cm is connection management, in the manner of rdma_cm: a
// workload listens on (adapter, service port); a peer dials "vm/vrdmaN"
// (or a GID) and port with a QP in RESET or INIT; the listener's workload
// gets the request and accepts it with a QP of its own; the agent then
// brings both QPs to RTS facing each other and answers both sides. A
// dialer on another host reaches the listener through its transport
// (package tcp carries CM_REQ), which hands the request in with
// ServeRemote; Establish brings the dialing QP to RTS once the answer is
// back. A side whose workload moves its QP itself (rdma_cm's external QP,
// Dial.External, AcceptRequest.QPN) is left alone: it gets the PSNs and
// path MTU, drawn when the request is made, and moves its QP with them.
// rdma_cm's event channels (Events, events.go) are the same connection
// management with its outcomes as events on a socket (Channel); Conns
// follows their connections for DISCONNECTED, and Hosts is what they need
// of other hosts, which the agent provides.
package cm

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// ErrClosing answers a blocking request whose session ends: the agent is
// shutting down (or the workload went away).
var ErrClosing = abi.Errorf(abi.CodeUnavailable, "", "the agent is shutting down")

// Manager is the listener table of one device. It is safe for concurrent
// use.
type Manager struct {
	dev          *device.Device
	host         string
	maxListeners int

	mu        sync.Mutex
	listeners map[listenKey]*listener // +checklocks:mu
	// hostPorts are the ports of this host's addresses VMs hold
	// (hostaddr.go).
	hostPorts map[hostPort]hostClaim // +checklocks:mu
	nextID    atomic.Uint32
	counts    counts // counts.go
}

// New returns the connection manager of dev on host (its name, for
// messages), allowing maxListeners listening ports per VM.
func New(dev *device.Device, host string, maxListeners int) *Manager {
	return &Manager{dev: dev, host: host, maxListeners: maxListeners, listeners: map[listenKey]*listener{}, hostPorts: map[hostPort]hostClaim{}}
}

type listenKey struct {
	vm      string
	adapter string
	port    uint16
	// ud: rdma_cm's UDP port space (RDMA_PS_UDP), whose requests are
	// service ID resolutions; a port of its own beside the TCP space's.
	ud bool
}

// space names the key's port space, for messages.
func (k listenKey) space() string {
	if k.ud {
		return "UDP (RDMA_PS_UDP)"
	}
	return "TCP"
}

type listener struct {
	id   uint32
	key  listenKey
	ad   *device.Adapter
	reqs chan *connReq // backlog
	quit chan struct{}
	once sync.Once

	mu sync.Mutex
	// handed to the workload, not yet answered
	pending map[uint32]*connReq // +checklocks:mu
	nextReq uint32              // +checklocks:mu
}

type connResult struct {
	reply abi.ConnectReply
	err   error
	// A remote dialer's PSNs: its send PSN and its receive PSN.
	sqPSN, rqPSN uint32
	mtu          uint32 // the path MTU the acceptor's QP took
}

// RemoteDialer is a QP that dials from another host.
type RemoteDialer struct {
	VM, Adapter string
	GID         abi.GID
	QPN         uint32
	Host        string // its host ID
	MTU         uint32 // its adapter's active MTU; 0 when the dialer did not say
	// PrivateData is the REQ's private data (checked: at most
	// abi.MaxPrivateDataREQ bytes).
	PrivateData []byte
	// External: the dialer's workload moves its QP itself; the
	// acceptor's ESTABLISHED waits for its RTU.
	External bool
	// UD: a service ID resolution from UD QP QPN (Dial.UD).
	UD bool
	// ToIP and FromIP, for a dial by a host's address: Dial's.
	ToIP, FromIP netip.Addr
	// PSN, with HasPSN, is the dialer's send PSN, when it chose it (a
	// native peer's REQ names its starting PSN); else one is drawn.
	PSN    uint32
	HasPSN bool
	// PathMTU: MTU is the connection's path MTU, as a native peer's REQ
	// fixes it, which the acceptor takes as it is (as a kernel RoCE
	// device does), not the smaller of it and its own.
	PathMTU bool
}

// Dial is what a dialer's REQ carries besides its QP.
type Dial struct {
	PrivateData []byte // at most abi.MaxPrivateDataREQ bytes
	// External: the dialer's workload moves its QP itself (rdma_cm's
	// external QP, CMConnect.QPN): the agent leaves it alone, and the
	// reply carries the PSNs and path MTU to move it with.
	External bool
	// UD: a service ID resolution (rdma_cm's RDMA_PS_UDP, a SIDR REQ) by
	// a UD QP, to a listener of the UDP port space: the answer is the
	// listener's UD QP number, GID and Q_Key, and neither QP is touched.
	UD bool // ToIP and FromIP, for a dial by a host's address (hostaddr.go): the
	// address dialed and the dialer's host's address, which the
	// acceptor's request reports as its local and peer addresses.
	ToIP, FromIP netip.Addr
}

type connReq struct {
	id     uint32
	from   *device.QP    // a dialer on this host, or
	remote *RemoteDialer // one on another host
	priv   []byte        // a local dialer's REQ private data
	// fromAckTimeout is a local dialer's ACK timeout for RTS.
	fromAckTimeout uint8
	// fromExternal: a local dialer's workload moves its QP itself.
	fromExternal bool
	// toIP and fromIP: a local dialer's Dial.ToIP and Dial.FromIP.
	toIP, fromIP netip.Addr
	// The connection's PSNs, drawn when the request is made: the
	// dialer's send PSN (the REQ's starting PSN) and the acceptor's, so
	// that an acceptor that moves its QP itself knows both before it
	// accepts.
	dialerPSN, acceptorPSN uint32
	reply                  chan connResult // buffered 1: whoever answers never blocks
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

// Client is one session's share of connection management: the listeners
// it opened, closed with it. ctx ends with the session.
type Client struct {
	m   *Manager
	ctx context.Context

	mu        sync.Mutex
	listeners map[uint32]*listener // +checklocks:mu
}

// NewClient returns the connection management of a session whose
// blocking calls give up when ctx ends.
func (m *Manager) NewClient(ctx context.Context) *Client {
	return &Client{m: m, ctx: ctx, listeners: map[uint32]*listener{}}
}

// Listen makes adapter r.Adapter of v listen on port r.Port, and returns
// the listener's handle.
func (c *Client) Listen(v *device.Context, r *abi.Listen) (uint32, error) {
	return c.listen(v, r.Adapter, r.Port, false)
}

// ListenUD is Listen in rdma_cm's UDP port space: its requests are
// service ID resolutions by UD QPs (Dial.UD).
func (c *Client) ListenUD(v *device.Context, adapter string, port uint16) (uint32, error) {
	return c.listen(v, adapter, port, true)
}

func (c *Client) listen(v *device.Context, adapter string, port uint16, ud bool) (uint32, error) {
	ad, err := v.Adapter(adapter)
	if err != nil {
		return 0, err
	}
	m := c.m
	key := listenKey{v.Name(), ad.Name(), port, ud}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, busy := m.listeners[key]; busy {
		return 0, abi.Errorf(abi.CodeExists, "port", "%s/%s already listens on %s port %d", v.Name(), ad.Name(), key.space(), port)
	}
	n := 0
	for k := range m.listeners {
		if k.vm == v.Name() {
			n++
		}
	}
	if n >= m.maxListeners {
		return 0, abi.Errorf(abi.CodeLimit, "", "VM %q listens on %d ports, the limit", v.Name(), n)
	}
	l := &listener{id: m.nextID.Add(1), key: key, ad: ad, reqs: make(chan *connReq, backlog),
		quit: make(chan struct{}), pending: map[uint32]*connReq{}}
	m.listeners[key] = l
	c.mu.Lock()
	c.listeners[l.id] = l
	c.mu.Unlock()
	return l.id, nil
}

// Close closes every listener of the client (its session ended).
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, l := range c.listeners {
		c.m.closeListener(l)
		delete(c.listeners, id)
	}
}

// CloseVM closes every listener on v's adapters (v is being torn down).
func (m *Manager) CloseVM(v *device.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, l := range m.listeners {
		if l.ad.Context() == v {
			l.close()
			delete(m.listeners, k)
		}
	}
}

func (m *Manager) closeListener(l *listener) {

	m.mu.Lock()
	if m.listeners[l.key] == l {
		delete(m.listeners, l.key)
	}
	m.mu.Unlock()
	l.close()
	l.mu.Lock()
	for id, r := range l.pending {
		m.refuse(l, r)
		delete(l.pending, id)
	}
	l.mu.Unlock()
	for {
		select {
		case r := <-l.reqs:
			m.refuse(l, r)
		default:
			return
		}
	}
}

// refuse answers r, a request to l that closed, with a reject, unless
// its dialer gave up.
func (m *Manager) refuse(l *listener, r *connReq) {
	if !r.answer() {
		return
	}
	m.countReq(reqRejected)
	r.reply <- connResult{err: Refused(abi.RejectInvalidServiceID, nil, "%s/%s stopped listening on port %d", l.key.vm, l.key.adapter, l.key.port)}
}

func (c *Client) listenerByID(id uint32) (*listener, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.listeners[id]
	if !ok {
		return nil, abi.Errorf(abi.CodeNotFound, "listener", "no listener with handle %d", id)
	}
	return l, nil
}

// CloseListener closes the client's listener id.
func (c *Client) CloseListener(id uint32) error {
	l, err := c.listenerByID(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.listeners, id)
	c.mu.Unlock()
	c.m.closeListener(l)
	return nil
}

// GetRequest waits for the next connection request on listener id.
func (c *Client) GetRequest(id uint32) (abi.ConnRequest, error) {
	l, err := c.listenerByID(id)
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
				return abi.ConnRequest{ID: r.id, RemoteVM: d.VM, RemoteAdapter: d.Adapter, RemoteGID: d.GID,
					RemoteQPN: d.QPN, Port: l.key.port, PrivateData: d.PrivateData, Adapter: l.key.adapter,
					SQPSN: r.acceptorPSN, RQPSN: r.dialerPSN, MTU: d.pathMTU(l.ad),
					LocalIP: ipString(d.ToIP), PeerIP: ipString(d.FromIP)}, nil
			}
			from := r.from
			return abi.ConnRequest{ID: r.id, RemoteVM: from.Context().Name(), RemoteAdapter: from.Adapter().Name(), RemoteGID: from.GID(),
				RemoteQPN: from.QPN(), Port: l.key.port, PrivateData: r.priv, Adapter: l.key.adapter,
				SQPSN: r.acceptorPSN, RQPSN: r.dialerPSN, MTU: PathMTU(l.ad, from.Adapter().ActiveMTU()),
				LocalIP: ipString(r.toIP), PeerIP: ipString(r.fromIP)}, nil
		case <-l.quit:
			return abi.ConnRequest{}, abi.Errorf(abi.CodeState, "listener", "the listener was closed")
		case <-c.ctx.Done():
			return abi.ConnRequest{}, ErrClosing
		}
	}
}

func (c *Client) takeRequest(lid, id uint32) (*listener, *connReq, error) {
	l, err := c.listenerByID(lid)
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

// Reject refuses a pending connection request with r's reason.
func (c *Client) Reject(r *abi.RejectRequest) error {
	l, req, err := c.takeRequest(r.Listener, r.ID)
	if err != nil {
		return err
	}
	why := r.Reason
	if why == "" {
		why = "rejected by the listener"
	}
	c.m.countReq(reqRejected)
	req.reply <- connResult{err: Refused(abi.RejectConsumer, r.PrivateData, "%s/%s port %d rejected the connection: %s", l.key.vm, l.key.adapter, l.key.port, why)}
	return nil
}

// Refused is a refused connect's error: code refused, with the IBTA
// reject reason and the REJ's private data.
func Refused(reason uint16, priv []byte, format string, args ...any) *abi.Error {
	e := abi.Errorf(abi.CodeRefused, "", format, args...)
	e.Reject = &abi.RejectInfo{Reason: reason, PrivateData: priv}
	if reason == abi.RejectInvalidServiceID {
		e.Field = "port"
	}
	return e
}

// Accept answers a pending connection request with QP r.QP of v, which it
// brings to RTS facing the dialer, or with QP number r.QPN of v, which its
// workload moves itself (the request's PSNs and MTU, abi.ConnRequest).
//
// It reports whether the dialer moves its QP itself: the acceptor's
// ESTABLISHED then waits for the dialer's RTU (rdma_establish).
func (c *Client) Accept(v *device.Context, r *abi.AcceptRequest) (rep abi.ConnectReply, awaitRTU bool, err error) {
	if l, err := c.listenerByID(r.Listener); err == nil && l.key.ud {
		rep, err := c.acceptUD(v, r)
		return rep, false, err
	}
	q, err := c.acceptingQP(v, r)
	if err != nil {
		return abi.ConnectReply{}, false, err
	}
	_, req, err := c.takeRequest(r.Listener, r.ID)
	if err != nil {
		return abi.ConnectReply{}, false, err
	}
	defer func() { c.m.countReq(acceptResult(err)) }()
	ours := end{q: q, external: r.QPN != 0, psn: req.acceptorPSN, ackTimeout: abi.AckTimeoutOr(r.AckTimeout)}
	if d := req.remote; d != nil {
		rep, err := acceptRemote(ours, req, d, r.PrivateData)
		return rep, d.External, err
	}
	from := req.from
	theirs := end{q: from, external: req.fromExternal, psn: req.dialerPSN, ackTimeout: req.fromAckTimeout}
	mtu := PathMTU(from.Adapter(), q.Adapter().ActiveMTU())
	if err := connectPair(theirs, ours, mtu); err != nil {
		req.reply <- connResult{err: err}
		return abi.ConnectReply{}, false, err
	}
	toDialer := abi.ConnectReply{RemoteQPN: q.QPN(), RemoteGID: q.GID(), Path: from.Query().Path, PrivateData: r.PrivateData}
	if theirs.external {
		toDialer.SQPSN, toDialer.RQPSN, toDialer.MTU = theirs.psn, ours.psn, mtu
	}
	req.reply <- connResult{reply: toDialer}
	return abi.ConnectReply{RemoteQPN: from.QPN(), RemoteGID: from.GID(), Path: q.Query().Path}, theirs.external, nil
}

// acceptUD answers a pending service ID resolution (a request to a
// listener of the UDP port space) with UD QP r.QP (or r.QPN) of v: the
// dialer learns its number, GID and Q_Key (a SIDR REP); neither QP is
// touched and nothing is connected.
func (c *Client) acceptUD(v *device.Context, r *abi.AcceptRequest) (abi.ConnectReply, error) {
	q, err := ConnQP(c.m.dev, v, r.QP, r.QPN)
	if err != nil {
		return abi.ConnectReply{}, err
	}
	if !q.IsUD() {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeInvalid, "qp", "QP 0x%x is %s: a request of the UDP port space (RDMA_PS_UDP) is answered with a UD QP", q.QPN(), q.Type())
	}
	if len(r.PrivateData) > abi.MaxPrivateDataSIDRREP {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeInvalid, "private_data", "%d bytes of SIDR REP (accept of a UD request) private data: at most %d are allowed (IBTA)", len(r.PrivateData), abi.MaxPrivateDataSIDRREP)
	}
	_, req, err := c.takeRequest(r.Listener, r.ID)
	if err != nil {
		return abi.ConnectReply{}, err
	}
	c.m.countReq(reqAccepted)
	req.reply <- connResult{reply: abi.ConnectReply{RemoteQPN: q.QPN(), RemoteGID: q.GID(), PrivateData: r.PrivateData, QKey: q.QKey()}}
	if d := req.remote; d != nil {
		return abi.ConnectReply{RemoteQPN: d.QPN, RemoteGID: d.GID}, nil
	}
	return abi.ConnectReply{RemoteQPN: req.from.QPN(), RemoteGID: req.from.GID()}, nil
}

// acceptingQP finds the QP r accepts with: by handle, in RESET or INIT
// (the agent moves it), or by number, a QP of v its workload moves itself.
func (c *Client) acceptingQP(v *device.Context, r *abi.AcceptRequest) (*device.QP, error) {
	q, err := ConnQP(c.m.dev, v, r.QP, r.QPN)
	if err == nil && r.QPN == 0 && q.IsUD() {
		// (A number the workload gives, for a QP it moves itself, may
		// be any QP's: the agent touches none.)
		return nil, abi.Errorf(abi.CodeInvalid, "qp", "QP 0x%x is UD: a connection request (TCP port space) is accepted with an RC or UC QP", q.QPN())
	}
	if err != nil || r.QPN != 0 {
		return q, err
	}
	if st := q.State(); st != abi.QPSReset && st != abi.QPSInit {
		return nil, abi.Errorf(abi.CodeState, "qp", "QP 0x%x is in %s: accept with a QP in RESET or INIT", q.QPN(), st)
	}
	return q, nil
}

// ConnQP finds the QP of v (this workload's context) a connection names:
// by its handle, or, for a QP the workload moves itself, by its number
// qpn (abi.CMConnect.QPN, abi.AcceptRequest.QPN).
func ConnQP(dev *device.Device, v *device.Context, handle, qpn uint32) (*device.QP, error) {
	if qpn == 0 {
		q, err := v.QPByHandle(handle)
		if err != nil {
			return nil, abi.Errorf(abi.CodeNotFound, "qp", "no QP with handle %d", handle)
		}
		return q, nil
	}
	q := dev.QP(qpn)
	if q == nil || q.Context() != v || q.Destroyed() {
		return nil, abi.Errorf(abi.CodeNotFound, "qpn", "no QP numbered 0x%x in this workload", qpn)
	}
	return q, nil
}

// end is one side of a connection being set up: its QP, whether its
// workload moves it itself, the PSN it sends from and its ACK timeout.
type end struct {
	q          *device.QP
	external   bool
	psn        uint32
	ackTimeout uint8
}

// connectPair brings a and b to RTS facing each other, with path MTU mtu
// and the defaults rdma_cm uses; an external end is left to its workload.
func connectPair(a, b end, mtu uint32) error {
	var steps []func() error
	for _, e := range []end{a, b} {
		if !e.external {
			steps = append(steps, func() error { return ToInit(e.q) })
		}
	}
	for _, p := range [][2]end{{a, b}, {b, a}} {
		if e, peer := p[0], p[1]; !e.external {
			steps = append(steps, func() error { return ToRTR(e.q, peer.q.GID(), peer.q.QPN(), peer.psn, mtu) })
		}
	}
	for _, e := range []end{a, b} {
		if !e.external {
			steps = append(steps, func() error { return ToRTS(e.q, e.psn, e.ackTimeout) })
		}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			for _, e := range []end{a, b} {
				if !e.external {
					e.q.MoveToErr("connection setup failed")
				}
			}
			return err
		}
	}
	return nil
}

// ToInit brings q to INIT (from RESET), or gives it every access (in
// INIT), as rdma_cm does.
func ToInit(q *device.QP) error {
	if q.State() != abi.QPSReset {
		return q.Modify(&abi.ModifyQP{Mask: abi.MaskAccessFlags, Attr: abi.QPAttr{AccessFlags: abi.AccessAll}})
	}
	return q.Modify(&abi.ModifyQP{Mask: abi.MaskState | abi.MaskPort | abi.MaskAccessFlags,
		Attr: abi.QPAttr{State: abi.QPSInit, Port: 1, AccessFlags: abi.AccessAll}})
}

// PathMTU is the path MTU between adapter ad and a remote end whose
// active MTU is remote (0 or not an MTU: unknown, ad's alone counts): the
// smaller of the two, as rdma_cm takes the path record's.
func PathMTU(ad *device.Adapter, remote uint32) uint32 {
	m := ad.ActiveMTU()
	if abi.ValidMTU(remote) && remote < m {
		m = remote
	}
	return m
}

// ToRTR brings q from INIT to RTR facing (gid, qpn), expecting rqPSN, with
// path MTU mtu and rdma_cm's other defaults.
func ToRTR(q *device.QP, gid abi.GID, qpn, rqPSN, mtu uint32) error {
	return q.Modify(&abi.ModifyQP{
		Mask: q.ConnectMask(abi.MaskState | abi.MaskAV | abi.MaskPathMTU | abi.MaskDestQPN | abi.MaskRQPSN | abi.MaskMaxDestRdAtomic | abi.MaskMinRNRTimer),
		Attr: abi.QPAttr{State: abi.QPSRTR, DGID: gid, PathMTU: mtu, DestQPN: qpn, RQPSN: rqPSN,
			MaxDestRdAtomic: abi.MaxRdAtom, MinRNRTimer: abi.DefaultMinRNRTimer}})
}

// ToRTS brings q from RTR to RTS, sending from sqPSN, with local ACK
// timeout ackTimeout and rdma_cm's other defaults.
func ToRTS(q *device.QP, sqPSN uint32, ackTimeout uint8) error {
	return q.Modify(&abi.ModifyQP{
		Mask: q.ConnectMask(abi.MaskState | abi.MaskSQPSN | abi.MaskTimeout | abi.MaskRetryCnt | abi.MaskRNRRetry | abi.MaskMaxRdAtomic),
		Attr: abi.QPAttr{State: abi.QPSRTS, SQPSN: sqPSN, Timeout: ackTimeout, RetryCnt: abi.DefaultRetryCnt,
			RNRRetry: abi.DefaultRNRRetry, MaxRdAtomic: abi.MaxRdAtom}})
}

// Resolve finds the adapter "vm/vrdmaN" or GID names on this host. A
// name that is not here is CodeUnavailable (another host may have it).
func (m *Manager) Resolve(remote string) (*device.Adapter, error) {
	if vmName, adName, ok := strings.Cut(remote, "/"); ok {
		v, attached := m.dev.ReadyVM(vmName)
		if !attached {
			return nil, abi.Errorf(abi.CodeUnavailable, "remote",
				"VM %q is not attached on host %s: start its workload (a VM on another host needs the control plane: this agent runs standalone, --no-control-plane)", vmName, m.host)
		}
		for _, ad := range v.Adapters() {
			if ad.Name() == adName {
				return ad, nil
			}
		}
		return nil, abi.Errorf(abi.CodeNotFound, "remote", "VM %q has no adapter %q", vmName, adName)
	}
	gid, err := abi.ParseGID(remote)
	if err != nil {
		return nil, abi.Errorf(abi.CodeInvalid, "remote", "remote %q is neither \"vm/vrdmaN\" nor a GID", remote)
	}
	if ad := m.dev.AdapterByGID(gid); ad != nil {
		return ad, nil
	}
	return nil, abi.Errorf(abi.CodeUnavailable, "remote", "GID %s is not an adapter on host %s (other hosts need the control plane: this agent runs standalone, --no-control-plane)", gid, m.host)
}

// CheckDialer checks that q may dial: a connect (ud false) with a QP in
// RESET or INIT — an RC or UC QP the agent moves, or any QP whose number
// the workload gives for one it moves itself (external: UCX's rdmacm
// connection manager names a dummy UD QP so) — or a service ID resolution
// (ud) with a UD QP.
func CheckDialer(q *device.QP, ud, external bool) error {
	switch {
	case ud && !q.IsUD():
		return abi.Errorf(abi.CodeInvalid, "qp", "QP 0x%x is %s: an ID of the UDP port space (RDMA_PS_UDP) resolves with a UD QP", q.QPN(), q.Type())
	case ud:
		return nil
	case !external && q.IsUD():
		return abi.Errorf(abi.CodeInvalid, "qp", "QP 0x%x is UD: connect it through an ID of the UDP port space (RDMA_PS_UDP), or send to its peers with address handles", q.QPN())
	}
	if st := q.State(); st != abi.QPSReset && st != abi.QPSInit {
		return abi.Errorf(abi.CodeState, "qp", "QP 0x%x is in %s: connect with a QP in RESET or INIT", q.QPN(), st)
	}
	return nil
}

// Timeout is a connect's timeout: timeoutMS, or 10 s when zero.
func Timeout(timeoutMS uint32) time.Duration {
	if timeoutMS == 0 {
		return 10 * time.Second
	}
	return time.Duration(timeoutMS) * time.Millisecond
}

// Connect dials the listener on port r.Port of ad, an adapter of this
// host, with q (checked with CheckDialer), and waits for its answer.
func (c *Client) Connect(q *device.QP, ad *device.Adapter, r *abi.Connect) (abi.ConnectReply, error) {
	return c.ConnectWith(q, ad, r, Dial{})
}

// ConnectWith is Connect with d's private data and external QP.
func (c *Client) ConnectWith(q *device.QP, ad *device.Adapter, r *abi.Connect, d Dial) (abi.ConnectReply, error) {
	m := c.m
	vmName := ad.Context().Name()
	m.mu.Lock()
	key := listenKey{vmName, ad.Name(), r.Port, d.UD}
	l := m.listeners[key]
	m.mu.Unlock()
	if l == nil {
		m.countReq(reqNoListener)
		return abi.ConnectReply{}, Refused(abi.RejectInvalidServiceID, nil, "connection refused: nothing listens on %s/%s %s port %d", vmName, ad.Name(), key.space(), r.Port)
	}
	timeout := Timeout(r.TimeoutMS)
	t := time.NewTimer(timeout)
	defer t.Stop()
	req := &connReq{from: q, priv: d.PrivateData, fromAckTimeout: abi.AckTimeoutOr(r.AckTimeout), fromExternal: d.External, toIP: d.ToIP, fromIP: d.FromIP, reply: make(chan connResult, 1)}
	req.dialerPSN, req.acceptorPSN = randomPSNs()
	select {
	case l.reqs <- req:
	case <-l.quit:
		m.countReq(reqNoListener)
		return abi.ConnectReply{}, Refused(abi.RejectInvalidServiceID, nil, "connection refused: %s/%s stopped listening on port %d", vmName, ad.Name(), r.Port)
	case <-t.C:
		m.countReq(reqDialerGone)
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "port", "connect timed out after %v: the listener's backlog is full", timeout)
	case <-c.ctx.Done():
		m.countReq(reqDialerGone)
		return abi.ConnectReply{}, ErrClosing
	}
	select {
	case res := <-req.reply:
		return res.reply, res.err
	case <-t.C:
	case <-c.ctx.Done():
	}
	// Withdraw the request, unless an answer is already under way.
	if !req.state.CompareAndSwap(reqPending, reqAbandoned) {
		res := <-req.reply
		return res.reply, res.err
	}
	l.mu.Lock()
	delete(l.pending, req.id)
	l.mu.Unlock()
	m.countReq(reqDialerGone)
	return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s port %d timed out after %v: the listener did not accept", r.Remote, r.Port, timeout)
}
