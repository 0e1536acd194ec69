// SPDX-License-Identifier: Apache-2.0

package cm

// Dialers on other hosts. The agents' links (package hostlink) carry a
// CM_REQ to the target's host, whose reader checks who sent it and hands
// it in here with ServeRemote: it waits on the listener's backlog like a
// local dialer's request, and the answer goes back with the accepting
// QP's number, GID and both PSNs. The dialer's side (DialRemote) builds
// the CM_REQ, reads the answer and brings its QP to RTS (Establish).

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// MaxRemoteWait bounds how long a remote dialer's request may wait for an
// answer.
const MaxRemoteWait = 60 * time.Second

// ErrCanceled answers a remote request whose dialer canceled it.
var ErrCanceled = errors.New("the dialer canceled the connection request")

// Remote is a connection request from a dialer on another host, from the
// moment its transport read it until ServeRemote returns.
type Remote struct{ req *connReq }

// NewRemote makes the request of dialer d.
func NewRemote(d RemoteDialer) *Remote {
	r := &connReq{remote: &d, reply: make(chan connResult, 1), canceled: make(chan struct{})}
	r.dialerPSN, r.acceptorPSN = randomPSNs()
	if d.HasPSN {
		r.dialerPSN = d.PSN & rc.PSNMask
	}
	return &Remote{r}
}

// Cancel withdraws the request (the dialer gave up: CM_CANCEL) while it is
// pending; ServeRemote then returns ErrCanceled. Safe to call at any time.
func (r *Remote) Cancel() {
	if r.req.state.CompareAndSwap(reqPending, reqAbandoned) {
		close(r.req.canceled)
	}
}

// Answer is what an accepted remote request sends back to its dialer.
type Answer struct {
	QPN          uint32
	GID          abi.GID
	SQPSN, RQPSN uint32 // the dialer's send PSN, and its receive PSN
	MTU          uint32 // the path MTU the acceptor's QP took
	PrivateData  []byte // the REP's private data
	QKey         uint32 // a UD request's: the accepting UD QP's Q_Key
}

// ServeRemote queues remote request r on the listener of target (an
// adapter of this host) and port, and waits for its answer, at most wait
// (MaxRemoteWait when zero or more). lost is closed when the connection
// to the dialer's host goes; ServeRemote returns lostErr then.
func (m *Manager) ServeRemote(r *Remote, target string, port uint16, wait time.Duration, lost <-chan struct{}, lostErr error) (Answer, error) {
	ad, err := m.Resolve(target)
	if err != nil {
		return Answer{}, err
	}
	vmName := ad.Context().Name()
	key := listenKey{vmName, ad.Name(), port, r.req.remote.UD}
	m.mu.Lock()
	l := m.listeners[key]
	m.mu.Unlock()
	if l == nil {
		m.countReq(reqNoListener)
		return Answer{}, Refused(abi.RejectInvalidServiceID, nil, "connection refused: nothing listens on %s/%s %s port %d", vmName, ad.Name(), key.space(), port)
	}
	if wait <= 0 || wait > MaxRemoteWait {
		wait = MaxRemoteWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	req := r.req
	select {
	case l.reqs <- req:
	case <-l.quit:
		m.countReq(reqNoListener)
		return Answer{}, Refused(abi.RejectInvalidServiceID, nil, "connection refused: %s/%s stopped listening on port %d", vmName, ad.Name(), port)
	case <-t.C:
		m.countReq(reqDialerGone)
		return Answer{}, abi.Errorf(abi.CodeUnavailable, "port", "connect timed out after %v: the listener's backlog is full", wait)
	case <-lost:
		m.countReq(reqDialerGone)
		req.state.CompareAndSwap(reqPending, reqAbandoned)
		return Answer{}, lostErr
	case <-req.canceled:
		m.countReq(reqDialerGone)
		return Answer{}, ErrCanceled
	}
	var res connResult
	select {
	case res = <-req.reply:
	case <-t.C:
	case <-lost:
	case <-req.canceled:
	}
	if res.err == nil && res.reply.RemoteQPN == 0 {
		// No answer yet: withdraw, unless one is under way. A request
		// the dialer canceled gets none.
		if req.state.CompareAndSwap(reqPending, reqAbandoned) || req.state.Load() == reqAbandoned {
			l.mu.Lock()
			delete(l.pending, req.id)
			l.mu.Unlock()
			m.countReq(reqDialerGone)
			select {
			case <-req.canceled:
				return Answer{}, ErrCanceled
			default:
			}
			return Answer{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s port %d timed out after %v: the listener did not accept", target, port, wait)
		}
		res = <-req.reply
	}
	if res.err != nil {
		return Answer{}, res.err
	}
	return Answer{QPN: res.reply.RemoteQPN, GID: res.reply.RemoteGID, SQPSN: res.sqPSN, RQPSN: res.rqPSN, MTU: res.mtu, PrivateData: res.reply.PrivateData, QKey: res.reply.QKey}, nil
}

// acceptRemote brings ours to RTS facing remote dialer d (unless its
// workload moves it itself), and answers d.
func acceptRemote(ours end, req *connReq, d *RemoteDialer, priv []byte) (abi.ConnectReply, error) {
	q := ours.q
	mtu := d.pathMTU(q.Adapter())
	if !ours.external {
		if err := Establish(q, d.GID, d.QPN, req.dialerPSN, ours.psn, mtu, ours.ackTimeout); err != nil {
			req.reply <- connResult{err: err}
			return abi.ConnectReply{}, err
		}
	}
	req.reply <- connResult{reply: abi.ConnectReply{RemoteQPN: q.QPN(), RemoteGID: q.GID(), PrivateData: priv}, sqPSN: req.dialerPSN, rqPSN: ours.psn, mtu: mtu}
	return abi.ConnectReply{RemoteQPN: d.QPN, RemoteGID: d.GID, Path: q.Query().Path}, nil
}

// pathMTU is the path MTU of d's connection to adapter ad.
func (d *RemoteDialer) pathMTU(ad *device.Adapter) uint32 {
	if d.PathMTU && abi.ValidMTU(d.MTU) {
		return d.MTU
	}
	return PathMTU(ad, d.MTU)
}

// SendCM sends a CM_REQ to the target's host and returns its answer,
// waiting at most timeout (and a little more): the agents' links
// (hostlink.Links.DialCM). Its errors are abi.Errors.
type SendCM func(m *tcpwire.ConnReqMsg, timeout time.Duration) (tcpwire.ConnRespMsg, error)

// DialRemote dials listener target (c.Port) on another host for q,
// through send, and brings q to RTS facing the QP that accepts. d's
// private data goes with the request; the reply carries the REP's, and a
// refusal the REJ's (abi.Error.Reject). An external QP (d.External) is
// left alone: the reply carries the PSNs and path MTU its workload moves
// it with.
func DialRemote(q *device.QP, c *abi.Connect, target string, d Dial, send SendCM) (abi.ConnectReply, error) {
	timeout := Timeout(c.TimeoutMS)
	m := tcpwire.ConnReqMsg{Target: target, Port: c.Port, FromVM: q.Context().Name(), FromAdapter: q.Adapter().Name(),
		FromGID: netip.AddrFrom16(q.GID()), FromQPN: q.QPN(), TimeoutMS: uint32(timeout / time.Millisecond), MTU: q.Adapter().ActiveMTU(),
		PrivateData: d.PrivateData, External: d.External, UD: d.UD, ToIP: d.ToIP, FromIP: d.FromIP}
	r, err := send(&m, timeout)
	if err != nil {
		return abi.ConnectReply{}, err
	}
	if r.Code != "" {
		e := &abi.Error{Code: r.Code, Message: r.Message}
		if r.Code == abi.CodeRefused && (r.RejectReason != 0 || len(r.PrivateData) > 0) {
			e.Reject = &abi.RejectInfo{Reason: r.RejectReason, PrivateData: r.PrivateData}
		}
		return abi.ConnectReply{}, e
	}
	gid := abi.GID(r.GID.As16())
	if d.UD {
		return abi.ConnectReply{RemoteQPN: r.QPN, RemoteGID: gid, PrivateData: r.PrivateData, QKey: r.QKey}, nil
	}
	mtu := PathMTU(q.Adapter(), r.MTU)
	if d.External {
		return abi.ConnectReply{RemoteQPN: r.QPN, RemoteGID: gid, PrivateData: r.PrivateData, SQPSN: r.SQPSN, RQPSN: r.RQPSN, MTU: mtu}, nil
	}
	if err := Establish(q, gid, r.QPN, r.RQPSN, r.SQPSN, mtu, abi.AckTimeoutOr(c.AckTimeout)); err != nil {
		return abi.ConnectReply{}, err
	}
	return abi.ConnectReply{RemoteQPN: r.QPN, RemoteGID: gid, Path: q.Query().Path, PrivateData: r.PrivateData}, nil
}

// Establish brings q through INIT and RTR to RTS facing (gid, qpn),
// expecting rqPSN and sending from sqPSN, with path MTU mtu; on a
// failure q is moved to ERR.
func Establish(q *device.QP, gid abi.GID, qpn, rqPSN, sqPSN, mtu uint32, ackTimeout uint8) error {
	for _, step := range []func() error{
		func() error { return ToInit(q) },
		func() error { return ToRTR(q, gid, qpn, rqPSN, mtu) },
		func() error { return ToRTS(q, sqPSN, ackTimeout) },
	} {
		if err := step(); err != nil {
			q.MoveToErr("connection setup failed")
			return err
		}
	}
	return nil
}

// RandomPSN returns a random 24-bit PSN.
func RandomPSN() uint32 {
	p, _ := randomPSNs()
	return p
}

// randomPSNs returns two random 24-bit PSNs.
func randomPSNs() (uint32, uint32) {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:]) & rc.PSNMask, binary.LittleEndian.Uint32(b[4:]) & rc.PSNMask
}
