// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// commands returns every command of vrdmactl's tree that a user sees.
func commands(root *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		out = append(out, c)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	return out
}

// TestHelpTexts walks the command tree: every command a user can run has
// a Short, a Long and an Example text, its --help shows them, and every
// example line runs that command (or, for a group, one of its
// subcommands) with flags and arguments it accepts.
func TestHelpTexts(t *testing.T) {
	isolate(t)
	root := (&app{}).rootCommand()
	seen := map[string]bool{}
	for _, c := range commands(root) {
		path := c.CommandPath()
		seen[path] = true
		if !c.Runnable() && c != root {
			continue
		}
		if c.Short == "" || c.Long == "" || c.Example == "" {
			t.Errorf("%s: Short %q, Long %d bytes, Example %d bytes: each needs text (help.go)", path, c.Short, len(c.Long), len(c.Example))
			continue
		}
		out := runOK(t, append(strings.Fields(path)[1:], "--help")...)
		if !strings.Contains(out, "Examples:\n") || !strings.Contains(out, strings.TrimSpace(strings.SplitN(c.Example, "\n", 2)[0])) {
			t.Errorf("%s --help shows no Examples section:\n%s", path, out)
		}
		ran := false
		for _, line := range strings.Split(c.Example, "\n") {
			line = strings.TrimSpace(line)
			for _, cut := range []string{" #", " <", " >", " |"} {
				if i := strings.Index(line, cut); i >= 0 {
					line = line[:i]
				}
			}
			if strings.HasPrefix(line, "source <(") {
				line = strings.TrimSuffix(strings.TrimPrefix(line, "source <("), ")")
			}
			args := strings.Fields(line)
			if len(args) == 0 || args[0] != "vrdmactl" {
				continue // vrdmad, or a shell line
			}
			// A fresh tree per line: parsing flags changes them.
			r := (&app{}).rootCommand()
			cmd, rest, err := r.Find(args[1:])
			if err != nil {
				t.Errorf("%s: example %q: %v", path, line, err)
				continue
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Errorf("%s: example %q: %v", path, line, err)
				continue
			}
			if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
				t.Errorf("%s: example %q: %v", path, line, err)
			}
			// A group's examples run its subcommands.
			if cmd.CommandPath() == path || strings.HasPrefix(cmd.CommandPath(), path+" ") {
				ran = true
			}
		}
		if !ran {
			t.Errorf("%s: no example runs it or its subcommands:\n%s", path, c.Example)
		}
	}
	for k := range manual {
		if !seen[k] {
			t.Errorf("help.go has a manual page for %q, which is no command", k)
		}
	}
}

// TestCompletion checks that vrdmactl completion prints a bash script that
// bash accepts, and that the completions it asks vrdmactl for are right.
func TestCompletion(t *testing.T) {
	isolate(t)
	script := runOK(t, "completion", "bash")
	if !strings.HasPrefix(script, "# bash completion V2 for vrdmactl") || !strings.Contains(script, "complete -o default -F __start_vrdmactl vrdmactl") {
		t.Fatalf("completion bash is not a bash completion script for vrdmactl:\n%.400s", script)
	}
	for _, sh := range []string{"zsh", "fish", "powershell"} {
		if out := runOK(t, "completion", sh); !strings.Contains(out, "vrdmactl") {
			t.Errorf("completion %s:\n%.300s", sh, out)
		}
	}
	// What the script asks for on TAB: "vrdmactl __complete ARGS...".
	out := runOK(t, "__complete", "vm", "power")
	if !strings.Contains(out, "power-off\t") || !strings.Contains(out, "power-on\t") || strings.Contains(out, "define") {
		t.Errorf("__complete vm power:\n%s", out)
	}
	out = runOK(t, "__complete", "doctor", "--")
	if !strings.Contains(out, "--rdma-uplink\t") || !strings.Contains(out, "--socket\t") {
		t.Errorf("__complete doctor --:\n%s", out)
	}

	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash to load the script into")
	}
	f := filepath.Join(t.TempDir(), "vrdmactl.bash")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	// Load it and check that it registered its completion function.
	b, err := exec.Command(bash, "-c", "source "+f+" && complete -p vrdmactl && declare -F __start_vrdmactl").CombinedOutput()
	if err != nil || !strings.Contains(string(b), "__start_vrdmactl") {
		t.Errorf("bash does not load the script: %v\n%s", err, b)
	}
}
