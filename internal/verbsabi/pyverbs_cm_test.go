// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestRDMACMPyverbs runs rdma-core's test_rdmacm (python3-pyverbs) on the
// drop-in libibverbs and librdmacm, through vrdmactl exec --sysfs (the
// suite finds vrdma0's address under /sys/class/infiniband/vrdma0/device/net
// and with ip): each test forks its passive and active sides, two
// workloads of one VM that connect by the adapter's address. The tests of
// what vrdma does (synchronous and asynchronous IDs, RC traffic with SEND,
// RDMA READ and WRITE, an ACK timeout set with rdma_set_option, a
// rejected request, a QP the program makes and moves itself with
// rdma_init_qp_attr and rdma_establish, UD IDs whose connect is a service
// ID resolution and whose datagrams are answered on an address handle made
// from a completion, and multicast groups joined with rdma_join_multicast
// and rdma_join_multicast_ex, left with rdma_leave_multicast) must pass,
// and none may fail: all ten.
func TestRDMACMPyverbs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skipf("vrdmactl exec --sysfs needs root (mount and network namespaces; euid %d): run the test as root (CI does)", os.Geteuid())
	}
	lib := BuildRDMACM(t)
	dir := pyverbsSuite(t)
	ctl := testenv.Binary(t, "vrdmactl")
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 64, IPv4: []string{cmAddrA}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ctl, "--socket", env.Socket, "exec", "--sysfs", "--lib", lib, "--vm", "vm1", "--",
		"/usr/bin/python3", filepath.Join(dir, "run_tests.py"), "--dev", "vrdma0", "-v", "test_rdmacm")
	cmd.Dir = dir
	outb, err := cmd.CombinedOutput()
	out := string(outb)
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests`).FindStringSubmatch(out)
	if ran == nil {
		t.Fatalf("test_rdmacm did not run: %v\n%s", err, out)
	}
	for _, m := range regexp.MustCompile(`(?m)^(?:ERROR|FAIL): (test_\w+) `).FindAllStringSubmatch(out, -1) {
		t.Errorf("%s failed:\n%s", m[1], grepLines(out, m[1]))
	}
	for _, name := range []string{
		"test_rdmacm_sync_traffic", "test_rdmacm_async_traffic", "test_rdmacm_async_reject_traffic",
		"test_rdmacm_async_read", "test_rdmacm_async_write", "test_rdmacm_async_traffic_external_qp",
		"test_rdmacm_async_udp_traffic", "test_rdmacm_async_multicast_traffic", "test_rdmacm_async_ex_multicast_traffic",
		"test_rdmacm_async_ex_leave_multicast_traffic",
	} {
		if !regexp.MustCompile(`(?m)^` + name + ` \(.*\) \.\.\. ok$`).MatchString(out) {
			t.Errorf("%s did not pass:\n%s", name, grepLines(out, name))
		}
	}
	if t.Failed() {
		t.Logf("test_rdmacm:\n%s", out)
	}
}
