package perf_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// newPair starts an in-process agent with two VMs and connects a pair.
func newPair(tb testing.TB, o testenv.VMOptions, cfg perf.PairConfig) *perf.Pair {
	tb.Helper()
	env := testenv.Start(tb)
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

func TestRun(t *testing.T) {
	p := newPair(t, testenv.VMOptions{}, perf.PairConfig{BufSize: 64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []perf.Config{
		{Test: perf.WriteBW, Size: 4096, Iters: 1000},
		{Test: perf.ReadBW, Size: 4096, Iters: 500, TxDepth: 16, CQMod: 7},
		{Test: perf.WriteBW, Size: 65536, Duration: 50 * time.Millisecond},
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
		if c.Duration > 0 && (r.BWPeak != 0 || r.Iters%perf.DefaultCQMod != 0) {
			t.Errorf("duration run: %+v", r)
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
	p := newPair(b, testenv.VMOptions{MemMB: need>>20 + 2, Async: async}, perf.PairConfig{BufSize: need, MaxInline: 220})
	c.Iters = max(b.N, 100)
	b.ResetTimer()
	r, err := p.Run(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(c.Size))
	if c.Test.Latency() {
		b.ReportMetric(r.TTypical, "µs-typical")
	} else {
		b.ReportMetric(r.BWAvg, "MiB/s")
	}
}

func BenchmarkWriteBW64K(b *testing.B) {
	benchmark(b, perf.Config{Test: perf.WriteBW, Size: 64 << 10}, false)
}
func BenchmarkWriteBW1M(b *testing.B) {
	benchmark(b, perf.Config{Test: perf.WriteBW, Size: 1 << 20}, false)
}
func BenchmarkReadBW64K(b *testing.B) {
	benchmark(b, perf.Config{Test: perf.ReadBW, Size: 64 << 10}, false)
}
func BenchmarkWriteLat8(b *testing.B) { benchmark(b, perf.Config{Test: perf.WriteLat, Size: 8}, false) }
func BenchmarkWriteLat8Async(b *testing.B) {
	benchmark(b, perf.Config{Test: perf.WriteLat, Size: 8}, true)
}
