package verbsabi

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// freePort returns a TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
// its buffer check (-c): busy-polling, with completion events (-e), and
// with messages small enough to go inline (-s 64). Each side must report
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
