// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/buildinfo"
	"github.com/vrdma/vrdma/internal/testenv"
)

func TestVersionFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main("vrdmad", []string{"--version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "vrdmad "+buildinfo.Read("vrdmad").Version+"\n") || errb.Len() != 0 {
		t.Fatalf("--version: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

func TestLogFormatFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main("vrdmad", []string{"--log-format", "xml", "--no-control-plane"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `--log-format "xml": want text or json`) {
		t.Fatalf("--log-format xml: exit %d, stderr %q", code, errb.String())
	}

	// A real vrdmad with JSON logs: every line it writes is a JSON object.
	dir, err := os.MkdirTemp("", "vrdmalog")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "s")
	cmd, lines := startAgent(t, dir, "--no-control-plane", "--log-format", "json")
	var serving map[string]any
	deadline := time.After(30 * time.Second)
	for serving == nil {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("vrdmad exited before it logged that it serves: %v", cmd.Wait())
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("a log line is not JSON: %v: %q", err, l)
			}
			if m["msg"] == "vrdmad serving" {
				serving = m
			}
		case <-deadline:
			cmd.Process.Kill()
			t.Fatal("vrdmad logged no \"vrdmad serving\" within 30 s")
		}
	}
	if serving["level"] != "INFO" || serving["socket"] != socket || serving["version"] != buildinfo.Release {
		t.Errorf("serving line: %v", serving)
	}
	cmd.Process.Signal(os.Interrupt)
	for l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("a log line is not JSON: %v: %q", err, l)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("vrdmad after SIGINT: %v", err)
	}
}

// startAgent starts the vrdmad binary with its socket and state directory
// in dir and args, and returns it with its stderr's lines, a channel
// closed when stderr ends (the goroutine that reads it is the test's).
func startAgent(t *testing.T, dir string, args ...string) (*exec.Cmd, chan string) {
	t.Helper()
	cmd := exec.Command(testenv.AgentBinary(t), append([]string{"--socket", filepath.Join(dir, "s"), "--state-dir", filepath.Join(dir, "state")}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}
