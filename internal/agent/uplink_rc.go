package agent

// RC operations over the tcp path: the requester's side (tcpDeliver, run
// by the QP's goroutine) and the responder's (tconn.serveRequests, run by
// the reader of a connection the peer opened).
//
// PSNs. Each request carries the requester QP's PSN (from sq_psn, one per
// WR, kept across retries); the responder expects the PSN from its rq_psn.
// A request with the expected PSN executes, and the expected PSN advances
// once the operation is final (not after RNR or NO_QP, which the requester
// retries). A request with an older PSN is a duplicate, a retry whose
// response was lost: it is answered from the last response (a READ is
// executed again, as IBTA allows) and never executed twice. A newer PSN is
// a sequence error, which the requester retries like a lost response.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// lastResponse is a responder QP's last final response, for duplicates.
type lastResponse struct {
	valid  bool
	psn    uint32
	status tcpwire.Status
	value  uint64
}

var reqTypes = [...]tcpwire.Type{
	abi.OpRDMAWrite: tcpwire.Write, abi.OpRDMAWriteWithImm: tcpwire.WriteImm, abi.OpSend: tcpwire.Send,
	abi.OpSendWithImm: tcpwire.SendImm, abi.OpRDMARead: tcpwire.Read, abi.OpAtomicCmpAndSwp: tcpwire.CmpSwap,
	abi.OpAtomicFetchAdd: tcpwire.FetchAdd,
}

var reqOps = map[tcpwire.Type]abi.Opcode{
	tcpwire.Write: abi.OpRDMAWrite, tcpwire.WriteImm: abi.OpRDMAWriteWithImm, tcpwire.Send: abi.OpSend,
	tcpwire.SendImm: abi.OpSendWithImm, tcpwire.Read: abi.OpRDMARead, tcpwire.CmpSwap: abi.OpAtomicCmpAndSwp,
	tcpwire.FetchAdd: abi.OpAtomicFetchAdd,
}

// tcpDeliver sends w to the remote end over link l and waits up to wait
// for the response. waited reports that the wait ran out (the retry
// timeout is spent).
func (q *qp) tcpDeliver(l *link, w *abi.SendWQE, segs [][]byte, total uint64, psn uint32, wait time.Duration) (out outcome, st abi.WCStatus, n uint32, rnrTimer uint8, waited bool) {
	if l == nil {
		return outNoPeer, 0, 0, 0, false
	}
	start := time.Now()
	c, err := l.conn(wait)
	if err != nil {
		return outNoPeer, 0, 0, 0, time.Since(start) >= wait
	}
	q.mu.Lock()
	dst := q.remoteQPN
	q.mu.Unlock()
	h := &q.treq
	*h = tcpwire.Header{Type: reqTypes[w.Opcode], DstQPN: dst, SrcQPN: q.qpn, PSN: psn, RKey: w.RKey, RemoteAddr: w.RemoteAddr,
		Compare: w.CompareAdd, Swap: w.Swap}
	k := q.call
	var pay [][]byte
	switch w.Opcode {
	case abi.OpRDMAWrite, abi.OpSend:
		pay, h.PayloadLen = segs, uint32(total)
	case abi.OpRDMAWriteWithImm, abi.OpSendWithImm:
		pay, h.PayloadLen, h.ImmOrLen = segs, uint32(total), w.Imm
	case abi.OpRDMARead:
		h.ImmOrLen = uint32(total)
		k.readSegs = segs
	}
	err = c.roundTrip(k, h, pay, wait, q.timer)
	k.readSegs = nil
	if err != nil {
		return outNoPeer, 0, 0, 0, errors.Is(err, errTimeout) || time.Since(start) >= wait
	}
	r := &k.resp
	wantType := tcpwire.Ack
	if w.Opcode == abi.OpRDMARead {
		wantType = tcpwire.ReadResp
	}
	if r.Type != wantType || r.Status == tcpwire.OK && r.Type == tcpwire.ReadResp && uint64(r.PayloadLen) != total {
		c.close(fmt.Errorf("host %s answered a %s with a %s of %d bytes", l.peerID, w.Opcode, r.Type, r.PayloadLen))
		return outNoPeer, 0, 0, 0, false
	}
	switch r.Status {
	case tcpwire.OK:
		if w.Opcode.IsAtomic() {
			binary.LittleEndian.PutUint64(segs[0], r.Compare)
			return outDone, abi.WCSuccess, 8, 0, false
		}
		return outDone, abi.WCSuccess, uint32(total), 0, false
	case tcpwire.RNR:
		return outRNR, 0, 0, r.RNRTimer, false
	case tcpwire.RemAccessErr:
		return outDone, abi.WCRemAccessErr, 0, 0, false
	case tcpwire.RemOpErr:
		return outDone, abi.WCRemOpErr, 0, 0, false
	case tcpwire.RemInvReqErr:
		return outDone, abi.WCRemInvReqErr, 0, 0, false
	}
	return outNoPeer, 0, 0, 0, false // NO_QP, SEQ_ERR: as if nothing answered
}

// sockPayload is the tcp path's payload at the responder: a request's
// data is read from the connection straight into guest memory; a READ's
// data is written from guest memory straight to the connection.
type sockPayload struct {
	c         *tconn
	resp      *tcpwire.Header
	remaining uint64 // payload bytes of the request not read yet
	responded bool   // out wrote the response
	old       uint64
}

func (s *sockPayload) in(dst []byte) error {
	if uint64(len(dst)) > s.remaining {
		return fmt.Errorf("payload shorter than the request says") // respond never asks for more than total
	}
	s.remaining -= uint64(len(dst))
	return s.c.readFull(dst)
}

func (s *sockPayload) out(src []byte) error {
	s.resp.Status, s.resp.PayloadLen = tcpwire.OK, uint32(len(src))
	s.responded = true
	s.c.segs[0] = src
	err := s.c.writeFrame(s.resp, s.c.segs[:1])
	s.c.segs[0] = nil
	return err
}

func (s *sockPayload) atomic(old uint64) { s.old = old }

// serveRequests is the responder side's reader.
func (c *tconn) serveRequests() {
	var hb [tcpwire.HeaderLen]byte
	var h tcpwire.Header
	for {
		err := c.readHeader(hb[:], &h)
		if err == nil {
			switch {
			case h.Type.IsRequest():
				err = c.serveRC(&h)
			case h.Type == tcpwire.CMReq:
				err = c.startCM(&h)
			case h.Type == tcpwire.CMCancel:
				err = c.cancelCM(&h)
			default:
				err = fmt.Errorf("%s frame on a connection that carries requests", h.Type)
			}
		}
		if err != nil {
			var fe *tcpwire.Error
			if errors.As(err, &fe) {
				c.l.u.log.Warn("tcp path: bad frame from a peer; connection closed", "peer", c.l.peerID, "err", err)
			}
			c.close(err)
			return
		}
	}
}

// serveRC executes one RC request and answers it.
func (c *tconn) serveRC(h *tcpwire.Header) error {
	resp := &c.resp
	*resp = tcpwire.Header{Type: tcpwire.Ack, Tag: h.Tag, SrcQPN: h.DstQPN, PSN: h.PSN}
	if h.Type == tcpwire.Read {
		resp.Type = tcpwire.ReadResp
	}
	sp := &c.sp
	*sp = sockPayload{c: c, resp: resp, remaining: uint64(h.PayloadLen)}
	if err := c.execute(h, sp); err != nil {
		return err
	}
	if sp.remaining > 0 {
		if err := c.discard(sp.remaining); err != nil {
			return err
		}
	}
	if sp.responded {
		return nil
	}
	return c.writeFrame(resp, nil)
}

// execute runs request h at its QP and fills in the response's status.
func (c *tconn) execute(h *tcpwire.Header, sp *sockPayload) error {
	resp := sp.resp
	resp.Status = tcpwire.NoQP
	a := c.l.u.a
	a.mu.Lock()
	p := a.qps[h.DstQPN]
	a.mu.Unlock()
	if p == nil {
		return nil
	}
	pv := p.vm
	pv.memMu.RLock()
	defer pv.memMu.RUnlock()
	if pv.dead || p.destroyed.Load() {
		return nil
	}
	if s := p.State(); s != abi.QPSRTR && s != abi.QPSRTS && s != abi.QPSSQD {
		return nil // a responder outside RTR..SQD drops what it gets
	}
	p.rspMu.Lock()
	defer p.rspMu.Unlock()
	p.mu.Lock()
	bound := p.remoteHost == c.l.peerID && p.remoteQPN == h.SrcQPN
	rqPSN := p.attr.RQPSN & tcpwire.PSNMask
	p.mu.Unlock()
	if !bound {
		return nil // p is connected to another QP: it ignores us
	}
	if gen := p.resets.Load(); !p.rspInit || p.rspGen != gen {
		p.rspInit, p.rspGen, p.ePSN, p.rspLast = true, gen, rqPSN, lastResponse{}
	}
	d := tcpwire.PSNDiff(h.PSN, p.ePSN)
	switch {
	case d > 0:
		resp.Status = tcpwire.SeqErr
		return nil
	case d < 0 && h.Type != tcpwire.Read:
		// A duplicate: answer as the first time, execute nothing.
		resp.Status = tcpwire.OK
		if p.rspLast.valid && p.rspLast.psn == h.PSN {
			resp.Status, resp.Compare = p.rspLast.status, p.rspLast.value
		}
		return nil
	}
	r := &c.req
	*r = rcRequest{op: reqOps[h.Type], srcQPN: h.SrcQPN, rkey: h.RKey, raddr: h.RemoteAddr, imm: h.ImmOrLen,
		compare: h.Compare, swap: h.Swap}
	switch h.Type {
	case tcpwire.Read:
		r.total, r.imm = uint64(h.ImmOrLen), 0
	case tcpwire.CmpSwap, tcpwire.FetchAdd:
		r.total, r.imm = 8, 0
	case tcpwire.Write, tcpwire.Send:
		r.total, r.imm = uint64(h.PayloadLen), 0
	default:
		r.total = uint64(h.PayloadLen)
	}
	out, st, _, rnrTimer, err := p.respond(r, sp)
	if err != nil {
		return err
	}
	switch out {
	case outNoPeer:
		return nil
	case outRNR:
		resp.Status, resp.RNRTimer = tcpwire.RNR, rnrTimer
		return nil
	}
	switch st {
	case abi.WCSuccess:
		resp.Status = tcpwire.OK
	case abi.WCRemAccessErr:
		resp.Status = tcpwire.RemAccessErr
	case abi.WCRemOpErr:
		resp.Status = tcpwire.RemOpErr
	default:
		resp.Status = tcpwire.RemInvReqErr
	}
	resp.Compare = sp.old
	if d == 0 {
		p.ePSN = (p.ePSN + 1) & tcpwire.PSNMask
		p.rspLast = lastResponse{valid: true, psn: h.PSN, status: resp.Status, value: sp.old}
	}
	if sp.responded || resp.Type != tcpwire.ReadResp {
		return nil
	}
	resp.PayloadLen = 0 // an error answers a READ without data
	return nil
}
