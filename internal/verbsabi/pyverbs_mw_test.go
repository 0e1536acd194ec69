package verbsabi

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// pyverbsMWTests are rdma-core's tests of memory windows: test_mr.py's
// MWTest (type 1 and 2 windows bound, used, invalidated locally, by a SEND
// with invalidate and by rebinding, deallocated while bound, and a window
// of a type that does not exist refused) and test_qpex.py's bind through
// ibv_wr_bind_mw.
var pyverbsMWTests = []string{
	"test_mw_type1", "test_invalidate_mw_type1", "test_mw_type2", "test_mw_type2_invalidate_local",
	"test_mw_type2_invalidate_remote", "test_mw_type2_invalidate_dealloc", "test_reg_mw_wrong_type",
	"test_qp_ex_rc_bind_mw",
}

// TestVerbsABIPyverbsMW runs just those of rdma-core's suite against the
// drop-in, on vrdma0 of a VM (the QPs of one VM meet on the memcpy path):
// each must pass, none may skip.
func TestVerbsABIPyverbsMW(t *testing.T) {
	lib := Build(t)
	dir := pyverbsSuite(t)
	env := testenv.StartProcess(t, testenv.ProcessOptions{Args: []string{"--log-level", "debug"}})
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := []string{filepath.Join(dir, "run_tests.py"), "--dev", "vrdma0", "-v"}
	for _, n := range pyverbsMWTests {
		args = append(args, "-k", n)
	}
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", args...)
	cmd.Env = append(Env(lib, env.Socket, "vm1"), "VRDMA_QUIET=1")
	cmd.Dir = dir
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	if err != nil {
		t.Errorf("rdma-core's memory-window tests: %v\n%s", err, out)
	}
	for _, name := range pyverbsMWTests {
		// A test with a docstring prints it on a line of its own, before the result.
		if !regexp.MustCompile(`(?m)^` + name + ` \(.*\)(\n[^\n]*)? \.\.\. ok$`).MatchString(out) {
			t.Errorf("%s did not pass:\n%s", name, grepLines(out, name))
		}
	}
	if t.Failed() {
		t.Log(env.Stderr())
	}
	if testing.Verbose() {
		t.Logf("%s", out)
	}
}
