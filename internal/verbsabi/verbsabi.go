// SPDX-License-Identifier: Apache-2.0

// Package verbsabi builds the drop-in libibverbs.so.1 (guest/ibverbs, C)
// for tests, and runs unmodified programs against it. The library itself
// has no Go in it; this package only drives its build and its programs.
package verbsabi

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Header is the system header the library is compiled against.
const Header = "/usr/include/infiniband/verbs.h"

// InstallHint names the Debian packages the build and the tests need.
const InstallHint = "install gcc libibverbs-dev ibverbs-utils (apt-get install -y gcc make libibverbs-dev ibverbs-utils)"

var built struct {
	once     sync.Once
	dir      string
	warnings string
	err      error
	skip     string
}

// SourceDir returns guest/ibverbs of this module.
func SourceDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "guest", "ibverbs")
}

// Build builds the library once per test binary, into a temporary
// directory next to the test binary, and returns that directory (the
// LD_LIBRARY_PATH of programs run against it). It skips tb when gcc, make
// or the headers are missing, and fails it when the build fails or the
// compiler warns (the sources are -Wall -Wextra clean).
func Build(tb testing.TB) string {
	tb.Helper()
	built.once.Do(func() {
		for _, tool := range []string{"gcc", "make", "objdump", "nm"} {
			if _, err := exec.LookPath(tool); err != nil {
				built.skip = fmt.Sprintf("no %s: %s", tool, InstallHint)
				return
			}
		}
		if _, err := os.Stat(Header); err != nil {
			built.skip = fmt.Sprintf("no %s: %s", Header, InstallHint)
			return
		}
		// Read the sources from this process, so that go test's cache
		// sees them (it records the files a test opens, not make's).
		for _, pat := range []string{"*", "tests/*", "../rdmacm/*", "../rdmacm/tests/*"} {
			files, _ := filepath.Glob(filepath.Join(SourceDir(), pat))
			for _, f := range files {
				os.ReadFile(f)
			}
		}
		base := os.TempDir()
		if exe, err := os.Executable(); err == nil {
			base = filepath.Dir(exe)
		}
		dir, err := os.MkdirTemp(base, "libibverbs-")
		if err != nil {
			built.err = err
			return
		}
		cmd := exec.Command("make", "-s", "-C", SourceDir(), "OUT="+dir, "CC=gcc")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			built.err = fmt.Errorf("make -C guest/ibverbs: %v\n%s", err, out.String())
			return
		}
		if strings.Contains(out.String(), "warning:") {
			built.warnings = out.String()
		}
		built.dir = dir
	})
	if built.skip != "" {
		tb.Skip(built.skip)
	}
	if built.err != nil {
		tb.Fatal(built.err)
	}
	if built.warnings != "" {
		tb.Errorf("the C library does not build warning-free:\n%s", built.warnings)
	}
	return built.dir
}

// Env returns the environment of a program run as a workload of vm on the
// agent at socket, with the library of dir.
func Env(dir, socket, vm string) []string {
	env := []string{"LD_LIBRARY_PATH=" + dir, "VRDMA_SOCKET=" + socket}
	if vm != "" {
		env = append(env, "VRDMA_VM="+vm)
	}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LD_LIBRARY_PATH", "VRDMA_SOCKET", "VRDMA_VM", "LD_PRELOAD", "VRDMA_QUIET":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// NeedProgram skips tb unless the Debian program path is installed.
func NeedProgram(tb testing.TB, path, pkg string) {
	tb.Helper()
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("no %s: install %s (apt-get install -y %s)", path, pkg, pkg)
	}
}
