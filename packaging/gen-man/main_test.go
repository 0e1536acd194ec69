// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestPackageManPages writes the man pages and checks them: one page for
// every command (each vrdmactl subcommand a user can run, vrdmad), and no
// other; each renders with man -l without a warning (man --warnings:
// groff's), and the rendered page names the command, its summary and
// every flag it has.
func TestPackageManPages(t *testing.T) {
	if _, err := exec.LookPath("man"); err != nil {
		t.Fatal("man is missing: apt-get install -y man-db groff-base")
	}
	t.Setenv("SOURCE_DATE_EPOCH", "1764979200")           // 2025-12-06
	t.Setenv("VRDMA_SOCKET", "/home/builder/vrdmad.sock") // the builder's own, which the pages must not show
	t.Setenv("VRDMA_STATE_DIR", "/home/builder/state")
	dir := t.TempDir()
	if err := write(dir); err != nil {
		t.Fatal(err)
	}
	want := map[string]*cobra.Command{}
	var walk func(c *cobra.Command, section string)
	walk = func(c *cobra.Command, section string) {
		if !c.IsAvailableCommand() && c.HasParent() {
			return // hidden, deprecated, or the help command
		}
		want[filepath.Join("man"+section, strings.ReplaceAll(c.CommandPath(), " ", "-")+"."+section)] = c
		for _, s := range c.Commands() {
			walk(s, section)
		}
	}
	for _, p := range pages() {
		walk(p.cmd, p.section)
	}
	got, _ := filepath.Glob(filepath.Join(dir, "man*", "*"))
	if len(got) != len(want) {
		t.Errorf("%d pages written, want %d (one a command)", len(got), len(want))
	}
	for _, g := range got {
		rel, _ := filepath.Rel(dir, g)
		if want[rel] == nil {
			t.Errorf("page %s is of no command", rel)
		}
	}
	for _, must := range []string{"man1/vrdmactl.1", "man1/vrdmactl-switch-create.1", "man1/vrdmactl-perf.1", "man1/vrdmactl-completion-bash.1", "man8/vrdmad.8"} {
		if want[must] == nil {
			t.Errorf("no command has page %s", must)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "man8", "vrdmad.8")); err != nil || !strings.Contains(string(b), "/run/vrdma/vrdmad.sock") || !strings.Contains(string(b), "/var/lib/vrdma") {
		t.Errorf("vrdmad(8) does not show the service's socket and state directory as the defaults: %v\n%s", err, b)
	}
	for rel, c := range want {
		cmd := exec.Command("man", "--warnings", "-l", filepath.Join(dir, rel))
		cmd.Env = append(os.Environ(), "MANWIDTH=200", "LANG=C.UTF-8")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil || stderr.Len() != 0 {
			t.Errorf("man -l %s: %v\n%s", rel, err, stderr.String())
			continue
		}
		// man joins hyphenated words and may break lines: compare with
		// single spaces.
		text := strings.Join(strings.Fields(stdout.String()), " ")
		name := strings.ReplaceAll(c.CommandPath(), " ", "-")
		if strings.Contains(text, "/home/builder") {
			t.Errorf("%s shows the builder's defaults:\n%s", rel, text)
		}
		for _, s := range []string{name + " - " + strings.Join(strings.Fields(c.Short), " "), "SYNOPSIS", "OPTIONS"} {
			if !strings.Contains(text, s) {
				t.Errorf("%s renders without %q:\n%s", rel, s, text)
			}
		}
		c.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
			if !f.Hidden && !strings.Contains(text, "--"+f.Name) {
				t.Errorf("%s does not name its flag --%s", rel, f.Name)
			}
		})
	}
}
