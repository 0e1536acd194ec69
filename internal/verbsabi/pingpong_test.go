// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// freePort returns a TCP port that nothing holds on any address now, for a
// program's out-of-band exchange (ibv_rc_pingpong and perftest bind the
// wildcard address). It is drawn below the kernel's ephemeral range
// (32768-60999 on Debian), which agents and the other test packages take
// ports from with bind(0) at any moment, and checked on the wildcard
// address: a port free on 127.0.0.1 alone may be an agent's on 127.x.y.z.
func freePort(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 10000 + rand.IntN(22000)
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	t.Fatal("no free TCP port below the ephemeral range in 100 tries")
	return 0
}

// listening reports whether a TCP socket listens on port (from
// /proc/net/tcp and tcp6, so that nothing connects to the server early:
// ibv_rc_pingpong's server takes the first connection as its peer).
func listening(port int) bool {
	want := fmt.Sprintf(":%04X ", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			fs := strings.Fields(l)
			if len(fs) > 3 && strings.HasSuffix(fs[1], want[:len(want)-1]) && fs[3] == "0A" {
				return true
			}
		}
	}
	return false
}

var (
	bytesLine = regexp.MustCompile(`(?m)^(\d+) bytes in [\d.]+ seconds = [\d.]+ Mbit/sec$`)
	itersLine = regexp.MustCompile(`(?m)^(\d+) iters in [\d.]+ seconds = [\d.]+ usec/iter$`)
	gidLine   = regexp.MustCompile(`(?m)^\s+local address:\s+LID 0x0000, QPN 0x[0-9a-f]+, PSN 0x[0-9a-f]+, GID (\S+)$`)
)

// TestVerbsABIRCPingpong runs Debian's unmodified ibv_rc_pingpong, server
// and client, as workloads of two VMs of one agent (the memcpy path), with
// its buffer check (-c): busy-polling, with completion events (-e), with
// messages small enough to go inline (-s 64), of 1 MiB, and with the
// ibv_wr_* send API (-N). Each side must report
// the bytes and iterations asked for, no invalid data, and nothing on
// stderr.
func TestVerbsABIRCPingpong(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_rc_pingpong", "ibverbs-utils")
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vmA", testenv.VMOptions{MemMB: 8})
	env.Define(t, "vmB", testenv.VMOptions{MemMB: 8})
	for _, c := range []struct {
		name string
		args []string
		size int
		n    int
	}{
		{"poll", nil, 4096, 1000},
		{"events", []string{"-e"}, 4096, 1000},
		{"inline", []string{"-s", "64"}, 64, 500},
		{"large", []string{"-s", "1048576", "-r", "16"}, 1048576, 50},
		{"new-send-api", []string{"-N"}, 4096, 1000}, // ibv_create_qp_ex, ibv_wr_send/ibv_wr_set_sge
	} {
		t.Run(c.name, func(t *testing.T) {
			port := freePort(t)
			args := append([]string{"-g", "0", "-c", "-d", "vrdma0", "-p", fmt.Sprint(port), "-n", fmt.Sprint(c.n)}, c.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			srv := exec.CommandContext(ctx, "/usr/bin/ibv_rc_pingpong", args...)
			srv.Env = Env(lib, env.Socket, "vmA")
			var sout, serr strings.Builder
			srv.Stdout, srv.Stderr = &sout, &serr
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			srvDone := make(chan error, 1)
			go func() { srvDone <- srv.Wait() }()
			deadline := time.Now().Add(20 * time.Second)
			for !listening(port) {
				select {
				case err := <-srvDone:
					t.Fatalf("server exited before listening: %v\n%s%s", err, sout.String(), serr.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("server does not listen on %d", port)
				}
				time.Sleep(10 * time.Millisecond)
			}
			cli := exec.CommandContext(ctx, "/usr/bin/ibv_rc_pingpong", append(args, "127.0.0.1")...)
			cli.Env = Env(lib, env.Socket, "vmB")
			var cout, cerr strings.Builder
			cli.Stdout, cli.Stderr = &cout, &cerr
			cliErr := cli.Run()
			srvErr := <-srvDone
			t.Logf("server:\n%s%s\nclient:\n%s%s", sout.String(), serr.String(), cout.String(), cerr.String())
			if cliErr != nil || srvErr != nil {
				t.Fatalf("client: %v, server: %v", cliErr, srvErr)
			}
			var gids []string
			for side, out := range map[string]string{"server": sout.String() + serr.String(), "client": cout.String() + cerr.String()} {
				if strings.Contains(out, "invalid data") || strings.Contains(out, "Failed") || strings.Contains(out, "Couldn't") {
					t.Errorf("%s reports an error:\n%s", side, out)
				}
				m := bytesLine.FindStringSubmatch(out)
				if m == nil || m[1] != fmt.Sprint(2*c.size*c.n) {
					t.Errorf("%s: bytes line %q, want %d bytes", side, m, 2*c.size*c.n)
				}
				if m := itersLine.FindStringSubmatch(out); m == nil || m[1] != fmt.Sprint(c.n) {
					t.Errorf("%s: iters line %q, want %d", side, m, c.n)
				}
				if m := gidLine.FindStringSubmatch(out); m == nil || !strings.HasPrefix(m[1], "fe80::") {
					t.Errorf("%s: no local GID line", side)
				} else {
					gids = append(gids, m[1])
				}
			}
			if serr.String() != "" || cerr.String() != "" {
				t.Errorf("stderr: server %q, client %q", serr.String(), cerr.String())
			}
			if len(gids) == 2 && gids[0] == gids[1] {
				t.Errorf("both sides have GID %s", gids[0])
			}
		})
	}
}

// runPair runs prog as a server in VM vmA (on the agent at sockA) and as
// a client in vmB (at sockB), with the server's address last, and returns
// both outputs (stdout and stderr together); it fails t if either side
// fails.
func runPair(t *testing.T, lib, sockA, sockB, prog string, args []string, port int) (string, string) {
	t.Helper()
	return runPairIn(t, lib, sockA, "vmA", sockB, "vmB", prog, args, port)
}

// runPairIn is runPair with the server in VM vmA and the client in vmB.
func runPairIn(t *testing.T, lib, sockA, vmA, sockB, vmB, prog string, args []string, port int) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, prog, args...)
	srv.Env = Env(lib, sockA, vmA)
	var sout strings.Builder
	srv.Stdout, srv.Stderr = &sout, &sout
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for !listening(port) {
		select {
		case err := <-srvDone:
			t.Fatalf("server exited before listening: %v\n%s", err, sout.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server does not listen on %d", port)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cli := exec.CommandContext(ctx, prog, append(args, "127.0.0.1")...)
	cli.Env = Env(lib, sockB, vmB)
	out, cliErr := cli.CombinedOutput()
	srvErr := <-srvDone
	if cliErr != nil || srvErr != nil {
		t.Fatalf("client: %v, server: %v\nserver:\n%s\nclient:\n%s", cliErr, srvErr, sout.String(), out)
	}
	return sout.String(), string(out)
}

// perftestCase is one perftest run: its program, message size and
// iterations, and whether it is a latency test.
type perftestCase struct {
	prog  string
	size  int
	iters int
	lat   bool
}

var perftestRC = []perftestCase{
	{"ib_write_bw", 65536, 500, false},
	{"ib_write_lat", 2, 500, true},
	{"ib_read_bw", 65536, 500, false},
	{"ib_read_lat", 2, 500, true},
	{"ib_send_bw", 65536, 500, false},
	{"ib_send_lat", 2, 500, true},
	{"ib_atomic_bw", 8, 500, false},
	{"ib_atomic_lat", 8, 500, true},
}

// runPerftest runs each case, server in vmA (at sockA), client in vmB (at
// sockB): both sides that print results must report the message size and
// iterations asked for and a positive figure, and no side an error line.
func runPerftest(t *testing.T, lib, sockA, sockB string, cases []perftestCase) {
	for _, c := range cases {
		t.Run(c.prog, func(t *testing.T) {
			prog := "/usr/bin/" + c.prog
			NeedProgram(t, prog, "perftest")
			port := freePort(t)
			args := []string{"-d", "vrdma0", "-x", "0", "-p", fmt.Sprint(port), "-n", fmt.Sprint(c.iters), "-s", fmt.Sprint(c.size)}
			if c.prog == "ib_atomic_bw" || c.prog == "ib_atomic_lat" {
				args = args[:len(args)-2] // atomics are 8 bytes; -s is refused
			}
			srv, cli := runPair(t, lib, sockA, sockB, prog, args, port)
			t.Logf("client:\n%s", cli)
			checkPerftest(t, c, srv, cli)
		})
	}
}

// checkPerftest fails t unless both sides of perftest run c that print
// results report the message size and iterations asked for and a positive
// figure, and no side an error line.
func checkPerftest(t *testing.T, c perftestCase, srv, cli string) {
	t.Helper()
	for side, out := range map[string]string{"server": srv, "client": cli} {
		if regexp.MustCompile(`(?i)error|fail|couldn't|unable`).MatchString(out) {
			t.Errorf("%s reports an error:\n%s", side, out)
		}
		if c.lat && side == "server" {
			continue // latency servers print no results
		}
		lines := strings.Split(out, "\n")
		var res []string
		for i, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), "#bytes") && i+1 < len(lines) {
				res = strings.Fields(lines[i+1])
			}
		}
		if len(res) < 5 || res[0] != fmt.Sprint(c.size) || res[1] != fmt.Sprint(c.iters) {
			t.Errorf("%s: result line %q, want %d bytes, %d iterations:\n%s", side, res, c.size, c.iters, out)
			continue
		}
		fig := res[3] // BW average[MB/sec]
		if c.lat {
			fig = res[4] // t_typical[usec]
		}
		if v, err := strconv.ParseFloat(fig, 64); err != nil || v <= 0 {
			t.Errorf("%s: figure %q is not a positive number", side, fig)
		}
	}
}

// TestVerbsABIPerftest runs the eight perftest RC tests, unmodified,
// server in one VM and client in another of one agent (memcpy), with a
// few iterations each.
func TestVerbsABIPerftest(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ib_write_bw", "perftest")
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vmA", testenv.VMOptions{MemMB: 16})
	env.Define(t, "vmB", testenv.VMOptions{MemMB: 16})
	runPerftest(t, lib, env.Socket, env.Socket, perftestRC)
}

// TestVerbsABITCP runs ibv_rc_pingpong -g 0 -c and the eight perftest RC
// tests, unmodified, between VMs on two hosts of a cluster (two vrdmad
// processes on loopback addresses, one etcd): the tcp path.
func TestVerbsABITCP(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_rc_pingpong", "ibverbs-utils")
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff})
	a, b := c.Hosts[0], c.Hosts[1]
	a.Define(t, "vmA", testenv.VMOptions{MemMB: 16})
	b.Define(t, "vmB", testenv.VMOptions{MemMB: 16})
	t.Run("ibv_rc_pingpong", func(t *testing.T) {
		for _, extra := range [][]string{nil, {"-e"}} {
			port := freePort(t)
			args := append([]string{"-g", "0", "-c", "-d", "vrdma0", "-p", fmt.Sprint(port), "-n", "200"}, extra...)
			srv, cli := runPair(t, lib, a.Socket, b.Socket, "/usr/bin/ibv_rc_pingpong", args, port)
			t.Logf("server:\n%s\nclient:\n%s", srv, cli)
			for side, out := range map[string]string{"server": srv, "client": cli} {
				if strings.Contains(out, "invalid data") || strings.Contains(out, "Failed") || strings.Contains(out, "Couldn't") {
					t.Errorf("%s %v reports an error:\n%s", side, extra, out)
				}
				if m := bytesLine.FindStringSubmatch(out); m == nil || m[1] != fmt.Sprint(2*4096*200) {
					t.Errorf("%s %v: bytes line %q", side, extra, m)
				}
			}
		}
	})
	NeedProgram(t, "/usr/bin/ib_write_bw", "perftest")
	runPerftest(t, lib, a.Socket, b.Socket, perftestRC)

	// The bytes crossed hostA's tcp uplink to hostB: this was the tcp path.
	moved := uplinkBytesMoved(t, a.Socket, "tcp", b.Name)
	if moved < 2*4096*200 {
		t.Errorf("hostA's uplinks carried %d bytes to and from hostB", moved)
	}
	t.Logf("hostA ↔ hostB over tcp: %d bytes", moved)
}

// TestVerbsABISeveralProcesses runs unmodified ibv_rc_pingpong (buffers
// checked) and ib_send_bw with server and client both workloads of one VM,
// as two programs open one device: each process has its own context on
// the same adapter (both report one GID), and their QPs connect.
func TestVerbsABISeveralProcesses(t *testing.T) {
	lib := Build(t)
	NeedProgram(t, "/usr/bin/ibv_rc_pingpong", "ibverbs-utils")
	NeedProgram(t, "/usr/bin/ib_send_bw", "perftest")
	env := testenv.StartProcess(t, testenv.ProcessOptions{})
	env.Define(t, "vmA", testenv.VMOptions{MemMB: 16})

	port := freePort(t)
	srv, cli := runPairIn(t, lib, env.Socket, "vmA", env.Socket, "vmA", "/usr/bin/ibv_rc_pingpong",
		[]string{"-g", "0", "-c", "-d", "vrdma0", "-p", fmt.Sprint(port), "-n", "500"}, port)
	var gids []string
	for side, out := range map[string]string{"server": srv, "client": cli} {
		if strings.Contains(out, "invalid data") || strings.Contains(out, "Failed") || strings.Contains(out, "Couldn't") {
			t.Errorf("%s reports an error:\n%s", side, out)
		}
		if m := itersLine.FindStringSubmatch(out); m == nil || m[1] != "500" {
			t.Errorf("%s: iters line %q, want 500:\n%s", side, m, out)
		}
		if m := gidLine.FindStringSubmatch(out); m != nil {
			gids = append(gids, m[1])
		}
	}
	if len(gids) != 2 || gids[0] != gids[1] {
		t.Errorf("the two processes of one VM report GIDs %v, want one adapter's GID twice", gids)
	}

	port = freePort(t)
	c := perftestCase{"ib_send_bw", 4096, 500, false}
	srv, cli = runPairIn(t, lib, env.Socket, "vmA", env.Socket, "vmA", "/usr/bin/ib_send_bw",
		[]string{"-d", "vrdma0", "-x", "0", "-p", fmt.Sprint(port), "-n", "500", "-s", "4096"}, port)
	checkPerftest(t, c, srv, cli)
}
