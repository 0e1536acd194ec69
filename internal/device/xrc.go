// SPDX-License-Identifier: Apache-2.0

package device

// XRC: domains, XRC SRQs and XRC target QPs. An XRC domain (XRCD) belongs
// to a VM: the VM's processes that open it through the same file (the
// file's device and inode number, FileID) share it, as processes on one
// host share a domain opened through the same inode; one opened without a
// file is private to its process. Each open is a handle of the process's
// context (xrcdHandle), counted in the domain (XRCD.opens); the domain
// goes with its last handle.
//
// The domain holds its XRC SRQs by SRQ number, the number a sender names
// in every request of an XRC initiator QP. An XRC target QP (no PD, CQs
// or queues of its own) resolves the number in its domain for each
// request: a SEND (or a WRITE with immediate) takes its receive from that
// SRQ and completes in the SRQ's CQ, and every RDMA operation is checked
// against the SRQ's PD. A number the domain does not hold — another
// domain's SRQ, a destroyed one, garbage from a peer — is an invalid
// request (REM_INV_REQ_ERR at the sender, the target QP to ERR), as IBTA
// says of an XRCETH naming an SRQ outside the target QP's domain.
//
// An SRQ is pinned (SRQ.xpins, under the domain's mu) while a target
// QP's responder uses it — from the lookup through the end of the check,
// and while the QP holds a WQE claimed from it (srqHeld) — and destroying
// a pinned SRQ is refused (EBUSY) rather than unmapping a ring a
// responder reads. A target QP delivers to the SRQs of every process of
// the VM in its domain: its responder holds the VM's xmem (QP.Hold), which
// whatever unmaps or changes any process's memory waits out (lockMem), so
// the SRQ's process's memory, its CQ and its SRQ ring stay while it
// holds it; an SRQ whose process is going (dying, its teardown under
// way) is refused like one outside the domain, and a receive a target QP
// holds of it is forgotten without a completion, its CQ going with it.
//
// A target QP is shared as the kernel shares one: the processes of the
// VM that opened its domain may open it by number (OpenQP, ibv_open_qp),
// each getting a handle of its own (qpOpen) that modifies, queries and
// destroys it, and hears its async events. Destroying an opened handle
// drops that open; the creator's destroy, while opens remain, only takes
// the QP out of the creator's handles (QP.orphan): the QP lives until
// the creator's handle and every open are gone, or until the creator's
// process ends, which ends it (its counters and charges are that
// process's).
//
// Lock order: Device.mu, then an XRCD's mu; a QP's rqMu, then an XRCD's
// mu; a process's memMu, then the VM's xmem, then a QP's rqMu.

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// FileID identifies the file an XRC domain was opened through: its
// device and inode numbers.
type FileID struct{ Dev, Ino uint64 }

// XRCD is an XRC domain, shared by the VM's processes that opened it
// through the same file. Safe for concurrent use.
type XRCD struct {
	file  FileID // zero: a private domain
	opens int    // handles open on it; guarded by Device.mu

	mu   sync.Mutex
	srqs map[uint32]*SRQ // +checklocks:mu
}

// xrcdHandle is one process's open of a domain: its handle in the
// process's context, and the PD its target QPs are created in (a target
// QP has none of its own; the adapter is the one the domain was opened
// on).
type xrcdHandle struct {
	handle uint32
	x      *XRCD
	pd     *PD
	refs   int // SRQs and target QPs created through it; guarded by vm.objMu
}

// OpenXRCD opens an XRC domain on adapter adName (ibv_open_xrcd). file,
// when not nil, names the domain within the VM: with create a domain is
// made for a file that names none yet, with excl a file that names one is
// refused. Without a file the domain is new and private.
func (v *Context) OpenXRCD(adName string, file *FileID, create, excl bool) (uint32, error) {
	ad, err := v.Adapter(adName)
	if err != nil {
		return 0, err
	}
	v.objMu.Lock()
	n := len(v.xrcds)
	v.objMu.Unlock()
	if n >= abi.MaxXRCD {
		return 0, abi.Errorf(abi.CodeLimit, "", "VM %q: this process has %d XRC domains open, the limit (max_xrcds): close some first", v.name, n)
	}
	d := v.d
	d.mu.Lock()
	var x *XRCD
	if file != nil {
		x = v.procs.xrcds[*file]
		switch {
		case x == nil && !create:
			d.mu.Unlock()
			return 0, abi.Errorf(abi.CodeInvalid, "oflags", "the file names no XRC domain of VM %q yet: open it with O_CREAT to create one", v.name)
		case x != nil && excl:
			d.mu.Unlock()
			return 0, abi.Errorf(abi.CodeInvalid, "oflags", "the file names an XRC domain of VM %q already, and O_EXCL was asked for", v.name)
		}
	}
	if x == nil {
		x = &XRCD{srqs: map[uint32]*SRQ{}}
		if file != nil {
			x.file = *file
			if v.procs.xrcds == nil {
				v.procs.xrcds = map[FileID]*XRCD{}
			}
			v.procs.xrcds[*file] = x
		}
	}
	x.opens++
	d.mu.Unlock()

	v.objMu.Lock()
	defer v.objMu.Unlock()
	h := &xrcdHandle{handle: v.allocHandleLocked(), x: x, pd: &PD{ad: ad}}
	v.xrcds[h.handle] = h
	return h.handle, nil
}

// CloseXRCD closes this process's handle h of a domain (ibv_close_xrcd);
// one with SRQs or target QPs created through it is refused (EBUSY).
func (v *Context) CloseXRCD(h uint32) error {
	v.objMu.Lock()
	xh, ok := v.xrcds[h]
	switch {
	case !ok:
		v.objMu.Unlock()
		return abi.Errorf(abi.CodeNotFound, "handle", "no XRC domain with handle %d", h)
	case xh.refs > 0:
		v.objMu.Unlock()
		return abi.Errorf(abi.CodeState, "handle", "XRC domain %d still holds %d SRQs or QPs of this process: destroy them first (EBUSY)", h, xh.refs)
	}
	delete(v.xrcds, h)
	v.objMu.Unlock()
	v.dropXRCD(xh.x)
	return nil
}

// dropXRCD counts one handle of x closed; with the last, the file names
// the domain no more.
func (v *Context) dropXRCD(x *XRCD) {
	v.d.mu.Lock()
	defer v.d.mu.Unlock()
	x.opens--
	if x.opens == 0 && x.file != (FileID{}) && v.procs.xrcds[x.file] == x {
		delete(v.procs.xrcds, x.file)
	}
}

// xrcdByHandleLocked returns the process's open domain h.
//
// +checklocks:v.objMu
func (v *Context) xrcdByHandleLocked(h uint32) (*xrcdHandle, error) {
	xh, ok := v.xrcds[h]
	if !ok {
		return nil, abi.Errorf(abi.CodeNotFound, "xrcd", "no XRC domain with handle %d", h)
	}
	return xh, nil
}

// addSRQ numbers s in x: a 24-bit number drawn at random, not 0 and
// unused in the domain.
func (x *XRCD) addSRQ(s *SRQ) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var b [4]byte
	for {
		rand.Read(b[:]) // never fails (crypto/rand)
		n := binary.LittleEndian.Uint32(b[:]) & abi.MaxSRQN
		if _, used := x.srqs[n]; n != 0 && !used {
			s.srqn = n
			x.srqs[n] = s
			return
		}
	}
}

// removeSRQ takes s out of x, unless a target QP's responder has it
// pinned (force: the process is going, and its QPs with it).
func (x *XRCD) removeSRQ(s *SRQ, force bool) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if s.xpins > 0 && !force {
		return abi.Errorf(abi.CodeState, "handle", "XRC SRQ %d is taking a message for a target QP: destroy it once the traffic stopped (EBUSY)", s.handle)
	}
	delete(x.srqs, s.srqn)
	return nil
}

// pin returns the SRQ numbered n in x, pinned, if it is in the domain and
// its process is not going; nil otherwise. The caller holds the VM's
// xmem for reading: the SRQ's process's memory stays while it does.
func (x *XRCD) pin(n uint32) *SRQ {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.srqs[n]
	if s == nil || s.vm.dying.Load() {
		return nil
	}
	s.xpins++
	return s
}

// unpin lets go of one pin of s.
func (s *SRQ) unpin() {
	s.xrcd.mu.Lock()
	s.xpins--
	s.xrcd.mu.Unlock()
}

// repin takes one more pin of s, which the caller has pinned already.
func (s *SRQ) repin() {
	s.xrcd.mu.Lock()
	s.xpins++
	s.xrcd.mu.Unlock()
}

// SRQN returns an XRC SRQ's number (ibv_get_srq_num); 0 for a basic SRQ.
func (s *SRQ) SRQN() uint32 { return s.srqn }

// checkXRC is the start of checkRequest at an XRC target QP: it resolves
// the SRQ number r names in p's domain and pins it for the check (the
// caller unpins it: m.xsrq). A number outside the domain is an invalid
// request, and p goes to ERR. An XRC initiator QP answers no request.
func (p *QP) checkXRC(r *Request, m *Message) (ok bool) {
	if p.typ == abi.QPTypeXRCSend {
		p.MoveToErr(fmt.Sprintf("%s from QP 0x%x refused: an XRC initiator QP takes no requests", r.Op, r.SrcQPN))
		return false
	}
	s := p.xrcd.pin(r.SRQN)
	if s == nil {
		p.MoveToErr(fmt.Sprintf("%s from QP 0x%x names XRC SRQ 0x%x, which is not in the target QP's XRC domain", r.Op, r.SrcQPN, r.SRQN))
		return false
	}
	m.xsrq, m.pd, m.mv = s, s.pd, s.vm
	return true
}

// holdXSRQLocked makes m's SRQ the one target QP p takes its receive
// from, for a message that needs one. A QP that holds a WQE of another
// SRQ (a message that did not complete, then retransmitted naming
// another SRQ) refuses it, unless that SRQ's process ended.
//
// +checklocks:p.rqMu
func (p *QP) holdXSRQLocked(m *Message) bool {
	if p.srqHeld && p.xsrqGoneLocked() {
		p.dropSRQHeldLocked() // its process ended: the WQE went with it
	}
	if p.srqHeld {
		return p.xsrq == m.xsrq
	}
	p.xsrq = m.xsrq
	return true
}

// releaseXSRQLocked forgets the SRQ of a target QP that holds no WQE of
// it any more, and its pin.
//
// +checklocks:p.rqMu
func (p *QP) releaseXSRQLocked() {
	if p.xsrq != nil && !p.srqHeld {
		p.xsrq.unpin()
		p.xsrq = nil
	}
}

// xsrqGoneLocked reports whether p is a target QP whose current SRQ's
// process is going: its memory, CQ and ring are going with it.
//
// +checklocks:p.rqMu
func (p *QP) xsrqGoneLocked() bool { return p.xsrq != nil && p.xsrq.vm.dying.Load() }

// flushTarget is flushRQ for a target QP in ERR: the WQE it holds, of
// its current SRQ, completes with WR_FLUSH_ERR in that SRQ's CQ — another
// process's, maybe, whose memory it holds (the VM's xmem) only while it
// tries: a full CQ is tried again after a back-off with xmem let go, so
// that no other process's deregistration waits for this one's consumer.
// A WQE of an SRQ whose process is ending goes without a completion.
func (q *QP) flushTarget() {
	xmem := &q.vm.procs.xmem
	for wait := time.Duration(0); ; {
		xmem.RLock()
		q.rqMu.Lock()
		q.rqCatchUpLocked()
		if q.srqHeld && q.xsrqGoneLocked() {
			q.dropSRQHeldLocked()
		}
		if q.srqHeld {
			e := abi.CQE{WRID: q.rwqe.WRID, QPNum: q.qpn, Opcode: abi.WCRecv, Status: abi.WCWRFlushErr}
			cq := q.xsrq.cq
			done, full := cq.offer(&e)
			if full && !q.stop.Load() && !q.destroyed.Load() { // a QP being destroyed gives up, as push does
				cq.event.Ring() // wake a waiting consumer; the SRQ's pin keeps the CQ
				q.rqMu.Unlock()
				xmem.RUnlock()
				wait = backOff(wait)
				continue
			}
			if done {
				q.ctr.noteCompletion(abi.WCWRFlushErr)
			}
			q.srqHeld = false
			q.rqSeq++
			q.releaseXSRQLocked()
		}
		q.lastWQESent = true // a target QP has no last-WQE event: it is on no SRQ of its own
		q.rqMu.Unlock()
		xmem.RUnlock()
		return
	}
}

// rqSRQLocked returns the SRQ p's receives come from: its own, or, for a
// target QP, the one its current message named (nil: none).
//
// +checklocks:p.rqMu
func (p *QP) rqSRQLocked() *SRQ {
	if p.srq != nil {
		return p.srq
	}
	return p.xsrq
}

// recvCQLocked returns the CQ p's receives complete in: its own, or a
// target QP's current SRQ's.
//
// +checklocks:p.rqMu
func (p *QP) recvCQLocked() *CQ {
	if p.typ == abi.QPTypeXRCRecv && p.xsrq != nil {
		return p.xsrq.cq
	}
	return p.recvCQ
}

// sharedRQ reports whether p takes its receives from SRQs: a QP created
// on an SRQ, or an XRC target QP.
func (p *QP) sharedRQ() bool { return p.srq != nil || p.typ == abi.QPTypeXRCRecv }

// xrcTransition is the attributes a transition of an XRC QP of type t
// needs and allows, from RC's: an initiator's RTR needs no responder
// attributes (max_dest_rd_atomic, min_rnr_timer), a target's RTS no
// requester ones (retry_cnt, rnr_retry, max_rd_atomic), as Linux's
// qp_state_table says of IB_QPT_XRC_INI and IB_QPT_XRC_TGT; what RC
// needs stays allowed.
func xrcTransition(t abi.QPType, cur, next abi.QPState, need []required, allowed abi.QPAttrMask) ([]required, abi.QPAttrMask) {
	var drop abi.QPAttrMask
	switch {
	case t == abi.QPTypeXRCSend && cur == abi.QPSInit && next == abi.QPSRTR:
		drop = abi.MaskMaxDestRdAtomic | abi.MaskMinRNRTimer
	case t == abi.QPTypeXRCRecv && cur == abi.QPSRTR && next == abi.QPSRTS:
		drop = abi.MaskRetryCnt | abi.MaskRNRRetry | abi.MaskMaxRdAtomic
	}
	var kept []required
	for _, r := range need {
		allowed |= r.mask
		if r.mask&drop == 0 {
			kept = append(kept, r)
		}
	}
	return kept, allowed
}

// QPOpen is one process's open of an XRC target QP (OpenQP,
// ibv_open_qp): its handle in that process's context, the domain handle
// it was opened through, and the functions told of the QP's async
// events for it.
type QPOpen struct {
	handle  uint32
	q       *QP
	xh      *xrcdHandle
	onEvent atomic.Pointer[func(event int, why string)]
}

// Handle is the open's handle in its process's context.
func (o *QPOpen) Handle() uint32 { return o.handle }

// QP is the target QP opened.
func (o *QPOpen) QP() *QP { return o.q }

// SetOnEvent sets the function told of the QP's async events for this
// open (abi.EventQPFatal, abi.EventCommEst), outside the QP's locks (nil:
// none).
func (o *QPOpen) SetOnEvent(f func(event int, why string)) {
	if f == nil {
		o.onEvent.Store(nil)
		return
	}
	o.onEvent.Store(&f)
}

// OpenQP opens the XRC target QP numbered r.QPN in the domain this
// process opened as r.XRCD (ibv_open_qp). The QP may be any process's of
// the VM, this one's included; one that is not a target QP of that
// domain on the domain handle's adapter — another type, another domain's,
// another VM's, none — is refused (EINVAL, as the kernel refuses it).
func (v *Context) OpenQP(r *abi.OpenQP) (*QPOpen, error) {
	v.objMu.Lock()
	xh, err := v.xrcdByHandleLocked(r.XRCD)
	n := len(v.qps) + len(v.openQPs)
	v.objMu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case n >= v.d.cfg.Limits.MaxQP:
		return nil, abi.Errorf(abi.CodeLimit, "", "VM %q: this process has %d QPs and opened QPs, the limit (max_qp): destroy some first", v.name, n)
	}
	q := v.d.QP(r.QPN)
	notOurs := abi.Errorf(abi.CodeInvalid, "qpn", "QP 0x%x is not an XRC target QP of this XRC domain: ibv_open_qp opens one a process of the VM created in the domain it names", r.QPN)
	if q == nil || q.typ != abi.QPTypeXRCRecv || q.xrcd != xh.x || q.ad.name != xh.pd.ad.name {
		return nil, notOurs
	}
	o := &QPOpen{q: q, xh: xh}
	q.shareMu.Lock()
	if q.ending {
		q.shareMu.Unlock()
		return nil, notOurs // destroyed meanwhile
	}
	q.opens = append(q.opens, o)
	q.shareMu.Unlock()
	v.objMu.Lock()
	if v.xrcds[r.XRCD] != xh {
		v.objMu.Unlock()
		v.dropOpen(o)
		return nil, abi.Errorf(abi.CodeNotFound, "xrcd", "XRC domain %d was closed meanwhile", r.XRCD)
	}
	o.handle = v.allocHandleLocked()
	xh.refs++
	v.openQPs[o.handle] = o
	v.objMu.Unlock()
	return o, nil
}

// DestroyQPHandle destroys the QP handle h of this process: a QP it
// created (DestroyQP), or its open of a target QP, which it drops (the
// QP goes with its last handle). It returns the QP.
func (v *Context) DestroyQPHandle(h uint32) (*QP, error) {
	v.objMu.Lock()
	o, opened := v.openQPs[h]
	if opened {
		delete(v.openQPs, h)
		o.xh.refs--
	}
	v.objMu.Unlock()
	if opened {
		v.dropOpen(o)
		return o.q, nil
	}
	q, err := v.QPByHandle(h)
	if err != nil {
		return nil, err
	}
	v.DestroyQP(q)
	return q, nil
}

// dropOpen takes o out of its QP's opens; with the last, an orphan goes.
// The caller holds none of the process's locks (objMu comes before a
// QP's shareMu).
func (v *Context) dropOpen(o *QPOpen) {
	q := o.q
	o.SetOnEvent(nil)
	q.shareMu.Lock()
	q.opens = slices.DeleteFunc(q.opens, func(p *QPOpen) bool { return p == o })
	last := q.orphaned && len(q.opens) == 0 && !q.ending
	if last {
		q.ending = true
	}
	q.shareMu.Unlock()
	if last {
		q.vm.destroyQP(q)
	}
}

// wasOrphaned reports whether q's creator destroyed its handle while
// opens held it.
func (q *QP) wasOrphaned() bool {
	q.shareMu.Lock()
	defer q.shareMu.Unlock()
	return q.orphaned
}

// orphan takes target QP q out of the creator's handles if opens hold
// it, and reports whether it did: the creator hears no more of its
// events, and its domain handle is free to close; q goes with its last
// open, or with the creator's process. Without opens, no open can be made
// any more, and the caller destroys q.
func (v *Context) orphan(q *QP) bool {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	q.shareMu.Lock()
	defer q.shareMu.Unlock()
	if len(q.opens) == 0 {
		q.ending = true
		return false
	}
	q.orphaned = true
	q.SetOnFatal(nil)
	q.SetOnEvent(nil)
	delete(v.qps, q.handle)
	v.orphans[q] = true
	q.xh.refs--
	return true
}

// tellOpens tells q's opens of event.
func (q *QP) tellOpens(event int, why string) {
	if q.typ != abi.QPTypeXRCRecv {
		return
	}
	q.shareMu.Lock()
	opens := slices.Clone(q.opens)
	q.shareMu.Unlock()
	for _, o := range opens {
		if f := o.onEvent.Load(); f != nil {
			(*f)(event, why)
		}
	}
}

// endOpens tells the opens of q, which its creator's process takes with
// it, that it went (IBV_EVENT_QP_FATAL): their handles now only query
// and destroy.
func (q *QP) endOpens() {
	q.shareMu.Lock()
	q.ending = true
	q.shareMu.Unlock()
	q.tellOpens(abi.EventQPFatal, "the process that created the XRC target QP ended: the QP is gone")
}
