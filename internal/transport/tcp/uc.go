// SPDX-License-Identifier: Apache-2.0

package tcp

// UC QPs on the tcp path (device/uc.go): the requester writes each WR
// as one UC frame (tcpwire's UC types) with no call waiting for a
// response, and the engine settles the WR once the batch is written
// (requester's UC mode); the responder answers nothing. A frame behind
// the expected PSN came twice (the lossy test link) and is dropped; any
// other is taken, and the next PSN after it expected: frames lost are
// messages lost. A message the device refuses is dropped.

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/rc/requester"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

var ucTypes = [...]tcpwire.Type{abi.OpRDMAWrite: tcpwire.UCWrite, abi.OpRDMAWriteWithImm: tcpwire.UCWriteImm, abi.OpSend: tcpwire.UCSend,
	abi.OpSendWithImm: tcpwire.UCSendImm}

var ucOps = map[tcpwire.Type]abi.Opcode{tcpwire.UCWrite: abi.OpRDMAWrite, tcpwire.UCWriteImm: abi.OpRDMAWriteWithImm,
	tcpwire.UCSend: abi.OpSend, tcpwire.UCSendImm: abi.OpSendWithImm}

// sendUC adds e's UC frame to the batch on c: no call, no tag. A UC QP's
// WQE is a SEND or a WRITE (device.QP.ReadWQE fails the others).
func (t *tcpPath) sendUC(c *hostlink.Conn, e *requester.Entry, at *device.RCAttrs) {
	wq := &e.WQE
	s := &t.slots[e.Index]
	h := &t.treq
	*h = tcpwire.Header{Version: c.Version(), Type: ucTypes[wq.Opcode], DstQPN: at.RemoteQPN, SrcQPN: t.q.QPN(), PSN: e.PSN, RKey: wq.RKey,
		RemoteAddr: wq.RemoteAddr, PayloadLen: uint32(e.Total), Flags: tcpwire.SolicitedOf(wq.Opcode.CarriesEvent(), wq.Flags&abi.SendSolicited != 0)}
	if wq.Opcode == abi.OpSendWithImm || wq.Opcode == abi.OpRDMAWriteWithImm {
		h.ImmOrLen = wq.Imm
	}
	h.Put(s.hdr[:])
	t.bq = append(t.bq, e.Index) // counted as a frame; no call to withdraw
	t.iov = append(t.iov, s.hdr[:])
	t.bn += tcpwire.HeaderLen
	for _, p := range e.Segs[:e.NSeg] {
		if len(p) > 0 {
			t.iov = append(t.iov, p)
			t.bn += uint64(len(p))
		}
	}
}

// requestUC executes UC request h and answers nothing.
func (rp *responder) requestUC(h *tcpwire.Header) error {
	sp := &rp.sp
	*sp = sockPayload{resp: &rp.resp, remaining: uint64(h.PayloadLen)}
	defer rp.unwind()
	if err := rp.executeUC(h, sp); err != nil {
		return err
	}
	if sp.remaining > 0 {
		return rp.c.Discard(sp.remaining)
	}
	return nil
}

// executeUC runs UC request h at its QP: in the PSN's order, landing its
// payload as execute does; every refusal drops it.
func (rp *responder) executeUC(h *tcpwire.Header, sp *sockPayload) error {
	p := rp.dev.Target(h.DstQPN)
	if p == nil {
		return nil
	}
	rp.bind = tcpBinding{host: rp.c.PeerID(), qpn: h.SrcQPN, uc: true}
	tp := tcpPathOf(p)
	if tp == nil || tp.host != rp.c.PeerID() {
		if rp.admit(p, &rp.bind) { // connected to a QP of another host (or none): dropped
			rp.release(p)
		}
		return nil
	}
	rs := &tp.rsp
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if !rp.admit(p, &rp.bind) {
		return nil // not bound to the requester, or an RC QP: dropped (counted)
	}
	ctr := p.Counters()
	rs.seq.Sync(p)
	switch rs.seq.Check(h.PSN) {
	case rc.Duplicate:
		ctr.Dups.Add(1)
		rp.release(p)
		return nil
	case rc.Ahead:
		ctr.SeqErrs.Add(1) // frames before it were lost
	}
	rs.seq.Resume(h.PSN)
	r := &rp.req
	*r = device.Request{Op: ucOps[h.Type], SrcQPN: h.SrcQPN, RKey: h.RKey, RAddr: h.RemoteAddr, Total: uint64(h.PayloadLen),
		Solicited: h.Flags&tcpwire.FlagSolicited != 0}
	if h.Type == tcpwire.UCWriteImm || h.Type == tcpwire.UCSendImm {
		r.Imm = h.ImmOrLen
	}
	m := &rp.rx
	if v := p.Begin(r, m); v.Out != device.OutDone || v.Status != abi.WCSuccess {
		m.Abandon() // refused (counted by the device): dropped
		rp.release(p)
		return nil
	}
	rp.release(p)
	landed, err := rp.landPayload(p, m, sp)
	if err != nil {
		m.Abandon()
		return err
	}
	if !rp.hold(p) {
		m.Abandon()
		return nil // p went meanwhile
	}
	if !landed {
		m.Abandon()
		ctr.Dropped.Add(1) // its target went while it landed
	} else if out, _ := p.End(m); out != device.OutDone {
		ctr.Dropped.Add(1) // the receive CQ is full, or the receive went
	}
	rp.release(p)
	return nil
}
