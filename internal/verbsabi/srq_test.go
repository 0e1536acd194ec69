// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// pingpongHosts starts the agents of a pingpong test's path — memcpy (one
// agent), tcp, rdma-v2 (two hosts on loopback addresses; rdma-v2 with
// software RoCE uplinks) or rdma-v1 (two hosts in network namespaces) —
// with VM vmA on the first and vmB on the second, and returns their
// sockets and the cluster (nil on memcpy).
func pingpongHosts(t *testing.T, path string) (sockA, sockB string, c *testenv.Cluster) {
	t.Helper()
	switch path {
	case "memcpy":
		env := testenv.StartProcess(t, testenv.ProcessOptions{})
		env.Define(t, "vmA", testenv.VMOptions{MemMB: 16})
		env.Define(t, "vmB", testenv.VMOptions{MemMB: 16})
		return env.Socket, env.Socket, nil
	case "tcp":
		c = testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff})
	case "rdma-v2":
		c = testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff, RDMA: true})
	case "rdma-v1":
		c = testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, RDMA: true, RoCEVersion: "v1"})
	default:
		t.Fatalf("pingpongHosts: no path %q", path)
	}
	c.Hosts[0].Define(t, "vmA", testenv.VMOptions{MemMB: 16})
	c.Hosts[1].Define(t, "vmB", testenv.VMOptions{MemMB: 16})
	return c.Hosts[0].Socket, c.Hosts[1].Socket, c
}

// TestMiddlewareSRQPingpong runs Debian's unmodified ibv_srq_pingpong —
// 16 RC QPs on each side taking their receives from one shared receive
// queue, every completion matched to its QP by wc.qp_num — server in one
// VM and client in another, with its buffer check (-c), over memcpy (two
// VMs of one agent), tcp (two hosts), rdma RoCE v2 and rdma RoCE v1 (two
// hosts with software RoCE uplinks; v1 in network namespaces, as root):
// busy-polling and with completion events (-e), and on memcpy 64 QPs
// sharing 128 receives posted at a time. Each side must report the
// bytes and iterations asked for, no invalid data and nothing on stderr;
// on tcp and rdma the bytes must have crossed that path.
func TestMiddlewareSRQPingpong(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_srq_pingpong", "ibverbs-utils")
	const size, iters = 4096, 200
	for _, path := range []string{"memcpy", "tcp", "rdma-v2", "rdma-v1"} {
		t.Run(path, func(t *testing.T) {
			sockA, sockB, c := pingpongHosts(t, path)
			runs := [][]string{nil, {"-e"}}
			if path == "memcpy" {
				runs = append(runs, []string{"-q", "64", "-r", "128"}) // more QPs than receives posted at once
			}
			for _, extra := range runs {
				port := freePort(t)
				args := append([]string{"-g", "0", "-c", "-d", "vrdma0", "-p", fmt.Sprint(port), "-n", fmt.Sprint(iters), "-s", fmt.Sprint(size)}, extra...)
				srv, cli := runPair(t, lib, sockA, sockB, "/usr/bin/ibv_srq_pingpong", args, port)
				t.Logf("%v server:\n%s\nclient:\n%s", extra, srv, cli)
				for side, out := range map[string]string{"server": srv, "client": cli} {
					if strings.Contains(out, "invalid data") || strings.Contains(out, "Failed") || strings.Contains(out, "Couldn't") {
						t.Errorf("%s %v reports an error:\n%s", side, extra, out)
					}
					if m := bytesLine.FindStringSubmatch(out); m == nil || m[1] != fmt.Sprint(2*size*iters) {
						t.Errorf("%s %v: bytes line %q, want %d bytes", side, extra, m, 2*size*iters)
					}
					if m := itersLine.FindStringSubmatch(out); m == nil || m[1] != fmt.Sprint(iters) {
						t.Errorf("%s %v: iters line %q, want %d", side, extra, m, iters)
					}
				}
			}
			// Two runs of 2 × size × iters bytes (ibv_srq_pingpong's iters
			// are spread over its 16 QPs).
			checkCrossed(t, path, sockA, c, 2*2*size*iters)
		})
	}
}

// checkCrossed checks, on tcp and rdma (c not nil), that hostA's uplinks
// of path carried at least want bytes to and from hostB, and on rdma-v1
// that they went as RoCE v1 frames only.
func checkCrossed(t *testing.T, path, sockA string, c *testenv.Cluster, want uint64) {
	t.Helper()
	if c == nil {
		return
	}
	kind := "tcp"
	if strings.HasPrefix(path, "rdma") {
		kind = "rdma"
	}
	if moved := uplinkBytesMoved(t, sockA, kind, c.Hosts[1].Name); moved < want {
		t.Errorf("hostA's %s uplinks carried %d bytes, want at least %d", kind, moved, want)
	} else {
		t.Logf("hostA ↔ hostB over %s: %d bytes", kind, moved)
	}
	if path == "rdma-v1" {
		if v1, v2 := rdmaBytes(t, sockA, "v1"), rdmaBytes(t, sockA, "v2"); v1 == 0 || v2 != 0 {
			t.Errorf("hostA sent %d bytes in RoCE v1 frames and %d in RoCE v2 datagrams; want > 0 and 0", v1, v2)
		}
	}
}

// rdmaBytes returns the bytes the agent at sock sent on its rdma uplinks
// of RoCE version roce ("v1", "v2").
func rdmaBytes(t *testing.T, sock, roce string) uint64 {
	t.Helper()
	st := agentStatus(t, sock)
	var n uint64
	for _, u := range st.RDMA {
		if u.RoCE == roce {
			n += u.BytesOut
		}
	}
	return n
}

// pyverbsSRQModule is a test module of rdma-core's suite's shape, run by
// its run_tests.py: the suite Debian ships has no SRQ test a device
// without ODP, parent domains or tag matching can run (its one generic
// one, test_odp_rc_srq_traffic, is test_odp's), so this is that test
// without ODP — the suite's own RCResources with with_srq=True and its
// traffic() — plus pyverbs' SRQ modify and query, on the drop-in.
const pyverbsSRQModule = `import errno
import unittest

import pyverbs.enums as e
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.srq import SrqAttr
from tests.base import RCResources, RDMATestCase
import tests.utils as u


class SrqRC(RCResources):
    def __init__(self, dev_name, ib_port, gid_index, qp_count=1):
        super().__init__(dev_name=dev_name, ib_port=ib_port, gid_index=gid_index, with_srq=True, qp_count=qp_count)


class VrdmaSrqTestCase(RDMATestCase):
    def setUp(self):
        super().setUp()
        self.iters = 100

    def create_players(self, resource, **resource_arg):
        self.client = resource(**self.dev_info, **resource_arg)
        self.server = resource(**self.dev_info, **resource_arg)
        self.client.pre_run(self.server.psns, self.server.qps_num)
        self.server.pre_run(self.client.psns, self.client.qps_num)
        self.traffic_args = {'client': self.client, 'server': self.server, 'iters': self.iters,
                             'gid_idx': self.gid_index, 'port': self.ib_port}

    def test_vrdma_rc_srq_traffic(self):
        self.create_players(SrqRC, qp_count=2)
        u.traffic(**self.traffic_args)

    def test_vrdma_srq_modify_query(self):
        self.create_players(SrqRC, qp_count=1)
        srq = self.server.srq
        attr = srq.query()
        self.assertGreaterEqual(attr.max_wr, self.server.num_msgs)
        srq.modify(SrqAttr(srq_limit=2), e.IBV_SRQ_LIMIT)
        self.assertEqual(srq.query().srq_limit, 2)
        with self.assertRaises(PyverbsRDMAError) as ex:
            srq.modify(SrqAttr(max_wr=attr.max_wr * 2), e.IBV_SRQ_MAX_WR)
        self.assertEqual(ex.exception.error_code, errno.EINVAL)
`

// TestMiddlewareSRQPyverbs runs pyverbsSRQModule with rdma-core's
// run_tests.py against the drop-in: RC traffic of two QPs sharing an SRQ
// through pyverbs (SRQ, post_srq_recv, completions by QP), and the SRQ's
// modify and query. Both tests must pass (none skipped).
func TestMiddlewareSRQPyverbs(t *testing.T) {
	lib := Build(t)
	dir := pyverbsSuite(t)
	if err := os.WriteFile(filepath.Join(dir, "test_vrdma_srq.py"), []byte(pyverbsSRQModule), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runPyverbs(t, lib, dir, "vrdma", 2*time.Minute)
	if err != nil || !regexp.MustCompile(`(?m)^Ran 2 tests`).MatchString(out) || !regexp.MustCompile(`(?m)^OK$`).MatchString(out) {
		t.Fatalf("pyverbs SRQ tests: %v", err)
	}
	for _, name := range []string{"test_vrdma_rc_srq_traffic", "test_vrdma_srq_modify_query"} {
		if !regexp.MustCompile(`(?m)^` + name + ` \(.*\) \.\.\. ok$`).MatchString(out) {
			t.Errorf("%s did not pass", name)
		}
	}
}

// runPyverbs runs the tests of rdma-core's suite in dir (pyverbsSuite)
// whose names hold k (run_tests.py -k), verbosely, on vrdma0 of a VM of
// a new agent, against the drop-in of lib, within d; it logs and returns
// their output.
func runPyverbs(t *testing.T, lib, dir, k string, d time.Duration) (string, error) {
	t.Helper()
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 64})
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/python3", filepath.Join(dir, "run_tests.py"), "--dev", "vrdma0", "-v", "-k", k)
	cmd.Env = append(Env(lib, env.Socket, "vm1"), "VRDMA_QUIET=1")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	return string(out), err
}

// TestMiddlewareSRQVerbs runs guest/ibverbs/tests/srq_check.c: the SRQ
// verbs of the drop-in in one process (ibv_create_srq_ex, query, modify
// with the limit and a refused resize, ibv_post_srq_recv, QPs on the SRQ
// whose completions name them, the limit and last-WQE events through
// ibv_get_async_event, EBUSY on destroy while in use).
func TestMiddlewareSRQVerbs(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, _ := runC(t, lib, env.Socket, "vm1", "srq_check")
	if n := strings.Count(out, "ok "); n < 25 {
		t.Errorf("only %d checks ran", n)
	}
}
