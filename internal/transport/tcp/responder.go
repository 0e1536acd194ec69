// SPDX-License-Identifier: Apache-2.0

package tcp

// RC operations over the tcp path, the responder's side (responder, run
// by the reader of a connection the peer host opened, package hostlink);
// the requester's is tcpPath (requester.go).
//
// PSNs. Each request carries the requester QP's PSN (from sq_psn, one per
// WR, kept across retries; the requester's window is requester.go); the
// responder expects the PSN from its rq_psn.
// A request with the expected PSN executes, and the expected PSN advances
// once the operation is final (not after RNR or NO_QP, which the requester
// retries). A request with an older PSN is a duplicate, a retry whose
// response was lost: it is answered as the first time and never executed
// twice: a SEND or WRITE is acknowledged again, a READ executed again (as
// IBTA allows), an atomic's original value replayed from the responder
// resources (rc.Seq: the last max_dest_rd_atomic READs and atomics), and
// an atomic no longer held there refused (rc.NAKUnheld). A newer PSN is
// a sequence error: an earlier request was refused (RNR) or lost, and the
// requester goes back to it.

import (
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// nakWire is how the tcp path's wire says each NAK (rc.NAKNone: OK).
var nakWire = [...]tcpwire.Status{rc.NAKNone: tcpwire.OK, rc.NAKRNR: tcpwire.RNR, rc.NAKSeqErr: tcpwire.SeqErr,
	rc.NAKInvReq: tcpwire.RemInvReqErr, rc.NAKRemAccess: tcpwire.RemAccessErr, rc.NAKRemOp: tcpwire.RemOpErr}

// nakStatus is the wire status of NAK n.
func nakStatus(n rc.NAK) tcpwire.Status {
	if int(n) < len(nakWire) {
		return nakWire[n]
	}
	return tcpwire.RemInvReqErr
}

// wireNAK is the NAK a tcp path response status says (rc.NAKNone for OK
// and for NO_QP, which is no response at all).
func wireNAK(s tcpwire.Status) rc.NAK {
	for n, w := range nakWire {
		if w == s {
			return rc.NAK(n)
		}
	}
	return rc.NAKNone
}

var reqTypes = [...]tcpwire.Type{
	abi.OpRDMAWrite: tcpwire.Write, abi.OpRDMAWriteWithImm: tcpwire.WriteImm, abi.OpSend: tcpwire.Send,
	abi.OpSendWithImm: tcpwire.SendImm, abi.OpRDMARead: tcpwire.Read, abi.OpAtomicCmpAndSwp: tcpwire.CmpSwap,
	abi.OpAtomicFetchAdd: tcpwire.FetchAdd, abi.OpSendWithInv: tcpwire.SendInv,
	abi.OpAtomicWrite: tcpwire.AtomicWrite,
}

var reqOps = map[tcpwire.Type]abi.Opcode{
	tcpwire.Write: abi.OpRDMAWrite, tcpwire.WriteImm: abi.OpRDMAWriteWithImm, tcpwire.Send: abi.OpSend,
	tcpwire.SendImm: abi.OpSendWithImm, tcpwire.Read: abi.OpRDMARead, tcpwire.CmpSwap: abi.OpAtomicCmpAndSwp,
	tcpwire.FetchAdd: abi.OpAtomicFetchAdd, tcpwire.SendInv: abi.OpSendWithInv,
	tcpwire.AtomicWrite: abi.OpAtomicWrite,
}

// sockPayload is what Request keeps of a request while execute runs it:
// its response, and how much of its payload is still on the connection
// (read and dropped after execute, whatever became of the request).
type sockPayload struct {
	resp      *tcpwire.Header
	remaining uint64 // payload bytes of the request not read yet
	responded bool   // sendRead wrote the response
	// A striped request's (lanes.go): the request, and how many of its
	// stripes are still on the lanes (read by landPayload, else read and
	// dropped after execute).
	req     *tcpwire.Header
	stripes int
}

// responder is the tcp path's responder on one connection a peer host
// opened (a hostlink.Responder): the scratch of that connection's
// reader, which calls its methods one at a time. ACKs wait in acks while
// the next request is already in the read buffer, and go out together
// (at most maxAcks).
type responder struct {
	lander // the main connection's
	dev    device.Targets

	acks  [maxAcks * tcpwire.HeaderLen]byte
	nacks int
	resp  tcpwire.Header
	sp    sockPayload
	req   device.Request
	rx    device.Message
	bind  tcpBinding              // the requester of the request being served
	whdr  [tcpwire.HeaderLen]byte // a READ response's header (landing.go)
	// writing says the responder holds the connection's write side
	// (sendRead). A panic while it or the target's memory (lander.held)
	// is held lets go of it on its way out (unwind), so that the VM's
	// teardown and the connection's other writers do not wait forever for
	// a handler that is gone.
	writing bool
	// lanes are the readers of the connection's lanes (lanes.go), made
	// at the first striped request.
	lanes [tcpwire.MaxLanes]*laneReader
}

// testHookHeld, if set, is called by execute with the request's header
// while the responder holds its target. Only tests set it
// (export_test.go), to make the responder panic there.
var testHookHeld func(h *tcpwire.Header)

// admit is p.Admit(b), noting p as held.
func (rp *responder) admit(p device.Target, b device.Binding) bool {
	if !p.Admit(b) {
		return false
	}
	rp.held = p
	return true
}

// unwind, deferred by Request, lets go of what a handler that panicked
// held: the target's memory and the connection's write side. On a normal
// return both are let go already and it does nothing.
//
// +checklocksignore: writing says the handler's StartWrite holds the write side
func (rp *responder) unwind() {
	if rp.held == nil && !rp.writing {
		return // the usual case: nothing to let go of
	}
	if rp.held != nil {
		rp.release(rp.held)
	}
	if rp.writing {
		rp.writing = false
		rp.c.EndWrite(0, 0)
	}
	rp.clearStep()
}

// maxAcks is how many ACKs the responder holds back at most.
const maxAcks = 16

// Responder returns the maker of the tcp path's responder of each
// connection a peer host opens (hostlink.Config.Responder): it executes
// RC requests for the QPs of dev.
func Responder(dev device.Targets) func(c *hostlink.Conn) hostlink.Responder {
	return func(c *hostlink.Conn) hostlink.Responder {
		rp := &responder{lander: lander{c: c}, dev: dev}
		rp.readFn, rp.writeFn = rp.tryRead, rp.tryWrite
		return rp
	}
}

// Idle writes the ACKs held back, before the connection waits for more.
func (rp *responder) Idle() error { return rp.flushAcks() }

// flushAcks writes the ACKs held back, in one write.
func (rp *responder) flushAcks() error {
	n := rp.nacks
	if n == 0 {
		return nil
	}
	rp.nacks = 0
	return rp.c.WriteEncoded(rp.acks[:n*tcpwire.HeaderLen], n)
}

// Request executes one RC request and answers it, or a UC one (uc.go).
func (rp *responder) Request(h *tcpwire.Header) error {
	if h.Type.IsUC() {
		return rp.requestUC(h)
	}
	resp := &rp.resp
	*resp = tcpwire.Header{Type: tcpwire.Ack, Tag: h.Tag, SrcQPN: h.DstQPN, PSN: h.PSN}
	if h.Type == tcpwire.Read {
		resp.Type = tcpwire.ReadResp
	}
	sp := &rp.sp
	*sp = sockPayload{resp: resp, remaining: uint64(h.PayloadLen)}
	if h.Striped() {
		if err := rp.checkLanes(h); err != nil {
			return err
		}
		sp.req, sp.stripes = h, h.StripeCount()-1
	}
	defer rp.unwind()
	if err := rp.execute(h, sp); err != nil {
		return err
	}
	if sp.remaining > 0 {
		if err := rp.c.Discard(sp.remaining); err != nil {
			return err
		}
	}
	if sp.stripes > 0 {
		if err := rp.dropStripes(sp); err != nil {
			return err
		}
	}
	if sp.responded {
		return nil
	}
	if resp.Type == tcpwire.Ack {
		// Hold the ACK back while the next request is already here: a
		// burst of requests is answered by one write.
		resp.Version = rp.c.Version()
		resp.Put(rp.acks[rp.nacks*tcpwire.HeaderLen:])
		rp.nacks++
		if rp.nacks < maxAcks && rp.c.Buffered() {
			return nil
		}
		return rp.flushAcks()
	}
	if err := rp.flushAcks(); err != nil {
		return err
	}
	return rp.c.WriteFrame(resp, nil)
}

// execute runs request h at its QP and fills in the response's status.
//
// The QP's memory is held (device.Target.Hold) only while bytes move between
// it and the connection: a copy out of the read buffer, one non-blocking
// system call between the socket and guest memory (landing.go); never
// while the connection waits for the peer. A slow peer then stalls its
// own connection and nothing else: the VM's other users, its
// deregistrations, destroys and power-off wait at most for one copy, and
// a target deregistered meanwhile is never touched again (each step
// resolves the request's target anew).
func (rp *responder) execute(h *tcpwire.Header, sp *sockPayload) error {
	resp := sp.resp
	resp.Status = tcpwire.NoQP
	p := rp.dev.Target(h.DstQPN)
	if p == nil {
		return nil
	}
	rp.bind = tcpBinding{host: rp.c.PeerID(), qpn: h.SrcQPN}
	tp := tcpPathOf(p)
	if tp == nil || tp.host != rp.c.PeerID() {
		if rp.admit(p, &rp.bind) { // p is connected to a QP of another host (or none): dropped
			rp.release(p)
		}
		return nil
	}
	// The responder's PSN lock before the QP's memory, always: a message
	// lets go of the memory and takes it again under the PSN lock.
	rs := &tp.rsp
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !rp.admit(p, &rp.bind) {
		return nil
	}
	if testHookHeld != nil {
		testHookHeld(h)
	}
	r, verdict, run := rp.sequence(h, p, rs, resp)
	if !run {
		rp.release(p)
		return nil
	}
	m := &rp.rx
	v := p.Begin(r, m)
	out, st, rnrTimer := v.Out, v.Status, v.RNRTimer
	var old uint64
	if out != device.OutDone || st != abi.WCSuccess {
		p.End(m) // lets go of what Begin resolved; m took no receive
	} else {
		switch h.Type {
		case tcpwire.CmpSwap, tcpwire.FetchAdd:
			old = m.Old()
			out, st = p.End(m)
		case tcpwire.Read:
			rp.release(p)
			if err := rp.sendRead(p, m, r.Total, sp); err != nil {
				return err
			}
			if !rp.hold(p) {
				return nil
			}
			if !sp.responded {
				// The target went before a byte of it was sent.
				st = abi.WCRemAccessErr
				p.MoveToErr(fmt.Sprintf("RDMA READ from QP 0x%x: its target [0x%x,+%d) was deregistered meanwhile", r.SrcQPN, r.RAddr, r.Total))
			}
			out, _ = p.End(m)
		default: // a WRITE or a SEND: its payload follows
			rp.release(p)
			landed, err := rp.landPayload(p, m, sp)
			if err != nil {
				return err
			}
			if !rp.hold(p) {
				return nil // p went meanwhile: nothing answers
			}
			out, st = p.End(m)
			if !landed && out == device.OutDone {
				st = rp.targetWent(p, m, r)
			}
		}
	}
	rp.release(p)
	switch out {
	case device.OutNoPeer:
		return nil
	case device.OutRNR:
		resp.Status, resp.RNRTimer = tcpwire.RNR, rnrTimer
		if rnrTimer == 0 {
			resp.RNRTimer = p.RCAttrs().MinRNRTimer // the receive CQ was full at End
		}
		return nil
	}
	nak := rc.NAKOf(st)
	resp.Status, resp.Compare = nakStatus(nak), old
	if verdict == rc.New {
		switch {
		case nak != rc.NAKNone:
			rs.seq.Done(nak)
		case h.Type == tcpwire.CmpSwap || h.Type == tcpwire.FetchAdd:
			rs.seq.Executed(rc.Resource{Atomic: true, Value: old})
		case h.Type == tcpwire.Read:
			rs.seq.Executed(rc.Resource{RKey: r.RKey, VA: r.RAddr, Len: r.Total})
		default:
			rs.seq.Done(rc.NAKNone)
		}
	}
	if !sp.responded && resp.Type == tcpwire.ReadResp {
		resp.PayloadLen = 0 // an error answers a READ without data
	}
	return nil
}

// targetWent is the status of a WRITE or SEND whose target went while
// its payload landed: its region was deregistered (REM_ACCESS_ERR for a
// WRITE; REM_OP_ERR for a SEND, whose receive's buffers went), and the
// responder goes to ERR, as when the target was bad from the start. The
// caller holds p. A receive flushed or reset meanwhile was already dealt
// with by End (OutNoPeer).
func (rp *responder) targetWent(p device.Target, m *device.Message, r *device.Request) abi.WCStatus {
	st := abi.WCRemAccessErr
	if r.Op.IsSend() {
		st = abi.WCRemOpErr
	}
	p.MoveToErr(fmt.Sprintf("%s from QP 0x%x: its target went while its %d bytes were arriving (a memory region deregistered)", r.Op, r.SrcQPN, r.Total))
	return st
}

// sequence applies the PSN rules to request h at p (rc.Seq: new,
// duplicate or ahead) and returns the request to run. run false: resp
// holds the answer. The caller holds rs.mu and p (Admit).
//
// +checklocks:rs.mu
func (rp *responder) sequence(h *tcpwire.Header, p device.Target, rs *responderPSN, resp *tcpwire.Header) (r *device.Request, verdict rc.Verdict, run bool) {
	rs.seq.Sync(p)
	verdict = rs.seq.Check(h.PSN)
	switch verdict {
	case rc.Ahead:
		p.Counters().SeqErrs.Add(1)
		resp.Status = tcpwire.SeqErr
		return nil, verdict, false
	case rc.Duplicate:
		p.Counters().Dups.Add(1)
		if h.Type != tcpwire.Read {
			// A duplicate: answer as the first time, execute nothing.
			// An atomic's result comes from the responder resources;
			// one no longer held is refused (rc.NAKUnheld).
			resp.Status = tcpwire.OK
			if nak, ok := rs.seq.Refused(h.PSN); ok {
				resp.Status = nakStatus(nak)
			} else if h.Type == tcpwire.CmpSwap || h.Type == tcpwire.FetchAdd {
				v, ok := rs.seq.Atomic(h.PSN)
				resp.Compare = v
				if !ok {
					resp.Status = nakStatus(rc.NAKUnheld)
				}
			}
			return nil, verdict, false
		}
	}
	r = &rp.req
	*r = device.Request{Op: reqOps[h.Type], SrcQPN: h.SrcQPN, RKey: h.RKey, RAddr: h.RemoteAddr, Imm: h.ImmOrLen,
		Compare: h.Compare, Swap: h.Swap, Solicited: h.Flags&tcpwire.FlagSolicited != 0, SRQN: h.XRCSRQN()}
	switch h.Type {
	case tcpwire.Read:
		r.Total, r.Imm = uint64(h.ImmOrLen), 0
	case tcpwire.CmpSwap, tcpwire.FetchAdd:
		r.Total, r.Imm = 8, 0
	case tcpwire.Write, tcpwire.Send, tcpwire.SendInv:
		r.Total, r.Imm = h.MessageLen(), 0
	default:
		r.Total = h.MessageLen()
	}
	return r, verdict, true
}
