// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestSecurityDropinMemoryThreads runs guest/ibverbs/tests/mem_threads.c
// (docs/SECURITY.md): threads write and read counters beside a region, on
// its first and last pages, while the main thread registers and
// deregisters it 400 times. No write may be lost, no neighbour may read
// zero or anything but what was written, and the program's own SIGSEGV
// handler must see no fault of the library's doing and still see its own.
func TestSecurityDropinMemoryThreads(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, stderr := runCSource(t, lib, env.Socket, "vm1", filepath.Join(SourceDir(), "tests", "mem_threads.c"), []string{"libibverbs.so.1"})
	if n := strings.Count(out, "ok "); n < 10 {
		t.Errorf("only %d checks ran:\n%s", n, out)
	}
	if stderr != "" {
		t.Errorf("stderr: %s", stderr)
	}
}
