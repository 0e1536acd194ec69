// SPDX-License-Identifier: Apache-2.0

package device

// Unreliable connected QPs (IBTA vol. 1's unreliable connected service;
// rxe's IB_QPT_UC). A UC QP is an RC QP without its reliability: the same
// state machine with fewer attributes (ucTransition), SEND and RDMA WRITE
// with and without immediate and nothing else (ucRefuse), no ACK, no NAK,
// no retransmission. Its requester completes a work request once its
// packets left (the paths' UC mode, and the RC requester engine's); its
// responder is the RC responder with every refusal turned into a silent
// drop of the message (checkUC): no RNR NAK for a SEND with no receive
// posted, no error NAK and no move to ERR for a bad rkey or a receive too
// small — the message is dropped and the QP goes on, as rxe's classes D
// and E do for UC. A receive WQE that is malformed (a bad SGE) fails the
// QP as on RC (class A). The paths drop a message a lost packet broke,
// whole: the responder abandons it (Message.Abandon), leaving its receive
// posted.

import (
	"github.com/vrdma/vrdma/internal/abi"
)

// ucTransition returns the attributes a UC QP's transition from cur to
// next requires and those it accepts (the state's mask included): the UC
// column of IBTA 10.3.1 (the kernel's qp_state_table), which has none of
// RC's retry, RNR and READ/atomic attributes: ibv_modify_qp with them
// fails with EINVAL, as on rxe.
func ucTransition(cur, next abi.QPState) (need []required, allowed abi.QPAttrMask) {
	allowed = abi.MaskState
	switch {
	case cur == abi.QPSReset && next == abi.QPSInit:
		need = reqInit
	case cur == abi.QPSInit && next == abi.QPSInit:
		allowed |= abi.MaskPort | abi.MaskAccessFlags
	case cur == abi.QPSInit && next == abi.QPSRTR:
		need = reqRTRUC
		allowed |= abi.MaskAccessFlags
	case cur == abi.QPSRTR && next == abi.QPSRTS:
		need = reqRTSUC
		allowed |= abi.MaskAccessFlags
	case cur == abi.QPSRTS && next == abi.QPSRTS, cur == abi.QPSSQD && next == abi.QPSRTS,
		cur == abi.QPSSQD && next == abi.QPSSQD, cur == abi.QPSSQE && next == abi.QPSRTS:
		allowed |= abi.MaskAccessFlags
	}
	return need, allowed
}

var (
	reqRTRUC = []required{{abi.MaskAV, "ah_attr with the remote GID (IBV_QP_AV)"}, {abi.MaskPathMTU, "path_mtu (IBV_QP_PATH_MTU)"},
		{abi.MaskDestQPN, "dest_qp_num (IBV_QP_DEST_QPN)"}, {abi.MaskRQPSN, "rq_psn (IBV_QP_RQ_PSN)"}}
	reqRTSUC = []required{{abi.MaskSQPSN, "sq_psn (IBV_QP_SQ_PSN)"}}
)

// Type is the QP's transport, abi.QPTypeRC or abi.QPTypeUC; any goroutine.
func (q *QP) Type() abi.QPType { return q.typ }

// ConnectMask is mask without the attributes q's type does not take, for
// connection management, which sets RC's defaults (abi.MaskRCOnly on a UC
// QP).
func (q *QP) ConnectMask(mask abi.QPAttrMask) abi.QPAttrMask {
	if q.typ == abi.QPTypeUC {
		return mask &^ abi.MaskRCOnly
	}
	return mask
}

// ucRefuse is the status of send WQE w, decoded with status st, on q: an
// RDMA READ, an atomic or a memory-window operation on a UC QP, and an
// atomic write on any QP but RC, fail with LOC_QP_OP_ERR (the drop-in and the library refuse them
// at post with EINVAL; only a hand-written ring gets here).
func (q *QP) ucRefuse(w *abi.SendWQE, st abi.WCStatus) abi.WCStatus {
	if st == abi.WCSuccess && (q.typ == abi.QPTypeUC && (w.Opcode.IsRdAtomic() || w.Opcode.IsMW()) ||
		w.Opcode == abi.OpAtomicWrite && q.typ != abi.QPTypeRC) {
		return abi.WCLocQPOpErr
	}
	return st
}

// checkUC is checkRequest at a UC responder: a request it refuses is
// dropped, counted (Dropped), and answered by nothing: it returns OutDone
// with a status that is not success (the RC responder's for the same
// refusal; WCRemOpErr for a SEND with no receive posted), leaves p in its
// state and its receive posted. A bad receive WQE fails p as on RC.
func (p *QP) checkUC(r *Request, m *Message, rqHeld bool) (Outcome, abi.WCStatus, uint8) {
	switch r.Op {
	case abi.OpRDMAWrite, abi.OpRDMAWriteWithImm:
		p.mu.Lock()
		access := p.attr.AccessFlags
		p.mu.Unlock()
		dst, ok := p.vm.resolveRemote(p, p.pd, r.RKey, r.RAddr, r.Total, abi.AccessRemoteWrite)
		if !ok || access&abi.AccessRemoteWrite == 0 && r.Total > 0 {
			p.ctr.Dropped.Add(1)
			return OutDone, abi.WCRemAccessErr, 0
		}
		m.segs[0], m.nseg = dst, 1
		if r.Op == abi.OpRDMAWriteWithImm {
			return p.takeRecvUC(m, false, rqHeld)
		}
		return OutDone, abi.WCSuccess, 0
	case abi.OpSend, abi.OpSendWithImm:
		return p.takeRecvUC(m, true, rqHeld)
	}
	p.ctr.Dropped.Add(1) // a READ or an atomic: UC has none
	return OutDone, abi.WCRemInvReqErr, 0
}

// takeRecvUC is takeRecv at a UC responder: no receive posted, or one
// too small for the message, drops the message and leaves the receive
// posted.
//
// +checklocksignore: takes rqMu unless rqHeld says the caller holds it
func (p *QP) takeRecvUC(m *Message, data bool, rqHeld bool) (Outcome, abi.WCStatus, uint8) {
	if !rqHeld {
		p.rqMu.Lock()
		defer p.rqMu.Unlock()
	}
	r := &m.r
	switch p.peekRecvLocked(r.SrcQPN) {
	case recvNone:
		p.ctr.Dropped.Add(1)
		return OutDone, abi.WCRemOpErr, 0
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
		p.MoveToErr("receive work request has a bad SGE (LOC_PROT_ERR)")
		p.completeRecvLocked(abi.WCLocProtErr, abi.WCRecv, 0, 0, 0, r.SrcQPN, false)
		return OutDone, abi.WCRemOpErr, 0
	case room < r.Total:
		m.Abandon()
		p.ctr.Dropped.Add(1)
		return OutDone, abi.WCRemInvReqErr, 0
	}
	return OutDone, abi.WCSuccess, 0
}

// Abandon forgets a message in progress without completing it: a UC
// responder that lost one of its packets (a PSN gap) or refused it. The
// receive it took stays posted (on an SRQ, held by the QP for its next
// message), and nothing of it completes; the bytes that landed are in a
// buffer the workload does not own back until a completion names it.
func (m *Message) Abandon() {
	clear(m.segs[:m.nseg])
	m.nseg, m.recv = 0, false
}
