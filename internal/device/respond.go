// SPDX-License-Identifier: Apache-2.0

package device

// The responder of an RC operation, shared by every path: the checks and
// effects at the target QP are the same whether the request comes from a
// QP on this host (memcpy: the requester's goroutine runs this) or from
// another host (tcp: the connection's reader runs it). Only where the
// payload comes from or goes to differs (payload).

import (
	"fmt"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/rc"
)

// Request is an RC operation as its responder sees it.
type Request struct {
	Op      abi.Opcode
	SrcQPN  uint32
	RKey    uint32
	RAddr   uint64
	Total   uint64
	Imm     uint32
	Compare uint64 // compare, or the addend
	Swap    uint64 // swap; an atomic write's 8 bytes
	// Solicited: the requester set the solicited-event bit (a SEND or a
	// WRITE with immediate posted with IBV_SEND_SOLICITED); the receive
	// completion wakes a CQ armed for solicited completions only.
	Solicited bool
	// SRQN is the XRC SRQ number a request to an XRC target QP names
	// (xrc.go); 0 for other QPs.
	SRQN uint32
}

// A SEND with invalidate (abi.OpSendWithInv) names the rkey it invalidates
// at its target in Request.RKey.

// Outcome is how a request ended at the responder, when not with a
// status.
type Outcome uint8

const (
	OutDone   Outcome = iota // the status is final
	OutNoPeer                // nothing answered: transport retry
	OutRNR                   // the responder had no receive posted
)

// Payload moves a request's data.
type Payload interface {
	// In fills dst with the next len(dst) bytes of the request's data
	// (WRITE, SEND).
	In(dst []byte) error
	// Out delivers the data a READ asked for.
	Out(src []byte) error
	// Atomic delivers an Atomic's original value.
	Atomic(old uint64)
}

// Message is one request at its responder, taken in steps, as a RoCE
// responder receives a message in packets: begin makes every check and
// takes the receive WQE of a SEND; place gives where the bytes at an
// offset go (or, for a READ, come from), for any offset, any number of
// times (a retransmitted packet lands on the same bytes); end completes
// it. The slices place returns are guest memory: they may be used only
// while the caller holds the responder VM's memMu for reading, as it did
// at begin; a caller that lets go of it between packets calls revalidate
// after taking it again. A message that took a receive (m.recv) places
// each packet under the responder's rqMu, after checking that taken still
// holds: the receive may have been flushed (ERR) or dropped (RESET) since,
// and its buffers are then the workload's again. One message at a time
// per responder QP: the callers serialize them (the tcp responder under
// the QP's PSN lock, the memcpy path by its one requester). The caller
// owns m.
type Message struct {
	r    Request
	segs [abi.MaxSGE][]byte // the target (WRITE, READ: one range; SEND: the receive's buffers)
	nseg int
	recv bool   // a receive WQE was taken (SEND, WRITE_WITH_IMM)
	wrid uint64 // its wr_id
	seq  uint64 // the responder's rqSeq when it was taken
	sges [abi.MaxSGE]abi.SGE
	nsge int
	old  uint64 // an atomic's original value
	pd   *PD    // the PD the target is checked against: the QP's, or its XRC SRQ's
	xsrq *SRQ   // an XRC target QP's: the SRQ the request named, pinned during the check
	// mv is the process whose memory the target is in: the QP's, or its
	// XRC SRQ's (any process of the VM).
	mv *Context
}

// Verdict is how a responder ended a request, or a step of one: Out,
// and with OutDone its final Status (WCSuccess, or the error the
// requester completes with); with OutRNR, RNRTimer is the delay the RNR
// NAK asks the requester to wait.
type Verdict struct {
	Out      Outcome
	Status   abi.WCStatus
	RNRTimer uint8
}

// Response is what Respond did with a whole request: its Verdict and the
// bytes it moved (N: the message's length, 8 for an atomic).
type Response struct {
	Verdict
	N uint32
}

// Begin checks request r at responder p and prepares m, before any byte
// moves: a refused request leaves the target untouched. It executes an
// atomic at once (one packet). The caller holds p for the request
// (Admit). OutRNR: no receive is posted.
func (p *QP) Begin(r *Request, m *Message) Verdict {
	out, st, t := p.check(r, m, false)
	return Verdict{Out: out, Status: st, RNRTimer: t}
}

// check is begin; rqHeld says the caller holds p.rqMu already.
func (p *QP) check(r *Request, m *Message, rqHeld bool) (out Outcome, st abi.WCStatus, rnrTimer uint8) {
	out, st, rnrTimer = p.checkRequest(r, m, rqHeld)
	if out == OutRNR {
		p.ctr.RNRSent.Add(1)
	}
	return out, st, rnrTimer
}

func (p *QP) checkRequest(r *Request, m *Message, rqHeld bool) (out Outcome, st abi.WCStatus, rnrTimer uint8) {
	m.r, m.nseg, m.recv, m.nsge, m.pd, m.xsrq, m.mv = *r, 0, false, 0, p.pd, nil, p.vm
	if p.typ == abi.QPTypeUC {
		return p.checkUC(r, m, rqHeld)
	}
	if p.typ.IsXRC() {
		if !p.checkXRC(r, m) {
			return OutDone, abi.WCRemInvReqErr, 0
		}
		defer m.xsrq.unpin()
	}
	pv := m.mv
	p.mu.Lock()
	access, rnrTimer, rdAtomic := p.attr.AccessFlags, p.attr.MinRNRTimer, p.attr.MaxDestRdAtomic
	p.mu.Unlock()
	if r.Op.IsRdAtomic() && rdAtomic == 0 {
		// No responder resources for READs and atomics: an invalid
		// request (IBTA 9.9.2, class C; rxe's
		// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ), and the responder goes to ERR.
		p.MoveToErr(fmt.Sprintf("%s from QP 0x%x refused: max_dest_rd_atomic is 0 (no responder resources for RDMA READ and atomics)", r.Op, r.SrcQPN))
		return OutDone, abi.WCRemInvReqErr, 0
	}
	total := r.Total
	switch r.Op {
	case abi.OpRDMAWrite, abi.OpRDMAWriteWithImm:
		dst, ok := pv.resolveRemote(p, m.pd, r.RKey, r.RAddr, total, abi.AccessRemoteWrite)
		if !ok || access&abi.AccessRemoteWrite == 0 && total > 0 {
			p.MoveToErr(fmt.Sprintf("remote access error: RDMA WRITE from QP 0x%x with rkey 0x%x to [0x%x,+%d)", r.SrcQPN, r.RKey, r.RAddr, total))
			return OutDone, abi.WCRemAccessErr, 0
		}
		m.segs[0], m.nseg = dst, 1
		if r.Op == abi.OpRDMAWriteWithImm {
			return p.takeRecv(m, false, rnrTimer, rqHeld)
		}
		return OutDone, abi.WCSuccess, 0

	case abi.OpSend, abi.OpSendWithImm:
		return p.takeRecv(m, true, rnrTimer, rqHeld)

	case abi.OpSendWithInv:
		if !p.checkInvalidate(r.RKey) {
			// An rkey that is no window p may invalidate: an invalid
			// request (rxe's RESPST_ERR_INVALIDATE_RKEY), p goes to ERR.
			p.refuseInvalidate(r.SrcQPN, r.RKey)
			return OutDone, abi.WCRemInvReqErr, 0
		}
		return p.takeRecv(m, true, rnrTimer, rqHeld)

	case abi.OpRDMARead:
		src, ok := pv.resolveRemote(p, m.pd, r.RKey, r.RAddr, total, abi.AccessRemoteRead)
		if !ok || access&abi.AccessRemoteRead == 0 && total > 0 {
			p.MoveToErr(fmt.Sprintf("remote access error: RDMA READ from QP 0x%x with rkey 0x%x of [0x%x,+%d)", r.SrcQPN, r.RKey, r.RAddr, total))
			return OutDone, abi.WCRemAccessErr, 0
		}
		m.segs[0], m.nseg = src, 1
		return OutDone, abi.WCSuccess, 0

	case abi.OpAtomicCmpAndSwp, abi.OpAtomicFetchAdd:
		word, st := p.word(r, m, access, abi.AccessRemoteAtomic)
		if st != abi.WCSuccess {
			return OutDone, st, 0
		}
		if r.Op == abi.OpAtomicFetchAdd {
			m.old = word.Add(r.Compare) - r.Compare
		} else {
			for {
				m.old = word.Load()
				if m.old != r.Compare || word.CompareAndSwap(m.old, r.Swap) {
					break
				}
			}
		}
		return OutDone, abi.WCSuccess, 0

	case abi.OpAtomicWrite:
		// r.Swap's 8 bytes, stored at once: no reader sees half of them.
		word, st := p.word(r, m, access, abi.AccessRemoteWrite)
		if st != abi.WCSuccess {
			return OutDone, st, 0
		}
		word.Store(r.Swap)
		return OutDone, abi.WCSuccess, 0
	}
	return OutDone, abi.WCRemInvReqErr, 0
}

// word resolves the 8-byte target of atomic r (or atomic write) in a
// region of m's PD, or a window, with need, the QP granting access: the
// word, or the status that refuses r (misaligned REM_INV_REQ_ERR, else
// REM_ACCESS_ERR), p then in ERR.
func (p *QP) word(r *Request, m *Message, access, need abi.Access) (*atomic.Uint64, abi.WCStatus) {
	if r.RAddr&7 != 0 {
		p.MoveToErr(fmt.Sprintf("misaligned %s at 0x%x from QP 0x%x", r.Op, r.RAddr, r.SrcQPN))
		return nil, abi.WCRemInvReqErr
	}
	t, ok := m.mv.resolveRemote(p, m.pd, r.RKey, r.RAddr, 8, need)
	if !ok || access&need == 0 || !abi.Aligned8(t, 0) {
		p.MoveToErr(fmt.Sprintf("remote access error: %s from QP 0x%x with rkey 0x%x at 0x%x", r.Op, r.SrcQPN, r.RKey, r.RAddr))
		return nil, abi.WCRemAccessErr
	}
	return abi.Word64(t, 0), abi.WCSuccess
}

// takeRecv takes the receive WQE at p's RQ head for m: a SEND's buffers
// (data), or a WRITE_WITH_IMM's completion. The WQE stays in the queue
// until end consumes it. rqHeld says the caller holds p.rqMu.
//
// +checklocksignore: takes rqMu unless rqHeld says the caller holds it
func (p *QP) takeRecv(m *Message, data bool, rnrTimer uint8, rqHeld bool) (Outcome, abi.WCStatus, uint8) {
	if !rqHeld {
		p.rqMu.Lock()
		defer p.rqMu.Unlock()
	}
	r := &m.r
	if m.xsrq != nil && !p.holdXSRQLocked(m) {
		p.MoveToErr(fmt.Sprintf("%s from QP 0x%x names XRC SRQ 0x%x while the QP holds a receive of SRQ 0x%x for the message", r.Op, r.SrcQPN, r.SRQN, p.xsrq.srqn))
		return OutDone, abi.WCRemInvReqErr, 0
	}
	st := p.peekRecvLocked(r.SrcQPN)
	if m.xsrq != nil {
		p.releaseXSRQLocked()
	}
	switch st {
	case recvNone:
		return OutRNR, 0, rnrTimer
	case recvBroken:
		return OutDone, abi.WCRemOpErr, 0
	}
	rw := &p.rwqe
	m.recv, m.wrid, m.seq = true, rw.WRID, p.rqSeq
	if !data {
		return OutDone, abi.WCSuccess, 0
	}
	m.nsge = copy(m.sges[:], rw.SGE[:rw.NumSGE])
	switch room, ok := m.resolveRecv(p); {
	case !ok:
		m.recv = false
		p.MoveToErr("receive work request has a bad SGE (LOC_PROT_ERR)")             // ERR first, as in execOne
		p.completeRecvLocked(abi.WCLocProtErr, abi.WCRecv, 0, 0, 0, r.SrcQPN, false) // if the CQ is full, the flush completes it
		return OutDone, abi.WCRemOpErr, 0
	case room < r.Total:
		m.recv = false
		p.MoveToErr(fmt.Sprintf("a %d-byte message does not fit the %d-byte receive buffer (LOC_LEN_ERR)", r.Total, room))
		p.completeRecvLocked(abi.WCLocLenErr, abi.WCRecv, 0, 0, 0, r.SrcQPN, false)
		return OutDone, abi.WCRemInvReqErr, 0
	}
	return OutDone, abi.WCSuccess, 0
}

// resolveRecv resolves the receive's SGEs into m.segs, reporting their
// room; false if one is not a region of p's PD with local write.
func (m *Message) resolveRecv(p *QP) (uint64, bool) {
	var room uint64
	m.nseg = 0
	for _, sge := range m.sges[:m.nsge] {
		b, ok := m.mv.resolve(m.pd, sge.LKey, sge.Addr, uint64(sge.Length), abi.AccessLocalWrite)
		if !ok {
			clear(m.segs[:m.nseg])
			m.nseg = 0
			return 0, false
		}
		m.segs[m.nseg] = b
		m.nseg++
		room += uint64(sge.Length)
	}
	return room, true
}

// Revalidate resolves m's target again at p, for a caller that let go of
// the responder VM's memMu since begin: a region deregistered meanwhile
// fails it (the message then fails as a remote access or operation
// error).
func (p *QP) Revalidate(m *Message) bool {
	r := &m.r
	if m.mv != nil && m.mv != p.vm && m.mv.dying.Load() {
		return false // an XRC SRQ's process went: its memory is going (xrc.go)
	}
	switch {
	case r.Op.IsSend():
		_, ok := m.resolveRecv(p)
		return ok
	case r.Op == abi.OpRDMARead:
		b, ok := m.mv.resolveRemote(p, m.pd, r.RKey, r.RAddr, r.Total, abi.AccessRemoteRead)
		m.segs[0] = b
		return ok
	case r.Op == abi.OpRDMAWrite || r.Op == abi.OpRDMAWriteWithImm:
		b, ok := m.mv.resolveRemote(p, m.pd, r.RKey, r.RAddr, r.Total, abi.AccessRemoteWrite)
		m.segs[0] = b
		return ok
	}
	return true
}

// Place returns where the message's bytes [off, off+n) go (READ: come
// from): guest memory, at most n bytes, fewer at the end of a receive
// buffer; the caller asks again from where it ends. nil when off+n is
// beyond the message.
func (m *Message) Place(off, n uint64) []byte {
	if n == 0 || off+n < off || off+n > m.r.Total {
		return nil
	}
	for _, b := range m.segs[:m.nseg] {
		if off < uint64(len(b)) {
			return b[off : off+min(n, uint64(len(b))-off)]
		}
		off -= uint64(len(b))
	}
	return nil
}

// End completes the message at p: a SEND or WRITE_WITH_IMM consumes its
// receive WQE with a completion. outRNR when p's receive CQ is full: the
// bytes landed in a buffer still posted, which is not yet the receiver's
// to read, and the requester tries again. A receive flushed or reset
// since begin is not completed twice.
func (p *QP) End(m *Message) (Outcome, abi.WCStatus) {
	if !m.recv {
		clear(m.segs[:m.nseg])
		return OutDone, abi.WCSuccess
	}
	p.rqMu.Lock()
	defer p.rqMu.Unlock()
	return p.endLocked(m)
}

// taken reports whether the receive m took is still at p's RQ head, not
// flushed (ERR) or dropped (RESET) since.
//
// +checklocks:p.rqMu
func (m *Message) taken(p *QP) bool {
	p.rqCatchUpLocked()
	return m.recv && p.rqSeq == m.seq && !p.rqBroken && !p.xsrqGoneLocked()
}

// endLocked is end; the caller holds p.rqMu.
//
// +checklocks:p.rqMu
func (p *QP) endLocked(m *Message) (Outcome, abi.WCStatus) {
	defer clear(m.segs[:m.nseg])
	if !m.recv {
		return OutDone, abi.WCSuccess
	}
	r := &m.r
	if !m.taken(p) {
		return OutNoPeer, 0 // the receive went meanwhile (ERR flushed it, or RESET): as if p had dropped the request
	}
	p.rwqe.WRID = m.wrid
	op, flags, imm := abi.WCRecv, abi.WCFlags(0), r.Imm
	switch r.Op {
	case abi.OpSendWithImm:
		flags = abi.WCWithImm
	case abi.OpRDMAWriteWithImm:
		op, flags = abi.WCRecvRDMAWithImm, abi.WCWithImm
	case abi.OpSendWithInv:
		// The window goes before the completion that reports it.
		p.invalidateRemote(r.RKey)
		flags, imm = abi.WCWithInv, r.RKey
	}
	if !p.completeRecvLocked(abi.WCSuccess, op, uint32(r.Total), imm, flags, r.SrcQPN, r.Solicited) {
		p.ctr.RNRSent.Add(1)
		return OutRNR, 0
	}
	return OutDone, abi.WCSuccess
}

// Respond executes request r at p in one step — begin, every byte through
// io, end — for a path that moves no byte across I/O (memcpy). m is the
// caller's scratch. The caller holds what begin needs (Admit). err is an
// error of the payload's: the request did not complete.
//
// A message that takes a receive holds p.rqMu from begin to end, as a
// whole: its bytes land in a receive nothing else can flush meanwhile.
func (p *QP) Respond(r *Request, m *Message, io Payload) (Response, error) {
	held := r.Op.CarriesEvent()
	if held {
		p.rqMu.Lock()
		defer p.rqMu.Unlock()
	}
	out, st, n, t, err := p.respondLocked(r, m, io, held)
	return Response{Verdict: Verdict{Out: out, Status: st, RNRTimer: t}, N: n}, err
}

// respondLocked is respond; rqHeld says the caller holds p.rqMu (for a
// message that takes a receive).
func (p *QP) respondLocked(r *Request, m *Message, io Payload, rqHeld bool) (out Outcome, st abi.WCStatus, n uint32, rnrTimer uint8, err error) {
	out, st, rnrTimer = p.check(r, m, rqHeld)
	if out != OutDone || st != abi.WCSuccess {
		clear(m.segs[:m.nseg])
		return out, st, 0, rnrTimer, nil
	}
	switch r.Op {
	case abi.OpAtomicCmpAndSwp, abi.OpAtomicFetchAdd:
		io.Atomic(m.old)
		return OutDone, abi.WCSuccess, 8, 0, nil
	case abi.OpRDMARead:
		if r.Total > 0 {
			err = io.Out(m.segs[0])
		}
	default:
		for off := uint64(0); off < r.Total && err == nil; {
			b := m.Place(off, r.Total-off)
			err = io.In(b)
			off += uint64(len(b))
		}
	}
	if err != nil {
		clear(m.segs[:m.nseg])
		return OutDone, 0, 0, 0, err
	}
	if rqHeld {
		out, st = p.endLocked(m) // +checklocksignore: rqHeld says the caller holds p.rqMu
	} else {
		out, st = p.End(m)
	}
	if out == OutRNR {
		rnrTimer = p.minRNRTimer()
	}
	return out, st, uint32(r.Total), rnrTimer, nil
}

// minRNRTimer is the delay p asks of requesters in an RNR NAK.
func (p *QP) minRNRTimer() uint8 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attr.MinRNRTimer
}

// Grow makes the message of a SEND total bytes long, for a responder
// that learns a SEND's length packet by packet (Begin took it with the
// first packet's length). A message that outgrows its receive fails as
// Begin fails one that does not fit: the responder goes to ERR, the
// receive completes with LOC_LEN_ERR, and the status (REM_INV_REQ_ERR) is
// what the requester gets. The caller holds what Begin needs.
func (p *QP) Grow(m *Message, total uint64) abi.WCStatus {
	if total <= m.r.Total {
		return abi.WCSuccess
	}
	if !m.recv || !m.r.Op.IsSend() {
		return abi.WCRemInvReqErr
	}
	var room uint64
	for _, b := range m.segs[:m.nseg] {
		room += uint64(len(b))
	}
	if total <= room {
		m.r.Total = total
		return abi.WCSuccess
	}
	if p.typ == abi.QPTypeUC {
		return abi.WCRemInvReqErr // dropped, the receive left posted (checkUC)
	}
	p.rqMu.Lock()
	defer p.rqMu.Unlock()
	if !m.taken(p) {
		return abi.WCWRFlushErr
	}
	m.recv = false
	p.MoveToErr(fmt.Sprintf("a message of at least %d bytes does not fit the %d-byte receive buffer (LOC_LEN_ERR)", total, room))
	p.completeRecvLocked(abi.WCLocLenErr, abi.WCRecv, 0, 0, 0, m.r.SrcQPN, false)
	return abi.WCRemInvReqErr
}

// Write copies data to the message's bytes at off (a SEND's or a WRITE's
// packet), and reports whether all of it landed: false when off+len(data)
// is beyond the message, or the receive it took went meanwhile (flushed
// or reset). The caller holds what Begin needs, and calls Revalidate
// first if it let go of it since.
func (p *QP) Write(m *Message, off uint64, data []byte) bool {
	if m.recv {
		p.rqMu.Lock()
		defer p.rqMu.Unlock()
		if !m.taken(p) {
			return false
		}
	}
	for len(data) > 0 {
		b := m.Place(off, uint64(len(data)))
		if b == nil {
			return false
		}
		n := copy(b, data)
		off += uint64(n)
		data = data[n:]
	}
	return true
}

// Filler writes a message's bytes straight into guest memory: a
// responder that reads a payload from a socket into its target without a
// copy of its own.
type Filler interface {
	// Fill writes up to len(dst) bytes of the payload into dst and
	// returns how many it wrote. It must not block waiting for a peer:
	// the caller holds the responder VM's memory while it runs.
	Fill(dst []byte) (int, error)
}

// Fill lets f write the message's bytes from off on, at most n of them,
// straight into guest memory, and returns how many f wrote. ok is false,
// and f is not called, when off+n is beyond the message or the receive m
// took went meanwhile (flushed or reset). The caller holds what Begin
// needs (Hold), and calls Revalidate first if it let go of it since:
// the guest memory f writes is the message's target only while it does.
func (p *QP) Fill(m *Message, off, n uint64, f Filler) (written int, ok bool, err error) {
	if m.recv {
		p.rqMu.Lock()
		defer p.rqMu.Unlock()
		if !m.taken(p) {
			return 0, false, nil
		}
	}
	b := m.Place(off, n)
	if b == nil {
		return 0, false, nil
	}
	written, err = f.Fill(b)
	return written, true, err
}

// SetSolicited records the solicited-event bit of a message's last
// packet, where a responder that takes a message in packets learns it.
func (m *Message) SetSolicited(se bool) { m.r.Solicited = se }

// SetImm makes a SEND's message one with immediate data imm: a responder
// that learns it from the message's last packet.
func (m *Message) SetImm(imm uint32) {
	if m.r.Op == abi.OpSend {
		m.r.Op = abi.OpSendWithImm
	}
	m.r.Imm = imm
}

// Invalidate makes a SEND's message one with invalidate of rkey: a
// responder that learns it from the message's last packet. The rkey is
// checked as Begin checks a SEND with invalidate's.
func (p *QP) Invalidate(m *Message, rkey uint32) abi.WCStatus {
	if m.r.Op == abi.OpSendWithInv && m.r.RKey == rkey {
		return abi.WCSuccess // the last packet again, after an RNR NAK
	}
	if m.r.Op != abi.OpSend || !p.checkInvalidate(rkey) {
		p.refuseInvalidate(m.r.SrcQPN, rkey)
		return abi.WCRemInvReqErr
	}
	m.r.Op, m.r.RKey = abi.OpSendWithInv, rkey
	return abi.WCSuccess
}

// Old is an atomic's original value, once Begin executed it.
func (m *Message) Old() uint64 { return m.old }

// Binding is a path's test that a responder QP is bound to the requester
// of a request it carries: the QP is connected over that path, to that
// peer (host, address) and QP. Implemented by a pointer to a path's own
// state, so that Admit allocates nothing.
type Binding interface {
	// Bound reports whether p is connected to the request's requester;
	// Admit calls it holding p.
	Bound(p Target) bool
}

// Admit opens the responder's sequence of every path at p for one
// request: it holds p (Hold: p and its VM alive, p in RTR, RTS or SQD),
// then checks that p's port is up and that p is bound to the requester
// (b). A request that fails a check is dropped, counted (Dropped, by Hold
// for a state that does not receive), and nothing answers it: its
// requester retries, as behind a pulled cable or at a QP that ignores
// strangers. After true the caller holds p for the request, responds, and
// calls Release; after false it holds nothing.
func (p *QP) Admit(b Binding) bool {
	if !p.Hold() {
		return false
	}
	if !p.Adapter().Connected() || !b.Bound(p) {
		p.ctr.Dropped.Add(1)
		p.Release()
		return false
	}
	p.noteCommEst()
	return true
}

// ResponderSeq is a responder QP's sequence state (rc.Seq: the expected
// PSN, the responder resources, the last refusal) for the QP's current
// incarnation: a QP reset and connected again starts it anew. Owned by
// the path's responder, under whatever serializes its requests.
type ResponderSeq struct {
	started bool
	gen     uint32 // p's resets when it started
	rc.Seq
}

// Sync starts s anew from p's rq_psn and max_dest_rd_atomic if it never
// started or p was reset since it did, and reports whether it did: the
// responder then forgets its messages in progress too. The caller holds
// p (Admit).
func (s *ResponderSeq) Sync(p Target) bool {
	gen := p.Resets()
	if s.started && s.gen == gen {
		return false
	}
	at := p.RCAttrs()
	s.started, s.gen = true, gen
	s.Start(at.RQPSN, at.MaxDestRdAtomic)
	return true
}
