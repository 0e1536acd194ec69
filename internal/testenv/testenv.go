// Package testenv starts host agents and defines VMs for tests: an agent
// in this process (real socket, real shared memory), or a real vrdmad
// process built from this module.
package testenv

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
)

// Env is a running agent and the means to define VMs on it.
type Env struct {
	Socket   string
	StateDir string
	Agent    *agent.Agent // nil for an agent process
	Cmd      *exec.Cmd    // nil for an in-process agent
}

// VMOptions shape a test VM.
type VMOptions struct {
	MemMB    int  // guest memory, MB (default 4)
	Locked   bool // reserve and lock all guest memory
	Async    bool // vrdma.asyncMode
	Adapters int  // number of adapters (default 1)
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
	for i := 0; i < o.Adapters; i++ {
		s += fmt.Sprintf("ethernet%d.present = \"TRUE\"\nethernet%d.virtualDev = \"vrdma\"\n", i, i)
	}
	return s
}

// Start runs an agent in this process with fresh state; it stops at the
// end of the test.
func Start(tb testing.TB) *Env {
	tb.Helper()
	dir := shortTempDir(tb)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	a, err := agent.New(agent.Config{Socket: filepath.Join(dir, "s"), StateDir: filepath.Join(dir, "state"), Host: "hostA", Logger: logger})
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
		wg.Wait()
	})
	return &Env{Socket: a.Socket(), StateDir: filepath.Join(dir, "state"), Agent: a}
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
