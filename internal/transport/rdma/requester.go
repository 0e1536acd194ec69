// SPDX-License-Identifier: Apache-2.0

package rdma

// The rdma path's requester: the RC engine (internal/rc/requester) over
// this path's packets. The engine, on the QP's send-queue goroutine, keeps
// the window of WQEs, their PSNs (a SEND or WRITE one per packet, a READ
// one per response packet, an atomic one), the fence, max_rd_atomic and
// outstanding-PSN limits, go-back-N and the retry budget; the path only
// turns each packet the engine asks for into a RoCEv2 packet in the
// path's batch (sent straight from guest memory, an AckReq at least every
// ackEvery packets), and each response packet the engine's reader
// goroutine gets into an upcall: an ACK acknowledges every PSN up to its
// own (coalescing), a NAK asks for a go-back-N, an RNR wait or ends a
// WQE, a READ response's data lands under the engine's lock, an atomic
// ACK carries the original value. A READ's response paced by the
// requester's credit (readCredit) is asked for more of (a continuation)
// by the engine's reader itself, as half of the last credit lands.

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/rc/requester"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// maxOutstanding is how many PSNs (packets sent, or READ response packets
// asked for) may wait for their acknowledgement at most (the engine's
// bound, outstandingFor, follows its socket's buffer): the bound that
// keeps a fast sender from overflowing a slow receiver's socket into a
// retransmission storm.
const (
	maxOutstanding = 1024
	ackEvery       = 64 // AckReq at least every this many packets
	pollBudget     = 200 * time.Microsecond
)

// path is the rdma path of one QP: its requester (the engine over this
// file's wire) and its responder (responder.go).
type path struct {
	e    *Engine
	q    device.Source
	peer netip.AddrPort // RoCE v1: the peer uplink's GID, port 0
	mac  [6]byte        // RoCE v1: the peer uplink's MAC
	m    Marks          // every packet's, both ways

	rq *requester.Engine

	// Owned by the QP's send-queue goroutine (the wire's Send and Flush).
	hdr  [maxHeader]byte
	bufs [][]byte
	out  *batch

	rsp responder
}

func newPath(e *Engine, q device.Source, peer netip.AddrPort, mac [6]byte, m Marks) *path {
	p := &path{e: e, q: q, peer: peer, mac: mac, m: m, bufs: make([][]byte, 0, abi.MaxSGE), out: newBatch(e, peer, mac, m)}
	p.rq = requester.New(q, (*wire)(p), requester.Config{
		MTU:         pathMTU,
		Outstanding: e.outstanding,
		ReadCredit:  readCredit,
		Poll:        pollBudget,
		Retransmits: &e.ctr.Retransmits,
	})
	p.rsp.p, p.rsp.out = p, newBatch(e, peer, mac, m)
	return p
}

// pathMTU is the payload of a request packet: the QP's path MTU, 1024
// when it is not one RoCE knows.
func pathMTU(at *device.RCAttrs) uint32 {
	if !rocewire.ValidMTU(int(at.PathMTU)) {
		return 1024
	}
	return at.PathMTU
}

// Kind, Pump, Busy, Drop, Flush, PollBudget and Status make p a
// device.Path that reports what it has in flight.

var _ device.PathStatuser = (*path)(nil)

func (p *path) Kind() abi.PathKind        { return abi.PathRDMA }
func (p *path) PollBudget() time.Duration { return pollBudget }
func (p *path) Status(st *mgmt.QPStatus)  { st.InFlight = p.rq.InFlight() }
func (p *path) Busy() bool                { return p.rq.Busy() }
func (p *path) Pump()                     { p.rq.Pump() }

// Drop forgets the window (RESET).
func (p *path) Drop() { p.rq.Drop() }

// Flush completes the window with WR_FLUSH_ERR (ERR).
func (p *path) Flush() { p.rq.Flush() }

// wire is the path as the requester engine's Wire: RoCEv2 packets in the
// path's batch. Its methods run on the QP's send-queue goroutine.
type wire path

var _ requester.Wire = (*wire)(nil)

// Send queues request packet i of e.
func (w *wire) Send(e *requester.Entry, i, got uint32, at *device.RCAttrs) error {
	p := (*path)(w)
	if err := p.sendPacket(at, e, i, got); err != nil {
		p.e.log.Debug("rdma path: send", "qpn", p.q.QPN(), "err", err)
		return err // the timeout retransmits
	}
	return nil
}

// Flush sends the batch; what it could not send the timeout retransmits.
func (w *wire) Flush() requester.Outcome {
	p := (*path)(w)
	if err := p.out.flush(); err != nil {
		p.e.log.Debug("rdma path: send", "qpn", p.q.QPN(), "err", err)
		return requester.Dropped
	}
	return requester.Sent
}

// Collect does nothing: the engine's reader makes the upcalls (response).
func (w *wire) Collect() {}

// Recall does nothing: a response to an earlier sending is told by its
// PSN, and READ data lands only under the requester's lock.
func (w *wire) Recall(*requester.Entry) {}

// Timeout goes back: a datagram or its response was lost.
func (w *wire) Timeout(*requester.Entry) requester.Verdict { return requester.GoBack }

// sendPacket queues request packet i of e; a READ of which got response
// packets arrived asks for the rest. A UC QP's SEND and WRITE packets
// have UC's opcodes and ask for no ACK (a UC QP has no READ or atomic);
// an XRC initiator's packets have XRC's, with the XRCETH naming the SRQ
// its WQE names.
func (p *path) sendPacket(at *device.RCAttrs, e *requester.Entry, i, got uint32) error {
	if !p.q.PortUp() {
		return nil // the port is down: the packet is lost, and the timeout retransmits
	}
	w := &e.WQE
	mtu := e.MTU
	psn := (e.PSN + i) & rc.PSNMask
	f := rocewire.BTHFields{PKey: rocewire.DefaultPKey, DestQP: at.RemoteQPN, PSN: psn}
	x := rocewire.BTHLen // where the next header goes
	if at.XRC {
		rocewire.XRCETH(p.hdr[x:]).Encode(w.XRCSRQN)
		x += rocewire.XRCETHLen
	}
	h := p.hdr[:x]
	first, last := i == 0, i == e.NPSN-1
	var off, n uint64
	switch w.Opcode {
	case abi.OpRDMARead:
		// AckReq, which a READ request needs not (its response answers
		// it), clear: the requester asks for a response paced by its
		// credit, and sends continuations for it (reads.go).
		f.Opcode, f.AckReq = rocewire.RDMAReadRequest, false
		skip := uint64(got) * uint64(e.MTU)
		psn = (e.PSN + got) & rc.PSNMask
		f.PSN = psn
		h = p.hdr[:x+rocewire.RETHLen]
		rocewire.RETH(h[x:]).Encode(w.RemoteAddr+skip, w.RKey, uint32(e.Total-skip))
	case abi.OpAtomicCmpAndSwp, abi.OpAtomicFetchAdd:
		f.Opcode, f.AckReq = rocewire.CompareSwap, true
		swap, cmp := w.Swap, w.CompareAdd
		if w.Opcode == abi.OpAtomicFetchAdd {
			f.Opcode, swap, cmp = rocewire.FetchAdd, w.CompareAdd, 0
		}
		h = p.hdr[:x+rocewire.AtomicETHLen]
		rocewire.AtomicETH(h[x:]).Encode(w.RemoteAddr, w.RKey, swap, cmp)
	case abi.OpAtomicWrite:
		// The 8 bytes follow the RETH in the header buffer: the WQE
		// carries them (its Swap, little-endian as in memory). RC only.
		f.Opcode, f.AckReq = rocewire.AtomicWrite, true
		h = p.hdr[:x+rocewire.RETHLen+8]
		rocewire.RETH(h[x:]).Encode(w.RemoteAddr, w.RKey, 8)
		binary.LittleEndian.PutUint64(h[x+rocewire.RETHLen:], w.Swap)
	default:
		off = uint64(i) * uint64(mtu)
		n = min(uint64(mtu), e.Total-off)
		imm := w.Opcode == abi.OpSendWithImm || w.Opcode == abi.OpRDMAWriteWithImm
		write := w.Opcode == abi.OpRDMAWrite || w.Opcode == abi.OpRDMAWriteWithImm
		f.Opcode = opcodeOf(write, imm, first, last)
		inv := w.Opcode == abi.OpSendWithInv && last
		if inv {
			f.Opcode = rocewire.SendLastWithInvalidate
			if first {
				f.Opcode = rocewire.SendOnlyWithInvalidate
			}
		}
		f.AckReq = last || i%ackEvery == ackEvery-1
		if at.UC {
			f.Opcode, f.AckReq = rocewire.UC|f.Opcode, false
		}
		f.Solicited = last && w.Flags&abi.SendSolicited != 0 && (!write || imm)
		if write && first {
			rocewire.RETH(p.hdr[x:]).Encode(w.RemoteAddr, w.RKey, uint32(e.Total))
			x += rocewire.RETHLen
		}
		if imm && last {
			rocewire.ImmDt(p.hdr[x:]).Encode(w.Imm)
			x += rocewire.ImmDtLen
		}
		if inv {
			rocewire.IETH(p.hdr[x:]).Encode(w.InvalidateRKey())
			x += rocewire.IETHLen
		}
		h = p.hdr[:x]
	}
	if at.XRC {
		f.Opcode |= rocewire.XRC
	}
	f.PadCount = rocewire.PadCount(int(n))
	rocewire.BTH(h).Encode(&f)
	return p.out.add(h, pieces(p.bufs[:0], e.Segs[:e.NSeg], off, n), int(n))
}

// opcodeOf is the opcode of a SEND's or a WRITE's packet.
func opcodeOf(write, imm, first, last bool) rocewire.Opcode {
	type k struct{ write, imm, first, last bool }
	switch (k{write, imm, first, last}) {
	case k{false, false, true, true}:
		return rocewire.SendOnly
	case k{false, true, true, true}:
		return rocewire.SendOnlyWithImmediate
	case k{false, false, true, false}, k{false, true, true, false}:
		return rocewire.SendFirst
	case k{false, false, false, false}, k{false, true, false, false}:
		return rocewire.SendMiddle
	case k{false, false, false, true}:
		return rocewire.SendLast
	case k{false, true, false, true}:
		return rocewire.SendLastWithImmediate
	case k{true, false, true, true}:
		return rocewire.RDMAWriteOnly
	case k{true, true, true, true}:
		return rocewire.RDMAWriteOnlyWithImmediate
	case k{true, false, true, false}, k{true, true, true, false}:
		return rocewire.RDMAWriteFirst
	case k{true, false, false, false}, k{true, true, false, false}:
		return rocewire.RDMAWriteMiddle
	case k{true, false, false, true}:
		return rocewire.RDMAWriteLast
	}
	return rocewire.RDMAWriteLastWithImmediate
}

// pieces appends to dst the slices of segs that hold bytes [off, off+n).
func pieces(dst [][]byte, segs [][]byte, off, n uint64) [][]byte {
	for _, s := range segs {
		if n == 0 {
			break
		}
		if off >= uint64(len(s)) {
			off -= uint64(len(s))
			continue
		}
		take := min(n, uint64(len(s))-off)
		dst = append(dst, s[off:off+take])
		off, n = 0, n-take
	}
	return dst
}

// response turns a response packet for this QP's requester into the
// engine's upcall; the engine's reader calls it. It reports whether it
// queued a packet in the reader's batch to the peer (the responder's,
// which the reader flushes once the packets it read are served): a READ's
// continuation.
func (p *path) response(pkt *rocewire.Packet) bool {
	psn := pkt.BTH.PSN()
	switch op := pkt.BTH.Opcode(); op {
	case rocewire.Acknowledge:
		s := pkt.AETH.Syndrome()
		switch s.Kind() {
		case rocewire.KindACK:
			p.rq.Ack(psn)
		case rocewire.KindRNR:
			p.rq.Nak(psn, rc.NAKRNR, s.Value())
		case rocewire.KindNAK:
			if s.Value() == rocewire.NAKPSNSeqErr {
				p.e.ctr.SeqErrNaks.Add(1)
				p.rq.Nak(psn, rc.NAKSeqErr, 0)
				return false
			}
			p.rq.Nak(psn, wireNAK(s.Value()), 0)
		}
	case rocewire.AtomicAcknowledge:
		p.rq.AtomicAck(psn, pkt.AtomicAckETH.Orig())
	case rocewire.RDMAReadResponseOnly:
		if len(pkt.Payload) == 0 && p.rq.AtomicWriteAck(psn) {
			return false // an atomic write's answer
		}
		fallthrough
	case rocewire.RDMAReadResponseFirst, rocewire.RDMAReadResponseMiddle, rocewire.RDMAReadResponseLast:
		pos := pkt.Info.Position
		// AckReq, which a response needs not, set: the responder paces
		// it by the requester's credit (reads.go).
		more, ask := p.rq.ReadResponse(psn, pos == rocewire.PosFirst || pos == rocewire.PosOnly, pos == rocewire.PosLast || pos == rocewire.PosOnly,
			pkt.BTH.AckReq(), pkt.Payload)
		if ask {
			return p.askMore(&more)
		}
	}
	return false
}

// askMore queues READ continuation m in the reader's batch to the peer,
// and reports whether it did (not while the port is down: the timeout
// asks again).
func (p *path) askMore(m *requester.ReadMore) bool {
	if !p.q.PortUp() {
		return false
	}
	dqpn, _ := p.q.Remote()
	var h [rocewire.BTHLen + rocewire.XRCETHLen + rocewire.RETHLen]byte
	op, x := rocewire.RDMAReadRequest, rocewire.BTHLen
	if p.q.RCAttrs().XRC {
		rocewire.XRCETH(h[x:]).Encode(m.SRQN)
		op, x = rocewire.XRC|op, x+rocewire.XRCETHLen
	}
	rocewire.BTH(h[:]).Encode(&rocewire.BTHFields{Opcode: op, PKey: rocewire.DefaultPKey, DestQP: dqpn, PSN: m.PSN})
	rocewire.RETH(h[x:]).Encode(m.RemoteAddr, m.RKey, m.Len)
	p.rsp.out.add(h[:x+rocewire.RETHLen], nil, 0)
	return true
}

// wireNAK is the rc NAK of a NAK code.
func wireNAK(code uint8) rc.NAK {
	switch code {
	case rocewire.NAKInvReq:
		return rc.NAKInvReq
	case rocewire.NAKRemAccess:
		return rc.NAKRemAccess
	}
	return rc.NAKRemOp
}
