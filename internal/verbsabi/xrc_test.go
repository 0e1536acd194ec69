// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestMiddlewareXRCPingpong runs Debian's unmodified ibv_xsrq_pingpong —
// XRC: each side opens the XRC domain of /tmp/xrc_domain, creates an XRC
// SRQ with its own CQ, an XRC target QP and an XRC initiator QP, and
// sends to the SRQ number the other side gave (wr.qp_type.xrc.remote_srqn);
// every receive completion is matched to its target QP by wc.qp_num —
// server in one VM and client in another, over memcpy (two VMs of one
// agent: the same file names a different domain in each), tcp, rdma RoCE
// v2 and rdma RoCE v1, busy-polling and with completion events (-e). Both
// sides must exit 0 with nothing on stderr (the program exits 1 at any
// error completion or failed verb), and on tcp and rdma the messages must
// have crossed that path.
func TestMiddlewareXRCPingpong(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_xsrq_pingpong", "ibverbs-utils")
	const size, iters = 4096, 100
	for _, path := range []string{"memcpy", "tcp", "rdma-v2", "rdma-v1"} {
		t.Run(path, func(t *testing.T) {
			sockA, sockB, c := pingpongHosts(t, path)
			for _, extra := range [][]string{nil, {"-e"}} {
				port := freePort(t)
				args := append([]string{"-g", "0", "-d", "vrdma0", "-p", fmt.Sprint(port), "-n", fmt.Sprint(iters), "-s", fmt.Sprint(size)}, extra...)
				srv, cli := runPair(t, lib, sockA, sockB, "/usr/bin/ibv_xsrq_pingpong", args, port)
				t.Logf("%v server:\n%s\nclient:\n%s", extra, srv, cli)
				for side, out := range map[string]string{"server": srv, "client": cli} {
					if strings.Contains(out, "error") || strings.Contains(out, "Failed") || strings.Contains(out, "Couldn't") {
						t.Errorf("%s %v reports an error:\n%s", side, extra, out)
					}
					if !strings.Contains(out, "SRQN") || !strings.Contains(out, "success") {
						t.Errorf("%s %v printed no address lines with SRQ numbers, or no success:\n%s", side, extra, out)
					}
				}
			}
			checkCrossed(t, path, sockA, c, 2*2*size*iters) // two runs of iters messages each way
		})
	}
}

// TestMiddlewareXRCVerbs runs guest/ibverbs/tests/xrc_check.c: the XRC
// verbs of the drop-in in one process and their errors (ibv_open_xrcd's
// attributes and open flags, a file's domain found again and refused with
// O_EXCL, XRC SRQs and ibv_get_srq_num, target and initiator QPs refusing
// the posts they cannot take, a SEND routed to the SRQ it names and
// completed in the SRQ's CQ with the target QP's number, EBUSY on closing
// a domain in use, the domain gone with its last handle).
func TestMiddlewareXRCVerbs(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, _ := runCSource(t, lib, env.Socket, "vm1", filepath.Join(SourceDir(), "tests", "xrc_check.c"), []string{"libibverbs.so.1"},
		filepath.Join(t.TempDir(), "xrc_domain"))
	if n := strings.Count(out, "ok "); n < 24 {
		t.Errorf("only %d checks ran", n)
	}
}
