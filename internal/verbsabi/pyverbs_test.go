package verbsabi

import (
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// pyverbsTests is where Debian's python3-pyverbs installs rdma-core's test
// suite (some files gzipped).
const pyverbsTests = "/usr/share/doc/rdma-core/tests"

// TestVerbsABIPyverbs runs rdma-core's own test suite (python3-pyverbs)
// against the drop-in, on vrdma0 of a VM: no test may fail or error, and
// the tests of what vrdma does (PD, CQ, completion events, extended CQ,
// RC traffic with the ibv_wr_* API, atomics and their bad flows, fork,
// device queries) must pass. docs/verbs-compat.md has the counts per file
// and the reason of every skip.
func TestVerbsABIPyverbs(t *testing.T) {
	lib := Build(t)
	dir := pyverbsSuite(t)
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", filepath.Join(dir, "run_tests.py"), "--dev", "vrdma0", "-v")
	cmd.Env = append(Env(lib, env.Socket, "vm1"), "VRDMA_QUIET=1")
	cmd.Dir = dir
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests`).FindStringSubmatch(out)
	res := regexp.MustCompile(`(?m)^(OK|FAILED)(?: \((.*)\))?$`).FindStringSubmatch(out)
	if err != nil || ran == nil || res == nil || res[1] != "OK" {
		t.Fatalf("rdma-core's tests: %v\n%s", err, out)
	}
	total, _ := strconv.Atoi(ran[1])
	skipped := 0
	if m := regexp.MustCompile(`skipped=(\d+)`).FindStringSubmatch(res[2]); m != nil {
		skipped, _ = strconv.Atoi(m[1])
	}
	t.Logf("rdma-core's tests: %d run, %d passed, %d skipped", total, total-skipped, skipped)
	for _, name := range []string{
		"test_atomic_cmp_and_swap", "test_atomic_fetch_and_add", "test_atomic_invalid_rkey", "test_atomic_non_aligned_addr",
		"test_create_cq_with_comp_channel", "test_cq_events_rc", "test_rc_traffic_cq_ex",
		"test_qp_ex_rc_rdma_write", "test_qp_ex_rc_rdma_read", "test_qp_ex_rc_send_imm", "test_qp_ex_rc_atomic_fetch_add",
		"test_ro_rc_traffic",
		// UD QPs and address handles; not the UD tests
		// of ibv_create_qp_ex with random create masks (test_create_ud_qp_ex_*,
		// test_modify_ud_qp, test_query_ud_qp), which skip when the mask
		// asks for what vrdma lacks (create flags, TSO), as RC's do.
		"test_create_ah", "test_create_ah_roce", "test_destroy_ah", "test_cq_events_ud", "test_ud_traffic_cq_ex",
		"test_create_ud_qp_no_attr", "test_create_ud_qp_with_attr", "test_query_data_in_order", "test_qp_ex_ud_send",
		"test_qp_ex_ud_send_imm", "test_qp_ex_ud_zero_size", "test_ro_ud_traffic",
		// ibv_resize_cq and ibv_rereg_mr's translation, PD and access.
		"test_resize_cq", "test_mr_rereg_access", "test_mr_rereg_access_bad_flow", "test_mr_rereg_pd", "test_mr_rereg_addr",
	} {
		// A test with a docstring prints it on a line of its own, before the result.
		if !regexp.MustCompile(`(?m)^` + name + ` \(.*\)(\n[^\n]*)? \.\.\. ok$`).MatchString(out) {
			t.Errorf("%s did not pass:\n%s", name, grepLines(out, name))
		}
	}
	if total-skipped < 65 {
		t.Errorf("only %d of rdma-core's %d tests passed", total-skipped, total)
	}
}

// pyverbsSuite copies rdma-core's test suite into a directory of the test
// (gunzipping what Debian gzipped, for Python to import) and returns it.
func pyverbsSuite(t *testing.T) string {
	t.Helper()
	NeedProgram(t, filepath.Join(pyverbsTests, "run_tests.py"), "python3-pyverbs")
	NeedProgram(t, "/usr/bin/python3", "python3")
	dir := filepath.Join(t.TempDir(), "tests")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(pyverbsTests)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		src := filepath.Join(pyverbsTests, e.Name())
		dst := filepath.Join(dir, strings.TrimSuffix(e.Name(), ".gz"))
		if err := copyMaybeGzip(src, dst, strings.HasSuffix(e.Name(), ".gz")); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func copyMaybeGzip(src, dst string, gz bool) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	var r io.Reader = f
	if gz {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	w, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

func grepLines(s, sub string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
