package cli

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/vrdma/vrdma/internal/perf"
)

func TestQuickstart(t *testing.T) {
	tmp := isolate(t)
	var rep quickstartReport
	runJSON(t, &rep, "quickstart", "-o", "json")
	t.Logf("%+v", rep)
	if !rep.OK || len(rep.Pairs) != 1 {
		t.Fatalf("report %+v", rep)
	}
	p := rep.Pairs[0]
	if !p.OK || p.A != "vm1/vrdma0" || p.B != "vm2/vrdma0" || p.Path != "memcpy" || !strings.HasPrefix(p.Reason, "memcpy: ") {
		t.Errorf("pair %+v", p)
	}
	// The agent ran the embedded control plane: quickstart created a switch
	// and a port group, and path selection decided the pair's path.
	if rep.Switch != quickstartSwitch || rep.PortGroup != quickstartPortGroup || !strings.Contains(p.Reason, "same host") {
		t.Errorf("switch %q, port group %q, reason %q: want %s, %s and path selection's reason", rep.Switch, rep.PortGroup, p.Reason, quickstartSwitch, quickstartPortGroup)
	}
	if len(p.Opcodes) != len(perf.Opcodes) {
		t.Errorf("%d opcodes, want %d: %v", len(p.Opcodes), len(perf.Opcodes), p.Opcodes)
	}
	for _, op := range perf.Opcodes {
		if p.Opcodes[op.String()] != "ok" {
			t.Errorf("%s: %q", op, p.Opcodes[op.String()])
		}
	}
	if p.BWMiBs <= 0 || p.LatUs <= 0 {
		t.Errorf("bandwidth %v MiB/s, latency %v µs", p.BWMiBs, p.LatUs)
	}
	if !strings.Contains(rep.Agent, "vrdmactl agent") {
		t.Errorf("agent %q: want the re-executed vrdmactl", rep.Agent)
	}
	// Nothing is left: the agent has exited and its directory is gone.
	if err := syscall.Kill(rep.AgentPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("agent pid %d still exists (kill 0: %v)", rep.AgentPID, err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("quickstart left %v in TMPDIR", left)
	}
}

func TestQuickstartText(t *testing.T) {
	isolate(t)
	out := runOK(t, "quickstart")
	for _, want := range []string{"PAIR", "vm1/vrdma0 → vm2/vrdma0", "memcpy", "7/7 opcodes ok", "MiB/s", "µs", "ok: every pair works"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestQuickstartNoAgent(t *testing.T) {
	isolate(t)
	t.Setenv(agentEnv, "/nonexistent/vrdmad")
	out, _, code := run(t, "", "quickstart")
	if code != exitFailure || !strings.Contains(out, "could not start a host agent") || !strings.Contains(out, "/nonexistent/vrdmad") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
}
