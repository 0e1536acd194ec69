// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
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
// against the drop-in libibverbs and librdmacm, on vrdma0 of a VM, in the
// view vrdmactl exec --sysfs gives (the suite's test_rdmacm finds vrdma0's
// address under /sys/class/infiniband/vrdma0/device/net and with ip), so
// that one run counts every file: no test may fail or error, the tests of
// what vrdma does (PD, CQ, completion events, extended CQ, RC traffic with
// the ibv_wr_* API, atomics and their bad flows, fork, device queries,
// rdma_cm, on-demand paging, parent domains, imports, atomic write, memory
// windows, XRC, multicast) must pass, at least 110 in all, and the
// run's counts per file, with the reasons of the skips, are logged
// (docs/verbs-compat.md's table is one such run).
func TestVerbsABIPyverbs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skipf("vrdmactl exec --sysfs needs root (mount and network namespaces; euid %d): run the test as root (CI does)", os.Geteuid())
	}
	hugePages(t, 16) // the suite's huge-page tests skip without 2 MiB pages
	lib := BuildRDMACM(t)
	dir := pyverbsSuite(t)
	ctl := testenv.Binary(t, "vrdmactl")
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 64, IPv4: []string{cmAddrA}})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ctl, "--socket", env.Socket, "exec", "--sysfs", "--lib", lib, "--vm", "vm1", "--",
		"/usr/bin/python3", filepath.Join(dir, "run_tests.py"), "--dev", "vrdma0", "-v")
	cmd.Env = append(os.Environ(), "VRDMA_QUIET=1")
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
	t.Logf("per file (pass / fail / skip, skip reasons):\n%s", pyverbsTable(out))
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
		// rdma_cm, in the network view (as TestRDMACMPyverbs).
		"test_rdmacm_sync_traffic", "test_rdmacm_async_traffic", "test_rdmacm_async_reject_traffic",
		"test_rdmacm_async_read", "test_rdmacm_async_write", "test_rdmacm_async_traffic_external_qp",
		"test_rdmacm_async_udp_traffic",
		// On-demand paging (not implicit: the device reaches guest
		// memory only), parent domains, imported PDs and MRs.
		"test_odp_rc_traffic", "test_odp_rc_atomic_cmp_and_swp", "test_odp_rc_atomic_fetch_and_add",
		"test_odp_rc_rdma_read", "test_odp_rc_rdma_write", "test_odp_ud_traffic", "test_odp_rc_srq_traffic",
		"test_odp_sync_prefetch_rc_traffic", "test_odp_async_prefetch_rc_traffic",
		"test_odp_prefetch_sync_no_page_fault_rc_traffic", "test_odp_prefetch_async_no_page_fault_rc_traffic",
		"test_without_allocators_rc_traffic", "test_default_allocators_rc_traffic", "test_mem_align_rc_traffic",
		"test_mem_align_ud_traffic", "test_mem_align_srq_excq_rc_traffic", "test_imported_rc_ex_rdma_write",
		// RDMA atomic write, the GID table's empty entries.
		"test_qp_ex_rc_atomic_write", "test_query_gid_ex_bad_flow",
		// Memory windows: test_mr.py's MWTest (type 1 and 2 windows bound,
		// used, invalidated locally, by a SEND with invalidate and by
		// rebinding, deallocated while bound, a window of a type that does
		// not exist refused) and the bind through ibv_wr_bind_mw.
		"test_mw_type1", "test_invalidate_mw_type1", "test_mw_type2", "test_mw_type2_invalidate_local",
		"test_mw_type2_invalidate_remote", "test_mw_type2_invalidate_dealloc", "test_reg_mw_wrong_type",
		"test_qp_ex_rc_bind_mw",
		// XRC domains, SRQs and QPs with the suite's XRCResources traffic.
		"test_xrc_atomic_cmp_and_swap", "test_xrc_atomic_fetch_and_add", "test_xrc_traffic_cq_ex",
		"test_qp_ex_xrc_send", "test_qp_ex_xrc_send_imm", "test_ro_xrc_traffic", "test_odp_xrc_traffic",
		// Regions over huge pages: an ODP region with IBV_ACCESS_HUGETLB,
		// one over a MAP_HUGETLB mapping, the parent domain's buffers in one.
		"test_odp_rc_huge_traffic", "test_odp_rc_huge_user_addr_traffic", "test_huge_page_traffic",
		// Multicast joins through rdma_cm.
		"test_rdmacm_async_multicast_traffic", "test_rdmacm_async_ex_multicast_traffic",
		"test_rdmacm_async_ex_leave_multicast_traffic",
	} {
		// A test with a docstring prints it on a line of its own, before the result.
		if !regexp.MustCompile(`(?m)^` + name + ` \(.*\)(\n[^\n]*)? \.\.\. ok$`).MatchString(out) {
			t.Errorf("%s did not pass:\n%s", name, grepLines(out, name))
		}
	}
	if total-skipped < 110 {
		t.Errorf("only %d of rdma-core's %d tests passed", total-skipped, total)
	}
}

// pyverbsResult is a test's line in unittest's -v output: its name, its
// file (module) and how it ended ("ok", "skipped 'why'", "FAIL",
// "ERROR"); a test with a docstring prints the docstring on a line of its
// own before the result, and one that prints (test_fork) a line between
// "..." and the result.
var pyverbsResult = regexp.MustCompile(`(?m)^(test_\w+) \(tests\.(test_\w+)\.[\w.]+\)(?:\n[^\n]*?)? \.\.\. (?:[^\n]*\n)??(ok|skipped '(.*)'|FAIL|ERROR|expected failure)$`)

// pyverbsTable sums the suite's -v output per file: a Markdown table of
// pass, fail and skip counts with the skip reasons and how many tests
// gave each, the layout of docs/verbs-compat.md's.
func pyverbsTable(out string) string {
	type row struct {
		pass, fail, skip int
		reasons          map[string]int
		order            []string
	}
	rows := map[string]*row{}
	var files []string
	for _, m := range pyverbsResult.FindAllStringSubmatch(out, -1) {
		r := rows[m[2]]
		if r == nil {
			r = &row{reasons: map[string]int{}}
			rows[m[2]] = r
			files = append(files, m[2])
		}
		switch {
		case m[3] == "ok":
			r.pass++
		case strings.HasPrefix(m[3], "skipped"):
			r.skip++
			if r.reasons[m[4]] == 0 {
				r.order = append(r.order, m[4])
			}
			r.reasons[m[4]]++
		default:
			r.fail++
		}
	}
	sort.Strings(files)
	var b strings.Builder
	b.WriteString("| file | pass | fail | skip | reasons |\n|---|---|---|---|---|\n")
	for _, f := range files {
		r := rows[f]
		var why []string
		for _, w := range r.order {
			why = append(why, fmt.Sprintf("%s (%d)", w, r.reasons[w]))
		}
		fmt.Fprintf(&b, "| `%s` | %d | %d | %d | %s |\n", f, r.pass, r.fail, r.skip, strings.Join(why, "; "))
	}
	return b.String()
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
