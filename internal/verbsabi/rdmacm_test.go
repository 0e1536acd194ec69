// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/testenv"
)

// The adapters' addresses in the rdma_cm tests: vmA's is the server's.
const (
	cmAddrA = "10.77.0.1"
	cmAddrB = "10.77.0.2"
)

// BuildRDMACM is Build, and skips tb unless the drop-in librdmacm.so.1
// was built too (it needs librdmacm-dev).
func BuildRDMACM(tb testing.TB) string {
	tb.Helper()
	lib := Build(tb)
	if _, err := os.Stat(filepath.Join(lib, "librdmacm.so.1")); err != nil {
		tb.Skip("the drop-in librdmacm.so.1 was not built: install librdmacm-dev (apt-get install -y librdmacm-dev)")
	}
	return lib
}

// cmPort returns a service port for one rdma_cm test run: the agent's
// ports are its own, not the host's, so any will do, but runs of one test
// binary must not meet.
func cmPort() int { return 20000 + rand.IntN(20000) }

// cmSide is one program of an rdma_cm pair.
type cmSide struct {
	socket, vm string
	prog       string
	args       []string
}

// cmOutput is what one program of a pair wrote.
type cmOutput struct{ stdout, stderr string }

func (o cmOutput) String() string { return o.stdout + o.stderr }

// runCMPair starts srv, then runs cli, and returns both outputs; it fails
// t unless both exit 0. Nothing tells from outside when an rdma_cm server
// listens: a client that came too early (the agent rejects it for want of
// a listener, REJECTED with reason 8) is run again with a new server, as
// the early client may have connected after all (perftest's client
// retries its connect, and leaves when the first try was rejected): a
// server that accepted it serves a peer that is gone. Each new server gets
// a longer head start (100 ms more each time, at most 2 s).
//
// A pair that hangs until its deadline (both programs waiting on each
// other: seen twice, rarely, with ib_send_lat -R over tcp on a loaded
// machine, maybe the early client above) is logged and run once more; a
// second hang fails t.
func runCMPair(t *testing.T, lib string, srv, cli cmSide) (cmOutput, cmOutput) {
	t.Helper()
	d := 60 * time.Second
	for attempt, hangs := 0, 0; ; attempt++ {
		lead := min(time.Duration(attempt)*100*time.Millisecond, 2*time.Second)
		so, co, hung, early, err := runCMPairOnce(t, lib, srv, cli, d, lead)
		switch {
		case early && attempt < 50:
			continue
		case hung && hangs == 0:
			t.Logf("the pair hung for %v (%v); running it once more\nserver:\n%s\nclient:\n%s", d, err, so, co)
			hangs, d = 1, 90*time.Second
			continue
		case err != nil:
			t.Fatalf("%v\nserver:\n%s\nclient:\n%s", err, so, co)
		}
		return so, co
	}
}

// runCMPairOnce is one run of runCMPair, within d, the client started
// lead after the server: the outputs, whether it hung (d passed with a
// program still running), whether the client came before the server
// listened (the server is then stopped), and what failed.
func runCMPairOnce(t *testing.T, lib string, srv, cli cmSide, d, lead time.Duration) (_, _ cmOutput, hung, early bool, _ error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	s := exec.CommandContext(ctx, srv.prog, srv.args...)
	s.Env = Env(lib, srv.socket, srv.vm)
	var sout, serr strings.Builder
	s.Stdout, s.Stderr = &sout, &serr
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- s.Wait() }()
	select {
	case err := <-srvDone:
		return cmOutput{sout.String(), serr.String()}, cmOutput{}, false, false, fmt.Errorf("server exited before the client started: %v", err)
	case <-time.After(lead):
	}
	c := exec.CommandContext(ctx, cli.prog, cli.args...)
	c.Env = Env(lib, cli.socket, cli.vm)
	var cout, cerr strings.Builder
	c.Stdout, c.Stderr = &cout, &cerr
	cliErr := c.Run()
	co := cmOutput{cout.String(), cerr.String()}
	if cliErr != nil && noListener(co.String()) {
		s.Process.Kill()
		<-srvDone
		return cmOutput{sout.String(), serr.String()}, co, false, true, cliErr
	}
	var srvErr error
	select {
	case srvErr = <-srvDone:
	case <-time.After(30 * time.Second):
		s.Process.Kill()
		srvErr = fmt.Errorf("server still running 30 s after the client ended: %v", <-srvDone)
	}
	so := cmOutput{sout.String(), serr.String()}
	if cliErr != nil || srvErr != nil {
		return so, co, ctx.Err() != nil, false, fmt.Errorf("client: %v, server: %v", cliErr, srvErr)
	}
	return so, co, false, false, nil
}

// noListener reports whether a client's output says the server was not
// there yet, however the program words it: its address not yet anyone's
// (ADDR_ERROR, or UNREACHABLE when it went between resolve and connect),
// or nothing listening on the port (REJECTED with IBTA reason 8). perftest
// prints the event's number ("Unexpected CM event bl blka 8") or gives up
// resolving ("Received 10 times ADDR_ERROR"), programs
// on synchronous IDs their errno (EHOSTUNREACH, ECONNREFUSED; ETIMEDOUT
// when the server's VM is not attached yet: its address resolves but
// nothing answers, UNREACHABLE with ETIMEDOUT as from a machine that is
// off, which the agent says at once); perftest without -R, whose TCP
// connect to the server's address found no listener yet, "Couldn't
// connect to ADDR:PORT".
var noListenerRE = regexp.MustCompile(`(?i)RDMA_CM_EVENT_(REJECTED|UNREACHABLE|ADDR_ERROR)|times ADDR_ERROR|Unexpected CM event bl blka [178]\b|ECONNREFUSED|Connection refused|Connection timed out|No route to host|Couldn't connect to [0-9.]+:[0-9]+`)

func noListener(out string) bool { return noListenerRE.MatchString(out) }

// cmEnv is two VMs with addresses, on one agent (memcpy) or on two hosts
// of a cluster (tcp; rdma: with software RoCEv2 uplinks on their loopback
// addresses).
type cmEnv struct {
	path         string
	sockA, sockB string
}

// carried fails t unless hostA's uplinks of e's path (tcp: its links to
// hostB; rdma: its RoCEv2 engine) moved at least min bytes since the
// environment started: the run took that path, not another.
func (e cmEnv) carried(t *testing.T, min uint64) {
	t.Helper()
	if e.path == "memcpy" {
		return
	}
	if moved := uplinkBytesMoved(t, e.sockA, e.path, ""); moved < min {
		t.Errorf("hostA's %s uplinks moved %d bytes, want at least %d: the run did not take the %s path", e.path, moved, min, e.path)
	}
}

// uplinkBytesMoved returns the bytes the agent at sock's uplinks of path
// (tcp: its links to host peer, or to every host when ""; rdma: its RoCEv2
// engines) carried, both ways.
func uplinkBytesMoved(t *testing.T, sock, path, peer string) uint64 {
	t.Helper()
	st := agentStatus(t, sock)
	var moved uint64
	if path == "tcp" {
		for _, u := range st.Uplinks {
			if peer == "" || u.PeerHost == peer {
				moved += u.BytesOut + u.BytesIn
			}
		}
	} else {
		for _, r := range st.RDMA {
			moved += r.BytesOut + r.BytesIn
		}
	}
	return moved
}

// agentStatus returns the status report of the agent at sock.
func agentStatus(t *testing.T, sock string) vrdma.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(sock))
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()
	st, err := ag.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func startCMEnv(t *testing.T, path string) cmEnv {
	t.Helper()
	return startCMEnvMem(t, path, 32)
}

// startCMEnvMem is startCMEnv with VMs of memMB MiB of guest memory.
func startCMEnvMem(t *testing.T, path string, memMB int) cmEnv {
	t.Helper()
	optsA := testenv.VMOptions{MemMB: memMB, IPv4: []string{cmAddrA}}
	optsB := testenv.VMOptions{MemMB: memMB, IPv4: []string{cmAddrB}}
	switch path {
	case "memcpy":
		env := testenv.StartProcess(t, testenv.ProcessOptions{})
		env.Define(t, "vmA", optsA)
		env.Define(t, "vmB", optsB)
		return cmEnv{path, env.Socket, env.Socket}
	case "tcp", "rdma":
		c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff, RDMA: path == "rdma"})
		c.Hosts[0].Define(t, "vmA", optsA)
		c.Hosts[1].Define(t, "vmB", optsB)
		return cmEnv{path, c.Hosts[0].Socket, c.Hosts[1].Socket}
	}
	t.Fatalf("no path %q", path)
	return cmEnv{}
}

var pingData = regexp.MustCompile(`(?m)^(?:server )?ping data: rdma-ping-(\d+): (\S+)$`)

// TestRDMACMRping runs Debian's unmodified rping, server and client, with
// verbose output and data validation (-v -V -C 100), connecting by the
// server adapter's IP address through the drop-in librdmacm.so.1, over
// memcpy, tcp and rdma, and with -q (QPs rping makes and moves itself)
// over memcpy and tcp: every one of the 100 pings must be printed by both
// sides with rping's rotating pattern, and neither side report an error.
func TestRDMACMRping(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/rping", "rdmacm-utils")
	for _, tc := range []struct{ name, path, flag string }{
		{"memcpy", "memcpy", ""}, {"tcp", "tcp", ""}, {"rdma", "rdma", ""},
		// -q: QPs rping makes with ibv_create_qp and moves itself
		// (rdma_init_qp_attr, rdma_establish).
		{"memcpy-q", "memcpy", "-q"}, {"tcp-q", "tcp", "-q"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			e := startCMEnv(t, path)
			port := fmt.Sprint(cmPort())
			args := func(side string) []string {
				a := []string{side, "-a", cmAddrA, "-p", port, "-v", "-V", "-C", "100"}
				if tc.flag != "" {
					a = append(a, tc.flag)
				}
				return a
			}
			srv, cli := runCMPair(t, lib,
				cmSide{e.sockA, "vmA", "/usr/bin/rping", args("-s")},
				cmSide{e.sockB, "vmB", "/usr/bin/rping", args("-c")})
			t.Logf("server:\n%s\nclient:\n%s", tail(srv.String(), 5), tail(cli.String(), 5))
			for side, out := range map[string]cmOutput{"server": srv, "client": cli} {
				// rping's server ends every run waiting for a ping that
				// does not come: "wait for RDMA_READ_ADV state 10"
				// (DISCONNECTED) is its normal last word.
				errs := strings.ReplaceAll(out.String(), "wait for RDMA_READ_ADV state 10", "")
				if regexp.MustCompile(`(?i)error|fail|invalid|wait for|unhandled`).MatchString(errs) {
					t.Errorf("%s reports an error:\n%s", side, out)
				}
				m := pingData.FindAllStringSubmatch(out.stdout, -1)
				if len(m) != 100 {
					t.Errorf("%s printed %d pings, want 100:\n%s", side, len(m), tail(out.stdout, 10))
					continue
				}
				for i, p := range m {
					if p[1] != fmt.Sprint(i) || !rpingPattern(i, p[2]) {
						t.Errorf("%s: ping %d is %q %q, not rping's pattern", side, i, p[1], p[2])
						break
					}
				}
			}
			e.carried(t, 100*64)
		})
	}
}

// TestRDMACMPairEarlyClient has rping's server start listening 300 ms
// late, so that its client comes first and is refused (REJECTED, reason
// 8): runCMPair starts the pair again with a new server and a longer head
// start until the client finds it, and the pings then all go through.
func TestRDMACMPairEarlyClient(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/rping", "rdmacm-utils")
	e := startCMEnv(t, "memcpy")
	port := fmt.Sprint(cmPort())
	srv, cli := runCMPair(t, lib,
		cmSide{e.sockA, "vmA", "/bin/sh", []string{"-c", `sleep 0.3; exec /usr/bin/rping "$@"`, "rping",
			"-s", "-a", cmAddrA, "-p", port, "-v", "-C", "10"}},
		cmSide{e.sockB, "vmB", "/usr/bin/rping", []string{"-c", "-a", cmAddrA, "-p", port, "-v", "-C", "10"}})
	for side, out := range map[string]cmOutput{"server": srv, "client": cli} {
		if n := len(pingData.FindAllString(out.stdout, -1)); n != 10 {
			t.Errorf("%s printed %d pings, want 10:\n%s", side, n, out)
		}
	}
}

// rpingPattern reports whether s is rping's data for ping i: consecutive
// characters from 'A'+i%58, wrapping from 'z' back to 'A', as rping writes
// them.
func rpingPattern(i int, s string) bool {
	if len(s) == 0 {
		return false
	}
	c := 65 + i%58
	for j := 0; j < len(s); j++ {
		if int(s[j]) != c {
			return false
		}
		c++
		if c > 122 {
			c = 65
		}
	}
	return true
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestRDMACMPerftest runs perftest's ib_write_bw and ib_send_lat with
// -R (connecting through rdma_cm by the server adapter's address),
// unmodified, over memcpy, tcp and rdma; each run's result line must give
// the size and iterations asked for and a positive figure.
func TestRDMACMPerftest(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/ib_write_bw", "perftest")
	for _, path := range []string{"memcpy", "tcp", "rdma"} {
		t.Run(path, func(t *testing.T) {
			e := startCMEnv(t, path)
			for _, c := range []perftestCase{{"ib_write_bw", 65536, 500, false}, {"ib_send_lat", 2, 500, true}} {
				t.Run(c.prog, func(t *testing.T) {
					port := fmt.Sprint(cmPort())
					args := []string{"-R", "-d", "vrdma0", "-p", port, "-n", fmt.Sprint(c.iters), "-s", fmt.Sprint(c.size)}
					srv, cli := runCMPair(t, lib,
						cmSide{e.sockA, "vmA", "/usr/bin/" + c.prog, args},
						cmSide{e.sockB, "vmB", "/usr/bin/" + c.prog, append(args, cmAddrA)})
					t.Logf("client:\n%s", cli)
					checkPerftest(t, c, srv.String(), cli.String())
				})
			}
			e.carried(t, 500*65536)
		})
	}
}

// TestRDMACMRdmaServerClient runs rdmacm-utils' rdma_server and
// rdma_client, unmodified: synchronous IDs made with rdma_create_ep, a
// send and a receive each way with rdma_verbs.h's helpers, over memcpy and
// over tcp. Both must end with status 0.
func TestRDMACMRdmaServerClient(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/rdma_server", "rdmacm-utils")
	for _, path := range []string{"memcpy", "tcp"} {
		t.Run(path, func(t *testing.T) {
			e := startCMEnv(t, path)
			port := fmt.Sprint(cmPort())
			srv, cli := runCMPair(t, lib,
				cmSide{e.sockA, "vmA", "/usr/bin/rdma_server", []string{"-s", cmAddrA, "-p", port}},
				cmSide{e.sockB, "vmB", "/usr/bin/rdma_client", []string{"-s", cmAddrA, "-p", port}})
			t.Logf("server:\n%s\nclient:\n%s", srv, cli)
			if !strings.Contains(srv.stdout, "rdma_server: end 0") {
				t.Errorf("rdma_server did not end with 0:\n%s", srv)
			}
			if !strings.Contains(cli.stdout, "rdma_client: end 0") {
				t.Errorf("rdma_client did not end with 0:\n%s", cli)
			}
		})
	}
}

// TestRDMACMUcmatose runs rdmacm-utils' ucmatose (cmatose), unmodified,
// with several connections on one event channel, each sending and
// receiving messages, over memcpy and over tcp: both sides must complete
// the transfers, the server its disconnects, and both return status 0.
func TestRDMACMUcmatose(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/ucmatose", "rdmacm-utils")
	for _, path := range []string{"memcpy", "tcp"} {
		t.Run(path, func(t *testing.T) {
			e := startCMEnv(t, path)
			port := fmt.Sprint(cmPort())
			args := []string{"-c", "4", "-C", "20", "-S", "1000", "-p", port}
			srv, cli := runCMPair(t, lib,
				cmSide{e.sockA, "vmA", "/usr/bin/ucmatose", append([]string{"-b", cmAddrA}, args...)},
				cmSide{e.sockB, "vmB", "/usr/bin/ucmatose", append([]string{"-s", cmAddrA}, args...)})
			t.Logf("server:\n%s\nclient:\n%s", srv, cli)
			for side, out := range map[string]cmOutput{"server": srv, "client": cli} {
				wants := []string{"data transfers complete", "test complete", "return status 0"}
				if side == "server" {
					wants = append(wants, "disconnected") // the server disconnects all four
				}
				for _, want := range wants {
					if !strings.Contains(out.String(), want) {
						t.Errorf("%s: no %q:\n%s", side, want, out)
					}
				}
				if regexp.MustCompile(`(?i)error|fail|unexpected`).MatchString(out.String()) {
					t.Errorf("%s reports an error:\n%s", side, out)
				}
			}
		})
	}
}

// TestRDMACMUdaddy runs rdmacm-utils' udaddy, unmodified, over memcpy, tcp
// and rdma: UD IDs (RDMA_PS_UDP) whose connect is a service ID resolution.
// The client's rdma_create_qp makes a UD QP in RTS with rdma_cm's Q_Key,
// its rdma_connect reaches the server's UD listener (on its fixed port
// 7174, a port of the UDP space), the server accepts with its UD QP, and
// the client's ESTABLISHED carries that QP's number, Q_Key and address
// handle attributes (event->param.ud). Then each of three clients' QPs
// sends ten datagrams with immediate data to the server, which answers
// each on an address handle made from the first completion's GRH
// (ibv_create_ah_from_wc); both sides must complete every transfer and
// return status 0.
func TestRDMACMUdaddy(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/udaddy", "rdmacm-utils")
	for _, path := range []string{"memcpy", "tcp", "rdma"} {
		t.Run(path, func(t *testing.T) {
			e := startCMEnv(t, path)
			args := []string{"-c", "3", "-C", "10", "-S", "200"}
			before := uint64(0)
			if path != "memcpy" {
				before = uplinkBytesMoved(t, e.sockA, path, "")
			}
			srv, cli := runCMPair(t, lib,
				cmSide{e.sockA, "vmA", "/usr/bin/udaddy", append([]string{"-b", cmAddrA}, args...)},
				cmSide{e.sockB, "vmB", "/usr/bin/udaddy", append([]string{"-s", cmAddrA}, args...)})
			t.Logf("server:\n%s\nclient:\n%s", srv, cli)
			for side, out := range map[string]cmOutput{"server": srv, "client": cli} {
				for _, want := range []string{"data transfers complete", "test complete", "return status 0"} {
					if !strings.Contains(out.String(), want) {
						t.Errorf("%s: no %q:\n%s", side, want, out)
					}
				}
				if regexp.MustCompile(`(?i)error|fail|unexpected`).MatchString(out.String()) {
					t.Errorf("%s reports an error:\n%s", side, out)
				}
			}
			if path != "memcpy" {
				// 3 × 10 datagrams of 200 bytes each way.
				if moved := uplinkBytesMoved(t, e.sockA, path, "") - before; moved < 2*3*10*200 {
					t.Errorf("hostA's %s uplinks moved %d bytes: the datagrams did not take the %s path", path, moved, path)
				}
			}
		})
	}
}

// TestRDMACMEvents runs guest/rdmacm/tests/cm_check.c against the drop-in
// librdmacm: a listener on 0.0.0.0 and dialers of one event channel, by
// the VM's own address. Binding an address no adapter has is
// EADDRNOTAVAIL, resolving it ADDR_ERROR; private data of 57 (connect),
// 149 (reject) and 197 (accept) bytes is EINVAL, of 56, 148 and 196 bytes
// arrives intact in CONNECT_REQUEST, REJECTED (reason 28) and the dialer's
// ESTABLISHED; a disconnect gives both sides DISCONNECTED then
// TIMEWAIT_EXIT and moves the QPs to ERR; a port nobody listens on is
// REJECTED with reason 8; an empty non-blocking channel is EAGAIN.
func TestRDMACMEvents(t *testing.T) {
	lib := BuildRDMACM(t)
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vmA", testenv.VMOptions{MemMB: 8, IPv4: []string{cmAddrA}})
	out, _ := runCSource(t, lib, env.Socket, "vmA", filepath.Join(SourceDir(), "..", "rdmacm", "tests", "cm_check.c"),
		[]string{"librdmacm.so.1", "libibverbs.so.1"}, cmAddrA, fmt.Sprint(cmPort()))
	if n := strings.Count(out, "ok "); n < 40 {
		t.Errorf("only %d checks ran", n)
	}
}

// TestRDMACMUDIDs runs guest/rdmacm/tests/ud_check.c against the drop-in
// librdmacm, a UD listener and dialer of one event channel by the VM's own
// address: rdma_create_qp on a UD ID refuses an RC QP (EINVAL) and brings
// a UD QP to RTS with Q_Key RDMA_UDP_QKEY, as rdma_init_qp_attr says; a
// UDP and a TCP listener share a port; private data of 181 (connect) and
// 137 (accept) bytes is EINVAL, of 180 and 136 bytes arrives intact in
// CONNECT_REQUEST and the dialer's ESTABLISHED, whose param.ud names the
// acceptor's QP, its Q_Key and a GRH to it; the acceptor gets no event; a
// datagram goes each way (the reply on an address handle from the
// completion); and a UD connect to a port with only a TCP listener is
// REJECTED with reason 8.
func TestRDMACMUDIDs(t *testing.T) {
	lib := BuildRDMACM(t)
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vmA", testenv.VMOptions{MemMB: 8, IPv4: []string{cmAddrA}})
	out, _ := runCSource(t, lib, env.Socket, "vmA", filepath.Join(SourceDir(), "..", "rdmacm", "tests", "ud_check.c"),
		[]string{"librdmacm.so.1", "libibverbs.so.1"}, cmAddrA, fmt.Sprint(cmPort()))
	if n := strings.Count(out, "ok "); n < 30 {
		t.Errorf("only %d checks ran:\n%s", n, out)
	}
}

// TestRDMACMExternalQP runs guest/rdmacm/tests/ext_qp.c, server and client:
// QPs the programs make with ibv_create_qp and move themselves, named by
// number in conn_param (UCX's rdmacm transport, rdma-core's
// test_rdmacm_async_traffic_external_qp). The dialer gets CONNECT_RESPONSE
// with its QP still in RESET, both move their QPs with rdma_init_qp_attr,
// rdma_establish gives the acceptor ESTABLISHED, messages go both ways
// intact, and a disconnect leaves the programs' QPs alone; over memcpy,
// tcp and rdma, and with an acceptor whose QP rdma_create_qp made (the
// agent moves that one: "mixed").
func TestRDMACMExternalQP(t *testing.T) {
	lib := BuildRDMACM(t)
	bin := compileC(t, lib, filepath.Join(SourceDir(), "..", "rdmacm", "tests", "ext_qp.c"), []string{"librdmacm.so.1", "libibverbs.so.1"})
	for _, tc := range []struct{ name, path, mode string }{
		{"memcpy", "memcpy", ""}, {"tcp", "tcp", ""}, {"rdma", "rdma", ""},
		{"memcpy-mixed", "memcpy", "managed"}, {"tcp-mixed", "tcp", "managed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startCMEnv(t, tc.path)
			port := fmt.Sprint(cmPort())
			srvArgs := []string{"server", cmAddrA, port}
			if tc.mode != "" {
				srvArgs = append(srvArgs, tc.mode)
			}
			so, co := runCMPair(t, lib, cmSide{e.sockA, "vmA", bin, srvArgs}, cmSide{e.sockB, "vmB", bin, []string{"client", cmAddrA, port}})
			for _, o := range []cmOutput{so, co} {
				if strings.Contains(o.stdout, "FAIL") {
					t.Errorf("%s", o)
				}
			}
			if !strings.Contains(co.stdout, "ok client exchanged every message") || !strings.Contains(so.stdout, "ok server exchanged every message") {
				t.Errorf("the messages did not all go through:\nserver:\n%s\nclient:\n%s", so, co)
			}
			e.carried(t, 20*64)
		})
	}
}

// TestRDMACMCrossPortGroup dials, with unmodified rping, an adapter of a
// port group with another VLAN (vmA on hostA, on the cluster's port group;
// vmC on hostB, on VLAN 20): rdma_cm's ADDR_ERROR reaches the program, and
// hostB's log names the rule that refused it (isolation by VLAN), while
// vmB, on vmA's port group on the same hostB, connects.
func TestRDMACMCrossPortGroup(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/rping", "rdmacm-utils")
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff})
	pg := records.PortGroup{Name: "other-vlan", Key: "dvportgroup-20", Switch: c.Switch.Name, VLAN: 20,
		PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Store().Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
		t.Fatal(err)
	}
	a, b := c.Hosts[0], c.Hosts[1]
	a.Define(t, "vmA", testenv.VMOptions{MemMB: 16, IPv4: []string{cmAddrA}})
	b.Define(t, "vmB", testenv.VMOptions{MemMB: 16, IPv4: []string{cmAddrB}})
	b.DefineVMX(t, "vmC", testenv.VMXOn(testenv.VMOptions{MemMB: 16, IPv4: []string{"10.77.0.3"}}, c.Switch.UUID, pg.Key))
	port := fmt.Sprint(cmPort())
	ctxp, cancelp := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancelp()
	srv := exec.CommandContext(ctxp, "/usr/bin/rping", "-s", "-a", cmAddrA, "-p", port, "-C", "1")
	srv.Env = Env(lib, a.Socket, "vmA")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()

	// Until rping's server has attached vmA, the refusal is that
	// 10.77.0.1 is nobody's yet: dial again until hostB names a rule.
	vlanRule := regexp.MustCompile(`rdma_cm address resolution refused.*vm=vmC.*remote=` + regexp.QuoteMeta(cmAddrA) + `.*VLAN`)
	var outC, errC, log string
	for i := 0; i < 50; i++ {
		outC, errC, _ = run(t, lib, b.Socket, "vmC", "/usr/bin/rping", "-c", "-a", cmAddrA, "-p", port, "-C", "1")
		if log = b.Stderr(); vlanRule.MatchString(log) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(outC+errC, "RDMA_CM_EVENT_ADDR_ERROR") {
		t.Errorf("vmC, on VLAN 20, dialing vmA's %s: no ADDR_ERROR:\n%s%s", cmAddrA, outC, errC)
	}
	t.Logf("vmC:\n%s%s", outC, errC)
	if !vlanRule.MatchString(log) {
		t.Errorf("hostB's log does not name the VLAN rule for vmC's resolution:\n%s", log)
	}
	// vmB, on vmA's port group, reaches the same server.
	var outB string
	for i := 0; i < 50; i++ {
		o, e, err := run(t, lib, b.Socket, "vmB", "/usr/bin/rping", "-c", "-a", cmAddrA, "-p", port, "-C", "1", "-v")
		outB = o + e
		if err == nil || !noListener(outB) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(outB, "ping data: rdma-ping-0") {
		t.Errorf("vmB, on vmA's port group, did not ping it:\n%s", outB)
	}
}
