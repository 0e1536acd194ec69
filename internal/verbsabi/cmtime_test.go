// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// cmtimeSteps are the steps a cmtime client times, as it names them.
var cmtimeSteps = []string{"create id", "resolve addr", "resolve route", "create qp", "connect", "disconnect", "destroy"}

// TestRDMACMCmtime runs rdmacm-utils' connection-timing tool cmtime,
// unmodified, over memcpy, tcp and rdma: a client makes 20 connections to
// the server, by its adapter's address, and times every step of each
// (create id, resolve address and route, create qp, connect, disconnect,
// destroy); the server accepts each on a thread of its own, makes its QP
// with rdma_create_qp, and disconnects and destroys it when the client
// disconnects. The client must exit 0 with every step timed for every
// connection; the server must then hold no QP in the agent (it destroyed
// all 20) and still be running: Debian 12's cmtime (rdma-core 44) has no
// end to its server — run_server loops on rdma_get_cm_event for as long
// as the channel lives, on a kernel device too (rdma-core 61 added one) —
// so the test stops it with SIGTERM, as its user does with ^C.
func TestRDMACMCmtime(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/cmtime", "rdmacm-utils")
	const conns = 20
	for _, path := range []string{"memcpy", "tcp", "rdma"} {
		t.Run(path, func(t *testing.T) {
			e := startCMEnv(t, path)
			port := fmt.Sprint(cmPort())
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			srv := exec.CommandContext(ctx, "/usr/bin/cmtime", "-b", cmAddrA, "-p", port, "-c", fmt.Sprint(conns))
			srv.Env = Env(lib, e.sockA, "vmA")
			var sout strings.Builder
			srv.Stdout, srv.Stderr = &sout, &sout
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			srvDone := make(chan error, 1)
			go func() { srvDone <- srv.Wait() }()
			stop := sync.OnceFunc(func() {
				srv.Process.Signal(syscall.SIGTERM)
				<-srvDone
			})
			defer stop()

			var cli string
			for attempt := 0; ; attempt++ {
				c := exec.CommandContext(ctx, "/usr/bin/cmtime", "-s", cmAddrA, "-p", port, "-c", fmt.Sprint(conns))
				c.Env = Env(lib, e.sockB, "vmB")
				out, err := c.CombinedOutput()
				cli = string(out)
				if err == nil && !noListener(cli) {
					break
				}
				if attempt >= 50 || !noListener(cli) {
					t.Fatalf("client: %v\n%s\nserver:\n%s", err, cli, sout.String())
				}
				select {
				case err := <-srvDone:
					t.Fatalf("server exited before a client connected: %v\n%s", err, sout.String())
				case <-time.After(100 * time.Millisecond):
				}
			}
			t.Logf("client:\n%s", cli)
			if regexp.MustCompile(`(?i)error|fail|event:`).MatchString(cli) {
				t.Errorf("the client reports an error:\n%s", cli)
			}
			// A step's line: name, total ms, max ms, min us, us per conn.
			for _, step := range cmtimeSteps {
				m := regexp.MustCompile(`(?m)^` + step + ` *: +([0-9.]+) +([0-9.]+) +([0-9.]+) +([0-9.]+)$`).FindStringSubmatch(cli)
				if m == nil {
					t.Errorf("the client timed no step %q", step)
				}
			}

			// The server destroys each QP when its connection's
			// DISCONNECTED comes: none may be left.
			var left int
			deadline := time.Now().Add(20 * time.Second)
			for {
				left = vmQPs(t, e.sockA, "vmA")
				if left == 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if left != 0 {
				t.Errorf("vmA still holds %d QPs after the client disconnected all %d connections", left, conns)
			}
			select {
			case err := <-srvDone:
				t.Fatalf("the server ended by itself (%v): cmtime 44's server runs until stopped\n%s", err, sout.String())
			default:
			}
			stop()
			if s := sout.String(); regexp.MustCompile(`(?i)error|fail`).MatchString(s) {
				t.Errorf("the server reports an error:\n%s", s)
			}
		})
	}
}

// vmQPs returns how many QPs vm holds at the agent at sock.
func vmQPs(t *testing.T, sock, vm string) int {
	t.Helper()
	for _, v := range agentStatus(t, sock).VMs {
		if v.Name == vm {
			return len(v.QPs)
		}
	}
	t.Fatalf("the agent at %s has no VM %s", sock, vm)
	return 0
}
