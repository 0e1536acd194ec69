// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// The fault harness on every path (docs/RELIABILITY.md,
// "Faults under a ledger"): traffic whose every WR is in a ledger
// (package fault) runs while a fault strikes, then the ledger must be
// clean — each WR completed exactly once, with success or, after a kill,
// the errors a kill may cause; every byte checksummed where it landed; no
// SEND delivered twice, no atomic executed twice — and every process that
// survived must hold no more descriptors, shared-memory mappings or
// goroutines than before.
//
//	TestFault/<path>/<fault>
//
// Paths: memcpy (one in-process agent; an agent process for kill-agent),
// lossy (the tcp path's RC protocol over the in-process test link, whose
// frames are lost, duplicated, reordered or delayed), rdma-loop (the
// RoCEv2 engine sending to itself through a socket that loses, duplicates,
// reorders or delays), and tcp, rdma, rdma-v1 (two vrdmad processes in
// network namespaces joined by a bridge; loss and duplication by nftables
// on the bridge's ports, reordering and delay by a relay that forwards
// between them in the bridge's place (fault.Relay), as this kernel has no
// sch_netem for netem).
// memcpy has no wire: wire faults do not apply to it.
//
// A workload process is this test binary run again with
// fault.WorkloadEnv set: TestMain hands it to fault.WorkloadMain.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/fault"
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/testlink"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/rdma/rdmatest"
)

func TestMain(m *testing.M) {
	if fault.WorkloadRequested() {
		os.Exit(fault.WorkloadMain())
	}
	os.Exit(m.Run())
}

// The traffic of a case: faultWRs WRs (faultWRsRare a round when a fault
// strikes one frame in a thousand, so that it strikes often), at most
// faultWindow in flight, messages of up to faultMaxLen bytes (two packets
// at the path MTU of 1024), the fault injected after faultAt completions.
const (
	faultWRs     = 300
	faultWRsRare = 1000
	faultWindow  = 16
	faultMaxLen  = 2048
	faultAt      = 60
	faultCaseMax = 90 * time.Second
)

// faultLossyRC is the in-process lossy paths' RC attributes: a lost frame
// costs one local ACK timeout, 33.6 ms (see lossyRC).
var faultLossyRC = fault.RC{Timeout: 13, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1}

// faultEnv is one path's hosts, as the cases use them.
type faultEnv struct {
	name string
	path vrdma.PathKind
	rc   fault.RC
	// sockets are the agents' sockets: the survivor's host (A), then the
	// other (B); the same socket twice on one agent.
	sockets [2]string
	// survivors returns the processes whose resources must not grow
	// across a case, the agent at socket B excluded when exceptB.
	survivors func(t *testing.T, exceptB bool) []faultSurvivor
	// cluster, for the cases that need hosts in namespaces.
	c   *testenv.Cluster
	seq atomic.Int32
	// settled, if set, waits before a baseline until the agents' own
	// work left from the case before has ended (lanes still opening).
	settled func(t *testing.T)
}

// faultSurvivor is a process that lives through a fault.
type faultSurvivor struct {
	name string
	snap func() (fault.Resources, error)
	// stacks, if set, returns the process's goroutine profile (debug=1
	// text): taken with the baseline and again when a leak is found, so
	// that the failure names the goroutines gained (fault.StackDiff).
	stacks func() (string, error)
}

// thisProcess is the test process as a survivor: it holds the workloads'
// side of every VM (and, for an in-process agent, the agent).
var thisProcess = faultSurvivor{name: "the test process", snap: func() (fault.Resources, error) {
	return fault.Snapshot(0, func() (int, error) { return runtime.NumGoroutine(), nil })
}, stacks: func() (string, error) {
	var b strings.Builder
	err := pprof.Lookup("goroutine").WriteTo(&b, 1)
	return b.String(), err
}}

// vmName returns a fresh VM name of the env's.
func (e *faultEnv) vmName() string {
	return fmt.Sprintf("f%s%d", strings.ReplaceAll(e.name, "-", ""), e.seq.Add(1))
}

// define defines a fresh VM on host i (0: A, 1: B) and returns its name.
func (e *faultEnv) define(t *testing.T, i int) string {
	t.Helper()
	name := e.vmName()
	vmx := testenv.VMX(testenv.VMOptions{MemMB: 16})
	if e.c != nil {
		vmx = e.c.Hosts[i].VMX(testenv.VMOptions{MemMB: 16})
	}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(e.sockets[i]))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.DefineVM(ctx, name, []byte(vmx)); err != nil {
		t.Fatalf("define VM %s: %v", name, err)
	}
	return name
}

// attach attaches VM name on host i; the caller closes it.
func (e *faultEnv) attach(t *testing.T, i int, name string) *vrdma.VM {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	v, err := vrdma.Open(ctx, name, vrdma.WithSocket(e.sockets[i]))
	if err != nil {
		t.Fatalf("attach VM %s: %v", name, err)
	}
	return v
}

// open defines and attaches a fresh VM on host i; the caller closes it.
func (e *faultEnv) open(t *testing.T, i int) *vrdma.VM {
	t.Helper()
	return e.attach(t, i, e.define(t, i))
}

// baseline snapshots the survivors.
func (e *faultEnv) baseline(t *testing.T, exceptB bool) ([]faultSurvivor, []fault.Resources) {
	t.Helper()
	if e.settled != nil {
		e.settled(t)
	}
	ss := e.survivors(t, exceptB)
	base := make([]fault.Resources, len(ss))
	for i, s := range ss {
		r, err := s.snap()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if s.stacks != nil {
			if r.Stacks, err = s.stacks(); err != nil {
				t.Fatalf("%s: goroutine profile: %v", s.name, err)
			}
		}
		base[i] = r
	}
	return ss, base
}

// checkLeaks fails the test if a survivor holds more than at its
// baseline once things settled (up to 20 s).
func checkLeaks(t *testing.T, ss []faultSurvivor, base []fault.Resources) {
	t.Helper()
	checkLeaksWithin(t, ss, base, 20*time.Second)
}

// checkLeaksWithin is checkLeaks with a bound of its own.
func checkLeaksWithin(t *testing.T, ss []faultSurvivor, base []fault.Resources, bound time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), bound)
	defer cancel()
	for i, s := range ss {
		t0 := time.Now()
		first, firstStacks := "", ""
		if r, err := s.snap(); err == nil {
			first = r.Leaks(base[i])
			if r.Goroutines > base[i].Goroutines && s.stacks != nil && base[i].Stacks != "" {
				if now, err := s.stacks(); err == nil {
					firstStacks = fault.StackDiff(base[i].Stacks, now)
				}
			}
		}
		if err := fault.Settle(ctx, s.name, base[i], s.snap); err != nil {
			t.Error(err)
			if s.stacks != nil && base[i].Stacks != "" {
				if now, err := s.stacks(); err != nil {
					t.Logf("%s: goroutine profile: %v", s.name, err)
				} else {
					t.Logf("%s: goroutines beyond its baseline:\n%s", s.name, fault.StackDiff(base[i].Stacks, now))
				}
			}
		} else if d := time.Since(t0); d > time.Second {
			t.Logf("%s settled after %v; it held at first: %s\n%s", s.name, d.Round(time.Millisecond), first, firstStacks)
		}
	}
}

// faultConfig is a case's traffic.
func faultConfig(seed uint64, wrs int, hook func(done int)) fault.Config {
	return fault.Config{Seed: seed, WRs: wrs, Window: faultWindow, MaxLen: faultMaxLen, Drain: time.Minute,
		Progress: func(done int) {
			if done == faultAt && hook != nil {
				hook(done)
			}
		}}
}

// pairRun runs a case's traffic on a new pair between va and vb: hook
// runs after faultAt completions; then the books are closed and checked
// under policy, and after, if given, looks at the pair before it closes.
// It returns the run's result and the report.
func (e *faultEnv) pairRun(t *testing.T, va, vb *vrdma.VM, seed uint64, wrs int, policy fault.Policy, hook func(p *fault.Pair), after ...func(p *fault.Pair)) (fault.Result, fault.Report) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), faultCaseMax)
	defer cancel()
	l := fault.NewLedger()
	p, err := fault.NewPair(ctx, va, vb, fault.DefaultLayout, e.rc, seed, l)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Close(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("close the pair: %v", err)
		}
	}()
	for _, s := range []*fault.Side{p.A, p.B} {
		if got := s.QP.Path(); got.Path != e.path {
			t.Fatalf("QP 0x%x of VM %s is on path %q (%s), want %q", s.QP.QPN(), s.VM.Name(), got.Path, got.Reason, e.path)
		}
	}
	var h func(int)
	if hook != nil {
		h = func(int) { hook(p) }
	}
	t0 := time.Now()
	res, err := p.Run(ctx, faultConfig(seed, wrs, h))
	if err != nil {
		t.Fatal(err)
	}
	ran := time.Since(t0)
	if err := p.Finish(ctx); err != nil && !errors.Is(err, vrdma.ErrAgentGone) {
		t.Fatal(err)
	}
	rep, err := l.Verify(policy)
	t.Logf("%s: traffic %v, books closed %v later: %s", e.name, ran.Round(time.Millisecond), (time.Since(t0) - ran).Round(time.Millisecond), rep)
	if err != nil {
		t.Error(err)
	}
	for _, f := range after {
		f(p)
	}
	return res, rep
}

// clean runs clean traffic between two fresh VMs on hosts A and B: every
// WR must succeed.
func (e *faultEnv) clean(t *testing.T, seed uint64) {
	t.Helper()
	va, vb := e.open(t, 0), e.open(t, 1)
	defer va.Close()
	defer vb.Close()
	e.pairRun(t, va, vb, seed, faultWRs, fault.Policy{}, nil)
}

// ---- the cases ----

// warm runs clean traffic both ways between two fresh VMs before any
// baseline is taken: the connections an agent keeps with a peer host (or
// its test link) for as long as it runs are open by then, and count as
// the baseline's.
func (e *faultEnv) warm(t *testing.T) {
	t.Helper()
	e.clean(t, 100)
	va, vb := e.open(t, 1), e.open(t, 0)
	e.pairRun(t, va, vb, 101, faultWRs, fault.Policy{}, nil)
	va.Close()
	vb.Close()
}

// caseNone: traffic with no fault; the ledger is clean and nothing leaks.
func caseNone(t *testing.T, e *faultEnv) {
	ss, base := e.baseline(t, false)
	e.clean(t, 1)
	checkLeaks(t, ss, base)
}

// caseStalled: B's responder stops posting receives and polling for
// 300 ms mid-run: A's SENDs meet RNR NAKs (retried forever: rnr_retry 7;
// A's QP counts them) and then complete; every WR succeeds once.
func caseStalled(t *testing.T, e *faultEnv) {
	ss, base := e.baseline(t, false)
	va, vb := e.open(t, 0), e.open(t, 1)
	e.pairRun(t, va, vb, 2, faultWRs, fault.Policy{}, func(p *fault.Pair) { p.Stall(300 * time.Millisecond) }, func(p *fault.Pair) {
		c := qpCounters(t, e.sockets[0], p.A.QP.QPN())
		t.Logf("A's QP: %d RNR NAKs received, %d transport retries", c.RNRNaksReceived, c.TransportRetries)
		if c.RNRNaksReceived == 0 {
			t.Errorf("A's QP 0x%x got no RNR NAK while B posted no receive for 300 ms", p.A.QP.QPN())
		}
	})
	va.Close()
	vb.Close()
	checkLeaks(t, ss, base)
}

// qpCounters reads QP qpn's counters from the agent at socket.
func qpCounters(t *testing.T, socket string, qpn uint32) vrdma.QPCounters {
	t.Helper()
	ag, err := vrdma.DialAgent(t.Context(), vrdma.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	st, err := ag.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.VMs {
		for _, q := range v.QPs {
			if q.QPN == qpn {
				return q.Counters
			}
		}
	}
	t.Fatalf("QP 0x%x is not in the status of the agent at %s", qpn, socket)
	return vrdma.QPCounters{}
}

// workloadPair is a side in a VM of this process (A) connected to a
// side in a workload process (B), with the ledger both record into.
type workloadPair struct {
	va    *vrdma.VM
	a     *fault.Side
	w     *fault.Workload
	l     *fault.Ledger
	nameB string // the workload's VM
}

// startWorkloadPair attaches a fresh VM on host A, starts a workload
// process serving a fresh VM on host B, and connects the two. The
// workload is killed at the end of the test if it still runs.
func (e *faultEnv) startWorkloadPair(t *testing.T, ctx context.Context, seed uint64) *workloadPair {
	t.Helper()
	p := &workloadPair{va: e.open(t, 0), nameB: e.define(t, 1), l: fault.NewLedger()}
	var err error
	if p.a, err = fault.NewSide(ctx, p.va, fault.DefaultLayout, seed); err != nil {
		t.Fatal(err)
	}
	spec := fault.WorkloadSpec{Socket: e.sockets[1], VM: p.nameB, Seed: seed, Layout: fault.DefaultLayout, RC: e.rc}
	if p.w, err = fault.StartWorkload(ctx, exec.Command(os.Args[0], "-test.run=^$"), spec, p.l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.w.Kill)
	if err := p.a.Connect(ctx, p.w.Target.Endpoint, e.rc); err != nil {
		t.Fatal(err)
	}
	if err := p.w.Connect(ctx, p.a.Target()); err != nil {
		t.Fatal(err)
	}
	if got := p.a.QP.Path(); got.Path != e.path {
		t.Fatalf("QP 0x%x is on path %q (%s), want %q", p.a.QP.QPN(), got.Path, got.Reason, e.path)
	}
	return p
}

// finish closes A's books and checks the ledger under policy.
func (p *workloadPair) finish(t *testing.T, ctx context.Context, name string, policy fault.Policy) {
	t.Helper()
	p.l.CloseBooks()
	if err := errors.Join(p.a.Fail(ctx), fault.Drain(ctx, p.a, p.l)); err != nil {
		t.Fatal(err)
	}
	rep, err := p.l.Verify(policy)
	t.Logf("%s: %s", name, rep)
	if err != nil {
		t.Error(err)
	}
	if err := p.a.Close(ctx); err != nil {
		t.Error(err)
	}
	p.va.Close()
}

// caseKillWorkload: B is a workload process, killed (SIGKILL) mid-run.
// A's WRs in flight fail — flushed as the agent tears the dead VM down
// (memcpy), or RETRY_EXC_ERR then flushes (the wire paths) — each exactly
// once; the dead VM attaches again and serves clean traffic; the agents
// and this process leak nothing.
func caseKillWorkload(t *testing.T, e *faultEnv) {
	ss, base := e.baseline(t, false)
	ctx, cancel := context.WithTimeout(t.Context(), faultCaseMax)
	defer cancel()
	const seed = 3
	p := e.startWorkloadPair(t, ctx, seed)
	var killedAt time.Time
	res, err := fault.Run(ctx, p.a, p.w.Target, p.l, faultConfig(seed, faultWRs, func(int) {
		p.w.Kill()
		killedAt = time.Now()
		p.l.Abandon(p.w.Target.Endpoint.QPN, "its workload process was killed")
		p.l.PeerGone(p.a.QP.QPN(), "its peer's workload process was killed")
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("workload %d killed after %d completions; A's last completion %v later", p.w.Pid(), faultAt, time.Since(killedAt).Round(time.Millisecond))
	if !res.Failed {
		t.Errorf("no WR of A failed after its peer's workload was killed with WRs in flight (%+v)", res)
	}
	p.finish(t, ctx, e.name, fault.Lenient)

	// The dead workload's VM attaches again, here, and serves.
	vb := e.attach(t, 1, p.nameB)
	va := e.open(t, 0)
	e.pairRun(t, va, vb, 4, faultWRs, fault.Policy{}, nil)
	va.Close()
	vb.Close()
	checkLeaks(t, ss, base)
}

// caseKillRequester: B is a workload process that drives the traffic at
// A, which responds; B is killed (SIGKILL) mid-run. Every receive of A
// completes once — flushed as the agent tears B's VM down and moves A's
// QP to ERR (memcpy), or at the end when the test closes A's books (the
// wire paths: nothing tells A) — every message delivered once and intact,
// no atomic executed twice; the agents and this process leak nothing.
func caseKillRequester(t *testing.T, e *faultEnv) {
	ss, base := e.baseline(t, false)
	ctx, cancel := context.WithTimeout(t.Context(), faultCaseMax)
	defer cancel()
	const seed = 15
	va := e.open(t, 0)
	nameB := e.define(t, 1)
	l := fault.NewLedger()
	a, err := fault.NewSide(ctx, va, fault.DefaultLayout, seed)
	if err != nil {
		t.Fatal(err)
	}
	spec := fault.WorkloadSpec{Socket: e.sockets[1], VM: nameB, Seed: seed, Layout: fault.DefaultLayout, RC: e.rc,
		Drive: &fault.Drive{WRs: faultWRs, Window: faultWindow, MaxLen: faultMaxLen}}
	w, err := fault.StartWorkload(ctx, exec.Command(os.Args[0], "-test.run=^$"), spec, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Kill)
	if err := a.Connect(ctx, w.Target.Endpoint, e.rc); err != nil {
		t.Fatal(err)
	}
	if got := a.QP.Path(); got.Path != e.path {
		t.Fatalf("QP 0x%x is on path %q (%s), want %q", a.QP.QPN(), got.Path, got.Reason, e.path)
	}
	// A's responder, owned by the case, which waits for it: it ends once
	// A's QP is in ERR and every receive is flushed.
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	respDone := make(chan error, 1)
	go func() { respDone <- fault.Respond(rctx, a, w.Target.Endpoint.QPN, l, nil) }()
	if err := w.Connect(ctx, a.Target()); err != nil {
		t.Fatal(err)
	}
	for w.Completions() < faultAt {
		select {
		case <-ctx.Done():
			t.Fatalf("the workload reported %d completions, want %d before the kill: %v", w.Completions(), faultAt, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	w.Kill()
	t.Logf("workload %d killed after %d completions", w.Pid(), w.Completions())
	// Its WRs still in flight died with it; every SEND it saw complete
	// was received here (A lives), so none is excused.
	l.Abandon(w.Target.Endpoint.QPN, "its workload process was killed")
	l.CloseBooks()
	if err := a.Fail(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-respDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatalf("A's receives did not all complete: %v (%d WRs outstanding)", ctx.Err(), l.Outstanding())
	}
	rep, err := l.Verify(fault.Lenient)
	t.Logf("%s: %s", e.name, rep)
	if err != nil {
		t.Error(err)
	}
	if rep.Verified == 0 {
		t.Error("no WR of the workload's was verified before the kill: the case tested nothing")
	}
	if err := a.Close(ctx); err != nil {
		t.Error(err)
	}
	va.Close()
	checkLeaks(t, ss, base)
}

// caseStoppedWorkload: B is a workload process, stopped (SIGSTOP) for
// 300 ms mid-run and continued: a stalled receiver whose whole process
// stalls. Every WR succeeds once; the workload then finishes cleanly,
// its receives flushed and on record.
func caseStoppedWorkload(t *testing.T, e *faultEnv) {
	ss, base := e.baseline(t, false)
	ctx, cancel := context.WithTimeout(t.Context(), faultCaseMax)
	defer cancel()
	const seed = 12
	p := e.startWorkloadPair(t, ctx, seed)
	var wg sync.WaitGroup
	var stallErr error
	_, err := fault.Run(ctx, p.a, p.w.Target, p.l, faultConfig(seed, faultWRs, func(int) {
		// The staller, owned by the case, which waits for it.
		wg.Go(func() { stallErr = p.w.Stall(300 * time.Millisecond) })
	}))
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if stallErr != nil {
		t.Fatal(stallErr)
	}
	p.l.CloseBooks()
	if err := p.w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	p.finish(t, ctx, e.name, fault.Policy{})
	checkLeaks(t, ss, base)
}

// caseWire runs clean traffic while faults strike the frames — rounds of
// wrs WRs, each on a new pair, until the fault struck at least
// wireMinHits times or after wireMaxRounds — and checks that every WR
// succeeded once with its bytes intact. struck reports how often the
// fault struck so far.
func caseWire(t *testing.T, e *faultEnv, wrs int, struck func() (uint64, string)) {
	ss, base := e.baseline(t, false)
	before, _ := struck()
	va, vb := e.open(t, 0), e.open(t, 1)
	var what string
	for round := 0; ; round++ {
		e.pairRun(t, va, vb, 5+uint64(round), wrs, fault.Policy{}, nil)
		var after uint64
		after, what = struck()
		if after-before >= wireMinHits || round+1 == wireMaxRounds || t.Failed() {
			if after-before < wireMinHits {
				t.Errorf("the fault struck %d times in %d rounds (%s), fewer than %d: the case tested too little", after-before, round+1, what, wireMinHits)
			}
			break
		}
	}
	t.Logf("faults: %s", what)
	va.Close()
	vb.Close()
	checkLeaks(t, ss, base)
}

// A wire fault must strike wireMinHits times during a case's traffic,
// within wireMaxRounds rounds.
const (
	wireMinHits   = 3
	wireMaxRounds = 10
)

// ---- the paths ----

func TestFault(t *testing.T) {
	t.Run("memcpy", func(t *testing.T) {
		env := testenv.Start(t)
		e := inProcessEnv("memcpy", env, vrdma.PathMemcpy, fault.DefaultRC)
		t.Run("none", func(t *testing.T) { caseNone(t, e) })
		t.Run("stalled-receiver", func(t *testing.T) { caseStalled(t, e) })
		t.Run("kill-workload", func(t *testing.T) { caseKillWorkload(t, e) })
		t.Run("kill-requester", func(t *testing.T) { caseKillRequester(t, e) })
		t.Run("stopped-workload", func(t *testing.T) { caseStoppedWorkload(t, e) })
		t.Run("kill-agent", testFaultMemcpyKillAgent)
	})
	t.Run("lossy", func(t *testing.T) {
		for _, f := range wireFaults {
			t.Run(f.name, func(t *testing.T) {
				var tf testlink.Faults
				f.set(&tf.Drop, &tf.Dup, &tf.Reorder, &tf.Delay)
				tf.DelayBy, tf.Seed = 2*time.Millisecond, 31
				env := testenv.StartWith(t, testenv.Options{TestLink: &tf})
				e := inProcessEnv("lossy", env, abi.PathTest, faultLossyRC)
				e.warm(t)
				st := env.TestLinkStats()
				caseWire(t, e, f.wrs, func() (uint64, string) { return f.count(st), st.String() })
			})
		}
		// The other faults, with 1 % of every kind of frame fault beside.
		tf := testlink.Faults{Drop: 0.01, Dup: 0.01, Reorder: 0.01, Delay: 0.01, DelayBy: 2 * time.Millisecond, Seed: 37}
		env := testenv.StartWith(t, testenv.Options{TestLink: &tf})
		e := inProcessEnv("lossy", env, abi.PathTest, faultLossyRC)
		e.warm(t)
		t.Run("stalled-receiver", func(t *testing.T) { caseStalled(t, e) })
		t.Run("kill-workload", func(t *testing.T) { caseKillWorkload(t, e) })
		t.Run("kill-requester", func(t *testing.T) { caseKillRequester(t, e) })
		t.Run("stopped-workload", func(t *testing.T) { caseStoppedWorkload(t, e) })
	})
	t.Run("rdma-loop", func(t *testing.T) {
		for _, f := range wireFaults {
			t.Run(f.name, func(t *testing.T) {
				var tf testlink.Faults
				f.set(&tf.Drop, &tf.Dup, &tf.Reorder, &tf.Delay)
				tf.DelayBy, tf.Seed = 2*time.Millisecond, 41
				st := new(testlink.Stats)
				env := testenv.StartWith(t, testenv.Options{RDMALoop: freeUDP(t),
					RDMALoopConn: func(c rdma.Conn) rdma.Conn { return rdmatest.Faulty(c, tf, st) }})
				e := inProcessEnv("rdma-loop", env, vrdma.PathRDMA, faultLossyRC)
				e.warm(t)
				caseWire(t, e, f.wrs, func() (uint64, string) { return f.count(st), st.String() })
			})
		}
		env := testenv.StartWith(t, testenv.Options{RDMALoop: freeUDP(t)})
		e := inProcessEnv("rdma-loop", env, vrdma.PathRDMA, faultLossyRC)
		e.warm(t)
		t.Run("stalled-receiver", func(t *testing.T) { caseStalled(t, e) })
		t.Run("kill-workload", func(t *testing.T) { caseKillWorkload(t, e) })
		t.Run("kill-requester", func(t *testing.T) { caseKillRequester(t, e) })
		t.Run("stopped-workload", func(t *testing.T) { caseStoppedWorkload(t, e) })
	})
	for _, p := range []struct {
		name string
		path vrdma.PathKind
		o    testenv.ClusterOptions
		args []string
	}{
		{"tcp", vrdma.PathTCP, testenv.ClusterOptions{}, nil},
		// Every message of 1 KiB or more striped over up to 4 lanes.
		{"tcp-lanes", vrdma.PathTCP, testenv.ClusterOptions{}, []string{"--tcp-lanes", "4", "--tcp-stripe-min", "512"}},
		{"rdma", vrdma.PathRDMA, testenv.ClusterOptions{RDMA: true}, nil},
		{"rdma-v1", vrdma.PathRDMA, testenv.ClusterOptions{RDMA: true, RoCEVersion: records.RoCEv1}, nil},
	} {
		t.Run(p.name, func(t *testing.T) { testFaultCluster(t, p.name, p.path, p.o, p.args) })
	}
}

// wireFault is a fault on frames at one rate.
type wireFault struct {
	name string
	wrs  int
	// set sets the fault's probability among drop, dup, reorder, delay.
	set func(drop, dup, reorder, delay *float64)
	// count returns how often the fault struck, from a test link's or a
	// faulty socket's counts.
	count func(st *testlink.Stats) uint64
}

// wireFaults are loss, duplication, reordering and delay at 0.1, 1 and
// 5 % of the frames.
var wireFaults = func() []wireFault {
	var out []wireFault
	kinds := []struct {
		name  string
		pick  func(drop, dup, reorder, delay *float64) *float64
		count func(st *testlink.Stats) uint64
	}{
		{"loss", func(d, _, _, _ *float64) *float64 { return d }, func(st *testlink.Stats) uint64 { return st.Dropped.Load() }},
		{"dup", func(_, d, _, _ *float64) *float64 { return d }, func(st *testlink.Stats) uint64 { return st.Duplicated.Load() }},
		{"reorder", func(_, _, r, _ *float64) *float64 { return r }, func(st *testlink.Stats) uint64 { return st.Reordered.Load() }},
		{"delay", func(_, _, _, d *float64) *float64 { return d }, func(st *testlink.Stats) uint64 { return st.Delayed.Load() }},
	}
	for _, k := range kinds {
		for _, r := range []struct {
			name string
			p    float64
			wrs  int
		}{{"0.1", 0.001, faultWRsRare}, {"1", 0.01, faultWRs}, {"5", 0.05, faultWRs}} {
			out = append(out, wireFault{name: k.name + "-" + r.name, wrs: r.wrs,
				set:   func(drop, dup, reorder, delay *float64) { *k.pick(drop, dup, reorder, delay) = r.p },
				count: k.count})
		}
	}
	return out
}()

// inProcessEnv is an in-process agent's env: both VMs on it, and the test
// process (the agent's) the only survivor.
func inProcessEnv(name string, env *testenv.Env, path vrdma.PathKind, rc fault.RC) *faultEnv {
	return &faultEnv{name: name, path: path, rc: rc, sockets: [2]string{env.Socket, env.Socket},
		survivors: func(*testing.T, bool) []faultSurvivor { return []faultSurvivor{thisProcess} }}
}

// freeUDP returns a UDP address on 127.0.0.1 whose port was free a moment
// ago: an rdma loop's own, clear of concurrent test runs.
func freeUDP(t *testing.T) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// testFaultMemcpyKillAgent kills the agent process (SIGKILL) under a
// running pair: every call of the workloads returns ErrAgentGone, nothing
// hangs, the WRs completed before the death are on record once and the
// rest are abandoned with the agent; this process releases every
// descriptor and mapping of the dead agent's VMs. The agent restarted
// serves again: both VMs attach again (their definitions persisted) and
// run clean traffic, and the new agent leaks nothing across it.
func testFaultMemcpyKillAgent(t *testing.T) {
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	e := &faultEnv{name: "memcpy", path: vrdma.PathMemcpy, rc: fault.DefaultRC, sockets: [2]string{env.Socket, env.Socket},
		survivors: func(*testing.T, bool) []faultSurvivor { return []faultSurvivor{thisProcess} }}
	ss, base := e.baseline(t, false)
	nameA, nameB := e.define(t, 0), e.define(t, 1)
	va, vb := e.attach(t, 0, nameA), e.attach(t, 1, nameB)
	res, _ := e.pairRun(t, va, vb, 6, faultWRs, fault.Lenient, func(p *fault.Pair) {
		env.Kill()
		for _, s := range []*fault.Side{p.A, p.B} {
			p.L.Abandon(s.QP.QPN(), "the agent was killed")
			p.L.PeerGone(s.QP.QPN(), "the agent was killed")
		}
	})
	if !res.AgentGone {
		t.Errorf("the run did not see the agent die: %+v", res)
	}
	va.Close()
	vb.Close()
	checkLeaks(t, ss, base)

	env.Restart(t)
	agent := faultSurvivor{name: "the restarted agent", snap: func() (fault.Resources, error) { return fault.Snapshot(env.PID(t), nil) }}
	ss2 := []faultSurvivor{thisProcess, agent}
	base2 := make([]fault.Resources, len(ss2))
	for i, s := range ss2 {
		r, err := s.snap()
		if err != nil {
			t.Fatal(err)
		}
		base2[i] = r
	}
	va, vb = e.attach(t, 0, nameA), e.attach(t, 1, nameB)
	e.pairRun(t, va, vb, 7, faultWRs, fault.Policy{}, nil)
	va.Close()
	vb.Close()
	checkLeaks(t, ss2, base2)
}

// TestFaultReadReplayInMessage places, on the rdma path, the replay of a
// READ inside the WRITE that follows it — what 5 % of loss, reordering
// or delay does at random (TestFault/rdma-loop/…-5): a READ of one packet
// and a WRITE of two are posted; the READ's response is lost once, and so
// is the WRITE's last packet. The requester times out and sends again
// from the READ: the responder replays the READ (a duplicate) while it
// holds the WRITE's first packet and waits for its last, then takes the
// WRITE's last packet. Both WRs must succeed once and the WRITE's bytes
// be at its target.
func TestFaultReadReplayInMessage(t *testing.T) {
	respTrap, lastTrap := new(rdmatest.Trap), new(rdmatest.Trap)
	env := testenv.StartWith(t, testenv.Options{RDMALoop: freeUDP(t),
		RDMALoopConn: func(c rdma.Conn) rdma.Conn { return rdmatest.Trapped(rdmatest.Trapped(c, respTrap), lastTrap) }})
	e := inProcessEnv("rdma-loop", env, vrdma.PathRDMA, faultLossyRC)
	ctx, cancel := context.WithTimeout(t.Context(), faultCaseMax)
	defer cancel()
	va, vb := e.open(t, 0), e.open(t, 1)
	defer va.Close()
	defer vb.Close()
	const seed = 21
	l := fault.NewLedger()
	p, err := fault.NewPair(ctx, va, vb, fault.DefaultLayout, e.rc, seed, l)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.WithoutCancel(ctx))
	lay := fault.DefaultLayout
	a, b := p.A, p.B
	respTrap.Arm(rocewire.RDMAReadResponseOnly, a.QP.QPN(), 1)
	lastTrap.Arm(rocewire.RDMAWriteLast, b.QP.QPN(), 1)
	const readLen, writeLen = 512, 2048 // one packet, two at MTU 1024
	src := a.MR.Bytes()[lay.OwnOffset(1):][:writeLen]
	fault.Fill(src, seed, 2)
	clear(a.MR.Bytes()[lay.OwnOffset(0):][:readLen])
	if err := a.QP.PostSend([]vrdma.SendWR{
		{ID: 1, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.MR.SGE(lay.OwnOffset(0), readLen)},
			RemoteAddr: b.MR.Addr() + uint64(lay.ReadOffset(0)), RKey: b.MR.RKey()},
		{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.MR.SGE(lay.OwnOffset(1), writeLen)},
			RemoteAddr: b.MR.Addr() + uint64(lay.WriteOffset(0)), RKey: b.MR.RKey()},
	}); err != nil {
		t.Fatal(err)
	}
	wc := make([]vrdma.WorkCompletion, 2)
	for got := 0; got < 2; {
		if err := a.SCQ.Wait(ctx); err != nil {
			t.Fatalf("waiting for the completions (%d of 2): %v", got, err)
		}
		n, err := a.SCQ.Poll(wc[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if respTrap.Dropped() != 1 || lastTrap.Dropped() != 1 {
		t.Fatalf("the traps dropped %d READ responses and %d WRITE last packets, want 1 and 1: the case did not happen", respTrap.Dropped(), lastTrap.Dropped())
	}
	for i, w := range wc {
		if w.WRID != uint64(i+1) || w.Status != vrdma.WCSuccess {
			t.Errorf("completion %d: WR %d %s, want WR %d SUCCESS", i, w.WRID, w.Status, i+1)
		}
	}
	want := make([]byte, lay.SlotSize)
	fault.Fill(want, seed, fault.ReadSlotID(0))
	if got := a.MR.Bytes()[lay.OwnOffset(0):][:readLen]; string(got) != string(want[:readLen]) {
		t.Error("the READ's bytes are not the target's")
	}
	if got := b.MR.Bytes()[lay.WriteOffset(0):][:writeLen]; string(got) != string(src) {
		t.Error("the WRITE completed but its bytes are not at its target")
	}
	if got := b.MR.Bytes()[lay.ReadOffset(0):][:lay.SlotSize]; string(got) != string(want) {
		t.Error("the READ's source changed: the WRITE's bytes went there")
	}
}

// injected is a wire fault in place between the cluster's hosts
// (fault.NetFaults, fault.Relay).
type injected interface {
	Struck(ctx context.Context) (uint64, string, error)
	Remove(ctx context.Context) error
}

// faultMetricsPort is where the cluster agents serve their metrics, each
// on its namespace's own address.
const faultMetricsPort = 9464

// testFaultCluster runs the cases on two vrdmad processes in network
// namespaces (hostA the survivor's, hostB the other's), with more vrdmad
// flags args. With --tcp-lanes, the warm-up must have striped messages
// over lanes each way.
func testFaultCluster(t *testing.T, name string, path vrdma.PathKind, o testenv.ClusterOptions, args []string) {
	o.Hosts, o.Netns = 2, testenv.NetnsOn
	o.ExtraArgs = func(h *testenv.Host) []string {
		return append([]string{"--metrics-listen", netip.AddrPortFrom(h.Addr(), faultMetricsPort).String(), "--metrics-pprof"}, args...)
	}
	c := testenv.StartCluster(t, o)
	ha, hb := c.Hosts[0], c.Hosts[1]
	e := &faultEnv{name: name, path: path, rc: fault.DefaultRC, sockets: [2]string{ha.Socket, hb.Socket}, c: c}
	e.survivors = func(t *testing.T, exceptB bool) []faultSurvivor {
		ss := []faultSurvivor{thisProcess, agentSurvivor(ha)}
		if !exceptB {
			ss = append(ss, agentSurvivor(hb))
		}
		return ss
	}
	e.warm(t)
	if slices.Contains(args, "--tcp-lanes") {
		// Lanes join a connection after it opened: the warm-up again
		// once they have.
		waitLanes(t, ha, hb, 4)
		waitLanes(t, hb, ha, 4)
		e.warm(t)
		// A connection made during a case (a fault closed the one
		// before) carries requests at once; its lanes join it in the
		// background, after the case's traffic perhaps. Its resources
		// are the same group's once they have: the baseline waits for
		// that, and so checks that every connection gets its lanes.
		e.settled = func(t *testing.T) {
			for _, h := range [][2]*testenv.Host{{ha, hb}, {hb, ha}} {
				t0 := time.Now()
				for {
					n := 0 // no uplink yet (an agent restarted): no connection
					for _, u := range agentStatus(t, h[0]).Uplinks {
						if u.PeerHostID == h[1].ID() {
							n = u.Lanes
						}
					}
					if n == 0 || n == 4 { // no connection, or one with every lane
						if d := time.Since(t0); d > 50*time.Millisecond {
							t.Logf("%s → %s: the connection's lanes joined it %v into the baseline", h[0].Name, h[1].Name, d.Round(time.Millisecond))
						}
						break
					}
					if time.Since(t0) > waitTimeout {
						t.Fatalf("%s → %s: a connection with %d lanes of 4 after %v: its lanes do not join it", h[0].Name, h[1].Name, n, waitTimeout)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
		for _, h := range [][2]*testenv.Host{{ha, hb}, {hb, ha}} {
			if u := uplinkTo(t, h[0], h[1]); u.Lanes < 2 || u.StripedBatches == 0 {
				t.Fatalf("%s striped nothing over lanes to %s: %d lanes, %d striped batches", h[0].Name, h[1].Name, u.Lanes, u.StripedBatches)
			}
		}
	}

	ports := []string{ha.SwitchPort(), hb.SwitchPort()}
	wire := func(w fault.Wire) func(ctx context.Context) (injected, error) {
		return func(ctx context.Context) (injected, error) { return fault.ApplyWire(ctx, c.SwitchNetns(), ports, w) }
	}
	queue := func(q fault.Queueing) func(ctx context.Context) (injected, error) {
		q.DelayBy, q.Seed = 2*time.Millisecond, 43
		return func(ctx context.Context) (injected, error) { return fault.StartRelay(ctx, c.SwitchNetns(), ports, q) }
	}
	for _, w := range []struct {
		name   string
		inject func(ctx context.Context) (injected, error)
		wrs    int
	}{
		{"loss-0.1", wire(fault.Wire{Loss: 0.001}), faultWRsRare},
		{"loss-1", wire(fault.Wire{Loss: 0.01}), faultWRs},
		{"loss-5", wire(fault.Wire{Loss: 0.05}), faultWRs},
		{"dup-0.1", wire(fault.Wire{Dup: 0.001}), faultWRsRare},
		{"dup-1", wire(fault.Wire{Dup: 0.01}), faultWRs},
		{"dup-5", wire(fault.Wire{Dup: 0.05}), faultWRs},
		{"reorder-0.1", queue(fault.Queueing{Reorder: 0.001}), faultWRsRare},
		{"reorder-1", queue(fault.Queueing{Reorder: 0.01}), faultWRs},
		{"reorder-5", queue(fault.Queueing{Reorder: 0.05}), faultWRs},
		{"delay-0.1", queue(fault.Queueing{Delay: 0.001}), faultWRsRare},
		{"delay-1", queue(fault.Queueing{Delay: 0.01}), faultWRs},
		{"delay-5", queue(fault.Queueing{Delay: 0.05}), faultWRs},
	} {
		t.Run(w.name, func(t *testing.T) {
			f, err := w.inject(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := f.Remove(context.WithoutCancel(t.Context())); err != nil {
					t.Error(err)
				}
			}()
			caseWire(t, e, w.wrs, func() (uint64, string) {
				n, what, err := f.Struck(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				return n, what
			})
		})
	}
	t.Run("cut", func(t *testing.T) { caseCut(t, e, hb) })
	t.Run("cut-long", func(t *testing.T) { caseCutLong(t, e, ha, hb) })
	t.Run("stalled-receiver", func(t *testing.T) { caseStalled(t, e) })
	t.Run("kill-workload", func(t *testing.T) { caseKillWorkload(t, e) })
	t.Run("kill-requester", func(t *testing.T) { caseKillRequester(t, e) })
	t.Run("stopped-workload", func(t *testing.T) { caseStoppedWorkload(t, e) })
	t.Run("kill-agent", func(t *testing.T) { caseKillAgent(t, e, hb) })
	// Last: the cluster's only etcd member does not come back.
	t.Run("etcd-member-stopped", func(t *testing.T) { caseEtcdStopped(t, e) })
}

// agentSurvivor is h's agent as a survivor: its descriptors and mappings
// from /proc, its goroutines and their stacks from its /debug/pprof/
// (--metrics-pprof), leaving out the goroutines of its HTTP server, which
// come and go with the survivor's own scrapes.
func agentSurvivor(h *testenv.Host) faultSurvivor {
	stacks := func() (string, error) {
		tr := &http.Transport{DisableKeepAlives: true, DialContext: h.Dial}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr, Timeout: waitTimeout}
		url := "http://" + netip.AddrPortFrom(h.Addr(), faultMetricsPort).String() + "/debug/pprof/goroutine?debug=1"
		resp, err := c.Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	return faultSurvivor{name: h.Name + "'s agent", stacks: stacks, snap: func() (fault.Resources, error) {
		return fault.Snapshot(h.Pid(), func() (int, error) {
			p, err := stacks()
			return fault.CountGoroutines(p, "net/http.(*conn).serve"), err
		})
	}}
}

// caseCut cuts host B's link (ip link set eth0 down in its namespace) for
// 150 ms mid-run, less than the QPs' retry budget (67 ms × 7): every WR
// succeeds once, the ones in flight during the cut retried after it.
func caseCut(t *testing.T, e *faultEnv, hb *testenv.Host) {
	ss, base := e.baseline(t, false)
	va, vb := e.open(t, 0), e.open(t, 1)
	var wg sync.WaitGroup
	var cutErr error
	e.pairRun(t, va, vb, 8, faultWRs, fault.Policy{}, func(*fault.Pair) {
		// The cutter, owned by the case: it restores the link and ends;
		// the case waits for it before closing.
		wg.Go(func() {
			ctx := context.WithoutCancel(t.Context())
			if cutErr = fault.SetLink(ctx, hb.Netns, hb.Link, false); cutErr != nil {
				return
			}
			time.Sleep(150 * time.Millisecond)
			cutErr = fault.SetLink(ctx, hb.Netns, hb.Link, true)
		})
	})
	wg.Wait()
	if cutErr != nil {
		t.Fatal(cutErr)
	}
	va.Close()
	vb.Close()
	checkLeaks(t, ss, base)
}

// caseCutLong cuts host B's link for longer than the QPs' retry budget
// (67 ms × 8): A's oldest WR in flight fails with RETRY_EXC_ERR, the rest
// flush, once each. Once the link is back, a new pair runs clean traffic,
// and a connection left half open by the cut is closed within 30 s.
func caseCutLong(t *testing.T, e *faultEnv, ha, hb *testenv.Host) {
	ss, base := e.baseline(t, false)
	va, vb := e.open(t, 0), e.open(t, 1)
	ctx := context.WithoutCancel(t.Context())
	t.Cleanup(func() { fault.SetLink(ctx, hb.Netns, hb.Link, true) })
	res, _ := e.pairRun(t, va, vb, 13, faultWRs, fault.Lenient, func(*fault.Pair) {
		if err := fault.SetLink(ctx, hb.Netns, hb.Link, false); err != nil {
			t.Error(err)
		}
	})
	if !res.Failed {
		t.Errorf("no WR of A failed with the link cut beyond the retry budget (%+v)", res)
	}
	if err := fault.SetLink(ctx, hb.Netns, hb.Link, true); err != nil {
		t.Fatal(err)
	}
	va.Close()
	vb.Close()
	waitReach(t, ha, hb)
	e.clean(t, 14)
	// On the tcp path A closed its connection to B during the cut, and
	// its FIN was lost: B finds its end dead by TCP keepalive (the first
	// probe 15 s after the last traffic; A answers it with a reset), and
	// closes it then.
	checkLeaksWithin(t, ss, base, 30*time.Second)
}

// caseKillAgent kills host B's agent (SIGKILL) under a running pair: A's
// WRs in flight fail once each (RETRY_EXC_ERR, then flushes), B's side
// sees ErrAgentGone; host A's agent and this process leak nothing. B's
// agent restarted serves again: B's VM attaches again and runs clean
// traffic with a new VM on A.
func caseKillAgent(t *testing.T, e *faultEnv, hb *testenv.Host) {
	ss, base := e.baseline(t, true)
	va := e.open(t, 0)
	nameB := e.define(t, 1)
	vb := e.attach(t, 1, nameB)
	res, _ := e.pairRun(t, va, vb, 9, faultWRs, fault.Lenient, func(p *fault.Pair) {
		hb.Kill()
		p.L.Abandon(p.B.QP.QPN(), "its agent was killed")
		p.L.PeerGone(p.A.QP.QPN(), "its peer's agent was killed")
	})
	if !res.Failed {
		t.Errorf("no WR of A failed after B's agent was killed with WRs in flight (%+v)", res)
	}
	va.Close()
	vb.Close()

	t0 := time.Now()
	hb.ExpireLease(t)
	hb.Restart(t)
	e.c.WaitHost(t, hb, records.HostUp, 10*time.Second)
	t.Logf("%s's agent restarted in %v", hb.Name, time.Since(t0).Round(time.Millisecond))
	vb = e.attach(t, 1, nameB)
	va2 := e.open(t, 0)
	e.pairRun(t, va2, vb, 10, faultWRs, fault.Policy{}, nil)
	va2.Close()
	vb.Close()
	checkLeaks(t, ss, base)
}

// caseEtcdStopped stops the cluster's etcd (its only member) mid-run,
// then runs more traffic on the same pair once it is down: connected QPs
// do not need the control plane, so every WR succeeds once. The agents'
// descriptors and mappings must not grow; their goroutines are not
// compared, as an agent keeps trying to reach etcd.
func caseEtcdStopped(t *testing.T, e *faultEnv) {
	ss, base := e.baseline(t, false)
	ctx, cancel := context.WithTimeout(t.Context(), faultCaseMax)
	defer cancel()
	va, vb := e.open(t, 0), e.open(t, 1)
	l := fault.NewLedger()
	const seed = 11
	p, err := fault.NewPair(ctx, va, vb, fault.DefaultLayout, e.rc, seed, l)
	if err != nil {
		t.Fatal(err)
	}
	// The stopper, owned by the case, which waits for it: etcd's
	// shutdown takes seconds, and the traffic goes on meanwhile.
	var wg sync.WaitGroup
	var stopped time.Duration
	t0 := time.Now()
	res, err := p.Run(ctx, faultConfig(seed, faultWRs, func(int) {
		wg.Go(func() {
			s := time.Now()
			e.c.StopEtcd()
			stopped = time.Since(s)
		})
	}))
	if err != nil {
		t.Fatal(err)
	}
	ran := time.Since(t0)
	wg.Wait()
	cfg := faultConfig(seed, faultWRs, nil) // the seed of the pair's read slots
	cfg.FirstID = res.LastID
	t1 := time.Now()
	if _, err := p.Run(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	after := time.Since(t1)
	if err := p.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := l.Verify(fault.Policy{})
	t.Logf("%s: traffic during etcd's stop %v (the stop took %v), after it %v: %s", e.name, ran.Round(time.Millisecond),
		stopped.Round(time.Millisecond), after.Round(time.Millisecond), rep)
	if err != nil {
		t.Error(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Error(err)
	}
	va.Close()
	vb.Close()
	for i := range base {
		base[i].Goroutines = -1
	}
	checkLeaks(t, ss, base)
}
