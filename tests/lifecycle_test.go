// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Lifecycle and crash tests: workloads that exit, are killed or close their
// VM; an agent that is killed; per-VM limits; the memory-lock limit; and
// hostile workloads that speak the raw protocol and scribble on their rings.
//
// The crash tests kill real processes. A child workload is this test binary
// run again with VRDMA_TEST_HELPER set (see TestLifecycleHelperProcess); a
// real agent process is vrdmad built from this module (testenv.StartProcess).
//
// Helpers here carry an "lc" prefix: the package's other test files share
// their namespace.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/libdiag"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/testenv"
)

// helperEnv names the child process to run, in the test binary re-run.
const lcHelperEnv = "VRDMA_TEST_HELPER"

// TestLifecycleHelperProcess is not a test: it is the body of the child
// processes that the crash tests start, this test binary re-run with
// VRDMA_TEST_HELPER set. Run as part of the suite it does nothing.
func TestLifecycleHelperProcess(t *testing.T) {
	switch h := os.Getenv(lcHelperEnv); h {
	case "":
		return
	case "workload":
		os.Exit(lcHelperWorkload())
	case "memlock-drop":
		os.Exit(lcHelperMemlockDrop())
	case "memlock-agent":
		os.Exit(lcHelperMemlockAgent())
	case "direct-writer":
		os.Exit(directWriterWorkload()) // direct_test.go
	case "direct-sender":
		os.Exit(directSenderWorkload()) // direct_send_test.go
	default:
		fmt.Fprintf(os.Stderr, "unknown %s %q\n", lcHelperEnv, h)
		os.Exit(3)
	}
}

// lcHelperWorkload attaches VM $VRDMA_TEST_VM, connects a QP to
// $VRDMA_TEST_REMOTE port $VRDMA_TEST_PORT through the CM, prints
// "ready QPN", then blocks until its standard input closes (or it is
// killed). It never posts a receive.
func lcHelperWorkload() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "workload:", err)
		return 1
	}
	_, _, _, qp, err := connectWorkload(ctx)
	if err != nil {
		return fail(err)
	}
	fmt.Println("ready", qp.QPN())
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// connectWorkload is the start of a helper workload: it attaches VM
// $VRDMA_TEST_VM through $VRDMA_TEST_SOCKET and connects an RC QP (one CQ
// of 64, 16 WRs each way) to $VRDMA_TEST_REMOTE port $VRDMA_TEST_PORT
// through the CM.
func connectWorkload(ctx context.Context) (*vrdma.VM, *vrdma.PD, *vrdma.CQ, *vrdma.QP, error) {
	v, err := vrdma.Open(ctx, os.Getenv("VRDMA_TEST_VM"), vrdma.WithSocket(os.Getenv("VRDMA_TEST_SOCKET")))
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ad := v.Adapters()[0]
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cq, err := ad.CreateCQ(ctx, 64)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	port, _ := strconv.Atoi(os.Getenv("VRDMA_TEST_PORT"))
	if err := qp.Connect(ctx, os.Getenv("VRDMA_TEST_REMOTE"), uint16(port)); err != nil {
		return nil, nil, nil, nil, err
	}
	return v, pd, cq, qp, nil
}

// lcHelperMemlockDrop drops CAP_IPC_LOCK (which lets root ignore
// RLIMIT_MEMLOCK) from this thread's bounding and inheritable sets, lowers
// RLIMIT_MEMLOCK to $VRDMA_TEST_MEMLOCK bytes, and executes this binary
// again as memlock-agent from the same thread: the new program starts
// without the capability, under the lowered limit.
func lcHelperMemlockDrop() int {
	runtime.LockOSThread() // capabilities are per thread; exec from this one
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "memlock-drop: %s: %v\n", what, err)
		return 1
	}
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_IPC_LOCK, 0, 0, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return fail("drop CAP_IPC_LOCK from the bounding set", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fail("clear ambient capabilities", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fail("capget", err)
	}
	data[0].Inheritable &^= 1 << unix.CAP_IPC_LOCK
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fail("capset", err)
	}
	n, err := strconv.ParseUint(os.Getenv("VRDMA_TEST_MEMLOCK"), 10, 64)
	if err != nil {
		return fail("VRDMA_TEST_MEMLOCK", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		return fail("setrlimit RLIMIT_MEMLOCK", err)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, lcHelperEnv+"=") })
	env = append(env, lcHelperEnv+"=memlock-agent")
	return fail("exec", syscall.Exec(os.Args[0], os.Args, env))
}

// lcHelperMemlockAgent checks that it runs without CAP_IPC_LOCK, then serves
// an in-process agent on $VRDMA_TEST_SOCKET until its standard input closes.
func lcHelperMemlockAgent() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "memlock-agent:", err)
		return 1
	}
	caps, err := lcEffectiveCaps()
	if err != nil {
		return fail(err)
	}
	if caps&(1<<unix.CAP_IPC_LOCK) != 0 {
		return fail(fmt.Errorf("CAP_IPC_LOCK is still effective (CapEff %x)", caps))
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return fail(err)
	}
	a, err := agent.New(agent.Config{Socket: os.Getenv("VRDMA_TEST_SOCKET"), StateDir: os.Getenv("VRDMA_TEST_STATE"), Host: "hostA",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return fail(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Serve(context.Background())
	}()
	fmt.Printf("ready CapEff=%x RLIMIT_MEMLOCK=%d\n", caps, lim.Cur)
	io.Copy(io.Discard, os.Stdin)
	a.Close()
	<-done
	return 0
}

// lcEffectiveCaps returns this process's effective capability set.
func lcEffectiveCaps() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff in /proc/self/status")
}

// lcChild is a helper process.
type lcChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr strings.Builder
	mu     sync.Mutex // guards stderr
	exited chan struct{}
	err    error // Wait's result, once exited is closed
}

type lcLockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lcLockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// lcStartChild runs this test binary again as helper kind with the extra
// environment env. The child is killed at the end of the test.
func lcStartChild(t *testing.T, kind string, env ...string) *lcChild {
	t.Helper()
	c := &lcChild{lines: make(chan string, 16), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestLifecycleHelperProcess$", "-test.count=1")
	c.cmd.Env = append(append(os.Environ(), lcHelperEnv+"="+kind), env...)
	c.cmd.Stderr = lcLockedWriter{&c.mu, &c.stderr}
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start helper %s: %v", kind, err)
	}
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	go func() {
		for l := range lines {
			c.lines <- l
		}
		close(c.lines)
		c.err = c.cmd.Wait() // after stdout is drained, as os/exec asks
		close(c.exited)
	}()
	t.Cleanup(c.kill)
	return c
}

// expect waits for a line of the child's output that starts with prefix
// and returns it.
func (c *lcChild) expect(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				<-c.exited
				t.Fatalf("helper exited (%v) before printing %q; stderr:\n%s", c.err, prefix, c.stderrText())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("helper did not print %q in a minute; stderr:\n%s", prefix, c.stderrText())
		}
	}
}

func (c *lcChild) stderrText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// kill SIGKILLs the child and waits until it is reaped.
func (c *lcChild) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.stdin.Close()
	go func() {
		for range c.lines { // keep the reader going until the pipe closes
		}
	}()
	<-c.exited // c.lines is closed by then, and the goroutine above ends
}

// lcSide is one end of a test connection: a VM's PD, CQ, QP and a 64 KiB
// memory region with every access right.
type lcSide struct {
	vm *vrdma.VM
	pd *vrdma.PD
	cq *vrdma.CQ
	qp *vrdma.QP
	mr *vrdma.MR
}

var lcTestCaps = vrdma.QPCaps{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}

func lcNewSide(t *testing.T, ctx context.Context, v *vrdma.VM) *lcSide {
	t.Helper()
	ad := v.Adapters()[0]
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ad.CreateCQ(ctx, 256)
	if err != nil {
		t.Fatal(err)
	}
	s := &lcSide{vm: v, pd: pd, cq: cq}
	s.qp = s.newQP(t, ctx)
	buf, err := v.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	if s.mr, err = pd.RegMR(ctx, buf, vrdma.AccessAll); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *lcSide) newQP(t *testing.T, ctx context.Context) *vrdma.QP {
	t.Helper()
	qp, err := s.pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, Caps: lcTestCaps})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

// lcConnectCM connects a.qp to b.qp: b listens on port and accepts, a dials.
func lcConnectCM(t *testing.T, ctx context.Context, a, b *lcSide, port uint16) {
	t.Helper()
	l, err := b.vm.Adapters()[0].Listen(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	acc := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err == nil {
			err = r.Accept(ctx, b.qp)
		}
		acc <- err
	}()
	if err := a.qp.Connect(ctx, b.vm.Name()+"/vrdma0", port); err != nil {
		t.Fatal(err)
	}
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
}

// lcRoundTrip sends a message from a to b (b posts the receive) and checks
// that it arrives intact.
func lcRoundTrip(ctx context.Context, a, b *lcSide, seq uint64) error {
	msg := fmt.Appendf(nil, "message %d from %s", seq, a.vm.Name())
	copy(a.mr.Bytes()[1024:], msg)
	if err := b.qp.PostRecv([]vrdma.RecvWR{{ID: seq, SGL: []vrdma.SGE{b.mr.SGE(2048, 256)}}}); err != nil {
		return err
	}
	if err := a.qp.PostSend([]vrdma.SendWR{{ID: seq, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.mr.SGE(1024, len(msg))}}}); err != nil {
		return err
	}
	for _, c := range []*lcSide{a, b} {
		wc := make([]vrdma.WorkCompletion, 1)
		for {
			if err := c.cq.Wait(ctx); err != nil {
				return err
			}
			n, err := c.cq.Poll(wc)
			if err != nil {
				return err
			}
			if n == 1 {
				break
			}
		}
		if wc[0].Status != vrdma.WCSuccess || wc[0].WRID != seq {
			return fmt.Errorf("%s: completion %+v, want WR %d SUCCESS", c.vm.Name(), wc[0], seq)
		}
	}
	if got := b.mr.Bytes()[2048 : 2048+len(msg)]; string(got) != string(msg) {
		return fmt.Errorf("received %q, want %q", got, msg)
	}
	return nil
}

// lcTraffic runs round trips between two sides in the background, to show
// that the agent keeps serving them while something else goes wrong.
type lcTraffic struct {
	a, b   *lcSide
	rounds atomic.Int64
	stop   chan struct{}
	done   chan error
	halt   func() error // stops the traffic and waits for it
}

func lcStartTraffic(t *testing.T, ctx context.Context, a, b *lcSide) *lcTraffic {
	tr := &lcTraffic{a: a, b: b, stop: make(chan struct{}), done: make(chan error, 1)}
	var once sync.Once
	exited := make(chan struct{})
	tr.halt = func() error {
		once.Do(func() { close(tr.stop) })
		<-exited
		select {
		case err := <-tr.done:
			return err
		default:
			return nil
		}
	}
	t.Cleanup(func() { tr.halt() }) // before the VMs close: the memory goes away
	go func() {
		defer close(exited)
		for i := uint64(1); ; i++ {
			select {
			case <-tr.stop:
				tr.done <- nil
				return
			default:
			}
			if err := lcRoundTrip(ctx, a, b, i); err != nil {
				tr.done <- fmt.Errorf("round trip %d: %w", i, err)
				return
			}
			tr.rounds.Add(1)
		}
	}()
	return tr
}

// lcStall is how long traffic may make no round trip before finish calls
// it stalled: while the traffic goroutine still waits (on the test's own
// context it would give up with the test, and its stack be gone from the
// dump).
const lcStall = 30 * time.Second

// finish waits for a few more round trips, then stops the traffic and
// fails the test if any round trip failed.
func (tr *lcTraffic) finish(t *testing.T, ctx context.Context) {
	t.Helper()
	want := tr.rounds.Load() + 3
	last, lastAt := tr.rounds.Load(), time.Now()
	for n := last; n < want; n = tr.rounds.Load() {
		if n != last {
			last, lastAt = n, time.Now()
		}
		select {
		case err := <-tr.done:
			t.Fatalf("traffic between two other VMs failed: %v", err)
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
			if time.Since(lastAt) < lcStall {
				continue
			}
		}
		// The agent runs in this process: its goroutines, and the
		// traffic's, show where.
		var stacks strings.Builder
		pprof.Lookup("goroutine").WriteTo(&stacks, 2)
		t.Fatalf("traffic between two other VMs stalled at %d round trips (none for %v)\n%s: %s\n%s: %s\ngoroutines:\n%s",
			n, time.Since(lastAt).Round(time.Second), tr.a.vm.Name(), libdiag.RingWords(tr.a.qp, tr.a.cq),
			tr.b.vm.Name(), libdiag.RingWords(tr.b.qp, tr.b.cq), stacks.String())
	}
	if err := tr.halt(); err != nil {
		t.Fatalf("traffic between two other VMs failed: %v", err)
	}
}

// lcResources counts what the agent holds, seen from inside this process:
// open descriptors by kind, shared-memory mappings, goroutines. The agent
// runs in this process (testenv.Start); what the test itself holds is the
// same before and after.
type lcResources struct {
	fds        map[string]int
	maps       map[string]int
	goroutines int
}

func lcSnapshot(t *testing.T) lcResources {
	t.Helper()
	r := lcResources{fds: map[string]int{}, maps: map[string]int{}, goroutines: runtime.NumGoroutine()}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue // the directory's own descriptor, closed meanwhile
		}
		if i := strings.Index(target, ":["); i > 0 && !strings.HasPrefix(target, "anon_inode") {
			target = target[:i] // socket:[123], pipe:[456]: count by kind
		}
		r.fds[target]++
	}
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.Index(l, "memfd:vrdma"); i >= 0 {
			r.maps[l[i:]]++
		}
	}
	return r
}

// leaks describes what cur holds beyond base, or "" if nothing.
func (cur lcResources) leaks(base lcResources) string {
	var out []string
	for k, n := range cur.fds {
		if n > base.fds[k] {
			out = append(out, fmt.Sprintf("%d more descriptors of %s", n-base.fds[k], k))
		}
	}
	for k, n := range cur.maps {
		if n > base.maps[k] {
			out = append(out, fmt.Sprintf("%d more mappings of %s", n-base.maps[k], k))
		}
	}
	if cur.goroutines > base.goroutines {
		out = append(out, fmt.Sprintf("%d more goroutines (%d, was %d)", cur.goroutines-base.goroutines, cur.goroutines, base.goroutines))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// lcCheckNoLeaks waits (a bounded while) for the resources to settle back to
// base and fails the test with what leaked if they do not.
func lcCheckNoLeaks(t *testing.T, base lcResources) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l := lcSnapshot(t).leaks(base)
		if l == "" {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("leaked: %s\ngoroutines:\n%s", l, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lcAgentStatus returns the agent's status report.
func lcAgentStatus(t *testing.T, ctx context.Context, socket string) vrdma.Status {
	t.Helper()
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// lcWaitDetached waits until the agent no longer has VM name attached.
func lcWaitDetached(t *testing.T, ctx context.Context, socket, name string) {
	t.Helper()
	for {
		attached := false
		for _, v := range lcAgentStatus(t, ctx, socket).VMs {
			attached = attached || v.Name == name && v.Attached
		}
		if !attached {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("VM %s is still attached: its workload is gone, the agent should have detached it", name)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// lcPostOutstanding posts, on s.qp connected to a peer that never posts a
// receive and never sends, nRecv receives and nSend signaled sends: the
// receives wait for a message that never comes, the first send waits in
// RNR retries (rnr_retry 7 retries forever) and the others behind it.
// It returns the IDs it posted; sends are 1..nSend, receives 101.. .
func lcPostOutstanding(t *testing.T, ctx context.Context, s *lcSide, nRecv, nSend int) (sends, recvs []uint64) {
	t.Helper()
	for i := range nRecv {
		id := uint64(101 + i)
		if err := s.qp.PostRecv([]vrdma.RecvWR{{ID: id, SGL: []vrdma.SGE{s.mr.SGE(8192+i*256, 256)}}}); err != nil {
			t.Fatal(err)
		}
		recvs = append(recvs, id)
	}
	for i := range nSend {
		id := uint64(1 + i)
		if err := s.qp.PostSend([]vrdma.SendWR{{ID: id, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{s.mr.SGE(0, 100)}}}); err != nil {
			t.Fatal(err)
		}
		sends = append(sends, id)
	}
	// Nothing can complete while the peer lives: no receive, no message.
	wc := make([]vrdma.WorkCompletion, 8)
	if n, err := s.cq.Poll(wc); n != 0 || err != nil {
		t.Fatalf("completions before the peer went away: %+v, %v", wc[:n], err)
	}
	return sends, recvs
}

// lcCheckFlushed waits until every posted WR of s.qp has completed, checks
// that each did so exactly once with WR_FLUSH_ERR, and that the QP is in
// ERR. To catch a WR completed twice it then posts a marker send and
// receive (which flush too, the QP being in ERR) and polls until both
// came: the QP's goroutine flushes in queue order, so a duplicate of an
// earlier WR would have come before them.
func lcCheckFlushed(t *testing.T, ctx context.Context, s *lcSide, sends, recvs []uint64) {
	t.Helper()
	const markSend, markRecv = 9001, 9002
	seen := map[uint64]vrdma.WorkCompletion{}
	wc := make([]vrdma.WorkCompletion, 64)
	want := len(sends) + len(recvs)
	posted := false
	for !(posted && len(seen) == want+2) {
		if !posted && len(seen) == want {
			if st := s.qp.State(); st != vrdma.QPSErr {
				t.Fatalf("QP in %s after its WRs flushed, want ERR", st)
			}
			if err := s.qp.PostSend([]vrdma.SendWR{{ID: markSend, Opcode: vrdma.OpSend, SGL: []vrdma.SGE{s.mr.SGE(0, 8)}}}); err != nil {
				t.Fatal(err)
			}
			if err := s.qp.PostRecv([]vrdma.RecvWR{{ID: markRecv, SGL: []vrdma.SGE{s.mr.SGE(0, 8)}}}); err != nil {
				t.Fatal(err)
			}
			posted = true
		}
		if err := s.cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for flushes (have %d of %d): %v", len(seen), want, err)
		}
		n, err := s.cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range wc[:n] {
			if prev, dup := seen[c.WRID]; dup {
				t.Fatalf("WR %d completed twice: %+v and %+v", c.WRID, prev, c)
			}
			seen[c.WRID] = c
		}
	}
	for _, id := range append(sends, markSend) {
		c, ok := seen[id]
		if !ok || c.Status != vrdma.WCWRFlushErr || c.Opcode != vrdma.WCSend || c.QPNum != s.qp.QPN() {
			t.Errorf("send %d: completion %+v (found %v), want SEND WR_FLUSH_ERR on QP 0x%x", id, c, ok, s.qp.QPN())
		}
		delete(seen, id)
	}
	for _, id := range append(recvs, markRecv) {
		c, ok := seen[id]
		if !ok || c.Status != vrdma.WCWRFlushErr || c.Opcode != vrdma.WCRecv || c.QPNum != s.qp.QPN() {
			t.Errorf("receive %d: completion %+v (found %v), want RECV WR_FLUSH_ERR on QP 0x%x", id, c, ok, s.qp.QPN())
		}
		delete(seen, id)
	}
	for id, c := range seen {
		t.Errorf("completion of a WR never posted: %d %+v", id, c)
	}
	info, err := s.qp.Query(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Attr.State != vrdma.QPSErr {
		t.Errorf("agent reports the QP in %s, want ERR", info.Attr.State)
	}
}

// TestCrashWorkloadKilled kills a workload process (SIGKILL) whose QP is
// connected to ours while WRs are outstanding on ours: our QP moves to ERR
// and every outstanding WR, the send in RNR retries included, completes
// exactly once with WR_FLUSH_ERR. The agent detaches the dead VM without
// leaking a descriptor, a mapping or a goroutine, keeps serving, and lets
// the dead VM's name be attached again.
func TestCrashWorkloadKilled(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := lcNewSide(t, ctx, env.Open(t, "vmA", testenv.VMOptions{}))
	env.Define(t, "vmB", testenv.VMOptions{})
	l, err := a.vm.Adapters()[0].Listen(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	base := lcSnapshot(t)

	acc := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err == nil {
			if r.RemoteVM != "vmB" {
				err = fmt.Errorf("connection from %s, want vmB", r.RemoteVM)
			} else {
				err = r.Accept(ctx, a.qp)
			}
		}
		acc <- err
	}()
	c := lcStartChild(t, "workload", "VRDMA_TEST_SOCKET="+env.Socket, "VRDMA_TEST_VM=vmB", "VRDMA_TEST_REMOTE=vmA/vrdma0", "VRDMA_TEST_PORT=7")
	c.expect(t, "ready")
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
	if st := a.qp.State(); st != vrdma.QPSRTS {
		t.Fatalf("connected QP in %s", st)
	}
	sends, recvs := lcPostOutstanding(t, ctx, a, 6, 5)

	c.kill()
	lcCheckFlushed(t, ctx, a, sends, recvs)
	lcWaitDetached(t, ctx, env.Socket, "vmB")
	lcCheckNoLeaks(t, base)

	// The agent keeps serving: the dead VM's name attaches again, a new VM
	// attaches, and they talk.
	b := lcNewSide(t, ctx, env.Open(t, "vmB", testenv.VMOptions{}))
	cc := lcNewSide(t, ctx, env.Open(t, "vmC", testenv.VMOptions{}))
	lcConnectCM(t, ctx, b, cc, 8)
	if err := lcRoundTrip(ctx, b, cc, 1); err != nil {
		t.Fatal(err)
	}
	if err := lcRoundTrip(ctx, cc, b, 2); err != nil {
		t.Fatal(err)
	}
}

// TestLifecycleCloseFlushesPeer: VM.Close on one side has the same effect
// on the other side as a crash: its QP moves to ERR and flushes, and the
// closed VM's resources are released.
func TestLifecycleCloseFlushesPeer(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := lcNewSide(t, ctx, env.Open(t, "vmA", testenv.VMOptions{}))
	env.Define(t, "vmB", testenv.VMOptions{})
	base := lcSnapshot(t)

	vb, err := vrdma.Open(ctx, "vmB", vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	b := lcNewSide(t, ctx, vb)
	lcConnectCM(t, ctx, a, b, 7)
	if err := lcRoundTrip(ctx, a, b, 1); err != nil {
		t.Fatal(err)
	}
	// An event channel's socket is the workload's: the agent keeps no
	// descriptor of it once the channel is closed.
	before := lcSnapshot(t)
	for range 3 {
		ch, err := vb.OpenEventChannel(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lcCheckNoLeaks(t, before)
	sends, recvs := lcPostOutstanding(t, ctx, a, 4, 3)
	if err := vb.Close(); err != nil {
		t.Fatal(err)
	}
	lcCheckFlushed(t, ctx, a, sends, recvs)
	lcWaitDetached(t, ctx, env.Socket, "vmB")
	// What the library maps for a CQ or QP stays until it is destroyed (or
	// the process exits); the agent's side is gone, so Destroy only
	// releases the library's.
	if err := b.qp.Destroy(ctx); err != nil {
		t.Errorf("QP.Destroy on a closed VM: %v", err)
	}
	if err := b.cq.Destroy(ctx); err != nil {
		t.Errorf("CQ.Destroy on a closed VM: %v", err)
	}
	lcCheckNoLeaks(t, base)
	if _, err := b.pd.RegMR(ctx, b.mr.Bytes(), vrdma.AccessLocalWrite); err == nil {
		t.Error("RegMR on a closed VM succeeded")
	}
	if err := b.qp.PostSend([]vrdma.SendWR{{ID: 1, Opcode: vrdma.OpSend}}); err == nil {
		t.Error("PostSend on a closed VM succeeded")
	}
}

// TestCrashAgentKilled kills a real agent process (SIGKILL) under two
// attached VMs with connected QPs: blocking calls in progress (CQ.Wait
// without a deadline, Listener.Accept, Connect) return ErrAgentGone, and
// so does every later call; nothing hangs.
func TestCrashAgentKilled(t *testing.T) {
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env.Define(t, "vm1", testenv.VMOptions{})
	env.Define(t, "vm2", testenv.VMOptions{})
	open := func(name string) *vrdma.VM {
		v, err := vrdma.Open(ctx, name, vrdma.WithSocket(env.Socket))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { v.Close() })
		return v
	}
	v1, v2 := open("vm1"), open("vm2")
	a, b := lcNewSide(t, ctx, v1), lcNewSide(t, ctx, v2)
	lcConnectCM(t, ctx, a, b, 7)
	if err := lcRoundTrip(ctx, a, b, 1); err != nil {
		t.Fatal(err)
	}
	ad1, ad2 := v1.Adapters()[0], v2.Adapters()[0]
	lAccept, err := ad2.Listen(ctx, 8) // nobody dials it
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ad2.Listen(ctx, 9); err != nil { // nobody accepts on it
		t.Fatal(err)
	}
	dialer := a.newQP(t, ctx)

	// Calls that block while the agent lives.
	never := context.Background()
	longCtx, longCancel := context.WithTimeout(never, time.Hour) // Connect sends its deadline to the agent
	defer longCancel()
	pending := map[string]chan error{"CQ.Wait": make(chan error, 1), "Listener.Accept": make(chan error, 1), "QP.Connect": make(chan error, 1)}
	go func() { pending["CQ.Wait"] <- a.cq.Wait(never) }()
	go func() {
		_, err := lAccept.Accept(never)
		pending["Listener.Accept"] <- err
	}()
	go func() { pending["QP.Connect"] <- dialer.Connect(longCtx, "vm2/vrdma0", 9) }()
	// Commands on one connection are served in order: once these answer,
	// the blocking calls above have most likely reached the agent (if not,
	// they must fail the same way).
	for range 3 {
		if _, err := ad1.QueryDevice(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for what, ch := range pending {
		select {
		case err := <-ch:
			t.Fatalf("%s returned while the agent lives: %v", what, err)
		default:
		}
	}

	env.Kill()

	for what, ch := range pending {
		select {
		case err := <-ch:
			if !errors.Is(err, vrdma.ErrAgentGone) {
				t.Errorf("%s after the agent died: %v, want ErrAgentGone", what, err)
			} else if !strings.Contains(err.Error(), "agent") {
				t.Errorf("%s: error %q does not say the agent is gone", what, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s still blocks a minute after the agent died", what)
		}
	}
	gone := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, vrdma.ErrAgentGone) {
			t.Errorf("%s after the agent died: %v, want ErrAgentGone", what, err)
		}
	}
	gone("PostSend", a.qp.PostSend([]vrdma.SendWR{{ID: 1, Opcode: vrdma.OpSend, SGL: []vrdma.SGE{a.mr.SGE(0, 8)}}}))
	gone("PostRecv", a.qp.PostRecv([]vrdma.RecvWR{{ID: 2, SGL: []vrdma.SGE{a.mr.SGE(0, 8)}}}))
	_, err = a.cq.Poll(make([]vrdma.WorkCompletion, 4))
	gone("Poll", err)
	gone("CQ.Wait", a.cq.Wait(ctx))
	_, err = ad1.AllocPD(ctx)
	gone("AllocPD", err)
	_, err = ad1.CreateCQ(ctx, 16)
	gone("CreateCQ", err)
	_, err = a.pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: a.cq, RecvCQ: a.cq, Caps: lcTestCaps})
	gone("CreateQP", err)
	_, err = a.pd.RegMR(ctx, a.mr.Bytes(), vrdma.AccessLocalWrite)
	gone("RegMR", err)
	gone("Connect", dialer.Connect(ctx, "vm2/vrdma0", 7))
	_, err = lAccept.Accept(ctx)
	gone("Listener.Accept", err)
	_, err = ad2.Listen(ctx, 10)
	gone("Listen", err)
	gone("Modify", b.qp.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSErr}, vrdma.MaskState))
	_, err = b.qp.Query(ctx)
	gone("Query", err)
	_, err = ad1.QueryDevice(ctx)
	gone("QueryDevice", err)
	// Destroying and closing only release what this process holds.
	if err := a.qp.Destroy(ctx); err != nil {
		t.Errorf("QP.Destroy after the agent died: %v", err)
	}
	if err := v1.Close(); err != nil {
		t.Errorf("VM.Close after the agent died: %v", err)
	}
}

// TestLifecycleLimits starts an agent with small per-VM limits: objects
// beyond them are refused with an error that names the limit, the limits
// are per VM and count live objects, and caps beyond the device's ring
// limits are refused naming them.
func TestLifecycleLimits(t *testing.T) {
	env := testenv.StartWith(t, testenv.Options{Limits: agent.Limits{MaxPD: 2, MaxMR: 3, MaxCQ: 2, MaxQP: 2}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := env.Open(t, "vm1", testenv.VMOptions{})
	ad := v.Adapters()[0]
	refused := func(what string, err error, code, name string) {
		t.Helper()
		var e *vrdma.Error
		switch {
		case err == nil:
			t.Errorf("%s: accepted, want refused naming %s", what, name)
		case !strings.Contains(err.Error(), name):
			t.Errorf("%s: %v; the error does not name %s", what, err, name)
		case code != "" && (!errors.As(err, &e) || e.Code != code):
			t.Errorf("%s: %v, want code %s", what, err, code)
		}
	}

	attr, err := ad.QueryDevice(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if attr.MaxPD != 2 || attr.MaxMR != 3 || attr.MaxCQ != 2 || attr.MaxQP != 2 {
		t.Errorf("device attributes %+v do not report the limits", attr)
	}

	pd, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pd2, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ad.AllocPD(ctx)
	refused("third PD", err, abi.CodeLimit, "max_pd")
	if err := pd2.Dealloc(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ad.AllocPD(ctx); err != nil {
		t.Errorf("a PD after one was freed: %v", err)
	}

	buf, _ := v.Alloc(1 << 16)
	var mrs []*vrdma.MR
	for i := range 3 {
		mr, err := pd.RegMR(ctx, buf[i*4096:(i+1)*4096], vrdma.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		mrs = append(mrs, mr)
	}
	_, err = pd.RegMR(ctx, buf[:4096], vrdma.AccessLocalWrite)
	refused("fourth MR", err, abi.CodeLimit, "max_mr")
	if err := mrs[1].Dereg(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(ctx, buf[:4096], vrdma.AccessLocalWrite); err != nil {
		t.Errorf("an MR after one was deregistered: %v", err)
	}

	cq, err := ad.CreateCQ(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	cq2, err := ad.CreateCQ(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ad.CreateCQ(ctx, 16)
	refused("third CQ", err, abi.CodeLimit, "max_cq")

	mkQP := func(c vrdma.QPCaps) (*vrdma.QP, error) {
		return pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq2, Caps: c})
	}
	small := vrdma.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	q1, err := mkQP(small)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mkQP(small); err != nil {
		t.Fatal(err)
	}
	_, err = mkQP(small)
	refused("third QP", err, abi.CodeLimit, "max_qp")
	if err := q1.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := mkQP(small); err != nil {
		t.Errorf("a QP after one was destroyed: %v", err)
	}
	if err := cq.Destroy(ctx); err == nil {
		t.Error("destroyed a CQ that QPs use")
	}

	// Ring sizes. These are checked before the QP count.
	for _, c := range []struct {
		name string
		caps vrdma.QPCaps
	}{
		{"max_qp_wr", vrdma.QPCaps{MaxSendWR: vrdma.MaxQPWR + 1, MaxRecvWR: 1}},
		{"max_qp_wr", vrdma.QPCaps{MaxSendWR: 1, MaxRecvWR: vrdma.MaxQPWR + 1}},
		{"max_qp_wr", vrdma.QPCaps{MaxSendWR: 0, MaxRecvWR: 1}},
		{"max_qp_wr", vrdma.QPCaps{MaxSendWR: 1 << 31, MaxRecvWR: 1}},
		{"max_sge", vrdma.QPCaps{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: vrdma.MaxSGE + 1}},
		{"max_sge", vrdma.QPCaps{MaxSendWR: 1, MaxRecvWR: 1, MaxRecvSGE: 1 << 30}},
		{"max_inline_data", vrdma.QPCaps{MaxSendWR: 1, MaxRecvWR: 1, MaxInlineData: vrdma.MaxInline + 1}},
	} {
		_, err := mkQP(c.caps)
		refused(fmt.Sprintf("QP caps %+v", c.caps), err, abi.CodeInvalid, c.name)
	}
	_, err = ad.CreateCQ(ctx, vrdma.MaxCQE+1)
	refused("CQ of max_cqe+1 entries", err, "", "max_cqe")

	// Limits are per VM: another VM still gets its own.
	v2 := env.Open(t, "vm2", testenv.VMOptions{})
	for range 2 {
		if _, err := v2.Adapters()[0].AllocPD(ctx); err != nil {
			t.Errorf("another VM's PD: %v", err)
		}
	}
}

// TestLifecycleMemoryLock runs an agent without CAP_IPC_LOCK under a small
// RLIMIT_MEMLOCK (a child process: capabilities and limits are not for a
// test to lower in itself). A VM that reserves and locks more memory than
// that is refused with an error that names the limit and the VM setting;
// one that fits is locked.
func TestLifecycleMemoryLock(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s")
	c := lcStartChild(t, "memlock-drop", "VRDMA_TEST_SOCKET="+sock, "VRDMA_TEST_STATE="+filepath.Join(dir, "state"),
		"VRDMA_TEST_MEMLOCK="+strconv.Itoa(4<<20))
	t.Logf("agent: %s", c.expect(t, "ready"))
	env := &testenv.Env{Socket: sock}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env.Define(t, "big", testenv.VMOptions{MemMB: 16, Locked: true})
	env.Define(t, "small", testenv.VMOptions{MemMB: 1, Locked: true})
	env.Define(t, "loose", testenv.VMOptions{MemMB: 16})

	for range 2 { // a refused attach leaves nothing behind: the same refusal again
		_, err := vrdma.Open(ctx, "big", vrdma.WithSocket(sock))
		var e *vrdma.Error
		if !errors.As(err, &e) {
			t.Fatalf("attach of a 16 MiB locked VM under a 4 MiB RLIMIT_MEMLOCK: %v, want an agent error", err)
		}
		if e.Code != abi.CodeLimit || e.Field != "memSize" {
			t.Errorf("code %q field %q, want %q memSize", e.Code, e.Field, abi.CodeLimit)
		}
		for _, s := range []string{"RLIMIT_MEMLOCK", "sched.mem.pin", "16 MiB", "4194304"} {
			if !strings.Contains(e.Message, s) {
				t.Errorf("the error does not say %q: %s", s, e.Message)
			}
		}
	}
	v, err := vrdma.Open(ctx, "small", vrdma.WithSocket(sock))
	if err != nil {
		t.Fatalf("a 1 MiB locked VM under a 4 MiB limit: %v", err)
	}
	defer v.Close()
	if !v.MemoryLocked() {
		t.Error("the 1 MiB VM's memory is not locked")
	}
	v2, err := vrdma.Open(ctx, "loose", vrdma.WithSocket(sock))
	if err != nil {
		t.Fatalf("a 16 MiB VM that locks nothing: %v", err)
	}
	defer v2.Close()
	if v2.MemoryLocked() {
		t.Error("a VM without sched.mem.pin has locked memory")
	}
}

// lcRaw is a client that speaks the command protocol by hand, as a hostile
// workload would.
type lcRaw struct {
	t     *testing.T
	pc    *sys.PacketConn
	seq   uint32
	buf   []byte
	early map[uint32]lcReply // replies read while waiting for another
}

type lcReply struct {
	h    abi.Header
	body []byte
	fds  []int
	err  error // the connection ended instead
}

func lcDialRaw(t *testing.T, socket string) *lcRaw {
	t.Helper()
	pc, err := sys.DialPacket(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return &lcRaw{t: t, pc: pc, buf: make([]byte, abi.MaxMessage), early: map[uint32]lcReply{}}
}

// sendRaw sends msg as is, with fds.
func (c *lcRaw) sendRaw(msg []byte, fds ...int) {
	c.t.Helper()
	if err := c.pc.Send(msg, fds...); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// recv reads the next message; a closed connection is reported in err.
func (c *lcRaw) recv() lcReply {
	c.t.Helper()
	c.pc.Conn().SetReadDeadline(time.Now().Add(30 * time.Second))
	n, fds, err := c.pc.Recv(c.buf)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.t.Fatal("no reply from the agent in 30 s")
		}
		return lcReply{err: err}
	}
	// Not abi.ParseMessage: the reply to a message whose op could not be
	// read carries op 0.
	msg := c.buf[:n]
	if n < abi.CmdHeaderSize || string(msg[:2]) != "VR" || msg[2] != abi.Version ||
		int(binary.LittleEndian.Uint32(msg[12:])) != n-abi.CmdHeaderSize {
		c.t.Fatalf("undecodable reply %q", msg)
	}
	h := abi.Header{Version: msg[2], Flags: msg[3], Op: abi.Op(binary.LittleEndian.Uint16(msg[4:])),
		Seq: binary.LittleEndian.Uint32(msg[8:]), Len: uint32(n - abi.CmdHeaderSize)}
	return lcReply{h: h, body: append([]byte(nil), msg[abi.CmdHeaderSize:]...), fds: fds}
}

// start sends a request and returns its sequence number.
func (c *lcRaw) start(op abi.Op, req any) uint32 {
	c.t.Helper()
	c.seq++
	msg, err := abi.AppendMessage(nil, abi.Header{Version: abi.Version, Op: op, Seq: c.seq}, req)
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendRaw(msg)
	return c.seq
}

// wait reads replies until the one to seq, decodes it into resp and
// returns its descriptors, or the agent's error.
func (c *lcRaw) wait(seq uint32, resp any) ([]int, *abi.Error) {
	c.t.Helper()
	r, ok := c.early[seq]
	delete(c.early, seq)
	for !ok {
		r = c.recv()
		if r.err != nil {
			c.t.Fatalf("connection ended waiting for reply %d: %v", seq, r.err)
		}
		if r.h.Seq == seq {
			break
		}
		c.early[r.h.Seq] = r
	}
	return c.decode(r, resp)
}

func (c *lcRaw) decode(r lcReply, resp any) ([]int, *abi.Error) {
	c.t.Helper()
	if r.h.Flags&abi.FlagResponse == 0 {
		c.t.Fatalf("reply %+v without the response flag", r.h)
	}
	if r.h.Flags&abi.FlagError != 0 {
		e := new(abi.Error)
		if err := json.Unmarshal(r.body, e); err != nil {
			c.t.Fatalf("undecodable error reply %q: %v", r.body, err)
		}
		for _, fd := range r.fds {
			sys.CloseFD(fd)
		}
		return nil, e
	}
	if resp != nil {
		if err := json.Unmarshal(r.body, resp); err != nil {
			c.t.Fatalf("undecodable reply %q: %v", r.body, err)
		}
	}
	return r.fds, nil
}

// call runs one command.
func (c *lcRaw) call(op abi.Op, req, resp any) ([]int, *abi.Error) {
	c.t.Helper()
	return c.wait(c.start(op, req), resp)
}

// must runs one command that must succeed.
func (c *lcRaw) must(op abi.Op, req, resp any) []int {
	c.t.Helper()
	fds, e := c.call(op, req, resp)
	if e != nil {
		c.t.Fatalf("%s: %v", op, e)
	}
	return fds
}

// refused runs one command that the agent must refuse with code, naming
// field; the session must go on.
func (c *lcRaw) refused(what string, op abi.Op, req any, code, field string) {
	c.t.Helper()
	_, e := c.call(op, req, nil)
	c.checkErr(what, e, code, field)
	c.alive(what)
}

func (c *lcRaw) checkErr(what string, e *abi.Error, code, field string) {
	c.t.Helper()
	switch {
	case e == nil:
		c.t.Errorf("%s: accepted, want %s naming %q", what, code, field)
	case e.Code != code || e.Field != field:
		c.t.Errorf("%s: code %q field %q (%s), want %s naming %q", what, e.Code, e.Field, e.Message, code, field)
	case e.Message == "":
		c.t.Errorf("%s: error without a message", what)
	}
}

// alive checks that the session still answers.
func (c *lcRaw) alive(after string) {
	c.t.Helper()
	var r abi.HelloReply
	if _, e := c.call(abi.OpHello, &abi.Hello{Client: "hostile"}, &r); e != nil || r.AgentVersion == "" {
		c.t.Fatalf("after %s the session does not answer hello: %v", after, e)
	}
}

// lcMsg returns a message with the given header fields and body.
func lcMsg(magic string, version, flags uint8, op uint16, body string) []byte {
	return append(lcHeader(magic, version, flags, op, 1, uint32(len(body))), body...)
}

// lcHeader returns a 16-byte command header.
func lcHeader(magic string, version uint8, flags uint8, op uint16, seq, n uint32) []byte {
	h := make([]byte, abi.CmdHeaderSize)
	copy(h, magic)
	h[2], h[3] = version, flags
	binary.LittleEndian.PutUint16(h[4:], op)
	binary.LittleEndian.PutUint32(h[8:], seq)
	binary.LittleEndian.PutUint32(h[12:], n)
	return h
}

// TestLifecycleHostileCommands sends the agent garbage, wrong versions,
// unknown ops, bad handles and out-of-range values while two other VMs
// exchange messages: each is refused with an error naming the field (or,
// when the message cannot be parsed at all, the session is closed), the
// agent never panics (testenv fails the test if a handler did), keeps
// serving the other VMs, and leaks nothing.
func TestLifecycleHostileCommands(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := lcNewSide(t, ctx, env.Open(t, "victim", testenv.VMOptions{}))
	b := lcNewSide(t, ctx, env.Open(t, "friend", testenv.VMOptions{}))
	lcConnectCM(t, ctx, a, b, 7)
	env.Define(t, "hostile", testenv.VMOptions{})
	base := lcSnapshot(t)
	tr := lcStartTraffic(t, ctx, a, b)

	// Messages that cannot be parsed end the session, after an error reply.
	closing := []struct {
		name  string
		msg   []byte
		field string
	}{
		{"short message", []byte("VR\x01"), "header"},
		{"empty message", nil, ""},
		{"bad magic", lcMsg("XY", abi.Version, 0, uint16(abi.OpHello), "{}"), "magic"},
		{"wrong version", lcMsg("VR", abi.Version+1, 0, uint16(abi.OpHello), "{}"), "version"},
		{"version 0", lcMsg("VR", 0, 0, uint16(abi.OpHello), "{}"), "version"},
		{"op 0", lcMsg("VR", abi.Version, 0, 0, "{}"), "op"},
		{"larger than 1 MiB", append(lcHeader("VR", abi.Version, 0, uint16(abi.OpHello), 1, abi.MaxMessage), make([]byte, abi.MaxMessage)...), ""},
	}
	for _, c := range closing {
		r := lcDialRaw(t, env.Socket)
		r.sendRaw(c.msg)
		rep := r.recv()
		if c.field != "" {
			if rep.err != nil {
				t.Errorf("%s: connection closed without an error reply", c.name)
				continue
			}
			_, e := r.decode(rep, nil)
			r.checkErr(c.name, e, abi.CodeInvalid, c.field)
			rep = r.recv()
		}
		if rep.err == nil && len(c.msg) > 0 {
			t.Errorf("%s: the session goes on (reply %+v %s)", c.name, rep.h, rep.body)
		}
		r.pc.Close()
	}

	r := lcDialRaw(t, env.Socket)
	// Descriptors sent to the agent are closed, not kept.
	ev, err := sys.NewBellPair()
	if err != nil {
		t.Fatal(err)
	}
	hello, _ := abi.AppendMessage(nil, abi.Header{Version: abi.Version, Op: abi.OpHello, Seq: 1000}, &abi.Hello{})
	r.sendRaw(hello, ev.PeerFD(), ev.PeerFD(), ev.PeerFD())
	ev.Close()
	if _, e := r.wait(1000, nil); e != nil {
		t.Fatalf("hello with descriptors: %v", e)
	}

	// Malformed requests the session survives.
	for _, c := range []struct {
		name  string
		msg   []byte
		field string
	}{
		{"unknown op", lcMsg("VR", abi.Version, 0, 999, "{}"), "op"},
		{"length mismatch", append(lcHeader("VR", abi.Version, 0, uint16(abi.OpHello), 1, 200), "{}"...), "len"},
		{"huge length", append(lcHeader("VR", abi.Version, 0, uint16(abi.OpHello), 1, 0xffffffff), "{}"...), "len"},
		{"response flag", lcMsg("VR", abi.Version, abi.FlagResponse, uint16(abi.OpHello), "{}"), "flags"},
		{"not JSON", lcMsg("VR", abi.Version, 0, uint16(abi.OpCreateCQ), "\xff{]}x"), "body"},
		{"JSON array", lcMsg("VR", abi.Version, 0, uint16(abi.OpCreateCQ), "[]"), "body"},
		{"wrong type", lcMsg("VR", abi.Version, 0, uint16(abi.OpCreateCQ), `{"adapter":"vrdma0","cqe":"many"}`), "cqe"},
		{"negative number", lcMsg("VR", abi.Version, 0, uint16(abi.OpRegMR), `{"pd":-1} `), "pd"},
	} {
		r.sendRaw(c.msg)
		rep := r.recv()
		if rep.err != nil {
			t.Fatalf("%s: the session ended: %v", c.name, rep.err)
		}
		_, e := r.decode(rep, nil)
		r.checkErr(c.name, e, abi.CodeInvalid, c.field)
		r.alive(c.name)
	}

	// Before attaching, VM commands are refused; so are blocking ones.
	r.refused("alloc-pd before attach", abi.OpAllocPD, &abi.AdapterRef{Adapter: "vrdma0"}, abi.CodeState, "")
	r.refused("connect before attach", abi.OpConnect, &abi.Connect{QP: 1, Remote: "victim/vrdma0", Port: 7}, abi.CodeState, "")
	r.refused("get-request before attach", abi.OpGetRequest, &abi.Handle{Handle: 1}, abi.CodeState, "")
	r.refused("attach a path", abi.OpAttach, &abi.Attach{VM: "../../etc/passwd"}, abi.CodeInvalid, "vm")
	r.refused("attach an empty name", abi.OpAttach, &abi.Attach{}, abi.CodeInvalid, "vm")
	r.refused("attach an unknown VM", abi.OpAttach, &abi.Attach{VM: "nosuch"}, abi.CodeNotFound, "vm")
	var att abi.AttachReply
	fds := r.must(abi.OpAttach, &abi.Attach{VM: "hostile"}, &att)
	for _, fd := range fds {
		sys.CloseFD(fd)
	}
	r.refused("attach twice", abi.OpAttach, &abi.Attach{VM: "hostile"}, abi.CodeState, "vm")

	var pd, pd2, listener abi.Handle
	r.must(abi.OpAllocPD, &abi.AdapterRef{Adapter: "vrdma0"}, &pd)
	r.must(abi.OpAllocPD, &abi.AdapterRef{Adapter: "vrdma0"}, &pd2)
	var mr abi.RegMRReply
	r.must(abi.OpRegMR, &abi.RegMR{PD: pd.Handle, Addr: 4096, Length: 4096, Access: abi.AccessLocalWrite}, &mr)
	var cq abi.CreateCQReply
	for _, fd := range r.must(abi.OpCreateCQ, &abi.CreateCQ{Adapter: "vrdma0", CQE: 8}, &cq) {
		sys.CloseFD(fd)
	}
	var qp abi.CreateQPReply
	for _, fd := range r.must(abi.OpCreateQP, &abi.CreateQP{PD: pd.Handle, SendCQ: cq.Handle, RecvCQ: cq.Handle, Type: abi.QPTypeRC,
		Caps: abi.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}, &qp) {
		sys.CloseFD(fd)
	}
	r.must(abi.OpListen, &abi.Listen{Adapter: "vrdma0", Port: 99}, &listener)
	var mwPD abi.Handle // a PD that holds a memory window only
	var mw abi.AllocMWReply
	r.must(abi.OpAllocPD, &abi.AdapterRef{Adapter: "vrdma0"}, &mwPD)
	r.must(abi.OpAllocMW, &abi.AllocMW{PD: mwPD.Handle, Type: abi.MWType1}, &mw)
	okCaps := abi.QPCaps{MaxSendWR: 4, MaxRecvWR: 4}
	for _, c := range []struct {
		name        string
		op          abi.Op
		req         any
		code, field string
	}{
		{"adapter not vrdmaN", abi.OpAllocPD, &abi.AdapterRef{Adapter: "eth0"}, abi.CodeInvalid, "adapter"},
		{"adapter too long", abi.OpQueryDevice, &abi.AdapterRef{Adapter: "vrdma123456"}, abi.CodeInvalid, "adapter"},
		{"missing adapter", abi.OpQueryPort, &abi.AdapterRef{Adapter: "vrdma7"}, abi.CodeNotFound, "adapter"},
		{"dealloc unknown PD", abi.OpDeallocPD, &abi.Handle{Handle: 0xffffffff}, abi.CodeNotFound, "handle"},
		{"dealloc a PD in use", abi.OpDeallocPD, &abi.Handle{Handle: pd.Handle}, abi.CodeState, "handle"},
		{"dealloc a CQ handle as a PD", abi.OpDeallocPD, &abi.Handle{Handle: cq.Handle}, abi.CodeNotFound, "handle"},
		{"MR in unknown PD", abi.OpRegMR, &abi.RegMR{PD: 77, Addr: 0, Length: 1}, abi.CodeNotFound, "pd"},
		{"MR of length 0", abi.OpRegMR, &abi.RegMR{PD: pd.Handle, Addr: 0, Length: 0}, abi.CodeInvalid, "length"},
		{"MR beyond memory", abi.OpRegMR, &abi.RegMR{PD: pd.Handle, Addr: att.MemSize - 10, Length: 11}, abi.CodeInvalid, "addr"},
		{"MR wrapping around", abi.OpRegMR, &abi.RegMR{PD: pd.Handle, Addr: 1<<64 - 8, Length: 16}, abi.CodeInvalid, "addr"},
		{"MR huge length", abi.OpRegMR, &abi.RegMR{PD: pd.Handle, Addr: 8, Length: 1<<64 - 1}, abi.CodeInvalid, "addr"},
		{"MR unknown access bits", abi.OpRegMR, &abi.RegMR{PD: pd.Handle, Addr: 0, Length: 8, Access: 0x100}, abi.CodeInvalid, "access"},
		{"MR remote write without local write", abi.OpRegMR, &abi.RegMR{PD: pd.Handle, Addr: 0, Length: 8, Access: abi.AccessRemoteWrite}, abi.CodeInvalid, "access"},
		{"dereg unknown MR", abi.OpDeregMR, &abi.Handle{Handle: 12345}, abi.CodeNotFound, "handle"},
		{"rereg unknown MR", abi.OpReregMR, &abi.ReregMR{Handle: 12345, Flags: abi.ReregAccess}, abi.CodeNotFound, "handle"},
		{"rereg a CQ handle", abi.OpReregMR, &abi.ReregMR{Handle: cq.Handle, Flags: abi.ReregAccess}, abi.CodeNotFound, "handle"},
		{"rereg without flags", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle}, abi.CodeInvalid, "flags"},
		{"rereg unknown flags", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle, Flags: 8}, abi.CodeInvalid, "flags"},
		{"rereg beyond memory", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle, Flags: abi.ReregTranslation, Addr: att.MemSize - 10, Length: 11, IOVA: 0}, abi.CodeInvalid, "addr"},
		{"rereg huge length", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle, Flags: abi.ReregTranslation, Addr: 8, Length: 1<<64 - 9, IOVA: 0}, abi.CodeInvalid, "addr"},
		{"rereg wrapping iova", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle, Flags: abi.ReregTranslation, Addr: 0, Length: 16, IOVA: 1<<64 - 8}, abi.CodeInvalid, "iova"},
		{"rereg length 0", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle, Flags: abi.ReregTranslation, Addr: 0, Length: 0}, abi.CodeInvalid, "length"},
		{"rereg to unknown PD", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle, Flags: abi.ReregPD, PD: 999}, abi.CodeNotFound, "pd"},
		{"rereg unknown access bits", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle, Flags: abi.ReregAccess, Access: 0x100}, abi.CodeInvalid, "access"},
		{"rereg remote write without local write", abi.OpReregMR, &abi.ReregMR{Handle: mr.Handle, Flags: abi.ReregAccess, Access: abi.AccessRemoteWrite}, abi.CodeInvalid, "access"},
		{"MW in unknown PD", abi.OpAllocMW, &abi.AllocMW{PD: 999, Type: abi.MWType2}, abi.CodeNotFound, "pd"},
		{"MW of type 3", abi.OpAllocMW, &abi.AllocMW{PD: pd.Handle, Type: 3}, abi.CodeInvalid, "type"},
		{"MW of type 0", abi.OpAllocMW, &abi.AllocMW{PD: pd.Handle}, abi.CodeInvalid, "type"},
		{"dealloc unknown MW", abi.OpDeallocMW, &abi.Handle{Handle: 0xffffffff}, abi.CodeNotFound, "handle"},
		{"dealloc a PD handle as an MW", abi.OpDeallocMW, &abi.Handle{Handle: mwPD.Handle}, abi.CodeNotFound, "handle"},
		{"dealloc an MW handle as an MR", abi.OpDeregMR, &abi.Handle{Handle: mw.Handle}, abi.CodeNotFound, "handle"},
		{"dealloc a PD holding an MW", abi.OpDeallocPD, &abi.Handle{Handle: mwPD.Handle}, abi.CodeState, "handle"},
		{"resize unknown CQ", abi.OpResizeCQ, &abi.ResizeCQ{Handle: 0, CQE: 8}, abi.CodeNotFound, "handle"},
		{"resize a PD handle", abi.OpResizeCQ, &abi.ResizeCQ{Handle: pd.Handle, CQE: 8}, abi.CodeNotFound, "handle"},
		{"resize to 0 entries", abi.OpResizeCQ, &abi.ResizeCQ{Handle: cq.Handle, CQE: 0}, abi.CodeInvalid, "cqe"},
		{"resize beyond max_cqe", abi.OpResizeCQ, &abi.ResizeCQ{Handle: cq.Handle, CQE: abi.MaxCQE + 1}, abi.CodeInvalid, "cqe"},
		{"CQ of 0 entries", abi.OpCreateCQ, &abi.CreateCQ{Adapter: "vrdma0", CQE: 0}, abi.CodeInvalid, "cqe"},
		{"CQ beyond max_cqe", abi.OpCreateCQ, &abi.CreateCQ{Adapter: "vrdma0", CQE: abi.MaxCQE + 1}, abi.CodeInvalid, "cqe"},
		{"CQ of 2^32-1 entries", abi.OpCreateCQ, &abi.CreateCQ{Adapter: "vrdma0", CQE: 0xffffffff}, abi.CodeInvalid, "cqe"},
		{"CQ on a bad adapter", abi.OpCreateCQ, &abi.CreateCQ{Adapter: "vrdma", CQE: 1}, abi.CodeInvalid, "adapter"},
		{"destroy unknown CQ", abi.OpDestroyCQ, &abi.Handle{Handle: 0}, abi.CodeNotFound, "handle"},
		{"destroy a CQ in use", abi.OpDestroyCQ, &abi.Handle{Handle: cq.Handle}, abi.CodeState, "handle"},
		{"XRC target QP without its domain", abi.OpCreateQP, &abi.CreateQP{Type: abi.QPTypeXRCRecv}, abi.CodeInvalid, "xrcd"},
		{"QP in unknown PD", abi.OpCreateQP, &abi.CreateQP{PD: 999, SendCQ: cq.Handle, RecvCQ: cq.Handle, Type: abi.QPTypeRC, Caps: okCaps}, abi.CodeNotFound, "pd"},
		{"QP with unknown send CQ", abi.OpCreateQP, &abi.CreateQP{PD: pd.Handle, SendCQ: 999, RecvCQ: cq.Handle, Type: abi.QPTypeRC, Caps: okCaps}, abi.CodeNotFound, "send_cq"},
		{"QP with unknown recv CQ", abi.OpCreateQP, &abi.CreateQP{PD: pd.Handle, SendCQ: cq.Handle, RecvCQ: pd.Handle, Type: abi.QPTypeRC, Caps: okCaps}, abi.CodeNotFound, "recv_cq"},
		{"QP beyond max_qp_wr", abi.OpCreateQP, &abi.CreateQP{PD: pd.Handle, SendCQ: cq.Handle, RecvCQ: cq.Handle, Type: abi.QPTypeRC, Caps: abi.QPCaps{MaxSendWR: 1 << 31, MaxRecvWR: 1}}, abi.CodeInvalid, "caps"},
		{"QP beyond max_sge", abi.OpCreateQP, &abi.CreateQP{PD: pd.Handle, SendCQ: cq.Handle, RecvCQ: cq.Handle, Type: abi.QPTypeRC, Caps: abi.QPCaps{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 0xffffffff}}, abi.CodeInvalid, "caps"},
		{"QP beyond max_inline_data", abi.OpCreateQP, &abi.CreateQP{PD: pd.Handle, SendCQ: cq.Handle, RecvCQ: cq.Handle, Type: abi.QPTypeRC, Caps: abi.QPCaps{MaxSendWR: 1, MaxRecvWR: 1, MaxInlineData: 1 << 20}}, abi.CodeInvalid, "caps"},
		{"modify unknown QP", abi.OpModifyQP, &abi.ModifyQP{Handle: 0, Mask: abi.MaskState, Attr: abi.QPAttr{State: abi.QPSInit}}, abi.CodeNotFound, "handle"},
		{"modify to state 200", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskState, Attr: abi.QPAttr{State: 200}}, abi.CodeInvalid, "qp_state"},
		{"modify port 2", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskPort, Attr: abi.QPAttr{Port: 2}}, abi.CodeInvalid, "port_num"},
		{"modify path MTU 3", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskPathMTU, Attr: abi.QPAttr{PathMTU: 3}}, abi.CodeInvalid, "path_mtu"},
		{"modify dest QPN of 25 bits", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskDestQPN, Attr: abi.QPAttr{DestQPN: 1 << 24}}, abi.CodeInvalid, "dest_qp_num"},
		{"modify timeout 99", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskTimeout, Attr: abi.QPAttr{Timeout: 99}}, abi.CodeInvalid, "timeout"},
		{"modify rnr_retry 8", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskRNRRetry, Attr: abi.QPAttr{RNRRetry: 8}}, abi.CodeInvalid, "rnr_retry"},
		{"modify access bits", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskAccessFlags, Attr: abi.QPAttr{AccessFlags: 1 << 31}}, abi.CodeInvalid, "qp_access_flags"},
		{"RESET to RTS", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskState, Attr: abi.QPAttr{State: abi.QPSRTS}}, abi.CodeState, "qp_state"},
		{"RESET to INIT without port", abi.OpModifyQP, &abi.ModifyQP{Handle: qp.Handle, Mask: abi.MaskState | abi.MaskAccessFlags, Attr: abi.QPAttr{State: abi.QPSInit}}, abi.CodeInvalid, "mask"},
		{"query unknown QP", abi.OpQueryQP, &abi.Handle{Handle: 4242}, abi.CodeNotFound, "handle"},
		{"destroy unknown QP", abi.OpDestroyQP, &abi.Handle{Handle: 0xfffffffe}, abi.CodeNotFound, "handle"},
		{"listen on port 0", abi.OpListen, &abi.Listen{Adapter: "vrdma0", Port: 0}, abi.CodeInvalid, "port"},
		{"listen on a bad adapter", abi.OpListen, &abi.Listen{Adapter: "vrdma9", Port: 5}, abi.CodeNotFound, "adapter"},
		{"listen twice", abi.OpListen, &abi.Listen{Adapter: "vrdma0", Port: 99}, abi.CodeExists, "port"},
		{"get-request on an unknown listener", abi.OpGetRequest, &abi.Handle{Handle: 0xffff}, abi.CodeNotFound, "listener"},
		{"accept on an unknown listener", abi.OpAcceptRequest, &abi.AcceptRequest{Listener: 0xffff, ID: 1, QP: qp.Handle}, abi.CodeNotFound, "listener"},
		{"accept an unknown request", abi.OpAcceptRequest, &abi.AcceptRequest{Listener: listener.Handle, ID: 77, QP: qp.Handle}, abi.CodeNotFound, "id"},
		{"accept with an unknown QP", abi.OpAcceptRequest, &abi.AcceptRequest{Listener: listener.Handle, ID: 1, QP: 555}, abi.CodeNotFound, "qp"},
		{"reject an unknown request", abi.OpRejectRequest, &abi.RejectRequest{Listener: listener.Handle, ID: 9}, abi.CodeNotFound, "id"},
		{"close an unknown listener", abi.OpCloseListener, &abi.Handle{Handle: 31337}, abi.CodeNotFound, "listener"},
		{"connect to port 0", abi.OpConnect, &abi.Connect{QP: qp.Handle, Remote: "victim/vrdma0", Port: 0}, abi.CodeInvalid, "port"},
		{"connect to nowhere", abi.OpConnect, &abi.Connect{QP: qp.Handle, Remote: "", Port: 7}, abi.CodeInvalid, "remote"},
		{"connect to a long name", abi.OpConnect, &abi.Connect{QP: qp.Handle, Remote: strings.Repeat("x", 200), Port: 7}, abi.CodeInvalid, "remote"},
		{"connect to garbage", abi.OpConnect, &abi.Connect{QP: qp.Handle, Remote: "zz::zz::zz", Port: 7}, abi.CodeInvalid, "remote"},
		{"connect to a VM not attached", abi.OpConnect, &abi.Connect{QP: qp.Handle, Remote: "nosuch/vrdma0", Port: 7}, abi.CodeUnavailable, "remote"},
		{"connect to a missing adapter", abi.OpConnect, &abi.Connect{QP: qp.Handle, Remote: "victim/vrdma5", Port: 7}, abi.CodeNotFound, "remote"},
		{"connect to a closed port", abi.OpConnect, &abi.Connect{QP: qp.Handle, Remote: "victim/vrdma0", Port: 4444}, abi.CodeRefused, "port"},
		{"connect with an unknown QP", abi.OpConnect, &abi.Connect{QP: 0, Remote: "victim/vrdma0", Port: 7}, abi.CodeNotFound, "qp"},
		{"define a path", abi.OpDefineVM, &mgmt.DefineVM{Name: "../x", VMX: "memSize = \"4\"\n"}, abi.CodeInvalid, "name"},
		{"define garbage", abi.OpDefineVM, &mgmt.DefineVM{Name: "junk", VMX: "\x00\x01 = = =\n"}, abi.CodeInvalid, "vmx"},
		{"define an attached VM", abi.OpDefineVM, &mgmt.DefineVM{Name: "victim", VMX: lcVMX()}, abi.CodeState, "name"},
		{"define a huge VMX", abi.OpDefineVM, &mgmt.DefineVM{Name: "huge", VMX: strings.Repeat("#", 1<<19+1)}, abi.CodeInvalid, "vmx"},
		{"undefine an unknown VM", abi.OpUndefineVM, &mgmt.VMRef{Name: "nosuch"}, abi.CodeNotFound, "name"},
		{"undefine an attached VM", abi.OpUndefineVM, &mgmt.VMRef{Name: "victim"}, abi.CodeState, "name"},
	} {
		r.refused(c.name, c.op, c.req, c.code, c.field)
	}

	// Blocking commands are bounded per session: pile up get-requests on
	// a listener nobody dials; those beyond the bound are refused at once.
	const flood = 300
	inflight := map[uint32]bool{}
	for range flood {
		inflight[r.start(abi.OpGetRequest, &abi.Handle{Handle: listener.Handle})] = true
	}
	for range flood - 256 { // the refusals come first: the others block
		rep := r.recv()
		if rep.err != nil {
			t.Fatal(rep.err)
		}
		if _, e := r.decode(rep, nil); !inflight[rep.h.Seq] || e == nil || e.Code != abi.CodeLimit {
			t.Fatalf("reply %d to a flood of get-requests: %v, want %s", rep.h.Seq, e, abi.CodeLimit)
		}
		delete(inflight, rep.h.Seq)
	}
	r.alive("a flood of get-requests")
	r.must(abi.OpCloseListener, &abi.Handle{Handle: listener.Handle}, nil)
	for len(inflight) > 0 { // closing the listener ends the others
		var rep lcReply
		for s := range inflight {
			if x, ok := r.early[s]; ok {
				rep = x
				delete(r.early, s)
				break
			}
		}
		if rep.h.Seq == 0 {
			if rep = r.recv(); rep.err != nil {
				t.Fatal(rep.err)
			}
		}
		if !inflight[rep.h.Seq] {
			t.Fatalf("unexpected reply %+v", rep.h)
		}
		delete(inflight, rep.h.Seq)
		if _, e := r.decode(rep, nil); e == nil {
			t.Errorf("get-request %d on a closed listener succeeded", rep.h.Seq)
		}
	}

	// A connect whose QP the dialer destroys before the listener accepts.
	var l2 abi.Handle
	r.must(abi.OpListen, &abi.Listen{Adapter: "vrdma0", Port: 100}, &l2)
	var qp2 abi.CreateQPReply
	for _, fd := range r.must(abi.OpCreateQP, &abi.CreateQP{PD: pd2.Handle, SendCQ: cq.Handle, RecvCQ: cq.Handle, Type: abi.QPTypeRC, Caps: okCaps}, &qp2) {
		sys.CloseFD(fd)
	}
	getSeq := r.start(abi.OpGetRequest, &abi.Handle{Handle: l2.Handle})
	connSeq := r.start(abi.OpConnect, &abi.Connect{QP: qp2.Handle, Remote: "hostile/vrdma0", Port: 100, TimeoutMS: 60000})
	var req abi.ConnRequest
	if _, e := r.wait(getSeq, &req); e != nil {
		t.Fatal(e)
	}
	r.must(abi.OpDestroyQP, &abi.Handle{Handle: qp2.Handle}, nil)
	_, e := r.call(abi.OpAcceptRequest, &abi.AcceptRequest{Listener: l2.Handle, ID: req.ID, QP: qp.Handle}, nil)
	if e == nil {
		t.Error("accepted a connection from a destroyed QP")
	}
	if _, e := r.wait(connSeq, nil); e == nil {
		t.Error("connect with a QP destroyed meanwhile succeeded")
	}

	status := lcAgentStatus(t, ctx, env.Socket)
	if len(status.VMs) < 3 {
		t.Errorf("status lists %d VMs", len(status.VMs))
	}
	r.pc.Close()
	waitCtx, waitCancel := context.WithTimeout(ctx, 30*time.Second)
	defer waitCancel()
	lcWaitDetached(t, waitCtx, env.Socket, "hostile")
	tr.finish(t, ctx)
	lcCheckNoLeaks(t, base)
}

func lcVMX() string { return testenv.VMX(testenv.VMOptions{}) }

// lcHostile is a VM attached through the raw protocol, whose rings the
// test writes by hand.
type lcHostile struct {
	t     *testing.T
	r     *lcRaw
	att   abi.AttachReply
	memFD int
	mem   *sys.Mapping
	pd    uint32
	mr    abi.RegMRReply // [mrAddr, +mrLen), every access right
	undo  []func()       // unmap and close what the test holds, at close
}

const lcMRAddr, lcMRLen = 1 << 20, 64 << 10

func lcAttachHostile(t *testing.T, socket, name string) *lcHostile {
	t.Helper()
	return lcAttachHostileCaps(t, socket, name, 0)
}

// lcAttachHostileCaps is lcAttachHostile after a hello with caps (none
// without: no hello).
func lcAttachHostileCaps(t *testing.T, socket, name string, caps abi.Caps) *lcHostile {
	t.Helper()
	h := &lcHostile{t: t, r: lcDialRaw(t, socket)}
	if caps != 0 {
		var hr abi.HelloReply
		h.r.must(abi.OpHello, &abi.Hello{Client: "hostile", Caps: caps}, &hr)
	}
	fds := h.r.must(abi.OpAttach, &abi.Attach{VM: name}, &h.att)
	if len(fds) != 1 {
		t.Fatalf("attach sent %d descriptors", len(fds))
	}
	h.memFD = fds[0]
	var err error
	if h.mem, err = sys.Map(h.memFD, int(h.att.MemSize), false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.close)
	var pd abi.Handle
	h.r.must(abi.OpAllocPD, &abi.AdapterRef{Adapter: "vrdma0"}, &pd)
	h.pd = pd.Handle
	h.r.must(abi.OpRegMR, &abi.RegMR{PD: h.pd, Addr: lcMRAddr, Length: lcMRLen, Access: abi.AccessAll}, &h.mr)
	return h
}

// close detaches: the session ends, and with it everything the VM held.
// It is idempotent.
func (h *lcHostile) close() {
	h.r.pc.Close()
	h.mem.Unmap()
	sys.CloseFD(h.memFD)
	h.memFD = -1
	for _, f := range h.undo {
		f()
	}
	h.undo = nil
}

type lcRawCQ struct {
	handle uint32
	layout abi.CQLayout
	fd     int
	ring   *sys.Mapping
	ev     *sys.Bell
	head   uint32
}

func (h *lcHostile) newCQ(cqe uint32) *lcRawCQ {
	h.t.Helper()
	var rep abi.CreateCQReply
	fds := h.r.must(abi.OpCreateCQ, &abi.CreateCQ{Adapter: "vrdma0", CQE: cqe}, &rep)
	c := &lcRawCQ{handle: rep.Handle, layout: rep.Layout, fd: fds[0]}
	var err error
	if c.ring, err = sys.Map(fds[0], int(rep.Layout.Size), false); err != nil {
		h.t.Fatal(err)
	}
	if c.ev, err = sys.BellFrom(fds[1]); err != nil {
		h.t.Fatal(err)
	}
	h.undo = append(h.undo, func() {
		c.ring.Unmap()
		c.ev.Close()
		sys.CloseFD(c.fd)
	})
	return c
}

func (c *lcRawCQ) word(off int) *atomic.Uint32 { return abi.Word(c.ring.Bytes(), off) }

// next waits for the next completion and consumes it.
func (c *lcRawCQ) next(t *testing.T) abi.CQE {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.word(abi.OffCQTail).Load() == c.head {
		if time.Now().After(deadline) {
			t.Fatal("no completion in 30 s")
		}
		time.Sleep(50 * time.Microsecond)
	}
	var e abi.CQE
	off := c.layout.Offset + abi.Slot(c.head, c.layout.Entries)*abi.CQESize
	abi.DecodeCQE(c.ring.Bytes()[off:off+abi.CQESize], &e)
	c.head = abi.Next(c.head, c.layout.Entries)
	c.word(abi.OffCQHead).Store(c.head)
	return e
}

type lcRawQP struct {
	h      *lcHostile
	handle uint32
	qpn    uint32
	caps   abi.QPCaps
	layout abi.QPLayout
	fd     int
	ring   *sys.Mapping
	db     *sys.Bell
	sqTail uint32
	rqTail uint32
}

func (h *lcHostile) newQP(scq, rcq *lcRawCQ) *lcRawQP {
	h.t.Helper()
	var rep abi.CreateQPReply
	fds := h.r.must(abi.OpCreateQP, &abi.CreateQP{PD: h.pd, SendCQ: scq.handle, RecvCQ: rcq.handle, Type: abi.QPTypeRC, SQSigAll: true,
		Caps: abi.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}}, &rep)
	q := &lcRawQP{h: h, handle: rep.Handle, qpn: rep.QPN, caps: rep.Caps, layout: rep.Layout, fd: fds[0]}
	var err error
	if q.ring, err = sys.Map(fds[0], int(rep.Layout.Size), false); err != nil {
		h.t.Fatal(err)
	}
	if q.db, err = sys.BellFrom(fds[1]); err != nil {
		h.t.Fatal(err)
	}
	h.undo = append(h.undo, func() {
		q.ring.Unmap()
		q.db.Close()
		sys.CloseFD(q.fd)
	})
	return q
}

func (q *lcRawQP) word(off int) *atomic.Uint32 { return abi.Word(q.ring.Bytes(), off) }
func (q *lcRawQP) state() abi.QPState          { return abi.QPState(q.word(abi.OffQPState).Load()) }

func (q *lcRawQP) modify(mask abi.QPAttrMask, attr abi.QPAttr) {
	q.h.t.Helper()
	q.h.r.must(abi.OpModifyQP, &abi.ModifyQP{Handle: q.handle, Mask: mask, Attr: attr}, nil)
}

// connect brings the QP to RTS facing (gid, qpn), failing at once on a
// missing receive or an absent peer (rnr_retry and retry_cnt 0).
func (q *lcRawQP) connect(gid abi.GID, qpn uint32) {
	q.h.t.Helper()
	q.modify(abi.MaskState|abi.MaskPort|abi.MaskAccessFlags, abi.QPAttr{State: abi.QPSInit, Port: 1, AccessFlags: abi.AccessAll})
	q.modify(abi.MaskState|abi.MaskAV|abi.MaskPathMTU|abi.MaskDestQPN|abi.MaskRQPSN|abi.MaskMaxDestRdAtomic|abi.MaskMinRNRTimer,
		abi.QPAttr{State: abi.QPSRTR, DGID: gid, PathMTU: 1024, DestQPN: qpn, MaxDestRdAtomic: 1, MinRNRTimer: 1})
	q.modify(abi.MaskState|abi.MaskSQPSN|abi.MaskTimeout|abi.MaskRetryCnt|abi.MaskRNRRetry|abi.MaskMaxRdAtomic,
		abi.QPAttr{State: abi.QPSRTS, Timeout: 1})
}

// post writes one send WQE (fill writes the slot) at the tail, publishes
// the new tail and rings the doorbell.
func (q *lcRawQP) post(fill func(slot []byte)) {
	l := q.layout
	slot := q.ring.Bytes()[l.SQOffset+abi.Slot(q.sqTail, l.SQEntries)*l.SQStride:][:l.SQStride]
	clear(slot)
	fill(slot)
	q.sqTail = abi.Next(q.sqTail, l.SQEntries)
	q.setSQTail(q.sqTail)
}

func (q *lcRawQP) setSQTail(v uint32) {
	q.word(abi.OffSQTail).Store(v)
	q.db.Ring()
}

// postRecv writes one receive WQE at the RQ tail and publishes it.
func (q *lcRawQP) postRecv(fill func(slot []byte)) {
	l := q.layout
	slot := q.ring.Bytes()[l.RQOffset+abi.Slot(q.rqTail, l.RQEntries)*l.RQStride:][:l.RQStride]
	clear(slot)
	fill(slot)
	q.rqTail = abi.Next(q.rqTail, l.RQEntries)
	q.word(abi.OffRQTail).Store(q.rqTail)
}

// lcSend returns a slot filler for a well-formed send WQE.
func lcSend(w abi.SendWQE, inline []byte) func([]byte) {
	return func(slot []byte) { abi.EncodeSend(slot, &w, inline) }
}

// waitState waits until the QP's state word reads want.
func (q *lcRawQP) waitState(t *testing.T, want abi.QPState) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for q.state() != want {
		if time.Now().After(deadline) {
			t.Fatalf("QP 0x%x in %s, want %s", q.qpn, q.state(), want)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// lcWaitWR waits for the completion of WR id on a library CQ.
func lcWaitWR(t *testing.T, ctx context.Context, cq *vrdma.CQ, id uint64) vrdma.WorkCompletion {
	t.Helper()
	wc := make([]vrdma.WorkCompletion, 1)
	for {
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for WR %d: %v", id, err)
		}
		if n, _ := cq.Poll(wc); n == 1 {
			if wc[0].WRID != id {
				t.Fatalf("completion %+v, want WR %d", wc[0], id)
			}
			return wc[0]
		}
	}
}

// TestLifecycleHostileRing: a workload that writes garbage into its rings
// gets the completion statuses hardware would give (LOC_QP_OP_ERR for a
// bad opcode, LOC_LEN_ERR for too many SGEs, LOC_PROT_ERR for a bad lkey or
// range), a QP whose indices are garbage moves to ERR without the agent
// spinning on it, a peer's memory is never touched by a refused request,
// a CQ that is full or garbled never wedges a peer or a teardown, and the
// memory it shares cannot be shrunk under the agent. Meanwhile two other
// VMs keep exchanging messages.
func TestLifecycleHostileRing(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := lcNewSide(t, ctx, env.Open(t, "victim", testenv.VMOptions{}))
	b := lcNewSide(t, ctx, env.Open(t, "friend", testenv.VMOptions{}))
	lcConnectCM(t, ctx, a, b, 7)
	tg := lcNewSide(t, ctx, env.Open(t, "target", testenv.VMOptions{}))
	env.Define(t, "hostile", testenv.VMOptions{MemMB: 4})
	base := lcSnapshot(t)
	tr := lcStartTraffic(t, ctx, a, b)

	h := lcAttachHostile(t, env.Socket, "hostile")
	gid := h.att.Adapters[0].GID
	cq := h.newCQ(64)
	lkey := h.mr.LKey

	// The shared memory files cannot be shrunk or grown: a shorter file
	// would make the agent's next access a SIGBUS.
	for what, fd := range map[string]int{"guest memory": h.memFD, "CQ ring": cq.fd} {
		for _, size := range []int64{0, 4096, 1 << 30} {
			if err := unix.Ftruncate(fd, size); !errors.Is(err, unix.EPERM) {
				if err == nil {
					t.Fatalf("the workload resized the %s memfd to %d bytes", what, size)
				}
				t.Errorf("ftruncate of the %s memfd: %v, want EPERM (sealed)", what, err)
			}
		}
	}

	var tqs []*vrdma.QP // the target's QPs, destroyed at the end
	newTQ := func() *vrdma.QP {
		tq := tg.newQP(t, ctx)
		tqs = append(tqs, tq)
		return tq
	}
	// pair returns a hostile QP in RTS connected to a new target QP.
	pair := func() (*lcRawQP, *vrdma.QP) {
		t.Helper()
		q := h.newQP(cq, cq)
		tq := newTQ()
		q.connect(tg.vm.Adapters()[0].GID(), tq.QPN())
		if err := tq.ConnectTo(ctx, vrdma.Endpoint{GID: gid, QPN: q.qpn}); err != nil {
			t.Fatal(err)
		}
		return q, tq
	}
	sge := func(addr uint64, n uint32, key uint32) abi.SGE { return abi.SGE{Addr: addr, Length: n, LKey: key} }
	send := func(id uint64, sges ...abi.SGE) abi.SendWQE {
		w := abi.SendWQE{WRID: id, Opcode: abi.OpSend, Flags: abi.SendSignaled, NumSGE: uint8(len(sges))}
		copy(w.SGE[:], sges)
		return w
	}

	// Malformed send WQEs: each completes with its status, and its QP
	// moves to ERR.
	for _, c := range []struct {
		name string
		fill func([]byte)
		want abi.WCStatus
	}{
		{"unknown opcode", func(s []byte) { lcSend(send(0xa1), nil)(s); s[8] = 0x7f }, abi.WCLocQPOpErr},
		{"opcode 10", func(s []byte) { lcSend(send(0xa2), nil)(s); s[8] = 10 }, abi.WCLocQPOpErr},
		{"more SGEs than max_send_sge", func(s []byte) { lcSend(send(0xa3), nil)(s); s[10] = uint8(min(len(s)/abi.SGESize, 17)) }, abi.WCLocLenErr},
		{"255 SGEs", func(s []byte) { lcSend(send(0xa4), nil)(s); s[10] = 255 }, abi.WCLocLenErr},
		{"bad lkey", lcSend(send(0xa5, sge(lcMRAddr, 64, 0xdeadbe01)), nil), abi.WCLocProtErr},
		{"lkey of no region", lcSend(send(0xa6, sge(lcMRAddr, 64, lkey+1<<8)), nil), abi.WCLocProtErr},
		{"SGE past the region's end", lcSend(send(0xa7, sge(lcMRAddr+lcMRLen-8, 16, lkey)), nil), abi.WCLocProtErr},
		{"SGE before the region", lcSend(send(0xa8, sge(lcMRAddr-8, 16, lkey)), nil), abi.WCLocProtErr},
		{"SGE wrapping around", lcSend(send(0xa9, sge(1<<64-8, 16, lkey)), nil), abi.WCLocProtErr},
		{"second SGE bad", lcSend(send(0xaa, sge(lcMRAddr, 8, lkey), sge(lcMRAddr, 0xffffffff, lkey)), nil), abi.WCLocProtErr},
		{"inline too long", func(s []byte) {
			w := send(0xab)
			w.Flags |= abi.SendInline
			lcSend(w, nil)(s)
			binary.LittleEndian.PutUint32(s[28:], 0xffffff00)
		}, abi.WCLocLenErr},
		{"inline RDMA READ", func(s []byte) {
			w := send(0xac)
			w.Opcode, w.Flags = abi.OpRDMARead, abi.SendSignaled|abi.SendInline
			lcSend(w, nil)(s)
		}, abi.WCLocQPOpErr},
		{"atomic into 4 bytes", func(s []byte) {
			w := send(0xad, sge(lcMRAddr, 4, lkey))
			w.Opcode = abi.OpAtomicFetchAdd
			lcSend(w, nil)(s)
		}, abi.WCLocLenErr},
	} {
		q, _ := pair()
		q.post(c.fill)
		e := cq.next(t)
		if e.Status != c.want || e.QPNum != q.qpn {
			t.Errorf("%s: completion %+v (%s), want %s on QP 0x%x", c.name, e, e.Status, c.want, q.qpn)
		}
		q.waitState(t, abi.QPSErr)
	}

	// A WQE posted by hand before RTS is refused the same way.
	{
		q := h.newQP(cq, cq)
		q.modify(abi.MaskState|abi.MaskPort|abi.MaskAccessFlags, abi.QPAttr{State: abi.QPSInit, Port: 1, AccessFlags: abi.AccessAll})
		q.post(lcSend(send(0xb1, sge(lcMRAddr, 8, lkey)), nil))
		if e := cq.next(t); e.WRID != 0xb1 || e.Status != abi.WCLocQPOpErr {
			t.Errorf("WQE in INIT: completion %+v, want LOC_QP_OP_ERR", e)
		}
	}

	// An RDMA WRITE with a bad rkey: REM_ACCESS_ERR, target untouched.
	{
		q, _ := pair()
		want := slices.Clone(tg.mr.Bytes())
		for _, rk := range []uint32{0, tg.mr.RKey() ^ 0xff, 0xffffffff} {
			w := send(0xc1, sge(lcMRAddr, 256, lkey))
			w.Opcode, w.RemoteAddr, w.RKey = abi.OpRDMAWrite, tg.mr.Addr(), rk
			copy(h.mem.Bytes()[lcMRAddr:], strings.Repeat("X", 256))
			q.post(lcSend(w, nil))
			if e := cq.next(t); e.Status != abi.WCRemAccessErr && e.Status != abi.WCWRFlushErr {
				t.Errorf("RDMA WRITE with rkey 0x%x: %+v, want REM_ACCESS_ERR (or a flush after it)", rk, e)
			}
		}
		if !slices.Equal(tg.mr.Bytes(), want) {
			t.Error("a refused RDMA WRITE changed the target's memory")
		}
	}

	// Agent-owned words scribbled over are ignored: they are the agent's
	// to write, and it never reads them back.
	{
		q, tq := pair()
		for _, off := range []int{abi.OffSQHead, abi.OffRQHead, abi.OffQPState, abi.OffSQDoorbell} {
			q.word(off).Store(0xdeadbeef)
		}
		copy(h.mem.Bytes()[lcMRAddr:], "scribbled")
		if err := tq.PostRecv([]vrdma.RecvWR{{ID: 0xd0, SGL: []vrdma.SGE{tg.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
		q.post(lcSend(send(0xd1, sge(lcMRAddr, 9, lkey)), nil))
		if e := cq.next(t); e.WRID != 0xd1 || e.Status != abi.WCSuccess {
			t.Errorf("send after scribbling on agent words: %+v", e)
		}
		if c := lcWaitWR(t, ctx, tg.cq, 0xd0); c.Status != vrdma.WCSuccess || string(tg.mr.Bytes()[:9]) != "scribbled" {
			t.Errorf("target received %+v %q", c, tg.mr.Bytes()[:9])
		}
	}

	// A garbage SQ tail: the QP moves to ERR, nothing completes for the
	// garbage, and the agent does not spin on it (it would log it again
	// and again). A valid tail afterwards is flushed.
	{
		q, _ := pair()
		q.setSQTail(0xdeadbeef)
		q.waitState(t, abi.QPSErr)
		for range 5 {
			q.db.Ring()
			time.Sleep(2 * time.Millisecond) // gives a spinning agent the chance to show it
		}
		n := 0
		for _, l := range env.Logs(slog.LevelWarn) {
			if strings.Contains(l, "send queue tail index is invalid") && strings.Contains(l, fmt.Sprintf("qpn=%d ", q.qpn)) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the garbage SQ tail was logged %d times, want once", n)
		}
		head := q.word(abi.OffSQHead).Load()
		q.sqTail = head
		q.post(lcSend(send(0xe1, sge(lcMRAddr, 8, lkey)), nil))
		if e := cq.next(t); e.WRID != 0xe1 || e.Status != abi.WCWRFlushErr {
			t.Errorf("WQE after a garbage tail was fixed: %+v, want WR_FLUSH_ERR", e)
		}
	}

	// A garbage RQ tail on the receiving side: the sender's SEND fails
	// with REM_OP_ERR and both QPs end in ERR.
	{
		q, tq := pair()
		q.word(abi.OffRQTail).Store(0x80000001)
		if err := tq.PostSend([]vrdma.SendWR{{ID: 0xf1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{tg.mr.SGE(0, 8)}}}); err != nil {
			t.Fatal(err)
		}
		if c := lcWaitWR(t, ctx, tg.cq, 0xf1); c.Status != vrdma.WCRemOpErr {
			t.Errorf("SEND to a QP with a garbage RQ tail: %+v, want REM_OP_ERR", c)
		}
		q.waitState(t, abi.QPSErr)
		if st := tq.State(); st != vrdma.QPSErr {
			t.Errorf("sender in %s after REM_OP_ERR, want ERR", st)
		}
	}

	// Malformed receive WQEs: the receive completes with its status, the
	// sender gets REM_OP_ERR, the target's memory stays as it was.
	for _, c := range []struct {
		name string
		fill func([]byte)
		want abi.WCStatus
	}{
		{"receive with 200 SGEs", func(s []byte) { binary.LittleEndian.PutUint64(s, 0x101); s[8] = 200 }, abi.WCLocLenErr},
		{"receive with a bad lkey", func(s []byte) {
			abi.EncodeRecv(s, &abi.RecvWQE{WRID: 0x102, NumSGE: 1, SGE: [abi.MaxSGE]abi.SGE{sge(lcMRAddr, 64, 0x12345678)}})
		}, abi.WCLocProtErr},
		{"receive outside memory", func(s []byte) {
			abi.EncodeRecv(s, &abi.RecvWQE{WRID: 0x103, NumSGE: 1, SGE: [abi.MaxSGE]abi.SGE{sge(1<<62, 64, lkey)}})
		}, abi.WCLocProtErr},
		{"receive too small", func(s []byte) {
			abi.EncodeRecv(s, &abi.RecvWQE{WRID: 0x104, NumSGE: 1, SGE: [abi.MaxSGE]abi.SGE{sge(lcMRAddr, 4, lkey)}})
		}, abi.WCLocLenErr},
	} {
		q, tq := pair()
		q.postRecv(c.fill)
		if err := tq.PostSend([]vrdma.SendWR{{ID: 0x1f, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{tg.mr.SGE(0, 8)}}}); err != nil {
			t.Fatal(err)
		}
		if sc := lcWaitWR(t, ctx, tg.cq, 0x1f); sc.Status == vrdma.WCSuccess {
			t.Errorf("%s: the sender's SEND succeeded", c.name)
		}
		if e := cq.next(t); e.Status != c.want || e.Opcode != abi.WCRecv || e.QPNum != q.qpn {
			t.Errorf("%s: completion %+v, want RECV %s", c.name, e, c.want)
		}
		q.waitState(t, abi.QPSErr)
	}

	// SQD holds the send queue; the move back to RTS resumes it.
	{
		q, tq := pair()
		if err := tq.PostRecv([]vrdma.RecvWR{{ID: 0x201, SGL: []vrdma.SGE{tg.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
		q.modify(abi.MaskState, abi.QPAttr{State: abi.QPSSQD})
		q.post(lcSend(send(0x202, sge(lcMRAddr, 8, lkey)), nil))
		q.modify(abi.MaskState, abi.QPAttr{State: abi.QPSRTS})
		if e := cq.next(t); e.WRID != 0x202 || e.Status != abi.WCSuccess {
			t.Errorf("send held in SQD: %+v", e)
		}
		lcWaitWR(t, ctx, tg.cq, 0x201)
	}

	// A CQ whose head index is garbage is broken: its completions are
	// dropped, and its QP consumes (flushes) its send queue all the same.
	{
		bad := h.newCQ(8)
		bad.word(abi.OffCQHead).Store(0xfffffff0)
		q := h.newQP(bad, bad)
		tq := newTQ()
		q.connect(tg.vm.Adapters()[0].GID(), tq.QPN())
		q.post(func(s []byte) { lcSend(send(0x301), nil)(s); s[8] = 0x7f }) // fails: ERR
		for i := range 4 {
			q.post(lcSend(send(0x302+uint64(i), sge(lcMRAddr, 8, lkey)), nil))
		}
		deadline := time.Now().Add(30 * time.Second)
		for q.word(abi.OffSQHead).Load() != q.sqTail {
			if time.Now().After(deadline) {
				t.Fatalf("a QP with a broken CQ stopped consuming its send queue at %d of %d", q.word(abi.OffSQHead).Load(), q.sqTail)
			}
			time.Sleep(50 * time.Microsecond)
		}
		if st := q.state(); st != abi.QPSErr {
			t.Errorf("QP in %s, want ERR", st)
		}
		if tail := bad.word(abi.OffCQTail).Load(); tail != 0 {
			t.Errorf("%d completions written to a CQ whose head is garbage", tail)
		}
	}

	// A full CQ that its workload never polls holds back the peer that
	// completes into it (its SEND waits, as for a missing receive), but
	// never a teardown: the peer can destroy its QP, and the hostile side
	// can destroy its own.
	for _, who := range []string{"the sender", "the full CQ's owner"} {
		one := h.newCQ(1)
		q := h.newQP(cq, one)
		tq := newTQ()
		q.connect(tg.vm.Adapters()[0].GID(), tq.QPN())
		if err := tq.ConnectTo(ctx, vrdma.Endpoint{GID: gid, QPN: q.qpn}); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			q.postRecv(func(s []byte) {
				abi.EncodeRecv(s, &abi.RecvWQE{WRID: uint64(0x400 + i), NumSGE: 1, SGE: [abi.MaxSGE]abi.SGE{sge(lcMRAddr, 64, lkey)}})
			})
		}
		for i := range 3 {
			if err := tq.PostSend([]vrdma.SendWR{{ID: uint64(0x410 + i), Opcode: vrdma.OpSend, SGL: []vrdma.SGE{tg.mr.SGE(0, 8)}}}); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(30 * time.Second)
		for one.word(abi.OffCQTail).Load() == 0 { // the first receive completed: the CQ is full
			if time.Now().After(deadline) {
				t.Fatal("no receive completed")
			}
			time.Sleep(50 * time.Microsecond)
		}
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		if who == "the sender" {
			if err := tq.Destroy(dctx); err != nil {
				t.Errorf("destroying a QP whose peer's CQ is full: %v", err)
			}
		} else {
			done := make(chan *abi.Error, 1)
			go func() {
				_, e := h.r.call(abi.OpDestroyQP, &abi.Handle{Handle: q.handle}, nil)
				done <- e
			}()
			select {
			case e := <-done:
				if e != nil {
					t.Errorf("destroying the QP with the full CQ: %v", e)
				}
			case <-dctx.Done():
				t.Fatal("destroying the QP with the full CQ hangs")
			}
		}
		dcancel()
	}

	h.r.alive("the hostile ring cases")
	h.close()
	lcWaitDetached(t, ctx, env.Socket, "hostile")
	tr.finish(t, ctx)
	// What the test made on the target since the baseline goes too.
	for _, tq := range tqs {
		tq.Destroy(ctx) // one was destroyed already: that one fails
	}
	lcCheckNoLeaks(t, base)
}

// TestVMCloseReleasesDescriptors: a VM closed with QPs and CQs it never
// destroyed leaves this process none of their descriptors (each holds a
// doorbell: a socket and an eventfd). A test binary whose tests closed
// VMs so ran out of descriptors (TestScaleQPs, 1,024 QPs a run: 2,048
// descriptors left behind each time).
func TestVMCloseReleasesDescriptors(t *testing.T) {
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	count := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	vm := env.Open(t, "fdclose0", testenv.VMOptions{MemMB: 16})
	newEnd(t, vm, qpConfig{}) // the first: the agent's connection and the process's pollers settle
	vm.Close()
	before := count()
	vm = env.Open(t, "fdclose1", testenv.VMOptions{MemMB: 16})
	for range 16 {
		newEnd(t, vm, qpConfig{}) // a QP and two CQs, never destroyed
	}
	if held := count() - before; held < 16*3*2 {
		t.Fatalf("16 QPs and 32 CQs hold %d descriptors; want 2 each at least (the test counts the wrong thing)", held)
	}
	vm.Close()
	if after := count(); after > before {
		t.Errorf("closing a VM left %d descriptors of its QPs and CQs (%d before it opened, %d after it closed)", after-before, before, after)
	}
}
