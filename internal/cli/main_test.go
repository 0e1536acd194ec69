// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/agentcmd"
)

// TestMain lets the test binary stand in for vrdmactl when quickstart and
// perf --local re-execute it as "vrdmactl agent" (VRDMACTL_AGENT=self),
// and exec as its device view's helper.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		os.Exit(agentcmd.Main("vrdmactl agent", os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == viewHelperArg { // exec's device view
		os.Exit(viewMain(os.Args[2:], os.Stderr))
	}
	jsonPrinted = recordJSON
	code := m.Run()
	// Every -o json output the tests printed conforms to its command's
	// schema, which docs/schema holds (jsonschema_test.go).
	if errs := checkPrinted(); len(errs) > 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "FAIL: -o json outputs and their schemas:\n%s\n", strings.Join(errs, "\n"))
		code = 1
	}
	os.Exit(code)
}

// isolate points HOME, the XDG directories and TMPDIR at fresh temporary
// directories and makes agent-starting commands re-execute the test
// binary, so that nothing touches the real machine. It returns TMPDIR.
func isolate(t *testing.T) string {
	t.Helper()
	for _, k := range []string{"HOME", "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CONFIG_HOME"} {
		t.Setenv(k, t.TempDir())
	}
	t.Setenv("VRDMA_SOCKET", "")
	t.Setenv(agentEnv, "self")
	tmp, err := os.MkdirTemp("", "clitest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	t.Setenv("TMPDIR", tmp)
	return tmp
}

// run runs vrdmactl in this process.
func run(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

// runOK runs vrdmactl and fails the test unless it exits 0.
func runOK(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, code := run(t, "", args...)
	if code != 0 {
		t.Fatalf("vrdmactl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// runJSON runs vrdmactl, which must exit 0 and print JSON, into v (the
// type vrdmactl printed, or one with its fields).
func runJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := runOK(t, args...)
	if err := unmarshalPrinted([]byte(out), v); err != nil {
		t.Fatalf("vrdmactl %s: output is not JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestUsageErrors(t *testing.T) {
	isolate(t)
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"no-such-command"},
		{"-o", "xml", "status"},
		{"vm", "define", "onlyname"},
		{"devinfo"},
		{"perf"},
		{"perf", "write_bw"},
		{"perf", "ping_pong", "--local"},
		{"perf", "write_bw", "--local", "--path", "carrier-pigeon"},
		{"perf", "write_lat", "--local", "-D", "1"},
	} {
		_, errs, code := run(t, "", args...)
		if code != exitUsage || !strings.HasPrefix(errs, "vrdmactl: ") {
			t.Errorf("vrdmactl %s: exit %d, stderr %q; want exit 2 and a message", strings.Join(args, " "), code, errs)
		}
	}
	_, errs, _ := run(t, "", "perf", "write_bw", "--path", "memcpy")
	if !strings.Contains(errs, "without --local, --vm NAME") {
		t.Errorf("perf without --local or --vm: %q", errs)
	}
}

func TestHelpListsCommands(t *testing.T) {
	isolate(t)
	out := runOK(t, "--help")
	for _, c := range []string{"quickstart", "devinfo", "status", "vm", "perf", "--socket", "--output"} {
		if !strings.Contains(out, c) {
			t.Errorf("help lacks %q:\n%s", c, out)
		}
	}
	if strings.Contains(out, "agent ") && strings.Contains(out, "Run the host agent") {
		t.Errorf("help shows the hidden agent command:\n%s", out)
	}
}

func TestAgentCommandPassesFlags(t *testing.T) {
	isolate(t)
	for _, flag := range []string{"--max-qp", "--max-processes"} {
		_, errs, code := run(t, "", "agent", flag, "0")
		if code != 2 || !strings.Contains(errs, flag+" 0 out of range") {
			t.Fatalf("agent %s 0: exit %d, %q", flag, code, errs)
		}
	}
}
