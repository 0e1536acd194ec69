// SPDX-License-Identifier: Apache-2.0

// Package rdma is the rdma path: a software RoCEv2 engine, the host's
// RDMA uplink where it has no RDMA hardware. Its packets are RoCEv2 RC
// packets as a RoCE NIC sends and accepts them (package rocewire: BTH and
// the extended headers, padding, the ICRC), over UDP port 4791 on the
// uplink's address; each QP of a VM is its own QP on the wire, with the
// device's QPN. A port group set to RoCE v1 has the same transport carried
// in Ethernet frames instead, by an engine on an AF_PACKET socket on the
// uplink's interface (frame.go).
//
// Goroutines and who owns them:
//
//	Engine.read  one per engine: reads every datagram, checks its ICRC and
//	             headers, and hands it to the QP its BTH names: a request
//	             to that QP's responder (responder.go), which executes it
//	             against guest memory and answers from this goroutine; a
//	             response to that QP's requester (requester.go), which
//	             records it and wakes the QP's send-queue goroutine (and
//	             asks for more of a READ response paced by its credit,
//	             from this goroutine: reads.go).
//	             Stopped by Close. A panic in serving a packet drops
//	             that packet only (packet, safeFrame): the reader lives.
//	Engine.sendReads  one per engine: the READ sender (reads.go). It
//	             sends the READ responses longer than one turn, and the
//	             answers queued behind them, one turn per QP in round
//	             robin, so that a long READ neither stops the reader nor
//	             starves the engine's other QPs. Stopped by Close; a
//	             panic in a turn drops that QP's queued answers only.
//
// Requesters are the QPs' send-queue goroutines (package device's runSQ):
// each packetizes its work requests by the path MTU, keeps a bounded
// window of them in flight, and completes them in order; losses are
// recovered by go-back-N on a PSN sequence error NAK, an implicit NAK or
// the local ACK timeout, under the shared RC rules (package rc).
package rdma

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// Config configures an Engine.
type Config struct {
	// Device is where the engine's reader finds the QP a packet is for
	// (its BTH's DestQP): the device's QPs.
	Device device.Targets
	Conn   Conn // the uplink's socket (ListenUDP), for RoCE v2
	// Frames, instead of Conn, makes the engine RoCE v1: its socket on
	// the uplink's interface (ListenFrames), and GID the uplink's GID,
	// every frame's SGID (frame.go).
	Frames FrameConn
	GID    netip.Addr
	Log    *slog.Logger
	// Members reports whether addr (an unmapped IP address; RoCE v1:
	// the source GID, unmapped) is the address of an RDMA uplink of a
	// vrdma host of the uplink's switch. A packet from any other address
	// is a peer that is not a vrdma VM: it is dropped unanswered and
	// counted (Counters.NotVRDMA). Nil takes every address for a member
	// (a test's engines, which have no control plane). It is called by
	// the reader only for a packet no QP serves, and for every UD packet.
	Members func(addr netip.Addr) bool
	// GSI, if set, receives the MADs of the UD packets to QP1 (gsi.go):
	// src is the sender's address (unmapped), srcQP its QP (DETH), mad
	// the payload, valid only during the call. Nil: they count as NoQP.
	GSI func(src netip.Addr, srcQP uint32, mad []byte)
}

// Counters are an engine's packet counters.
type Counters struct {
	TxPackets, RxPackets, TxBytes, RxBytes, Retransmits atomic.Uint64
	BadICRC, Malformed, NoQP, SeqErrNaks                atomic.Uint64
	// Panics counts the packets dropped because serving them panicked
	// (packet, safeFrame).
	Panics atomic.Uint64
	// TxBatches and RxBatches count the datagrams of several packets
	// (UDP GSO sends, GRO receives).
	TxBatches, RxBatches atomic.Uint64
	// NotVRDMA counts the packets dropped because their sender is no
	// vrdma host of the switch (Config.Members); they are not in NoQP.
	NotVRDMA atomic.Uint64
}

// Engine is one RDMA uplink's RoCE engine: RoCE v2 on a UDP socket, or
// RoCE v1 on an AF_PACKET one (frame.go).
type Engine struct {
	cfg   Config
	dev   device.Targets
	conn  Conn // RoCE v2; nil for v1
	log   *slog.Logger
	local netip.AddrPort // RoCE v1: the GID, port 0
	ctr   Counters

	// outstanding is how many PSNs a requester of the engine's leaves
	// unacknowledged at most (outstandingFor).
	outstanding int32

	// RoCE v1's: the socket, its interface and the uplink's GID.
	fc   FrameConn
	link Link
	gid  [16]byte

	rd readSender // the QPs with READ responses queued (reads.go)
	mc groups     // the multicast groups it receives (mcast.go)

	wg sync.WaitGroup
}

// Start starts the engine on cfg.Conn, or on cfg.Frames.
func Start(cfg Config) *Engine {
	e := &Engine{cfg: cfg, dev: cfg.Device, conn: cfg.Conn, fc: cfg.Frames, log: cfg.Log.With("component", "rdma")}
	if cfg.Frames != nil {
		e.outstanding = outstandingFor(cfg.Frames)
	} else {
		e.outstanding = outstandingFor(cfg.Conn)
	}
	e.rd.wake = make(chan struct{}, 1)
	e.wg.Add(2)
	go e.sendReads()
	if e.fc != nil {
		e.link, e.gid = e.fc.Link(), cfg.GID.As16()
		e.local = netip.AddrPortFrom(netip.AddrFrom16(e.gid), 0)
		go e.readFrames()
		return e
	}
	e.local = cfg.Conn.LocalAddr()
	go e.read()
	return e
}

// outstandingFor is the engine's bound on unacknowledged PSNs, for a
// socket whose receive buffer the peer's is taken to equal (agents set
// theirs alike, setBuffers): as many packets of the largest MTU as fill
// half of it (a packet's buffer takes up to twice its size), from
// 2×ackEvery, so that a window always holds an AckReq, up to
// maxOutstanding. A larger bound is fewer waits for acknowledgements
// and wake-ups per MiB; a smaller one keeps a burst within a default
// buffer (net.core.rmem_max, 208 KiB, without CAP_NET_ADMIN) instead of
// overflowing it into retransmissions. A socket that does not tell its
// buffer (a test's) gets maxOutstanding.
func outstandingFor(c any) int32 {
	b, ok := c.(interface{ ReceiveBuffer() int })
	if !ok {
		return maxOutstanding
	}
	return int32(min(max(b.ReceiveBuffer()/(4*maxDatagram), 2*ackEvery), maxOutstanding))
}

// RoCEv1 reports whether the engine speaks RoCE v1.
func (e *Engine) RoCEv1() bool { return e.fc != nil }

// Counters returns the engine's packet counters.
func (e *Engine) Counters() *Counters { return &e.ctr }

// Status reports the engine's address and counters.
func (e *Engine) Status() mgmt.RDMAStatus {
	c := &e.ctr
	addr, roce := e.local.String(), "v2"
	if e.fc != nil {
		addr, roce = fmt.Sprintf("%s %s gid %s", e.link.Name, net.HardwareAddr(e.link.MAC[:]), e.local.Addr()), "v1"
	}
	return mgmt.RDMAStatus{Address: addr, RoCE: roce, PacketsOut: c.TxPackets.Load(), PacketsIn: c.RxPackets.Load(),
		BytesOut: c.TxBytes.Load(), BytesIn: c.RxBytes.Load(), Retransmits: c.Retransmits.Load(), SeqErrNaks: c.SeqErrNaks.Load(),
		BadICRC: c.BadICRC.Load(), Malformed: c.Malformed.Load(), NoQP: c.NoQP.Load(), Panics: c.Panics.Load(),
		BatchesOut: c.TxBatches.Load(), BatchesIn: c.RxBatches.Load(), NotVRDMA: c.NotVRDMA.Load()}
}

// LocalAddr is the uplink's address and port (RoCE v1: its GID, port 0).
func (e *Engine) LocalAddr() netip.AddrPort { return e.local }

// Close stops the engine: its socket, its reader and its READ sender.
func (e *Engine) Close() {
	if e.fc != nil {
		e.fc.Close()
	} else {
		e.conn.Close()
	}
	e.closeGroups()
	e.rd.stop()
	e.wg.Wait()
}

// Bind returns the maker of the rdma path of a QP whose remote end is
// behind the uplink at peer (its address; port 0 means 4791), for a
// device.Route; its packets carry marks m (the port group's DSCP
// << 2, netcheck.SocketOptionsOf).
func (e *Engine) Bind(peer netip.AddrPort, m Marks) func(q device.Source) device.Path {
	if peer.Port() == 0 {
		peer = netip.AddrPortFrom(peer.Addr(), rocewire.UDPPort)
	}
	return func(q device.Source) device.Path { return newPath(e, q, peer, [6]byte{}, m) }
}

// BindFrames is Bind for a RoCE v1 engine (and for it only): the peer is the uplink of GID
// gid on interface MAC mac; its frames are tagged as m says (Marks.VLAN,
// Marks.Priority) and their GRH carries m.TOS as its traffic class.
func (e *Engine) BindFrames(mac [6]byte, gid netip.Addr, m Marks) func(q device.Source) device.Path {
	peer := netip.AddrPortFrom(netip.AddrFrom16(gid.As16()), 0)
	return func(q device.Source) device.Path { return newPath(e, q, peer, mac, m) }
}

// maxDatagram is the largest packet the engine takes: a 4096-byte path
// MTU's with every header; readBuffer the largest read, a batch of them
// the kernel coalesced (UDP GRO), and one byte to tell a longer one.
const (
	maxDatagram = 4096 + 64
	readBuffer  = 1<<16 + 1
)

// read is the engine's receive loop. The datagrams of one read, and the
// packets of a coalesced batch, are served packet by packet, and what the
// responders answered goes out once they all are: one batch per
// responder (responder.flush), its ACKs coalesced.
func (e *Engine) read() {
	defer e.wg.Done()
	bufs := make([][]byte, maxReads)
	for k := range bufs {
		bufs[k] = make([]byte, readBuffer)
	}
	var reads [maxReads]Read
	var ids idDeltas
	var pkt rocewire.Packet
	var answered answering
	for {
		n, err := e.conn.Read(bufs, reads[:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			e.log.Warn("rdma uplink: read", "err", err)
			continue
		}
		for k := range n {
			e.datagram(bufs[k], reads[k], &ids, &pkt, &answered)
		}
		answered.flush()
	}
}

// datagram serves the packets of datagram r, read into buf.
func (e *Engine) datagram(buf []byte, r Read, ids *idDeltas, pkt *rocewire.Packet, answered *answering) {
	n, seg, src := r.N, r.Seg, r.Src
	if n >= len(buf) || src.Addr().Is4() != e.local.Addr().Is4() {
		e.ctr.RxPackets.Add(1)
		e.ctr.Malformed.Add(1)
		return
	}
	if seg <= 0 || seg > n {
		seg = n
	}
	if seg < n {
		e.ctr.RxBatches.Add(1)
	}
	for k, off := 0, 0; off < n; k, off = k+1, off+seg {
		b := buf[off:min(off+seg, n)]
		e.ctr.RxPackets.Add(1)
		e.ctr.RxBytes.Add(uint64(len(b)))
		answered.add(e.packet(b, src, uint16(k), ids, pkt))
	}
}

// packet checks packet k of a datagram from src, b, and hands it to its
// QP (dispatch); it returns the path whose batch holds what it answered
// (dispatch). A panic
// in it — a bug reached by a packet — costs that packet only: it is
// dropped, logged with its stack and counted (Counters.Panics,
// RDMAStatus.Panics), and the reader goes on. What the handler held it
// let go on its way out: the responder releases its target and the
// requester engine its lock in deferred calls.
func (e *Engine) packet(b []byte, src netip.AddrPort, k uint16, ids *idDeltas, pkt *rocewire.Packet) (p *path) {
	defer func() {
		if r := recover(); r != nil {
			p = nil
			e.panicked(src.String(), r)
		}
	}()
	if len(b) > maxDatagram {
		e.ctr.Malformed.Add(1)
		return nil
	}
	if !ids.verify(src, e.local, b, k) {
		e.ctr.BadICRC.Add(1)
		return nil
	}
	return e.dispatch(b, src, nil, pkt)
}

// panicked logs and counts a panic in serving a packet from from.
func (e *Engine) panicked(from string, r any) {
	e.ctr.Panics.Add(1)
	buf := make([]byte, 8192)
	buf = buf[:runtime.Stack(buf, false)]
	e.log.Error("rdma uplink: serving a packet panicked (a bug); the packet is dropped, the engine goes on",
		"from", from, "panic", r, "stack", string(buf))
}

// answering is the responders that answered requests of the datagrams
// (or frames) the reader is serving; owned by the reader.
type answering []*path

// add notes that p's responder answered (p may be nil: none did).
func (a *answering) add(p *path) {
	if p != nil && !p.rsp.answering {
		p.rsp.answering = true
		*a = append(*a, p)
	}
}

// flush sends every answer noted, once per responder.
func (a *answering) flush() {
	for _, p := range *a {
		p.rsp.answering = false
		p.rsp.flush()
	}
	clear(*a)
	*a = (*a)[:0]
}

// member reports whether addr is a vrdma host's uplink (Config.Members).
func (e *Engine) member(addr netip.Addr) bool {
	return e.cfg.Members == nil || e.cfg.Members(addr.Unmap())
}

// testHookPacket, if set, is called by dispatch with each packet's
// parsed headers before its QP is found. Only tests set it
// (export_test.go), to make the reader panic.
var testHookPacket func(pkt *rocewire.Packet)

// dispatch parses packet b from src (RoCE v1: the SGID, port 0, and the
// source MAC mac; nil for v2) and hands it to its QP, if that QP is
// connected through this engine to src; it returns the path whose
// responder served it, or whose requester asked for more of a READ (a
// continuation, reads.go), nil if none did: the reader flushes its batch.
func (e *Engine) dispatch(b []byte, src netip.AddrPort, mac *[6]byte, pkt *rocewire.Packet) *path {
	if err := rocewire.Parse(b, 0, pkt); err != nil {
		e.ctr.Malformed.Add(1)
		return nil
	}
	if testHookPacket != nil {
		testHookPacket(pkt)
	}
	if pkt.DETH != nil && pkt.BTH.DestQP() == rocewire.GSIQPN {
		e.gsiPacket(pkt, src.Addr()) // RDMA CM's MADs, from any peer (gsi.go)
		return nil
	}
	if pkt.DETH != nil {
		if !e.member(src.Addr()) {
			e.ctr.NotVRDMA.Add(1)
			return nil
		}
		e.udPacket(pkt, src.Addr()) // a UD packet (ud.go)
		return nil
	}
	srqn, xrc := pkt.StripXRC() // served as RC, by an XRC QP only (its ICRC is checked)
	q := e.dev.Target(pkt.BTH.DestQP())
	var p *path
	if q != nil {
		p, _ = q.BoundPath().(*path)
	}
	if p == nil || p.e != e || p.peer.Addr() != src.Addr() || mac != nil && *mac != p.mac || xrc != q.Type().IsXRC() {
		if !e.member(src.Addr()) {
			// Isolation: a peer that is not a vrdma VM gets no answer,
			// whatever QP it names (no adapter has native endpoints).
			e.ctr.NotVRDMA.Add(1)
			return nil
		}
		e.ctr.NoQP.Add(1)
		if q != nil && pkt.Info.Request {
			q.Counters().Dropped.Add(1) // a QP not connected over this path (RESET, INIT) drops what it gets
		}
		return nil
	}
	if !pkt.Info.Request {
		if !q.PortUp() {
			q.Counters().Dropped.Add(1) // its port is down: nothing reaches it
			return nil
		}
		if p.response(pkt) {
			return p // a READ's continuation is in its batch
		}
		return nil
	}
	p.rsp.serve(q, pkt, srqn) // device.Target.Admit checks the port
	return p
}
