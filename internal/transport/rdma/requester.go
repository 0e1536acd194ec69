package rdma

// The requester and completer of one QP (rocev2.md §4.4). The QP's
// send-queue goroutine takes WQEs into a window, gives each the PSNs it
// needs (a SEND or WRITE one per packet, a READ one per response packet,
// an atomic one), sends their packets straight from guest memory, and
// completes them in order. The engine's reader records responses under
// mu: an ACK completes every SEND and WRITE up to its PSN (coalescing);
// READ response data lands in the WQE's local buffers; an atomic ACK
// carries the original value; a NAK ends a WQE with its status, or asks
// for a go-back-N (PSN sequence error, or a response past a READ or
// atomic still waiting: an implicit NAK) or an RNR wait. The goroutine
// retransmits from the PSN asked for, or from the oldest unacknowledged
// one when the local ACK timeout passes, under the QP's retry budget.

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// window is how many WQEs a QP keeps in flight; maxOutstanding how many
// PSNs (packets sent, or READ response packets asked for) may wait for
// their acknowledgement at most (the engine's bound, outstandingFor,
// follows its socket's buffer): the bound that keeps a fast sender from
// overflowing a slow receiver's socket into a retransmission storm.
const (
	window         = 16
	maxOutstanding = 1024
	ackEvery       = 64 // AckReq at least every this many packets
	pollBudget     = 200 * time.Microsecond
)

// entry is one WQE in flight.
type entry struct {
	wqe   abi.SendWQE
	slot  []byte
	segs  [abi.MaxSGE][]byte
	nseg  int
	total uint64
	local abi.WCStatus // the local checks' verdict
	psn   uint32       // first PSN
	npsn  uint32       // PSNs it takes
	mtu   uint32       // its packets' payload, but the last's
	sent  uint32       // request packets sent since the last rewind; written under mu

	// Under path.mu: what the responses said.
	done   bool
	status abi.WCStatus
	got    uint32 // READ: response packets received in order
	old    uint64 // an atomic's original value
}

// reqPackets is how many request packets e sends: one per PSN for a SEND
// or a WRITE, one for a READ or an atomic.
func (e *entry) reqPackets() uint32 {
	if e.wqe.Opcode.IsRdAtomic() {
		return 1
	}
	return e.npsn
}

// path is the rdma path of one QP: its requester (this file) and its
// responder (responder.go).
type path struct {
	e    *Engine
	q    *device.QP
	peer netip.AddrPort // RoCE v1: the peer uplink's GID, port 0
	mac  [6]byte        // RoCE v1: the peer uplink's MAC
	m    Marks          // every packet's, both ways

	// Owned by the QP's send-queue goroutine.
	budget  device.RetryBudget
	next    uint32 // SQ index of the next WQE to take
	blocked bool   // the last send stopped at a limit (fence, max_rd_atomic, outstanding)
	hdr     [maxHeader]byte
	bufs    [][]byte
	out     *batch

	// Owned by the engine's reader.
	rxBufs [][]byte

	inflight atomic.Int32

	mu   sync.Mutex
	win  [window]entry // mu guards the ring indices; the QP goroutine reads the WQE fields it wrote without it
	head int           // +checklocks:mu
	n    int           // +checklocks:mu
	// the PSNs below are set (from the first WQE's)
	started bool // +checklocks:mu
	// the PSN after the last one sent
	sendPSN uint32 // +checklocks:mu
	// the PSN after the furthest one ever sent
	maxPSN uint32 // +checklocks:mu
	// the PSN after the last one acknowledged
	ackPSN uint32 // +checklocks:mu
	// seenPSN: the PSN after the furthest one a response acknowledged,
	// even past a READ or atomic still waiting for its own (which holds
	// ackPSN back).
	// +checklocks:mu
	seenPSN uint32
	// go back to rewPSN
	rewind bool   // +checklocks:mu
	rewPSN uint32 // +checklocks:mu
	// an RNR NAK asked to wait rnrTimer
	rnr  bool  // +checklocks:mu
	rnrT uint8 // +checklocks:mu
	// a response came since the goroutine last looked
	heard bool // +checklocks:mu
	// retrying: a go-back-N for a NAK, an implicit NAK or the timeout
	// was taken and nothing progressed since; until something does, only
	// the timeout starts another (rxe's started_retry): the responses to
	// what went before it, and to its own duplicates, ask for nothing
	// new and spend no retry, and a go-back-N that never progresses ends
	// after retry_cnt timeouts.
	// +checklocks:mu
	retrying bool
	// progress: ackPSN or seenPSN moved since the goroutine last looked;
	// a retry episode ends with progress, as rxe's retry count is
	// reloaded by an acknowledgement (a 1 MiB READ that loses a packet in
	// every attempt still gets there; so does a WRITE that loses several
	// behind an atomic whose response was lost). Duplicate ACKs, which
	// acknowledge nothing new, are none.
	// +checklocks:mu
	progress bool

	rsp responder
}

func newPath(e *Engine, q *device.QP, peer netip.AddrPort, mac [6]byte, m Marks) *path {
	p := &path{e: e, q: q, peer: peer, mac: mac, m: m, bufs: make([][]byte, 0, abi.MaxSGE), rxBufs: make([][]byte, 0, abi.MaxSGE),
		out: newBatch(e, peer, mac, m)}
	for i := range p.win {
		p.win[i].slot = make([]byte, q.SlotSize())
	}
	p.next = q.SQHead()
	p.rsp.p, p.rsp.out = p, newBatch(e, peer, mac, m)
	return p
}

// Kind, Pump, Busy, Drop, Flush, PollBudget and Status make p a
// device.Path that reports what it has in flight.

var _ device.PathStatuser = (*path)(nil)

func (p *path) Kind() abi.PathKind        { return abi.PathRDMA }
func (p *path) PollBudget() time.Duration { return pollBudget }
func (p *path) Status(st *mgmt.QPStatus)  { st.InFlight = int(p.inflight.Load()) }

func (p *path) Busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n > 0
}

// Drop forgets the window (RESET).
func (p *path) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.n > 0 {
		e := &p.win[p.head]
		clear(e.segs[:e.nseg])
		p.head = (p.head + 1) % window
		p.n--
	}
	p.inflight.Store(0)
	p.started, p.retrying = false, false
	p.next = p.q.SQHead()
}

// Flush completes the window with WR_FLUSH_ERR (ERR).
func (p *path) Flush() {
	for {
		p.mu.Lock()
		if p.n == 0 {
			p.mu.Unlock()
			p.next = p.q.SQHead()
			return
		}
		p.mu.Unlock()
		p.complete(abi.WCWRFlushErr, 0)
	}
}

// at returns the window's i-th entry.
//
// +checklocks:p.mu
func (p *path) at(i int) *entry { return &p.win[(p.head+i)%window] }

// Pump runs the send queue while the QP is in RTS or SQD.
func (p *path) Pump() {
	q := p.q
	for q.Sending() {
		s := q.State()
		if s != abi.QPSRTS && s != abi.QPSSQD {
			return
		}
		p.reap()
		if s = q.State(); s != abi.QPSRTS && s != abi.QPSSQD {
			return
		}
		if !p.retry() {
			continue
		}
		if !p.fill(s == abi.QPSRTS) {
			return // an invalid tail: the device deals with it
		}
		p.mu.Lock()
		n := p.n
		p.mu.Unlock()
		if n == 0 {
			return
		}
		p.wait()
	}
}

// reap completes the WQEs at the window's head that are done, in order.
func (p *path) reap() {
	for {
		p.mu.Lock()
		if p.n == 0 {
			p.mu.Unlock()
			return
		}
		e := p.at(0)
		if e.local != abi.WCSuccess {
			p.mu.Unlock()
			p.complete(e.local, 0)
			continue
		}
		if !e.done {
			p.mu.Unlock()
			return
		}
		st, old := e.status, e.old
		p.mu.Unlock()
		n := uint32(e.total)
		if st == abi.WCSuccess {
			if e.wqe.Opcode.IsAtomic() {
				binary.LittleEndian.PutUint64(e.segs[0], old)
				n = 8
			}
			p.q.NoteSent(e.total)
			p.budget.Reset()
		}
		p.complete(st, n)
	}
}

// complete takes the head entry out of the window and completes its WQE.
func (p *path) complete(st abi.WCStatus, n uint32) {
	p.mu.Lock()
	e := p.at(0)
	p.head = (p.head + 1) % window
	p.n--
	p.inflight.Store(int32(p.n))
	p.mu.Unlock()
	clear(e.segs[:e.nseg])
	p.q.CompleteHead(&e.wqe, st, n)
}

// fill takes new WQEs into the window (in RTS) and sends what may go.
func (p *path) fill(takeNew bool) bool {
	q := p.q
	pending, ok := q.SQPending()
	if !ok {
		return false
	}
	at := q.RCAttrs()
	mtu := uint64(at.PathMTU)
	if !rocewire.ValidMTU(int(mtu)) {
		mtu = 1024
	}
	p.mu.Lock()
	for takeNew && p.n < window && uint32(p.n) < pending {
		if p.n > 0 && p.at(p.n-1).local != abi.WCSuccess {
			break // nothing after a WR that failed locally: the QP goes to ERR there
		}
		e := p.at(p.n)
		e.local = q.ReadWQE(p.next, e.slot, &e.wqe)
		p.next = q.SQNext(p.next)
		e.nseg, e.total, e.sent, e.done, e.status, e.got, e.old = 0, 0, 0, false, 0, 0, 0
		if e.local == abi.WCSuccess {
			e.local, e.nseg, e.total = q.GatherLocal(&e.wqe, e.slot, &e.segs)
		}
		if e.local == abi.WCSuccess {
			e.npsn = 1
			if op := e.wqe.Opcode; !op.IsAtomic() && e.total > mtu {
				e.npsn = uint32((e.total + mtu - 1) / mtu)
			}
			e.psn, e.mtu = q.TakePSNs(e.npsn), uint32(mtu)
			if !p.started {
				p.started, p.sendPSN, p.maxPSN, p.ackPSN, p.seenPSN = true, e.psn, e.psn, e.psn, e.psn
			}
		}
		p.n++
		p.inflight.Store(int32(p.n))
	}
	p.mu.Unlock()
	p.send(&at, uint32(mtu))
	return true
}

// send sends the window's packets not sent yet, within the fence, the
// max_rd_atomic limit and the outstanding bound, in batches.
func (p *path) send(at *device.RCAttrs, mtu uint32) {
	p.queue(at, mtu)
	if err := p.out.flush(); err != nil {
		p.e.log.Debug("rdma path: send", "qpn", p.q.QPN(), "err", err)
		p.blocked = true // the timeout retransmits
	}
}

// queue puts the packets send sends into the path's batch.
func (p *path) queue(at *device.RCAttrs, mtu uint32) {
	depth := max(int(at.MaxRdAtomic), 1) // 0 allows one, as mlx5 and rxe
	p.blocked = false
	p.mu.Lock()
	n := p.n
	p.mu.Unlock()
	rd := 0
	for i := 0; i < n; i++ {
		p.mu.Lock()
		e := p.at(i)
		done, sent, got := e.done, e.sent, e.got
		p.mu.Unlock()
		if e.local != abi.WCSuccess {
			return
		}
		w := &e.wqe
		if done {
			if w.Opcode.IsRdAtomic() {
				// Done but not completed (an older WQE still waits): it
				// keeps its max_rd_atomic credit until it completes, in
				// order, as rxe returns it. Then no READ or atomic still
				// waiting ever has more than max_rd_atomic-1 executed after
				// it, and the responder (max_dest_rd_atomic ≥ max_rd_atomic
				// resources) still holds its result when it is retried.
				rd++
			}
			continue
		}
		if w.Flags&abi.SendFence != 0 && rd > 0 && sent == 0 {
			p.blocked = true
			return // a fenced WR waits for every earlier READ and atomic
		}
		if w.Opcode.IsRdAtomic() {
			if rd >= depth && sent == 0 {
				p.blocked = true
				return // max_rd_atomic outstanding
			}
			rd++
			p.q.Counters().NotePeak(uint32(rd))
		}
		for sent < e.reqPackets() {
			p.mu.Lock()
			full := rc.PSNDiff(p.sendPSN, p.ackPSN) >= p.e.outstanding
			p.mu.Unlock()
			if full {
				p.blocked = true
				return // wait for acknowledgements
			}
			// The packet counts as sent before it goes: its response may
			// come back before sendmsg returns.
			i := sent
			sent++
			end := (e.psn + sent) & rc.PSNMask
			if w.Opcode == abi.OpRDMARead {
				end = (e.psn + e.npsn) & rc.PSNMask
			}
			p.mu.Lock()
			again := rc.PSNDiff(end, p.maxPSN) <= 0
			e.sent = sent
			if rc.PSNDiff(end, p.sendPSN) > 0 {
				p.sendPSN = end
			}
			if !again {
				p.maxPSN = end
			}
			p.mu.Unlock()
			if again {
				p.e.ctr.Retransmits.Add(1)
			}
			if err := p.sendPacket(at.RemoteQPN, e, i, got, mtu); err != nil {
				p.e.log.Debug("rdma path: send", "qpn", p.q.QPN(), "err", err)
				p.blocked = true
				return // the timeout retransmits
			}
		}
	}
}

// sendPacket queues request packet i of e; a READ of which got response
// packets arrived asks for the rest.
func (p *path) sendPacket(dqpn uint32, e *entry, i, got, mtu uint32) error {
	if !p.q.Adapter().Connected() {
		return nil // the port is down: the packet is lost, and the timeout retransmits
	}
	w := &e.wqe
	psn := (e.psn + i) & rc.PSNMask
	f := rocewire.BTHFields{PKey: rocewire.DefaultPKey, DestQP: dqpn, PSN: psn}
	h := p.hdr[:rocewire.BTHLen]
	first, last := i == 0, i == e.npsn-1
	var off, n uint64
	switch w.Opcode {
	case abi.OpRDMARead:
		f.Opcode, f.AckReq = rocewire.RDMAReadRequest, true
		skip := uint64(got) * uint64(e.mtu)
		psn = (e.psn + got) & rc.PSNMask
		f.PSN = psn
		h = p.hdr[:rocewire.BTHLen+rocewire.RETHLen]
		rocewire.RETH(h[rocewire.BTHLen:]).Encode(w.RemoteAddr+skip, w.RKey, uint32(e.total-skip))
	case abi.OpAtomicCmpAndSwp, abi.OpAtomicFetchAdd:
		f.Opcode, f.AckReq = rocewire.CompareSwap, true
		swap, cmp := w.Swap, w.CompareAdd
		if w.Opcode == abi.OpAtomicFetchAdd {
			f.Opcode, swap, cmp = rocewire.FetchAdd, w.CompareAdd, 0
		}
		h = p.hdr[:rocewire.BTHLen+rocewire.AtomicETHLen]
		rocewire.AtomicETH(h[rocewire.BTHLen:]).Encode(w.RemoteAddr, w.RKey, swap, cmp)
	default:
		off = uint64(i) * uint64(mtu)
		n = min(uint64(mtu), e.total-off)
		imm := w.Opcode == abi.OpSendWithImm || w.Opcode == abi.OpRDMAWriteWithImm
		write := w.Opcode == abi.OpRDMAWrite || w.Opcode == abi.OpRDMAWriteWithImm
		f.Opcode = opcodeOf(write, imm, first, last)
		f.AckReq = last || i%ackEvery == ackEvery-1
		f.Solicited = last && w.Flags&abi.SendSolicited != 0 && (!write || imm)
		x := rocewire.BTHLen
		if write && first {
			rocewire.RETH(p.hdr[x:]).Encode(w.RemoteAddr, w.RKey, uint32(e.total))
			x += rocewire.RETHLen
		}
		if imm && last {
			rocewire.ImmDt(p.hdr[x:]).Encode(w.Imm)
			x += rocewire.ImmDtLen
		}
		h = p.hdr[:x]
	}
	f.PadCount = rocewire.PadCount(int(n))
	rocewire.BTH(h).Encode(&f)
	return p.out.add(h, pieces(p.bufs[:0], e.segs[:e.nseg], off, n), int(n))
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

// retry acts on what the responses asked for: a go-back-N now, or after
// an RNR wait, spending the retry budget. false when the goroutine should
// look at the queue again first (it slept, or completed a WQE).
func (p *path) retry() bool {
	p.mu.Lock()
	rewind, psn, rnr, t, progress := p.rewind, p.rewPSN, p.rnr, p.rnrT, p.progress
	p.rewind, p.rnr = false, false
	if rewind || rnr {
		p.progress = false
	}
	p.mu.Unlock()
	if !rewind && !rnr {
		return true
	}
	q := p.q
	at := q.RCAttrs()
	if progress {
		p.budget.Reset()
	}
	p.budget.Arm(&at)
	if rnr {
		if st, ok := p.budget.RNRNak(q.Counters()); !ok {
			p.failOldest(st)
			return false
		}
		// Go back before the wait: a PSN sequence error NAK of the
		// requests after the refused one, which comes meanwhile, then
		// finds it taken (above, in response).
		p.rewindTo(psn)
		q.Sleep(rc.RNRDelay(t))
		return false
	}
	if st, ok := p.budget.Transport(q.Counters()); !ok {
		// A go-back-N spends a transport retry (IBTA: a PSN sequence
		// error NAK or an implicit NAK decrements retry_cnt, as the
		// timeout does): responses that keep asking for one without
		// progress (duplicate ACKs past an atomic whose response never
		// comes) end in RETRY_EXC_ERR, not a livelock.
		p.failOldest(st)
		return false
	}
	p.mu.Lock()
	p.retrying = true
	p.mu.Unlock()
	p.rewindTo(psn)
	return false
}

// failOldest completes the oldest WQE not done with st (a retry budget
// spent), after the done ones before it.
func (p *path) failOldest(st abi.WCStatus) {
	p.mu.Lock()
	for i := 0; i < p.n; i++ {
		if e := p.at(i); !e.done {
			e.done, e.status = true, st
			break
		}
	}
	p.mu.Unlock()
	p.reap()
}

// rewindTo makes every unfinished packet from PSN psn on go out again: a
// SEND or WRITE from that packet, a READ from its first response packet
// not received (the responder executes it again from memory), an atomic
// whole (the responder replays its result).
func (p *path) rewindTo(psn uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < p.n; i++ {
		e := p.at(i)
		if e.done || e.local != abi.WCSuccess {
			continue
		}
		switch d := rc.PSNDiff(psn, e.psn); {
		case e.wqe.Opcode.IsRdAtomic():
			if rc.PSNDiff(psn, e.psn+e.npsn-1) <= 0 {
				e.sent = 0
			}
		case d <= 0:
			e.sent = 0
		case d < int32(e.npsn):
			e.sent = min(e.sent, uint32(d))
		}
	}
	p.sendPSN = psn
}

// wait sleeps until a response comes or the local ACK timeout passes; on
// the timeout it asks for a retransmission from the oldest PSN not
// acknowledged, or fails the oldest WQE when the retry budget is spent.
func (p *path) wait() {
	q := p.q
	at := q.RCAttrs()
	d := rc.LocalACKTimeout(at.Timeout)
	p.mu.Lock()
	if p.heard || p.rewind || p.rnr || p.n > 0 && p.at(0).done {
		p.heard = false
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	if !p.blocked && q.State() == abi.QPSRTS && q.PostedBeyond(p.next) {
		p.mu.Lock()
		full := p.n >= window
		p.mu.Unlock()
		if !full {
			return // more to take
		}
	}
	if p.poll() {
		return
	}
	t := q.Timer()
	t.Reset(d)
	select {
	case <-q.WakeCh():
		t.Stop()
		return
	case <-t.C():
	}
	p.mu.Lock()
	if p.heard || p.n == 0 {
		p.heard = false
		p.mu.Unlock()
		return
	}
	psn, progress := p.ackPSN, p.progress
	p.progress = false
	if e := p.at(0); !e.done {
		psn = e.psn
		if !e.wqe.Opcode.IsRdAtomic() && rc.PSNDiff(p.ackPSN, e.psn) > 0 && rc.PSNDiff(p.ackPSN, e.psn+e.npsn) < 0 {
			psn = p.ackPSN
		}
	}
	p.mu.Unlock()
	if progress {
		p.budget.Reset()
	}
	p.budget.Arm(&at)
	if st, ok := p.budget.Transport(q.Counters()); !ok {
		p.failOldest(st)
		return
	}
	p.mu.Lock()
	p.retrying = true
	p.mu.Unlock()
	p.rewindTo(psn)
}

// poll waits for a response or a new post for up to pollBudget without
// sleeping, while a polling slot is free (device.TrySpin): one that comes
// within it costs no sleep and wake-up of this goroutine's thread. It
// reports whether one came.
func (p *path) poll() bool {
	if !device.TrySpin() {
		return false
	}
	defer device.EndSpin()
	q := p.q
	deadline := time.Now().Add(pollBudget)
	for {
		select {
		case <-q.WakeCh():
			return true
		default:
		}
		if !q.Sending() || !p.blocked && q.State() == abi.QPSRTS && q.PostedBeyond(p.next) && p.inflight.Load() < window {
			return true
		}
		device.YieldCPU() // at every turn: the threads this one waits for share the CPUs
		if time.Now().After(deadline) {
			return false
		}
	}
}

// response records a response packet for this QP's requester; the
// engine's reader calls it.
func (p *path) response(pkt *rocewire.Packet) {
	psn := pkt.BTH.PSN()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.heard = true
	defer p.wake()
	op := pkt.BTH.Opcode()
	if op == rocewire.Acknowledge {
		s := pkt.AETH.Syndrome()
		switch s.Kind() {
		case rocewire.KindACK:
			p.ackThrough(psn)
		case rocewire.KindRNR:
			p.ackThrough((psn - 1) & rc.PSNMask)
			p.goBack(psn) // from the refused packet on
			p.rnr, p.rnrT = true, s.Value()
		case rocewire.KindNAK:
			p.ackThrough((psn - 1) & rc.PSNMask)
			if s.Value() == rocewire.NAKPSNSeqErr {
				p.e.ctr.SeqErrNaks.Add(1)
				if p.retrying || rc.PSNDiff(psn, p.sendPSN) >= 0 {
					// A go-back-N is under way, or psn was not sent
					// again since the last one (or the RNR wait), which
					// covers it: the NAK asks for nothing new.
					return
				}
				// Back to psn, or to an earlier PSN a go-back-N not
				// taken yet asks for (a READ or atomic whose response
				// the NAK's implicit ACK shows lost).
				p.goBack(psn)
				p.rewind = true
				return
			}
			if e := p.entryAt(psn); e != nil && !e.done {
				e.done, e.status = true, wireNAK(s.Value()).Status()
			}
		}
		return
	}
	e := p.entryAt(psn)
	if e == nil || e.done {
		return // a duplicate, or a response to what is no longer in flight
	}
	switch op {
	case rocewire.AtomicAcknowledge:
		if !e.wqe.Opcode.IsAtomic() {
			return
		}
		p.ackThrough((psn - 1) & rc.PSNMask)
		e.done, e.status, e.old = true, abi.WCSuccess, pkt.AtomicAckETH.Orig()
		p.advanceAck((psn + 1) & rc.PSNMask)
	case rocewire.RDMAReadResponseFirst, rocewire.RDMAReadResponseMiddle, rocewire.RDMAReadResponseLast, rocewire.RDMAReadResponseOnly:
		if e.wqe.Opcode != abi.OpRDMARead || rc.PSNDiff(psn, e.psn) != int32(e.got) {
			return // out of order: the timeout or the next read retry sets it right
		}
		pos := pkt.Info.Position
		if e.got == 0 {
			p.ackThrough((psn - 1) & rc.PSNMask)
		}
		lastPkt := e.got == e.npsn-1
		if (e.got == 0) != (pos == rocewire.PosFirst || pos == rocewire.PosOnly) || lastPkt != (pos == rocewire.PosLast || pos == rocewire.PosOnly) {
			return
		}
		off := uint64(e.got) * uint64(e.mtu)
		if off+uint64(len(pkt.Payload)) > e.total || !lastPkt && len(pkt.Payload) == 0 {
			return
		}
		if len(pkt.Payload) > 0 {
			if !p.q.HoldMemory() {
				return
			}
			rest := pkt.Payload
			for _, s := range pieces(p.rxBufs[:0], e.segs[:e.nseg], off, uint64(len(rest))) {
				rest = rest[copy(s, rest):]
			}
			p.q.Release()
		}
		e.got++
		p.advanceAck((psn + 1) & rc.PSNMask)
		if lastPkt {
			if off+uint64(len(pkt.Payload)) != e.total {
				e.done, e.status = true, abi.WCBadRespErr
				return
			}
			e.done, e.status = true, abi.WCSuccess
		}
	}
}

// ackThrough records an acknowledgement of every PSN up to psn: SENDs and
// WRITEs that end there are done; a READ or atomic still waiting before
// it lost its response (an implicit NAK: go back to it).
//
// +checklocks:p.mu
func (p *path) ackThrough(psn uint32) {
	if next := (psn + 1) & rc.PSNMask; rc.PSNDiff(next, p.seenPSN) > 0 && rc.PSNDiff(next, p.maxPSN) <= 0 {
		p.seenPSN, p.progress, p.retrying = next, true, false
	}
	for i := 0; i < p.n; i++ {
		e := p.at(i)
		if e.local != abi.WCSuccess {
			return
		}
		last := (e.psn + e.npsn - 1) & rc.PSNMask
		if rc.PSNDiff(psn, last) < 0 {
			break
		}
		if e.done {
			continue
		}
		if e.wqe.Opcode.IsRdAtomic() {
			// Not while a go-back-N is under way, nor when psn was not
			// sent again since the last one: a response to what went
			// before it, which asks for nothing new.
			if !p.retrying && rc.PSNDiff(psn, p.sendPSN) < 0 {
				p.goBack(e.psn)
				p.rewind = true
			}
			return
		}
		if e.sent < e.reqPackets() {
			return // acknowledged beyond what was sent: a stale ACK from before a rewind
		}
		e.done, e.status = true, abi.WCSuccess
	}
	p.advanceAck((psn + 1) & rc.PSNMask)
}

// goBack asks the goroutine for a go-back-N to psn, or keeps the earlier
// PSN one it has not taken yet asks for.
//
// +checklocks:p.mu
func (p *path) goBack(psn uint32) {
	if !p.rewind && !p.rnr || rc.PSNDiff(psn, p.rewPSN) < 0 {
		p.rewPSN = psn
	}
}

// advanceAck moves ackPSN to psn if that is further.
//
// +checklocks:p.mu
func (p *path) advanceAck(psn uint32) {
	if rc.PSNDiff(psn, p.ackPSN) > 0 && rc.PSNDiff(psn, p.maxPSN) <= 0 {
		p.ackPSN, p.progress, p.retrying = psn, true, false
		if rc.PSNDiff(psn, p.seenPSN) > 0 {
			p.seenPSN = psn
		}
	}
}

// entryAt returns the entry whose PSNs include psn.
//
// +checklocks:p.mu
func (p *path) entryAt(psn uint32) *entry {
	for i := 0; i < p.n; i++ {
		e := p.at(i)
		if e.local != abi.WCSuccess {
			return nil
		}
		if d := rc.PSNDiff(psn, e.psn); d >= 0 && d < int32(e.npsn) {
			return e
		}
	}
	return nil
}

// wake signals the QP's goroutine, without blocking.
func (p *path) wake() {
	select {
	case p.q.WakeCh() <- struct{}{}:
	default:
	}
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
