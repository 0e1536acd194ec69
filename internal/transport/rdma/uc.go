// SPDX-License-Identifier: Apache-2.0

package rdma

// The responder of a UC QP (IBTA vol. 1's unreliable connected service;
// rxe's check_psn and check_op_seq for IB_QPT_UC), run by the engine's
// reader as serve is. It answers nothing: no ACK, no NAK. A packet behind the expected PSN came
// twice or late and is dropped. A packet ahead of it means packets were
// lost: the message in progress is dropped whole (its receive stays
// posted, nothing completes), and the packet is taken if it begins a
// message (FIRST or ONLY); a MIDDLE or LAST without its message is
// dropped, and so is every packet up to the next FIRST or ONLY. A message
// the device refuses (no receive posted, a bad rkey, a receive too
// small: device/uc.go) is dropped, and the QP goes on. A message is thus
// completed only when every packet of it arrived, in order.

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// serveUC handles packet pkt for the responder's QP, r.q, which the
// caller holds (Admit): a UC packet for a UC QP. Any other pairing (an RC
// packet for a UC QP, a UC packet for an RC QP) is dropped.
func (r *responder) serveUC(at *device.RCAttrs, pkt *rocewire.Packet) {
	q := r.q
	ctr := q.Counters()
	op := pkt.BTH.Opcode()
	if !at.UC || op.Transport() != rocewire.UC {
		ctr.Dropped.Add(1)
		return
	}
	psn := pkt.BTH.PSN()
	switch r.seq.Check(psn) {
	case rc.Duplicate:
		ctr.Dups.Add(1)
		return // came twice, or late
	case rc.Ahead:
		ctr.SeqErrs.Add(1)
		r.abandonUC() // packets were lost: the message they belonged to is dropped
	}
	r.seq.Resume(psn)
	op = op.Operation()
	pos := pkt.Info.Position
	first, last := pos == rocewire.PosFirst || pos == rocewire.PosOnly, pos == rocewire.PosLast || pos == rocewire.PosOnly
	write := op >= rocewire.RDMAWriteFirst && op <= rocewire.RDMAWriteOnlyWithImmediate
	n := uint64(len(pkt.Payload))
	if uint32(n) > at.PathMTU {
		r.dropUC(ctr)
		return
	}
	m := &r.msg
	if first {
		r.abandonUC() // a message that begins inside another: that one lost its end
		r.req = device.Request{SrcQPN: at.RemoteQPN, Total: n}
		switch {
		case write:
			r.req.Op, r.req.RAddr, r.req.RKey, r.req.Total = abi.OpRDMAWrite, pkt.RETH.VA(), pkt.RETH.RKey(), uint64(pkt.RETH.DMALen())
			if op == rocewire.RDMAWriteOnlyWithImmediate {
				r.req.Op, r.req.Imm = abi.OpRDMAWriteWithImm, pkt.ImmDt.Imm()
			}
		case op == rocewire.SendOnlyWithImmediate:
			r.req.Op, r.req.Imm = abi.OpSendWithImm, pkt.ImmDt.Imm()
		default:
			r.req.Op = abi.OpSend
		}
		if v := q.Begin(&r.req, m); v.Out != device.OutDone || v.Status != abi.WCSuccess {
			m.Abandon() // refused (counted by the device): dropped
			return
		}
		r.inMsg, r.write, r.off = true, write, 0
	} else {
		if !r.inMsg || r.write != write || !q.Revalidate(m) {
			r.dropUC(ctr) // no message to continue, one of the other kind, or its target went
			return
		}
		if !write && q.Grow(m, r.off+n) != abi.WCSuccess {
			r.dropUC(ctr) // larger than its receive
			return
		}
	}
	if write && (last && r.off+n != r.req.Total || !last && r.off+n >= r.req.Total && r.req.Total > 0) {
		r.dropUC(ctr) // the packets do not add up to the RETH's length
		return
	}
	if !q.Write(m, r.off, pkt.Payload) {
		r.dropUC(ctr) // its receive went meanwhile (ERR, RESET)
		return
	}
	if !last {
		r.off += n
		return
	}
	if !first && op == rocewire.SendLastWithImmediate {
		m.SetImm(pkt.ImmDt.Imm())
	}
	if op == rocewire.RDMAWriteLastWithImmediate {
		// The receive it consumes is taken at its last packet, the
		// whole range checked again with it.
		r.req.Op, r.req.Imm = abi.OpRDMAWriteWithImm, pkt.ImmDt.Imm()
		q.End(m)
		if v := q.Begin(&r.req, m); v.Out != device.OutDone || v.Status != abi.WCSuccess {
			r.inMsg = false
			m.Abandon()
			return
		}
	}
	r.inMsg = false
	m.SetSolicited(pkt.BTH.Solicited())
	if out, _ := q.End(m); out != device.OutDone {
		ctr.Dropped.Add(1) // the receive CQ is full, or the receive went: dropped
	}
}

// abandonUC drops the message in progress, if any.
func (r *responder) abandonUC() {
	if r.inMsg {
		r.inMsg = false
		r.msg.Abandon()
	}
}

// dropUC drops the packet being served and the message it belongs to.
func (r *responder) dropUC(ctr *device.Counters) {
	ctr.Dropped.Add(1)
	r.abandonUC()
}
