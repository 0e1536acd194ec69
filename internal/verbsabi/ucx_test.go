// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// execProgram returns the command that runs prog as a workload of vm on
// the agent at sock through vrdmactl exec (ctl), with the drop-in of lib:
// the device view UCX needs comes with it.
func execProgram(ctx context.Context, ctl, lib, sock, vm, prog string, args []string, env ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, ctl, append([]string{"--socket", sock, "exec", "--lib", lib, "--vm", vm, "--", prog}, args...)...)
	c.Env = append(Env(lib, sock, vm), env...)
	return c
}

// runExecPair runs prog through vrdmactl exec as a server in vmA (at
// e.sockA) listening on TCP port port, then as a client in vmB (at
// e.sockB) with clientArgs, and returns both outputs; it fails t if
// either side fails.
func runExecPair(t *testing.T, ctl, lib string, e cmEnv, prog string, serverArgs, clientArgs []string, port int, env ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := execProgram(ctx, ctl, lib, e.sockA, "vmA", prog, serverArgs, env...)
	var sout testenv.SyncBuffer
	srv.Stdout, srv.Stderr = &sout, &sout
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for !listening(port) {
		select {
		case err := <-srvDone:
			t.Fatalf("server exited before listening: %v\n%s", err, sout.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server does not listen on %d:\n%s", port, sout.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, cliErr := execProgram(ctx, ctl, lib, e.sockB, "vmB", prog, clientArgs, env...).CombinedOutput()
	srvErr := <-srvDone
	if cliErr != nil || srvErr != nil {
		t.Fatalf("client: %v, server: %v\nserver:\n%s\nclient:\n%s", cliErr, srvErr, tail(sout.String(), 40), tail(string(out), 40))
	}
	return sout.String(), string(out)
}

// ucxMemMB is the guest memory of the VMs UCX runs in: rc_verbs registers
// its receive buffers as one pool of 36 MiB (rc_recv_desc), and fails in
// a smaller VM ("raise memSize").
const ucxMemMB = 256

// ucxTransports parses ucx_info -d: each transport on each device, and
// whether its interface opened ("< failed to open interface >" follows
// the device otherwise).
func ucxTransports(out string) map[string]bool {
	tls := map[string]bool{}
	var last string
	for _, l := range strings.Split(out, "\n") {
		f := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#"))
		switch {
		case strings.HasPrefix(f, "Transport:"):
			last = strings.TrimSpace(strings.TrimPrefix(f, "Transport:"))
		case strings.HasPrefix(f, "Device:") && last != "":
			last += "/" + strings.TrimSpace(strings.TrimPrefix(f, "Device:"))
			tls[last] = true
		case strings.Contains(f, "failed to open interface") && strings.Contains(last, "/"):
			tls[last] = false
		}
	}
	return tls
}

// ucxInfo runs ucx_info -d as a workload of vm through vrdmactl exec.
func ucxInfo(t *testing.T, ctl, lib, sock, vm string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := execProgram(ctx, ctl, lib, sock, vm, "/usr/bin/ucx_info", []string{"-d"}).CombinedOutput()
	if err != nil {
		t.Fatalf("ucx_info -d: %v\n%s", err, out)
	}
	return string(out)
}

// needUCX skips t without UCX's tools and returns the drop-in's directory
// and vrdmactl.
func needUCX(t *testing.T) (lib, ctl string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("the device view UCX needs is tested as root here (euid %d; TestExecView covers other users): run as root (CI does)", os.Geteuid())
	}
	lib = BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/ucx_info", "ucx-utils")
	NeedProgram(t, "/usr/bin/ucx_perftest", "ucx-utils")
	return lib, testenv.Binary(t, "vrdmactl")
}

// TestMiddlewareUCXInfo runs Debian's unmodified ucx_info -d (UCX 1.13)
// through vrdmactl exec: UCX must find VM vmA's adapter — the character
// device /dev/infiniband/uverbs0 of the device view, transport
// IBV_TRANSPORT_IB, a RoCE v2 GID chosen from the view's gid_attrs — and
// open its rc_verbs and ud_verbs interfaces on vrdma0:1, as root and as
// uid 65534 (a user and mount namespace).
func TestMiddlewareUCXInfo(t *testing.T) {
	lib, ctl := needUCX(t)
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vmA", testenv.VMOptions{MemMB: ucxMemMB, IPv4: []string{cmAddrA}})
	out := ucxInfo(t, ctl, lib, env.Socket, "vmA")
	tls := ucxTransports(out)
	t.Logf("transports: %v", tls)
	if !tls["rc_verbs/vrdma0:1"] {
		t.Errorf("ucx_info -d does not open rc_verbs on vrdma0:1:\n%s", out)
	}
	if !tls["ud_verbs/vrdma0:1"] {
		t.Errorf("ucx_info -d does not open ud_verbs on vrdma0:1:\n%s", out)
	}
	t.Run("user", func(t *testing.T) { ucxInfoAsNobody(t, ctl, lib, env.Socket) })
	// Without the view, UCX finds no device: the view is what it needs.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, ctl, "--socket", env.Socket, "exec", "--no-view", "--lib", lib, "--vm", "vmA", "--", "/usr/bin/ucx_info", "-d")
	c.Env = Env(lib, env.Socket, "vmA")
	if b, err := c.CombinedOutput(); err != nil || strings.Contains(string(b), "vrdma0:1") {
		t.Errorf("ucx_info -d without the view: %v; it lists vrdma0:1, or fails:\n%s", err, b)
	}
}

// ucxInfoAsNobody runs ucx_info -d as uid 65534 through vrdmactl exec (a
// user and mount namespace), in a VM that user owns: rc_verbs must open
// on vrdma0:1 there too. vrdmactl and the libraries are copied where that
// user can reach them.
func ucxInfoAsNobody(t *testing.T, ctl, lib, sock string) {
	const nobody = 65534
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(sock))
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	vmx := testenv.VMX(testenv.VMOptions{MemMB: ucxMemMB, IPv4: []string{cmAddrB}})
	if err := ag.DefineVMFor(ctx, "vmN", []byte(vmx), vrdma.Owner{UID: nobody, GID: nobody}); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/tmp", "vrdma-ucx")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, f := range []struct{ src, dst string }{
		{ctl, "vrdmactl"}, {filepath.Join(lib, "libibverbs.so.1"), "libibverbs.so.1"}, {filepath.Join(lib, "librdmacm.so.1"), "librdmacm.so.1"},
	} {
		b, err := os.ReadFile(f.src)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, f.dst), b, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// The socket's directory and its parents up to /tmp.
	for d := filepath.Dir(sock); d != "/" && d != "/tmp"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "vrdmactl"), "--socket", sock, "exec", "--lib", dir, "--vm", "vmN", "--", "/usr/bin/ucx_info", "-d")
	cmd.Env = []string{"HOME=" + dir, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	outb, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ucx_info -d as uid %d: %v\n%s", nobody, err, outb)
	}
	if !ucxTransports(string(outb))["rc_verbs/vrdma0:1"] {
		t.Errorf("ucx_info -d as uid %d does not open rc_verbs on vrdma0:1:\n%s", nobody, outb)
	}
}

// ucxFinal is ucx_perftest's result line: iterations, then typical and
// average latency or overhead (µs), then average and overall bandwidth
// (MB/s), then message rates.
var ucxFinal = regexp.MustCompile(`(?m)^Final:\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s*$`)

// ucxCase is one ucx_perftest run.
type ucxCase struct {
	name  string
	args  []string // the test's flags, both sides
	iters int
	lat   bool // a latency test: its figure is the latency column
}

// TestMiddlewareUCXPerftest runs Debian's unmodified ucx_perftest (UCX
// 1.13), server in VM vmA and client in vmB, each through vrdmactl exec,
// over memcpy (two VMs of one agent), tcp and rdma (two hosts, software
// RoCEv2 uplinks):
//
//   - on UCX's transport layer, on rc_verbs and vrdma0:1 (-x rc_verbs
//     -d vrdma0:1): active-message latency (am_lat: SENDs), put bandwidth
//     with zero copy (put_bw: RDMA WRITEs from registered memory), get
//     bandwidth (get_bw: RDMA READs) and active-message bandwidth with
//     bcopy (am_bw). Each must complete its iterations with a positive
//     figure, and on tcp and rdma the bytes cross that path;
//   - on UCP (tag_lat, tag_bw, ucp_put_bw with UCX_TLS=rc_verbs,ud_verbs:aux
//     and UCX's log naming rc_verbs as the endpoint's lane): UCP wires up
//     a worker-address endpoint on a p2p transport such as rc_verbs through
//     an auxiliary transport with asynchronous callbacks, which in UCX 1.13
//     only UD has (src/ucp/wireup/select.c, ucp_wireup_fill_aux_criteria;
//     UCX_TLS=rc_verbs,tcp fails with "no auxiliary transport"): ud_verbs
//     must open on vrdma0:1;
//   - on UCP over ud_verbs alone (UCX_TLS=ud_verbs, the same three tests,
//     UCX's log naming ud_verbs as the lane: tag matching, and for
//     ucp_put_bw remote memory access emulated over its active messages,
//     rma_am).
func TestMiddlewareUCXPerftest(t *testing.T) {
	lib, ctl := needUCX(t)
	uct := []ucxCase{
		{"am_lat", []string{"-t", "am_lat", "-s", "8"}, 1000, true},
		{"put_bw_zcopy_64k", []string{"-t", "put_bw", "-D", "zcopy", "-s", "65536"}, 500, false},
		{"get_zcopy_64k", []string{"-t", "get", "-D", "zcopy", "-s", "65536"}, 500, false},
		{"fadd", []string{"-t", "fadd", "-s", "8"}, 1000, true},
		{"am_bw_bcopy_4k", []string{"-t", "am_bw", "-D", "bcopy", "-s", "4096"}, 1000, false},
	}
	ucp := []ucxCase{
		{"tag_lat", []string{"-t", "tag_lat", "-s", "8"}, 1000, true},
		{"tag_bw_64k", []string{"-t", "tag_bw", "-s", "65536"}, 500, false},
		{"ucp_put_bw_64k", []string{"-t", "ucp_put_bw", "-s", "65536"}, 500, false},
	}
	for _, path := range []string{"memcpy", "tcp", "rdma"} {
		t.Run(path, func(t *testing.T) {
			e := startCMEnvMem(t, path, ucxMemMB)
			for _, c := range uct {
				t.Run("uct_rc_verbs_"+c.name, func(t *testing.T) {
					args := append([]string{"-x", "rc_verbs", "-d", "vrdma0:1"}, c.args...)
					runUCXCase(t, ctl, lib, e, c, args, nil)
				})
			}
			// UCP wires rc_verbs up through ud_verbs, the only auxiliary
			// transport UCX 1.13 has.
			if !ucxTransports(ucxInfo(t, ctl, lib, e.sockA, "vmA"))["ud_verbs/vrdma0:1"] {
				t.Fatal("ud_verbs does not open on vrdma0:1: UCP cannot wire rc_verbs up")
			}
			for _, tl := range []struct{ name, tls string }{
				{"rc_verbs", "rc_verbs,ud_verbs:aux"},
				{"ud_verbs", "ud_verbs"},
			} {
				for _, c := range ucp {
					t.Run("ucp_"+tl.name+"_"+c.name, func(t *testing.T) {
						srv, cli := runUCXCase(t, ctl, lib, e, c, c.args, []string{"UCX_TLS=" + tl.tls, "UCX_LOG_LEVEL=info"})
						// The lane of the test's operation: tag matching, or
						// remote memory access (emulated over active
						// messages on ud_verbs) for ucp_put_bw.
						if lane := regexp.MustCompile(`ep_cfg\[\d+\]: (tag|rma|rma_am)\(` + tl.name + `/vrdma0:1`); !lane.MatchString(cli) || !lane.MatchString(srv) {
							t.Errorf("UCX's log does not name %s on vrdma0:1 as the operation's lane:\nserver:\n%s\nclient:\n%s", tl.name, srv, cli)
						}
					})
				}
			}
		})
	}
}

// runUCXCase runs one ucx_perftest case with args on both sides and
// checks the client's result line; on tcp and rdma, that the bytes crossed
// that path.
func runUCXCase(t *testing.T, ctl, lib string, e cmEnv, c ucxCase, args, env []string) (string, string) {
	t.Helper()
	port := freePort(t)
	common := append([]string{"-p", strconv.Itoa(port)}, args...)
	before := uint64(0)
	if e.path != "memcpy" {
		before = uplinkBytesMoved(t, e.sockA, e.path, "")
	}
	srv, cli := runExecPair(t, ctl, lib, e, "/usr/bin/ucx_perftest", common,
		append(append(append([]string(nil), common...), "-n", strconv.Itoa(c.iters)), "127.0.0.1"), port, env...)
	m := ucxFinal.FindStringSubmatch(cli)
	if m == nil {
		t.Fatalf("no result line:\nserver:\n%s\nclient:\n%s", tail(srv, 40), tail(cli, 40))
	}
	if m[1] != strconv.Itoa(c.iters) {
		t.Errorf("%s iterations, want %d", m[1], c.iters)
	}
	figure, unit := m[3], "µs"
	if !c.lat {
		figure, unit = m[5], "MB/s"
	}
	if v, _ := strconv.ParseFloat(figure, 64); v <= 0 {
		t.Errorf("figure %s %s, want > 0:\n%s", figure, unit, cli)
	}
	if strings.Contains(cli+srv, "UCX  ERROR") {
		t.Errorf("UCX reports an error:\nserver:\n%s\nclient:\n%s", tail(srv, 40), tail(cli, 40))
	}
	t.Logf("%s on %s: %s %s (%s iterations)", c.name, e.path, figure, unit, m[1])
	if e.path != "memcpy" {
		if moved := uplinkBytesMoved(t, e.sockA, e.path, "") - before; moved < uint64(c.iters) {
			t.Errorf("hostA's %s uplinks moved %d bytes during the run: it did not take the %s path", e.path, moved, e.path)
		}
	}
	return srv, cli
}

// TestMiddlewareUCXSockaddr runs Debian's unmodified io_demo (UCX 1.13),
// server in vmA and client in vmB through vrdmactl exec, over memcpy, tcp
// and rdma: UCP connects by socket address, the server's listener on the
// any address and the client to vmA's adapter address and a port, through
// UCX's rdmacm connection manager on the drop-in librdmacm (an RC ID whose
// connect names a dummy UD QP made on a UD ID, rdma_init_qp_attr on the
// request's ID for its GID); 200 READs and WRITEs of 1 KiB to 64 KiB with
// io_demo's data check (-q) must complete, on rc_verbs (UCX's log), and on
// tcp and rdma the bytes cross that path.
func TestMiddlewareUCXSockaddr(t *testing.T) {
	lib, ctl := needUCX(t)
	NeedProgram(t, "/usr/bin/io_demo", "ucx-utils")
	env := []string{"UCX_TLS=rc_verbs,ud_verbs:aux", "UCX_NET_DEVICES=vrdma0:1", "UCX_LOG_LEVEL=info"}
	for _, path := range []string{"memcpy", "tcp", "rdma"} {
		t.Run(path, func(t *testing.T) {
			e := startCMEnvMem(t, path, ucxMemMB)
			port := strconv.Itoa(cmPort())
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			srv := execProgram(ctx, ctl, lib, e.sockA, "vmA", "/usr/bin/io_demo", []string{"-p", port, "-q", "-d", "1024:65536"}, env...)
			var sout testenv.SyncBuffer
			srv.Stdout, srv.Stderr = &sout, &sout
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			defer srv.Wait()
			defer srv.Process.Kill() // io_demo's server runs until stopped
			before := uint64(0)
			if path != "memcpy" {
				before = uplinkBytesMoved(t, e.sockA, path, "")
			}
			// -c/-y: the client retries its connect while the server
			// starts (nothing tells from outside when it listens).
			out, err := execProgram(ctx, ctl, lib, e.sockB, "vmB", "/usr/bin/io_demo",
				[]string{"-p", port, "-q", "-i", "200", "-o", "read,write", "-d", "1024:65536", "-c", "100", "-y", "0.2", cmAddrA}, env...).CombinedOutput()
			cli := string(out)
			if err != nil || !strings.Contains(cli, "Client exit with status 'OK'") {
				t.Fatalf("client: %v\nclient:\n%s\nserver:\n%s", err, tail(cli, 40), tail(sout.String(), 40))
			}
			// Each report counts the operations since the last: they
			// add up to the 200 asked for, READs and WRITEs among them.
			total, reads, writes := 0, 0, 0
			for _, m := range regexp.MustCompile(`total min:\d+ max:\d+ total:(\d+) \| read [\d.]+ MBs min:\d+\S* max:\d+ total:(\d+) \| write [\d.]+ MBs min:\d+\S* max:\d+ total:(\d+)`).FindAllStringSubmatch(cli, -1) {
				n, r, w := atoiOr0(m[1]), atoiOr0(m[2]), atoiOr0(m[3])
				total, reads, writes = total+n, reads+r, writes+w
			}
			if total != 200 || reads == 0 || writes == 0 {
				t.Errorf("the client's reports add up to %d operations (%d READs, %d WRITEs), want 200 of both kinds:\n%s", total, reads, writes, tail(cli, 20))
			}
			if !regexp.MustCompile(`ep_cfg\[\d+\]: tag\(rc_verbs/vrdma0:1`).MatchString(cli) {
				t.Errorf("UCX's log does not name rc_verbs on vrdma0:1 as the tag lane:\n%s", tail(cli, 40))
			}
			// (The server's UCX logs an ERROR for the QP_FATAL event its
			// QP gets when the client's workload ends: vrdma moves a QP
			// whose peer went away to ERR, docs/wire-local.md §4.13.)
			errs := regexp.MustCompile(`(?m)^.*IB Async event on vrdma0: local work queue catastrophic error.*$`).ReplaceAllString(cli+sout.String(), "")
			if regexp.MustCompile(`(?i)data (check|integrity).*fail|UCX  ERROR`).MatchString(errs) {
				t.Errorf("io_demo reports an error:\nclient:\n%s\nserver:\n%s", tail(cli, 40), tail(sout.String(), 40))
			}
			if path != "memcpy" {
				if moved := uplinkBytesMoved(t, e.sockA, path, "") - before; moved < 200*1024 {
					t.Errorf("hostA's %s uplinks moved %d bytes: the run did not take the %s path", path, moved, path)
				}
			}
		})
	}
}

// atoiOr0 is s as a number, 0 when it is not one.
func atoiOr0(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
