// SPDX-License-Identifier: Apache-2.0

package gsi

// The MADs that come in: each is checked (its format, then that it names
// a connection of its sender's in the state it answers) before it moves
// anything.

import (
	"errors"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// Receive takes mad, the payload of a UD packet to QP1 from QP srcQP of
// the RoCE endpoint at src (unmapped). mad is not kept.
func (m *Manager) Receive(src netip.Addr, srcQP uint32, mad []byte) {
	m.ctr.In.Add(1)
	mm, err := rocewire.ParseMAD(mad)
	if err != nil || srcQP != rocewire.GSIQPN || !src.IsValid() {
		m.ctr.Dropped.Add(1)
		return
	}
	switch mm.Attr() {
	case rocewire.AttrREQ:
		m.req(src, mm)
	case rocewire.AttrREP:
		m.rep(src, mm)
	case rocewire.AttrRTU:
		m.rtu(src, mm)
	case rocewire.AttrREJ:
		m.rej(src, mm)
	case rocewire.AttrMRA:
		m.mra(src, mm)
	case rocewire.AttrDREQ:
		m.dreq(src, mm)
	case rocewire.AttrDREP:
		m.drep(src, mm)
	}
}

// connOfLocked is the connection a message after the REQ names: its
// receiver's comm ID is ours; its sender's must be the peer's (once
// known) and its source address the peer's. Anything else is nil and
// counted.
// +checklocks:m.mu
func (m *Manager) connOfLocked(src netip.Addr, ids rocewire.CommIDs, remoteKnown bool) *conn {
	c := m.byID[ids.Remote]
	if c == nil || c.peer != src || remoteKnown && c.remoteID != ids.Local {
		m.ctr.Dropped.Add(1)
		return nil
	}
	return c
}

// req is a REQ: a new connection served on a goroutine of its own, or a
// resent one answered as before.
func (m *Manager) req(src netip.Addr, mad rocewire.MAD) {
	var r rocewire.REQ
	if err := r.Read(mad); err != nil || r.TransportType != 0 || r.LocalQPN < 2 {
		m.ctr.Dropped.Add(1) // RDMA CM connects RC QPs only
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.byRemote[remoteKey{src, r.LocalCommID}]; c != nil {
		m.ctr.Duplicates.Add(1)
		if c.st == mraSent || c.st == repSent || c.st == timewaitSt && c.rejected {
			m.send(c.peer, c.mad[:]) // its MRA, REP or REJ again
		}
		return
	}
	ps, port, ok := rocewire.ServicePort(r.ServiceID)
	hdr, herr := rocewire.ReadCMAHeader(r.PrivateData[:])
	c := m.newConnLocked(src)
	if c == nil {
		m.ctr.Dropped.Add(1)
		return
	}
	c.remoteID, c.peerQPN, c.tid, c.maxRetries = r.LocalCommID, r.LocalQPN, mad.TID(), int(r.MaxCMRetries)
	m.byRemote[remoteKey{src, c.remoteID}] = c
	if !ok || ps != rocewire.PortSpaceTCP || herr != nil {
		// Not RDMA CM's TCP port space with its IP header: no listener
		// can have it.
		m.rejectLocked(c, rocewire.MsgREQ, rocewire.RejInvalidServerID)
		m.toTimewaitLocked(c)
		return
	}
	c.st, c.canceled = reqRcvd, make(chan struct{})
	req := &Request{Peer: src, Port: port, QPN: r.LocalQPN, PSN: r.StartingPSN, MTU: 128 << r.PathMTU, AckTimeout: r.LocalAckTimeout,
		Header: hdr, PrivateData: append([]byte(nil), r.PrivateData[rocewire.CMAHeaderLen:]...), Canceled: c.canceled}
	// The dialer resends its REQ after its response timeout: an accept
	// that takes half of it gets an MRA first (serve).
	mraAfter := Duration(r.RemoteCMRespTimeout) / 2
	repWait := Duration(r.LocalCMRespTimeout) + 2*packetLife
	go m.serve(c, req, mraAfter, repWait)
}

// serve answers c's REQ with what Config.Serve says: a REP, awaiting the
// RTU within repWait, or a REJ; an MRA first if the answer takes longer
// than mraAfter.
func (m *Manager) serve(c *conn, req *Request, mraAfter, repWait time.Duration) {
	mra := time.AfterFunc(mraAfter, func() { m.sendMRA(c) })
	acc, err := m.cfg.Serve(req)
	mra.Stop()
	m.mu.Lock()
	if m.byID[c.localID] != c || c.st != reqRcvd && c.st != mraSent {
		// The dialer gave up (its REJ) while the listener answered.
		m.mu.Unlock()
		if err == nil {
			m.cfg.Failed(acc.QPN, req.QPN, req.GID(), rocewire.RejTimeout)
		}
		return
	}
	if err != nil {
		reason := uint16(rocewire.RejConsumer)
		if ae := (*abi.Error)(nil); errors.As(err, &ae) && ae.Reject != nil {
			reason = ae.Reject.Reason
		}
		m.log.Info("RDMA CM: connection request refused", "peer", req.Peer.String(), "port", req.Port, "reason", reason, "err", err)
		m.rejectLocked(c, rocewire.MsgREQ, reason)
		m.toTimewaitLocked(c)
		m.mu.Unlock()
		return
	}
	c.st, c.qpn = repSent, acc.QPN
	if old := m.byQPN[acc.QPN]; old != nil && old != c {
		m.forgetLocked(old)
	}
	m.byQPN[acc.QPN] = c
	rep := rocewire.REP{LocalCommID: c.localID, RemoteCommID: c.remoteID, LocalQPN: acc.QPN, StartingPSN: acc.PSN,
		ResponderResources: abi.MaxRdAtom, InitiatorDepth: abi.MaxRdAtom, RNRRetryCount: abi.DefaultRNRRetry, LocalCAGUID: m.caGUID()}
	copy(rep.PrivateData[:], acc.PrivateData)
	mad := rocewire.MAD(c.mad[:])
	mad.EncodeCM(c.tid, rocewire.AttrREP)
	rep.Put(mad)
	m.sendAwaitingLocked(c, repWait)
	m.mu.Unlock()
}

// sendMRA tells c's dialer that its REQ's answer takes longer (an MRA),
// and keeps it to answer a resent REQ with.
func (m *Manager) sendMRA(c *conn) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID[c.localID] != c || c.st != reqRcvd {
		return
	}
	c.st = mraSent
	mad := rocewire.MAD(c.mad[:])
	mad.EncodeCM(c.tid, rocewire.AttrMRA)
	(&rocewire.MRA{CommIDs: rocewire.CommIDs{Local: c.localID, Remote: c.remoteID}, MessageMRAed: rocewire.MsgREQ, ServiceTimeout: mraServiceTimeout}).Put(mad)
	m.send(c.peer, c.mad[:])
}

// rep is a REP to a REQ of ours: the dialer goes on (Dial returns), or,
// resent after our RTU, gets that RTU again.
func (m *Manager) rep(src netip.Addr, mad rocewire.MAD) {
	var r rocewire.REP
	r.Read(mad)
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.connOfLocked(src, rocewire.CommIDs{Local: r.LocalCommID, Remote: r.RemoteCommID}, false)
	switch {
	case c == nil:
	case c.st == reqSent || c.st == mraRcvd:
		if r.LocalQPN < 2 {
			m.ctr.Dropped.Add(1)
			return
		}
		m.stopLocked(c)
		c.st, c.remoteID, c.peerQPN = repRcvd, r.LocalCommID, r.LocalQPN
		m.byRemote[remoteKey{src, c.remoteID}] = c
		c.done <- dialResult{rep: r}
	case c.remoteID != r.LocalCommID:
		m.ctr.Dropped.Add(1)
	case c.st == established:
		m.ctr.Duplicates.Add(1)
		m.sendRTULocked(c)
	case c.st == repRcvd:
		m.ctr.Duplicates.Add(1)
	default:
		m.ctr.Dropped.Add(1)
	}
}

// rtu is the RTU of a dialer whose REQ we answered: the connection is
// established.
func (m *Manager) rtu(src netip.Addr, mad rocewire.MAD) {
	var r rocewire.RTU
	r.Read(mad)
	m.mu.Lock()
	c := m.connOfLocked(src, r.CommIDs, true)
	if c == nil || c.st != repSent {
		if c != nil {
			m.ctr.Duplicates.Add(1)
		}
		m.mu.Unlock()
		return
	}
	m.stopLocked(c)
	c.st = established
	qpn, peerQPN := c.qpn, c.peerQPN
	m.mu.Unlock()
	m.cfg.Established(qpn, peerQPN, gidOf(src))
}

// rej is a REJ: of our REQ (Dial fails with its reason), of our REP (the
// accepted connection fails), or the dialer's giving up on a REQ being
// served.
func (m *Manager) rej(src netip.Addr, mad rocewire.MAD) {
	var r rocewire.REJ
	if r.Read(mad) != nil {
		m.ctr.Dropped.Add(1)
		return
	}
	m.mu.Lock()
	c := m.connOfLocked(src, r.CommIDs, false)
	var gone func()
	switch {
	case c == nil:
	case c.st == reqSent || c.st == mraRcvd:
		if r.MessageRejected != rocewire.MsgREQ {
			m.ctr.Dropped.Add(1)
			break
		}
		m.forgetLocked(c)
		c.done <- dialResult{err: refused(src, r)}
	case c.remoteID != r.Local:
		m.ctr.Dropped.Add(1)
	case c.st == reqRcvd || c.st == mraSent:
		close(c.canceled)
		m.toTimewaitLocked(c)
	case c.st == repSent:
		m.toTimewaitLocked(c)
		qpn, peerQPN, reason := c.qpn, c.peerQPN, max(r.Reason, 1)
		gone = func() { m.cfg.Failed(qpn, peerQPN, gidOf(src), reason) }
	case c.st == established:
		m.toTimewaitLocked(c)
		qpn, peerQPN := c.qpn, c.peerQPN
		gone = func() { m.cfg.Gone(qpn, peerQPN, gidOf(src)) }
	default:
		m.ctr.Duplicates.Add(1)
	}
	m.mu.Unlock()
	if gone != nil {
		gone()
	}
}

// refused is a dialer's error for REJ r from peer.
func refused(peer netip.Addr, r rocewire.REJ) error {
	e := abi.Errorf(abi.CodeRefused, "", "RDMA CM: %s rejected the connection request (IBTA reason %d)", peer, r.Reason)
	e.Reject = &abi.RejectInfo{Reason: r.Reason, PrivateData: append([]byte(nil), r.PrivateData[:abi.MaxPrivateDataREJ]...)}
	if r.Reason == rocewire.RejInvalidServerID {
		e.Field = "port"
	}
	return e
}

// mra is an MRA: the listener (of our REQ) or the dialer (of our REP)
// needs more time; the message is not resent within its service timeout.
func (m *Manager) mra(src netip.Addr, mad rocewire.MAD) {
	var r rocewire.MRA
	if r.Read(mad) != nil {
		m.ctr.Dropped.Add(1)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.connOfLocked(src, r.CommIDs, false)
	switch {
	case c == nil:
	case (c.st == reqSent || c.st == mraRcvd) && r.MessageMRAed == rocewire.MsgREQ:
		if c.st == reqSent {
			c.remoteID = r.Local
		}
		c.st = mraRcvd
		m.armLocked(c, Duration(r.ServiceTimeout)+Duration(m.cfg.ResponseTimeout))
	case c.st == repSent && r.MessageMRAed == rocewire.MsgREP && c.remoteID == r.Local:
		c.left = c.maxRetries
		m.armLocked(c, Duration(r.ServiceTimeout)+c.timeout)
	default:
		m.ctr.Dropped.Add(1)
	}
}

// dreq is the peer's DREQ: the connection ends (Config.Gone) and gets its
// DREP; a DREQ for a connection already closed or unknown gets one too,
// as its first DREP may have been lost.
func (m *Manager) dreq(src netip.Addr, mad rocewire.MAD) {
	var r rocewire.DREQ
	r.Read(mad)
	m.mu.Lock()
	c := m.byID[r.Remote]
	var gone func()
	switch {
	case c == nil || c.peer != src:
		m.ctr.Dropped.Add(1)
	case c.remoteID != r.Local || c.qpn != r.RemoteQPN:
		m.ctr.Dropped.Add(1)
		c = nil
	case c.st == established || c.st == repSent || c.st == repRcvd || c.st == dreqSent:
		qpn, peerQPN := c.qpn, c.peerQPN
		if c.st != dreqSent {
			gone = func() { m.cfg.Gone(qpn, peerQPN, gidOf(src)) }
		}
		m.toTimewaitLocked(c)
	case c.st == timewaitSt:
		m.ctr.Duplicates.Add(1)
	default:
		m.ctr.Dropped.Add(1)
		c = nil
	}
	if c != nil || m.byID[r.Remote] == nil {
		// The DREP, to a DREQ of a connection we know or no longer know.
		var b [rocewire.MADLen]byte
		dm := rocewire.MAD(b[:])
		dm.EncodeCM(mad.TID(), rocewire.AttrDREP)
		(&rocewire.DREP{CommIDs: rocewire.CommIDs{Local: r.Remote, Remote: r.Local}}).Put(dm)
		m.send(src, b[:])
	}
	m.mu.Unlock()
	if gone != nil {
		gone()
	}
}

// drep is the DREP of our DREQ: the connection is closed.
func (m *Manager) drep(src netip.Addr, mad rocewire.MAD) {
	var r rocewire.DREP
	r.Read(mad)
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.connOfLocked(src, r.CommIDs, true)
	switch {
	case c == nil:
	case c.st == dreqSent:
		m.stopLocked(c)
		m.toTimewaitLocked(c)
	default:
		m.ctr.Duplicates.Add(1)
	}
}
