// SPDX-License-Identifier: Apache-2.0

package perf_test

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/testenv"
)

// newPair starts an in-process agent with two VMs and connects a pair.
func newPair(tb testing.TB, o testenv.VMOptions, cfg perf.PairConfig) *perf.Pair {
	tb.Helper()
	return connectPair(tb, testenv.Start(tb), o, cfg)
}

// connectPair defines two VMs on env and connects a pair.
func connectPair(tb testing.TB, env *testenv.Env, o testenv.VMOptions, cfg perf.PairConfig) *perf.Pair {
	tb.Helper()
	v1 := env.Open(tb, "vm1", o)
	v2 := env.Open(tb, "vm2", o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close(context.Background()) })
	return p
}

func TestCheckOpcodes(t *testing.T) {
	p := newPair(t, testenv.VMOptions{}, perf.PairConfig{})
	if got := p.Path().Path; got != vrdma.PathMemcpy {
		t.Fatalf("path %q, want memcpy", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := p.CheckOpcodes(ctx)
	if len(res) != len(perf.Opcodes) {
		t.Fatalf("%d results, want %d", len(res), len(perf.Opcodes))
	}
	for _, r := range res {
		if r.Err != nil {
			t.Errorf("%s: %v", r.Opcode, r.Err)
		}
	}
}

// TestBuffersHoldData: both sides' buffers start filled with random
// bytes, as perftest's, not with the zeros they were allocated with
// (a copy of zeros runs faster than a copy of data on some machines).
func TestBuffersHoldData(t *testing.T) {
	p := newPair(t, testenv.VMOptions{}, perf.PairConfig{BufSize: 64 << 10})
	for _, s := range []*perf.Side{p.A, p.B} {
		b := s.MR.Bytes()
		zeros := bytes.Count(b, []byte{0})
		// Random bytes: one in 256 is zero, 256 expected here.
		if zeros > len(b)/64 {
			t.Errorf("%s's buffer: %d of %d bytes are zero, want random bytes", s.Name(), zeros, len(b))
		}
	}
	if bytes.Equal(p.A.MR.Bytes(), p.B.MR.Bytes()) {
		t.Error("both sides' buffers hold the same bytes")
	}
}

func TestRun(t *testing.T) {
	p := newPair(t, testenv.VMOptions{}, perf.PairConfig{BufSize: 64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []perf.Config{
		{Test: perf.WriteBW, Size: 4096, Iters: 1000},
		{Test: perf.ReadBW, Size: 4096, Iters: 500, TxDepth: 16, CQMod: 7},
		{Test: perf.WriteBW, Size: 4096, Iters: 1000, TxDepth: 8, UseEvent: true}, // sleeps on the CQ when the window is full
		{Test: perf.WriteBW, Size: 4096, Duration: 50 * time.Millisecond},         // stops at a signaled request: one in 100
		{Test: perf.WriteLat, Size: 8, Iters: 300},
		{Test: perf.WriteLat, Size: 4096, Iters: 300}, // not inline
		{Test: perf.WriteLat, Size: 2, Iters: 600},    // the counter byte wraps
	} {
		r, err := p.Run(ctx, c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		t.Logf("%s %d B × %d: peak %.0f avg %.0f MiB/s %.3f Mpps; lat min %.2f typ %.2f avg %.2f max %.2f µs",
			r.Test, r.MsgSize, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate, r.TMin, r.TTypical, r.TAvg, r.TMax)
		if r.Path.Path != vrdma.PathMemcpy || r.MsgSize != c.Size {
			t.Errorf("result %+v", r)
		}
		if c.Duration == 0 && r.Iters != c.Iters {
			t.Errorf("%d iterations, want %d", r.Iters, c.Iters)
		}
		if c.Test.Latency() {
			if !(r.TMin > 0 && r.TMin <= r.TTypical && r.TTypical <= r.TMax && r.TMin <= r.TAvg && r.P99 <= r.P999 && r.P999 <= r.TMax) {
				t.Errorf("inconsistent latencies %+v", r)
			}
			continue
		}
		if !(r.BWAvg > 0 && r.MsgRate > 0) || math.Abs(r.MsgRate*1e6*float64(r.MsgSize)/(1<<20)-r.BWAvg) > 1e-6*r.BWAvg {
			t.Errorf("inconsistent bandwidth %+v", r)
		}
		if c.Duration == 0 && r.BWPeak < r.BWAvg*0.999 {
			t.Errorf("peak %.1f below average %.1f", r.BWPeak, r.BWAvg)
		}
		if c.Duration > 0 && (r.BWPeak != 0 || r.Iters%perf.DefaultCQModFor(c.Size, c.UseEvent, false) != 0 || r.Iters < 2*perf.DefaultCQMod) {
			t.Errorf("duration run: %+v", r)
		}
	}
}

// TestDefaultCQMod: without -Q, the CQ moderation is perftest's — one
// signaled request in 100, but every request for messages over 8 KiB
// (unless --use_event, or every size runs), as ib_write_bw -s 65536 does.
func TestDefaultCQMod(t *testing.T) {
	for _, c := range []struct {
		size          int
		useEvent, all bool
		want          int
	}{
		{8, false, false, 100}, {8192, false, false, 100}, {8193, false, false, 1}, {65536, false, false, 1},
		{65536, true, false, 100}, {65536, false, true, 100},
	} {
		if got := perf.DefaultCQModFor(c.size, c.useEvent, c.all); got != c.want {
			t.Errorf("DefaultCQModFor(%d, use_event %v, all sizes %v) = %d, want %d", c.size, c.useEvent, c.all, got, c.want)
		}
	}
}

// TestRunManyQPs runs the BW tests over several QP pairs sharing each
// side's CQ (perftest's -q): every QP must complete its iterations for a
// run to end, and the figures are the sum over the QPs.
func TestRunManyQPs(t *testing.T) {
	const qps = 8
	p := newPair(t, testenv.VMOptions{}, perf.PairConfig{BufSize: 4096, TxDepth: 16, QPs: qps})
	if len(p.A.QPs) != qps || len(p.B.QPs) != qps {
		t.Fatalf("%d and %d QPs, want %d", len(p.A.QPs), len(p.B.QPs), qps)
	}
	for i, q := range p.B.QPs {
		if q.State() != vrdma.QPSRTS || q.Path().Path != vrdma.PathMemcpy {
			t.Fatalf("B's QP %d: %s, path %q", i, q.State(), q.Path().Path)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []perf.Config{
		{Test: perf.WriteBW, Size: 4096, Iters: 500},
		{Test: perf.ReadBW, Size: 1024, Iters: 300, CQMod: 7},
		{Test: perf.SendBW, Size: 64, Iters: 700},
		{Test: perf.AtomicBW, Size: 8, Iters: 200},
		{Test: perf.WriteBW, Size: 4096, Duration: 50 * time.Millisecond},
		// A timed send_bw leaves receives posted (the receiver cannot
		// know when the sender stops); the runs after it count them.
		{Test: perf.SendBW, Size: 64, Duration: 50 * time.Millisecond},
		{Test: perf.SendBW, Size: 256, Duration: 30 * time.Millisecond},
		{Test: perf.SendBW, Size: 1024, Iters: 50},
		{Test: perf.SendBW, Size: 8, Iters: 900},
	} {
		r, err := p.Run(ctx, c)
		if err != nil {
			t.Fatalf("%s %d B: %v", c.Test, c.Size, err)
		}
		if c.Duration == 0 && r.Iters != c.Iters {
			t.Errorf("%s: %d iterations, want %d per QP", c.Test, r.Iters, c.Iters)
		}
		if c.Duration > 0 && r.Iters == 0 {
			t.Errorf("%s -D: no iteration", c.Test)
		}
		// The rate counts every QP's messages: Iters × QPs over the time.
		if want := float64(r.Iters*qps) / r.Elapsed.Seconds() / 1e6; c.Duration == 0 && math.Abs(r.MsgRate-want) > 1e-6*want {
			t.Errorf("%s: message rate %.6f Mpps, want %.6f (%d × %d in %v)", c.Test, r.MsgRate, want, r.Iters, qps, r.Elapsed)
		}
	}
	if _, err := p.Run(ctx, perf.Config{Test: perf.WriteLat, Size: 8, Iters: 10}); err == nil {
		t.Error("write_lat on 8 QPs: no error (latency tests run on one QP)")
	}
}

// TestPairMTU connects out of band with a path MTU (perftest's -m): the
// QPs take it, or the adapters' active MTU if that is smaller.
func TestPairMTU(t *testing.T) {
	env := testenv.Start(t)
	v1, v2 := env.Open(t, "vm1", testenv.VMOptions{}), env.Open(t, "vm2", testenv.VMOptions{})
	for _, tc := range []struct{ mtu, want uint32 }{{512, 512}, {256, 256}, {4096, 1024}} {
		p, err := perf.Connect(context.Background(), v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{MTU: tc.mtu})
		if err != nil {
			t.Fatalf("-m %d: %v", tc.mtu, err)
		}
		defer p.Close(context.Background())
		for _, s := range []*perf.Side{p.A, p.B} {
			qi, err := s.QP.Query(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if qi.Attr.PathMTU != tc.want || s.QP.State() != vrdma.QPSRTS {
				t.Errorf("-m %d: %s's QP has path MTU %d in %s, want %d in RTS", tc.mtu, s.Name(), qi.Attr.PathMTU, s.QP.State(), tc.want)
			}
		}
		if _, err := p.Run(context.Background(), perf.Config{Test: perf.ReadBW, Size: 4096, Iters: 100}); err != nil {
			t.Errorf("-m %d: %v", tc.mtu, err)
		}
	}
	for _, cfg := range []perf.PairConfig{{MTU: 1000}, {QPs: perf.MaxQPs + 1}, {QPs: 1024, TxDepth: 128}} {
		if _, err := perf.Connect(context.Background(), nil, nil, cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}

func TestRunRefusesSmallBuffer(t *testing.T) {
	p := newPair(t, testenv.VMOptions{}, perf.PairConfig{BufSize: 4096})
	if _, err := p.Run(context.Background(), perf.Config{Test: perf.WriteLat, Size: 4096, Iters: 10}); err == nil {
		t.Fatal("write_lat of 4096 B on 4096-byte buffers: no error")
	}
}

func benchmark(b *testing.B, c perf.Config, async bool) {
	need := c.Size
	if c.Test.Latency() {
		need *= 2
	}
	// The agent runs as its own process, as in production: in this
	// process its goroutines would compete for the Go scheduler with the
	// two spinning workload sides, which distorts latency.
	env := testenv.StartProcess(b, testenv.ProcessOptions{})
	p := connectPair(b, env, testenv.VMOptions{MemMB: need>>20 + 2, Async: async}, perf.PairConfig{BufSize: need, MaxInline: 220})
	runBenchmark(b, p, c)
}

// runBenchmark warms pair p up — both guest memories faulted in, in the
// agents and here, and the path in its steady state — then runs c for
// b.N iterations (at least 100) and reports perftest's figure for it.
func runBenchmark(b *testing.B, p *perf.Pair, c perf.Config) {
	w := c
	w.Iters = max(200, min(5000, (256<<20)/max(c.Size, 1)))
	if _, err := p.Run(context.Background(), w); err != nil {
		b.Fatal(err)
	}
	c.Iters = max(b.N, 100)
	b.ResetTimer()
	r, err := p.Run(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	reportResult(b, c, r)
}

// reportResult reports run c's figures r as the benchmark's metrics.
func reportResult(b *testing.B, c perf.Config, r perf.Result) {
	b.SetBytes(int64(c.Size))
	switch {
	case c.Test.Latency():
		b.ReportMetric(r.TTypical, "µs-typical")
		b.ReportMetric(r.TAvg, "µs-avg")
	case c.Test == perf.SendBW:
		b.ReportMetric(r.MsgRate, "Mpps")
	default:
		b.ReportMetric(r.BWAvg, "MiB/s")
	}
}

// The benchmarks of the memcpy path, beside the physical limit of one
// copy per byte: plain copy() of the same sizes on one core. Compare the
// "MiB/s" metrics (2^20 bytes per second, perftest's unit) of
// BenchmarkWriteBW and BenchmarkCopy at each size.
var bwSizes = []struct {
	name string
	size int
}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"64MiB", 64 << 20}}

// BenchmarkCopy is the baseline: copy() between two buffers of the size,
// on one core, buffers reused as the RDMA benchmarks reuse theirs.
func BenchmarkCopy(b *testing.B) {
	for _, sz := range bwSizes {
		b.Run(sz.name, func(b *testing.B) {
			benchCopy(b, make([]byte, sz.size), make([]byte, sz.size))
		})
	}
}

// benchCopy times copy(dst, src), reporting MiB/s as the RDMA benchmarks do.
// src holds data, not zeros, as vrdmactl perf's buffers do: at 1 MiB, where
// Go's memmove uses non-temporal stores, a copy of zeros runs nearly twice
// as fast here.
func benchCopy(b *testing.B, dst, src []byte) {
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src)
	b.SetBytes(int64(len(src)))
	b.ResetTimer()
	for b.Loop() {
		copy(dst, src)
	}
	b.ReportMetric(float64(len(src))*float64(b.N)/b.Elapsed().Seconds()/(1<<20), "MiB/s")
}

// BenchmarkCopyMemfd is copy() between two shared memfd mappings, the
// kind of memory guest memory is (4 KiB shmem pages, unlike the Go heap,
// which the runtime backs with transparent huge pages): the physical limit
// of the memcpy path.
func BenchmarkCopyMemfd(b *testing.B) {
	for _, sz := range bwSizes {
		b.Run(sz.name, func(b *testing.B) {
			var bufs [2][]byte
			for i := range bufs {
				fd, err := sys.Memfd("bench", int64(sz.size))
				if err != nil {
					b.Fatal(err)
				}
				m, err := sys.Map(fd.Int(), sz.size, true)
				fd.Close()
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { m.Unmap() })
				bufs[i] = m.Bytes()
			}
			benchCopy(b, bufs[1], bufs[0])
		})
	}
}

// BenchmarkWriteBW is perftest's write_bw over the memcpy path: 128
// outstanding RDMA WRITEs, one signaled in 100.
func BenchmarkWriteBW(b *testing.B) {
	for _, sz := range bwSizes {
		b.Run(sz.name, func(b *testing.B) { benchmark(b, perf.Config{Test: perf.WriteBW, Size: sz.size}, false) })
	}
}

// BenchmarkReadBW is perftest's read_bw over the memcpy path.
func BenchmarkReadBW(b *testing.B) {
	for _, sz := range bwSizes[1:3] {
		b.Run(sz.name, func(b *testing.B) { benchmark(b, perf.Config{Test: perf.ReadBW, Size: sz.size}, false) })
	}
}

// BenchmarkWriteLat is perftest's write_lat with 8-byte messages (RTT/2),
// in doorbell and async modes.
func BenchmarkWriteLat(b *testing.B) {
	b.Run("8B/doorbell", func(b *testing.B) { benchmark(b, perf.Config{Test: perf.WriteLat, Size: 8}, false) })
	b.Run("8B/async", func(b *testing.B) { benchmark(b, perf.Config{Test: perf.WriteLat, Size: 8}, true) })
}

// directBenchmark runs c over the memcpy-direct path: two VMs of an
// agent process that list each other in vrdma.directPeers, so that the
// library executes the WRITEs itself.
func directBenchmark(b *testing.B, c perf.Config) {
	need := c.Size
	if c.Test.Latency() {
		need *= 2
	}
	env := testenv.StartProcess(b, testenv.ProcessOptions{})
	o1 := testenv.VMOptions{MemMB: need>>20 + 2, DirectPeers: []string{"vm2"}}
	o2 := o1
	o2.DirectPeers = []string{"vm1"}
	v1, v2 := env.Open(b, "vm1", o1), env.Open(b, "vm2", o2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{BufSize: need, MaxInline: 220})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	if got := p.Path().Path; got != vrdma.PathMemcpyDirect {
		b.Fatalf("path %q (%s), want memcpy-direct", got, p.Path().Reason)
	}
	runBenchmark(b, p, c)
}

// BenchmarkDirectWriteLat is write_lat with 8-byte messages over the
// memcpy-direct path: compare with BenchmarkWriteLat/8B/doorbell, the
// relayed path.
func BenchmarkDirectWriteLat(b *testing.B) {
	b.Run("8B", func(b *testing.B) { directBenchmark(b, perf.Config{Test: perf.WriteLat, Size: 8}) })
}

// BenchmarkDirectSendLat is send_lat with 8-byte messages over the
// memcpy-direct path, whose SENDs go through the send channel
// (wire-local.md §4.22): compare with BenchmarkSendLat's relayed figure.
func BenchmarkDirectSendLat(b *testing.B) {
	b.Run("8B", func(b *testing.B) { directBenchmark(b, perf.Config{Test: perf.SendLat, Size: 8}) })
}

// BenchmarkDirectWriteBW is write_bw over the memcpy-direct path:
// compare with BenchmarkWriteBW.
func BenchmarkDirectWriteBW(b *testing.B) {
	for _, sz := range bwSizes {
		b.Run(sz.name, func(b *testing.B) { directBenchmark(b, perf.Config{Test: perf.WriteBW, Size: sz.size}) })
	}
}

// BenchmarkSendRate is perftest's send_bw with 8-byte messages: the
// message rate (Mpps).
func BenchmarkSendRate(b *testing.B) {
	b.Run("8B/doorbell", func(b *testing.B) { benchmark(b, perf.Config{Test: perf.SendBW, Size: 8}, false) })
	b.Run("8B/async", func(b *testing.B) { benchmark(b, perf.Config{Test: perf.SendBW, Size: 8}, true) })
}

// TestRunBidirectional runs write_bw, read_bw and atomic_bw with -b: the
// agent's counters show each side's QP completed the iterations toward
// the other (one way only without -b), and the figures are consistent.
func TestRunBidirectional(t *testing.T) {
	env := testenv.Start(t)
	p := connectPair(t, env, testenv.VMOptions{}, perf.PairConfig{BufSize: 64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	// ops returns how many op work requests each VM's QP completed.
	ops := func(op string) map[string]uint64 {
		st, err := ag.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for _, v := range st.VMs {
			for _, q := range v.QPs {
				out[v.Name] += q.Counters.Ops[op]
			}
		}
		return out
	}
	const iters = 400
	for _, c := range []struct {
		cfg perf.Config
		op  string
	}{
		{perf.Config{Test: perf.WriteBW, Size: 4096, Iters: iters, Bidirectional: true}, "RDMA_WRITE"},
		{perf.Config{Test: perf.ReadBW, Size: 4096, Iters: iters, Bidirectional: true}, "RDMA_READ"},
		{perf.Config{Test: perf.AtomicBW, Size: 8, Iters: iters, Bidirectional: true}, "ATOMIC_FETCH_AND_ADD"},
		{perf.Config{Test: perf.WriteBW, Size: 4096, Iters: iters}, "RDMA_WRITE"},
	} {
		before := ops(c.op)
		r, err := p.Run(ctx, c.cfg)
		if err != nil {
			t.Fatalf("%+v: %v", c.cfg, err)
		}
		after := ops(c.op)
		a, b := after["vm1"]-before["vm1"], after["vm2"]-before["vm2"]
		t.Logf("%s -b=%v: %d and %d %s; avg %.0f MiB/s %.3f Mpps", r.Test, c.cfg.Bidirectional, a, b, c.op, r.BWAvg, r.MsgRate)
		wantB := uint64(0)
		if c.cfg.Bidirectional {
			wantB = iters
		}
		if a != iters || b != wantB {
			t.Errorf("%s -b=%v: vm1's QP completed %d %s, vm2's %d; want %d and %d", r.Test, c.cfg.Bidirectional, a, c.op, b, iters, wantB)
		}
		if !(r.BWAvg > 0) || math.Abs(r.MsgRate*1e6*float64(r.MsgSize)/(1<<20)-r.BWAvg) > 1e-6*r.BWAvg || r.BWPeak < r.BWAvg*0.999 {
			t.Errorf("inconsistent bandwidth %+v", r)
		}
	}
	if _, err := p.Run(ctx, perf.Config{Test: perf.SendBW, Bidirectional: true}); err == nil || !strings.Contains(err.Error(), "-b (bidirectional)") {
		t.Errorf("send_bw -b: %v, want a refusal", err)
	}
}
