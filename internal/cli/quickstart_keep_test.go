// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestQuickstartKeep runs "vrdmactl quickstart --keep" as a process, takes
// the lines it prints once ready, and runs them as a user would: the
// environment line, with which "vrdmactl vm list" reaches the lab; on each
// pair — memcpy, tcp, rdma and memcpy-direct — unmodified ib_write_bw -a (perftest) on
// the drop-in libibverbs, up to its 8 MiB messages (the VMs' guest memory
// holds its buffers), and rping on the drop-in librdmacm to the server
// adapter's address (the port group's subnet gave it one); then interrupts
// it, and it removes everything and exits 0.
func TestQuickstartKeep(t *testing.T) {
	for _, tool := range []string{"gcc", "make", "objdump", "ib_write_bw"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: install gcc make libibverbs-dev perftest", tool)
		}
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("no <infiniband/verbs.h>: install libibverbs-dev")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/vrdmactl", "./cmd/vrdmad")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	env := append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir(), libEnv+"=", "PATH="+bin+":"+os.Getenv("PATH"))
	qs := exec.Command(filepath.Join(bin, "vrdmactl"), "quickstart", "--keep")
	qs.Env = env
	qs.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // its agents follow it
	stdout, err := qs.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	qs.Stderr = os.Stderr
	if err := qs.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	t.Cleanup(func() {
		qs.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			qs.Process.Kill()
		}
	})
	lines := make(chan string, 256)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		done <- qs.Wait()
	}()
	var out []string
	var cmds []string
	var envLine string
	ready := false
	for deadline := time.After(3 * time.Minute); !ready || len(cmds) < 4*len(quickstartPairs); {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("quickstart --keep ended before it was ready:\n%s", strings.Join(out, "\n"))
			}
			out = append(out, l)
			switch {
			case l == "ready":
				ready = true
			case ready && strings.HasPrefix(l, "export "):
				envLine = l
			case ready && strings.Contains(l, " exec --vm "):
				cmds = append(cmds, l)
			}
		case <-deadline:
			t.Fatalf("quickstart --keep not ready in 3 minutes:\n%s", strings.Join(out, "\n"))
		}
	}
	if envLine == "" {
		t.Fatalf("quickstart --keep printed no environment line:\n%s", strings.Join(out, "\n"))
	}
	list := exec.Command("sh", "-c", envLine+" && vrdmactl vm list")
	list.Env = env
	if lout, err := list.CombinedOutput(); err != nil || !strings.Contains(string(lout), "vm1") {
		t.Errorf("%s && vrdmactl vm list: %v:\n%s", envLine, err, lout)
	}
	// run starts server, then client, and returns the client's output and
	// both errors; together they get two minutes. A client that fails
	// while the server still runs found no listener yet (on a busy machine
	// the server may take more than a moment): it runs again.
	run := func(server, client string) (string, string, error, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		srv := exec.CommandContext(ctx, "sh", "-c", "exec "+strings.TrimSuffix(server, " &"))
		srv.Env = env
		var sout testenv.SyncBuffer
		srv.Stdout, srv.Stderr = &sout, &sout
		srv.WaitDelay = 5 * time.Second
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		srvDone := make(chan error, 1)
		go func() { srvDone <- srv.Wait() }()
		for {
			time.Sleep(time.Second) // the server listens
			cl := exec.CommandContext(ctx, "sh", "-c", "exec "+client)
			cl.Env = env
			cl.WaitDelay = 5 * time.Second
			cout, err := cl.CombinedOutput()
			if err == nil || ctx.Err() != nil {
				return string(cout), sout.String(), err, <-srvDone
			}
			select {
			case serr := <-srvDone:
				return string(cout), sout.String(), err, serr
			default:
				t.Logf("%s failed while its server runs (no listener yet?), again: %v\n%s", client, err, cout)
			}
		}
	}
	bw := regexp.MustCompile(`(?m)^\s*8388608\s+5\s+[0-9.]+\s+[0-9.]+`)
	pings := regexp.MustCompile(`(?m)^ping data: rdma-ping-9: `)
	for i := 0; i+3 < len(cmds); i += 4 {
		// -n 5: every size, 5 iterations each; -p: a port of its own for
		// perftest's exchange (other runs on this machine may hold 18515).
		port := fmt.Sprintf(" -n 5 -p %d", freeTCPPort(t))
		cout, sout, err, serr := run(strings.TrimSuffix(cmds[i], " &")+port, cmds[i+1]+port)
		if err != nil || serr != nil || !bw.MatchString(cout) {
			t.Errorf("pair %d: %s\n%s\n-> %v, server %v:\n%s\nserver:\n%s", i/4+1, cmds[i], cmds[i+1], err, serr, cout, sout)
		}
		cout, sout, err, serr = run(cmds[i+2], cmds[i+3])
		if err != nil || serr != nil || !pings.MatchString(cout) {
			t.Errorf("pair %d: %s\n%s\n-> %v, server %v:\n%s\nserver:\n%s", i/4+1, cmds[i+2], cmds[i+3], err, serr, cout, sout)
		}
	}
	qs.Process.Signal(syscall.SIGINT)
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	if err := <-done; err != nil {
		t.Errorf("quickstart --keep after SIGINT: %v\n%s", err, strings.Join(rest, "\n"))
	}
	done <- nil // for the cleanup
	if all := strings.Join(rest, "\n"); !strings.Contains(all, "the agents and their temporary state are gone") {
		t.Errorf("quickstart --keep's last words:\n%s", all)
	}
}

// freeTCPPort returns a TCP port that was free on the loopback address a
// moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
