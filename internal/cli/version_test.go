// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/buildinfo"
	"github.com/vrdma/vrdma/internal/testenv"
)

func TestVersionCommand(t *testing.T) {
	isolate(t)
	// No agent at the socket: the client's information, and why there is
	// no agent's.
	var rep versionReport
	runJSON(t, &rep, "--socket", "/nonexistent/vrdmad.sock", "version", "-o", "json")
	if rep.Client.Program != "vrdmactl" || rep.Client.Release != buildinfo.Release || rep.Client.GoVersion != runtime.Version() ||
		rep.Agent != "" || !strings.Contains(rep.AgentError, "/nonexistent/vrdmad.sock") {
		t.Fatalf("version without an agent: %+v", rep)
	}
	env := testenv.Start(t)
	out := runOK(t, "--socket", env.Socket, "version")
	for _, want := range []string{"vrdmactl " + buildinfo.Read("vrdmactl").Version + "\n", "  release  " + buildinfo.Release + "\n", "  go       " + runtime.Version(),
		"agent: vrdmad " + agent.Version + " at " + env.Socket + " (host hostA)"} {
		if !strings.Contains(out, want) {
			t.Errorf("version lacks %q:\n%s", want, out)
		}
	}
	if _, _, code := run(t, "", "version", "extra"); code != exitUsage {
		t.Errorf("version extra: exit %d, want %d", code, exitUsage)
	}
}

// TestVrdmadVersion builds vrdmad and checks that --version says what the
// go command reads from the same binary (go version -m): the module
// version and, when the build was stamped, the commit.
func TestVrdmadVersion(t *testing.T) {
	bin := testenv.AgentBinary(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("vrdmad --version: %v\n%s", err, out)
	}
	m, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
	if err != nil {
		t.Skipf("go version -m: %v\n%s", err, m)
	}
	field := func(re string) string {
		if s := regexp.MustCompile(re).FindStringSubmatch(string(m)); s != nil {
			return s[1]
		}
		return ""
	}
	modVersion := field(`(?m)^\tmod\tgithub.com/vrdma/vrdma\t(\S+)`)
	rev := field(`(?m)^\tbuild\tvcs.revision=(\S+)`)
	goVersion := field(`^\S+: (go\S+)`)
	buildVersion := buildinfo.Release + "-devel" // no version stamped (-X), none derived from a tag
	if v, ok := strings.CutPrefix(modVersion, "v"); ok {
		buildVersion = v
	}
	s := string(out)
	if !strings.HasPrefix(s, "vrdmad "+buildVersion+"\n") || !strings.Contains(s, "release  "+buildinfo.Release+"\n") || !strings.Contains(s, "module   github.com/vrdma/vrdma "+modVersion+"\n") ||
		!strings.Contains(s, "go       "+goVersion+" ") {
		t.Errorf("vrdmad --version:\n%s\ngo version -m:\n%s", s, m)
	}
	if rev != "" && !strings.Contains(s, "commit   "+rev) {
		t.Errorf("vrdmad --version lacks commit %s:\n%s", rev, s)
	}
	if rev == "" && !strings.Contains(s, "commit   unknown") {
		t.Errorf("an unstamped build claims a commit:\n%s", s)
	}
	t.Logf("vrdmad --version:\n%s", s)
}
