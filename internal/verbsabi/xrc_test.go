// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestMiddlewareXRCOpenQP runs guest/ibverbs/tests/xrcshare_check.c: an
// XRC target QP shared by two processes of one VM. The owner (vmA)
// creates the target QP and an XRC SRQ; the opener, another process of
// vmA, opens the QP with ibv_open_qp after the refusals (a QP that is
// not a target QP, another VM's target QP, a domain the QP is not in, a
// wrong type, no domain: EINVAL), makes an XRC SRQ of its own and
// connects the opened QP; a sender in vmB sends through its XRC
// initiator QP to both processes' SRQs, each message landing in the SRQ's
// process and completing in that process's CQ with the target QP's
// number; a SEND naming an SRQ of another domain completes
// REM_INV_REQ_ERR, and both handles of the target QP get
// IBV_EVENT_QP_FATAL with their own ibv_qp; the owner's destroy leaves
// the QP to the opener, whose destroy frees its domain. On memcpy, tcp
// and rdma RoCE v2.
func TestMiddlewareXRCOpenQP(t *testing.T) {
	lib := Build(t)
	bin := compileC(t, lib, filepath.Join(SourceDir(), "tests", "xrcshare_check.c"), []string{"libibverbs.so.1"})
	for _, path := range []string{"memcpy", "tcp", "rdma-v2"} {
		t.Run(path, func(t *testing.T) {
			sockA, sockB, _ := pingpongHosts(t, path)
			file := filepath.Join(t.TempDir(), "xrc_domain")
			owner := startRole(t, lib, sockA, "vmA", bin, "owner", file)
			oi := owner.info(t, 3) // QPN SRQN GID
			sender := startRole(t, lib, sockB, "vmB", bin, "sender")
			si := sender.info(t, 4) // QPN SRQN TGTQPN GID
			opener := startRole(t, lib, sockA, "vmA", bin, "opener", file, oi[0], si[0], si[3], si[2])
			bi := opener.info(t, 1) // SRQN
			sender.send(t, "peer "+oi[0]+" "+oi[2]+" "+oi[1]+" "+bi[0])
			sender.expect(t, "connect-ini", "send-to-opener-srq", "send-to-owner-srq")
			owner.send(t, "wait")
			opener.send(t, "wait")
			owner.expect(t, "recv-in-own-srq")
			opener.expect(t, "recv-in-own-srq")
			sender.send(t, "bad")
			sender.expect(t, "send-other-domain-srq")
			owner.send(t, "fatal")
			opener.send(t, "fatal")
			owner.expect(t, "qp-fatal-event")
			opener.expect(t, "qp-fatal-event")
			owner.send(t, "destroy")
			owner.expect(t, "owner-destroy")
			opener.send(t, "query")
			opener.expect(t, "opened-outlives-creator-handle")
			opener.send(t, "destroy")
			opener.expect(t, "opener-destroy")
			for _, r := range []*role{owner, opener, sender} {
				r.end(t)
			}
		})
	}
}

// role is one process of xrcshare_check, driven through its stdin.
type role struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	out   strings.Builder // everything it printed, for failures
}

// startRole runs bin with args as a workload of vm.
func startRole(t *testing.T, lib, socket, vm, bin string, args ...string) *role {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	r := &role{name: args[0], cmd: exec.CommandContext(ctx, bin, args...), lines: make(chan string, 64)}
	r.cmd.Env = Env(lib, socket, vm)
	r.cmd.Stderr = os.Stderr
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if r.in, err = r.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.cmd.Process.Kill(); r.cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	return r
}

// next returns the role's next line; it fails t on a FAIL line, at the
// end of its output or after 30 s.
func (r *role) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-r.lines:
		if !ok {
			t.Fatalf("%s ended early:\n%s", r.name, r.out.String())
		}
		r.out.WriteString(l + "\n")
		if strings.HasPrefix(l, "FAIL") {
			t.Fatalf("%s: %s\n%s", r.name, l, r.out.String())
		}
		return l
	case <-time.After(30 * time.Second):
		t.Fatalf("%s printed nothing for 30 s:\n%s", r.name, r.out.String())
	}
	return ""
}

// info skips the role's ok lines up to its "info" line and returns its n
// fields.
func (r *role) info(t *testing.T, n int) []string {
	t.Helper()
	for {
		l := r.next(t)
		if f := strings.Fields(l); len(f) == n+1 && f[0] == "info" {
			return f[1:]
		}
		if !strings.HasPrefix(l, "ok ") {
			t.Fatalf("%s: unexpected line %q", r.name, l)
		}
	}
}

// send writes a command line to the role.
func (r *role) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(r.in, line+"\n"); err != nil {
		t.Fatalf("%s: %v", r.name, err)
	}
}

// expect reads the role's next lines, which must be "ok NAME" for names.
func (r *role) expect(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if l := r.next(t); l != "ok "+n {
			t.Fatalf("%s: got %q, want ok %s\n%s", r.name, l, n, r.out.String())
		}
	}
}

// end closes the role's stdin and waits for it to exit 0.
func (r *role) end(t *testing.T) {
	t.Helper()
	r.in.Close()
	for l := range r.lines {
		r.out.WriteString(l + "\n")
		if strings.HasPrefix(l, "FAIL") {
			t.Errorf("%s: %s", r.name, l)
		}
	}
	if err := r.cmd.Wait(); err != nil {
		t.Errorf("%s: %v\n%s", r.name, err, r.out.String())
	}
}
