// SPDX-License-Identifier: Apache-2.0

package requester

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
)

// fakeSQ is a send queue of WQEs posted by the test; the test's goroutine
// is its QP goroutine.
type fakeSQ struct {
	t      *testing.T
	wqes   []abi.SendWQE
	local  [][]byte // each WQE's one local buffer
	head   uint32
	npsn   uint32
	attrs  device.RCAttrs
	state  abi.QPState
	done   []completion
	sleeps []time.Duration
	ctr    device.Counters
	timer  clock.Timer
	wake   chan struct{}
	// totals, if set, gives a WQE's message length instead of its
	// buffer's (a message of gigabytes, whose packets a test never sends)
	totals map[uint64]uint64
	// locals: for each local WR executed (ExecLocal), its WRID and how
	// many WRs had completed then
	locals [][2]uint64
}

type completion struct {
	wrid uint64
	st   abi.WCStatus
	n    uint32
}

func newFakeSQ(t *testing.T) *fakeSQ {
	tm := clock.Real.NewTimer(time.Hour)
	tm.Stop()
	return &fakeSQ{t: t, npsn: 100, state: abi.QPSRTS, timer: tm, wake: make(chan struct{}, 1),
		attrs: device.RCAttrs{Timeout: 8, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4, PathMTU: 256, MaxDestRdAtomic: 4}}
}

// post adds a WQE with a local buffer of n bytes (its WRID: its index).
func (s *fakeSQ) post(w abi.SendWQE, n int) {
	w.WRID = uint64(len(s.wqes))
	w.Flags |= abi.SendSignaled
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	s.wqes, s.local = append(s.wqes, w), append(s.local, b)
}

func (s *fakeSQ) Sending() bool                { return true }
func (s *fakeSQ) State() abi.QPState           { return s.state }
func (s *fakeSQ) SlotSize() uint32             { return 64 }
func (s *fakeSQ) SQHead() uint32               { return s.head }
func (s *fakeSQ) SQNext(idx uint32) uint32     { return idx + 1 }
func (s *fakeSQ) SQPending() (uint32, bool)    { return uint32(len(s.wqes)) - s.head, true }
func (s *fakeSQ) PostedBeyond(idx uint32) bool { return uint32(len(s.wqes)) != idx }
func (s *fakeSQ) ReadWQE(idx uint32, _ []byte, w *abi.SendWQE) abi.WCStatus {
	*w = s.wqes[idx]
	return abi.WCSuccess
}
func (s *fakeSQ) GatherLocal(w *abi.SendWQE, _ []byte, segs *[abi.MaxSGE][]byte) device.Local {
	segs[0] = s.local[w.WRID]
	if n, ok := s.totals[w.WRID]; ok {
		return device.Local{Status: abi.WCSuccess, NSeg: 1, Total: n}
	}
	return device.Local{Status: abi.WCSuccess, NSeg: 1, Total: uint64(len(s.local[w.WRID]))}
}
func (s *fakeSQ) ExecLocal(w *abi.SendWQE) abi.WCStatus {
	s.locals = append(s.locals, [2]uint64{w.WRID, uint64(len(s.done))})
	return abi.WCSuccess
}
func (s *fakeSQ) TakePSNs(n uint32) uint32 {
	p := s.npsn
	s.npsn = (p + n) & rc.PSNMask
	return p
}
func (s *fakeSQ) RCAttrs() device.RCAttrs { return s.attrs }
func (s *fakeSQ) CompleteHead(w *abi.SendWQE, st abi.WCStatus, n uint32) {
	if w.WRID != uint64(s.head) {
		s.t.Errorf("completed WR %d at head %d: out of order", w.WRID, s.head)
	}
	if st != abi.WCSuccess && st != abi.WCWRFlushErr {
		s.state = abi.QPSErr
	}
	s.head++
	s.done = append(s.done, completion{w.WRID, st, n})
}
func (s *fakeSQ) NoteSent(uint64) {}
func (s *fakeSQ) Sleep(d time.Duration) bool {
	s.sleeps = append(s.sleeps, d)
	return true
}
func (s *fakeSQ) Clock() clock.Clock         { return clock.Real }
func (s *fakeSQ) Timer() clock.Timer         { return s.timer }
func (s *fakeSQ) WakeCh() chan struct{}      { return s.wake }
func (s *fakeSQ) Counters() *device.Counters { return &s.ctr }
func (s *fakeSQ) HoldMemory() bool           { return true }
func (s *fakeSQ) Release()                   {}
func (s *fakeSQ) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

var _ device.SendQueue = (*fakeSQ)(nil)

// pkt is a request packet on the fake wire.
type pkt struct {
	psn         uint32
	op          abi.Opcode
	i, n        uint32 // packet i of a SEND or WRITE of n; a READ asks from response i of n
	first, last bool
	va          uint64
	add         uint64
	len         uint64
	mtu         uint32
	fenced      bool
}

// resp is a response on the fake wire.
type resp struct {
	kind        int // ack, nak, atomic, read
	psn         uint32
	nak         rc.NAK
	old         uint64
	first, last bool
	credited    bool // a READ response paced by the requester's credit
	data        []byte
	hold        int // Collects it waits for
}

const (
	rAck = iota
	rNak
	rAtomic
	rRead
)

// fakeWire is a wire whose responder (rc.Seq over a remote memory) runs
// in Collect, on the QP goroutine, with the test's loss, reordering and
// RNR policies.
type fakeWire struct {
	sq       *fakeSQ
	r        *Engine
	queued   []pkt
	inflight []pkt
	resps    []resp
	seq      rc.Seq
	mem      [4096]byte
	nreq     int // request packets that reached the wire
	nresp    int
	nakSent  bool
	atomics  int // atomics executed

	dropReq  func(n int, p pkt) bool
	dropResp func(n int, r resp) bool
	reorder  bool // swap each pair of request packets
	rnr      int  // the first SEND packets answered RNR
	holdRead int  // Collects a READ's response waits
	onSend   func(p pkt)
	timeouts int
	afterRNR bool  // an RNR NAK was answered: the next batch is recorded
	probes   []int // the size of each batch sent after an RNR NAK
	// credit, if set, paces READ responses: each READ request gets this
	// many response packets from the one it asks from, marked credited.
	credit uint32
	more   []ReadMore // the continuations the engine asked for
	// mangle, if set, may change each response before it is delivered.
	mangle func(r *resp)
}

func newFakeWire(sq *fakeSQ) *fakeWire {
	w := &fakeWire{sq: sq}
	w.seq.Start(sq.npsn, sq.attrs.MaxDestRdAtomic)
	for i := range w.mem {
		w.mem[i] = byte(i * 13)
	}
	return w
}

func (w *fakeWire) Send(e *Entry, i, got uint32, at *device.RCAttrs) error {
	p := pkt{op: e.WQE.Opcode, i: i, n: e.NPSN, va: e.WQE.RemoteAddr, add: e.WQE.CompareAdd, len: e.Total, mtu: e.MTU,
		fenced: e.WQE.Flags&abi.SendFence != 0}
	switch {
	case p.op == abi.OpRDMARead:
		p.psn, p.i = (e.PSN+got)&rc.PSNMask, got
	case p.op.IsAtomic():
		p.psn = e.PSN
	default:
		p.psn, p.first, p.last = (e.PSN+i)&rc.PSNMask, i == 0, i == e.NPSN-1
	}
	if w.onSend != nil {
		w.onSend(p)
	}
	w.queued = append(w.queued, p)
	return nil
}

func (w *fakeWire) Flush() Outcome {
	if w.afterRNR && len(w.queued) > 0 {
		w.afterRNR, w.probes = false, append(w.probes, len(w.queued))
	}
	w.inflight = append(w.inflight, w.queued...)
	w.queued = w.queued[:0]
	w.sq.poke() // as a reader would, when the responses come
	return Sent
}

func (w *fakeWire) Recall(*Entry) {}

func (w *fakeWire) Timeout(*Entry) Verdict {
	w.timeouts++
	return GoBack
}

// Collect runs the responder over the packets in flight, then delivers
// the responses due.
func (w *fakeWire) Collect() {
	in := w.inflight
	w.inflight = nil
	if w.reorder {
		for i := 0; i+1 < len(in); i += 2 {
			in[i], in[i+1] = in[i+1], in[i]
		}
	}
	for _, p := range in {
		w.nreq++
		if w.dropReq != nil && w.dropReq(w.nreq, p) {
			continue
		}
		w.serve(p)
	}
	var keep []resp
	for _, r := range w.resps {
		if w.mangle != nil {
			w.mangle(&r)
		}
		if r.hold > 0 {
			r.hold--
			keep = append(keep, r)
			continue
		}
		w.nresp++
		if w.dropResp != nil && w.dropResp(w.nresp, r) {
			continue
		}
		switch r.kind {
		case rAck:
			w.r.Ack(r.psn)
		case rNak:
			w.r.Nak(r.psn, r.nak, 1)
		case rAtomic:
			w.r.AtomicAck(r.psn, r.old)
		case rRead:
			if more, ask := w.r.ReadResponse(r.psn, r.first, r.last, r.credited, r.data); ask {
				// A continuation: the wire sends it at once, as the
				// rdma engine's reader does.
				w.more = append(w.more, more)
				w.inflight = append(w.inflight, pkt{op: abi.OpRDMARead, psn: more.PSN, va: more.RemoteAddr, len: uint64(more.Len), mtu: w.sq.attrs.PathMTU})
			}
		}
	}
	w.resps = keep
	if len(keep) > 0 {
		w.sq.poke()
	}
}

func (w *fakeWire) respond(r resp) { w.resps = append(w.resps, r) }

// readResp answers a READ of p.len bytes at va from its response packet k
// on; its first PSN is first.
func (w *fakeWire) readResp(first uint32, va, length uint64, mtu uint32, n, k uint32) {
	if mtu == 0 {
		mtu = uint32(length) // one PSN per WR: one response
	}
	end := n
	if w.credit > 0 {
		end = min(n, k+w.credit)
	}
	for ; k < end; k++ {
		off := uint64(k) * uint64(mtu)
		end := min(off+uint64(mtu), length)
		w.respond(resp{kind: rRead, psn: (first + k) & rc.PSNMask, first: k == 0, last: k == n-1, credited: w.credit > 0,
			data: append([]byte(nil), w.mem[va+off:va+end]...), hold: w.holdRead})
	}
}

func (w *fakeWire) serve(p pkt) {
	switch w.seq.Check(p.psn) {
	case rc.New:
		w.nakSent = false
		switch {
		case p.op == abi.OpRDMARead:
			w.seq.Executed(rc.Resource{VA: p.va, Len: p.len, N: p.n})
			w.readResp(p.psn, p.va, p.len, p.mtu, p.n, 0)
		case p.op.IsAtomic():
			old := binary.LittleEndian.Uint64(w.mem[p.va:])
			binary.LittleEndian.PutUint64(w.mem[p.va:], old+p.add)
			w.atomics++
			w.seq.Executed(rc.Resource{Atomic: true, Value: old, N: 1})
			w.respond(resp{kind: rAtomic, psn: p.psn, old: old})
		default:
			if w.rnr > 0 && p.op == abi.OpSend && p.first {
				w.rnr--
				w.afterRNR = true
				w.respond(resp{kind: rNak, psn: p.psn, nak: rc.NAKRNR})
				return
			}
			w.seq.Done(rc.NAKNone)
			if p.last {
				w.respond(resp{kind: rAck, psn: p.psn})
			}
		}
	case rc.Duplicate:
		switch {
		case p.op == abi.OpRDMARead:
			if r, ok := w.seq.Read(p.psn); ok {
				w.readResp(r.PSN, r.VA, r.Len, p.mtu, r.N, uint32(rc.PSNDiff(p.psn, r.PSN)))
			}
		case p.op.IsAtomic():
			if v, ok := w.seq.Atomic(p.psn); ok {
				w.respond(resp{kind: rAtomic, psn: p.psn, old: v})
			} else {
				w.respond(resp{kind: rNak, psn: p.psn, nak: rc.NAKUnheld})
			}
		default:
			w.respond(resp{kind: rAck, psn: (w.seq.Expected() - 1) & rc.PSNMask})
		}
	case rc.Ahead:
		if !w.nakSent {
			w.nakSent = true
			w.respond(resp{kind: rNak, psn: w.seq.Expected(), nak: rc.NAKSeqErr})
		}
	}
}

// setup makes an engine over a fake queue and wire.
func setup(t *testing.T, cfg Config) (*fakeSQ, *fakeWire, *Engine) {
	sq := newFakeSQ(t)
	w := newFakeWire(sq)
	if cfg.MTU == nil {
		cfg.MTU = func(at *device.RCAttrs) uint32 { return at.PathMTU }
	}
	w.r = New(sq, w, cfg)
	return sq, w, w.r
}

// run pumps until every posted WR completed, or the QP left RTS.
func run(t *testing.T, sq *fakeSQ, r *Engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for int(sq.head) < len(sq.wqes) && sq.state == abi.QPSRTS {
		if time.Now().After(deadline) {
			t.Fatalf("stuck: %d of %d WRs completed", sq.head, len(sq.wqes))
		}
		r.Pump()
	}
	if sq.state != abi.QPSRTS {
		r.Flush()
	}
}

// mix posts WRITEs of several packets, SENDs, READs and atomics.
func mix(sq *fakeSQ, n int) {
	for i := range n {
		switch i % 5 {
		case 0, 1:
			sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite, RemoteAddr: 0}, 1000)
		case 2:
			sq.post(abi.SendWQE{Opcode: abi.OpSend}, 300)
		case 3:
			sq.post(abi.SendWQE{Opcode: abi.OpRDMARead, RemoteAddr: uint64(8 * i)}, 700)
		case 4:
			sq.post(abi.SendWQE{Opcode: abi.OpAtomicFetchAdd, RemoteAddr: 2048, CompareAdd: 1}, 8)
		}
	}
}

// check verifies that every WR completed successfully, in order, READs
// with the remote memory's bytes and atomics each executed once.
func check(t *testing.T, sq *fakeSQ, w *fakeWire) {
	t.Helper()
	if len(sq.done) != len(sq.wqes) {
		t.Fatalf("%d completions for %d WRs", len(sq.done), len(sq.wqes))
	}
	atomics := 0
	seen := map[uint64]bool{}
	for i, c := range sq.done {
		wq := &sq.wqes[i]
		if c.st != abi.WCSuccess {
			t.Fatalf("WR %d (%s) completed %s", i, wq.Opcode, c.st)
		}
		switch {
		case wq.Opcode == abi.OpRDMARead:
			va := wq.RemoteAddr
			if !bytes.Equal(sq.local[i], w.mem[va:va+uint64(len(sq.local[i]))]) {
				t.Errorf("READ %d landed wrong data", i)
			}
		case wq.Opcode.IsAtomic():
			atomics++
			old := binary.LittleEndian.Uint64(sq.local[i])
			if seen[old] {
				t.Errorf("atomic %d returned %d twice", i, old)
			}
			seen[old] = true
		}
	}
	if w.atomics != atomics {
		t.Errorf("the responder executed %d atomics for %d", w.atomics, atomics)
	}
}

func TestEngineInOrder(t *testing.T) {
	sq, w, r := setup(t, Config{})
	mix(sq, 40)
	run(t, sq, r)
	check(t, sq, w)
	if n := sq.ctr.Retries.Load(); n != 0 {
		t.Errorf("%d retries on a perfect wire", n)
	}
	if w.timeouts != 0 {
		t.Errorf("%d timeouts on a perfect wire", w.timeouts)
	}
}

// TestEngineLocalOps: a BIND_MW or LOCAL_INV among requests runs when
// every request before it has completed, sends nothing, and completes in
// order.
func TestEngineLocalOps(t *testing.T) {
	sq, w, r := setup(t, Config{})
	for i := range 12 {
		switch i % 4 {
		case 1:
			sq.post(abi.SendWQE{Opcode: abi.OpBindMW}, 0)
		case 3:
			sq.post(abi.SendWQE{Opcode: abi.OpLocalInv}, 0)
		default:
			sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 1000)
		}
	}
	run(t, sq, r)
	check(t, sq, w)
	if len(sq.locals) != 6 {
		t.Fatalf("%d local WRs executed, want 6", len(sq.locals))
	}
	for _, l := range sq.locals {
		if l[1] != l[0] {
			t.Errorf("local WR %d ran when %d WRs had completed, want all %d before it", l[0], l[1], l[0])
		}
	}
	if w.nreq != 6*4 { // the six WRITEs of 1,000 bytes in 256-byte packets
		t.Errorf("%d request packets, want 24: a local WR sends none", w.nreq)
	}
}

func TestEngineLoss(t *testing.T) {
	sq, w, r := setup(t, Config{})
	sq.attrs.RetryCnt = 7
	w.dropReq = func(n int, _ pkt) bool { return n%9 == 4 }
	w.dropResp = func(n int, _ resp) bool { return n%7 == 3 }
	mix(sq, 60)
	run(t, sq, r)
	check(t, sq, w)
	if sq.ctr.Retries.Load() == 0 {
		t.Error("no retry spent on a lossy wire")
	}
}

func TestEngineReorder(t *testing.T) {
	sq, w, r := setup(t, Config{})
	w.reorder = true
	mix(sq, 40)
	run(t, sq, r)
	check(t, sq, w)
}

func TestEngineRNR(t *testing.T) {
	sq, w, r := setup(t, Config{ProbeAfterRNR: true})
	w.rnr = 2
	sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 100)
	sq.post(abi.SendWQE{Opcode: abi.OpSend}, 100)
	sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 600)
	sq.post(abi.SendWQE{Opcode: abi.OpSend}, 10)
	run(t, sq, r)
	check(t, sq, w)
	if n := sq.ctr.RNRRcvd.Load(); n != 2 {
		t.Errorf("%d RNR NAKs received, want 2", n)
	}
	if len(sq.sleeps) != 2 || sq.sleeps[0] != rc.RNRDelay(1) {
		t.Errorf("RNR waits %v, want 2 of %v", sq.sleeps, rc.RNRDelay(1))
	}
	if len(w.probes) != 2 || w.probes[0] != 1 || w.probes[1] != 1 {
		t.Errorf("batches after the RNR NAKs %v, want the refused SEND alone twice", w.probes)
	}
}

func TestEngineRNRBudget(t *testing.T) {
	sq, w, r := setup(t, Config{})
	sq.attrs.RNRRetry = 2
	w.rnr = 10
	sq.post(abi.SendWQE{Opcode: abi.OpSend}, 100)
	sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 100)
	run(t, sq, r)
	if len(sq.done) == 0 || sq.done[0].st != abi.WCRNRRetryExcErr {
		t.Fatalf("completions %v, want RNR_RETRY_EXC_ERR first", sq.done)
	}
	if n := sq.ctr.RNRRcvd.Load(); n != 3 {
		t.Errorf("%d RNR NAKs received, want rnr_retry+1 = 3", n)
	}
}

func TestEngineFence(t *testing.T) {
	sq, w, r := setup(t, Config{})
	w.holdRead = 3
	sq.post(abi.SendWQE{Opcode: abi.OpRDMARead, RemoteAddr: 64}, 500)
	sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 100)
	sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite, Flags: abi.SendFence}, 100)
	sq.post(abi.SendWQE{Opcode: abi.OpSend}, 100)
	w.onSend = func(p pkt) {
		if p.fenced && len(sq.done) == 0 {
			t.Errorf("the fenced WRITE left before the READ before it completed")
		}
	}
	run(t, sq, r)
	check(t, sq, w)
}

func TestEngineMaxRdAtomic(t *testing.T) {
	sq, w, r := setup(t, Config{})
	sq.attrs.MaxRdAtomic = 2
	w.holdRead = 2
	for i := range 10 {
		if i%3 == 2 {
			sq.post(abi.SendWQE{Opcode: abi.OpAtomicFetchAdd, RemoteAddr: 2048, CompareAdd: 1}, 8)
		} else {
			sq.post(abi.SendWQE{Opcode: abi.OpRDMARead, RemoteAddr: uint64(16 * i)}, 300)
		}
	}
	sent := map[uint32]bool{}
	w.onSend = func(p pkt) {
		if p.op.IsRdAtomic() && p.i == 0 {
			sent[p.psn] = true
		}
		out := 0
		// READs and atomics taken into the window, sent and not completed.
		for i := 0; i < r.Len(); i++ {
			if e := r.At(i); sent[e.PSN] {
				out++
			}
		}
		if out > 2 {
			t.Errorf("%d READs and atomics outstanding, max_rd_atomic 2", out)
		}
	}
	run(t, sq, r)
	check(t, sq, w)
	if p := sq.ctr.RdAtomicPeak.Load(); p != 2 {
		t.Errorf("peak %d READs and atomics outstanding, want 2", p)
	}
}

// TestEngineRetryBudgetRewinds: an atomic whose every response is lost,
// followed by WRITEs that are acknowledged: the ACKs past it ask for
// go-back-Ns (implicit NAKs) and duplicate ACKs keep coming, but every
// go-back-N spends a transport retry and nothing progresses, so the
// atomic ends with RETRY_EXC_ERR after retry_cnt retries, executed once.
func TestEngineRetryBudgetRewinds(t *testing.T) {
	sq, w, r := setup(t, Config{})
	sq.attrs.RetryCnt = 3
	w.dropResp = func(_ int, r resp) bool { return r.kind == rAtomic }
	sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 100)
	sq.post(abi.SendWQE{Opcode: abi.OpAtomicFetchAdd, RemoteAddr: 2048, CompareAdd: 5}, 8)
	for range 4 {
		sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 600)
	}
	run(t, sq, r)
	if len(sq.done) < 2 || sq.done[0].st != abi.WCSuccess || sq.done[1].st != abi.WCRetryExcErr {
		t.Fatalf("completions %v, want the WRITE then RETRY_EXC_ERR", sq.done)
	}
	if n := sq.ctr.Retries.Load(); n != 3 {
		t.Errorf("%d retries, want retry_cnt = 3", n)
	}
	if w.atomics != 1 {
		t.Errorf("the atomic executed %d times", w.atomics)
	}
	if r.Busy() {
		t.Error("the window holds WRs after the flush")
	}
}

// TestEngineReadGapAsksAtOnce loses one packet of a READ's response: the
// next one to come shows it lost, and the READ is asked for again from
// it at once, without waiting for the local ACK timeout. Before, the
// packets after the loss were dropped silently and the READ waited for
// the timeout, while its responder went on sending the rest.
func TestEngineReadGapAsksAtOnce(t *testing.T) {
	sq, w, r := setup(t, Config{})
	sq.attrs.Timeout = 20 // 4 s: the READ must not wait for it
	// 16 packets of 256 bytes
	sq.post(abi.SendWQE{Opcode: abi.OpRDMARead}, 4096)
	lost := false
	w.dropResp = func(_ int, r resp) bool {
		if r.kind == rRead && r.psn == sq.npsn-16+5 && !lost {
			lost = true
			return true
		}
		return false
	}
	var asked []uint32
	w.onSend = func(p pkt) {
		if p.op == abi.OpRDMARead {
			asked = append(asked, p.i)
		}
	}
	run(t, sq, r)
	check(t, sq, w)
	if w.timeouts != 0 {
		t.Errorf("%d local ACK timeouts: the READ waited for the timeout to ask for the packet lost", w.timeouts)
	}
	if len(asked) != 2 || asked[0] != 0 || asked[1] != 5 {
		t.Errorf("the READ asked from response packets %v, want [0 5]: once, then from the packet lost", asked)
	}
}

// TestEngineReadCredit reads 16 packets from a responder that sends 4 per
// request (a credit of 4, said in its responses): the requester asks for
// the next 4 when half of the last have landed (continuations, which the
// upcall hands the wire), and the READ completes without a timeout; from
// a responder that does not say it paces, it asks once, whatever its
// credit.
func TestEngineReadCredit(t *testing.T) {
	for _, paced := range []bool{true, false} {
		sq, w, r := setup(t, Config{ReadCredit: 4})
		sq.attrs.Timeout = 20
		if paced {
			w.credit = 4
		}
		sq.post(abi.SendWQE{Opcode: abi.OpRDMARead, RemoteAddr: 64, RKey: 9}, 4000)
		var asked []uint32
		w.onSend = func(p pkt) {
			if p.op == abi.OpRDMARead {
				asked = append(asked, p.i)
			}
		}
		run(t, sq, r)
		check(t, sq, w)
		var want []ReadMore
		if paced {
			for k := uint32(4); k < 16; k += 4 {
				want = append(want, ReadMore{PSN: 100 + k, RemoteAddr: 64 + 256*uint64(k), RKey: 9, Len: 4000 - 256*k})
			}
		}
		if !slices.Equal(asked, []uint32{0}) || !slices.Equal(w.more, want) || w.timeouts != 0 {
			t.Errorf("paced %v: the READ asked from response packets %v, then continuations %+v, with %d timeouts; want [0], then %+v, and none",
				paced, asked, w.more, w.timeouts, want)
		}
	}
}

// TestEngineOnePSN: a wire whose WRs take one PSN each (tcp) moves long
// messages in one request packet.
func TestEngineOnePSN(t *testing.T) {
	sq, w, r := setup(t, Config{MTU: func(*device.RCAttrs) uint32 { return 0 }, BatchBytes: 1500})
	mix(sq, 20)
	var pkts int
	w.onSend = func(pkt) { pkts++ }
	run(t, sq, r)
	check(t, sq, w)
	if pkts != 20 {
		t.Errorf("%d request packets for 20 WRs", pkts)
	}
}

// TestSecurityMessageSpanningPSNSpace: at path MTU 256 a message of more
// than rc.MaxSpan packets (1 GiB) would take more PSNs than a window may
// span (a 2 GiB one half the PSN space, where a new PSN reads as an old
// one): it completes with LOC_LEN_ERR without a packet sent, and the QP
// moves to ERR. One of exactly rc.MaxSpan packets is taken.
func TestSecurityMessageSpanningPSNSpace(t *testing.T) {
	const mtu = 256
	t.Run("refused", func(t *testing.T) {
		sq, w, r := setup(t, Config{Outstanding: 16})
		sq.attrs.PathMTU = mtu
		sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 64)
		sq.totals = map[uint64]uint64{0: rc.MaxSpan*mtu + 1}
		r.fill(true)
		r.reap()
		if len(w.queued)+len(w.inflight) != 0 {
			t.Errorf("%d packets of the refused message sent", len(w.queued)+len(w.inflight))
		}
		if len(sq.done) != 1 || sq.done[0].st != abi.WCLocLenErr {
			t.Fatalf("completions %+v, want the WRITE's with LOC_LEN_ERR", sq.done)
		}
		if sq.state != abi.QPSErr {
			t.Fatalf("QP in %s after the refusal, want ERR", sq.state)
		}
	})
	t.Run("largest-taken", func(t *testing.T) {
		sq, _, r := setup(t, Config{Outstanding: 16})
		sq.attrs.PathMTU = mtu
		sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 64)
		sq.totals = map[uint64]uint64{0: rc.MaxSpan * mtu}
		r.fill(true)
		if r.Len() != 1 || r.At(0).NPSN != rc.MaxSpan || r.At(0).local != abi.WCSuccess {
			t.Fatalf("window of %d, its first entry %d PSNs (%s); want the message taken with %d", r.Len(), r.At(0).NPSN, r.At(0).local, rc.MaxSpan)
		}
	})
}

// TestSecurityWindowSpansAQuarterOfPSNs: READs of 512 MiB at path MTU 256
// take 2^21+1 PSNs each (one per response packet): the window takes the
// second only once the first is acknowledged, so that the PSNs in flight
// never span more than rc.MaxSpan.
func TestSecurityWindowSpansAQuarterOfPSNs(t *testing.T) {
	const mtu = 256
	sq, w, r := setup(t, Config{Outstanding: 16})
	sq.attrs.PathMTU = mtu
	w.dropReq = func(int, pkt) bool { return true } // nothing is answered
	sq.totals = map[uint64]uint64{}
	for i := range 3 {
		sq.post(abi.SendWQE{Opcode: abi.OpRDMARead}, 64)
		sq.totals[uint64(i)] = (rc.MaxSpan/2 + 1) * mtu
	}
	r.fill(true)
	if r.Len() != 1 {
		t.Fatalf("the window took %d READs of %d PSNs each, spanning %d PSNs; want 1 (at most %d)", r.Len(), rc.MaxSpan/2+1, r.Len()*(rc.MaxSpan/2+1), rc.MaxSpan)
	}
	if !r.spanFull {
		t.Fatal("the window stopped taking WQEs without saying why: wait would not sleep")
	}
}

// TestEngineNoSuccessAfterError: once the head WR completes with an error
// (the QP goes to ERR), the WRs behind it flush, even those whose
// responses came already: a WRITE NAKed REM_OP_ERR, then the READ behind
// it answered in the same batch of responses (as a replay can make a
// responder do), leaves the READ WR_FLUSH_ERR, not SUCCESS (IBTA: every WR after an error completion
// flushes). The fault harness saw WR 298 WRITE REM_OP_ERR, then WR 299
// READ SUCCESS.
func TestEngineNoSuccessAfterError(t *testing.T) {
	sq, w, r := setup(t, Config{})
	w.mangle = func(p *resp) {
		if p.kind == rAck {
			p.kind, p.nak = rNak, rc.NAKRemOp
		}
	}
	sq.post(abi.SendWQE{Opcode: abi.OpRDMAWrite}, 100)
	sq.post(abi.SendWQE{Opcode: abi.OpRDMARead, RemoteAddr: 64}, 100)
	run(t, sq, r)
	want := []abi.WCStatus{abi.WCRemOpErr, abi.WCWRFlushErr}
	if len(sq.done) != len(want) {
		t.Fatalf("%d completions %+v, want %v", len(sq.done), sq.done, want)
	}
	for i, c := range sq.done {
		if c.st != want[i] {
			t.Errorf("WR %d completed %s, want %s", i, c.st, want[i])
		}
	}
}
