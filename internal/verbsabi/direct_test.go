// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// directVMX is the VMX of a test VM with address ipv4 that allows peers
// (vrdma.directPeers, space separated; "" leaves the key out).
func directVMX(peers, ipv4 string) string {
	s := testenv.VMX(testenv.VMOptions{MemMB: 32, IPv4: []string{ipv4}})
	if peers != "" {
		s += fmt.Sprintf("vrdma.directPeers = %q\n", peers)
	}
	return s
}

// TestDropinDirect runs the drop-in on the memcpy-direct path
// (wire-local.md §4.21) between vmA and vmB, which allow each other, and
// the same programs between vmC and vmD, where only vmC allows vmD (so
// their QPs stay on memcpy and say why):
//   - perftest ib_write_lat, ib_read_lat, ib_atomic_lat and ib_write_bw,
//     unmodified, complete on both pairs, and ib_read_lat and
//     ib_atomic_lat with rdma_cm (-R: the agent moves the QPs);
//   - guest/ibverbs/tests/direct_check.c: the client's QP reports path
//     memcpy-direct (vmB) or memcpy with memcpy-direct rejected (vmD);
//     WRITE (SGE list and inline), READ, FETCH_ADD, CMP_SWP,
//     ATOMIC_WRITE and the ibv_wr_* API give the right bytes and
//     completions through ibv_poll_cq and ibv_start_poll; the client's
//     /proc/PID/maps maps the server's guest memory on the direct pair,
//     and never on the other, and a child it forks maps neither that
//     memory nor a grant table;
//   - revocation: while the client WRITEs in a loop into the server's
//     region, the server deregisters it: no byte lands after
//     ibv_dereg_mr returns, the client's WRs then complete with an error
//     (no crash), and its /proc/PID/maps no longer maps the server's
//     memory;
//   - SEND and RECV (the send channel of wire-local.md §4.22 on the
//     direct pair, relayed on the other): perftest ib_send_lat and
//     ib_send_bw at 2, 64, 4096 bytes (the channel) and 8192 (above its
//     payload: relayed), ib_send_lat -e (events); direct_check.c's
//     SEND with immediate, 0-byte and inline SENDs, a relayed big SEND and
//     a WRITE in posting order, events of both CQs across the channel,
//     RNR with rnr_retry 1, a receive too small (both statuses) and the
//     ERR flush, each completion once, through ibv_poll_cq and
//     ibv_start_poll.
func TestDropinDirect(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ib_write_lat", "perftest")
	env := testenv.StartProcess(t, testenv.ProcessOptions{Args: []string{"--log-level", "info"}}) // why a QP went to ERR, if one fails
	addr := map[string]string{"vmA": "10.77.0.1", "vmB": "10.77.0.2", "vmC": "10.77.0.3", "vmD": "10.77.0.4"}
	env.DefineVMX(t, "vmA", directVMX("vmB", addr["vmA"]))
	env.DefineVMX(t, "vmB", directVMX("vmA", addr["vmB"]))
	env.DefineVMX(t, "vmC", directVMX("vmD", addr["vmC"]))
	env.DefineVMX(t, "vmD", directVMX("", addr["vmD"]))
	bin := compileC(t, lib, filepath.Join(SourceDir(), "tests", "direct_check.c"), []string{"libibverbs.so.1"})
	cases := []perftestCase{
		{"ib_write_lat", 8, 2000, true},
		{"ib_read_lat", 8, 1000, true},
		{"ib_atomic_lat", 8, 1000, true},
		{"ib_write_bw", 1 << 20, 200, false},
	}
	for _, pair := range [][2]string{{"vmA", "vmB"}, {"vmC", "vmD"}} {
		direct := pair[0] == "vmA"
		name := "memcpy-direct"
		if !direct {
			name = "memcpy"
		}
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.prog, func(t *testing.T) {
					prog := "/usr/bin/" + c.prog
					NeedProgram(t, prog, "perftest")
					port := freePort(t)
					args := []string{"-d", "vrdma0", "-x", "0", "-p", fmt.Sprint(port), "-n", fmt.Sprint(c.iters)}
					if c.prog != "ib_atomic_lat" {
						args = append(args, "-s", fmt.Sprint(c.size))
					}
					srv, cli := runPairIn(t, lib, env.Socket, pair[0], env.Socket, pair[1], prog, args, port)
					t.Logf("client:\n%s", cli)
					checkPerftest(t, c, srv, cli)
				})
			}
			// rdma_cm: the agent moves the QPs; the library learns the
			// path at the first post.
			for _, c := range []perftestCase{{"ib_read_lat", 8, 1000, true}, {"ib_atomic_lat", 8, 1000, true}} {
				t.Run(c.prog+"-R", func(t *testing.T) {
					port := fmt.Sprint(cmPort())
					args := []string{"-R", "-d", "vrdma0", "-p", port, "-n", fmt.Sprint(c.iters)}
					if c.prog != "ib_atomic_lat" {
						args = append(args, "-s", fmt.Sprint(c.size))
					}
					srv, cli := runCMPair(t, lib, cmSide{env.Socket, pair[0], "/usr/bin/" + c.prog, args},
						cmSide{env.Socket, pair[1], "/usr/bin/" + c.prog, append(args, addr[pair[0]])})
					t.Logf("client:\n%s", cli)
					checkPerftest(t, c, srv.String(), cli.String())
				})
			}
			// rping: rdma_cm, SENDs through the channel, RDMA READ and
			// WRITE, and at the end the client's disconnect, which must
			// flush the server's posted receive and wake its CQ thread.
			t.Run("rping", func(t *testing.T) {
				NeedProgram(t, "/usr/bin/rping", "rdmacm-utils")
				port := fmt.Sprint(cmPort())
				srv, cli := runCMPair(t, lib, cmSide{env.Socket, pair[0], "/usr/bin/rping", []string{"-s", "-a", addr[pair[0]], "-p", port, "-C", "10", "-v"}},
					cmSide{env.Socket, pair[1], "/usr/bin/rping", []string{"-c", "-a", addr[pair[0]], "-p", port, "-C", "10", "-v"}})
				if n := strings.Count(cli.String(), "ping data: rdma-ping-"); n != 10 {
					t.Errorf("the client saw %d pings, want 10\nserver:\n%s\nclient:\n%s", n, srv, cli)
				}
			})
			// SEND and RECV: through the send channel on the direct
			// pair (sizes up to its payload), relayed above it and on
			// the other pair; -e waits for completion events.
			for _, c := range []struct {
				c     perftestCase
				extra []string
			}{
				{perftestCase{"ib_send_lat", 2, 2000, true}, nil},
				{perftestCase{"ib_send_lat", 64, 2000, true}, nil},
				{perftestCase{"ib_send_lat", 4096, 1000, true}, nil},
				{perftestCase{"ib_send_lat", 8192, 500, true}, nil},
				{perftestCase{"ib_send_lat", 2, 1000, true}, []string{"-e"}},
				{perftestCase{"ib_send_bw", 2, 2000, false}, nil},
				{perftestCase{"ib_send_bw", 64, 2000, false}, nil},
				{perftestCase{"ib_send_bw", 4096, 1000, false}, nil},
				{perftestCase{"ib_send_bw", 8192, 500, false}, nil},
			} {
				t.Run(fmt.Sprintf("%s-%d%s", c.c.prog, c.c.size, strings.Join(c.extra, "")), func(t *testing.T) {
					prog := "/usr/bin/" + c.c.prog
					NeedProgram(t, prog, "perftest")
					port := freePort(t)
					args := append([]string{"-d", "vrdma0", "-x", "0", "-p", fmt.Sprint(port), "-n", fmt.Sprint(c.c.iters),
						"-s", fmt.Sprint(c.c.size)}, c.extra...)
					// ib_send_bw's server leaves its QP in RTR: its
					// library takes the channel there (§4.22), and the
					// client's library counts what went through it
					// (VRDMA_DEBUG's line at destroy). Before, not one
					// SEND did: all were relayed.
					counted := direct && c.c.prog == "ib_send_bw" && c.c.size <= 4096
					if counted {
						t.Setenv("VRDMA_DEBUG", "1")
					}
					srv, cli := runPairIn(t, lib, env.Socket, pair[0], env.Socket, pair[1], prog, args, port)
					t.Logf("server:\n%s\nclient:\n%s", srv, cli)
					checkPerftest(t, c.c, srv, cli)
					if counted {
						// Relayed: the SENDs before the server's library
						// mapped the channel (at most a queue's worth),
						// and those it left untaken for relay_ns (a
						// stall of this busy machine): at most a half.
						m := regexp.MustCompile(`send channel: (\d+) sent, .* (\d+) retracted`).FindStringSubmatch(cli)
						if m == nil {
							t.Fatalf("the client's library printed no send channel line")
						}
						sent, _ := strconv.Atoi(m[1])
						retracted, _ := strconv.Atoi(m[2])
						if carried := sent - retracted; 2*carried < c.c.iters {
							t.Errorf("%d of %d SENDs went through the send channel (%d posted to it, %d retracted), want at least half: the rest were relayed", carried, c.c.iters, sent, retracted)
						}
					}
				})
			}
			t.Run("direct_check", func(t *testing.T) {
				runDirectCheck(t, lib, env.Socket, bin, pair[0], pair[1], direct)
			})
		})
	}
}

// runDirectCheck runs direct_check's owner in VM owner and its peer in
// VM peer (see TestDropinDirect); direct says whether the pair allows the
// memcpy-direct path.
func runDirectCheck(t *testing.T, lib, sock, bin, owner, peer string, direct bool) {
	o := startRole(t, lib, sock, owner, bin, "owner")
	oi := o.info(t, 7) // QPN GID ADDR RKEY, and the send tests' QPNs S N E
	p := startRole(t, lib, sock, peer, bin, "peer")
	pi := p.info(t, 5) // QPN GID, S N E
	o.send(t, "peer "+strings.Join(pi, " "))
	o.untilDone(t)
	p.send(t, "peer "+strings.Join(oi, " "))
	p.untilDone(t)

	// The peer's QP: its path, and why.
	found := false
	for _, vm := range agentStatus(t, sock).VMs {
		for _, q := range vm.QPs {
			if vm.Name != peer || fmt.Sprint(q.QPN) != pi[0] {
				continue
			}
			found = true
			t.Logf("%s QP %d: path %+v", peer, q.QPN, q.Path)
			if direct && q.Path.Path != "memcpy-direct" {
				t.Errorf("%s's QP is on %q, want memcpy-direct: %+v", peer, q.Path.Path, q.Path)
			}
			if !direct {
				rejected := false
				for _, r := range q.Path.Rejected {
					rejected = rejected || (r.Path == "memcpy-direct" && r.Why != "")
				}
				if q.Path.Path != "memcpy" || !rejected {
					t.Errorf("%s's QP: path %+v, want memcpy with memcpy-direct rejected and why", peer, q.Path)
				}
			}
		}
	}
	if !found {
		t.Errorf("no QP %s of %s in the agent's status", pi[0], peer)
	}

	p.send(t, "data")
	if n := p.untilDone(t); n < 20 {
		t.Errorf("the peer ran %d data checks, want at least 20", n)
	}
	o.send(t, "check")
	if n := o.untilDone(t); n != 5 {
		t.Errorf("the owner ran %d checks, want 5", n)
	}

	// SEND and RECV (the send channel on the direct pair, §4.22): the
	// owner receives, the peer sends; each line one step (direct_check.c).
	for _, step := range []struct {
		r    *role
		line string
		min  int
	}{
		{o, "rpost", 1}, {p, "sends", 1}, {o, "rcheck", 9}, {p, "scheck", 9},
		{o, "evarm", 1}, {p, "evsend", 1}, {o, "evcheck", 1},
		{p, "rnr", 1},
		{o, "epost", 1}, {p, "esend", 1}, {o, "echeck", 4}, {p, "echeck2", 4},
	} {
		step.r.send(t, step.line)
		if n := step.r.untilDone(t); n < step.min {
			t.Errorf("%s: %q ran %d checks, want %d", step.r.name, step.line, n, step.min)
		}
	}
	p.send(t, "fork "+owner)
	p.untilDone(t)
	ownerMem := "/memfd:vrdma-guest-" + owner
	if got := mapsHas(t, p.cmd.Process.Pid, ownerMem); got != direct {
		t.Errorf("the peer maps %s: %v, want %v", ownerMem, got, direct)
	}

	// Revocation: dereg while the peer writes in a loop.
	p.send(t, "loop")
	if n := p.untilDone(t); n != 1 {
		t.Fatalf("peer: %q ran %d checks, want 1 (ok writing)", "loop", n)
	}
	o.send(t, "dereg")
	o.untilDone(t)
	p.send(t, "stop")
	p.untilDone(t)
	if mapsHas(t, p.cmd.Process.Pid, ownerMem) {
		t.Errorf("the peer still maps %s after the region's deregistration", ownerMem)
	}
	for _, r := range []*role{o, p} {
		r.end(t)
	}
}

// untilDone reads the role's "ok" lines up to its "done" and returns how
// many there were; a FAIL line fails t.
func (r *role) untilDone(t *testing.T) int {
	t.Helper()
	n := 0
	for {
		l := r.next(t)
		if l == "done" {
			return n
		}
		if !strings.HasPrefix(l, "ok ") {
			t.Fatalf("%s: unexpected line %q", r.name, l)
		}
		n++
	}
}

// mapsHas reports whether /proc/PID/maps has a mapping of the file path
// (a memfd's "/memfd:NAME", " (deleted)" or not).
func mapsHas(t *testing.T, pid int, path string) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 6 && f[5] == path {
			return true
		}
	}
	return false
}
