// SPDX-License-Identifier: Apache-2.0

package device

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// ringHarness is a device with two attached VMs, built without sockets or
// workloads, for driving the ring consumer by hand; their QPs connect over
// the memcpy path (harnessPath). Each VM's 1 MiB of
// guest memory holds a pattern, two memory regions with keys 0x1000 (every
// access right, [harnessRW, +harnessRWLen)) and 0x1001 (remote read only,
// [harnessRO, +harnessROLen)), and nothing else that may change.
type ringHarness struct {
	d       *Device
	v, pv   *Context // the sender's VM and its peer's
	pd, ppd *PD
	pattern []byte // what guest memory holds outside the writable regions
}

const (
	harnessMem   = 1 << 20
	harnessRW    = 0x10000
	harnessRWLen = 0x10000
	harnessRO    = 0x30000
	harnessROLen = 0x1000
	harnessKeyRW = 0x1000 // slot 0, generation 1 (keys.go, max_mr 4096)
	harnessKeyRO = 0x1001 // slot 1, generation 1
	harnessCaps  = 8      // SQ and RQ slots, the QPs' SGEs per WQE
)

func newRingHarness(tb testing.TB) *ringHarness {
	tb.Helper()
	if harnessPath == nil {
		tb.Fatal("no memcpy path: harness_path_test.go's init sets it")
	}
	d := New(Config{Host: "fuzz", HostID: "fuzz-host", Limits: DefaultLimits, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Router: harnessRouter{}})
	h := &ringHarness{d: d, pattern: make([]byte, harnessMem)}
	for i := range h.pattern {
		h.pattern[i] = byte(i*131 + i>>8*7 + 3)
	}
	vmx := "memSize = \"1\"\nvirtualHW.version = \"20\"\nguestOS = \"ubuntu-64\"\nethernet0.present = \"TRUE\"\nethernet0.virtualDev = \"vrdma\"\n"
	attach := func(name string) (*Context, *PD) {
		cfg, err := vmconfig.Parse([]byte(vmx))
		if err != nil {
			tb.Fatal(err)
		}
		v, err := d.Attach(harnessOwner{}, name, cfg, false, func() error { return nil })
		if err != nil {
			tb.Fatal(err)
		}
		v.SetReady()
		tb.Cleanup(func() {
			v.Teardown()
			d.Remove(v)
		})
		ph, err := v.AllocPD("vrdma0")
		if err != nil {
			tb.Fatal(err)
		}
		p := v.pds[ph]
		for _, r := range []abi.RegMR{{PD: ph, Addr: harnessRW, Length: harnessRWLen, Access: abi.AccessAll},
			{PD: ph, Addr: harnessRO, Length: harnessROLen, Access: abi.AccessRemoteRead}} {
			if _, err := v.RegMR(&r); err != nil {
				tb.Fatal(err)
			}
		}
		if v.lookupMR(harnessKeyRW) == nil || v.lookupMR(harnessKeyRO) == nil {
			tb.Fatal("memory region keys are not the expected 0x1000 and 0x1001")
		}
		copy(v.mem.Bytes(), h.pattern)
		return v, p
	}
	h.v, h.pd = attach("sender")
	h.pv, h.ppd = attach("peer")
	return h
}

// harnessPath makes the path of the harness's QPs: package memcpy's, set
// by harness_path_test.go (package device_test, which may import it).
var harnessPath func(ts Targets) func(q Source) Path

// harnessRouter binds every QP to harnessPath.
type harnessRouter struct{}

func (harnessRouter) Route(q *QP, dgid abi.GID, dqpn uint32) (Route, error) {
	return Route{Info: abi.PathInfo{Path: abi.PathMemcpy, Reason: "memcpy: the ring harness"}, New: harnessPath(q.Device())}, nil
}

// harnessOwner is the harness's VMs' workload: none.
type harnessOwner struct{}

func (harnessOwner) PID() int32                       { return 0 }
func (harnessOwner) UID() uint32                      { return 0 }
func (harnessOwner) Close()                           {}
func (harnessOwner) Closed() bool                     { return false }
func (harnessOwner) PortChanged(ad *Adapter, up bool) {}

// connect brings q from RESET to RTR facing p, with the attributes the
// CM gives (package cm's ToInit and ToRTR).
func connect(q, p *QP) error {
	if err := q.Modify(&abi.ModifyQP{Mask: abi.MaskState | abi.MaskPort | abi.MaskAccessFlags,
		Attr: abi.QPAttr{State: abi.QPSInit, Port: 1, AccessFlags: abi.AccessAll}}); err != nil {
		return err
	}
	return q.Modify(&abi.ModifyQP{
		Mask: abi.MaskState | abi.MaskAV | abi.MaskPathMTU | abi.MaskDestQPN | abi.MaskRQPSN | abi.MaskMaxDestRdAtomic | abi.MaskMinRNRTimer,
		Attr: abi.QPAttr{State: abi.QPSRTR, DGID: p.ad.gid, PathMTU: abi.DefaultPathMTU, DestQPN: p.qpn,
			MaxDestRdAtomic: abi.MaxRdAtom, MinRNRTimer: abi.DefaultMinRNRTimer}})
}

// ringCase is one run of the consumer: a QP q of the sender VM connected
// to a QP p of the peer VM, with whatever the fuzzer wrote into their
// rings.
type ringCase struct {
	q, p         *QP
	cq, pcq      *CQ    // q's CQ (send and receive), p's
	sqHead0      uint32 // q's SQ head before the run
	sigAll       bool
	cqGarbage    bool // q's CQ head index is garbage: its completions are dropped
	state        abi.QPState
	sqTailBad    bool
	consumedSQ   map[uint64]bool // WR IDs of the send WQEs consumed
	consumedPRQ  map[uint64]bool // of p's receive WQEs consumed
	consumedQRQ  map[uint64]bool // of q's receive WQEs consumed
	rqTail, qrqT uint32
}

// WR IDs the harness writes into the slots, so that a completion names
// the slot it came from.
const (
	wrSQ  = 0x5100 // + SQ slot of q
	wrPRQ = 0x7200 // + RQ slot of p
	wrQRQ = 0x8300 // + RQ slot of q
)

// newQP creates a QP whose goroutine is stopped, so that the test runs
// the consumer itself.
func (h *ringHarness) newQP(tb testing.TB, v *Context, p *PD, c *CQ, sigAll bool) *QP {
	tb.Helper()
	q, err := v.CreateQP(&abi.CreateQP{PD: p.handle, SendCQ: c.handle, RecvCQ: c.handle, Type: abi.QPTypeRC, SQSigAll: sigAll,
		Caps: abi.QPCaps{MaxSendWR: harnessCaps, MaxRecvWR: harnessCaps, MaxSendSGE: harnessCaps, MaxRecvSGE: harnessCaps, MaxInlineData: 64}})
	if err != nil {
		tb.Fatal(err)
	}
	q.stop.Store(true)
	q.doorbell.Wake()
	<-q.done
	q.stop.Store(false)
	return q
}

func (h *ringHarness) newCQ(tb testing.TB, v *Context) *CQ {
	tb.Helper()
	c, err := v.CreateCQ(&abi.CreateCQ{Adapter: "vrdma0", CQE: 64})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// setup builds a connected pair and writes the fuzzer's bytes into the
// rings: q's send queue (sq, tail sqTail, head sqHead), p's receive queue
// (prq, tail rqTail) and q's receive queue (qrq, tail qrqTail). mode
// picks q's state, SQ signaling and whether q's CQ head is garbage
// (cqHead, if it is not a valid index).
func (h *ringHarness) setup(tb testing.TB, sq []byte, sqTail, sqHead uint32, prq []byte, rqTail uint32, qrq []byte, qrqTail, cqHead uint32, mode uint8) *ringCase {
	tb.Helper()
	rc := &ringCase{sigAll: mode&8 != 0, cq: h.newCQ(tb, h.v), pcq: h.newCQ(tb, h.pv)}
	rc.q = h.newQP(tb, h.v, h.pd, rc.cq, rc.sigAll)
	rc.p = h.newQP(tb, h.pv, h.ppd, rc.pcq, false)
	q, p := rc.q, rc.p
	// Connected as the CM does, except that q fails at once rather than
	// wait on a missing receive or peer (retry_cnt and rnr_retry 0).
	for _, step := range []func() error{
		func() error { return connect(q, p) },
		func() error { return connect(p, q) },
		func() error {
			return p.Modify(&abi.ModifyQP{Mask: abi.MaskState | abi.MaskSQPSN | abi.MaskTimeout | abi.MaskRetryCnt | abi.MaskRNRRetry | abi.MaskMaxRdAtomic,
				Attr: abi.QPAttr{State: abi.QPSRTS, Timeout: abi.DefaultTimeout, RetryCnt: abi.DefaultRetryCnt, RNRRetry: abi.DefaultRNRRetry, MaxRdAtomic: abi.MaxRdAtom}})
		},
		func() error {
			return q.Modify(&abi.ModifyQP{Mask: abi.MaskState | abi.MaskSQPSN | abi.MaskTimeout | abi.MaskRetryCnt | abi.MaskRNRRetry | abi.MaskMaxRdAtomic,
				Attr: abi.QPAttr{State: abi.QPSRTS, Timeout: 1, MaxRdAtomic: 1}})
		},
	} {
		if err := step(); err != nil {
			tb.Fatal(err)
		}
	}
	states := [...]abi.QPState{abi.QPSRTS, abi.QPSRTS, abi.QPSSQD, abi.QPSErr, abi.QPSReset, abi.QPSInit, abi.QPSRTS, abi.QPSRTS}
	rc.state = states[mode&7]
	switch rc.state {
	case abi.QPSSQD, abi.QPSErr, abi.QPSReset:
		if err := q.Modify(&abi.ModifyQP{Mask: abi.MaskState, Attr: abi.QPAttr{State: rc.state}}); err != nil {
			tb.Fatal(err)
		}
	case abi.QPSInit:
		for _, m := range []abi.ModifyQP{{Mask: abi.MaskState, Attr: abi.QPAttr{State: abi.QPSReset}},
			{Mask: abi.MaskState | abi.MaskPort | abi.MaskAccessFlags, Attr: abi.QPAttr{State: abi.QPSInit, Port: 1, AccessFlags: abi.AccessAll}}} {
			if err := q.Modify(&m); err != nil {
				tb.Fatal(err)
			}
		}
	}

	// Let the consumers see the state changes with empty queues, as their
	// goroutines would have: what follows is posted after them.
	q.drain()
	p.drain()

	fill := func(ring []byte, off, entries, stride uint32, b []byte, wr uint64) {
		region := ring[off : off+entries*stride]
		copy(region, b)
		for i := range entries {
			binary.LittleEndian.PutUint64(region[i*stride:], wr+uint64(i))
		}
	}
	ql, pl := q.layout, p.layout
	qmem, pmem := q.ring.Bytes(), p.ring.Bytes()
	fill(qmem, ql.SQOffset, ql.SQEntries, ql.SQStride, sq, wrSQ)
	fill(pmem, pl.RQOffset, pl.RQEntries, pl.RQStride, prq, wrPRQ)
	fill(qmem, ql.RQOffset, ql.RQEntries, ql.RQStride, qrq, wrQRQ)

	// q's private SQ head is the agent's, always a valid index; the head
	// words in shared memory are the workload's to scribble on.
	q.sqHead = sqHead & (2*ql.SQEntries - 1)
	rc.sqHead0 = q.sqHead
	abi.Word(qmem, abi.OffSQHead).Store(sqHead ^ 0xa5a5a5a5)
	abi.Word(qmem, abi.OffRQHead).Store(rqTail ^ 0x5a5a5a5a)
	abi.Word(qmem, abi.OffSQTail).Store(sqTail)
	abi.Word(pmem, abi.OffRQTail).Store(rqTail)
	abi.Word(qmem, abi.OffRQTail).Store(qrqTail)
	_, ok := abi.Pending(sqTail, q.sqHead, ql.SQEntries)
	rc.sqTailBad, rc.rqTail, rc.qrqT = !ok, rqTail, qrqTail
	// A valid CQ head could claim the CQ full, and the consumer would
	// then wait for a workload that is not there: only garbage is
	// interesting.
	if !abi.ValidIndex(cqHead, rc.cq.layout.Entries) {
		abi.Word(rc.cq.ring.Bytes(), abi.OffCQHead).Store(cqHead)
		rc.cqGarbage = true
	}
	return rc
}

// consumed returns the WR IDs of the slots between from and to.
func consumed(from, to, entries uint32, wr uint64) map[uint64]bool {
	m := map[uint64]bool{}
	for i := from; i != to; i = abi.Next(i, entries) {
		m[wr+uint64(abi.Slot(i, entries))] = true
	}
	return m
}

// completions returns the CQEs the agent wrote to c.
func completions(c *CQ) []abi.CQE {
	var out []abi.CQE
	mem := c.ring.Bytes()
	for i := uint32(0); i != c.tail; i = abi.Next(i, c.layout.Entries) {
		var e abi.CQE
		off := c.layout.Offset + abi.Slot(i, c.layout.Entries)*abi.CQESize
		abi.DecodeCQE(mem[off:off+abi.CQESize], &e)
		out = append(out, e)
	}
	return out
}

// check verifies the invariants after a run.
func (h *ringHarness) check(tb testing.TB, rc *ringCase) {
	tb.Helper()
	q, p := rc.q, rc.p
	// Guest memory outside the writable regions is untouched, in both VMs
	// (the read-only regions included).
	for _, v := range []*Context{h.v, h.pv} {
		mem := v.mem.Bytes()
		if !bytes.Equal(mem[:harnessRW], h.pattern[:harnessRW]) || !bytes.Equal(mem[harnessRW+harnessRWLen:], h.pattern[harnessRW+harnessRWLen:]) {
			for i := range mem {
				if (i < harnessRW || i >= harnessRW+harnessRWLen) && mem[i] != h.pattern[i] {
					tb.Fatalf("VM %s: byte 0x%x outside every writable region changed", v.name, i)
				}
			}
		}
	}
	// Each consumed WQE completes at most once, and exactly once when
	// nothing drops completions; nothing else completes.
	rc.consumedSQ = consumed(rc.sqHead0, q.sqHead, q.layout.SQEntries, wrSQ)
	rc.consumedQRQ = consumed(0, q.rqHead, q.layout.RQEntries, wrQRQ)
	rc.consumedPRQ = consumed(0, p.rqHead, p.layout.RQEntries, wrPRQ)
	seen := map[uint64]bool{}
	for _, e := range completions(rc.cq) {
		want := rc.consumedSQ
		if e.Opcode >= abi.WCRecv {
			want = rc.consumedQRQ
		}
		if e.QPNum != q.qpn || !want[e.WRID] || seen[e.WRID] {
			tb.Fatalf("completion %+v: not of a WQE q consumed, or twice (consumed %v %v)", e, rc.consumedSQ, rc.consumedQRQ)
		}
		seen[e.WRID] = true
	}
	for _, e := range completions(rc.pcq) {
		if e.QPNum != p.qpn || e.Opcode < abi.WCRecv || !rc.consumedPRQ[e.WRID] || seen[e.WRID] {
			tb.Fatalf("peer completion %+v: not of a receive p consumed, or twice (consumed %v)", e, rc.consumedPRQ)
		}
		seen[e.WRID] = true
	}
	for id := range rc.consumedPRQ {
		if !seen[id] {
			tb.Fatalf("the peer consumed receive 0x%x without completing it", id)
		}
	}
	if !rc.cqGarbage && rc.state != abi.QPSReset {
		for id := range rc.consumedQRQ {
			if !seen[id] {
				tb.Fatalf("q flushed receive 0x%x without completing it", id)
			}
		}
		if rc.sigAll {
			for id := range rc.consumedSQ {
				if !seen[id] {
					tb.Fatalf("send 0x%x consumed without completion on a QP that signals all", id)
				}
			}
		}
	}
	// Nothing is left that would make the goroutine spin: the consumer
	// did all it could.
	for _, x := range []*QP{q, p} {
		if x.hasWork(abi.Word(x.ring.Bytes(), abi.OffSQTail).Load()) {
			tb.Fatalf("QP 0x%x in %s still has work after draining (SQ tail %d head %d): its goroutine would spin",
				x.qpn, x.State(), abi.Word(x.ring.Bytes(), abi.OffSQTail).Load(), x.sqHead)
		}
	}
	if rc.sqTailBad && rc.state != abi.QPSReset && q.State() != abi.QPSErr {
		tb.Fatalf("a garbage SQ tail left the QP in %s", q.State())
	}
}

// teardown destroys the case's objects and restores the writable regions.
func (h *ringHarness) teardown(tb testing.TB, rc *ringCase) {
	tb.Helper()
	h.v.DestroyQP(rc.q)
	h.pv.DestroyQP(rc.p)
	for _, x := range []struct {
		v *Context
		c *CQ
	}{{h.v, rc.cq}, {h.pv, rc.pcq}} {
		if err := x.v.DestroyCQ(x.c.handle); err != nil {
			tb.Fatal(err)
		}
	}
	for _, v := range []*Context{h.v, h.pv} {
		copy(v.mem.Bytes()[harnessRW:harnessRW+harnessRWLen], h.pattern[harnessRW:])
	}
}

// sendSlots encodes send WQEs into consecutive SQ slots of the harness's
// stride, for seeds.
func sendSlots(ws ...abi.SendWQE) []byte {
	_, caps, _ := abi.NewQPLayout(abi.QPCaps{MaxSendWR: harnessCaps, MaxRecvWR: harnessCaps, MaxSendSGE: harnessCaps, MaxRecvSGE: harnessCaps, MaxInlineData: 64})
	l, _, _ := abi.NewQPLayout(caps)
	b := make([]byte, len(ws)*int(l.SQStride))
	for i := range ws {
		abi.EncodeSend(b[i*int(l.SQStride):], &ws[i], []byte("inline payload"))
	}
	return b
}

func recvSlots(ws ...abi.RecvWQE) []byte {
	l, _, _ := abi.NewQPLayout(abi.QPCaps{MaxSendWR: harnessCaps, MaxRecvWR: harnessCaps, MaxSendSGE: harnessCaps, MaxRecvSGE: harnessCaps, MaxInlineData: 64})
	b := make([]byte, len(ws)*int(l.RQStride))
	for i := range ws {
		abi.EncodeRecv(b[i*int(l.RQStride):], &ws[i])
	}
	return b
}

func sges(s ...abi.SGE) (n uint8, a [abi.MaxSGE]abi.SGE) {
	copy(a[:], s)
	return uint8(len(s)), a
}

// FuzzRingConsumer writes fuzzer-chosen bytes into a QP's send queue, its
// peer's receive queue and its own receive queue, with fuzzer-chosen
// indices, in each QP state, then runs the consumer (drain) as the QP's
// goroutine would, and its peer's. It checks that nothing panics, that no
// byte of guest memory outside the regions that allow writing changes,
// that every consumed WQE completes at most once (exactly once where no
// completion may be dropped), and that the consumer leaves nothing that
// would make it spin.
//
// Each run creates and destroys two QPs and two CQs (system calls): about
// a thousand runs a second. Minimizing every new input for the default
// 60 s would leave little time to search, so run it with a short
// -fuzzminimizetime:
//
//	go test -run '^$' -fuzz '^FuzzRingConsumer$' -fuzztime 60s -fuzzminimizetime 1s ./internal/agent
func FuzzRingConsumer(f *testing.F) {
	rw := func(addr uint64, n uint32) abi.SGE {
		return abi.SGE{Addr: harnessRW + addr, Length: n, LKey: harnessKeyRW}
	}
	n1, s1 := sges(rw(0, 64))
	n2, s2 := sges(rw(128, 32), rw(512, 32))
	recvs := recvSlots(abi.RecvWQE{WRID: 1, NumSGE: n1, SGE: s1}, abi.RecvWQE{WRID: 2, NumSGE: n2, SGE: s2},
		abi.RecvWQE{WRID: 3, NumSGE: n1, SGE: s1}, abi.RecvWQE{WRID: 4, NumSGE: n1, SGE: s1})
	nl, sl := sges(rw(1024, 64))
	na, sa := sges(rw(2048, 8))
	sends := sendSlots(
		abi.SendWQE{Opcode: abi.OpSend, Flags: abi.SendSignaled, NumSGE: nl, SGE: sl},
		abi.SendWQE{Opcode: abi.OpRDMAWrite, NumSGE: nl, SGE: sl, RemoteAddr: harnessRW + 4096, RKey: harnessKeyRW},
		abi.SendWQE{Opcode: abi.OpRDMARead, Flags: abi.SendSignaled, NumSGE: nl, SGE: sl, RemoteAddr: harnessRO, RKey: harnessKeyRO},
		abi.SendWQE{Opcode: abi.OpAtomicFetchAdd, NumSGE: na, SGE: sa, RemoteAddr: harnessRW + 64, RKey: harnessKeyRW, CompareAdd: 5},
		abi.SendWQE{Opcode: abi.OpAtomicCmpAndSwp, NumSGE: na, SGE: sa, RemoteAddr: harnessRW + 64, RKey: harnessKeyRW, CompareAdd: 5, Swap: 9},
		abi.SendWQE{Opcode: abi.OpSendWithImm, Flags: abi.SendInline | abi.SendSignaled, InlineLen: 14, Imm: 77},
		abi.SendWQE{Opcode: abi.OpRDMAWriteWithImm, NumSGE: nl, SGE: sl, RemoteAddr: harnessRW + 8192, RKey: harnessKeyRW, Imm: 1},
		abi.SendWQE{Opcode: abi.OpRDMAWrite, NumSGE: nl, SGE: sl, RemoteAddr: harnessRO, RKey: harnessKeyRO}, // no remote write
	)
	for mode := range uint8(16) {
		f.Add(sends, uint32(8), uint32(0), recvs, uint32(4), recvs, uint32(2), uint32(0), mode)
	}
	f.Add(sends, uint32(11), uint32(7), recvs, uint32(12), recvs, uint32(9), uint32(0), uint8(8))             // wrapped indices
	f.Add(sends, uint32(0xdeadbeef), uint32(0), recvs, uint32(4), recvs, uint32(0xffff), uint32(0), uint8(3)) // garbage tails
	f.Add(sends, uint32(4), uint32(0), recvs, uint32(0x80000000), recvs, uint32(1), uint32(0x7fffffff), uint8(8))
	f.Add(bytes.Repeat([]byte{0xff}, 4096), uint32(8), uint32(0), bytes.Repeat([]byte{0xff}, 4096), uint32(8), []byte{}, uint32(0), uint32(0), uint8(0))
	f.Add([]byte{}, uint32(16), uint32(0), []byte{}, uint32(0), []byte{}, uint32(0), uint32(0), uint8(1))
	// Memory-window work requests with garbage in them: a bind of a
	// window the context does not have, of a region key that is no
	// window's, an invalidation of a region's key and of a window's key
	// of no window, a SEND with invalidate of garbage.
	bind := abi.SendWQE{Opcode: abi.OpBindMW, Flags: abi.SendSignaled}
	bind.SetBindMW(abi.MWBind{MW: 0xffff, RKey: abi.MWKeyBit | 0x107, MRKey: harnessKeyRW, Addr: harnessRW, Length: 64, Access: abi.AccessRemoteWrite})
	bind2 := abi.SendWQE{Opcode: abi.OpBindMW}
	bind2.SetBindMW(abi.MWBind{MW: 1, RKey: harnessKeyRW, MRKey: harnessKeyRO, Addr: ^uint64(0), Length: ^uint64(0), Access: ^abi.Access(0)})
	mws := sendSlots(bind, bind2,
		abi.SendWQE{Opcode: abi.OpLocalInv, Flags: abi.SendSignaled, Imm: harnessKeyRW},
		abi.SendWQE{Opcode: abi.OpLocalInv, Imm: abi.MWKeyBit | 0x7fffff07},
		abi.SendWQE{Opcode: abi.OpSendWithInv, Flags: abi.SendSignaled, NumSGE: nl, SGE: sl, Imm: abi.MWKeyBit | 0x100},
		abi.SendWQE{Opcode: abi.OpSendWithInv, NumSGE: nl, SGE: sl, Imm: harnessKeyRW},
	)
	for mode := range uint8(4) {
		f.Add(mws, uint32(6), uint32(0), recvs, uint32(4), recvs, uint32(2), uint32(0), mode)
	}

	h := newRingHarness(f)
	f.Fuzz(func(t *testing.T, sq []byte, sqTail, sqHead uint32, prq []byte, rqTail uint32, qrq []byte, qrqTail, cqHead uint32, mode uint8) {
		rc := h.setup(t, sq, sqTail, sqHead, prq, rqTail, qrq, qrqTail, cqHead, mode)
		rc.q.drain()
		rc.p.drain() // the peer's goroutine: flushes its receive queue if it went to ERR
		rc.q.drain()
		// What q's drains started may end after them, on another
		// goroutine (a timer of q's requester, the peer's answer), and
		// move q to ERR: its goroutine, woken by that move, would drain
		// again. So drain whenever there is work, until none has come for
		// a while (bounded): a consumer that leaves work it cannot do
		// would spin, and check reports it.
		for quiet, i := 0, 0; quiet < 10 && i < 200; i++ {
			quiet++
			if rc.q.hasWork(abi.Word(rc.q.ring.Bytes(), abi.OffSQTail).Load()) || rc.p.hasWork(abi.Word(rc.p.ring.Bytes(), abi.OffSQTail).Load()) {
				quiet = 0
				rc.q.drain()
				rc.p.drain()
			}
			time.Sleep(100 * time.Microsecond)
		}
		h.check(t, rc)
		h.teardown(t, rc)
	})
}

// TestRingConsumerSpin checks, case by case, that garbage indices leave
// the consumer nothing to spin on, in every state the garbage can meet.
func TestRingConsumerSpin(t *testing.T) {
	h := newRingHarness(t)
	for _, c := range []struct {
		name                    string
		sqTail, rqTail, qrqTail uint32
		mode                    uint8
	}{
		{"garbage SQ tail in RTS", 0xdeadbeef, 0, 0, 0},
		{"garbage SQ tail in RESET", 0xdeadbeef, 0, 0, 4},
		{"garbage RQ tail in ERR", 0, 0, 0x12345678, 3},
		{"garbage RQ tail in RESET", 0, 0, 0x12345678, 4},
		{"WQEs held in SQD", 3, 0, 0, 2},
		{"garbage peer RQ tail", 2, 0x40000000, 0, 0},
		{"broken CQ", 5, 0, 3, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc := h.setup(t, nil, c.sqTail, 0, nil, c.rqTail, nil, c.qrqTail, 0xffffffff, c.mode)
			rc.q.drain()
			rc.p.drain()
			h.check(t, rc)
			if c.mode == 2 { // SQD → RTS resumes the held WQEs
				if err := rc.q.Modify(&abi.ModifyQP{Mask: abi.MaskState, Attr: abi.QPAttr{State: abi.QPSRTS}}); err != nil {
					t.Fatal(err)
				}
				if !rc.q.hasWork(abi.Word(rc.q.ring.Bytes(), abi.OffSQTail).Load()) {
					t.Fatal("WQEs held in SQD are not work once the QP is back in RTS")
				}
				rc.q.drain()
				if rc.q.sqHead != 3 {
					t.Fatalf("after SQD → RTS the consumer is at %d of 3", rc.q.sqHead)
				}
			}
			h.teardown(t, rc)
		})
	}
}
