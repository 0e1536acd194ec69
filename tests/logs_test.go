// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestAgentLogs runs vrdmad with --log-format json: every line it writes
// is one JSON object with time, level and message, and the lines of a
// workload's session carry the session's ID and the workload's pid (and
// the VM's name where one is concerned); a bad --log-format is refused.
func TestAgentLogs(t *testing.T) {
	env := testenv.StartProcess(t, testenv.ProcessOptions{Args: []string{"--log-format", "json", "--log-level", "debug"}})
	vm := env.Open(t, "logvm", testenv.VMOptions{})
	newEnd(t, vm, qpConfig{})
	vm.Close()
	env.Kill()
	attached := false
	for _, l := range strings.Split(strings.TrimSpace(env.Stderr()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a log line that is not JSON: %q: %v", l, err)
		}
		if m["time"] == nil || m["level"] == nil || m["msg"] == nil {
			t.Errorf("a log line without time, level or msg: %q", l)
		}
		if m["msg"] == "VM attached" {
			attached = true
			if m["vm"] != "logvm" || m["session"] == nil || m["pid"] == nil {
				t.Errorf("the attach line lacks the VM, the session or the pid: %q", l)
			}
		}
	}
	if !attached {
		t.Errorf("no \"VM attached\" line in:\n%s", env.Stderr())
	}
	out, err := exec.Command(testenv.AgentBinary(t), "--log-format", "xml", "--no-control-plane").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), `--log-format "xml": want text or json`) {
		t.Errorf("vrdmad --log-format xml: %v: %s", err, out)
	}
}
