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
// the address it prints, asks the API, and stops it; and checks that it
// refuses to listen off loopback without a token, and TLS flags that are
// incomplete or name no files.
func TestServeConsoleCommand(t *testing.T) {
	isolate(t)
	if _, errs, code := run(t, "", "console", "--listen", "0.0.0.0:0"); code != exitUsage || !strings.Contains(errs, "--token") {
		t.Errorf("console --listen 0.0.0.0:0 without a token: exit %d, %s", code, errs)
	}
	for _, c := range [][]string{{"--tls-client-ca", "ca.pem"}, {"--tls-cert", "c.pem"}, {"--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.pem"}} {
		if _, errs, code := run(t, "", append([]string{"console", "--listen", "127.0.0.1:0"}, c...)...); code != exitUsage || !strings.Contains(errs, "--tls-") {
			t.Errorf("console %v: exit %d, %s", c, code, errs)
		}
	}
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{})

	pr, pw := io.Pipe()
	var errs strings.Builder
	a := &app{stdin: strings.NewReader(""), stdout: pw, stderr: &errs}
	root := a.rootCommand()
	root.SetArgs([]string{"--socket", env.Socket, "--state-dir", t.TempDir(), "console", "--listen", "127.0.0.1:0"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go io.Copy(io.Discard, pr)
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "vrdma console: ")
	if err != nil || !ok || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("console printed %q (%v)", line, err)
	}
	resp, err := http.Get(url + "api/inventory")
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
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("console after its context ended: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("console still runs 10 s after its context ended")
	}
	if !strings.Contains(errs.String(), "console without a control plane") {
		t.Errorf("console's stderr does not say it has no control plane:\n%s", errs.String())
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
