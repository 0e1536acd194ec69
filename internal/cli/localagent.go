// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
)

// localAgent is a host agent process with temporary state, which
// quickstart and perf --local start for themselves and stop when done: it
// touches nothing of the machine but a temporary directory.
type localAgent struct {
	Dir    string // temporary directory: socket, state, log
	Socket string
	How    string // which binary runs, and why that one
	Host   string // the host name the agent reports
	HostID string // and its ID

	cmd       *exec.Cmd
	cand      agentCandidate // the binary that started, for restart
	extraArgs []string       // agent flags beyond socket, state and log level
	exited    chan struct{}  // closed when the process has exited
	waitErr   error          // set before exited is closed
	logPath   string
}

// agentEnv names the environment variable that picks the agent binary:
// "self" re-executes vrdmactl ("vrdmactl agent"); a path runs that binary.
// Unset: vrdmad next to vrdmactl, else vrdmad on PATH, else vrdmactl itself.
const agentEnv = "VRDMACTL_AGENT"

type agentCandidate struct {
	path string
	args []string // before the flags
	how  string
}

// agentCandidates lists the agent binaries to try, best first.
func agentCandidates() []agentCandidate {
	exe, err := os.Executable()
	self := agentCandidate{path: exe, args: []string{"agent"}, how: "vrdmactl agent (vrdmactl re-executed: no vrdmad binary found next to it or on PATH)"}
	if err != nil {
		self = agentCandidate{path: os.Args[0], args: []string{"agent"}, how: "vrdmactl agent"}
	}
	switch v := os.Getenv(agentEnv); v {
	case "":
	case "self":
		self.how = "vrdmactl agent (" + agentEnv + "=self)"
		return []agentCandidate{self}
	default:
		return []agentCandidate{{path: v, how: v + " (" + agentEnv + ")"}}
	}
	var out []agentCandidate
	seen := map[string]bool{}
	add := func(p, how string) {
		if p == "" {
			return
		}
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		if r, err := filepath.EvalSymlinks(p); err == nil && !seen[r] {
			seen[r] = true
			out = append(out, agentCandidate{path: p, how: how})
		}
	}
	if err == nil {
		next := filepath.Join(filepath.Dir(exe), "vrdmad")
		if isExecutable(next) {
			add(next, next+" (next to vrdmactl)")
		}
	}
	if p, err := exec.LookPath("vrdmad"); err == nil {
		add(p, p+" (on PATH)")
	}
	return append(out, self)
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// agentStartTimeout bounds the wait for one agent binary to answer.
const agentStartTimeout = 15 * time.Second

// startLocalAgent starts an agent process on a fresh temporary directory
// and waits until its socket answers. It tries the candidates in turn: a
// binary that exits or answers garbage is skipped, and the error names
// each one and why it failed.
//
// extraArgs are more agent flags: "--no-control-plane" for an agent without
// etcd, "--switch NAME" for quickstart's.
func startLocalAgent(ctx context.Context, extraArgs ...string) (*localAgent, error) {
	dir, err := os.MkdirTemp("", "vrdmactl-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory for the agent: %w", err)
	}
	// A Unix socket path must fit 108 bytes.
	if len(dir) > 80 {
		os.RemoveAll(dir)
		if dir, err = os.MkdirTemp("/tmp", "vrdmactl-"); err != nil {
			return nil, fmt.Errorf("temporary directory for the agent: %w", err)
		}
	}
	var failures []string
	for i, c := range agentCandidates() {
		l := &localAgent{Dir: dir, Socket: filepath.Join(dir, "vrdmad.sock"), How: c.how,
			logPath: filepath.Join(dir, fmt.Sprintf("agent-%d.log", i)), extraArgs: extraArgs}
		err := l.start(ctx, c)
		if err == nil {
			l.cand = c
			return l, nil
		}
		l.stop()
		failures = append(failures, fmt.Sprintf("%s: %v", c.how, err))
		if ctx.Err() != nil {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("could not start a host agent:\n  %s", strings.Join(failures, "\n  "))
}

func (l *localAgent) start(ctx context.Context, c agentCandidate) error {
	logf, err := os.Create(l.logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append(append([]string(nil), c.args...),
		"--socket", l.Socket, "--state-dir", l.StateDir(), "--log-level", "warn")
	args = append(args, l.extraArgs...)
	cmd := exec.Command(c.path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = os.Environ()
	// Its own process group: a Ctrl-C reaches vrdmactl, which stops the
	// agent itself after cleaning up. If vrdmactl dies, so does the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	l.cmd = cmd
	l.exited = make(chan struct{})
	go func() {
		l.waitErr = cmd.Wait()
		close(l.exited)
	}()

	deadline := time.Now().Add(agentStartTimeout)
	answeredBadly := 0
	for {
		select {
		case <-l.exited:
			return fmt.Errorf("exited before serving (%v)%s", l.waitErr, l.logTail())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if _, err := os.Stat(l.Socket); err == nil {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			ag, err := vrdma.DialAgent(dctx, vrdma.WithSocket(l.Socket))
			cancel()
			if err == nil {
				l.Host, l.HostID = ag.Info.Host, ag.Info.HostID
				ag.Close()
				return nil
			}
			// The socket exists: the agent listens. Failing to talk to it
			// a few times over means it speaks another protocol.
			if answeredBadly++; answeredBadly >= 5 {
				return fmt.Errorf("serves %s but does not answer: %v (an older vrdmad? set %s=self to use this vrdmactl's agent)%s",
					l.Socket, err, agentEnv, l.logTail())
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("did not serve %s within %v%s", l.Socket, agentStartTimeout, l.logTail())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// PID returns the agent's process ID.
func (l *localAgent) PID() int { return l.cmd.Process.Pid }

// StateDir is the agent's state directory (--state-dir), where its
// embedded etcd, if it runs one, says how to reach it.
func (l *localAgent) StateDir() string { return filepath.Join(l.Dir, "state") }

// logTail returns the end of the agent's log, for error messages.
func (l *localAgent) logTail() string {
	b, err := os.ReadFile(l.logPath)
	b = bytes.TrimSpace(b)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "; its log:\n    " + strings.ReplaceAll(string(b), "\n", "\n    ")
}

// kill ends the process with SIGKILL, as a crash would, and waits for it.
func (l *localAgent) kill() {
	l.cmd.Process.Kill()
	<-l.exited
}

// restart starts the agent again, on the same socket and state, after
// it ended.
func (l *localAgent) restart(ctx context.Context) error {
	<-l.exited
	// The dead agent's socket is left behind: start waits for the new one.
	if err := os.Remove(l.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return l.start(ctx, l.cand)
}

// stop ends the process: SIGTERM, then SIGKILL if it lingers.
func (l *localAgent) stop() error {
	if l.cmd == nil || l.cmd.Process == nil {
		return nil
	}
	select {
	case <-l.exited:
		return nil
	default:
	}
	l.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-l.exited:
		return nil
	case <-time.After(3 * time.Second):
	}
	l.cmd.Process.Kill()
	<-l.exited
	return fmt.Errorf("the agent (pid %d) ignored SIGTERM for 3 s and was killed", l.cmd.Process.Pid)
}

// Close stops the agent and removes its temporary directory.
func (l *localAgent) Close() error {
	err := l.stop()
	return errors.Join(err, os.RemoveAll(l.Dir))
}

// shareOneCore makes this process's goroutines share one OS thread
// (GOMAXPROCS 1) on a machine of two cores or fewer, unless GOMAXPROCS is
// set, and returns the function that restores the setting. quickstart and
// perf run both workloads of a pair here, and they spin; with the agent
// that moves their bytes, that is three busy threads for two cores, and the
// Go runtime's own idle threads looking for work make it worse: write_lat's
// typical latency then jumps between ~10 and ~60 µs from run to run. With
// the two spinners on one thread (they yield to each other every 64 turns)
// the agent keeps a core.
func shareOneCore() (restore func()) {
	if os.Getenv("GOMAXPROCS") != "" || runtime.NumCPU() > 2 {
		return func() {}
	}
	prev := runtime.GOMAXPROCS(1)
	return func() { runtime.GOMAXPROCS(prev) }
}

// localVM is a VM that quickstart or perf defines on a local agent.
type localVM struct {
	Name   string
	MemMB  int
	Locked bool // reserve and lock all guest memory
	Async  bool // vrdma.asyncMode
	// DirectPeers is vrdma.directPeers (the memcpy-direct path); nil: unset.
	DirectPeers []string
	// Switch and PortGroup put ethernet0 on a distributed port group
	// (ethernet0.dvs.switchId, ethernet0.dvs.portgroupId); "" for none.
	Switch, PortGroup string
}

// vmx returns the VM's VMX configuration.
func (v localVM) vmx(by string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Defined by %s; removed with its temporary agent.\n", by)
	fmt.Fprintf(&b, ".encoding = \"UTF-8\"\nconfig.version = \"8\"\nvirtualHW.version = \"20\"\nguestOS = \"ubuntu-64\"\n")
	fmt.Fprintf(&b, "memSize = \"%d\"\n", v.MemMB)
	if v.DirectPeers != nil {
		fmt.Fprintf(&b, "vrdma.directPeers = %q\n", strings.Join(v.DirectPeers, " "))
	}
	if v.Locked {
		fmt.Fprintf(&b, "sched.mem.min = \"%d\"\nsched.mem.minSize = \"%d\"\nsched.mem.pin = \"TRUE\"\n", v.MemMB, v.MemMB)
	}
	if v.Async {
		b.WriteString("vrdma.asyncMode = \"TRUE\"\nsched.cpu.latencySensitivity = \"high\"\n")
	}
	b.WriteString("ethernet0.present = \"TRUE\"\nethernet0.virtualDev = \"vrdma\"\n")
	if v.Switch != "" {
		fmt.Fprintf(&b, "ethernet0.dvs.switchId = %q\n", v.Switch)
	}
	if v.PortGroup != "" {
		fmt.Fprintf(&b, "ethernet0.dvs.portgroupId = %q\n", v.PortGroup)
	}
	return b.String()
}

// openLocalVMs defines the VMs on the agent at socket and attaches to each
// (a session per VM, as separate workloads would). A VM whose memory lock
// the memlock limit refuses is redefined unlocked; notes say so. On error
// the VMs already attached are closed.
func openLocalVMs(ctx context.Context, socket, by string, specs []*localVM) (vms []*vrdma.VM, notes []string, err error) {
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(socket))
	if err != nil {
		return nil, nil, err
	}
	defer ag.Close()
	defer func() {
		if err != nil {
			for _, v := range vms {
				v.Close()
			}
			vms = nil
		}
	}()
	for _, s := range specs {
		if err := ag.DefineVM(ctx, s.Name, []byte(s.vmx(by))); err != nil {
			return vms, notes, fmt.Errorf("define VM %s: %w", s.Name, err)
		}
		v, err := vrdma.Open(ctx, s.Name, vrdma.WithSocket(socket))
		var ae *vrdma.Error
		if err != nil && s.Locked && errors.As(err, &ae) && ae.Code == abi.CodeLimit && ae.Field == "memSize" {
			notes = append(notes, fmt.Sprintf("%s: locking its %d MiB of guest memory failed, so it runs unlocked (%s)", s.Name, s.MemMB, ae.Message))
			s.Locked = false
			if err := ag.DefineVM(ctx, s.Name, []byte(s.vmx(by))); err != nil {
				return vms, notes, fmt.Errorf("define VM %s unlocked: %w", s.Name, err)
			}
			v, err = vrdma.Open(ctx, s.Name, vrdma.WithSocket(socket))
		}
		if err != nil {
			return vms, notes, err
		}
		s.Locked = v.MemoryLocked()
		vms = append(vms, v)
	}
	return vms, notes, nil
}
