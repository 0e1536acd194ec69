// SPDX-License-Identifier: Apache-2.0

package fault

// A workload process: the responder side of a run in a process of its own,
// so that a test can kill it (SIGKILL) or stall it (SIGSTOP). The parent
// runs a program that calls WorkloadMain when WorkloadEnv is set (a test
// binary's TestMain, a command's hidden mode), with WorkloadEnv holding a
// WorkloadSpec as JSON. The two talk over the child's standard streams:
//
//	child → parent, one JSON event per line on stdout:
//	  {"t":"target",...}      the side is made; what the peer needs of it
//	  {"t":"ready"}           the QP is connected to the parent's
//	  {"t":"posted",...}      \
//	  {"t":"completed",...}    | the child's records (RunRecorder): of its
//	  {"t":"landed",...}       | receives as a responder, of its WRs as a
//	  {"t":"fetched",...}      | requester (WorkloadSpec.Drive)
//	  {"t":"counter",...}      |
//	  {"t":"abandon",...}     /
//	  {"t":"ran"}             a requester's traffic is over
//	  {"t":"done"}            the child finished after stdin closed
//	parent → child on stdin: the parent side's Target as one JSON line;
//	  then closing stdin asks the child to finish (a responder's QP to
//	  ERR, its receives flushed and recorded) and exit.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vrdma/vrdma"
)

// WorkloadEnv is the environment variable that makes a program a
// workload process (WorkloadMain); its value is a WorkloadSpec in JSON.
const WorkloadEnv = "VRDMA_FAULT_WORKLOAD"

// WorkloadSpec is what a workload process serves.
type WorkloadSpec struct {
	Socket string `json:"socket"` // the agent's socket
	VM     string `json:"vm"`     // the VM to attach, defined already
	Seed   uint64 `json:"seed"`
	Layout Layout `json:"layout"`
	RC     RC     `json:"rc"`
	// Drive, if set, makes the workload the requester: once connected it
	// runs this traffic (Run) at the parent's side, which responds;
	// otherwise it responds (Respond) to the parent's traffic.
	Drive *Drive `json:"drive,omitempty"`
}

// Drive is the traffic a requesting workload process runs (Config's
// fields of the same names).
type Drive struct {
	WRs    int `json:"wrs"`
	Window int `json:"window"`
	MaxLen int `json:"max_len"`
}

// WorkloadRequested reports whether this process was started as a
// workload process.
func WorkloadRequested() bool { return os.Getenv(WorkloadEnv) != "" }

// event is one line from a workload process.
type event struct {
	T      string                `json:"t"`
	Target *Target               `json:"target,omitempty"`
	WR     *WR                   `json:"wr,omitempty"`
	WC     *vrdma.WorkCompletion `json:"wc,omitempty"`
	QPN    uint32                `json:"qpn,omitempty"`
	ID     uint64                `json:"id,omitempty"`
	N      int                   `json:"n,omitempty"`
	Sum    uint64                `json:"sum,omitempty"`
	Value  uint64                `json:"value,omitempty"` // fetched, counter
	Why    string                `json:"why,omitempty"`   // abandon
}

// lineRecorder writes records as events, one per line; safe for
// concurrent use.
type lineRecorder struct {
	mu  sync.Mutex
	enc *json.Encoder // +checklocks:mu
}

func (r *lineRecorder) emit(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.enc.Encode(e)
}

func (r *lineRecorder) Posted(w WR)                       { r.emit(event{T: "posted", WR: &w}) }
func (r *lineRecorder) Completed(wc vrdma.WorkCompletion) { r.emit(event{T: "completed", WC: &wc}) }
func (r *lineRecorder) Landed(qpn uint32, id uint64, n int, sum uint64) {
	r.emit(event{T: "landed", QPN: qpn, ID: id, N: n, Sum: sum})
}
func (r *lineRecorder) Fetched(qpn uint32, id uint64, old uint64) {
	r.emit(event{T: "fetched", QPN: qpn, ID: id, Value: old})
}
func (r *lineRecorder) Counter(v uint64) { r.emit(event{T: "counter", Value: v}) }
func (r *lineRecorder) Abandon(qpn uint32, why string) {
	r.emit(event{T: "abandon", QPN: qpn, Why: why})
}

// WorkloadMain is the body of a workload process: it attaches the VM of
// the WorkloadSpec in $VRDMA_FAULT_WORKLOAD, makes a side, connects it to
// the side whose Target it reads from stdin, and responds (Respond) until
// stdin closes, then closes the books; or, with WorkloadSpec.Drive, runs
// that traffic (Run) and waits for stdin to close. It returns the
// process's exit code.
func WorkloadMain() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "fault workload:", err)
		return 1
	}
	var spec WorkloadSpec
	if err := json.Unmarshal([]byte(os.Getenv(WorkloadEnv)), &spec); err != nil {
		return fail(fmt.Errorf("%s: %w", WorkloadEnv, err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	vm, err := vrdma.Open(ctx, spec.VM, vrdma.WithSocket(spec.Socket))
	if err != nil {
		return fail(err)
	}
	defer vm.Close()
	s, err := NewSide(ctx, vm, spec.Layout, spec.Seed)
	if err != nil {
		return fail(err)
	}
	defer s.Close(ctx)
	rec := &lineRecorder{enc: json.NewEncoder(os.Stdout)}
	t := s.Target()
	rec.emit(event{T: "target", Target: &t})
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		return fail(fmt.Errorf("read the peer's endpoint: %w", err))
	}
	var peer Target
	if err := json.Unmarshal(line, &peer); err != nil {
		return fail(fmt.Errorf("the peer's target %q: %w", line, err))
	}
	if err := s.Connect(ctx, peer.Endpoint, spec.RC); err != nil {
		return fail(err)
	}
	rec.emit(event{T: "ready"})
	// The stdin watcher, owned by main: it ends at stdin's end, after
	// moving a responder's QP to ERR so that the responder finishes.
	eof := make(chan struct{})
	go func() {
		defer close(eof)
		io.Copy(io.Discard, in)
		if spec.Drive != nil {
			return
		}
		if err := s.Fail(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "fault workload:", err)
		}
	}()
	if d := spec.Drive; d != nil {
		if _, err := Run(ctx, s, peer, rec, Config{Seed: spec.Seed, WRs: d.WRs, Window: d.Window, MaxLen: d.MaxLen}); err != nil {
			return fail(err)
		}
		rec.emit(event{T: "ran"})
		<-eof
	} else if err := Respond(ctx, s, peer.Endpoint.QPN, rec, nil); err != nil {
		return fail(err)
	}
	rec.emit(event{T: "done"})
	return 0
}

// Workload is a running workload process, seen from its parent.
//
// Goroutines: StartWorkload starts one that reads the child's events,
// passes the records to the Recorder, and once the child's stdout ends
// waits for the process and closes done. It is the Workload's; Kill and
// Stop wait for it.
type Workload struct {
	// Target is the child side's, as it reported it.
	Target Target

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr strings.Builder
	errMu  sync.Mutex // guards stderr
	ready  chan struct{}
	done   chan struct{} // closed when the child has exited and its events are read
	wcs    atomic.Int64  // completions the child reported
	waited error         // the child's exit, once done is closed
	last   string        // the last event's type, once done is closed
}

// StartWorkload starts cmd, a program that calls WorkloadMain, with spec
// in its environment, and returns once it has made its side (its Target
// is set). Records it reports go to rec. The caller must Kill or Stop it.
func StartWorkload(ctx context.Context, cmd *exec.Cmd, spec WorkloadSpec, rec RunRecorder) (*Workload, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, WorkloadEnv+"="+string(b))
	w := &Workload{cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = lockedWriter{&w.errMu, &w.stderr}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fault: start workload %s: %w", cmd.Path, err)
	}
	target := make(chan Target, 1)
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				fmt.Fprintf(lockedWriter{&w.errMu, &w.stderr}, "[parent] a line it cannot read: %q: %v\n", sc.Bytes(), err)
				continue
			}
			w.last = e.T
			switch e.T {
			case "target":
				target <- *e.Target
			case "ready":
				close(w.ready)
			case "posted":
				rec.Posted(*e.WR)
			case "completed":
				rec.Completed(*e.WC)
				w.wcs.Add(1)
			case "landed":
				rec.Landed(e.QPN, e.ID, e.N, e.Sum)
			case "fetched":
				rec.Fetched(e.QPN, e.ID, e.Value)
			case "counter":
				rec.Counter(e.Value)
			case "abandon":
				rec.Abandon(e.QPN, e.Why)
			}
		}
		io.Copy(io.Discard, out)
		w.waited = cmd.Wait()
	}()
	select {
	case t := <-target:
		w.Target = t
		return w, nil
	case <-w.done:
		return nil, fmt.Errorf("fault: workload exited (%v) before making its side: %s", w.waited, w.Stderr())
	case <-ctx.Done():
		w.Kill()
		return nil, fmt.Errorf("fault: workload did not make its side: %w: %s", ctx.Err(), w.Stderr())
	}
}

// Completions returns how many completions the child reported so far.
func (w *Workload) Completions() int { return int(w.wcs.Load()) }

// Connect gives the child the parent side's target and waits until the
// child's QP is connected to it (a requesting child then starts its
// traffic: the parent's responder must run already).
func (w *Workload) Connect(ctx context.Context, peer Target) error {
	b, err := json.Marshal(peer)
	if err != nil {
		return err
	}
	if _, err := w.stdin.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("fault: workload: send the peer's target: %w", err)
	}
	select {
	case <-w.ready:
		return nil
	case <-w.done:
		return fmt.Errorf("fault: workload exited (%v) before connecting: %s", w.waited, w.Stderr())
	case <-ctx.Done():
		return fmt.Errorf("fault: workload did not connect: %w: %s", ctx.Err(), w.Stderr())
	}
}

// Pid returns the child's process ID.
func (w *Workload) Pid() int { return w.cmd.Process.Pid }

// Kill kills the child (SIGKILL) and waits until it is gone and its
// events are read.
func (w *Workload) Kill() {
	w.cmd.Process.Kill()
	w.stdin.Close()
	<-w.done
}

// Stall stops the child (SIGSTOP) for d, then lets it go on (SIGCONT).
func (w *Workload) Stall(d time.Duration) error {
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("fault: stop workload %d: %w", w.Pid(), err)
	}
	time.Sleep(d)
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("fault: continue workload %d: %w", w.Pid(), err)
	}
	return nil
}

// Stop asks the child to finish (its receives flushed and recorded) and
// waits until it exited; it fails if the child did not end cleanly.
func (w *Workload) Stop(ctx context.Context) error {
	w.stdin.Close()
	select {
	case <-w.done:
	case <-ctx.Done():
		w.Kill()
		return fmt.Errorf("fault: workload %d did not finish: %w: %s", w.Pid(), ctx.Err(), w.Stderr())
	}
	if w.waited != nil || w.last != "done" {
		return fmt.Errorf("fault: workload %d ended with %v, last event %q: %s", w.Pid(), w.waited, w.last, w.Stderr())
	}
	return nil
}

// Stderr returns what the child wrote to its standard error.
func (w *Workload) Stderr() string {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.stderr.String()
}

// lockedWriter serialises writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
