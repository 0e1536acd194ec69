package agent

// Connection management across hosts: a Connect whose target is on another
// host travels as a CM_REQ over the tcp path to the target's agent, which
// queues it on the listener like a local dialer's; the listener's Accept
// brings its QP to RTS facing the dialer and answers with a CM_RESP
// carrying its QPN, GID and both PSNs; the dialer's agent then brings the
// dialing QP to RTS. A Reject, a closed listener or a timeout answers with
// an error instead; a dialer that gives up sends CM_CANCEL.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// cmMaxWait bounds how long a CM_REQ may wait for an answer; cmMaxPending
// how many a connection may have waiting.
const (
	cmMaxWait    = 60 * time.Second
	cmMaxPending = 256
)

// startCM reads a CM_REQ and hands it to its own goroutine.
func (c *tconn) startCM(h *tcpwire.Header) error {
	var m tcpwire.ConnReqMsg
	if err := c.readControl(h, &m); err != nil {
		return err
	}
	tag := h.Tag
	if err := m.Validate(); err != nil {
		return c.writeControl(tcpwire.CMResp, tag, tcpwire.ConnRespMsg{Code: abi.CodeInvalid, Message: err.Error()})
	}
	if c.cmCount.Add(1) > cmMaxPending {
		c.cmCount.Add(-1)
		return c.writeControl(tcpwire.CMResp, tag, tcpwire.ConnRespMsg{Code: abi.CodeLimit,
			Message: fmt.Sprintf("host %s has %d connection requests from this host waiting for an answer, the limit", c.l.u.a.cfg.Host, cmMaxPending)})
	}
	u := c.l.u
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		defer c.cmCount.Add(-1)
		resp := c.serveCM(tag, &m)
		if err := c.writeControl(tcpwire.CMResp, tag, resp); err != nil {
			u.log.Info("tcp path: CM answer not delivered", "peer", c.l.peerID, "err", err)
		}
	}()
	return nil
}

// cancelCM withdraws a CM_REQ whose dialer gave up.
func (c *tconn) cancelCM(h *tcpwire.Header) error {
	if h.PayloadLen != 0 {
		if err := c.discard(uint64(h.PayloadLen)); err != nil {
			return err
		}
	}
	c.cmMu.Lock()
	r := c.cms[h.Tag]
	c.cmMu.Unlock()
	if r != nil && r.state.CompareAndSwap(reqPending, reqAbandoned) {
		close(r.canceled) // serveCM returns
	}
	return nil
}

var errCMCanceled = errors.New("the dialer canceled the connection request")

func cmErr(err error) tcpwire.ConnRespMsg {
	var ae *abi.Error
	if errors.As(err, &ae) {
		return tcpwire.ConnRespMsg{Code: ae.Code, Message: ae.Message}
	}
	return tcpwire.ConnRespMsg{Code: abi.CodeUnavailable, Message: err.Error()}
}

// serveCM queues a remote dialer's request on the listener and waits for
// the answer.
func (c *tconn) serveCM(tag uint64, m *tcpwire.ConnReqMsg) tcpwire.ConnRespMsg {
	a := c.l.u.a
	ad, err := a.resolveRemote(m.Target)
	if err != nil {
		return cmErr(err)
	}
	// The dialer must be an adapter of the host this connection
	// authenticated.
	ctx, cancel := context.WithTimeout(context.Background(), a.ctl.cfg.LookupTimeout)
	ep, err := a.ctl.cache.Resolve(ctx, m.FromGID.String())
	cancel()
	if err != nil || ep.Host != c.l.peerID || ep.VM != m.FromVM {
		return cmErr(abi.Errorf(abi.CodeRefused, "", "CM request from %s/%s (GID %s) on host %s: the control plane does not place that adapter on that host",
			m.FromVM, m.FromAdapter, m.FromGID, c.l.peerID))
	}
	a.mu.Lock()
	l := a.listeners[listenKey{ad.vm.name, ad.name, m.Port}]
	a.mu.Unlock()
	if l == nil {
		return cmErr(abi.Errorf(abi.CodeRefused, "port", "connection refused: nothing listens on %s/%s port %d", ad.vm.name, ad.name, m.Port))
	}
	wait := time.Duration(m.TimeoutMS) * time.Millisecond
	if wait <= 0 || wait > cmMaxWait {
		wait = cmMaxWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	req := &connReq{remote: &remoteDialer{vm: m.FromVM, adapter: m.FromAdapter, gid: abi.GID(m.FromGID.As16()), qpn: m.FromQPN, host: c.l.peerID},
		reply: make(chan connResult, 1), canceled: make(chan struct{})}
	c.cmMu.Lock()
	c.cms[tag] = req
	c.cmMu.Unlock()
	defer func() {
		c.cmMu.Lock()
		delete(c.cms, tag)
		c.cmMu.Unlock()
	}()
	select {
	case l.reqs <- req:
	case <-l.quit:
		return cmErr(abi.Errorf(abi.CodeRefused, "port", "connection refused: %s/%s stopped listening on port %d", ad.vm.name, ad.name, m.Port))
	case <-t.C:
		return cmErr(abi.Errorf(abi.CodeUnavailable, "port", "connect timed out after %v: the listener's backlog is full", wait))
	case <-c.closed:
		req.state.CompareAndSwap(reqPending, reqAbandoned)
		return cmErr(errConnLost)
	case <-req.canceled:
		return cmErr(errCMCanceled)
	}
	var res connResult
	select {
	case res = <-req.reply:
	case <-t.C:
	case <-c.closed:
	case <-req.canceled:
	}
	if res.err == nil && res.reply.RemoteQPN == 0 {
		// No answer yet: withdraw, unless one is under way. A request
		// the dialer canceled gets none.
		if req.state.CompareAndSwap(reqPending, reqAbandoned) || req.state.Load() == reqAbandoned {
			l.mu.Lock()
			delete(l.pending, req.id)
			l.mu.Unlock()
			select {
			case <-req.canceled:
				return cmErr(errCMCanceled)
			default:
			}
			return cmErr(abi.Errorf(abi.CodeUnavailable, "", "connect to %s port %d timed out after %v: the listener did not accept", m.Target, m.Port, wait))
		}
		res = <-req.reply
	}
	if res.err != nil {
		return cmErr(res.err)
	}
	r := res.reply
	return tcpwire.ConnRespMsg{QPN: r.RemoteQPN, GID: netip.AddrFrom16(r.RemoteGID), SQPSN: res.sqPSN, RQPSN: res.rqPSN}
}

// acceptRemote brings q to RTS facing remote dialer d and answers it.
func acceptRemote(q *QP, req *connReq, d *remoteDialer) (abi.ConnectReply, error) {
	var b [8]byte
	rand.Read(b[:])
	dialerPSN := binary.LittleEndian.Uint32(b[:]) & tcpwire.PSNMask // the dialer's sq_psn
	ourPSN := binary.LittleEndian.Uint32(b[4:]) & tcpwire.PSNMask   // ours
	for _, step := range []func() error{
		func() error { return toInit(q) },
		func() error { return toRTR(q, d.gid, d.qpn, dialerPSN) },
		func() error { return toRTS(q, ourPSN) },
	} {
		if err := step(); err != nil {
			q.MoveToErr("connection setup failed")
			req.reply <- connResult{err: err}
			return abi.ConnectReply{}, err
		}
	}
	req.reply <- connResult{reply: abi.ConnectReply{RemoteQPN: q.qpn, RemoteGID: q.ad.gid}, sqPSN: dialerPSN, rqPSN: ourPSN}
	return abi.ConnectReply{RemoteQPN: d.qpn, RemoteGID: d.gid, Path: q.Query().Path}, nil
}

// remoteConnect dials the listener of end, on another host, for q.
func (s *session) remoteConnect(q *QP, c *abi.Connect, end *member.End) (abi.ConnectReply, error) {
	a := s.a
	timeout := time.Duration(c.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	l := a.up.linkTo(end.Host.Host.ID)
	tc, err := l.conn(min(timeout, 5*time.Second))
	if err != nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "remote", "connect to %s on host %s over the tcp path: %v", end.Endpoint.Name(), end.Host.Host.Label(), err)
	}
	m := tcpwire.ConnReqMsg{Target: end.Endpoint.Name(), Port: c.Port, FromVM: q.vm.name, FromAdapter: q.ad.name,
		FromGID: netip.AddrFrom16(q.ad.gid), FromQPN: q.qpn, TimeoutMS: uint32(timeout / time.Millisecond)}
	k := newCall()
	if !tc.register(k) {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "remote", "connect to %s: the tcp path connection to host %s closed", end.Endpoint.Name(), end.Host.Host.Label())
	}
	if err := tc.writeControl(tcpwire.CMReq, k.tag, m); err != nil {
		tc.withdraw(k)
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "remote", "connect to %s: %v", end.Endpoint.Name(), err)
	}
	t := time.NewTimer(timeout + time.Second) // the acceptor times out first and says why
	defer t.Stop()
	answered := false
	select {
	case <-k.done:
		answered = true
	case <-t.C:
	case <-s.ctx.Done():
	}
	if !answered {
		if tc.withdraw(k) {
			h := tcpwire.Header{Type: tcpwire.CMCancel, Tag: k.tag}
			tc.writeFrame(&h, nil)
			return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s port %d timed out after %v", c.Remote, c.Port, timeout)
		}
		<-k.done // the reader has the answer in hand
	}
	if k.err != nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s: %v", c.Remote, k.err)
	}
	var r tcpwire.ConnRespMsg
	if err := tcpwire.DecodeJSON(k.ctl, &r); err != nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s: bad answer from host %s: %v", c.Remote, end.Host.Host.Label(), err)
	}
	if err := r.Validate(); err != nil {
		return abi.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s: bad answer from host %s: %v", c.Remote, end.Host.Host.Label(), err)
	}
	if r.Code != "" {
		return abi.ConnectReply{}, &abi.Error{Code: r.Code, Message: r.Message}
	}
	gid := abi.GID(r.GID.As16())
	for _, step := range []func() error{
		func() error { return toInit(q) },
		func() error { return toRTR(q, gid, r.QPN, r.RQPSN) },
		func() error { return toRTS(q, r.SQPSN) },
	} {
		if err := step(); err != nil {
			q.MoveToErr("connection setup failed")
			return abi.ConnectReply{}, err
		}
	}
	return abi.ConnectReply{RemoteQPN: r.QPN, RemoteGID: gid, Path: q.Query().Path}, nil
}
