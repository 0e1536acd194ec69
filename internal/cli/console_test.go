// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestServeConsoleCommand runs vrdmactl console against a standalone
// agent (no control plane: it says so and shows the agent's VMs), reads
// the address it prints (with the token it made: loopback is open to
// every user of the machine), asks the API without the token (refused)
// and with it, and stops it; and checks that it
// refuses to listen off loopback without a token, a token too short to
// resist guessing, and TLS flags that are
// incomplete or name no files.
func TestServeConsoleCommand(t *testing.T) {
	isolate(t)
	if _, errs, code := run(t, "", "console", "--listen", "0.0.0.0:0"); code != exitUsage || !strings.Contains(errs, "--token") {
		t.Errorf("console --listen 0.0.0.0:0 without a token: exit %d, %s", code, errs)
	}
	if _, errs, code := run(t, "", "console", "--listen", "127.0.0.1:0", "--token", "s3cret"); code != exitUsage || !strings.Contains(errs, "too short") {
		t.Errorf("console --token s3cret (6 characters): exit %d, %s", code, errs)
	}
	for _, c := range [][]string{{"--tls-client-ca", "ca.pem"}, {"--tls-cert", "c.pem"}, {"--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.pem"}} {
		if _, errs, code := run(t, "", append([]string{"console", "--listen", "127.0.0.1:0"}, c...)...); code != exitUsage || !strings.Contains(errs, "--tls-") {
			t.Errorf("console %v: exit %d, %s", c, code, errs)
		}
	}
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{})

	line, stop := startConsole(t, env.Socket)
	printed, ok := strings.CutPrefix(strings.TrimSpace(line), "vrdma console: ")
	url, token, hasToken := strings.Cut(printed, "?token=")
	if !ok || !strings.HasPrefix(url, "http://127.0.0.1:") || !hasToken || len(token) < 16 {
		t.Fatalf("console printed %q, not the address with a token of its own", line)
	}
	// Loopback is every local user's: without the token, nothing.
	resp, err := http.Get(url + "api/inventory")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /api/inventory without the token: %s, want 401", resp.Status)
	}
	req, _ := http.NewRequest("GET", url+"api/inventory", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var inv struct {
		Control      bool   `json:"control"`
		ControlError string `json:"control_error"`
		Local        []struct {
			Name string `json:"name"`
		} `json:"local"`
	}
	err = json.NewDecoder(resp.Body).Decode(&inv)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || inv.Control || !strings.Contains(inv.ControlError, "no control plane") || len(inv.Local) != 1 || inv.Local[0].Name != "vm1" {
		t.Errorf("GET /api/inventory: %d %+v %v", resp.StatusCode, inv, err)
	}
	if errs := stop(); !strings.Contains(errs, "console without a control plane") {
		t.Errorf("console's stderr does not say it has no control plane:\n%s", errs)
	}
}

// startConsole runs vrdmactl console on 127.0.0.1:0 (and args) against
// the agent at socket, with no control plane, and returns the line it
// prints first; stop ends it, checks that it ends cleanly, and returns
// what it wrote to stderr.
func startConsole(t *testing.T, socket string, args ...string) (line string, stop func() string) {
	t.Helper()
	pr, pw := io.Pipe()
	var errs strings.Builder
	a := &app{stdin: strings.NewReader(""), stdout: pw, stderr: &errs}
	root := a.rootCommand()
	root.SetArgs(append([]string{"--socket", socket, "--state-dir", t.TempDir(), "console", "--listen", "127.0.0.1:0"}, args...))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	if err != nil {
		t.Fatalf("console printed %q, then %v", line, err)
	}
	return line, func() string {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("console after its context ended: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("console still runs 10 s after its context ended")
		}
		return errs.String()
	}
}

// TestConsoleGivenTokenNotPrinted checks that a token given in the
// environment is not printed in the console's address (its output may
// go to a log), and is the one the console asks for.
func TestConsoleGivenTokenNotPrinted(t *testing.T) {
	isolate(t)
	const secret = "rv-given-0123456789abcdef"
	t.Setenv(consoleTokenEnv, secret)
	env := testenv.Start(t)
	line, stop := startConsole(t, env.Socket)
	defer stop()
	if strings.Contains(line, secret) || !strings.Contains(line, "?token=TOKEN") {
		t.Fatalf("console printed %q: the token given, or no word of how to open it", line)
	}
	u := strings.Fields(strings.TrimPrefix(line, "vrdma console: "))[0]
	for tok, want := range map[string]int{secret: 200, "rv-other-0123456789abcdef": 401} {
		req, _ := http.NewRequest("GET", u+"api/inventory", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %sapi/inventory with the token %s: %s, want %d", u, tok, resp.Status, want)
		}
	}
}

// TestVMEditDryRun checks vm set, edit and reserve-memory --dry-run: the
// agent answers what saving would, refusing what saving would refuse,
// and the VMX does not change.
func TestVMEditDryRun(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	on := []string{"--socket", env.Socket}
	ctlOn(t, on, "vm", "create", "web", "--memory", "4")
	ctlOn(t, on, "vm", "edit", "web", "--add-adapter", "--portgroup", "dvportgroup-10", "--switch", "dvs1")
	before := ctlOn(t, on, "vm", "show", "web", "--vmx")
	if out := ctlOn(t, on, "vm", "set", "web", "vrdma.asyncMode=TRUE", "--dry-run"); !strings.Contains(out, "would be saved") || !strings.Contains(out, "nothing stored") {
		t.Errorf("vm set --dry-run:\n%s", out)
	}
	ctlOn(t, on, "vm", "reserve-memory", "web", "--all", "--dry-run")
	ctlOn(t, on, "vm", "edit", "web", "--add-adapter", "--portgroup", "dvportgroup-10", "--switch", "dvs1", "--dry-run")
	ctlFail(t, on, []string{"hw-version", "refused by the rules"}, "vm", "set", "web", "virtualHW.version=10", "--dry-run")
	if after := ctlOn(t, on, "vm", "show", "web", "--vmx"); after != before {
		t.Errorf("--dry-run changed the VMX:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	ctlOn(t, on, "vm", "power-off", "web")
	var r struct {
		Refused bool `json:"refused"`
		VM      struct {
			VMX string `json:"vmx"`
		} `json:"vm"`
	}
	runJSON(t, &r, append(on, "-o", "json", "vm", "set", "web", "vrdma.asyncMode=TRUE", "--dry-run")...)
	if r.Refused || !strings.Contains(r.VM.VMX, `vrdma.asyncMode = "TRUE"`) {
		t.Errorf("vm set --dry-run -o json: %+v", r)
	}
	if after := ctlOn(t, on, "vm", "show", "web", "--vmx"); after != before {
		t.Errorf("--dry-run -o json changed the VMX:\n%s", after)
	}
}

// TestConsoleTokenNotShown checks that the token given in the
// environment is used but never printed: not by --help, not by a usage
// error.
func TestConsoleTokenNotShown(t *testing.T) {
	isolate(t)
	const secret = "rv-secret-0123456789abcdef"
	t.Setenv(consoleTokenEnv, secret)
	out, errs, _ := run(t, "", "console", "--help")
	if strings.Contains(out+errs, secret) {
		t.Errorf("console --help prints the token of %s:\n%s%s", consoleTokenEnv, out, errs)
	}
	out, errs, code := run(t, "", "console", "--listen", "0.0.0.0:0", "--tls-cert", "c.pem")
	if code != exitUsage || strings.Contains(out+errs, secret) {
		t.Errorf("console with a usage error: exit %d, prints the token:\n%s%s", code, out, errs)
	}
	// The token still counts: off loopback is allowed with it.
	if _, errs, code := run(t, "", "console", "--listen", "256.0.0.1:0"); code == exitUsage && strings.Contains(errs, "--token") {
		t.Errorf("console with %s set still asks for --token: %s", consoleTokenEnv, errs)
	}
}
