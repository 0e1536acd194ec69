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

// jsonHarness is ibverbs/tests/json_fuzz.c, built once per test process
// (with the sanitizers where gcc has them) and running: one process reads
// every input, so a fuzz iteration costs a pipe round trip, not a fork.
var jsonHarness struct {
	once   sync.Once
	dir    string
	err    error
	mu     sync.Mutex
	in     io.WriteCloser
	out    io.Reader
	cmd    *exec.Cmd
	stderr bytes.Buffer
	san    bool
}

// sanitizers are the gcc flags of the harness when this gcc links them.
var sanitizers = []string{"-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"}

// startJSONHarness builds and starts the harness the first time; later
// calls return the running one, or restart it after a test killed it.
func startJSONHarness(t *testing.T) {
	h := &jsonHarness
	h.once.Do(func() {
		h.dir, h.err = os.MkdirTemp("", "vrdma-json-fuzz-")
		if h.err != nil {
			return
		}
		probe := filepath.Join(h.dir, "probe.c")
		os.WriteFile(probe, []byte("int main(void) { return 0; }\n"), 0o644)
		if exec.Command("gcc", append(sanitizers, "-o", filepath.Join(h.dir, "probe"), probe)...).Run() == nil {
			h.san = true
		}
	})
	if h.err != nil {
		t.Fatal(h.err)
	}
	if h.cmd != nil {
		return
	}
	var flags []string
	if h.san {
		flags = sanitizers
	} else {
		t.Log("gcc cannot link -fsanitize=address,undefined here: the harness runs without them (crashes are still caught)")
	}
	bin := filepath.Join(h.dir, "json_fuzz")
	if _, err := os.Stat(bin); err != nil {
		buildC(t, h.dir, "json_fuzz", []string{"json.c"}, flags...)
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

// FuzzCJSON feeds each input to the C drop-in's JSON reader (json.c, the
// parser of every agent reply and event) and calls each of its accessors
// on every token; it fails on a crash or a sanitizer report. The seed
// corpus (testdata/fuzz/FuzzCJSON) holds real replies and events of the
// agent and malformed variants. go test runs the seeds;
// go test -fuzz FuzzCJSON ./guest explores.
func FuzzCJSON(f *testing.F) {
	needC(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 1<<20 {
			return // the agent's messages are at most 1 MiB
		}
		h := &jsonHarness
		h.mu.Lock()
		defer h.mu.Unlock()
		startJSONHarness(t)
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
			t.Fatalf("json.c failed on %q (%d bytes): %v %v\n%s", in, len(in), werr, rerr, report)
		}
	})
}

// TestMain stops the JSON harness and removes its build after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	h := &jsonHarness
	if h.cmd != nil {
		h.in.Close()
		h.cmd.Wait()
	}
	if h.dir != "" {
		os.RemoveAll(h.dir)
	}
	os.Exit(code)
}
