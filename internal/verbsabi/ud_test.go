// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestMiddlewareUDPingpong runs Debian's unmodified ibv_ud_pingpong — a
// UD QP on each side, an address handle made from the peer's GID (-g 0),
// each datagram received behind its 40-byte GRH, with its buffer check
// (-c) — server in one VM and client in another, over memcpy (two VMs of
// one agent), tcp (two hosts), rdma RoCE v2 and rdma RoCE v1 (two hosts
// with software RoCE uplinks; v1 in network namespaces, as root): busy-
// polling and with completion events (-e), messages of the active MTU
// (1024) and of 1 byte. Each side must report the bytes and iterations
// asked for and no error; on tcp and rdma the datagrams must have
// crossed that path.
func TestMiddlewareUDPingpong(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_ud_pingpong", "ibverbs-utils")
	const iters = 200
	for _, path := range []string{"memcpy", "tcp", "rdma-v2", "rdma-v1"} {
		t.Run(path, func(t *testing.T) {
			sockA, sockB, c := pingpongHosts(t, path)
			var total int
			for _, run := range []struct {
				size  int
				extra []string
			}{{1024, nil}, {1024, []string{"-e"}}, {1, nil}} {
				port := freePort(t)
				args := append([]string{"-g", "0", "-c", "-d", "vrdma0", "-p", fmt.Sprint(port), "-n", fmt.Sprint(iters), "-s", fmt.Sprint(run.size)}, run.extra...)
				srv, cli := runPair(t, lib, sockA, sockB, "/usr/bin/ibv_ud_pingpong", args, port)
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
				total += 2 * run.size * iters
			}
			if c == nil {
				return
			}
			kind := "tcp"
			if strings.HasPrefix(path, "rdma") {
				kind = "rdma"
			}
			if moved := uplinkBytesMoved(t, sockA, kind, c.Hosts[1].Name); moved < uint64(total) {
				t.Errorf("hostA's %s uplinks carried %d bytes, want at least %d", kind, moved, total)
			} else {
				t.Logf("hostA ↔ hostB over %s: %d bytes", kind, moved)
			}
			if path == "rdma-v1" {
				if v1, v2 := rdmaBytes(t, sockA, "v1"), rdmaBytes(t, sockA, "v2"); v1 == 0 || v2 != 0 {
					t.Errorf("hostA sent %d bytes in RoCE v1 frames and %d in RoCE v2 datagrams; want > 0 and 0", v1, v2)
				}
			}
		})
	}
}

// TestMiddlewareUDVerbs runs guest/ibverbs/tests/ud_check.c: the UD and
// address-handle verbs of the drop-in in one process (ibv_create_ah's
// refusals, UD attributes, ibv_post_send's UD refusals, the GRH in front
// of received datagrams, ibv_init_ah_from_wc and ibv_create_ah_from_wc,
// ibv_wr_set_ud_addr, LOC_LEN_ERR beyond the MTU, max_ah).
func TestMiddlewareUDVerbs(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, stderr := runC(t, lib, env.Socket, "vm1", "ud_check")
	if n := strings.Count(out, "ok "); n < 25 {
		t.Errorf("only %d checks ran:\n%s", n, out)
	}
	if !strings.Contains(stderr, "without a GRH") {
		t.Errorf("ibv_create_ah without a GRH said nothing on stderr: %q", stderr)
	}
}
