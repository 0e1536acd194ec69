// SPDX-License-Identifier: Apache-2.0

package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPackageVersion runs packaging/version in a git repository of its
// own through a release's life: no tag yet (a snapshot before the
// release), the commit tagged, commits after the tag, uncommitted
// changes, and HEAD tagged with another release (refused). Then it builds
// vrdmad as build-deb does, stamped with this checkout's version, and
// vrdmad --version says that version.
func TestPackageVersion(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range []string{"packaging/version", "internal/buildinfo/buildinfo.go"} {
		b, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "tag.gpgSign=false", "-c", "commit.gpgSign=false"}, args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	version := func() (string, error) {
		out, err := exec.Command(filepath.Join(dir, "packaging", "version")).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	release := regexp.MustCompile(`(?m)^const Release = "(.*)"$`).FindStringSubmatch(readFile(t, filepath.Join(dir, "internal/buildinfo/buildinfo.go")))[1]
	git("init", "-q")
	git("add", ".")
	git("commit", "-qm", "first")
	hash := func() string { return git("rev-parse", "--short=12", "HEAD") }
	date := git("log", "-1", "--format=%cd", "--date=format:%Y%m%d")

	for _, step := range []struct {
		name string
		do   func()
		want func() string
	}{
		{"no tag", func() {}, func() string { return release + "~git" + date + "." + hash() }},
		{"tagged", func() { git("tag", "v"+release) }, func() string { return release }},
		{"two commits after the tag", func() {
			git("commit", "-q", "--allow-empty", "-m", "second")
			git("commit", "-q", "--allow-empty", "-m", "third")
		}, func() string { return release + "+2.g" + hash() }},
		{"uncommitted changes", func() {
			os.WriteFile(filepath.Join(dir, "packaging", "version"), []byte(readFile(t, filepath.Join(dir, "packaging", "version"))+"\n"), 0o755)
		}, func() string { return release + "+2.g" + hash() + ".dirty" }},
	} {
		step.do()
		got, err := version()
		if want := step.want(); err != nil || got != want {
			t.Errorf("%s: packaging/version = %q, %v; want %q", step.name, got, err, want)
		}
	}
	git("checkout", "-q", "--", ".")
	git("tag", "v9.9.9")
	if got, err := version(); err == nil || !strings.Contains(got, "HEAD is tagged v9.9.9 but internal/buildinfo says "+release) {
		t.Errorf("HEAD tagged with another release: %q, %v; want a refusal", got, err)
	}

	// vrdmad as build-deb builds it, stamped with this checkout's version.
	out, err := exec.Command(filepath.Join(repo, "packaging", "version")).CombinedOutput()
	if err != nil {
		t.Fatalf("packaging/version of this checkout: %v\n%s", err, out)
	}
	v := strings.TrimSpace(string(out))
	bin := filepath.Join(t.TempDir(), "vrdmad")
	build := exec.Command("go", "build", "-ldflags", "-X github.com/vrdma/vrdma/internal/buildinfo.version="+v, "-o", bin, "./cmd/vrdmad")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "vrdmad "+v+"\n  release  "+release+"\n") {
		t.Errorf("vrdmad --version of a build stamped %s: %v\n%s", v, err, out)
	}
	t.Logf("this checkout: %s", v)
}

// readFile returns the contents of file, failing t if it cannot.
func readFile(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
