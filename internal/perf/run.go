// SPDX-License-Identifier: Apache-2.0

package perf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
)

// Test names a benchmark, as perftest's binaries do (ib_write_bw is
// write_bw).
type Test string

// Tests.
const (
	WriteBW   Test = "write_bw"
	ReadBW    Test = "read_bw"
	SendBW    Test = "send_bw"
	AtomicBW  Test = "atomic_bw"
	WriteLat  Test = "write_lat"
	ReadLat   Test = "read_lat"
	SendLat   Test = "send_lat"
	AtomicLat Test = "atomic_lat"
)

// Tests lists the tests Run knows, perftest's eight RC tests.
var Tests = []Test{WriteBW, ReadBW, SendBW, AtomicBW, WriteLat, ReadLat, SendLat, AtomicLat}

// ParseTest returns the test called s.
func ParseTest(s string) (Test, error) {
	for _, t := range Tests {
		if string(t) == s {
			return t, nil
		}
	}
	names := make([]string, len(Tests))
	for i, t := range Tests {
		names[i] = string(t)
	}
	return "", fmt.Errorf("unknown test %q: want one of %s", s, strings.Join(names, ", "))
}

// Atomic is the operation of the atomic tests (perftest's -A).
type Atomic string

// Atomic operations.
const (
	FetchAndAdd Atomic = "FETCH_AND_ADD" // the default
	CmpAndSwap  Atomic = "CMP_AND_SWAP"
)

// ParseAtomic returns the operation called s (perftest's names).
func ParseAtomic(s string) (Atomic, error) {
	switch Atomic(s) {
	case FetchAndAdd, CmpAndSwap:
		return Atomic(s), nil
	}
	return "", fmt.Errorf("unknown atomic operation %q: want FETCH_AND_ADD or CMP_AND_SWAP", s)
}

// Title returns perftest's title line: "RDMA_Write BW Test", "Atomic
// FETCH_AND_ADD Latency Test" (op names the atomic tests' operation;
// empty is FETCH_AND_ADD).
func (t Test) Title(op Atomic) string {
	if op == "" {
		op = FetchAndAdd
	}
	switch t {
	case WriteBW:
		return "RDMA_Write BW Test"
	case ReadBW:
		return "RDMA_Read BW Test"
	case SendBW:
		return "Send BW Test"
	case AtomicBW:
		return "Atomic " + string(op) + " BW Test"
	case WriteLat:
		return "RDMA_Write Latency Test"
	case ReadLat:
		return "RDMA_Read Latency Test"
	case SendLat:
		return "Send Latency Test"
	case AtomicLat:
		return "Atomic " + string(op) + " Latency Test"
	}
	return string(t)
}

// Latency reports whether t measures latency (else bandwidth).
func (t Test) Latency() bool {
	return t == WriteLat || t == ReadLat || t == SendLat || t == AtomicLat
}

// FullRoundTrip reports whether t's latency is the whole round trip
// (read_lat, atomic_lat: one side's request and its response), as
// perftest reports them; write_lat and send_lat ping-pong and report half.
func (t Test) FullRoundTrip() bool { return t == ReadLat || t == AtomicLat }

// Atomic reports whether t is an atomic test: its messages are 8 bytes.
func (t Test) Atomic() bool { return t == AtomicBW || t == AtomicLat }

// DefaultSize is perftest's default message size (-s): 65536 for BW, 2 for
// latency, 8 (the only size) for atomics.
func (t Test) DefaultSize() int {
	switch {
	case t.Atomic():
		return 8
	case t.Latency():
		return 2
	}
	return 65536
}

// DefaultIters is perftest's default iteration count (-n): 5000 for write
// BW, 1000 otherwise.
func (t Test) DefaultIters() int {
	if t == WriteBW {
		return 5000
	}
	return 1000
}

// DefaultCQMod is perftest's CQ moderation (-Q): one signaled send in 100.
const DefaultCQMod = 100

// CQModSizeLimit is the largest message perftest moderates completions
// for by default: above it, unless -Q is given, --use_event is on or every
// size runs (-a), it signals every work request (perftest_parameters.c,
// MSG_SIZE_CQ_MOD_LIMIT; ib_write_bw -s 65536 writes a CQE per request).
const CQModSizeLimit = 8192

// DefaultCQModFor is perftest's CQ moderation when -Q is not given, for
// messages of size bytes.
func DefaultCQModFor(size int, useEvent, allSizes bool) int {
	if size > CQModSizeLimit && !useEvent && !allSizes {
		return 1
	}
	return DefaultCQMod
}

// Config is one run of a test.
type Config struct {
	Test  Test
	Size  int // message size in bytes (default Test.DefaultSize)
	Iters int // iterations (default Test.DefaultIters)
	// Duration, if positive, runs a BW test for about that long instead of
	// Iters iterations (perftest's -D); BW peak is then not measured.
	// Latency tests always count iterations.
	Duration time.Duration
	// TxDepth bounds the outstanding work requests of BW tests (default,
	// and at most, the pair's TxDepth).
	TxDepth int
	// CQMod signals one send in CQMod (at most TxDepth; default
	// perftest's, DefaultCQModFor).
	CQMod int
	// UseEvent (perftest's --use_event): a BW test whose window is full
	// sleeps on the CQ's completion event instead of polling, leaving the
	// CPU to the agents (on a small machine they share it).
	UseEvent bool
	// Atomic is the atomic tests' operation (default FetchAndAdd).
	Atomic Atomic
	// Progress, if set, is kept at the iterations completed so far, for
	// a progress display that reads it from another goroutine.
	Progress *atomic.Int64
	// Bidirectional (perftest's -b): write_bw, read_bw and atomic_bw run
	// both ways at once, B toward A as A toward B; the figures are the
	// two directions' sum, as perftest's.
	Bidirectional bool
}

// progress records n iterations done, if c has a Progress counter.
func (c *Config) progress(n int) {
	if c.Progress != nil {
		c.Progress.Store(int64(n))
	}
}

// Result is what a run measured. Bandwidths are MiB/s (2^20 bytes per
// second), message rates Mpps, latencies µs (RTT/2 for write_lat and
// send_lat, the round trip for read_lat and atomic_lat, as perftest
// reports them).
type Result struct {
	Test     Test
	MsgSize  int
	Iters    int
	Elapsed  time.Duration
	PeakSeen bool // BWPeak was measured (iteration mode)

	BWPeak  float64
	BWAvg   float64
	MsgRate float64

	TMin, TMax, TTypical, TAvg, TStdev, P99, P999 float64

	Path vrdma.PathInfo

	perQP []int // BW tests: the requests each QP completed
}

// Run runs one test on the pair, A acting and B passive (write_lat: both
// ping-pong). It fails if a work request fails, the QP leaves RTS, or ctx
// ends.
func (p *Pair) Run(ctx context.Context, c Config) (Result, error) {
	c, err := c.normalize(p.cfg)
	if err != nil {
		return Result{}, err
	}
	var r Result
	switch c.Test {
	case WriteBW, ReadBW, AtomicBW:
		r, err = p.runBW(ctx, c, c.bwOpcode())
	case SendBW:
		r, err = p.runSendBW(ctx, c)
	case WriteLat:
		r, err = p.runWriteLat(ctx, c)
	case ReadLat:
		r, err = runRoundTrip(ctx, c, p.A, p.B.Peer(), vrdma.OpRDMARead)
	case AtomicLat:
		r, err = runRoundTrip(ctx, c, p.A, p.B.Peer(), c.Atomic.opcode())
	case SendLat:
		r, err = p.runSendLat(ctx, c)
	}
	r.Test, r.MsgSize, r.Path = c.Test, c.Size, p.Path()
	return r, err
}

// normalize fills c's defaults and checks it against a side built with
// pc.
func (c Config) normalize(pc PairConfig) (Config, error) {
	if _, err := ParseTest(string(c.Test)); err != nil {
		return c, err
	}
	if c.Size <= 0 {
		c.Size = c.Test.DefaultSize()
	}
	if c.Iters <= 0 {
		c.Iters = c.Test.DefaultIters()
	}
	if c.TxDepth <= 0 || c.TxDepth > pc.TxDepth {
		c.TxDepth = pc.TxDepth
	}
	if c.CQMod <= 0 {
		c.CQMod = DefaultCQModFor(c.Size, c.UseEvent, false)
	}
	c.CQMod = min(c.CQMod, c.TxDepth)
	if c.Test.Atomic() {
		if c.Size != 8 {
			return c, fmt.Errorf("perf: %s moves 8 bytes: -s %d is not allowed", c.Test, c.Size)
		}
		if c.Atomic == "" {
			c.Atomic = FetchAndAdd
		}
		if _, err := ParseAtomic(string(c.Atomic)); err != nil {
			return c, err
		}
	}
	if need := c.Test.BufSize(c.Size); need > pc.BufSize {
		return c, fmt.Errorf("perf: %s of %d bytes needs %d bytes of buffer per side; the pair has %d", c.Test, c.Size, need, pc.BufSize)
	}
	if pc.QPs > 1 && c.Test.Latency() {
		return c, fmt.Errorf("perf: %s runs on one QP; several QPs (-q %d) are for the BW tests, as perftest's", c.Test, pc.QPs)
	}
	if c.Iters > math.MaxInt32 {
		return c, fmt.Errorf("perf: %d iterations: at most %d", c.Iters, math.MaxInt32)
	}
	if c.Bidirectional && c.Test != WriteBW && c.Test != ReadBW && c.Test != AtomicBW {
		return c, fmt.Errorf("perf: -b (bidirectional) runs write_bw, read_bw and atomic_bw; not %s", c.Test)
	}
	if c.Size > math.MaxUint32 {
		return c, fmt.Errorf("perf: message size %d exceeds 4 GiB", c.Size)
	}
	return c, nil
}

// BufSize is the registered buffer a side of t needs for messages of
// size bytes: write_lat's sides send from one half and receive in the
// other.
func (t Test) BufSize(size int) int {
	if t == WriteLat {
		return 2 * size
	}
	return size
}

// spinner is the busy-wait policy of the measuring loops: spin, but every
// 64 turns yield the CPU (sched_yield for the agent process, and Gosched
// for the other side's goroutines when both sides run in this process)
// so that spinners on a small machine do not starve the agent; every 4096
// turns look at ctx and the QP's state. sched_yield is a raw system call:
// it never blocks, and the runtime must not hand this goroutine's P to
// another thread while the kernel runs someone else. A side alone in its
// process (vrdmactl perf as a server or a client) does not call Gosched:
// with idle Ps each call wakes another thread to run the goroutine, and
// write_lat between two such processes took 22 µs instead of 7–10 (with
// 19 context switches per round trip instead of 5–9).
//
// A wait that only the peer's library can end needs no agent: write_lat's
// and send_lat's on the memcpy-direct path (the peer's library writes, or
// puts its SEND in the send channel, wire-local.md §4.22; this library
// completes). sched_yield costs
// 1.35 µs in this VM, and a write arriving while the waiter was inside one
// waited for it (docs/PERF-LOG.md, "memcpy-direct latency: the library's
// per-WR work and the spinner"). So the spinner of such a wait
// (Side.peerSpinner) with a thread of its own (GOMAXPROCS 2 or more)
// spins without yielding for its first directSpinTurns turns after each
// reset, as perftest and ucx_perftest spin; one whose pair's other side
// shares its only thread (vrdmactl perf --local on two cores,
// shareOneCore) hands that thread over at every turn (Gosched), since
// only the other side can end the wait. A wait that lasts longer (a WR
// relayed after all, a descheduled peer) yields as on any path.
type spinner struct {
	ctx     context.Context
	qp      *vrdma.QP
	n       uint32
	gosched bool
	pure    uint32 // turns after a reset that never yield
	handoff bool   // Gosched at every turn
}

// directSpinTurns is how long a spinner of a memcpy-direct QP with a
// thread of its own spins before it starts yielding: 2^12 turns, some
// 5–10 µs here, ten times the path's round trip.
const directSpinTurns = 1 << 12

// spinner returns s's busy-wait policy for ctx.
func (s *Side) spinner(ctx context.Context) spinner {
	return spinner{ctx: ctx, qp: s.QP, gosched: !s.alone}
}

// peerSpinner returns s's busy-wait policy for ctx for waits that only the
// peer's library ends when the QP is on memcpy-direct (write_lat's and
// send_lat's): no agent needs the CPU there.
func (s *Side) peerSpinner(ctx context.Context) spinner {
	sp := s.spinner(ctx)
	if s.QP.Path().Path == vrdma.PathMemcpyDirect {
		if runtime.GOMAXPROCS(0) > 1 {
			sp.pure = directSpinTurns
		} else {
			sp.handoff = sp.gosched
		}
	}
	return sp
}

func (s *spinner) spin() error {
	s.n++
	if s.handoff {
		runtime.Gosched()
	}
	if s.n&63 != 0 || s.n <= s.pure {
		return nil
	}
	unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	if s.gosched && !s.handoff {
		runtime.Gosched()
	}
	if s.n&4095 != 0 {
		return nil
	}
	if err := s.ctx.Err(); err != nil {
		return err
	}
	if st := s.qp.State(); st != vrdma.QPSRTS {
		return fmt.Errorf("QP 0x%x left RTS: it is in %s", s.qp.QPN(), st)
	}
	return nil
}

func (s *spinner) reset() { s.n = 0 }

// completionError describes a failed work completion.
func completionError(wc *vrdma.WorkCompletion) error {
	return fmt.Errorf("work request %d (%s) completed with %s", wc.WRID, wc.Opcode, wc.Status)
}

// bwOpcode is the operation of c's RDMA BW test: write_bw's WRITE,
// read_bw's READ, atomic_bw's atomic.
func (c Config) bwOpcode() vrdma.Opcode {
	switch c.Test {
	case ReadBW:
		return vrdma.OpRDMARead
	case AtomicBW:
		return c.Atomic.opcode()
	}
	return vrdma.OpRDMAWrite
}

// runBW runs the BW loop of op from A to B, and with c.Bidirectional
// from B to A at the same time, adding up the two directions' figures.
func (p *Pair) runBW(ctx context.Context, c Config, op vrdma.Opcode) (Result, error) {
	if !c.Bidirectional {
		return runBW(ctx, c, p.A, p.B.Peer(), op)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var back Result
	var backErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		if back, backErr = runBW(ctx, c, p.B, p.A.Peer(), op); backErr != nil {
			cancel() // the other direction fails too, at once
		}
	}()
	r, err := runBW(ctx, c, p.A, p.B.Peer(), op)
	if err != nil {
		cancel()
	}
	<-done
	if err == nil && backErr != nil {
		err = fmt.Errorf("perf: %s from %s to %s: %w", c.Test, p.B.Name(), p.A.Name(), backErr)
	}
	if err != nil {
		return Result{}, err
	}
	r.add(back)
	return r, nil
}

// add adds the figures of the other direction of a bidirectional run,
// back, to r's.
func (r *Result) add(back Result) {
	r.BWPeak += back.BWPeak
	r.BWAvg += back.BWAvg
	r.MsgRate += back.MsgRate
	r.Elapsed = max(r.Elapsed, back.Elapsed)
}

// runBW is perftest's BW loop: keep up to TxDepth work requests
// outstanding on each of a's QPs (Iters each), signal one in CQMod, and
// count completions on the shared CQ. Bandwidth and message rate are the
// sum over the QPs, as perftest's with -q.
func runBW(ctx context.Context, c Config, a *Side, peer Peer, op vrdma.Opcode) (Result, error) {
	qps := make([]bwQP, len(a.QPs))
	for i := range qps {
		qps[i].iters = c.Iters
	}
	total := c.Iters * len(qps) // requests still to complete, all QPs
	peak := c.Duration <= 0
	// The peak's stamps (peakBW): when each postStamp-th request was
	// posted, all QPs in posting order, and each completion seen. Both
	// are sized for the run and written once before it starts: a page
	// of them touched for the first time inside the loop is a page
	// fault, which in this VM cost a quarter of a 4 KiB write_bw.
	var tposted []int64
	var tdone []doneStamp
	if peak {
		tposted = make([]int64, (total+postStamp-1)/postStamp)
		tdone = make([]doneStamp, len(qps)*(c.Iters/max(c.CQMod, 1)+1))
		clear(tposted)
		clear(tdone)
		tdone = tdone[:0]
	}
	sgl := []vrdma.SGE{a.MR.SGE(0, c.Size)}
	wrs := []vrdma.SendWR{{Opcode: op, SGL: sgl, RemoteAddr: peer.Addr, RKey: peer.RKey, Swap: 1}}
	wc := make([]vrdma.WorkCompletion, 64)
	// Messages that fit the QP's max_inline_data (perftest's -I) are
	// posted inline, as perftest's: WRITEs and SENDs.
	var inline vrdma.SendFlags
	if (op == vrdma.OpRDMAWrite || op == vrdma.OpSend) && c.Size <= int(a.QP.Caps().MaxInlineData) {
		inline = vrdma.SendInline
	}
	sp := a.spinner(ctx)
	posted, completed := 0, 0 // all QPs
	start := time.Now()
	var deadline time.Time
	if !peak {
		deadline = start.Add(c.Duration)
		for i := range qps {
			qps[i].iters = math.MaxInt32
		}
		total = math.MaxInt
	}
	var last time.Duration
	for completed < total {
		for qi := range qps {
			q := &qps[qi]
			for q.posted < q.iters && q.posted-q.completed < c.TxDepth {
				wr := &wrs[0]
				wr.ID = uint64(qi)<<32 | uint64(q.posted)
				wr.Flags = inline
				if (q.posted+1)%c.CQMod == 0 || q.posted+1 == q.iters {
					wr.Flags |= vrdma.SendSignaled
				}
				if peak && posted%postStamp == 0 {
					tposted[posted/postStamp] = int64(time.Since(start))
				}
				if err := a.QPs[qi].PostSend(wrs); err != nil {
					var pe *vrdma.PostError
					if errors.As(err, &pe) && errors.Is(pe.Err, vrdma.ErrQueueFull) {
						break // the agent has not freed the slot yet: poll
					}
					return Result{}, err
				}
				q.posted++
				posted++
				if !peak && q.posted%c.CQMod == 0 && time.Now().After(deadline) {
					// Stop at a signaled request; the run ends when
					// every QP has.
					q.iters = q.posted
					if total == math.MaxInt && stoppedAll(qps) {
						total = posted
					}
				}
			}
		}
		n, err := a.CQ.Poll(wc)
		if err != nil {
			return Result{}, err
		}
		if n == 0 {
			if c.UseEvent && posted-completed >= c.TxDepth*len(qps) {
				if err := a.CQ.Wait(ctx); err != nil {
					return Result{}, fmt.Errorf("perf: %s after %d of %d completions: %w", c.Test, completed, total, err)
				}
				continue
			}
			if err := sp.spin(); err != nil {
				return Result{}, fmt.Errorf("perf: %s after %d of %d completions: %w", c.Test, completed, total, err)
			}
			continue
		}
		sp.reset()
		now := time.Since(start)
		for i := range n {
			if wc[i].Status != vrdma.WCSuccess {
				return Result{}, fmt.Errorf("perf: %s: %w", c.Test, completionError(&wc[i]))
			}
			qi, done := int(wc[i].WRID>>32), int(uint32(wc[i].WRID))+1
			if qi >= len(qps) || done <= qps[qi].completed {
				continue
			}
			completed += done - qps[qi].completed
			qps[qi].completed = done
			if peak {
				tdone = append(tdone, doneStamp{n: completed, t: int64(now)})
			}
		}
		c.progress(completed / len(qps))
		last = now
	}
	r := Result{Iters: completed / len(qps), Elapsed: last, PeakSeen: peak, perQP: make([]int, len(qps))}
	for i := range qps {
		r.perQP[i] = qps[i].completed
	}
	// perftest: average from the first post to the last completion.
	sec := float64(last) / 1e9
	if sec > 0 {
		r.BWAvg = float64(completed) * float64(c.Size) / sec / (1 << 20)
		r.MsgRate = float64(completed) / sec / 1e6
	}
	if peak {
		r.BWPeak = peakBW(tposted, tdone, c.Size)
	}
	return r, nil
}

// bwQP is one QP's counts in runBW.
type bwQP struct{ posted, completed, iters int }

// stoppedAll reports whether every QP of a timed run has its last
// request posted.
func stoppedAll(qps []bwQP) bool {
	for _, q := range qps {
		if q.iters == math.MaxInt32 {
			return false
		}
	}
	return true
}

// runSendBW is perftest's send_bw: B keeps its receive queue full and
// reposts a receive for each one consumed, while A runs the BW loop with
// SENDs. A waits for B to have counted every message. In a timed run (-D)
// B learns how many messages each QP sent once A stops.
func (p *Pair) runSendBW(ctx context.Context, c Config) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready, received := make(chan error, 1), make(chan error, 1)
	var sent chan []int
	if c.Duration > 0 {
		sent = make(chan []int, 1)
	}
	go func() { received <- receiveAll(ctx, p.B, c, ready, sent) }()
	if err := <-ready; err != nil {
		return Result{}, fmt.Errorf("perf: send_bw: %w", err)
	}
	r, err := runBW(ctx, c, p.A, p.B.Peer(), vrdma.OpSend)
	if err != nil {
		cancel()
		<-received
		return r, err
	}
	if sent != nil {
		sent <- r.perQP
	}
	if err := <-received; err != nil {
		return Result{}, fmt.Errorf("perf: send_bw: %w", err)
	}
	return r, nil
}

// receiveAll is send_bw's receiver: it keeps receives posted on each of
// b's QPs (and says so on ready, or why not) and counts the messages,
// c.Iters per QP, or, when sent is not nil (a timed run), as many as the
// counts that come on sent once the sender stopped. It reposts a receive
// for each one consumed, but never more than the messages still to come
// need, once that is known; what a timed run leaves posted, the next run
// counts as posted (Side.recvOut). Receives take the whole buffer, so that
// one left posted fits a later run's messages.
func receiveAll(ctx context.Context, b *Side, c Config, ready chan<- error, sent <-chan []int) error {
	nq := len(b.QPs)
	if b.recvOut == nil {
		b.recvOut = make([]int, nq)
	}
	depth := int(b.QP.Caps().MaxRecvWR)
	var want []int // messages per QP, once known
	if sent == nil {
		depth = min(depth, c.Iters)
		want = make([]int, nq)
		for i := range want {
			want[i] = c.Iters
		}
	}
	sgl := []vrdma.SGE{b.MR.SGE(0, len(b.MR.Bytes()))}
	rwrs := make([]vrdma.RecvWR, depth)
	posted := make([]int, nq) // receives this run may consume, the earlier runs' included
	got := make([]int, nq)
	for qi, q := range b.QPs {
		posted[qi] = b.recvOut[qi]
		k := min(depth-posted[qi], len(rwrs))
		if k <= 0 {
			continue
		}
		for i := range k {
			rwrs[i] = vrdma.RecvWR{ID: uint64(qi), SGL: sgl}
		}
		if err := q.PostRecv(rwrs[:k]); err != nil {
			err = fmt.Errorf("post receives on %s's QP 0x%x: %w", b.Name(), q.QPN(), err)
			ready <- err
			return err
		}
		posted[qi] += k
	}
	defer func() {
		for qi := range posted {
			b.recvOut[qi] = posted[qi] - got[qi]
		}
	}()
	ready <- nil
	done := func() bool {
		if want == nil {
			return false
		}
		for qi := range got {
			if got[qi] < want[qi] {
				return false
			}
		}
		return true
	}
	wc := make([]vrdma.WorkCompletion, 64)
	sp := b.spinner(ctx)
	for !done() {
		if want == nil {
			select {
			case want = <-sent:
				if len(want) != nq {
					return fmt.Errorf("the sender reports %d QPs' counts, the receiver has %d QPs", len(want), nq)
				}
				continue
			default:
			}
		}
		n, err := b.CQ.Poll(wc)
		if err != nil {
			return err
		}
		if n == 0 {
			if err := sp.spin(); err != nil {
				return fmt.Errorf("receiver %s after %v of %v messages: %w", b.Name(), got, want, err)
			}
			continue
		}
		sp.reset()
		// Repost what each QP consumed, one call per QP and poll.
		for i := 0; i < n; {
			qi := int(wc[i].WRID)
			k := 0
			for ; i < n && int(wc[i].WRID) == qi; i++ {
				if wc[i].Status != vrdma.WCSuccess {
					return completionError(&wc[i])
				}
				k++
			}
			if qi >= nq {
				return fmt.Errorf("receive completion with work request ID %d: no such QP", qi)
			}
			got[qi] += k
			if want != nil {
				k = min(k, want[qi]-posted[qi])
			}
			if k = min(k, len(rwrs)); k > 0 {
				for j := range k {
					rwrs[j] = vrdma.RecvWR{ID: uint64(qi), SGL: sgl}
				}
				if err := b.QPs[qi].PostRecv(rwrs[:k]); err != nil {
					return err
				}
				posted[qi] += k
			}
		}
	}
	return nil
}

// postStamp: runBW reads the clock at one post in postStamp (tposted),
// not at each: a clock read costs 40–90 ns in this VM, as much as the
// memcpy-direct path's own work for a 4 KiB WRITE, and perftest's
// get_cycles() is a single instruction.
const postStamp = 8

// doneStamp is a completion runBW saw: n requests complete, at t ns.
type doneStamp struct {
	n int
	t int64
}

// peakBW is perftest's peak: the best rate over any run of requests from
// one posted (i) to one whose completion was seen (j), (j-i+1)×size over
// the time between. Completions are seen at signaled requests only (done);
// i steps by postStamp, the posts that carry a time (tposted[k] is request
// k×postStamp's), and further when the run is long, to bound the work.
func peakBW(tposted []int64, done []doneStamp, size int) float64 {
	step := 1
	for len(tposted)/step*len(done) > 50_000_000 {
		step *= 2
	}
	best := 0.0
	for k := 0; k < len(tposted); k += step {
		i := k * postStamp
		for _, d := range done {
			j := d.n - 1
			if j < i {
				continue
			}
			dt := d.t - tposted[k]
			if dt <= 0 {
				continue
			}
			if bw := float64(j-i+1) * float64(size) / (float64(dt) / 1e9); bw > best {
				best = bw
			}
		}
	}
	return best / (1 << 20)
}

// runWriteLat is perftest's write_lat: A and B ping-pong RDMA WRITEs of
// Size bytes into each other's receive half; each spins on the last byte
// of its receive half changing, and writes after seeing the peer's write.
// A stamps each of its posts; RTT is the time between two stamps.
func (p *Pair) runWriteLat(ctx context.Context, c Config) (Result, error) {
	iters := c.Iters
	for _, s := range []*Side{p.A, p.B} {
		clearLatBytes(s, c.Size)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stamps := make([]int64, iters+1)
	errc := make(chan error, 1)
	go func() {
		err := latSide(ctx, p.B, p.A.Peer(), c, iters, nil)
		if err != nil {
			cancel()
		}
		errc <- err
	}()
	err := latSide(ctx, p.A, p.B.Peer(), c, iters, stamps)
	if err != nil {
		cancel()
	}
	errB := <-errc
	switch {
	case err != nil && errB != nil && !errors.Is(errB, context.Canceled):
		err = fmt.Errorf("perf: %s: %v; passive side %s: %w", c.Test, err, p.B.Name(), errB)
	case err != nil:
		err = fmt.Errorf("perf: %s: %w", c.Test, err)
	case errB != nil:
		err = fmt.Errorf("perf: %s: passive side %s: %w", c.Test, p.B.Name(), errB)
	}
	if err != nil {
		return Result{}, err
	}
	return halfRTT(stamps), nil
}

// clearLatBytes clears the bytes a write_lat side of size watches and
// writes: both sides count from 1, and earlier runs may have left them
// set. Both sides must be cleared before either starts.
func clearLatBytes(s *Side, size int) {
	b := s.MR.Bytes()
	b[size-1], b[2*size-1] = 0, 0
}

// halfRTT is the result of a ping-pong whose active side stamped each
// exchange (and, last, the end of the final one): latencies RTT/2.
func halfRTT(stamps []int64) Result {
	iters := len(stamps) - 1
	rtt := make([]float64, iters)
	for i := range iters {
		rtt[i] = float64(stamps[i+1]-stamps[i]) / 1e3 / 2 // µs, RTT/2
	}
	r := Result{Iters: iters, Elapsed: time.Duration(stamps[iters] - stamps[0])}
	r.TMin, r.TMax, r.TTypical, r.TAvg, r.TStdev, r.P99, r.P999 = latencyStats(rtt)
	return r
}

// latSide runs one side of write_lat: s writes into peer's receive half.
// Write k (1..iters) carries byte(k) in its last byte; the exchange
// alternates strictly, so the byte wrapping around is harmless. With
// stamps, s is the active side: it writes first, stamps each post and,
// last, the arrival of the final answer. Each side waits for a signaled
// write's completion before it waits for the peer's write, as perftest.
func latSide(ctx context.Context, s *Side, peer Peer, c Config, iters int, stamps []int64) error {
	buf := s.MR.Bytes()
	size := c.Size
	sendLast := size - 1   // last byte of our send half
	recvLast := 2*size - 1 // last byte of our receive half, written by the peer
	word := abi.Word(buf, recvLast&^3)
	shift := uint(recvLast&3) * 8
	sp := s.peerSpinner(ctx)
	wait := func(k int) error {
		want := byte(k)
		for byte(word.Load()>>shift) != want {
			if err := sp.spin(); err != nil {
				return fmt.Errorf("waiting for write %d of %d from %s: %w", k, iters, peer.Name, err)
			}
		}
		sp.reset()
		return nil
	}

	flags := vrdma.SendFlags(0)
	if size <= int(s.QP.Caps().MaxInlineData) {
		flags = vrdma.SendInline
	}
	wrs := []vrdma.SendWR{{Opcode: vrdma.OpRDMAWrite, SGL: []vrdma.SGE{s.MR.SGE(0, size)},
		RemoteAddr: peer.Addr + uint64(size), RKey: peer.RKey}}
	wc := make([]vrdma.WorkCompletion, 16)
	signaled := 0 // signaled writes whose completion is still to be polled
	poll := func() error {
		n, err := s.CQ.Poll(wc)
		if err != nil {
			return err
		}
		for i := range n {
			if wc[i].Status != vrdma.WCSuccess {
				return completionError(&wc[i])
			}
			signaled--
		}
		return nil
	}
	active := stamps != nil
	start := time.Now()
	for k := 1; k <= iters; k++ {
		if active {
			stamps[k-1] = int64(time.Since(start))
			c.progress(k - 1)
		} else if err := wait(k); err != nil {
			return err
		}
		buf[sendLast] = byte(k)
		wr := &wrs[0]
		wr.ID = uint64(k)
		wr.Flags = flags
		if k%c.CQMod == 0 || k == iters {
			wr.Flags |= vrdma.SendSignaled
		}
		for {
			err := s.QP.PostSend(wrs)
			if err == nil {
				break
			}
			var pe *vrdma.PostError
			if !errors.As(err, &pe) || !errors.Is(pe.Err, vrdma.ErrQueueFull) {
				return err
			}
			if err := sp.spin(); err != nil {
				return err
			}
		}
		if wr.Flags&vrdma.SendSignaled != 0 {
			signaled++
		}
		// As perftest's write_lat: a signaled write's completion is
		// waited for before the peer's next write (its ACK is on the
		// round trip's path).
		for {
			if err := poll(); err != nil {
				return err
			}
			if signaled == 0 {
				break
			}
			if err := sp.spin(); err != nil {
				return fmt.Errorf("waiting for the completion of write %d of %d: %w", k, iters, err)
			}
		}
		sp.reset()
		if active {
			if err := wait(k); err != nil {
				return err
			}
		}
	}
	if active {
		stamps[iters] = int64(time.Since(start))
	}
	// Drain our signaled completions so the CQ is empty for the next run.
	for signaled > 0 {
		if err := poll(); err != nil {
			return err
		}
		if signaled > 0 {
			if err := sp.spin(); err != nil {
				return err
			}
		}
	}
	return nil
}

// latencyStats returns perftest's latency columns of samples (µs): min,
// max, typical (median), average, standard deviation, 99th and 99.9th
// percentiles.
func latencyStats(v []float64) (tmin, tmax, typical, avg, stdev, p99, p999 float64) {
	if len(v) == 0 {
		return
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	avg = sum / float64(n)
	var sq float64
	for _, x := range s {
		sq += (x - avg) * (x - avg)
	}
	stdev = math.Sqrt(sq / float64(n))
	pct := func(p float64) float64 {
		i := int(math.Ceil(p*float64(n))) - 1
		return s[min(max(i, 0), n-1)]
	}
	return s[0], s[n-1], s[n/2], avg, stdev, pct(0.99), pct(0.999)
}
