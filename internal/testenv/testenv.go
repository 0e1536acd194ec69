// SPDX-License-Identifier: Apache-2.0

// Package testenv starts host agents and defines VMs for tests: an agent
// in this process (real socket, real shared memory), or a real vrdmad
// process built from this module.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/testlink"
	"github.com/vrdma/vrdma/internal/transport/rdma"
)

// Env is a running agent and the means to define VMs on it.
type Env struct {
	Socket   string
	StateDir string
	Agent    *agent.Agent // nil for an agent process
	Cmd      *exec.Cmd    // nil for an in-process agent

	logs      *logs           // in-process agent
	testStats *testlink.Stats // its test link's frames; nil without
	stderr    SyncBuffer      // agent process
	exited    chan struct{}   // closed when the agent process has exited
	waitErr   error           // the process's exit, once exited is closed
	bin       string          // agent process: its binary (Restart)
	args      []string        // and flags
}

// SyncBuffer is a bytes.Buffer safe for concurrent use: what a process or
// a goroutine writes while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer // +checklocks:mu
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// VMOptions shape a test VM.
type VMOptions struct {
	MemMB    int  // guest memory, MB (default 4)
	Locked   bool // reserve and lock all guest memory
	Async    bool // vrdma.asyncMode
	Adapters int  // number of adapters (default 1)
	// IPv4 are the adapters' vrdmaN.ipAddress values, by index; "" or a
	// missing entry leaves the key out.
	IPv4 []string
	// Disconnected attaches the adapters with their ports down
	// (ethernetN.startConnected = "FALSE").
	Disconnected bool
	// DirectPeers is vrdma.directPeers: the VMs that may map this one's
	// memory (the memcpy-direct path); nil leaves the key out.
	DirectPeers []string
}

// VMX returns a VMX text for o.
func VMX(o VMOptions) string {
	if o.MemMB == 0 {
		o.MemMB = 4
	}
	if o.Adapters == 0 {
		o.Adapters = 1
	}
	s := fmt.Sprintf(".encoding = \"UTF-8\"\nconfig.version = \"8\"\nvirtualHW.version = \"20\"\nguestOS = \"ubuntu-64\"\nmemSize = \"%d\"\n", o.MemMB)
	if o.Locked {
		s += fmt.Sprintf("sched.mem.min = \"%d\"\nsched.mem.minSize = \"%d\"\nsched.mem.pin = \"TRUE\"\n", o.MemMB, o.MemMB)
	}
	if o.Async {
		s += "vrdma.asyncMode = \"TRUE\"\nsched.cpu.latencySensitivity = \"high\"\n"
	}
	if o.DirectPeers != nil {
		s += fmt.Sprintf("vrdma.directPeers = %q\n", strings.Join(o.DirectPeers, " "))
	}
	for i := 0; i < o.Adapters; i++ {
		s += fmt.Sprintf("ethernet%d.present = \"TRUE\"\nethernet%d.virtualDev = \"vrdma\"\n", i, i)
		if i < len(o.IPv4) && o.IPv4[i] != "" {
			s += fmt.Sprintf("vrdma%d.ipAddress = %q\n", i, o.IPv4[i])
		}
		if o.Disconnected {
			s += fmt.Sprintf("ethernet%d.startConnected = \"FALSE\"\n", i)
		}
	}
	return s
}

// Options shape an in-process agent.
type Options struct {
	Limits agent.Limits // per-VM limits; a zero field takes agent.DefaultLimits
	// MaxBlocking is agent.Config.MaxBlocking; 0 takes its default.
	MaxBlocking int
	Quotas      agent.Quotas // per-uid caps and the pinned-memory budget; a zero field takes its default
	// Host is the agent's host name; default "hostA".
	Host string
	// Control runs the agent with a control plane (see StartControl);
	// nil, the default, runs it standalone, without etcd.
	Control *agent.ControlConfig
	// TestLink puts QPs between the agent's VMs on the test path, over an
	// in-process link with these faults (tcp.NewTestLink); Env.TestLinkStats
	// counts its frames.
	TestLink *testlink.Faults
	// TestLinkVMs, if set, puts only the QPs of these VMs on the test
	// link (or the rdma loop); the other VMs' QPs take the agent's own
	// path (memcpy), also towards these VMs.
	TestLinkVMs []string
	// RDMALoop puts QPs between the agent's VMs on the rdma path, the
	// agent's RoCEv2 engine on this UDP address sending to itself
	// (port 0: 4791); RDMALoopConn, if set, wraps its socket (a fault
	// injector, rdmatest.Faulty). Both are the agent's local paths
	// (agent.WithLocalPaths, localpaths.go).
	RDMALoop     netip.AddrPort
	RDMALoopConn func(rdma.Conn) rdma.Conn
	RDMALoopDSCP uint8 // the DSCP the rdma loop's packets carry
	RDMALoopPrio uint8 // and their socket priority
	// MetricsListen is agent.Config.MetricsListen.
	MetricsListen string
	// MetricsNoQPSeries is agent.Config.MetricsNoQPSeries.
	MetricsNoQPSeries bool
	// Clock is the agent's clock for RC timers; nil: the real one.
	Clock clock.Clock
	// AllowErrors, if set, matches the errors the test makes the agent
	// log on purpose (a panic it injects): they do not fail the test at
	// its end, which checks them itself (Env.Logs).
	AllowErrors *regexp.Regexp
}

// Start runs an agent in this process with fresh state; it stops at the
// end of the test. The test fails at its end if the agent logged an error
// (a command handler or a QP goroutine panicked).
func Start(tb testing.TB) *Env { return StartWith(tb, Options{}) }

// StartWith is Start with options.
func StartWith(tb testing.TB, o Options) *Env {
	tb.Helper()
	dir := shortTempDir(tb)
	var inner slog.Handler = slog.NewTextHandler(io.Discard, nil)
	if testing.Verbose() {
		inner = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	rec := &recorder{inner: inner, logs: new(logs)}
	if o.Host == "" {
		o.Host = "hostA"
	}
	var opts []agent.Option
	var stats *testlink.Stats
	if o.TestLink != nil {
		stats = new(testlink.Stats)
	}
	if mk := o.localPaths(stats); mk != nil {
		opts = append(opts, agent.WithLocalPaths(mk))
	}
	a, err := agent.New(agent.Config{Socket: filepath.Join(dir, "s"), StateDir: filepath.Join(dir, "state"), Host: o.Host,
		Logger: slog.New(rec), Limits: o.Limits, MaxBlocking: o.MaxBlocking, Quotas: o.Quotas, Control: o.Control, Clock: o.Clock, MetricsListen: o.MetricsListen, MetricsNoQPSeries: o.MetricsNoQPSeries}, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.Serve(ctx)
	}()
	tb.Cleanup(func() {
		cancel()
		if !waitGroupFor(&wg, serveStopTimeout) {
			tb.Errorf("the agent's Serve did not return within %v of its context's end (a hang in its shutdown); every goroutine:\n%s", serveStopTimeout, allStacks())
		}
		errs := rec.logs.get(slog.LevelError)
		if o.AllowErrors != nil {
			errs = slices.DeleteFunc(errs, o.AllowErrors.MatchString)
		}
		if len(errs) > 0 {
			tb.Errorf("the agent logged %d errors (a bug):\n%s", len(errs), strings.Join(errs, "\n"))
		}
	})
	return &Env{Socket: a.Socket(), StateDir: filepath.Join(dir, "state"), Agent: a, logs: rec.logs, testStats: stats}
}

// TestLinkStats returns the frames the in-process agent's test link
// (Options.TestLink) carried, by fate; nil without a test link.
func (e *Env) TestLinkStats() *testlink.Stats { return e.testStats }

// Logs returns what the in-process agent logged at level or above, one
// line per record: the message, then its attributes.
func (e *Env) Logs(level slog.Level) []string {
	if e.logs == nil {
		return nil
	}
	return e.logs.get(level)
}

type logs struct {
	mu  sync.Mutex
	all []logLine // +checklocks:mu
}

type logLine struct {
	level slog.Level
	text  string
}

func (l *logs) get(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.all {
		if r.level >= level {
			out = append(out, r.text)
		}
	}
	return out
}

// recorder is a slog.Handler that keeps every record and passes it on.
type recorder struct {
	inner slog.Handler
	attrs []slog.Attr
	logs  *logs
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(ctx context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	add := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range r.attrs {
		add(a)
	}
	rec.Attrs(add)
	r.logs.mu.Lock()
	r.logs.all = append(r.logs.all, logLine{rec.Level, b.String()})
	r.logs.mu.Unlock()
	if r.inner.Enabled(ctx, rec.Level) {
		return r.inner.Handle(ctx, rec)
	}
	return nil
}

func (r *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &recorder{inner: r.inner.WithAttrs(as), attrs: append(append([]slog.Attr(nil), r.attrs...), as...), logs: r.logs}
}

func (r *recorder) WithGroup(name string) slog.Handler {
	return &recorder{inner: r.inner.WithGroup(name), attrs: r.attrs, logs: r.logs}
}

// ProcessOptions shape an agent process.
type ProcessOptions struct {
	Limits agent.Limits // per-VM limits; a zero field takes the default
	Args   []string     // more vrdmad flags, after the defaults (a flag given again wins)
	// Wrap is a command that runs vrdmad, its arguments before vrdmad's
	// path: {"setpriv", "--inh-caps=-ipc_lock", "--"} runs it without a
	// capability. The wrapper must exec vrdmad, so that the process's pid
	// stays vrdmad's.
	Wrap []string
}

// logTail is how much of an agent process's log a failed test prints.
const logTail = 256 << 10

// StartProcess runs a real vrdmad process, built from this module (once
// per test binary), with fresh state. It is killed at the end of the test
// if it still runs; Kill kills it before. A test that failed logs the end
// of the agent's log (logTail bytes).
func StartProcess(tb testing.TB, o ProcessOptions) *Env {
	tb.Helper()
	bin := AgentBinary(tb)
	dir := shortTempDir(tb)
	e := &Env{Socket: filepath.Join(dir, "s"), StateDir: filepath.Join(dir, "state")}
	args := []string{"--socket", e.Socket, "--state-dir", e.StateDir, "--host", "hostA", "--log-level", "warn", "--no-control-plane"}
	for _, l := range []struct {
		flag string
		v    int
	}{{"--max-qp", o.Limits.MaxQP}, {"--max-cq", o.Limits.MaxCQ}, {"--max-mr", o.Limits.MaxMR}, {"--max-pd", o.Limits.MaxPD}} {
		if l.v > 0 {
			args = append(args, l.flag, fmt.Sprint(l.v))
		}
	}
	args = append(args, o.Args...)
	if len(o.Wrap) > 0 {
		args = append(append(append([]string(nil), o.Wrap[1:]...), bin), args...)
		bin = o.Wrap[0]
	}
	e.bin, e.args = bin, args
	tb.Cleanup(func() {
		e.Kill()
		if tb.Failed() { // what the agent said helps explain a failure that does not recur
			log := e.stderr.String()
			if n := len(log); n > logTail {
				log = "…" + log[n-logTail:]
			}
			tb.Logf("vrdmad's log (%s):\n%s", e.Socket, log)
		}
	})
	if err := e.startProcess(); err != nil {
		tb.Fatal(err)
	}
	return e
}

// Restart kills an agent process (SIGKILL) if it runs and starts it again
// with the same flags, socket and state directory (VM definitions persist
// there), and waits until it answers. It fails tb for an in-process agent
// or if the agent does not come back.
func (e *Env) Restart(tb testing.TB) {
	tb.Helper()
	if e.Cmd == nil {
		tb.Fatal("testenv: Restart: the agent is in this process, not its own")
	}
	e.Kill()
	fmt.Fprintf(&e.stderr, "--- testenv: restarted at %s ---\n", time.Now().Format("15:04:05.000"))
	if err := e.startProcess(); err != nil {
		tb.Fatalf("restart: %v", err)
	}
}

// startProcess starts the agent process with e's binary and flags and
// waits until it answers on its socket.
func (e *Env) startProcess() error {
	cmd := exec.Command(e.bin, e.args...)
	cmd.Stderr = &e.stderr
	exited := make(chan struct{})
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", e.bin, err)
	}
	e.Cmd, e.exited = cmd, exited
	go func() {
		e.waitErr = cmd.Wait()
		close(exited)
	}()
	// Wait until it answers.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(e.Socket))
		cancel()
		if err == nil {
			a.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("vrdmad exited before serving: %v\n%s", e.waitErr, e.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vrdmad does not answer on %s: %v\n%s", e.Socket, err, e.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ProcStatus returns a field of the agent process's /proc/PID/status
// (Threads, VmRSS in kB, ...) as a number.
func (e *Env) ProcStatus(tb testing.TB, field string) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", e.PID(tb)))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			if err != nil {
				tb.Fatalf("/proc status field %s: %v", field, err)
			}
			return n
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, e.PID(tb))
	return 0
}

// CPUTime returns the CPU time (user + system) the agent process used so
// far, from /proc/PID/stat.
func (e *Env) CPUTime(tb testing.TB) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", e.PID(tb)))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name, which is in parentheses: state is
	// field 3, utime 14, stime 15 (proc(5)).
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		tb.Fatalf("/proc/%d/stat: %q", e.PID(tb), b)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * time.Second / clockTicks
}

// clockTicks is sysconf(_SC_CLK_TCK), 100 on Linux.
const clockTicks = 100

// PID returns the agent process's ID; it fails tb for an in-process agent.
func (e *Env) PID(tb testing.TB) int {
	tb.Helper()
	if e.Cmd == nil || e.Cmd.Process == nil {
		tb.Fatal("testenv: the agent is in this process, not its own")
	}
	return e.Cmd.Process.Pid
}

// Kill kills an agent process (SIGKILL) and waits for it to exit.
func (e *Env) Kill() {
	if e.Cmd == nil {
		return
	}
	e.Cmd.Process.Kill()
	<-e.exited
}

// Stderr returns what an agent process wrote to its standard error.
func (e *Env) Stderr() string { return e.stderr.String() }

// buildHome is HOME when the test binary started: tests that isolate
// themselves point HOME elsewhere, and the go command would then build
// vrdmad with an empty build cache (minutes, not seconds).
var buildHome = os.Getenv("HOME")

// built is the binaries of this module's commands built for this test
// binary, by command name.
var built struct {
	mu   sync.Mutex
	bins map[string]*builtBinary // +checklocks:mu
}

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

// AgentBinary returns the path of a vrdmad binary built from this module,
// building it on first use (Binary).
func AgentBinary(tb testing.TB) string {
	tb.Helper()
	return Binary(tb, "vrdmad")
}

// Binary returns the path of the binary of this module's command
// cmd/name, building it on first use. It lives next to the test binary
// (in the go command's work directory, which go test removes) when it
// can, so that a test run builds it once.
func Binary(tb testing.TB, name string) string {
	tb.Helper()
	built.mu.Lock()
	if built.bins == nil {
		built.bins = map[string]*builtBinary{}
	}
	b := built.bins[name]
	if b == nil {
		b = &builtBinary{}
		built.bins[name] = b
	}
	built.mu.Unlock()
	b.once.Do(func() { b.path, b.err = buildCommand(name) })
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}

func buildCommand(name string) (string, error) {
	base := os.TempDir()
	if exe, err := os.Executable(); err == nil {
		base = filepath.Dir(exe)
	}
	dir, err := os.MkdirTemp(base, name+"-")
	if err != nil {
		dir, err = os.MkdirTemp("", name+"-")
	}
	if err != nil {
		return "", err
	}
	goTool := "go"
	if p, err := exec.LookPath("go"); err == nil {
		goTool = p
	} else if r := os.Getenv("GOROOT"); r != "" {
		goTool = filepath.Join(r, "bin", "go")
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command(goTool, "build", "-o", out, "github.com/vrdma/vrdma/cmd/"+name)
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		cmd.Dir = filepath.Dir(file) // inside the module
	}
	if buildHome != "" {
		cmd.Env = append(os.Environ(), "HOME="+buildHome)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, b)
	}
	return out, nil
}

// shortTempDir returns a temporary directory whose path fits a Unix
// socket address (108 bytes), removed at the end of the test.
func shortTempDir(tb testing.TB) string {
	dir, err := os.MkdirTemp("", "vrdma")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Define defines VM name on the agent.
func (e *Env) Define(tb testing.TB, name string, o VMOptions) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(e.Socket))
	if err != nil {
		tb.Fatal(err)
	}
	defer a.Close()
	if err := a.DefineVM(ctx, name, []byte(VMX(o))); err != nil {
		tb.Fatalf("define VM %s: %v", name, err)
	}
}

// Open defines VM name and attaches to it; the VM is closed at the end of
// the test.
func (e *Env) Open(tb testing.TB, name string, o VMOptions) *vrdma.VM {
	tb.Helper()
	e.Define(tb, name, o)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := vrdma.Open(ctx, name, vrdma.WithSocket(e.Socket))
	if err != nil {
		tb.Fatalf("open VM %s: %v", name, err)
	}
	tb.Cleanup(func() { v.Close() })
	return v
}

// serveStopTimeout bounds how long an in-process agent's cleanup waits for
// its Serve to return: a shutdown that hangs fails the test with every
// goroutine's stack, rather than hang the package until go test's timeout.
const serveStopTimeout = 30 * time.Second

// waitGroupFor waits for wg up to d and reports whether it finished.
func waitGroupFor(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// allStacks returns the stacks of every goroutine of this process.
func allStacks() string {
	var b bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	return b.String()
}
