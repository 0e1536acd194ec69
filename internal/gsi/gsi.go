// SPDX-License-Identifier: Apache-2.0

// Package gsi is RDMA CM over QP1, the General Services Interface, with
// RoCE peers that are not vrdma hosts (native endpoints): the CM MADs
// (package rocewire, cm.go) a kernel RoCE device exchanges to connect RC
// QPs by IP address and port, and the state machine of the InfiniBand
// Architecture Specification's chapter 12 that drives them. A dialer
// sends a REQ and waits for a REP (or REJ, or an MRA that asks it to wait
// longer), then sends an RTU; a listener's side answers a REQ with a REP
// (an MRA first when its application is slow to accept, a REJ when it
// refuses or nothing listens) and waits for the RTU. A connection ends
// with a DREQ answered by a DREP. Every message that expects an answer is
// resent when its timeout passes — the REQ's CM response timeouts, 4.096
// µs × 2^n — at most the REQ's Max CM Retries times; then the connection
// fails (UNREACHABLE to a dialer; a REJ with reason Timeout to a dialer
// that never sent its RTU).
//
// A Manager serves one RoCE endpoint (an agent's uplink engine): Receive
// takes every MAD to QP1, Dial connects, Ready and Disconnect go on with
// a dialed or accepted connection; Config says how MADs leave and how a
// REQ finds its listener. A MAD that is malformed, of an attribute RDMA
// CM does not use, for no connection, from another address than the
// connection's peer, or out of its connection's state is dropped and
// counted (Counters); nothing a peer sends makes it panic or grow beyond
// MaxConns connections.
package gsi

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// Defaults of the CM timing fields of the REQs a Manager sends, as
// Linux's rdma_cm sends them (CMA_CM_RESPONSE_TIMEOUT, CMA_MAX_CM_RETRIES,
// and the service timeout of its MRA, CMA_CM_MRA_SETTING).
const (
	DefaultResponseTimeout = 20 // 4.096 µs × 2^20: about 4.3 s
	DefaultMaxRetries      = 15
	mraServiceTimeout      = 24 // about 69 s
)

// MaxConns bounds the connections a Manager follows at once (including
// those in their time wait); a REQ beyond it is dropped and counted.
const MaxConns = 4096

// timewait is how long a closed connection's IDs are kept to answer its
// peer's resent DREQ, REJ or REP.
const timewait = 2 * time.Second

// Config configures a Manager.
type Config struct {
	// Send sends mad (rocewire.MADLen bytes, valid during the call) from
	// QP1 to QP1 of the RoCE endpoint at peer (an unmapped address).
	Send func(peer netip.Addr, mad []byte)
	// Local is this endpoint's address (unmapped): the GID its REQs and
	// REPs name, and the source of the IP CM header.
	Local netip.Addr
	// Serve finds the listener of a peer's REQ and waits for its
	// answer: the accepting QP, its PSN and the REP's private data; or
	// an error, a REJ (an abi.Error with a Reject says its reason,
	// else the listener refused: RejConsumer). It returns when r.Canceled
	// is closed (the dialer gave up) too. It runs on a goroutine of its
	// own per REQ.
	Serve func(r *Request) (Accepted, error)
	// Established tells of an accepted connection's RTU: this side's QP
	// qpn faces the peer's QP peerQPN at peerGID.
	Established func(qpn, peerQPN uint32, peerGID abi.GID)
	// Gone tells that the peer of this side's QP qpn ended the
	// connection (a DREQ, or a REJ once established).
	Gone func(qpn, peerQPN uint32, peerGID abi.GID)
	// Failed tells that an accepted connection failed before its RTU:
	// reason 0 when the RTU never came (the REP's retries ran out), else
	// the reason of the dialer's REJ.
	Failed func(qpn, peerQPN uint32, peerGID abi.GID, reason uint16)
	// ResponseTimeout and MaxRetries are the REQs' CM response timeouts
	// (both, 5-bit codes) and Max CM Retries (4 bits); zero: the
	// defaults.
	ResponseTimeout, MaxRetries uint8
	Log                         *slog.Logger
}

// Request is a peer's REQ, for Config.Serve.
type Request struct {
	Peer        netip.Addr         // the sender's address (unmapped)
	Port        uint16             // the TCP port its service ID names
	QPN, PSN    uint32             // its QP and that QP's starting PSN
	MTU         uint32             // the path MTU in bytes
	AckTimeout  uint8              // its local ACK timeout
	Header      rocewire.CMAHeader // its IP CM header
	PrivateData []byte             // the application's private data (after the header)
	// Canceled is closed when the dialer gives up (its REJ).
	Canceled <-chan struct{}
}

// GID is the peer's GID (its address, IPv4-mapped for IPv4).
func (r *Request) GID() abi.GID { return gidOf(r.Peer) }

// Accepted is a listener's answer to a REQ: its QP, in RTS facing the
// dialer or moved by its workload, the PSN it sends from, and the REP's
// private data.
type Accepted struct {
	QPN, PSN    uint32
	PrivateData []byte
}

// Counters count a Manager's MADs.
type Counters struct {
	In, Out atomic.Uint64
	// Dropped: malformed, an attribute RDMA CM does not use, for no
	// connection, from another address than its connection's peer, or
	// out of its state.
	Dropped atomic.Uint64
	// Duplicates: a message again (resent by the peer), answered as the
	// first was when it called for an answer.
	Duplicates atomic.Uint64
	// Resent: messages resent after their timeout; TimedOut: connections
	// that failed after the last resend.
	Resent, TimedOut atomic.Uint64
	// Rejected: REJs sent (no listener, a refusal, a timeout).
	Rejected atomic.Uint64
}

// state is a connection's CM state (IBTA 12.9).
type state uint8

const (
	reqSent     state = iota // dialer: REQ out, waiting for REP
	mraRcvd                  // dialer: the listener asked for more time
	repRcvd                  // dialer: REP in, RTU not yet sent
	reqRcvd                  // listener: serving the REQ
	mraSent                  // listener: serving, MRA sent
	repSent                  // listener: REP out, waiting for RTU
	established              //
	dreqSent                 // DREQ out, waiting for DREP
	timewaitSt               // closed; IDs kept to answer resends
)

// conn is one connection's CM state.
type conn struct {
	localID, remoteID uint32
	peer              netip.Addr
	qpn, peerQPN      uint32
	st                state
	tid               uint64
	mad               [rocewire.MADLen]byte // the last message that awaits an answer, resent on the timer
	timer             *time.Timer
	gen               uint64 // the timer's: one that fires after it was replaced does nothing
	timeout           time.Duration
	left              int // resends left
	maxRetries        int
	// rejected: mad is the REJ this side sent, to send again to a resent
	// REQ (the first may have been lost).
	rejected bool
	// The dialer's outcome (REP, REJ or timeout): buffered 1.
	done chan dialResult
	// canceled is closed when the dialer gives up on a REQ being served.
	canceled chan struct{}
}

type dialResult struct {
	rep rocewire.REP
	err error
}

// Manager is RDMA CM over QP1 for one RoCE endpoint. It is safe for
// concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger
	ctr Counters

	mu       sync.Mutex
	byID     map[uint32]*conn    // +checklocks:mu
	byRemote map[remoteKey]*conn // +checklocks:mu
	byQPN    map[uint32]*conn    // +checklocks:mu
	tid      uint64              // +checklocks:mu
}

// remoteKey is a connection as its peer names it.
type remoteKey struct {
	peer netip.Addr
	id   uint32
}

// New returns a Manager of cfg.
func New(cfg Config) *Manager {
	if cfg.ResponseTimeout == 0 {
		cfg.ResponseTimeout = DefaultResponseTimeout
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = DefaultMaxRetries
	}
	cfg.ResponseTimeout &= 0x1f
	cfg.MaxRetries &= 0xf
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [8]byte
	rand.Read(b[:])
	return &Manager{cfg: cfg, log: log.With("component", "rdma-cm"), byID: map[uint32]*conn{}, byRemote: map[remoteKey]*conn{},
		byQPN: map[uint32]*conn{}, tid: binary.LittleEndian.Uint64(b[:]) &^ (1 << 63)}
}

// Counters returns the Manager's counters.
func (m *Manager) Counters() *Counters { return &m.ctr }

// Duration is a CM timeout code's time: 4.096 µs × 2^code.
func Duration(code uint8) time.Duration {
	return time.Duration(4096<<min(code, 31)) * time.Nanosecond
}

// gidOf is ip's GID.
func gidOf(ip netip.Addr) abi.GID { return abi.GID(ip.As16()) }

// caGUID is this endpoint's CA GUID: from its address, as only one of
// it is on the fabric.
func (m *Manager) caGUID() uint64 {
	g := m.cfg.Local.As16()
	return binary.BigEndian.Uint64(g[8:]) | 0x0200000000000000
}

// newConnLocked makes a connection with a fresh local comm ID; nil when
// MaxConns are followed.
// +checklocks:m.mu
func (m *Manager) newConnLocked(peer netip.Addr) *conn {
	if len(m.byID) >= MaxConns {
		return nil
	}
	c := &conn{peer: peer}
	for c.localID == 0 || m.byID[c.localID] != nil {
		var b [4]byte
		rand.Read(b[:])
		c.localID = binary.LittleEndian.Uint32(b[:])
	}
	m.byID[c.localID] = c
	return c
}

// nextTIDLocked is a fresh transaction ID.
// +checklocks:m.mu
func (m *Manager) nextTIDLocked() uint64 {
	m.tid++
	return m.tid
}

// send sends mad to peer.
func (m *Manager) send(peer netip.Addr, mad []byte) {
	m.ctr.Out.Add(1)
	m.cfg.Send(peer, mad)
}

// sendAwaitingLocked sends c.mad, which expects an answer within timeout,
// and arms c's timer to resend it, at most c.maxRetries times.
// +checklocks:m.mu
func (m *Manager) sendAwaitingLocked(c *conn, timeout time.Duration) {
	c.timeout, c.left = timeout, c.maxRetries
	m.armLocked(c, timeout)
	m.send(c.peer, c.mad[:])
}

// armLocked (re)starts c's timer.
// +checklocks:m.mu
func (m *Manager) armLocked(c *conn, d time.Duration) {
	if c.timer != nil {
		c.timer.Stop()
	}
	c.gen++
	gen := c.gen
	c.timer = time.AfterFunc(d, func() { m.expire(c, gen) })
}

// stopLocked stops c's timer.
// +checklocks:m.mu
func (m *Manager) stopLocked(c *conn) {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	c.gen++
}

// toTimewaitLocked closes c: its IDs stay known for timewait, to answer
// its peer's resends, then go.
// +checklocks:m.mu
func (m *Manager) toTimewaitLocked(c *conn) {
	if m.byQPN[c.qpn] == c {
		delete(m.byQPN, c.qpn)
	}
	c.st = timewaitSt
	m.armLocked(c, timewait)
}

// forgetLocked drops c.
// +checklocks:m.mu
func (m *Manager) forgetLocked(c *conn) {
	m.stopLocked(c)
	if m.byID[c.localID] == c {
		delete(m.byID, c.localID)
	}
	if k := (remoteKey{c.peer, c.remoteID}); m.byRemote[k] == c {
		delete(m.byRemote, k)
	}
	if m.byQPN[c.qpn] == c {
		delete(m.byQPN, c.qpn)
	}
}

// expire is c's timer: resend its message, or give up on it.
func (m *Manager) expire(c *conn, gen uint64) {
	m.mu.Lock()
	var gone func()
	switch {
	case m.byID[c.localID] != c || c.gen != gen:
	case c.st == timewaitSt:
		m.forgetLocked(c)
	case c.left > 0 && (c.st == reqSent || c.st == repSent || c.st == dreqSent):
		c.left--
		m.ctr.Resent.Add(1)
		m.armLocked(c, c.timeout)
		m.send(c.peer, c.mad[:])
	case c.st == reqSent || c.st == mraRcvd:
		m.ctr.TimedOut.Add(1)
		m.forgetLocked(c)
		c.done <- dialResult{err: abi.Errorf(abi.CodeUnavailable, "", "RDMA CM: no answer from %s to the connection request after %d retries (the peer is unreachable, or nothing answers on its QP1)", c.peer, c.maxRetries)}
	case c.st == repSent:
		// The dialer never sent its RTU: the connection fails, and the
		// dialer is told (IBTA 12.9.7: a REJ with reason Timeout).
		m.ctr.TimedOut.Add(1)
		m.rejectLocked(c, rocewire.MsgREP, rocewire.RejTimeout)
		m.toTimewaitLocked(c)
		qpn, peerQPN, peer := c.qpn, c.peerQPN, c.peer
		gone = func() { m.cfg.Failed(qpn, peerQPN, gidOf(peer), 0) }
	case c.st == dreqSent:
		m.ctr.TimedOut.Add(1)
		m.toTimewaitLocked(c)
	}
	m.mu.Unlock()
	if gone != nil {
		gone()
	}
}

// rejectLocked sends a REJ of message msg on c with reason.
// +checklocks:m.mu
// The REJ is kept in c.mad (c.rejected) to answer a resent REQ with; c
// leaves its state for time wait or goes.
func (m *Manager) rejectLocked(c *conn, msg uint8, reason uint16) {
	mad := rocewire.MAD(c.mad[:])
	mad.EncodeCM(c.tid, rocewire.AttrREJ)
	(&rocewire.REJ{CommIDs: rocewire.CommIDs{Local: c.localID, Remote: c.remoteID}, MessageRejected: msg, Reason: reason}).Put(mad)
	c.rejected = true
	m.ctr.Rejected.Add(1)
	m.send(c.peer, c.mad[:])
}

// ErrClosed is the error of a connection whose CM state is gone.
var ErrClosed = errors.New("RDMA CM: the connection is no longer known (closed, or timed out)")

// DialParams is a connect's REQ.
type DialParams struct {
	Peer        netip.Addr // the listener's address (unmapped)
	Port        uint16     // its TCP port
	SrcPort     uint16     // the IP CM header's source port
	QPN, PSN    uint32     // the dialing QP and its starting PSN
	MTU         uint32     // the path MTU in bytes
	AckTimeout  uint8      // the dialing QP's local ACK timeout
	PrivateData []byte     // at most abi.MaxPrivateDataREQ bytes
}

// Reply is a listener's REP, as Dial returns it.
type Reply struct {
	QPN, PSN    uint32 // the accepting QP and the PSN it sends from
	MTU         uint32 // the path MTU (the REQ's)
	PrivateData []byte
}

// mtuCode is the path MTU code of n bytes (256 … 4096), 0 for none.
func mtuCode(n uint32) uint8 {
	for c := uint8(1); c <= 5; c++ {
		if n == 128<<c {
			return c
		}
	}
	return 0
}

// Dial sends p's REQ and waits for its REP: it resends the REQ after each
// response timeout (longer after an MRA), fails with the REJ's reason
// (abi.CodeRefused, with abi.Error.Reject) or, after the last retry or
// when ctx ends, with abi.CodeUnavailable. After a Reply the caller
// brings its QP to RTS and calls Ready (or Fail).
func (m *Manager) Dial(ctx context.Context, p DialParams) (Reply, error) {
	code := mtuCode(p.MTU)
	if code == 0 || len(p.PrivateData) > rocewire.REQPrivateLen-rocewire.CMAHeaderLen {
		return Reply{}, abi.Errorf(abi.CodeInvalid, "", "RDMA CM: a path MTU of %d bytes or %d bytes of private data (at most %d) cannot go in a REQ", p.MTU, len(p.PrivateData), rocewire.REQPrivateLen-rocewire.CMAHeaderLen)
	}
	m.mu.Lock()
	if old := m.byQPN[p.QPN]; old != nil {
		m.forgetLocked(old)
	}
	c := m.newConnLocked(p.Peer)
	if c == nil {
		m.mu.Unlock()
		return Reply{}, abi.Errorf(abi.CodeLimit, "", "RDMA CM: %d connections are being set up or closed, the limit", MaxConns)
	}
	c.qpn, c.st, c.tid, c.maxRetries = p.QPN, reqSent, m.nextTIDLocked(), int(m.cfg.MaxRetries)
	c.done = make(chan dialResult, 1)
	m.byQPN[p.QPN] = c
	r := rocewire.REQ{LocalCommID: c.localID, ServiceID: rocewire.ServiceID(rocewire.PortSpaceTCP, p.Port), LocalCAGUID: m.caGUID(),
		LocalQPN: p.QPN, ResponderResources: abi.MaxRdAtom, InitiatorDepth: abi.MaxRdAtom, RemoteCMRespTimeout: m.cfg.ResponseTimeout,
		StartingPSN: p.PSN, LocalCMRespTimeout: m.cfg.ResponseTimeout, RetryCount: abi.DefaultRetryCnt, PKey: rocewire.DefaultPKey,
		PathMTU: code, RNRRetryCount: abi.DefaultRNRRetry, MaxCMRetries: m.cfg.MaxRetries, LocalGID: gidOf(m.cfg.Local),
		RemoteGID: gidOf(p.Peer), HopLimit: 64, LocalAckTimeout: p.AckTimeout}
	(&rocewire.CMAHeader{SrcPort: p.SrcPort, Src: m.cfg.Local, Dst: p.Peer}).Put(r.PrivateData[:])
	copy(r.PrivateData[rocewire.CMAHeaderLen:], p.PrivateData)
	mad := rocewire.MAD(c.mad[:])
	mad.EncodeCM(c.tid, rocewire.AttrREQ)
	r.Put(mad)
	// The listener's CM answers within its response time, after the
	// REQ's flight there and the REP's back.
	m.sendAwaitingLocked(c, Duration(m.cfg.ResponseTimeout)+2*packetLife)
	m.mu.Unlock()
	select {
	case res := <-c.done:
		if res.err != nil {
			return Reply{}, res.err
		}
		priv := res.rep.PrivateData[:]
		return Reply{QPN: res.rep.LocalQPN, PSN: res.rep.StartingPSN, MTU: p.MTU, PrivateData: priv[:abi.MaxPrivateDataREP]}, nil
	case <-ctx.Done():
		m.mu.Lock()
		if m.byID[c.localID] == c {
			switch c.st {
			case reqSent, mraRcvd:
				m.rejectLocked(c, rocewire.MsgREQ, rocewire.RejTimeout)
				m.forgetLocked(c)
			case repRcvd:
				m.rejectLocked(c, rocewire.MsgREP, rocewire.RejTimeout)
				m.toTimewaitLocked(c)
			}
		}
		m.mu.Unlock()
		return Reply{}, abi.Errorf(abi.CodeUnavailable, "", "RDMA CM: %s did not answer the connection request in time: %v", p.Peer, ctx.Err())
	}
}

// packetLife is the time a MAD takes on the fabric, each way, counted in
// a timeout (the path record's packet lifetime).
const packetLife = 10 * time.Millisecond

// Ready sends the RTU of QP qpn's dialed connection, now that its QP is in
// RTS (rdma_establish, for a workload that moves it itself).
func (m *Manager) Ready(qpn uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.byQPN[qpn]
	if c == nil || c.st != repRcvd {
		return ErrClosed
	}
	c.st = established
	m.sendRTULocked(c)
	return nil
}

// sendRTULocked sends c's RTU.
// +checklocks:m.mu
func (m *Manager) sendRTULocked(c *conn) {
	var b [rocewire.MADLen]byte
	mad := rocewire.MAD(b[:])
	mad.EncodeCM(c.tid, rocewire.AttrRTU)
	(&rocewire.RTU{CommIDs: rocewire.CommIDs{Local: c.localID, Remote: c.remoteID}}).Put(mad)
	m.send(c.peer, b[:])
}

// Fail refuses the REP of QP qpn's dialed connection (its QP could not
// take the REP's values): a REJ, and the connection is gone.
func (m *Manager) Fail(qpn uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.byQPN[qpn]; c != nil && c.st == repRcvd {
		m.rejectLocked(c, rocewire.MsgREP, rocewire.RejConsumer)
		m.toTimewaitLocked(c)
	}
}

// Disconnect sends the DREQ of QP qpn's connection, resent until its
// DREP comes or the retries run out; false when qpn has no connection
// here (not one to a native peer).
func (m *Manager) Disconnect(qpn uint32) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.byQPN[qpn]
	if c == nil {
		return false
	}
	switch c.st {
	case established, repRcvd, repSent:
		c.st, c.tid = dreqSent, m.nextTIDLocked()
		mad := rocewire.MAD(c.mad[:])
		mad.EncodeCM(c.tid, rocewire.AttrDREQ)
		(&rocewire.DREQ{CommIDs: rocewire.CommIDs{Local: c.localID, Remote: c.remoteID}, RemoteQPN: c.peerQPN}).Put(mad)
		m.sendAwaitingLocked(c, Duration(m.cfg.ResponseTimeout)+2*packetLife)
	default:
		m.toTimewaitLocked(c)
	}
	return true
}
