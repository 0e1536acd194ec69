// SPDX-License-Identifier: Apache-2.0

package device

// Shared receive queues. An SRQ is a receive ring the workload fills and
// the responders of every QP created on it consume: whichever QP a SEND
// (or a WRITE with immediate) arrives for claims the WQE at the SRQ's
// head, under the SRQ's one consumer lock (SRQ.mu), so that two QPs'
// responders, on any goroutines and paths, never take the same WQE.
//
// A QP claims a WQE when a message that needs one begins (rxe does the
// same: its responder copies the SRQ's WQE into the QP at the first
// packet), and keeps it (QP.srqHeld, under the QP's rqMu) until the
// message completes into the QP's receive CQ: a message that does not
// complete (a full CQ, a lost packet, a retransmission) finds the same
// WQE again, and every check that a receive is still "taken" (rqSeq) is
// the RQ's. A QP that enters ERR flushes the WQE it holds (WR_FLUSH_ERR
// in its own receive CQ) and reports IBV_EVENT_QP_LAST_WQE_REACHED; the
// SRQ's other WQEs stay for the other QPs. Destroying the SRQ discards
// what it holds without completions, as rxe does; it is refused (EBUSY)
// while a QP uses it.
//
// Lock order: a QP's rqMu, then its SRQ's mu.

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// SRQ is a shared receive queue. Safe for concurrent use.
type SRQ struct {
	handle uint32
	vm     *Context
	pd     *PD
	layout abi.SRQLayout
	maxSGE uint32 // the SGEs a WQE may have: what create reported
	ringFD sys.FD
	ring   *sys.Mapping

	// onLimit, if set, is told when the SRQ's posted WQEs fell below the
	// armed limit (the limit is disarmed first): the workload's
	// IBV_EVENT_SRQ_LIMIT_REACHED.
	onLimit atomic.Pointer[func()]

	mu sync.Mutex // the consumer lock: every QP's responder takes WQEs under it
	// the next index the agent consumes
	head uint32 // +checklocks:mu
	// the armed limit; 0: not armed
	limit uint32 // +checklocks:mu
	// a bad tail was logged (once until a good one is seen)
	badLogged bool // +checklocks:mu
	// private copy of one slot
	slot []byte // +checklocks:mu

	refs int // QPs on it; guarded by vm.objMu

	// An XRC SRQ's (xrc.go): its domain, the process's handle of the
	// domain it was created through, the CQ its receives complete in, its
	// number in the domain, and the target QPs' pins of it.
	xrcd  *XRCD
	xh    *xrcdHandle
	cq    *CQ
	srqn  uint32
	xpins int // the target QPs' pins; guarded by xrcd.mu
}

func srqCharge(l abi.SRQLayout) vmCharge { return vmCharge{wr: uint64(l.Entries)} }

// CreateSRQ creates a shared receive queue in PD c.PD and its ring.
func (v *Context) CreateSRQ(c *abi.CreateSRQ) (*SRQ, error) {
	layout, attr, err := abi.NewSRQLayout(c.Attr)
	if err != nil {
		return nil, abi.Errorf(abi.CodeInvalid, "attr", "%v", err)
	}
	v.objMu.Lock()
	p, ok := v.pds[c.PD]
	n := len(v.srqs)
	var xh *xrcdHandle
	var cq *CQ
	if c.Type == abi.SRQTypeXRC {
		xh, err = v.xrcdByHandleLocked(c.XRCD)
		if cq = v.cqs[c.CQ]; err == nil && cq == nil {
			err = abi.Errorf(abi.CodeNotFound, "cq", "no CQ with handle %d", c.CQ)
		}
	}
	v.objMu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, abi.Errorf(abi.CodeNotFound, "pd", "no PD with handle %d", c.PD)
	case n >= v.d.cfg.Limits.MaxQP:
		return nil, abi.Errorf(abi.CodeLimit, "", "VM %q has %d SRQs, the limit (max_srq): destroy some first", v.name, n)
	}
	if err := v.chargeQueue(srqCharge(layout), layout.Size); err != nil {
		return nil, err
	}
	fd, err := sys.Memfd("vrdma-srq", int64(layout.Size))
	if err != nil {
		v.refundQueue(srqCharge(layout), layout.Size)
		return nil, abi.Errorf(abi.CodeInternal, "", "create the SRQ's ring: %v", err)
	}
	ring, err := sys.Map(fd.Int(), int(layout.Size), true)
	if err != nil {
		fd.Close()
		v.refundQueue(srqCharge(layout), layout.Size)
		return nil, abi.Errorf(abi.CodeInternal, "", "map the SRQ's ring: %v", err)
	}
	s := &SRQ{vm: v, pd: p, layout: layout, maxSGE: attr.MaxSGE, ringFD: fd, ring: ring, limit: attr.Limit,
		slot: make([]byte, layout.Stride), xh: xh, cq: cq}
	v.objMu.Lock()
	if _, ok := v.pds[c.PD]; !ok || len(v.srqs) >= v.d.cfg.Limits.MaxQP ||
		xh != nil && (v.xrcds[c.XRCD] != xh || v.cqs[c.CQ] != cq) {
		v.objMu.Unlock()
		s.release()
		v.refundQueue(srqCharge(layout), layout.Size)
		return nil, abi.Errorf(abi.CodeLimit, "", "VM %q: its PD %d, XRC domain or CQ went, or it reached max_srq SRQs, meanwhile", v.name, c.PD)
	}
	s.handle = v.allocHandleLocked()
	p.refs++
	if xh != nil {
		xh.refs++
		cq.refs++
		s.xrcd = xh.x
	}
	v.srqs[s.handle] = s
	v.objMu.Unlock()
	if s.xrcd != nil {
		s.xrcd.addSRQ(s)
	}
	return s, nil
}

// release unmaps and closes the SRQ's ring.
func (s *SRQ) release() {
	s.ring.Unmap()
	s.ringFD.Close()
}

// SRQByHandle returns the VM's SRQ with handle h.
func (v *Context) SRQByHandle(h uint32) (*SRQ, error) {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	s, ok := v.srqs[h]
	if !ok {
		return nil, abi.Errorf(abi.CodeNotFound, "handle", "no SRQ with handle %d", h)
	}
	return s, nil
}

// DestroySRQ destroys SRQ h, discarding the WQEs it holds; one still used
// by a QP is refused.
func (v *Context) DestroySRQ(h uint32) error {
	v.objMu.Lock()
	s, ok := v.srqs[h]
	if ok && s.refs > 0 {
		refs := s.refs
		v.objMu.Unlock()
		return abi.Errorf(abi.CodeState, "handle", "SRQ %d is still used by %d QPs: destroy them first (EBUSY)", h, refs)
	}
	if ok && s.xrcd != nil {
		if err := s.xrcd.removeSRQ(s, false); err != nil {
			v.objMu.Unlock()
			return err
		}
		s.xh.refs--
		s.cq.refs--
	}
	if ok {
		delete(v.srqs, h)
		s.pd.refs--
	}
	v.objMu.Unlock()
	if !ok {
		return abi.Errorf(abi.CodeNotFound, "handle", "no SRQ with handle %d", h)
	}
	v.lockMem()
	s.release()
	v.unlockMem()
	v.refundQueue(srqCharge(s.layout), s.layout.Size)
	return nil
}

// Reply is the answer to the workload's create, with the descriptor of
// the SRQ's ring to pass along.
func (s *SRQ) Reply() (abi.CreateSRQReply, []int) {
	return abi.CreateSRQReply{Handle: s.handle, Attr: s.Query(), Layout: s.layout, SRQN: s.srqn}, []int{s.ringFD.Int()}
}

// Adapter is the adapter of the SRQ's PD.
func (s *SRQ) Adapter() *Adapter { return s.pd.ad }

// Handle returns the SRQ's handle in its session.
func (s *SRQ) Handle() uint32 { return s.handle }

// Query answers ibv_query_srq: the size, the SGEs and the armed limit
// (0 once the limit event fired).
func (s *SRQ) Query() abi.SRQAttr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return abi.SRQAttr{MaxWR: s.layout.Entries, MaxSGE: s.maxSGE, Limit: s.limit}
}

// Modify applies ibv_modify_srq: IBV_SRQ_LIMIT arms the limit event (0
// disarms it); IBV_SRQ_MAX_WR, a resize, is refused: the device does not
// report IBV_DEVICE_SRQ_RESIZE (the ring is mapped by the workload at its
// size), and rdma-core's providers without it fail it with EINVAL.
func (s *SRQ) Modify(m *abi.ModifySRQ) error {
	if m.Mask&abi.SRQMaskMaxWR != 0 {
		return abi.Errorf(abi.CodeInvalid, "mask", "SRQ %d: vrdma does not resize an SRQ (no IBV_DEVICE_SRQ_RESIZE): create a larger one", s.handle)
	}
	if m.Mask&abi.SRQMaskLimit == 0 {
		return nil
	}
	if m.Attr.Limit > s.layout.Entries {
		return abi.Errorf(abi.CodeInvalid, "srq_limit", "SRQ %d: srq_limit %d exceeds its max_wr %d", s.handle, m.Attr.Limit, s.layout.Entries)
	}
	s.mu.Lock()
	s.limit = m.Attr.Limit
	s.mu.Unlock()
	return nil
}

// SetOnLimit sets the function the SRQ calls when its limit event fires
// (nil: none). It is called without the SRQ's lock.
func (s *SRQ) SetOnLimit(f func()) {
	if f == nil {
		s.onLimit.Store(nil)
		return
	}
	s.onLimit.Store(&f)
}

// claimResult is what claim found at the SRQ's head.
type claimResult uint8

const (
	claimOK      claimResult = iota // w holds the WQE, consumed from the SRQ
	claimEmpty                      // no WQE posted
	claimBadTail                    // the tail word is garbage: nothing can be taken
	claimBadWQE                     // the WQE was consumed but does not decode (too many SGEs)
)

// claim takes the WQE at the SRQ's head into w, consuming it from the
// SRQ, and fires the limit event if the WQEs left fell below the armed
// limit. qpn names the claiming QP in logs. The caller holds that QP's
// rqMu and keeps the VM mapped (the SRQ lives while a QP uses it).
func (s *SRQ) claim(w *abi.RecvWQE, qpn uint32) claimResult {
	fire := false
	res := s.claimLocked(w, qpn, &fire)
	if fire {
		if f := s.onLimit.Load(); f != nil {
			(*f)()
		}
	}
	return res
}

func (s *SRQ) claimLocked(w *abi.RecvWQE, qpn uint32, fire *bool) claimResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	mem := s.ring.Bytes()
	size := s.layout.Entries
	tail := abi.Word(mem, abi.OffSRQTail).Load()
	n, ok := abi.Pending(tail, s.head, size)
	if !ok {
		if !s.badLogged {
			s.badLogged = true
			s.vm.d.log.Warn("shared receive queue tail index is invalid: the workload wrote garbage; the QP taking a receive moves to ERR",
				"vm", s.vm.name, "srq", s.handle, "qpn", qpn, "tail", tail, "head", s.head, "size", size)
		}
		return claimBadTail
	}
	s.badLogged = false
	if n == 0 {
		return claimEmpty
	}
	off := s.layout.Offset + abi.Slot(s.head, size)*s.layout.Stride
	copy(s.slot, mem[off:off+s.layout.Stride])
	s.head = abi.Next(s.head, size)
	abi.Word(mem, abi.OffSRQHead).Store(s.head)
	if s.limit != 0 && n-1 < s.limit {
		s.limit = 0 // one-shot: ibv_modify_srq arms it again
		*fire = true
	}
	if abi.DecodeRecv(s.slot, w, s.maxSGE) != abi.WCSuccess {
		return claimBadWQE
	}
	return claimOK
}

// peekSRQLocked is peekRecvLocked for a QP on an SRQ: the WQE the QP
// holds already, or one claimed from the SRQ now. A QP in ERR or RESET
// claims none (its flush or reset has run, or will, under rqMu: a WQE
// claimed after it would be held forever).
//
// +checklocks:p.rqMu
func (p *QP) peekSRQLocked(srcQPN uint32) recvState {
	p.rqCatchUpLocked()
	if p.srqHeld {
		return recvReady
	}
	if s := p.State(); s == abi.QPSErr || s == abi.QPSReset {
		return recvBroken
	}
	srq := p.rqSRQLocked()
	switch srq.claim(&p.rwqe, p.qpn) {
	case claimEmpty:
		return recvNone
	case claimBadTail:
		p.MoveToErr(fmt.Sprintf("shared receive queue %d's tail index is invalid", srq.handle))
		return recvBroken
	case claimBadWQE:
		p.srqHeld = true
		p.rqSeq++
		p.MoveToErr("receive work request of the shared receive queue has too many SGEs")
		p.completeRecvLocked(abi.WCLocLenErr, abi.WCRecv, 0, 0, 0, srcQPN, false)
		return recvBroken
	}
	p.srqHeld = true
	p.rqSeq++
	return recvReady
}

// dropSRQHeldLocked forgets the WQE a QP on an SRQ holds (RESET: no
// completion), and lets its next entry to ERR report the last WQE again.
//
// +checklocks:q.rqMu
func (q *QP) dropSRQHeldLocked() {
	if q.srqHeld {
		q.srqHeld = false
		q.rqSeq++
	}
	q.releaseXSRQLocked()
	q.lastWQESent = false
}

// flushSRQLocked is flushRQ for a QP on an SRQ in ERR (an XRC target
// QP's is flushTarget): the WQE it holds
// completes with WR_FLUSH_ERR in its receive CQ, and the first flush of
// this ERR reports the last WQE (the QP takes no more from the SRQ). It
// reports whether the event is due; the caller posts it without rqMu.
//
// +checklocks:q.rqMu
func (q *QP) flushSRQLocked() bool {
	if q.srqHeld {
		e := abi.CQE{WRID: q.rwqe.WRID, QPNum: q.qpn, Opcode: abi.WCRecv, Status: abi.WCWRFlushErr}
		q.ctr.noteCompletion(abi.WCWRFlushErr)
		q.srqHeld = false
		q.rqSeq++
		q.recvCQ.push(&e, &q.stop, &q.destroyed) // as in flushSQ
	}
	if q.lastWQESent {
		return false
	}
	q.lastWQESent = true
	return true
}

// SetOnLastWQE sets the function called when q, a QP on an SRQ, enters
// ERR and will take no more WQEs from it (nil: none): the workload's
// IBV_EVENT_QP_LAST_WQE_REACHED. It is called without q's locks.
func (q *QP) SetOnLastWQE(f func()) {
	if f == nil {
		q.onLastWQE.Store(nil)
		return
	}
	q.onLastWQE.Store(&f)
}

// SRQ is the shared receive queue q takes its receives from, or nil.
func (q *QP) SRQ() *SRQ { return q.srq }
