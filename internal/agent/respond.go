package agent

// The responder of an RC operation, shared by every path: the checks and
// effects at the target QP are the same whether the request comes from a
// QP on this host (memcpy: the requester's goroutine runs this) or from
// another host (tcp: the connection's reader runs it). Only where the
// payload comes from or goes to differs (payload).

import (
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
)

// rcRequest is an RC operation as its responder sees it.
type rcRequest struct {
	op      abi.Opcode
	srcQPN  uint32
	rkey    uint32
	raddr   uint64
	total   uint64
	imm     uint32
	compare uint64 // compare, or the addend
	swap    uint64
}

// outcome is how a request ended at the responder, when not with a
// status.
type outcome uint8

const (
	outDone   outcome = iota // the status is final
	outNoPeer                // nothing answered: transport retry
	outRNR                   // the responder had no receive posted
)

// payload moves a request's data.
type payload interface {
	// in fills dst with the next len(dst) bytes of the request's data
	// (WRITE, SEND).
	in(dst []byte) error
	// out delivers the data a READ asked for.
	out(src []byte) error
	// atomic delivers an atomic's original value.
	atomic(old uint64)
}

// respond executes request r at responder QP p, whose VM's memMu the
// caller holds for reading (and has checked alive), after the caller
// checked that p is bound to the requester and in a state that receives.
// Checks happen before any byte moves, so a refused request leaves the
// target untouched. err is an I/O error of the payload (tcp): the
// connection is broken and the request did not complete.
func (p *qp) respond(r *rcRequest, io payload) (out outcome, st abi.WCStatus, n uint32, rnrTimer uint8, err error) {
	out, st, n, rnrTimer, err = p.serve(r, io)
	if out == outRNR {
		p.ctr.rnrSent.Add(1)
	}
	return out, st, n, rnrTimer, err
}

// serve is respond without the counters.
func (p *qp) serve(r *rcRequest, io payload) (out outcome, st abi.WCStatus, n uint32, rnrTimer uint8, err error) {
	pv := p.vm
	p.mu.Lock()
	access, rnrTimer, rdAtomic := p.attr.AccessFlags, p.attr.MinRNRTimer, p.attr.MaxDestRdAtomic
	p.mu.Unlock()
	if (r.op == abi.OpRDMARead || r.op.IsAtomic()) && rdAtomic == 0 {
		// No responder resources for READs and atomics: an invalid
		// request (IBTA 9.9.2, class C; rxe's
		// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ), and the responder goes to ERR.
		p.moveToErr(fmt.Sprintf("%s from QP 0x%x refused: max_dest_rd_atomic is 0 (no responder resources for RDMA READ and atomics)", r.op, r.srcQPN))
		return outDone, abi.WCRemInvReqErr, 0, 0, nil
	}
	total := r.total
	n = uint32(total)
	switch r.op {
	case abi.OpRDMAWrite, abi.OpRDMAWriteWithImm:
		dst, ok := pv.resolve(p.pd, r.rkey, r.raddr, total, abi.AccessRemoteWrite)
		if !ok || access&abi.AccessRemoteWrite == 0 && total > 0 {
			p.moveToErr(fmt.Sprintf("remote access error: RDMA WRITE from QP 0x%x with rkey 0x%x to [0x%x,+%d)", r.srcQPN, r.rkey, r.raddr, total))
			return outDone, abi.WCRemAccessErr, 0, 0, nil
		}
		if r.op == abi.OpRDMAWrite {
			if err := io.in(dst); err != nil {
				return outDone, 0, 0, 0, err
			}
			return outDone, abi.WCSuccess, n, 0, nil
		}
		p.rqMu.Lock()
		defer p.rqMu.Unlock()
		switch p.peekRecvLocked(r.srcQPN) {
		case recvNone:
			return outRNR, 0, 0, rnrTimer, nil
		case recvBroken:
			return outDone, abi.WCRemOpErr, 0, 0, nil
		}
		if err := io.in(dst); err != nil {
			return outDone, 0, 0, 0, err
		}
		if !p.completeRecvLocked(abi.WCSuccess, abi.WCRecvRDMAWithImm, n, r.imm, true, r.srcQPN) {
			return outRNR, 0, 0, rnrTimer, nil // the receive CQ is full: not ready
		}
		return outDone, abi.WCSuccess, n, 0, nil

	case abi.OpSend, abi.OpSendWithImm:
		p.rqMu.Lock()
		defer p.rqMu.Unlock()
		switch p.peekRecvLocked(r.srcQPN) {
		case recvNone:
			return outRNR, 0, 0, rnrTimer, nil
		case recvBroken:
			return outDone, abi.WCRemOpErr, 0, 0, nil
		}
		rw := &p.rwqe
		var room uint64
		nr := 0
		for i := 0; i < int(rw.NumSGE); i++ {
			sge := &rw.SGE[i]
			b, ok := pv.resolve(p.pd, sge.LKey, sge.Addr, uint64(sge.Length), abi.AccessLocalWrite)
			if !ok {
				p.moveToErr("receive work request has a bad SGE (LOC_PROT_ERR)")          // ERR first, as in execOne
				p.completeRecvLocked(abi.WCLocProtErr, abi.WCRecv, 0, 0, false, r.srcQPN) // if the CQ is full, the flush completes it
				return outDone, abi.WCRemOpErr, 0, 0, nil
			}
			p.rsegs[nr] = b
			nr++
			room += uint64(sge.Length)
		}
		if room < total {
			clear(p.rsegs[:nr])
			p.moveToErr(fmt.Sprintf("a %d-byte message does not fit the %d-byte receive buffer (LOC_LEN_ERR)", total, room))
			p.completeRecvLocked(abi.WCLocLenErr, abi.WCRecv, 0, 0, false, r.srcQPN)
			return outDone, abi.WCRemInvReqErr, 0, 0, nil
		}
		left := total
		for _, b := range p.rsegs[:nr] {
			if left == 0 {
				break
			}
			k := min(uint64(len(b)), left)
			if err := io.in(b[:k]); err != nil {
				clear(p.rsegs[:nr])
				return outDone, 0, 0, 0, err
			}
			left -= k
		}
		clear(p.rsegs[:nr])
		if !p.completeRecvLocked(abi.WCSuccess, abi.WCRecv, n, r.imm, r.op == abi.OpSendWithImm, r.srcQPN) {
			// The receive CQ is full: not ready. The bytes landed in a
			// buffer still posted, which is not yet the receiver's to read.
			return outRNR, 0, 0, rnrTimer, nil
		}
		return outDone, abi.WCSuccess, n, 0, nil

	case abi.OpRDMARead:
		src, ok := pv.resolve(p.pd, r.rkey, r.raddr, total, abi.AccessRemoteRead)
		if !ok || access&abi.AccessRemoteRead == 0 && total > 0 {
			p.moveToErr(fmt.Sprintf("remote access error: RDMA READ from QP 0x%x with rkey 0x%x of [0x%x,+%d)", r.srcQPN, r.rkey, r.raddr, total))
			return outDone, abi.WCRemAccessErr, 0, 0, nil
		}
		if err := io.out(src); err != nil {
			return outDone, 0, 0, 0, err
		}
		return outDone, abi.WCSuccess, n, 0, nil

	case abi.OpAtomicCmpAndSwp, abi.OpAtomicFetchAdd:
		if r.raddr&7 != 0 {
			p.moveToErr(fmt.Sprintf("misaligned atomic at 0x%x from QP 0x%x", r.raddr, r.srcQPN))
			return outDone, abi.WCRemInvReqErr, 0, 0, nil
		}
		t, ok := pv.resolve(p.pd, r.rkey, r.raddr, 8, abi.AccessRemoteAtomic)
		if !ok || access&abi.AccessRemoteAtomic == 0 || !abi.Aligned8(t, 0) {
			p.moveToErr(fmt.Sprintf("remote access error: atomic from QP 0x%x with rkey 0x%x at 0x%x", r.srcQPN, r.rkey, r.raddr))
			return outDone, abi.WCRemAccessErr, 0, 0, nil
		}
		word := abi.Word64(t, 0)
		var old uint64
		if r.op == abi.OpAtomicFetchAdd {
			old = word.Add(r.compare) - r.compare
		} else {
			for {
				old = word.Load()
				if old != r.compare || word.CompareAndSwap(old, r.swap) {
					break
				}
			}
		}
		io.atomic(old)
		return outDone, abi.WCSuccess, 8, 0, nil
	}
	return outDone, abi.WCRemInvReqErr, 0, 0, nil
}
