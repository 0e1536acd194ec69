// SPDX-License-Identifier: Apache-2.0

package device

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/sys"
)

// QP is a connected queue pair: RC, or UC (uc.go).
type QP struct {
	// onFatal, if set, is told when the agent moves the QP to ERR for an
	// error it detected (MoveToErr): the workload's async event.
	onFatal atomic.Pointer[func(why string)]
	// onLastWQE, if set, is told when the QP, on an SRQ, entered ERR and
	// takes no more WQEs from it (srq.go).
	onLastWQE atomic.Pointer[func()]
	// onEvent, if set, is told of the QP's IBV_EVENT_COMM_EST and
	// IBV_EVENT_SQ_DRAINED (abi.Event*), once per entry into RTR and SQD
	// (commEstDue, drainedDue).
	onEvent    atomic.Pointer[func(event int, why string)]
	commEstDue atomic.Bool
	drainedDue atomic.Bool

	handle uint32
	qpn    uint32
	vm     *Context
	pd     *PD
	ad     *Adapter
	sendCQ *CQ
	recvCQ *CQ
	srq    *SRQ // the shared receive queue receives come from; nil: the QP's own RQ
	// An XRC target QP's domain, and the process's handle of it the QP
	// was created through (xrc.go).
	xrcd *XRCD
	xh   *xrcdHandle
	// A target QP's opens by processes of the VM (OpenQP), and whether
	// its creator's handle is gone (orphaned) or it is being destroyed
	// (ending: no more opens).
	shareMu  sync.Mutex
	opens    []*QPOpen // +checklocks:shareMu
	orphaned bool      // +checklocks:shareMu
	ending   bool      // +checklocks:shareMu
	typ      abi.QPType
	qkey     atomic.Uint32 // a UD QP's Q_Key (ud.go); written under mu, read anywhere
	sqSigAll bool
	caps     abi.QPCaps
	layout   abi.QPLayout
	ringFD   sys.FD
	ring     *sys.Mapping
	doorbell *sys.Bell

	state atomic.Uint32 // abi.QPState; written under mu, read anywhere
	// directGen counts the changes of state and attributes that revoke
	// the QP's memcpy-direct grants (direct.go).
	directGen atomic.Uint64
	// ch is the QP's send channel (direct_send.go), guarded by
	// d.directMu; chanP is the same for the QP's goroutine, which reads
	// it without the lock (the drain before a relayed WQE, the flush).
	// chanRQ: a library consumed this incarnation's receives too (a
	// channel was made since the last RESET): the RQ head is resynced
	// from the RQ-head word, under rqMu.
	ch     *channel // guarded by d.directMu
	chanP  atomic.Pointer[channel]
	chanRQ atomic.Bool

	mu sync.Mutex
	// State mirrors state
	attr abi.QPAttr // +checklocks:mu
	// the decision bound is from
	pathInfo  abi.PathInfo // +checklocks:mu
	remoteQPN uint32       // +checklocks:mu
	remoteGID abi.GID      // +checklocks:mu
	errReason string       // +checklocks:mu
	// the next request's PSN (from sq_psn)
	npsn uint32 // +checklocks:mu

	// bound is the path the QP was bound to at RTR (path.go), nil before
	// and after RESET; written under mu. cur is the path the send-queue
	// goroutine works with: it takes bound when it finds none, and drops
	// it when it sees a reset.
	bound atomic.Pointer[pathRef]
	cur   Path // owned by runSQ

	// Receive side: consumed by whichever goroutine delivers a message to
	// this QP (a peer's sender) or flushes it (this QP's sender).
	rqMu   sync.Mutex
	rqHead uint32 // +checklocks:rqMu
	// bumped at every move of rqHead: a receive taken is still there while it holds
	rqSeq uint64 // +checklocks:rqMu
	// private copy of one RQ slot
	rqSlot   []byte             // +checklocks:rqMu
	rwqe     abi.RecvWQE        // +checklocks:rqMu
	rsegs    [abi.MaxSGE][]byte // +checklocks:rqMu
	rqBroken bool               // +checklocks:rqMu
	// RQ tail rqBadTail was found invalid in ERR or RESET (see hasWork)
	rqBad     bool   // +checklocks:rqMu
	rqBadTail uint32 // +checklocks:rqMu
	// on an SRQ: rwqe holds a WQE claimed from it for a message (srq.go)
	srqHeld bool // +checklocks:rqMu
	// on an SRQ: the last-WQE event of this ERR was reported
	lastWQESent bool // +checklocks:rqMu
	// an XRC target QP: the SRQ of the message it takes a receive for,
	// pinned while it holds a WQE of it (xrc.go)
	xsrq *SRQ // +checklocks:rqMu

	// Send side: owned by runSQ.
	sqHead uint32
	sqSlot []byte
	wqe    abi.SendWQE
	segs   [abi.MaxSGE][]byte
	cqe    abi.CQE
	timer  clock.Timer   // RNR and retry delays, response timeouts (the device's clock)
	wakeCh chan struct{} // a response arrived, or the state changed
	// sqBad: the SQ tail sqBadTail was found invalid; it is not work until
	// the workload changes it (see hasWork).
	sqBad     bool
	sqBadTail uint32
	// sqUnpublished counts the WQEs completed since the head word was
	// last stored (CompleteHead).
	sqUnpublished uint32
	// sqCompleted is the SQ head once the completions of the WQEs before
	// it are in the send CQ: what a resize waits for (coreverbs.go).
	sqCompleted atomic.Uint32

	spin      asyncSpin // async mode: the polling window it learned (spin.go); the goroutine's
	stop      atomic.Bool
	destroyed atomic.Bool
	done      chan struct{}

	// RESET empties both queues without completions, even if the QP has
	// moved on by the time the queues are next looked at: every move to
	// RESET records the workload's tails, then bumps resets; the send
	// goroutine and the receive side each skip to the recorded tail when
	// they see a new value.
	resets      atomic.Uint32
	resetSQTail atomic.Uint32
	resetRQTail atomic.Uint32
	sqResets    uint32 // resets the send side has caught up with; owned by runSQ
	rqResets    uint32 // +checklocks:rqMu

	ctr Counters
}

// Counters are a QP's RC statistics (mgmt.QPCounters), updated by
// whichever goroutine acts for the QP as requester or responder.
type Counters struct {
	Retries, RNRRcvd, RNRSent, Dropped, Dups, SeqErrs atomic.Uint64
	RdAtomicPeak                                      atomic.Uint32

	// The work done: send-queue work requests completed successfully by
	// opcode, and the bytes they moved (sent, written or read: NoteSent);
	// receives completed successfully and their bytes; completions of
	// either queue by status, flushes and errors included.
	Ops         [abi.OpMax]atomic.Uint64
	SendBytes   atomic.Uint64
	Recvs       atomic.Uint64
	RecvBytes   atomic.Uint64
	Completions [abi.WCGeneralErr + 1]atomic.Uint64

	// The send queue's goroutine: how often it slept until the doorbell
	// rang, and how long it polled for work before sleeping.
	Doorbells atomic.Uint64
	PollNanos atomic.Uint64
}

func (c *Counters) report() mgmt.QPCounters {
	r := mgmt.QPCounters{TransportRetries: c.Retries.Load(), RNRNaksReceived: c.RNRRcvd.Load(), RdAtomicPeak: c.RdAtomicPeak.Load(),
		RNRNaksSent: c.RNRSent.Load(), RequestsDropped: c.Dropped.Load(), DuplicateRequest: c.Dups.Load(), OutOfSeqRequest: c.SeqErrs.Load(),
		SendBytes: c.SendBytes.Load(), Recvs: c.Recvs.Load(), RecvBytes: c.RecvBytes.Load(),
		Doorbells: c.Doorbells.Load(), PollNanos: c.PollNanos.Load()}
	for op := range c.Ops {
		if n := c.Ops[op].Load(); n != 0 {
			if r.Ops == nil {
				r.Ops = map[string]uint64{}
			}
			r.Ops[abi.Opcode(op).String()] = n
		}
	}
	for st := range c.Completions {
		if n := c.Completions[st].Load(); n != 0 {
			if r.Completions == nil {
				r.Completions = map[string]uint64{}
			}
			r.Completions[abi.WCStatus(st).String()] = n
		}
	}
	return r
}

// noteCompletion counts a completion of status st.
func (c *Counters) noteCompletion(st abi.WCStatus) {
	if int(st) < len(c.Completions) {
		c.Completions[st].Add(1)
	}
}

// NotePeak records n READs and atomics outstanding at once.
func (c *Counters) NotePeak(n uint32) {
	for {
		p := c.RdAtomicPeak.Load()
		if n <= p || c.RdAtomicPeak.CompareAndSwap(p, n) {
			return
		}
	}
}

// State is the QP's state; any goroutine may call it.
func (q *QP) State() abi.QPState { return abi.QPState(q.state.Load()) }

// CreateQP creates an RC QP, its rings and doorbell, and starts its
// send-queue goroutine.
func (v *Context) CreateQP(c *abi.CreateQP) (*QP, error) {
	want := c.Caps
	noRQ := c.SRQ != 0 || c.Type.IsXRC()
	if noRQ {
		// Receives come from an SRQ, or never (an XRC initiator): the
		// QP's own receive queue is the smallest ring, never read
		// (ibv_create_qp ignores max_recv_wr and max_recv_sge then).
		want.MaxRecvWR, want.MaxRecvSGE = 1, 1
	}
	if c.Type == abi.QPTypeXRCRecv {
		want = abi.QPCaps{MaxSendWR: 1, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1} // no queues: the rings stay the agent's
	}
	layout, caps, err := abi.NewQPLayout(want)
	if err != nil {
		return nil, abi.Errorf(abi.CodeInvalid, "caps", "%v", err)
	}
	if noRQ {
		caps.MaxRecvWR, caps.MaxRecvSGE = 0, 0
	}
	if c.Type == abi.QPTypeXRCRecv {
		caps = abi.QPCaps{}
	}
	recvCQ := c.RecvCQ
	if c.Type == abi.QPTypeXRCSend && recvCQ == 0 {
		recvCQ = c.SendCQ
	}
	v.objMu.Lock()
	p, ok := v.pds[c.PD]
	scq, ok2 := v.cqs[c.SendCQ]
	rcq, ok3 := v.cqs[recvCQ]
	srq, ok4 := v.srqs[c.SRQ]
	var xh *xrcdHandle
	if c.Type == abi.QPTypeXRCRecv {
		xh, err = v.xrcdByHandleLocked(c.XRCD)
		if xh != nil {
			p, ok, scq, ok2, rcq, ok3 = xh.pd, true, nil, true, nil, true
		}
	}
	nqp := len(v.qps)
	v.objMu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case c.SRQ != 0 && !ok4:
		return nil, abi.Errorf(abi.CodeNotFound, "srq", "no SRQ with handle %d", c.SRQ)
	case !ok:
		return nil, abi.Errorf(abi.CodeNotFound, "pd", "no PD with handle %d", c.PD)
	case !ok2:
		return nil, abi.Errorf(abi.CodeNotFound, "send_cq", "no CQ with handle %d", c.SendCQ)
	case !ok3:
		return nil, abi.Errorf(abi.CodeNotFound, "recv_cq", "no CQ with handle %d", c.RecvCQ)
	case nqp >= v.d.cfg.Limits.MaxQP:
		return nil, abi.Errorf(abi.CodeLimit, "", "VM %q has %d QPs, the limit (max_qp): destroy some first", v.name, nqp)
	}
	if err := v.chargeQueue(qpCharge(layout), layout.Size); err != nil {
		return nil, err
	}
	fd, ring, db, err := newRing("vrdma-qp", layout.Size)
	if err != nil {
		v.refundQueue(qpCharge(layout), layout.Size)
		return nil, err
	}
	q := &QP{typ: c.Type, vm: v, pd: p, ad: p.ad, sendCQ: scq, recvCQ: rcq, srq: srq, xh: xh, sqSigAll: c.SQSigAll, caps: caps, layout: layout,
		ringFD: fd, ring: ring, doorbell: db, done: make(chan struct{}),
		sqSlot: make([]byte, layout.SQStride), rqSlot: make([]byte, layout.RQStride), timer: v.d.clk.NewTimer(time.Hour), wakeCh: make(chan struct{}, 1)}
	q.timer.Stop()
	q.attr.Port = 1
	q.attr.PathMTU = abi.DefaultPathMTU

	v.objMu.Lock()
	if n := len(v.qps); n >= v.d.cfg.Limits.MaxQP {
		v.objMu.Unlock()
		q.release()
		v.refundQueue(qpCharge(layout), layout.Size)
		return nil, abi.Errorf(abi.CodeLimit, "", "VM %q has %d QPs, the limit (max_qp): destroy some first", v.name, n)
	}
	if srq != nil && v.srqs[c.SRQ] != srq || xh != nil && v.xrcds[c.XRCD] != xh {
		v.objMu.Unlock()
		q.release()
		v.refundQueue(qpCharge(layout), layout.Size)
		return nil, abi.Errorf(abi.CodeNotFound, "srq", "SRQ %d or XRC domain %d was destroyed meanwhile", c.SRQ, c.XRCD)
	}
	q.handle = v.allocHandleLocked()
	p.refs++
	if xh != nil {
		xh.refs++
		q.xrcd = xh.x
	} else {
		scq.refs++
		rcq.refs++
	}
	if srq != nil {
		srq.refs++
	}
	v.qps[q.handle] = q
	v.objMu.Unlock()

	v.d.mu.Lock()
	q.qpn = v.d.allocQPNLocked()
	v.d.qps[q.qpn] = q
	v.d.mu.Unlock()

	go q.runSQ()
	return q, nil
}

func (q *QP) release() {
	q.ring.Unmap()
	q.ringFD.Close()
	q.doorbell.Close()
}

// DestroyQP stops the QP's goroutine, unlinks it and unmaps its rings:
// the destroy of the creator's handle. A target QP that other handles
// opened lives on without it (orphan, xrc.go).
func (v *Context) DestroyQP(q *QP) {
	if q.typ == abi.QPTypeXRCRecv && v.orphan(q) {
		return
	}
	v.destroyQP(q)
}

// udSendWait bounds how long a destroy waits for a UD QP's posted
// datagrams to leave (sendPosted).
const udSendWait = time.Second

// sendPosted lets a UD QP in RTS send the datagrams posted before its
// destroy (or its process's end) before the goroutine stops: an HCA has
// sent them by the time a program gets to destroy the QP, and programs
// count on it — mckey's sender posts its datagrams unsignaled, leaves the
// group and exits. UD has no acknowledgement to wait for; a tail the
// goroutine cannot reach (garbage, a path that blocks) is given up on
// after udSendWait. Other QP types lose what they had not executed, as
// before.
func (q *QP) sendPosted() {
	if q.typ != abi.QPTypeUD || q.State() != abi.QPSRTS {
		return
	}
	tail := abi.Word(q.ring.Bytes(), abi.OffSQTail)
	for deadline := time.Now().Add(udSendWait); tail.Load() != q.sqCompleted.Load() && time.Now().Before(deadline) && q.State() == abi.QPSRTS; {
		q.poke()
		time.Sleep(50 * time.Microsecond)
	}
}

// destroyQP is DestroyQP, once no handle holds q.
func (v *Context) destroyQP(q *QP) {
	if q.destroyed.Load() {
		return
	}
	q.sendPosted()
	if q.destroyed.Swap(true) {
		return
	}
	q.vm.d.revoke(func(g *grant) bool { return g.init == q || g.target == q }) // direct.go
	q.stop.Store(true)
	q.poke()
	<-q.done

	v.d.detachAll(q) // mcast.go
	v.d.mu.Lock()
	delete(v.d.qps, q.qpn)
	v.d.mu.Unlock()
	v.objMu.Lock()
	q.pd.ad.retired.Add(q.ctr.report()) // in the same step as the QP leaves v.qps: Status counts it once
	delete(v.qps, q.handle)
	v.unbindQPLocked(q) // its type 2 windows go with it
	q.pd.refs--
	orphaned := q.wasOrphaned()
	if orphaned {
		delete(v.orphans, q)
	}
	if q.xh != nil {
		if !orphaned {
			q.xh.refs-- // an orphan's creator let go of its domain handle already
		}
	} else {
		q.sendCQ.refs--
		q.recvCQ.refs--
	}
	if q.srq != nil {
		q.srq.refs--
	}
	v.objMu.Unlock()
	q.rqMu.Lock()
	q.srqHeld = false // a WQE a target QP held is dropped with it, as a basic SRQ's QP's
	q.releaseXSRQLocked()
	q.rqMu.Unlock()

	v.lockMem() // peers' senders may be reading our receive ring
	q.mu.Lock() // setStateLocked (connection setup, peers' errors) may be writing the state word
	q.release()
	q.mu.Unlock()
	v.unlockMem()
	v.refundQueue(qpCharge(q.layout), q.layout.Size)
}

// QPByHandle returns the VM's QP with handle h: one it created, or an
// XRC target QP it opened (OpenQP).
func (v *Context) QPByHandle(h uint32) (*QP, error) {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	q, ok := v.qps[h]
	if o, opened := v.openQPs[h]; opened {
		q, ok = o.q, true
	}
	if !ok {
		return nil, abi.Errorf(abi.CodeNotFound, "handle", "no QP with handle %d", h)
	}
	return q, nil
}

// legal[from] is the set of states a QP may move to from "from" (IBTA
// 10.3.1; RC).
var legal = [...]uint8{
	abi.QPSReset: 1<<abi.QPSReset | 1<<abi.QPSInit | 1<<abi.QPSErr,
	abi.QPSInit:  1<<abi.QPSReset | 1<<abi.QPSInit | 1<<abi.QPSRTR | 1<<abi.QPSErr,
	abi.QPSRTR:   1<<abi.QPSReset | 1<<abi.QPSRTS | 1<<abi.QPSErr,
	abi.QPSRTS:   1<<abi.QPSReset | 1<<abi.QPSRTS | 1<<abi.QPSSQD | 1<<abi.QPSErr,
	abi.QPSSQD:   1<<abi.QPSReset | 1<<abi.QPSRTS | 1<<abi.QPSSQD | 1<<abi.QPSErr,
	abi.QPSSQE:   1<<abi.QPSReset | 1<<abi.QPSRTS | 1<<abi.QPSErr,
	abi.QPSErr:   1<<abi.QPSReset | 1<<abi.QPSErr,
}

type required struct {
	mask abi.QPAttrMask
	name string
}

var (
	reqInit = []required{{abi.MaskPort, "port_num (IBV_QP_PORT)"}, {abi.MaskAccessFlags, "qp_access_flags (IBV_QP_ACCESS_FLAGS)"}}
	reqRTR  = []required{{abi.MaskAV, "ah_attr with the remote GID (IBV_QP_AV)"}, {abi.MaskPathMTU, "path_mtu (IBV_QP_PATH_MTU)"},
		{abi.MaskDestQPN, "dest_qp_num (IBV_QP_DEST_QPN)"}, {abi.MaskRQPSN, "rq_psn (IBV_QP_RQ_PSN)"},
		{abi.MaskMaxDestRdAtomic, "max_dest_rd_atomic (IBV_QP_MAX_DEST_RD_ATOMIC)"}, {abi.MaskMinRNRTimer, "min_rnr_timer (IBV_QP_MIN_RNR_TIMER)"}}
	reqRTS = []required{{abi.MaskSQPSN, "sq_psn (IBV_QP_SQ_PSN)"}, {abi.MaskTimeout, "timeout (IBV_QP_TIMEOUT)"},
		{abi.MaskRetryCnt, "retry_cnt (IBV_QP_RETRY_CNT)"}, {abi.MaskRNRRetry, "rnr_retry (IBV_QP_RNR_RETRY)"},
		{abi.MaskMaxRdAtomic, "max_rd_atomic (IBV_QP_MAX_QP_RD_ATOMIC)"}}
)

// knownAttrs are the attribute mask bits vrdma knows; others are ignored.
const knownAttrs = abi.MaskState | abi.MaskAccessFlags | abi.MaskPort | abi.MaskAV | abi.MaskPathMTU | abi.MaskTimeout |
	abi.MaskRetryCnt | abi.MaskRNRRetry | abi.MaskRQPSN | abi.MaskMaxRdAtomic | abi.MaskMinRNRTimer | abi.MaskSQPSN |
	abi.MaskMaxDestRdAtomic | abi.MaskDestQPN

// optionalAttrs are the attributes a transition accepts besides its
// required ones: the RC column of IBTA 10.3.1 (the kernel's
// qp_state_table). Transitions to RESET and ERR take none. SQD→SQD does not
// take a new address or port: vrdma does not move a connected QP.
func optionalAttrs(cur, next abi.QPState) abi.QPAttrMask {
	switch {
	case cur == abi.QPSInit && next == abi.QPSInit:
		return abi.MaskPort | abi.MaskAccessFlags
	case cur == abi.QPSInit && next == abi.QPSRTR, cur == abi.QPSSQE && next == abi.QPSRTS:
		return abi.MaskAccessFlags
	case cur == abi.QPSRTR && next == abi.QPSRTS, cur == abi.QPSRTS && next == abi.QPSRTS, cur == abi.QPSSQD && next == abi.QPSRTS:
		return abi.MaskAccessFlags | abi.MaskMinRNRTimer
	case cur == abi.QPSSQD && next == abi.QPSSQD:
		return abi.MaskAccessFlags | abi.MaskMinRNRTimer | abi.MaskTimeout | abi.MaskRetryCnt | abi.MaskRNRRetry |
			abi.MaskMaxRdAtomic | abi.MaskMaxDestRdAtomic
	}
	return 0
}

// Modify applies a ModifyQP. Transitions follow the IBTA state machine;
// attributes a transition requires must be present. The QP's
// memcpy-direct grants, as initiator or target, are revoked before it
// returns (direct.go).
func (q *QP) Modify(m *abi.ModifyQP) error {
	err := q.modify(m)
	if err == nil {
		q.directChanged(true)
	}
	return err
}

func (q *QP) modify(m *abi.ModifyQP) error {
	if q.IsUD() {
		return q.modifyUD(m) // ud.go
	}
	// The route of a QP entering RTR is decided before q.mu: the router
	// may ask the control plane.
	var route *Route
	var routeErr error
	if m.Mask&abi.MaskState != 0 && m.Attr.State == abi.QPSRTR && q.State() == abi.QPSInit && m.Mask&abi.MaskAV != 0 {
		route, routeErr = q.vm.d.route(q, m.Attr.DGID, m.Attr.DestQPN)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed.Load() {
		// Connection setup may reach a QP its owner destroyed meanwhile.
		return abi.Errorf(abi.CodeNotFound, "qp", "QP 0x%x was destroyed", q.qpn)
	}
	cur := abi.QPState(q.state.Load())
	next := cur
	if m.Mask&abi.MaskState != 0 {
		next = m.Attr.State
	}
	if legal[cur]&(1<<next) == 0 {
		return abi.Errorf(abi.CodeState, "qp_state", "QP 0x%x: %s → %s is not a legal transition (IBTA 10.3.1)", q.qpn, cur, next)
	}
	var need []required
	switch {
	case cur == abi.QPSReset && next == abi.QPSInit:
		need = reqInit
	case cur == abi.QPSInit && next == abi.QPSRTR:
		need = reqRTR
	case cur == abi.QPSRTR && next == abi.QPSRTS:
		need = reqRTS
	}
	allowed := abi.MaskState | optionalAttrs(cur, next)
	if q.typ == abi.QPTypeUC {
		need, allowed = ucTransition(cur, next)
	}
	if q.typ.IsXRC() {
		need, allowed = xrcTransition(q.typ, cur, next, need, allowed)
	}
	for _, r := range need {
		if m.Mask&r.mask == 0 {
			return abi.Errorf(abi.CodeInvalid, "mask", "QP 0x%x: %s → %s needs %s", q.qpn, cur, next, r.name)
		}
		allowed |= r.mask
	}
	if extra := m.Mask & knownAttrs &^ allowed; extra != 0 {
		return abi.Errorf(abi.CodeInvalid, "mask", "QP 0x%x: %s → %s does not take the attributes of mask 0x%x (IBTA 10.3.1; ibv_modify_qp fails with EINVAL)",
			q.qpn, cur, next, uint32(extra))
	}
	if cur == abi.QPSInit && next == abi.QPSRTR {
		if routeErr != nil {
			return routeErr
		}
		if route == nil {
			return abi.Errorf(abi.CodeState, "qp_state", "QP 0x%x: another modify moved it to INIT meanwhile: try again", q.qpn)
		}
		q.remoteGID, q.remoteQPN = m.Attr.DGID, m.Attr.DestQPN
		q.bindPathLocked(route.New(q), route.Info)
	}
	q.applyLocked(m.Mask, &m.Attr)
	if next != cur {
		q.setStateLocked(next)
	}
	return nil
}

// +checklocks:q.mu
func (q *QP) applyLocked(mask abi.QPAttrMask, a *abi.QPAttr) {
	t := &q.attr
	if mask&abi.MaskAccessFlags != 0 {
		t.AccessFlags = a.AccessFlags
	}
	if mask&abi.MaskPathMTU != 0 {
		t.PathMTU = a.PathMTU
	}
	if mask&abi.MaskAV != 0 {
		t.DGID = a.DGID
	}
	if mask&abi.MaskDestQPN != 0 {
		t.DestQPN = a.DestQPN
	}
	if mask&abi.MaskRQPSN != 0 {
		t.RQPSN = a.RQPSN
	}
	if mask&abi.MaskSQPSN != 0 {
		t.SQPSN = a.SQPSN
		q.npsn = a.SQPSN & rc.PSNMask
	}
	if mask&abi.MaskTimeout != 0 {
		t.Timeout = a.Timeout
	}
	if mask&abi.MaskRetryCnt != 0 {
		t.RetryCnt = a.RetryCnt
	}
	if mask&abi.MaskRNRRetry != 0 {
		t.RNRRetry = a.RNRRetry
	}
	if mask&abi.MaskMinRNRTimer != 0 {
		t.MinRNRTimer = a.MinRNRTimer
	}
	if mask&abi.MaskMaxRdAtomic != 0 {
		t.MaxRdAtomic = a.MaxRdAtomic
	}
	if mask&abi.MaskMaxDestRdAtomic != 0 {
		t.MaxDestRdAtomic = a.MaxDestRdAtomic
	}
}

// poke wakes the QP goroutine wherever it waits.
func (q *QP) poke() {
	q.doorbell.Wake()
	select {
	case q.wakeCh <- struct{}{}:
	default:
	}
}

// setStateLocked records a new state, publishes it to the library and
// wakes the QP's goroutine, which flushes in ERR.
//
// +checklocks:q.mu
func (q *QP) setStateLocked(s abi.QPState) {
	prev := q.attr.State
	q.attr.State = s
	q.state.Store(uint32(s))
	switch {
	case s == abi.QPSRTR && prev != abi.QPSRTR:
		q.commEstDue.Store(true)
	case s == abi.QPSSQD && prev != abi.QPSSQD:
		q.drainedDue.Store(true)
	}
	if s == abi.QPSReset {
		q.remoteQPN, q.remoteGID, q.pathInfo, q.errReason = 0, abi.GID{}, abi.PathInfo{}, ""
		q.bound.Store(nil)
	}
	if s != prev {
		q.directChanged(false) // marked now; Modify waits for them, a path's or peer's change does not (direct.go)
	}
	if q.destroyed.Load() {
		return // destroyQP unmaps the rings under q.mu once destroyed is set
	}
	if s == abi.QPSReset {
		mem := q.ring.Bytes()
		q.resetSQTail.Store(abi.Word(mem, abi.OffSQTail).Load())
		q.resetRQTail.Store(abi.Word(mem, abi.OffRQTail).Load())
		q.resets.Add(1)
	}
	abi.StoreFenced(abi.Word(q.ring.Bytes(), abi.OffQPState), uint32(s)) // §6 pair 3: before the RQ tail's load
	// Wake the goroutine: in RESET it drops what the queues hold, in ERR it
	// flushes them, in RTS it resumes a send queue that SQD held.
	q.poke()
}

// MoveToErr moves the QP to ERR (from any state but RESET), recording why:
// an error the agent detected, which the QP's onFatal hears of.
func (q *QP) MoveToErr(why string) {
	if q.toErr(why) {
		q.vm.d.log.Info("QP moved to ERR", "vm", q.vm.name, "qpn", q.qpn, "why", why)
		if f := q.onFatal.Load(); f != nil {
			(*f)(why)
		}
		q.tellOpens(abi.EventQPFatal, why)
	}
}

// Shutdown is MoveToErr for an end the workload asked for (rdma_disconnect
// moves the QP to ERR as rdma-core does): no fatal event.
func (q *QP) Shutdown(why string) { q.toErr(why) }

// toErr moves the QP to ERR unless it is in ERR or RESET, and reports
// whether it did.
func (q *QP) toErr(why string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.State(); s == abi.QPSErr || s == abi.QPSReset {
		return false
	}
	q.errReason = why
	q.setStateLocked(abi.QPSErr)
	return true
}

// SetOnEvent sets the function told of the QP's COMM_EST and SQ_DRAINED
// events (abi.EventCommEst, abi.EventSQDrained), outside q's locks (nil:
// none).
func (q *QP) SetOnEvent(f func(event int, why string)) {
	if f == nil {
		q.onEvent.Store(nil)
		return
	}
	q.onEvent.Store(&f)
}

// noteCommEst raises COMM_EST if q is in RTR and has not since it entered
// it: its first message arrived (IBTA 11.6.3: a packet received in RTR).
func (q *QP) noteCommEst() {
	if q.State() == abi.QPSRTR && q.commEstDue.CompareAndSwap(true, false) {
		if f := q.onEvent.Load(); f != nil {
			(*f)(abi.EventCommEst, "the QP received its first message in RTR")
		}
		q.tellOpens(abi.EventCommEst, "the QP received its first message in RTR")
	}
}

// noteDrained raises SQ_DRAINED once q, in SQD, has no send work in
// flight, once per entry into SQD. The QP's goroutine calls it.
func (q *QP) noteDrained() {
	if q.State() == abi.QPSSQD && q.drainedDue.CompareAndSwap(true, false) {
		if f := q.onEvent.Load(); f != nil {
			(*f)(abi.EventSQDrained, "the send queue drained in SQD")
		}
	}
}

// SetOnFatal sets the function MoveToErr calls with why, outside q's lock
// (nil: none).
func (q *QP) SetOnFatal(f func(why string)) {
	if f == nil {
		q.onFatal.Store(nil)
		return
	}
	q.onFatal.Store(&f)
}

// route asks the router for the path from q to (dgid, dqpn).
func (d *Device) route(q *QP, dgid abi.GID, dqpn uint32) (*Route, error) {
	if d.cfg.Router == nil {
		return nil, abi.Errorf(abi.CodeUnavailable, "dgid", "QP 0x%x: this device has no paths", q.qpn)
	}
	r, err := d.cfg.Router.Route(q, dgid, dqpn)
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// remoteIs reports whether the QP's remote end is an adapter of v and,
// unless qpns is nil, one of the QPs numbered in qpns.
func (q *QP) remoteIs(v *Context, qpns map[uint32]bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.remoteGID.IsZero() || qpns != nil && !qpns[q.remoteQPN] {
		return false
	}
	for _, ad := range v.adapters {
		if ad.gid == q.remoteGID {
			return true
		}
	}
	return false
}

// Query answers ibv_query_qp: the attributes, capabilities and path.
func (q *QP) Query() abi.QueryQPReply {
	q.mu.Lock()
	defer q.mu.Unlock()
	return abi.QueryQPReply{QPN: q.qpn, Attr: q.attr, Caps: q.caps, Path: q.pathInfo}
}

func (q *QP) statusReport() mgmt.QPStatus {
	q.vm.d.foldDirect(q) // direct.go
	q.mu.Lock()
	st := mgmt.QPStatus{QPN: q.qpn, Adapter: q.ad.name, State: q.State().String(), PeerQPN: q.remoteQPN, Path: q.pathInfo,
		Counters: q.ctr.report()}
	gid := q.remoteGID
	q.mu.Unlock()
	if ps, ok := q.BoundPath().(PathStatuser); ok {
		ps.Status(&st)
	}
	switch {
	case !gid.IsZero():
		// The peer is resolved on first use; until then name it by the
		// adapter its GID belongs to, if that is on this host. d.mu is
		// taken after q.mu is released (teardown takes them the other way).
		if ad := q.vm.d.AdapterByGID(gid); ad != nil {
			st.Peer = ad.vm.name + "/" + ad.name
		} else {
			st.Peer = gid.String()
		}
	}
	return st
}

// QPN is the QP's number.
func (q *QP) QPN() uint32 { return q.qpn }

// Adapter is the adapter the QP belongs to.
func (q *QP) Adapter() *Adapter { return q.ad }

// Handle returns the QP's handle in its session.
func (q *QP) Handle() uint32 { return q.handle }

// GID is the GID of the QP's adapter.
func (q *QP) GID() abi.GID { return q.ad.gid }

// Context is the process context the QP belongs to.
func (q *QP) Context() *Context { return q.vm }

// Device is the device the QP belongs to.
func (q *QP) Device() *Device { return q.vm.d }

// Counters are the QP's RC statistics, for the path that acts for it.
func (q *QP) Counters() *Counters { return &q.ctr }

// Resets counts the QP's moves to RESET: a responder that keeps state for
// the QP (its expected PSN) starts afresh when it changes.
func (q *QP) Resets() uint32 { return q.resets.Load() }

// Destroyed reports whether the QP was destroyed; a path that caches a
// peer QP drops it then.
func (q *QP) Destroyed() bool { return q.destroyed.Load() }

// Reply is the answer to the workload's create, with the descriptors of
// the QP's rings and doorbell to pass along.
func (q *QP) Reply() (abi.CreateQPReply, []int) {
	if q.typ == abi.QPTypeXRCRecv {
		// A target QP has no queues: its rings stay the agent's.
		return abi.CreateQPReply{Handle: q.handle, QPN: q.qpn}, nil
	}
	return abi.CreateQPReply{Handle: q.handle, QPN: q.qpn, Caps: q.caps, Layout: q.layout}, []int{q.ringFD.Int(), q.doorbell.PeerFD()}
}

// Hold makes q a responder for one request: it takes q's VM's memory for
// reading and checks that the VM and q are alive and that q is in a state
// that receives (RTR, RTS, SQD). It returns false, holding nothing, when
// they are not; a request for a QP outside RTR..SQD is counted as
// dropped. After true, the caller checks that q is bound to the
// requester (Remote, RCAttrs), responds, and calls Release.
//
// An XRC target QP's responder touches the memory of the process whose
// SRQ a request names, any process of the VM: Hold takes the VM's xmem
// for reading instead of q's process's memMu, and the request's checks
// find the SRQ's process alive (xrc.go).
//
// +checklocksignore: takes memMu (or xmem) only when it returns true
func (q *QP) Hold() bool {
	v := q.vm
	if q.typ == abi.QPTypeXRCRecv {
		v.procs.xmem.RLock()
		if !q.destroyed.Load() && q.receives() {
			return true
		}
		v.procs.xmem.RUnlock()
		return false
	}
	v.memMu.RLock()
	if v.dead || q.destroyed.Load() {
		v.memMu.RUnlock()
		return false
	}
	if !q.receives() {
		v.memMu.RUnlock()
		return false
	}
	return true
}

// receives reports whether q is in a state that takes requests (RTR,
// RTS, SQD); a request for a QP in another is counted as dropped.
func (q *QP) receives() bool {
	if s := q.State(); s != abi.QPSRTR && s != abi.QPSRTS && s != abi.QPSSQD {
		q.ctr.Dropped.Add(1)
		return false
	}
	return true
}

// Release ends what Hold began.
//
// +checklocksignore: releases what Hold or HoldMemory took
func (q *QP) Release() {
	if q.typ == abi.QPTypeXRCRecv {
		q.vm.procs.xmem.RUnlock()
		return
	}
	q.vm.memMu.RUnlock()
}

// NoteSent counts n bytes moved by a send-queue work request that
// completed successfully.
func (q *QP) NoteSent(n uint64) { q.ctr.SendBytes.Add(n) }

// WakeCh is signalled when a response for the QP's path arrives or the
// QP's state changes; its one slot is filled without blocking (a send
// that finds it full is dropped: one signal stands for many).
func (q *QP) WakeCh() chan struct{} { return q.wakeCh }

// Timer is the QP's RC timer (on the device's clock), for its send-queue
// goroutine: RNR and retry delays, response timeouts.
func (q *QP) Timer() clock.Timer { return q.timer }

// HoldMemory takes q's VM's memory for reading, for a requester's path
// that writes a response into the local buffers of a work request (a
// READ's data) from a goroutine other than q's; false, holding nothing,
// when the VM or q is gone. Release ends it.
//
// +checklocksignore: takes memMu only when it returns true
func (q *QP) HoldMemory() bool {
	v := q.vm
	if q.typ == abi.QPTypeXRCRecv {
		return false // no send queue: no requester's path holds it
	}
	v.memMu.RLock()
	if v.dead || q.destroyed.Load() {
		v.memMu.RUnlock()
		return false
	}
	return true
}
