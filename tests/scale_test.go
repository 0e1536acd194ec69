// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Scale: 1,024 connected RC QPs in one agent, traffic on every
// one of them, on the memcpy and tcp paths, in doorbell and async mode.
// TestScaleQPs checks what must hold — every WR completes, byte-exact, and
// the agent runs on a bounded number of OS threads, counted from /proc —
// and BenchmarkScale records the figures (aggregate bandwidth and message
// rate, threads, memory per QP, idle CPU) for docs/PERF-LOG.md.

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

const (
	scaleQPsPerVM = 256 // 4 VMs × 256 = 1,024 QPs in each agent
	scaleVMs      = 4
	scaleBlock    = 4 << 10 // each WRITE
	scaleDepth    = 4       // WRITEs posted per QP per round
	// scaleMaxThreads is the target: an agent with 1,024 QPs, busy or idle,
	// runs on at most this many OS threads (one per QP before).
	scaleMaxThreads = 64
)

// scaleSide is one VM's half of the links: its QPs share one CQ.
type scaleSide struct {
	vm  *vrdma.VM
	cq  *vrdma.CQ
	mr  *vrdma.MR // scaleQPsPerVM blocks of scaleDepth × scaleBlock
	qps []*vrdma.QP
}

// scaleRun is a set of VMs on one or two agents, connected QP by QP.
type scaleRun struct {
	agents []*testenv.Env // the agents whose QPs are counted
	from   []*scaleSide   // requesters: from[i].qps[k] writes to to[i].qps[k]
	to     []*scaleSide
}

// startScale builds the run for path ("memcpy": four VMs on one agent
// process, two pairs of VMs; "tcp": four VMs on each of two hosts, every
// QP of host A connected to one of host B).
func startScale(tb testing.TB, path string, async bool) *scaleRun {
	tb.Helper()
	r := &scaleRun{}
	vmOpts := testenv.VMOptions{MemMB: 16, Async: async}
	switch path {
	case "memcpy":
		env := testenv.StartProcess(tb, testenv.ProcessOptions{})
		r.agents = []*testenv.Env{env}
		for i := range scaleVMs / 2 {
			r.from = append(r.from, newScaleSide(tb, env.Open(tb, fmt.Sprintf("sa%d", i), vmOpts)))
			r.to = append(r.to, newScaleSide(tb, env.Open(tb, fmt.Sprintf("sb%d", i), vmOpts)))
		}
	case "tcp":
		c := testenv.StartCluster(tb, testenv.ClusterOptions{Hosts: 2})
		r.agents = []*testenv.Env{c.Hosts[0].Env, c.Hosts[1].Env}
		for i := range scaleVMs {
			r.from = append(r.from, newScaleSide(tb, c.Hosts[0].Open(tb, fmt.Sprintf("sa%d", i), vmOpts)))
			r.to = append(r.to, newScaleSide(tb, c.Hosts[1].Open(tb, fmt.Sprintf("sb%d", i), vmOpts)))
		}
	}
	// Connect, eight links at a time.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	sem := make(chan struct{}, 8)
	for i := range r.from {
		for k := range scaleQPsPerVM {
			a, b := r.from[i].qps[k], r.to[i].qps[k]
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
				defer cancel()
				if err := a.ConnectTo(ctx, b.Endpoint()); err != nil {
					errs <- err
				} else if err := b.ConnectTo(ctx, a.Endpoint()); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	want := vrdma.PathKind(path)
	for _, s := range r.from {
		for _, q := range s.qps {
			if p := q.Path(); p.Path != want {
				tb.Fatalf("QP 0x%x took path %q (%s), want %q", q.QPN(), p.Path, p.Reason, want)
			}
		}
	}
	return r
}

func newScaleSide(tb testing.TB, vm *vrdma.VM) *scaleSide {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	ad := vm.Adapters()[0]
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	cq, err := ad.CreateCQ(ctx, scaleQPsPerVM*scaleDepth)
	if err != nil {
		tb.Fatal(err)
	}
	buf, err := vm.Alloc(scaleQPsPerVM * scaleDepth * scaleBlock)
	if err != nil {
		tb.Fatal(err)
	}
	mr, err := pd.RegMR(ctx, buf, vrdma.AccessAll)
	if err != nil {
		tb.Fatal(err)
	}
	s := &scaleSide{vm: vm, cq: cq, mr: mr}
	caps := vrdma.QPCaps{MaxSendWR: 2 * scaleDepth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	for range scaleQPsPerVM {
		q, err := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: caps})
		if err != nil {
			tb.Fatal(err)
		}
		s.qps = append(s.qps, q)
	}
	return s
}

// round posts scaleDepth WRITEs on every requester QP, with a fresh
// pattern (seed), and waits for every completion. It returns the bytes
// and messages moved.
func (r *scaleRun) round(tb testing.TB, seed uint64) (bytesMoved, msgs int64) {
	tb.Helper()
	for i, s := range r.from {
		fill(s.mr.Bytes(), seed+uint64(i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(r.from))
	for i, s := range r.from {
		dst := r.to[i].mr
		wg.Go(func() {
			wrs := make([]vrdma.SendWR, scaleDepth)
			for k, q := range s.qps {
				for d := range wrs {
					o := (k*scaleDepth + d) * scaleBlock
					wrs[d] = vrdma.SendWR{ID: uint64(k*scaleDepth + d), Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
						SGL: sgl(s.mr.SGE(o, scaleBlock)), RemoteAddr: off(dst, o), RKey: dst.RKey()}
				}
				if err := q.PostSend(wrs); err != nil {
					errs <- err
					return
				}
			}
			if err := s.reap(ctx, len(s.qps)*scaleDepth); err != nil {
				errs <- fmt.Errorf("VM %s: %w", s.vm.Name(), err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	for i, s := range r.from {
		if !bytes.Equal(s.mr.Bytes(), r.to[i].mr.Bytes()) {
			tb.Fatalf("VM %s: the WRITEs' target differs from their source", r.to[i].vm.Name())
		}
	}
	n := int64(len(r.from) * scaleQPsPerVM * scaleDepth)
	return n * scaleBlock, n
}

// reap polls s's CQ until n successful completions, each WR once.
func (s *scaleSide) reap(ctx context.Context, n int) error {
	seen := make(map[[2]uint64]bool, n)
	wc := make([]vrdma.WorkCompletion, 64)
	for len(seen) < n {
		k, err := s.cq.Poll(wc)
		if err != nil {
			return err
		}
		for _, w := range wc[:k] {
			id := [2]uint64{uint64(w.QPNum), w.WRID}
			if w.Status != vrdma.WCSuccess || seen[id] {
				return fmt.Errorf("completion %s: failed or duplicate", fmtWC(w))
			}
			seen[id] = true
		}
		if k == 0 {
			if err := s.cq.Wait(ctx); err != nil {
				return fmt.Errorf("%d of %d completions: %w", len(seen), n, err)
			}
		}
	}
	return nil
}

// threadSampler records the most OS threads each agent had while it ran.
type threadSampler struct {
	peak []atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func (r *scaleRun) sampleThreads(tb testing.TB) *threadSampler {
	ts := &threadSampler{peak: make([]atomic.Int64, len(r.agents)), stop: make(chan struct{}), done: make(chan struct{})}
	sample := func() {
		for i, e := range r.agents {
			if n := e.ProcStatus(tb, "Threads"); n > ts.peak[i].Load() {
				ts.peak[i].Store(n)
			}
		}
	}
	sample()
	go func() {
		defer close(ts.done)
		for {
			select {
			case <-ts.stop:
				return
			case <-time.After(2 * time.Millisecond):
				sample()
			}
		}
	}()
	return ts
}

func (ts *threadSampler) end() []int64 {
	close(ts.stop)
	<-ts.done
	out := make([]int64, len(ts.peak))
	for i := range ts.peak {
		out[i] = ts.peak[i].Load()
	}
	return out
}

var scaleModes = []struct {
	path  string
	async bool
}{{"memcpy", false}, {"memcpy", true}, {"tcp", false}, {"tcp", true}}

func scaleName(path string, async bool) string {
	if async {
		return path + "/async"
	}
	return path + "/doorbell"
}

// TestScaleQPs: 1,024 connected QPs in an agent, WRITEs on every one of
// them (each completing once, byte-exact), and the agent on at most
// scaleMaxThreads OS threads throughout — busy and idle.
func TestScaleQPs(t *testing.T) {
	for _, m := range scaleModes {
		t.Run(scaleName(m.path, m.async), func(t *testing.T) {
			r := startScale(t, m.path, m.async)
			ts := r.sampleThreads(t)
			for i := range 3 {
				r.round(t, uint64(i)*7)
			}
			time.Sleep(50 * time.Millisecond) // idle: every QP goroutine parks
			peak := ts.end()
			for i, e := range r.agents {
				idle := e.ProcStatus(t, "Threads")
				t.Logf("agent %d: %d QPs, peak %d OS threads, %d idle, RSS %d KiB", i, scaleVMs*scaleQPsPerVM, peak[i], idle,
					e.ProcStatus(t, "VmRSS"))
				if peak[i] > scaleMaxThreads {
					t.Errorf("agent %d ran %d QPs on %d OS threads at the peak, want at most %d", i, scaleVMs*scaleQPsPerVM, peak[i], scaleMaxThreads)
				}
			}
		})
	}
}

// BenchmarkScale moves WRITEs over 1,024 QPs per agent and reports the
// aggregate bandwidth and message rate, the agents' peak threads, their
// memory per QP, and their CPU in the second after the traffic stops.
func BenchmarkScale(b *testing.B) {
	for _, m := range scaleModes {
		b.Run(scaleName(m.path, m.async), func(b *testing.B) {
			r := startScale(b, m.path, m.async)
			r.round(b, 1) // warm up: connections, pages
			// Memory per QP: the agents' whole resident memory (guest
			// memory of their VMs included) over their QPs, an upper bound.
			var rss int64
			for _, e := range r.agents {
				rss += e.ProcStatus(b, "VmRSS")
			}
			ts := r.sampleThreads(b)
			var moved, msgs int64
			b.ResetTimer()
			start := time.Now()
			i := uint64(0)
			for b.Loop() {
				i++
				n, k := r.round(b, i)
				moved += n
				msgs += k
			}
			el := time.Since(start)
			b.StopTimer()
			peak := ts.end()
			var cpu0 time.Duration
			for _, e := range r.agents {
				cpu0 += e.CPUTime(b)
			}
			time.Sleep(time.Second)
			var cpu1 time.Duration
			var maxThreads int64
			for j, e := range r.agents {
				cpu1 += e.CPUTime(b)
				maxThreads = max(maxThreads, peak[j])
			}
			b.ReportMetric(float64(moved)/el.Seconds()/(1<<20), "MiB/s")
			b.ReportMetric(float64(msgs)/el.Seconds(), "msg/s")
			b.ReportMetric(float64(maxThreads), "threads")
			b.ReportMetric(float64(rss)/float64(len(r.agents)*scaleVMs*scaleQPsPerVM), "KiB-RSS/QP")
			b.ReportMetric(100*(cpu1-cpu0).Seconds()/float64(len(r.agents)), "idle-CPU-%/agent")
		})
	}
}
