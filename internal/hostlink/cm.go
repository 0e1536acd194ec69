// SPDX-License-Identifier: Apache-2.0

package hostlink

// Connection management's frames across hosts: a Connect whose target is
// on another host travels as a CM_REQ (DialCM; package cm's DialRemote
// builds it and reads the answer) over the link to the target's agent, which
// queues it on the listener like a local dialer's; the listener's Accept
// brings its QP to RTS facing the dialer and answers with a CM_RESP
// carrying its QPN, GID and both PSNs; the dialer's agent then brings the
// dialing QP to RTS. A Reject, a closed listener or a timeout answers with
// an error instead; a dialer that gives up sends CM_CANCEL. CM_DISC tells
// the peer's host of a disconnect, and CM_RTU of the rdma_establish of a
// dialer whose workload moves its QP itself.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// cmMaxPending bounds how many CM_REQs a connection may have waiting.
const cmMaxPending = 256

// cmMaxNotes bounds how many CM_DISC and CM_RTU frames of one connection
// are served at once, each on a goroutine of its own that looks its
// sender up in the control plane (a lookup that may go to etcd) before
// it tells connection management. When that many are in hand the
// connection's reader waits for one to finish before it reads on: a
// peer that floods them slows down its own connection, and costs the
// agent cmMaxNotes goroutines and lookups at most; none is dropped.
const cmMaxNotes = 8

// startCM reads a CM_REQ and hands it to its own goroutine.
func (c *Conn) startCM(h *tcpwire.Header) error {
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
			Message: fmt.Sprintf("host %s has %d connection requests from this host waiting for an answer, the limit", c.l.u.cfg.Host, cmMaxPending)})
	}
	r := cm.NewRemote(cm.RemoteDialer{VM: m.FromVM, Adapter: m.FromAdapter, GID: abi.GID(m.FromGID.As16()), QPN: m.FromQPN, Host: c.l.peerID, MTU: m.MTU,
		PrivateData: m.PrivateData, External: m.External, UD: m.UD, ToIP: m.ToIP, FromIP: m.FromIP})
	c.cmMu.Lock()
	c.cms[tag] = r
	c.cmMu.Unlock()
	u := c.l.u
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		defer c.cmCount.Add(-1)
		defer c.guard("CM request goroutine")
		defer func() {
			c.cmMu.Lock()
			delete(c.cms, tag)
			c.cmMu.Unlock()
		}()
		resp := c.serveCM(r, &m)
		if err := c.writeControl(tcpwire.CMResp, tag, resp); err != nil {
			u.log.Info("tcp path: CM answer not delivered", "peer", c.l.peerID, "err", err)
		}
	}()
	return nil
}

// cancelCM withdraws a CM_REQ whose dialer gave up.
func (c *Conn) cancelCM(h *tcpwire.Header) error {
	if h.PayloadLen != 0 {
		if err := c.Discard(uint64(h.PayloadLen)); err != nil {
			return err
		}
	}
	c.cmMu.Lock()
	r := c.cms[h.Tag]
	c.cmMu.Unlock()
	if r != nil {
		r.Cancel() // serveCM returns
	}
	return nil
}

func cmErr(err error) tcpwire.ConnRespMsg {
	var ae *abi.Error
	if errors.As(err, &ae) {
		r := tcpwire.ConnRespMsg{Code: ae.Code, Message: ae.Message}
		if ae.Reject != nil {
			r.RejectReason, r.PrivateData = ae.Reject.Reason, ae.Reject.PrivateData
		}
		return r
	}
	return tcpwire.ConnRespMsg{Code: abi.CodeUnavailable, Message: err.Error()}
}

// serveCM checks a remote dialer's request, hands it to connection
// management and waits for the answer.
func (c *Conn) serveCM(r *cm.Remote, m *tcpwire.ConnReqMsg) tcpwire.ConnRespMsg {
	u := c.l.u
	// The dialer must be an adapter of the host this connection
	// authenticated.
	ctx, cancel := context.WithTimeout(context.Background(), u.cfg.LookupTimeout)
	ep, err := u.cfg.Cache.Resolve(ctx, m.FromGID.String())
	cancel()
	if err != nil || ep.Host != c.l.peerID || ep.VM != m.FromVM {
		return cmErr(abi.Errorf(abi.CodeRefused, "", "CM request from %s/%s (GID %s) on host %s: the control plane does not place that adapter on that host",
			m.FromVM, m.FromAdapter, m.FromGID, c.l.peerID))
	}
	if m.ToIP.IsValid() {
		// A connect by this host's address: the addresses are the two
		// hosts' PVRDMA addresses, as the control plane has them.
		if err := c.checkHostIPs(m.ToIP, m.FromIP); err != nil {
			return cmErr(err)
		}
	}
	a, err := u.cfg.CM.ServeRemote(r, m.Target, m.Port, time.Duration(m.TimeoutMS)*time.Millisecond, c.closed, ErrConnLost)
	if err != nil {
		return cmErr(err)
	}
	return tcpwire.ConnRespMsg{QPN: a.QPN, GID: netip.AddrFrom16(a.GID), SQPSN: a.SQPSN, RQPSN: a.RQPSN, MTU: a.MTU, PrivateData: a.PrivateData, QKey: a.QKey}
}

// checkHostIPs checks a CM_REQ's to_ip and from_ip: this host's PVRDMA
// address and the dialing host's, as the control plane records them.
func (c *Conn) checkHostIPs(to, from netip.Addr) error {
	u := c.l.u
	ctx, cancel := context.WithTimeout(context.Background(), u.cfg.LookupTimeout)
	defer cancel()
	for _, e := range []struct {
		id   string
		ip   netip.Addr
		what string
	}{{u.cfg.HostID, to, "to_ip"}, {c.l.peerID, from, "from_ip"}} {
		hs, err := u.cfg.Cache.Host(ctx, e.id)
		if err != nil {
			return abi.Errorf(abi.CodeUnavailable, "", "CM request by a host's address: look up host %s: %v", e.id, err)
		}
		if hs.Host.PVRDMAAddress.Addr() != e.ip {
			return abi.Errorf(abi.CodeRefused, "", "CM request by a host's address: %s %v is not host %s's PVRDMA address %v", e.what, e.ip, hs.Host.Label(), hs.Host.PVRDMAAddress.Addr())
		}
	}
	return nil
}

// answerWho answers a CM_WHO at once: the VM that holds the port of this
// host's addresses, from connection management's table.
func (c *Conn) answerWho(h *tcpwire.Header) error {
	var m tcpwire.HostPortMsg
	if err := c.readControl(h, &m); err != nil {
		return err
	}
	if err := m.Validate(); err != nil {
		return c.writeControl(tcpwire.CMResp, h.Tag, tcpwire.ConnRespMsg{Code: abi.CodeInvalid, Message: err.Error()})
	}
	hl, _ := c.l.u.cfg.CM.HostListener(m.Port, m.UD)
	return c.writeControl(tcpwire.CMResp, h.Tag, tcpwire.ConnRespMsg{VM: hl.VM, Adapters: hl.Adapters})
}

// whoTimeout bounds a CM_WHO's wait for its answer, which comes at once.
const whoTimeout = 5 * time.Second

// AskWho asks host id which VM holds port (of the UDP port space with ud)
// of its addresses (a CM_WHO) and waits for the answer, at most whoTimeout
// or until ctx ends. The zero HostListener: none does. Its errors are
// abi.Errors.
func (u *Links) AskWho(ctx context.Context, id string, port uint16, ud bool) (cm.HostListener, error) {
	l := u.linkTo(id)
	tc, err := l.Conn(whoTimeout)
	if err != nil {
		return cm.HostListener{}, abi.Errorf(abi.CodeUnavailable, "remote", "ask host %s who listens on its port %d over the tcp path: %v", l.label(), port, err)
	}
	k := NewCall(nil)
	if !tc.Register(k) {
		return cm.HostListener{}, abi.Errorf(abi.CodeUnavailable, "remote", "ask host %s who listens on its port %d: the tcp path connection closed", l.label(), port)
	}
	if err := tc.writeControl(tcpwire.CMWho, k.Tag(), tcpwire.HostPortMsg{Port: port, UD: ud}); err != nil {
		tc.Withdraw(k)
		return cm.HostListener{}, abi.Errorf(abi.CodeUnavailable, "remote", "ask host %s who listens on its port %d: %v", l.label(), port, err)
	}
	t := time.NewTimer(whoTimeout)
	defer t.Stop()
	select {
	case <-k.Done:
	case <-t.C:
		tc.Recall(k)
		return cm.HostListener{}, abi.Errorf(abi.CodeUnavailable, "remote", "host %s did not say who listens on its port %d within %v", l.label(), port, whoTimeout)
	case <-ctx.Done():
		tc.Recall(k)
		return cm.HostListener{}, cm.ErrClosing
	}
	if k.Err != nil {
		return cm.HostListener{}, abi.Errorf(abi.CodeUnavailable, "remote", "ask host %s who listens on its port %d: %v", l.label(), port, k.Err)
	}
	var r tcpwire.ConnRespMsg
	err = tcpwire.DecodeJSON(k.Ctl, &r)
	if err == nil {
		err = r.ValidateWho()
	}
	if err != nil {
		return cm.HostListener{}, abi.Errorf(abi.CodeUnavailable, "remote", "host %s's answer to who listens on its port %d: %v", l.label(), port, err)
	}
	if r.Code != "" {
		return cm.HostListener{}, &abi.Error{Code: r.Code, Message: r.Message}
	}
	return cm.HostListener{VM: r.VM, Adapters: r.Adapters}, nil
}

// DialCM sends CM_REQ m to host id and waits for its CM_RESP, at most
// timeout and a second (the acceptor times out first and says why) or
// until ctx ends; a dialer that gives up sends CM_CANCEL. The answer is
// connection management's to read (cm.DialRemote); an error here is an
// abi.Error: the host could not be reached, or did not answer.
func (u *Links) DialCM(ctx context.Context, id string, m *tcpwire.ConnReqMsg, timeout time.Duration) (tcpwire.ConnRespMsg, error) {
	l := u.linkTo(id)
	tc, err := l.Conn(min(timeout, 5*time.Second))
	if err != nil {
		return tcpwire.ConnRespMsg{}, abi.Errorf(abi.CodeUnavailable, "remote", "connect to %s on host %s over the tcp path: %v", m.Target, l.label(), err)
	}
	k := NewCall(nil)
	if !tc.Register(k) {
		return tcpwire.ConnRespMsg{}, abi.Errorf(abi.CodeUnavailable, "remote", "connect to %s: the tcp path connection to host %s closed", m.Target, l.label())
	}
	if err := tc.writeControl(tcpwire.CMReq, k.Tag(), m); err != nil {
		tc.Withdraw(k)
		return tcpwire.ConnRespMsg{}, abi.Errorf(abi.CodeUnavailable, "remote", "connect to %s: %v", m.Target, err)
	}
	t := time.NewTimer(timeout + time.Second)
	defer t.Stop()
	answered := false
	select {
	case <-k.Done:
		answered = true
	case <-t.C:
	case <-ctx.Done():
	}
	if !answered {
		if tc.Withdraw(k) {
			h := tcpwire.Header{Type: tcpwire.CMCancel, Tag: k.Tag()}
			tc.WriteFrame(&h, nil)
			return tcpwire.ConnRespMsg{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s port %d on host %s timed out after %v", m.Target, m.Port, l.label(), timeout)
		}
		<-k.Done // the reader has the answer in hand
	}
	if k.Err != nil {
		return tcpwire.ConnRespMsg{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s: %v", m.Target, k.Err)
	}
	var r tcpwire.ConnRespMsg
	if err := tcpwire.DecodeJSON(k.Ctl, &r); err != nil {
		return tcpwire.ConnRespMsg{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s: bad answer from host %s: %v", m.Target, l.label(), err)
	}
	if err := r.Validate(); err != nil {
		return tcpwire.ConnRespMsg{}, abi.Errorf(abi.CodeUnavailable, "", "connect to %s: bad answer from host %s: %v", m.Target, l.label(), err)
	}
	return r, nil
}

// noteCM reads a CM_DISC or CM_RTU and, once the control plane places its
// sender on the host this connection authenticated, hands it to
// OnDisconnect or OnEstablish.
func (c *Conn) noteCM(h *tcpwire.Header) error {
	var m tcpwire.ConnDiscMsg
	if err := c.readControl(h, &m); err != nil {
		return err
	}
	u := c.l.u
	if err := m.Validate(); err != nil {
		u.log.Warn("tcp path: bad "+h.Type.String()+" ignored", "peer", c.l.peerID, "err", err)
		return nil
	}
	typ := h.Type // h is the reader's, reused for the next frame
	handle := u.cfg.OnDisconnect
	if typ == tcpwire.CMRTU {
		handle = u.cfg.OnEstablish
	}
	if handle == nil {
		return nil
	}
	select {
	case c.notes <- struct{}{}: // one of cmMaxNotes
	case <-c.closed:
		return ErrConnLost
	}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		defer func() { <-c.notes }()
		defer c.guard(typ.String() + " goroutine")
		ctx, cancel := context.WithTimeout(context.Background(), u.cfg.LookupTimeout)
		ep, err := u.cfg.Cache.Resolve(ctx, m.FromGID.String())
		cancel()
		if err != nil || ep.Host != c.l.peerID {
			if n := c.notesIgnored.Add(1); c.logNow() {
				u.log.Warn("tcp path: "+typ.String()+" from an adapter the control plane does not place on the sending host; ignored (logged at most once a second per connection)",
					"peer", c.l.peerID, "from_gid", m.FromGID, "err", err, "ignored_on_this_connection", n)
			}
			return
		}
		handle(m.QPN, m.FromQPN, abi.GID(m.FromGID.As16()))
	}()
	return nil
}

// logNow reports whether a line about the peer's frames may be logged
// now: at most one a second per connection, so that a peer cannot flood
// the agent's log.
func (c *Conn) logNow() bool {
	now, last := nanotime(), c.lastLogged.Load()
	return (last == 0 || now-last >= int64(time.Second)) && c.lastLogged.CompareAndSwap(last, now)
}

// Disconnect tells host that this host's QP fromQPN (GID fromGID)
// disconnected its rdma_cm connection to that host's QP qpn (a CM_DISC).
func (u *Links) Disconnect(host string, qpn, fromQPN uint32, fromGID netip.Addr) error {
	tc, err := u.linkTo(host).Conn(5 * time.Second)
	if err != nil {
		return err
	}
	return tc.writeControl(tcpwire.CMDisc, 0, tcpwire.ConnDiscMsg{QPN: qpn, FromQPN: fromQPN, FromGID: fromGID})
}

// Establish tells host that this host's QP fromQPN (GID fromGID), whose
// workload moves it itself, established its rdma_cm connection to that
// host's QP qpn (a CM_RTU, rdma_establish).
func (u *Links) Establish(host string, qpn, fromQPN uint32, fromGID netip.Addr) error {
	tc, err := u.linkTo(host).Conn(5 * time.Second)
	if err != nil {
		return err
	}
	return tc.writeControl(tcpwire.CMRTU, 0, tcpwire.ConnDiscMsg{QPN: qpn, FromQPN: fromQPN, FromGID: fromGID})
}
