// SPDX-License-Identifier: Apache-2.0

package rdma

// The responder of one QP (rocev2.md §4.3), run by the engine's reader.
// A packet with the expected PSN executes: a SEND or WRITE message is
// taken packet by packet with the device's resumable responder (Begin at
// its first packet, Write for each, End at its last), a READ sends its
// response packets from guest memory (a response longer than a turn, or
// behind one, through the engine's READ sender: reads.go), an atomic
// executes at once. An
// older PSN is a duplicate: a SEND or WRITE is acknowledged again, a READ
// executed again from memory, an atomic's original value replayed; both
// from the responder resources (rc.Seq: the last max_dest_rd_atomic READs
// and atomics, which no SEND or WRITE evicts), and an atomic no longer
// held there is refused with rc.NAKUnheld, never executed again nor left
// unanswered. A newer one is a gap: one PSN sequence error NAK, then
// silence until the expected PSN comes.
// Every check happens before a byte moves; a refused request is NAKed
// with the status the brief's table gives and leaves the target untouched.

import (
	"encoding/binary"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// responder is a QP's responder state; owned by the engine's reader.
type responder struct {
	p       *path
	q       device.Target // the path's QP as the target of the request being served (serve)
	seq     device.ResponderSeq
	nakSent bool   // a PSN sequence error NAK went out for the current gap
	msn     uint32 // messages completed, mod 2^24

	// The message in progress (a SEND or WRITE of several packets).
	inMsg bool
	write bool
	off   uint64
	req   device.Request
	msg   device.Message
	// rmsg is a READ's: a duplicate READ, replayed, may arrive while a
	// later SEND or WRITE is half received in msg.
	rmsg device.Message

	hdr [maxHeader]byte
	out *batch // what the responder answers, sent by flush
	seg [1][]byte

	// rq is the QP's answer queue, shared with the engine's READ sender
	// (reads.go); made when the first READ response is queued. While it
	// holds answers, the responder's answers join it.
	rq *readQueue

	// A positive ACK not sent yet: the latest one of a batch of requests
	// stands for all (coalescing).
	ackDue bool
	ackQPN uint32
	ackPSN uint32
	ackMSN uint32

	answering bool // on the reader's list of responders to flush

	// XRC: the SRQ number the request being served named (its XRCETH),
	// and XRC's opcode bits for the answers of an XRC target QP (0 for
	// another QP's).
	srqn uint32
	xrc  rocewire.Opcode
}

// flush sends what the responder answered to the requests served since
// the last flush: the engine's reader calls it once a datagram is served.
func (r *responder) flush() {
	r.sendAck()
	r.out.flush()
}

// sendAck queues the positive ACK due, if one is.
func (r *responder) sendAck() {
	if !r.ackDue {
		return
	}
	r.ackDue = false
	var hdr [rocewire.BTHLen + rocewire.AETHLen]byte // not r.hdr: callers may have a header there
	h := hdr[:]
	rocewire.BTH(h).Encode(&rocewire.BTHFields{Opcode: rocewire.Acknowledge | r.xrc, PKey: rocewire.DefaultPKey, DestQP: r.ackQPN, PSN: r.ackPSN})
	rocewire.AETH(h[rocewire.BTHLen:]).Encode(rocewire.ACK, r.ackMSN)
	r.answer(h, true)
}

// answer sends packet h, which has no payload (ack: a positive ACK):
// behind the QP's queued answers if it has some (the QP's answers leave
// in PSN order), else in the reader's batch.
func (r *responder) answer(h []byte, ack bool) {
	if r.rq != nil && r.rq.addShort(r.q, r.q.Resets(), h, ack) {
		return
	}
	r.out.add(h, nil, 0)
}

// queued reports whether answers of the QP wait in its queue.
func (r *responder) queued() bool {
	if r.rq == nil {
		return false
	}
	r.rq.mu.Lock()
	defer r.rq.mu.Unlock()
	return r.rq.n > 0
}

// Bound makes r a device.Binding: its QP is still connected over r's
// path (the engine's reader found the path by the packet's DestQP and
// source address; a RESET or a new connection since unbinds it).
func (r *responder) Bound(q device.Target) bool { return q.BoundPath() == device.Path(r.p) }

// serve handles request packet pkt for the responder's QP, q: the
// engine's reader found it by the packet's DestQP, bound to r's path.
// srqn is the SRQ number of an XRC request (its RC form, StripXRC).
func (r *responder) serve(q device.Target, pkt *rocewire.Packet, srqn uint32) {
	r.q = q
	r.srqn, r.xrc = srqn, 0
	if q.Type() == abi.QPTypeXRCRecv {
		r.xrc = rocewire.XRC
	}
	if !q.Admit(r) {
		return
	}
	defer q.Release()
	at := q.RCAttrs()
	if r.seq.Sync(q) {
		r.nakSent, r.inMsg, r.msn = false, false, 0
	}
	if at.UC || pkt.BTH.Opcode().Transport() == rocewire.UC {
		r.serveUC(&at, pkt)
		return
	}
	psn := pkt.BTH.PSN()
	ctr := q.Counters()
	switch r.seq.Check(psn) {
	case rc.Ahead:
		ctr.SeqErrs.Add(1)
		if !r.nakSent {
			r.nakSent = true
			r.ack(at.RemoteQPN, rocewire.NAK(rocewire.NAKPSNSeqErr), r.seq.Expected())
		}
		return
	case rc.Duplicate:
		r.duplicate(&at, pkt, psn, ctr)
		return
	}
	r.nakSent = false
	if uint32(len(pkt.Payload)) > at.PathMTU {
		r.refuse(&at, psn, abi.WCRemInvReqErr)
		return
	}
	op := pkt.BTH.Opcode()
	switch {
	case op == rocewire.RDMAReadRequest:
		r.read(&at, pkt, psn)
	case op == rocewire.CompareSwap || op == rocewire.FetchAdd:
		r.atomic(&at, pkt, psn)
	case op == rocewire.AtomicWrite:
		r.atomicWrite(&at, pkt, psn)
	default:
		r.message(&at, pkt, psn)
	}
}

// message takes one packet of a SEND or WRITE.
func (r *responder) message(at *device.RCAttrs, pkt *rocewire.Packet, psn uint32) {
	q := r.q
	info := pkt.Info
	op := pkt.BTH.Opcode()
	write := pkt.RETH != nil || op == rocewire.RDMAWriteMiddle || op == rocewire.RDMAWriteLast || op == rocewire.RDMAWriteLastWithImmediate
	first := info.Position == rocewire.PosFirst || info.Position == rocewire.PosOnly
	last := info.Position == rocewire.PosLast || info.Position == rocewire.PosOnly
	if first == r.inMsg || !first && r.write != write {
		// A FIRST or ONLY inside a message, or a MIDDLE or LAST outside
		// one (or of the other kind): an invalid request (class C).
		r.inMsg = false
		q.MoveToErr("RoCE opcode " + op.String() + " out of sequence")
		r.refuse(at, psn, abi.WCRemInvReqErr)
		return
	}
	m := &r.msg
	if first {
		r.req = device.Request{SrcQPN: at.RemoteQPN, Total: uint64(len(pkt.Payload)), SRQN: r.srqn}
		switch {
		case write:
			r.req.Op, r.req.RAddr, r.req.RKey, r.req.Total = abi.OpRDMAWrite, pkt.RETH.VA(), pkt.RETH.RKey(), uint64(pkt.RETH.DMALen())
			if op == rocewire.RDMAWriteOnlyWithImmediate {
				r.req.Op, r.req.Imm = abi.OpRDMAWriteWithImm, pkt.ImmDt.Imm()
			}
		case op == rocewire.SendOnlyWithImmediate:
			r.req.Op, r.req.Imm = abi.OpSendWithImm, pkt.ImmDt.Imm()
		case op == rocewire.SendOnlyWithInvalidate:
			r.req.Op, r.req.RKey = abi.OpSendWithInv, pkt.IETH.RKey()
		default:
			r.req.Op = abi.OpSend
		}
		v := q.Begin(&r.req, m)
		switch {
		case v.Out == device.OutRNR:
			r.ack(at.RemoteQPN, rocewire.RNRNak(v.RNRTimer), psn)
			return
		case v.Status != abi.WCSuccess:
			r.refuse(at, psn, v.Status)
			return
		}
		r.inMsg, r.write, r.off = true, write, 0
	} else {
		if !q.Revalidate(m) {
			r.inMsg = false
			st := abi.WCRemAccessErr
			if !r.write {
				st = abi.WCRemOpErr
			}
			q.MoveToErr("the target of a message in progress went away")
			r.refuse(at, psn, st)
			return
		}
		if !r.write {
			if st := q.Grow(m, r.off+uint64(len(pkt.Payload))); st != abi.WCSuccess {
				r.inMsg = false
				r.refuse(at, psn, st)
				return
			}
		}
	}
	if r.write && (last && r.off+uint64(len(pkt.Payload)) != r.req.Total || !last && r.off+uint64(len(pkt.Payload)) >= r.req.Total && r.req.Total > 0) {
		r.inMsg = false
		q.MoveToErr("RDMA WRITE packets do not add up to the RETH's length")
		r.refuse(at, psn, abi.WCRemInvReqErr)
		return
	}
	if !q.Write(m, r.off, pkt.Payload) {
		r.inMsg = false
		r.ack(at.RemoteQPN, rocewire.NAK(rocewire.NAKRemOpErr), psn)
		r.seq.Done(rc.NAKRemOp)
		return
	}
	if !last {
		r.off += uint64(len(pkt.Payload))
		r.seq.Done(rc.NAKNone)
		if pkt.BTH.AckReq() {
			r.ack(at.RemoteQPN, rocewire.ACK, psn)
		}
		return
	}
	if !first && op == rocewire.SendLastWithImmediate {
		m.SetImm(pkt.ImmDt.Imm())
	}
	if !first && op == rocewire.SendLastWithInvalidate {
		if st := q.Invalidate(m, pkt.IETH.RKey()); st != abi.WCSuccess {
			r.inMsg = false
			r.refuse(at, psn, st)
			return
		}
	}
	if op == rocewire.RDMAWriteLastWithImmediate {
		// The receive a WRITE_WITH_IMM consumes is taken at its last
		// packet: check the whole range again with it.
		r.req.Op, r.req.Imm = abi.OpRDMAWriteWithImm, pkt.ImmDt.Imm()
		q.End(m)
		v := q.Begin(&r.req, m)
		switch {
		case v.Out == device.OutRNR:
			r.ack(at.RemoteQPN, rocewire.RNRNak(v.RNRTimer), psn) // the requester sends the last packet again
			return
		case v.Status != abi.WCSuccess:
			r.inMsg = false
			r.refuse(at, psn, v.Status)
			return
		}
		q.Write(m, r.off, pkt.Payload)
	}
	m.SetSolicited(pkt.BTH.Solicited())
	out, _ := q.End(m)
	switch out {
	case device.OutRNR: // the receive CQ is full: the requester sends the last packet again
		if first {
			r.inMsg = false // a message of one packet begins again with it
		}
		r.ack(at.RemoteQPN, rocewire.RNRNak(at.MinRNRTimer), psn)
		return
	case device.OutNoPeer: // the receive went meanwhile (flushed): as if dropped
		r.inMsg = false
		return
	}
	r.inMsg = false
	r.msn = (r.msn + 1) & rc.PSNMask
	r.seq.Done(rc.NAKNone)
	if pkt.BTH.AckReq() {
		r.ack(at.RemoteQPN, rocewire.ACK, psn)
	}
}

// read executes an RDMA READ request and sends its response.
func (r *responder) read(at *device.RCAttrs, pkt *rocewire.Packet, psn uint32) {
	if r.inMsg {
		r.inMsg = false
		r.q.MoveToErr("RDMA READ request inside a message")
		r.refuse(at, psn, abi.WCRemInvReqErr)
		return
	}
	req := device.Request{Op: abi.OpRDMARead, SrcQPN: at.RemoteQPN, RKey: pkt.RETH.RKey(), RAddr: pkt.RETH.VA(), Total: uint64(pkt.RETH.DMALen()), SRQN: r.srqn}
	n, ok := r.sendRead(at, &req, psn, 0, !pkt.BTH.AckReq())
	if !ok {
		return
	}
	r.msn = (r.msn + 1) & rc.PSNMask
	r.seq.Executed(rc.Resource{N: n, RKey: req.RKey, VA: req.RAddr, Len: req.Total})
}

// sendRead executes READ req whose first PSN is psn and answers it from
// packet from on (a duplicate that asks for the rest): a response of at
// most readTurn packets (the requester's credit, readCredit) the reader
// sends itself, unless answers of the QP are queued; a longer one, or one
// behind them, it queues for the engine's READ sender (reads.go), which
// sends it a turn at a time — paced (a request with AckReq clear, from a
// requester that sends continuations), within the credit the requester's
// requests give. It returns how many PSNs the whole response takes, false
// when the READ was refused (and NAKed).
func (r *responder) sendRead(at *device.RCAttrs, req *device.Request, psn, from uint32, paced bool) (uint32, bool) {
	q := r.q
	m := &r.rmsg
	if v := q.Begin(req, m); v.Status != abi.WCSuccess {
		r.refuse(at, psn, v.Status)
		return 0, false
	}
	mtu := uint64(at.PathMTU)
	npkt := uint32(1)
	if req.Total > mtu {
		npkt = uint32((req.Total + mtu - 1) / mtu)
	}
	a := answer{t: q, gen: q.Resets(), read: true, paced: paced, req: *req, dqpn: at.RemoteQPN, psn: psn, npkt: npkt, next: from,
		limit: npkt, mtu: at.PathMTU, msn: r.msn, xrc: r.xrc}
	if paced {
		a.limit = min(from+readCredit, npkt)
	}
	if npkt-from > readTurn || r.queued() {
		q.End(m) // the sender begins it again, a turn at a time
		r.queueRead(&a)
		return npkt, true
	}
	defer q.End(m)
	defer r.flush() // before End: the batch points into the target's memory
	r.sendAck()
	for i := from; i < npkt; i++ {
		readPacket(r.out, &r.hdr, m, &r.seg, &a, i)
	}
	return npkt, true
}

// queueRead queues READ response a for the engine's READ sender, after
// what the reader's batch holds for the QP, which goes first.
func (r *responder) queueRead(a *answer) {
	if r.rq == nil {
		r.rq = new(readQueue)
	}
	if !r.queued() {
		r.flush()
	}
	ok, put := r.rq.add(a)
	if !ok {
		// More READs and atomics than max_rd_atomic allows: dropped,
		// as by a responder out of resources; the requester's timeout
		// asks again.
		a.t.Counters().Dropped.Add(1)
		return
	}
	if put {
		r.p.e.rd.put(r.p)
	}
}

// atomic executes an atomic and answers with its original value.
func (r *responder) atomic(at *device.RCAttrs, pkt *rocewire.Packet, psn uint32) {
	q := r.q
	if r.inMsg {
		r.inMsg = false
		q.MoveToErr("atomic request inside a message")
		r.refuse(at, psn, abi.WCRemInvReqErr)
		return
	}
	a := pkt.AtomicETH
	req := device.Request{Op: abi.OpAtomicCmpAndSwp, SrcQPN: at.RemoteQPN, RKey: a.RKey(), RAddr: a.VA(), Total: 8, Compare: a.Compare(), Swap: a.SwapAdd(), SRQN: r.srqn}
	if pkt.BTH.Opcode() == rocewire.FetchAdd {
		req.Op, req.Compare, req.Swap = abi.OpAtomicFetchAdd, a.SwapAdd(), 0
	}
	m := &r.msg
	if v := q.Begin(&req, m); v.Status != abi.WCSuccess {
		r.refuse(at, psn, v.Status)
		return
	}
	q.End(m)
	old := m.Old()
	r.msn = (r.msn + 1) & rc.PSNMask
	r.seq.Executed(rc.Resource{Atomic: true, Value: old})
	r.atomicAck(at.RemoteQPN, psn, old)
}

// atomicWrite stores an atomic write's 8 bytes and answers with a
// zero-length RDMA READ response, as IBTA answers one. It takes a
// responder resource, so that a duplicate is answered again and never
// executed again.
func (r *responder) atomicWrite(at *device.RCAttrs, pkt *rocewire.Packet, psn uint32) {
	q := r.q
	if r.inMsg || len(pkt.Payload) != 8 || pkt.RETH.DMALen() != 8 {
		r.inMsg = false
		q.MoveToErr("atomic write inside a message, or not of 8 bytes")
		r.refuse(at, psn, abi.WCRemInvReqErr)
		return
	}
	req := device.Request{Op: abi.OpAtomicWrite, SrcQPN: at.RemoteQPN, RKey: pkt.RETH.RKey(), RAddr: pkt.RETH.VA(),
		Swap: binary.LittleEndian.Uint64(pkt.Payload)}
	m := &r.msg
	if v := q.Begin(&req, m); v.Status != abi.WCSuccess {
		r.refuse(at, psn, v.Status)
		return
	}
	q.End(m)
	r.msn = (r.msn + 1) & rc.PSNMask
	r.seq.Executed(rc.Resource{Atomic: true})
	r.writeAck(at.RemoteQPN, psn)
}

// writeAck sends an atomic write's answer: an RDMA READ RESPONSE ONLY
// with no payload.
func (r *responder) writeAck(dqpn, psn uint32) {
	h := r.hdr[:rocewire.BTHLen+rocewire.AETHLen]
	rocewire.BTH(h).Encode(&rocewire.BTHFields{Opcode: rocewire.RDMAReadResponseOnly, PKey: rocewire.DefaultPKey, DestQP: dqpn, PSN: psn})
	rocewire.AETH(h[rocewire.BTHLen:]).Encode(rocewire.ACK, r.msn)
	r.sendAck()
	r.answer(h, false)
}

// duplicate answers a request the requester sent again (counted in
// ctr.Dups), or a READ request that asks for more of a response being
// sent (a continuation, not counted).
func (r *responder) duplicate(at *device.RCAttrs, pkt *rocewire.Packet, psn uint32, ctr *device.Counters) {
	op := pkt.BTH.Opcode()
	if op != rocewire.RDMAReadRequest {
		ctr.Dups.Add(1)
	}
	switch op {
	case rocewire.RDMAReadRequest:
		// The READ whose response holds psn, asked for from that packet
		// on: executed again from memory (C9-148 allows it).
		res, ok := r.seq.Read(psn)
		if !ok {
			ctr.Dups.Add(1)
			return // no resource holds it: dropped (class D)
		}
		k := uint32(rc.PSNDiff(psn, res.PSN))
		off := uint64(k) * uint64(at.PathMTU)
		if res.RKey != pkt.RETH.RKey() || res.VA+off != pkt.RETH.VA() || res.Len-off != uint64(pkt.RETH.DMALen()) {
			ctr.Dups.Add(1)
			return // not the rest of that READ: dropped (class D)
		}
		if r.rq != nil {
			if found, cont, put := r.rq.restart(r.q, r.q.Resets(), res.PSN, k); found {
				// Still queued: a continuation gives it more credit, a
				// request for packets lost sends it again from k (once,
				// not once per request).
				if !cont {
					ctr.Dups.Add(1)
				}
				if put {
					r.p.e.rd.put(r.p)
				}
				return
			}
		}
		ctr.Dups.Add(1)
		req := device.Request{Op: abi.OpRDMARead, SrcQPN: at.RemoteQPN, RKey: res.RKey, RAddr: res.VA, Total: res.Len, SRQN: r.srqn}
		r.sendRead(at, &req, res.PSN, k, !pkt.BTH.AckReq())
	case rocewire.CompareSwap, rocewire.FetchAdd:
		// Its original value from the responder resources; never
		// executed again, never left unanswered.
		if nak, ok := r.seq.Refused(psn); ok {
			r.ack(at.RemoteQPN, nakSyndrome(nak), psn)
		} else if v, ok := r.seq.Atomic(psn); ok {
			r.atomicAck(at.RemoteQPN, psn, v)
		} else {
			r.ack(at.RemoteQPN, nakSyndrome(rc.NAKUnheld), psn)
		}
	case rocewire.AtomicWrite:
		// Answered again from the responder resources, never executed
		// again (a later write may have changed the word since).
		if nak, ok := r.seq.Refused(psn); ok {
			r.ack(at.RemoteQPN, nakSyndrome(nak), psn)
		} else if _, ok := r.seq.Atomic(psn); ok {
			r.writeAck(at.RemoteQPN, psn)
		} else {
			r.ack(at.RemoteQPN, nakSyndrome(rc.NAKUnheld), psn)
		}
	default:
		// Executed already: acknowledge again what was acknowledged.
		r.ack(at.RemoteQPN, rocewire.ACK, (r.seq.Expected()-1)&rc.PSNMask)
	}
}

// refuse NAKs the request at psn with the NAK its status gives; the
// expected PSN moves on (the QP is in ERR for a class C error).
func (r *responder) refuse(at *device.RCAttrs, psn uint32, st abi.WCStatus) {
	nak := rc.NAKOf(st)
	r.seq.Done(nak)
	r.ack(at.RemoteQPN, nakSyndrome(nak), psn)
}

// nakSyndrome is the AETH syndrome of a final NAK (invalid request,
// remote access or remote operational error).
func nakSyndrome(nak rc.NAK) rocewire.Syndrome {
	code := uint8(rocewire.NAKRemOpErr)
	switch nak {
	case rc.NAKInvReq:
		code = rocewire.NAKInvReq
	case rc.NAKRemAccess:
		code = rocewire.NAKRemAccess
	}
	return rocewire.NAK(code)
}

// ack answers psn with an ACKNOWLEDGE of syndrome s: a positive one is
// due until flush, or until another answer goes first; a NAK goes now.
func (r *responder) ack(dqpn uint32, s rocewire.Syndrome, psn uint32) {
	if s == rocewire.ACK {
		r.ackDue, r.ackQPN, r.ackPSN, r.ackMSN = true, dqpn, psn, r.msn
		return
	}
	r.sendAck()
	h := r.hdr[:rocewire.BTHLen+rocewire.AETHLen]
	rocewire.BTH(h).Encode(&rocewire.BTHFields{Opcode: rocewire.Acknowledge | r.xrc, PKey: rocewire.DefaultPKey, DestQP: dqpn, PSN: psn})
	rocewire.AETH(h[rocewire.BTHLen:]).Encode(s, r.msn)
	r.answer(h, false)
}

// atomicAck sends an ATOMIC_ACKNOWLEDGE with an atomic's original value.
func (r *responder) atomicAck(dqpn, psn uint32, old uint64) {
	h := r.hdr[:rocewire.BTHLen+rocewire.AETHLen+rocewire.AtomicAckETHLen]
	rocewire.BTH(h).Encode(&rocewire.BTHFields{Opcode: rocewire.AtomicAcknowledge | r.xrc, PKey: rocewire.DefaultPKey, DestQP: dqpn, PSN: psn})
	rocewire.AETH(h[rocewire.BTHLen:]).Encode(rocewire.ACK, r.msn)
	rocewire.AtomicAckETH(h[rocewire.BTHLen+rocewire.AETHLen:]).Encode(old)
	r.sendAck()
	r.answer(h, false)
}
