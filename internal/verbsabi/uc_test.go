// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestMiddlewareUCPingpong runs Debian's unmodified ibv_uc_pingpong — a
// UC QP on each side, connected out of band with UC's attribute masks
// (no timeout, retry, RNR or READ/atomic attributes), SENDs with no ACK
// — server in one VM and client in another, with its buffer check (-c),
// over memcpy (two VMs of one agent), tcp (two hosts), rdma RoCE v2 and
// rdma RoCE v1 (two hosts with software RoCE uplinks; v1 in network
// namespaces, as root): busy-polling and with completion events (-e),
// messages of one packet, of four and of 1024 (the path MTU 1024). Each
// side must report the bytes and iterations asked for, no invalid data
// and nothing on stderr; on tcp and rdma the bytes must have crossed
// that path (on rdma as UC packets, which TestEngineWireUC decodes with
// tshark).
func TestMiddlewareUCPingpong(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_uc_pingpong", "ibverbs-utils")
	const iters = 200
	for _, path := range []string{"memcpy", "tcp", "rdma-v2", "rdma-v1"} {
		t.Run(path, func(t *testing.T) {
			sockA, sockB, c := pingpongHosts(t, path)
			var want uint64
			for _, run := range []struct {
				size  int
				extra []string
			}{{4096, nil}, {4096, []string{"-e"}}, {64, nil}, {1 << 20, nil}} {
				port := freePort(t)
				args := append([]string{"-g", "0", "-c", "-d", "vrdma0", "-p", fmt.Sprint(port), "-n", fmt.Sprint(iters), "-s", fmt.Sprint(run.size)}, run.extra...)
				srv, cli := runPair(t, lib, sockA, sockB, "/usr/bin/ibv_uc_pingpong", args, port)
				t.Logf("-s %d %v server:\n%s\nclient:\n%s", run.size, run.extra, srv, cli)
				for side, out := range map[string]string{"server": srv, "client": cli} {
					if strings.Contains(out, "invalid data") || strings.Contains(out, "Failed") || strings.Contains(out, "Couldn't") {
						t.Errorf("%s -s %d %v reports an error:\n%s", side, run.size, run.extra, out)
					}
					if m := bytesLine.FindStringSubmatch(out); m == nil || m[1] != fmt.Sprint(2*run.size*iters) {
						t.Errorf("%s -s %d %v: bytes line %q, want %d bytes", side, run.size, run.extra, m, 2*run.size*iters)
					}
					if m := itersLine.FindStringSubmatch(out); m == nil || m[1] != fmt.Sprint(iters) {
						t.Errorf("%s -s %d %v: iters line %q, want %d", side, run.size, run.extra, m, iters)
					}
				}
				want += uint64(run.size * iters)
			}
			checkCrossed(t, path, sockA, c, want)
		})
	}
}

// TestMiddlewareUCVerbs runs guest/ibverbs/tests/uc_check.c: two UC QPs
// of one VM on the drop-in — the QP type, RC's attributes refused, RDMA
// READ and atomics refused at post (EINVAL, bad_wr at them; the ibv_wr_*
// API too; READ and atomic send ops EOPNOTSUPP at create), a SEND with no
// receive completing and dropped, SEND and WRITE with immediate
// byte-exact.
func TestMiddlewareUCVerbs(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, _ := runC(t, lib, env.Socket, "vm1", "uc_check")
	if n := strings.Count(out, "ok "); n < 20 {
		t.Errorf("only %d checks ran", n)
	}
}

// TestMiddlewareUCPyverbs runs the UC tests of rdma-core's suite
// (python3-pyverbs, run_tests.py -k _uc_: test_qp's creation with and
// without attributes, through ibv_create_qp and ibv_create_qp_ex, and its
// query) against the drop-in: all five pass, none skipped.
func TestMiddlewareUCPyverbs(t *testing.T) {
	out, err := runPyverbs(t, Build(t), pyverbsSuite(t), "_uc_", 5*time.Minute)
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests`).FindStringSubmatch(out)
	if err != nil || ran == nil || !regexp.MustCompile(`(?m)^OK$`).MatchString(out) {
		t.Fatalf("rdma-core's UC tests: %v\n%s", err, out)
	}
	// -v prints each test's docstring; a skip is "... skipped 'why'".
	if n := strings.Count(out, " ... ok\n"); ran[1] != "5" || n != 5 || strings.Contains(out, "skipped") {
		t.Errorf("ran %s UC tests, %d passed; want rdma-core v44's 5, all passed, none skipped", ran[1], n)
	}
}
