// SPDX-License-Identifier: Apache-2.0

package guest

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// cFuzzHarness is a fuzz harness of ibverbs/tests (json_fuzz.c,
// maps_fuzz.c), built once per test process (with the sanitizers where
// gcc has them) and running: one process reads every input, so a fuzz
// iteration costs a pipe round trip, not a fork. Its protocol: each input
// on stdin as a 4-byte little-endian length and that many bytes, one byte
// "k" on stdout for each input it survived.
type cFuzzHarness struct {
	name   string   // ibverbs/tests/NAME.c
	srcs   []string // the library's sources it is built with
	mu     sync.Mutex
	in     io.WriteCloser
	out    io.Reader
	cmd    *exec.Cmd
	stderr bytes.Buffer
}

var (
	jsonHarness = &cFuzzHarness{name: "json_fuzz", srcs: []string{"json.c"}}
	mapsHarness = &cFuzzHarness{name: "maps_fuzz", srcs: []string{"maps.c"}}
	harnesses   = []*cFuzzHarness{jsonHarness, mapsHarness}
)

// fuzzBuild is the directory of the harnesses' builds, and whether gcc
// links the sanitizers, found once.
var fuzzBuild struct {
	once sync.Once
	dir  string
	err  error
	san  bool
}

// sanitizers are the gcc flags of the harnesses when this gcc links them.
var sanitizers = []string{"-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"}

// start builds and starts the harness the first time; later calls return
// the running one, or restart it after an input killed it.
//
// +checklocks:h.mu
func (h *cFuzzHarness) start(t *testing.T) {
	b := &fuzzBuild
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "vrdma-c-fuzz-")
		if b.err != nil {
			return
		}
		probe := filepath.Join(b.dir, "probe.c")
		os.WriteFile(probe, []byte("int main(void) { return 0; }\n"), 0o644)
		if exec.Command("gcc", append(sanitizers, "-o", filepath.Join(b.dir, "probe"), probe)...).Run() == nil {
			b.san = true
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	if h.cmd != nil {
		return
	}
	var flags []string
	if b.san {
		flags = sanitizers
	} else {
		t.Log("gcc cannot link -fsanitize=address,undefined here: the harness runs without them (crashes are still caught)")
	}
	bin := filepath.Join(b.dir, h.name)
	if _, err := os.Stat(bin); err != nil {
		buildC(t, b.dir, h.name, h.srcs, flags...)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS=print_stacktrace=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.stderr.Reset()
	cmd.Stderr = &h.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.in, h.out, h.cmd = in, out, cmd
}

// feed gives the harness one input and fails t when it does not survive
// it (a crash, a sanitizer report, a failed check of its own).
func (h *cFuzzHarness) feed(t *testing.T, in []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.start(t)
	msg := binary.LittleEndian.AppendUint32(nil, uint32(len(in)))
	msg = append(msg, in...)
	var ack [1]byte
	_, werr := h.in.Write(msg)
	_, rerr := io.ReadFull(h.out, ack[:])
	if werr != nil || rerr != nil || ack[0] != 'k' {
		h.in.Close()
		h.cmd.Wait()
		report := h.stderr.String()
		h.cmd = nil // the next input starts a new one
		t.Fatalf("%s failed on %q (%d bytes): %v %v\n%s", h.name, in, len(in), werr, rerr, report)
	}
}

// TestMain stops the fuzz harnesses and removes their builds after the
// tests.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, h := range harnesses {
		if h.cmd != nil {
			h.in.Close()
			h.cmd.Wait()
		}
	}
	if fuzzBuild.dir != "" {
		os.RemoveAll(fuzzBuild.dir)
	}
	os.Exit(code)
}
