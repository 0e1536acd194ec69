// SPDX-License-Identifier: Apache-2.0

package tcp

// The tcp path's requester: the RC engine (internal/rc/requester) over
// this path's frames. The engine, on the QP's send-queue goroutine, keeps
// the window of requests in flight (requester.Window), one PSN per WR,
// the fence and max_rd_atomic gates, go-back-N, the retry and RNR budgets
// and the poll-then-sleep wait, and completes WRs in order. This file is
// the Wire under it:
//
//   - Send writes each WR as one frame, a call on the connection (its tag
//     finds the call when the response comes); Flush writes a batch of
//     them (at most txBatchBytes of payload) in one writev.
//   - The connection's reader goroutine (readResponses) stores each
//     response in its call — a READ's data straight into the WR's local
//     buffers — signals it and pokes the QP (wakeCh). Collect, on the QP
//     goroutine, turns the signalled calls into the engine's upcalls from
//     the oldest, in order: OK (Ack, ReadLanded, AtomicAck), RNR and
//     SEQ_ERR (go back: after the RNR delay only the oldest goes out
//     until it is accepted, ProbeAfterRNR), REM_ACCESS_ERR, REM_OP_ERR and
//     REM_INV_REQ_ERR (the WR ends with it, the QP moves to ERR), NO_QP
//     or a lost connection (Lost: a transport retry after the timeout).
//   - Recall withdraws a call the engine sends again or completes: a
//     response that comes later is dropped.
//   - Timeout is the slow-peer rule: a request whose connection still
//     makes progress, or whose peer's kernel still acknowledges it, is
//     waited for again (slowPeerLimit); otherwise the connection is
//     closed, its calls fail and Collect reports Lost. On the lossy test
//     link a missing response is a loss: go back at once.
//
// A duplicate that reaches the responder (a response was lost, not the
// request) is answered as the first time (an atomic from the responder
// resources, rc.Seq) and never executed twice.

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/rc/requester"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// txWindow is how many requests a QP keeps in flight on the tcp path.
const txWindow = requester.Window

// txSlot is the wire's state of one window entry (requester.Entry.Index).
type txSlot struct {
	call  *hostlink.Call
	conn  *hostlink.Conn          // the connection its call waits on; nil when not in flight
	sent  time.Time               // when it was sent, or last found waiting on a live peer (the real clock)
	first time.Time               // when it was sent
	hdr   [tcpwire.HeaderLen]byte // its frame header, as last sent
	// its STRIPE frames' headers, when it was striped (lanes i+1)
	lhdr [tcpwire.MaxLanes - 1][tcpwire.HeaderLen]byte
}

// responsePoll is how long a requester with a request in flight polls for
// its response before it sleeps: a response due soon (the ACK of a WRITE,
// a READ's data) then costs no sleep and wake-up of a thread. That is the
// only polling of the tcp path in doorbell mode: its QP goroutine sleeps
// at once when the send queue is empty (PollBudget 0), and its reader in
// the network poller between frames. Polling where nothing is due helped
// programs that yield their CPU (vrdmactl perf) and cost programs that
// busy-wait without yielding (perftest's ib_write_lat spins on its
// buffer): a poller that yields gives its CPU to such a spinner until the
// next tick. Measured on two vCPUs, quickstart --keep's tcp pair,
// alternating rounds (docs/PERF-LOG.md): 8-byte write latency, typical,
// perftest 134 µs with every poller and 60 µs with none; in another
// session, 88–104 µs with every poller, 98–101 with none, 55–84 with this
// one alone (vrdmactl perf 113–129, 107–127, 78–93).
const responsePoll = 200 * time.Microsecond

// txBatchBytes bounds the payload of one batch of frames: a connection's
// write lock is not held for too long.
const txBatchBytes = 1 << 20

// errNoConn stops a batch whose connection could not be had.
var errNoConn = errors.New("no connection")

// tcpPath is the tcp path of one QP: its requester (the engine over this
// file's wire) and the link to the remote end's host, and its responder's
// PSN state. It is made when the QP enters RTR and dropped at RESET.
type tcpPath struct {
	q        device.Source
	host     string         // the remote end's host ID
	link     *hostlink.Peer // the link to host
	pathKind abi.PathKind

	rq *requester.Engine

	// The wire's state: owned by the QP's send-queue goroutine.
	slots [txWindow]txSlot
	treq  tcpwire.Header // the request being written
	iov   net.Buffers    // the frames of one batch, for one writev
	bconn *hostlink.Conn // the batch's connection, nil before its first frame
	bn    uint64         // the batch's bytes
	bq    []int          // the batch's entries (slots)
	bfail requester.Outcome
	// The batch's stripes on each lane of bconn (lanes[i-1]: lane i),
	// made at the first striped request; striped says the batch has some.
	// blanes is how many of bconn's connections the batch may stripe
	// over, read once per batch: lanes join a connection after it opened
	// (hostlink's openLanes), and a batch's requests and its write must
	// agree on them.
	lanes   [tcpwire.MaxLanes - 1]*hostlink.LaneBatch
	striped bool
	blanes  int

	// Responder: the expected PSN and the last responses, for duplicates
	// (a request retried after its response was lost), used by the
	// readers of the connections host opened. rsp.mu is taken before q.mu.
	rsp responderPSN
}

// responderPSN is an RC responder's sequence state (responder.go).
type responderPSN struct {
	mu  sync.Mutex
	seq device.ResponderSeq // +checklocks:mu
}

// tcpBinding is a request's requester as the tcp responder knows it: QP
// qpn of the connection's peer host.
type tcpBinding struct {
	host string
	qpn  uint32
	uc   bool // a UC request (a UC frame)
}

// Bound makes b a device.Binding: p is connected over the tcp path to
// QP b.qpn of host b.host, and of the request's transport (RC, UC).
func (b *tcpBinding) Bound(p device.Target) bool {
	tp := tcpPathOf(p)
	return tp != nil && tp.host == b.host && (p.Type() == abi.QPTypeUC) == b.uc && p.RCAttrs().RemoteQPN == b.qpn
}

func newTCPPath(q device.Source, l *hostlink.Peer, kind abi.PathKind) *tcpPath {
	t := &tcpPath{q: q, host: l.ID(), link: l, pathKind: kind}
	for i := range t.slots {
		t.slots[i].call = hostlink.NewCall(q.WakeCh())
	}
	t.iov = make(net.Buffers, 0, txWindow*(abi.MaxSGE+1))
	t.bq = make([]int, 0, txWindow)
	t.rq = requester.New(q, (*txWire)(t), requester.Config{
		BatchBytes:    txBatchBytes,
		ProbeAfterRNR: true,
		Poll:          responsePoll,
	})
	return t
}

// tcpPathOf returns q's tcp path, nil if q is not bound to one.
func tcpPathOf(q device.Target) *tcpPath {
	t, _ := q.BoundPath().(*tcpPath)
	return t
}

// Kind, Pump, Busy, Drop, Flush, PollBudget and Status make t a
// device.Path that reports what it has in flight.

var _ device.PathStatuser = (*tcpPath)(nil)

func (t *tcpPath) Kind() abi.PathKind        { return t.pathKind }
func (t *tcpPath) Pump()                     { t.rq.Pump() }
func (t *tcpPath) Busy() bool                { return t.rq.Busy() }
func (t *tcpPath) Drop()                     { t.rq.Drop() }
func (t *tcpPath) Flush()                    { t.rq.Flush() }
func (t *tcpPath) PollBudget() time.Duration { return 0 }
func (t *tcpPath) Status(st *mgmt.QPStatus)  { st.InFlight = t.rq.InFlight() }

// txWire is the tcp path as the requester engine's Wire. Its methods run
// on the QP's send-queue goroutine.
type txWire tcpPath

var _ requester.Wire = (*txWire)(nil)

// Send adds e's frame to the batch, registering its call on the batch's
// connection (had at the batch's first frame).
func (w *txWire) Send(e *requester.Entry, _, _ uint32, at *device.RCAttrs) error {
	t := (*tcpPath)(w)
	q := t.q
	if t.bfail != requester.Sent {
		return errNoConn
	}
	if t.bconn == nil {
		wait := rc.LocalACKTimeout(at.Timeout)
		if t.link == nil || !q.PortUp() {
			t.bfail = requester.Failed // no link, or the port is down
			return errNoConn
		}
		start := time.Now()
		c, err := t.link.Conn(wait)
		if err != nil {
			t.bfail = requester.Failed
			if time.Since(start) >= wait {
				t.bfail = requester.FailedWaited
			}
			return err
		}
		t.bconn, t.bn, t.blanes = c, 0, c.Lanes()
		t.iov, t.bq = t.iov[:0], t.bq[:0]
	}
	c := t.bconn
	if at.UC {
		t.sendUC(c, e, at)
		return nil
	}
	s := &t.slots[e.Index]
	w.Recall(e)
	wq := &e.WQE
	h := &t.treq
	*h = tcpwire.Header{Version: c.Version(), Type: reqTypes[wq.Opcode], DstQPN: at.RemoteQPN, SrcQPN: q.QPN(), PSN: e.PSN, RKey: wq.RKey,
		RemoteAddr: wq.RemoteAddr, Compare: wq.CompareAdd, Swap: wq.Swap, Flags: tcpwire.SolicitedOf(wq.Opcode.CarriesEvent(), wq.Flags&abi.SendSolicited != 0)}
	if at.XRC {
		h.SetXRC(wq.XRCSRQN)
	}
	k := s.call
	k.ReadSegs = nil
	var pay [][]byte
	switch wq.Opcode {
	case abi.OpRDMAWrite, abi.OpSend:
		pay, h.PayloadLen = e.Segs[:e.NSeg], uint32(e.Total)
	case abi.OpSendWithInv:
		pay, h.PayloadLen, h.RKey = e.Segs[:e.NSeg], uint32(e.Total), wq.InvalidateRKey()
	case abi.OpRDMAWriteWithImm, abi.OpSendWithImm:
		pay, h.PayloadLen, h.ImmOrLen = e.Segs[:e.NSeg], uint32(e.Total), wq.Imm
	case abi.OpRDMARead:
		h.ImmOrLen = uint32(e.Total)
		k.ReadSegs = e.Segs[:e.NSeg]
	}
	striped, stripe := false, e.Total
	if lanes := t.blanes; lanes > 1 && pay != nil {
		stripe = tcpwire.StripeSize(e.Total, lanes, c.StripeMin())
		striped = stripe < e.Total
	}
	if !c.Register(k) {
		t.bfail = requester.Failed
		return errNoConn
	}
	s.conn = c
	t.bq = append(t.bq, e.Index)
	h.Tag = k.Tag()
	if striped {
		h.Flags |= tcpwire.FlagStriped
		h.Compare, h.PayloadLen = e.Total, uint32(stripe)
	}
	h.Put(s.hdr[:])
	t.iov = append(t.iov, s.hdr[:])
	t.bn += tcpwire.HeaderLen
	if h.Striped() {
		t.stripe(s, h, pay)
		return nil
	}
	for _, p := range pay {
		if len(p) > 0 {
			t.iov = append(t.iov, p)
			t.bn += uint64(len(p))
		}
	}
	return nil
}

// stripe adds striped request h (slot s, payload pay) to the batch: its
// first stripe after its header, stripe i on lane i of the batch's
// connection (StripeSize cut it into no more stripes than it has lanes).
func (t *tcpPath) stripe(s *txSlot, h *tcpwire.Header, pay [][]byte) {
	if t.lanes[0] == nil {
		for i := range t.lanes {
			t.lanes[i] = hostlink.NewLaneBatch()
		}
	}
	t.striped = true
	_, n := h.StripeAt(0)
	t.iov = appendRange(t.iov, pay, 0, n)
	t.bn += n
	for i := 1; i < h.StripeCount(); i++ {
		off, n := h.StripeAt(i)
		sh := tcpwire.Header{Version: h.Version, Type: tcpwire.Stripe, Tag: h.Tag, DstQPN: h.DstQPN, SrcQPN: h.SrcQPN, PSN: h.PSN,
			RemoteAddr: off, PayloadLen: uint32(n)}
		sh.Put(s.lhdr[i-1][:])
		b := t.lanes[i-1]
		b.Iov = append(b.Iov, s.lhdr[i-1][:])
		b.Iov = appendRange(b.Iov, pay, off, n)
		b.N += tcpwire.HeaderLen + n
		b.Frames++
	}
}

// appendRange appends the bytes [off, off+n) of the payload segments
// segs to iov, as slices of them.
func appendRange(iov net.Buffers, segs [][]byte, off, n uint64) net.Buffers {
	for _, p := range segs {
		if n == 0 {
			break
		}
		if off >= uint64(len(p)) {
			off -= uint64(len(p))
			continue
		}
		k := min(uint64(len(p))-off, n)
		iov = append(iov, p[off:off+k])
		off, n = 0, n-k
	}
	return iov
}

// Flush writes the batch in one writev; when it cannot (no connection, a
// write error) it withdraws the batch's calls: nothing of it is in flight.
func (w *txWire) Flush() requester.Outcome {
	t := (*tcpPath)(w)
	o, c := t.bfail, t.bconn
	t.bfail, t.bconn = requester.Sent, nil
	if o == requester.Sent && c != nil {
		var err error
		if t.striped {
			err = c.WriteStriped(&t.iov, t.bn, len(t.bq), t.lanes[:t.blanes-1])
		} else {
			err = c.WriteFrames(&t.iov, t.bn, len(t.bq))
		}
		if err != nil {
			o = requester.Failed
		}
	}
	if c != nil {
		clear(t.iov[:cap(t.iov)]) // do not keep guest memory reachable
		t.iov = t.iov[:0]
		if t.striped {
			for _, b := range t.lanes {
				clear(b.Iov[:cap(b.Iov)])
				b.Iov, b.N, b.Frames = b.Iov[:0], 0, 0
			}
		}
	}
	t.striped = false
	if o != requester.Sent {
		for _, i := range t.bq {
			if s := &t.slots[i]; s.conn != nil {
				s.conn.Recall(s.call)
				s.conn = nil
			}
		}
	} else {
		now := time.Now()
		for _, i := range t.bq {
			t.slots[i].sent, t.slots[i].first = now, now
		}
	}
	t.bq = t.bq[:0]
	return o
}

// Collect turns the signalled calls, from the oldest entry in flight, into
// the engine's upcalls; it stops at the first call still waiting, and
// after a response that asks for a go-back.
func (w *txWire) Collect() {
	t := (*tcpPath)(w)
	r := t.rq
	for i := 0; i < r.Len(); i++ {
		e := r.At(i)
		s := &t.slots[e.Index]
		if s.conn == nil {
			continue // settled, or not in flight
		}
		k := s.call
		select {
		case <-k.Done:
		default:
			return
		}
		c := s.conn
		s.conn = nil
		if k.Err != nil {
			r.Lost()
			return
		}
		resp := &k.Resp
		op := e.WQE.Opcode
		want := tcpwire.Ack
		if op == abi.OpRDMARead {
			want = tcpwire.ReadResp
		}
		if resp.Type != want || resp.Status == tcpwire.OK && resp.Type == tcpwire.ReadResp && uint64(resp.PayloadLen) != e.Total {
			c.Close(fmt.Errorf("host %s answered a %s with a %s of %d bytes", c.PeerID(), op, resp.Type, resp.PayloadLen))
			r.Lost()
			return
		}
		switch resp.Status {
		case tcpwire.OK:
			switch {
			case op == abi.OpRDMARead:
				r.ReadLanded(e.PSN)
			case op.IsAtomic():
				r.AtomicAck(e.PSN, resp.Compare)
			default:
				r.Ack(e.PSN)
			}
		case tcpwire.RNR:
			r.Nak(e.PSN, rc.NAKRNR, resp.RNRTimer)
			return
		case tcpwire.RemAccessErr, tcpwire.RemOpErr, tcpwire.RemInvReqErr:
			r.Nak(e.PSN, wireNAK(resp.Status), 0)
			return
		case tcpwire.SeqErr:
			// The responder expects an earlier PSN: a request before
			// this one was lost or overtaken. Go back to it at once, as
			// IBTA's requester does on a PSN sequence error NAK.
			r.Nak(e.PSN, rc.NAKSeqErr, 0)
			return
		default: // NO_QP: as if nothing had answered
			r.Lost()
			return
		}
	}
}

// Recall withdraws e's call, if it waits on a connection.
func (w *txWire) Recall(e *requester.Entry) {
	s := &w.slots[e.Index]
	if s.conn != nil {
		s.conn.Recall(s.call)
		s.conn = nil
	}
}

// Timeout is the slow-peer rule (see the file's comment). A timeout with
// no read progress on the connection since the request went out closes
// the connection: the peer or the link is gone.
func (w *txWire) Timeout(e *requester.Entry) requester.Verdict {
	t := (*tcpPath)(w)
	s := &t.slots[e.Index]
	if s.conn == nil {
		return requester.GoBack // answered with a sequence error the engine did not act on, or not sent
	}
	if len(s.call.Done) > 0 || !s.conn.Waiting(s.call) {
		// Answered (Collect takes it), or its response is arriving: a
		// READ's data being read into its buffers is not lost, however
		// long it takes, and going back would throw it away and queue
		// another copy behind it.
		return requester.WaitAgain
	}
	if t.link.Lossy() {
		// The request or its response was lost, not the connection:
		// go back to the oldest at once (the timeout is waited out).
		return requester.GoBack
	}
	c := s.conn
	wait := rc.LocalACKTimeout(t.q.RCAttrs().Timeout)
	if !c.ReadSince(s.sent) && (!c.PeerAcking(wait) || time.Since(s.first) > slowPeerLimit(wait)) {
		c.Close(fmt.Errorf("no response from host %s in %v: link or peer down", c.PeerID(), wait))
		return requester.WaitAgain // the call fails: Collect reports Lost
	}
	// The connection makes progress (other responses flow), or the peer's
	// kernel acknowledges what was sent (its agent is slow: a loaded host,
	// a deep queue on the connection): the response comes behind them;
	// wait again.
	s.sent = time.Now()
	return requester.WaitAgain
}

// slowPeerLimit bounds how long a requester waits for a response from a
// peer whose kernel acknowledges what was sent (peerAcking) while no
// response comes: a peer host that died after acknowledging the request
// looks the same, so this is how long its death may go unnoticed.
func slowPeerLimit(wait time.Duration) time.Duration { return max(time.Second, 8*wait) }
