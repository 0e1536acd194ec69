// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/testenv"
)

// hostNetEnv is VMs whose programs run in their hosts' own network (the
// test's), on a cluster with loopback host addresses: vmA and vmC on
// hostA, and vmB on hostA (memcpy) or on hostB (tcp; rdma: with software
// RoCEv2 uplinks).
type hostNetEnv struct {
	cmEnv
	sockC string
	hostA string // hostA's PVRDMA address
}

func startHostNetEnv(t *testing.T, path string) hostNetEnv {
	t.Helper()
	n := 2
	if path == "memcpy" {
		n = 1
	}
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: n, Netns: testenv.NetnsOff, RDMA: path == "rdma"})
	a, b := c.Hosts[0], c.Hosts[n-1]
	a.Define(t, "vmA", testenv.VMOptions{MemMB: 32, IPv4: []string{cmAddrA}})
	a.Define(t, "vmC", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.77.0.3"}})
	b.Define(t, "vmB", testenv.VMOptions{MemMB: 32, IPv4: []string{cmAddrB}})
	return hostNetEnv{cmEnv{path, a.Socket, b.Socket}, a.Socket, a.Addr().String()}
}

// TestHostAddressCheck runs guest/rdmacm/tests/hostaddr_check.c in a VM
// whose process is in its host's network, by 127.0.0.1 and by the host's
// PVRDMA address: a listener on the any address holds the host's port; a
// second on a host address and the same port is EADDRINUSE; a dialer by
// the host's address and port reaches the first; both sides'
// rdma_get_local_addr and rdma_get_peer_addr are the addresses the program
// used; a port nobody holds is REJECTED with reason 8; closing the
// listener frees the port.
func TestHostAddressCheck(t *testing.T) {
	lib := BuildRDMACM(t)
	e := startHostNetEnv(t, "memcpy")
	for _, host := range []string{"127.0.0.1", e.hostA} {
		t.Run(host, func(t *testing.T) {
			out, _ := runCSource(t, lib, e.sockA, "vmA", filepath.Join(SourceDir(), "..", "rdmacm", "tests", "hostaddr_check.c"),
				[]string{"librdmacm.so.1", "libibverbs.so.1"}, host, fmt.Sprint(cmPort()))
			if n := strings.Count(out, "ok "); n < 20 {
				t.Errorf("only %d checks ran", n)
			}
		})
	}
}

// TestHostAddressPrograms runs unmodified rping, ib_write_bw -R and
// ucmatose with the server in vmA listening on the any address, and the
// client dialing the host's address instead of the adapter's: 127.0.0.1
// and hostA's PVRDMA address from vmB on hostA (memcpy), hostA's PVRDMA
// address from vmB on hostB (tcp, rdma). Each must complete as by the
// adapter's address, and on tcp and rdma the bytes cross that path.
func TestHostAddressPrograms(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/rping", "rdmacm-utils")
	NeedProgram(t, "/usr/bin/ib_write_bw", "perftest")
	for _, path := range []string{"memcpy", "tcp", "rdma"} {
		t.Run(path, func(t *testing.T) {
			e := startHostNetEnv(t, path)
			targets := []string{e.hostA}
			if path == "memcpy" {
				targets = []string{"127.0.0.1", e.hostA}
			}
			for _, to := range targets {
				t.Run("rping_"+to, func(t *testing.T) {
					port := fmt.Sprint(cmPort())
					srv, cli := runCMPair(t, lib,
						cmSide{e.sockA, "vmA", "/usr/bin/rping", []string{"-s", "-a", "0.0.0.0", "-p", port, "-v", "-V", "-C", "20"}},
						cmSide{e.sockB, "vmB", "/usr/bin/rping", []string{"-c", "-a", to, "-p", port, "-v", "-V", "-C", "20"}})
					for side, out := range map[string]cmOutput{"server": srv, "client": cli} {
						if m := pingData.FindAllStringSubmatch(out.stdout, -1); len(m) != 20 {
							t.Errorf("%s printed %d pings, want 20:\n%s", side, len(m), out)
						}
					}
				})
				t.Run("ib_write_bw_"+to, func(t *testing.T) {
					port := fmt.Sprint(cmPort())
					c := perftestCase{"ib_write_bw", 65536, 200, false}
					args := []string{"-R", "-d", "vrdma0", "-p", port, "-n", fmt.Sprint(c.iters), "-s", fmt.Sprint(c.size)}
					srv, cli := runCMPair(t, lib,
						cmSide{e.sockA, "vmA", "/usr/bin/ib_write_bw", args},
						cmSide{e.sockB, "vmB", "/usr/bin/ib_write_bw", append(args, to)})
					checkPerftest(t, c, srv.String(), cli.String())
				})
				t.Run("ucmatose_"+to, func(t *testing.T) {
					port := fmt.Sprint(cmPort())
					// One connection: with more, a client that starts as
					// the server comes up may have its first connect
					// refused and a later one accepted, and neither side
					// ends (runCMPair runs a refused client again).
					args := []string{"-c", "1", "-C", "10", "-S", "1000", "-p", port}
					srv, cli := runCMPair(t, lib,
						cmSide{e.sockA, "vmA", "/usr/bin/ucmatose", args},
						cmSide{e.sockB, "vmB", "/usr/bin/ucmatose", append([]string{"-s", to}, args...)})
					for side, out := range map[string]cmOutput{"server": srv, "client": cli} {
						if !strings.Contains(out.String(), "return status 0") {
							t.Errorf("%s did not end with status 0:\n%s", side, out)
						}
					}
				})
			}
			e.carried(t, 200*65536)
		})
	}
}

// TestHostAddressSecondListener starts rping's persistent server on the
// any address and a port in vmA, waits until a client by 127.0.0.1 gets
// through, then starts another server in vmC, a second VM of the same
// host: its rdma_listen fails with EADDRINUSE, as a second TCP listener on
// that port would; once the first ends, vmC may listen there.
func TestHostAddressSecondListener(t *testing.T) {
	lib := BuildRDMACM(t)
	NeedProgram(t, "/usr/bin/rping", "rdmacm-utils")
	e := startHostNetEnv(t, "memcpy")
	port := fmt.Sprint(cmPort())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := exec.CommandContext(ctx, "/usr/bin/rping", "-s", "-P", "-a", "0.0.0.0", "-p", port)
	first.Env = Env(lib, e.sockA, "vmA")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			first.Process.Kill()
			first.Wait()
			stopped = true
		}
	}
	defer stop()
	run := func(sock, vm string, args ...string) (string, error) {
		c := exec.CommandContext(ctx, "/usr/bin/rping", args...)
		c.Env = Env(lib, sock, vm)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	var out string
	var err error
	for i := 0; i < 50; i++ {
		if out, err = run(e.sockB, "vmB", "-c", "-a", "127.0.0.1", "-p", port, "-C", "1"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("no client by 127.0.0.1 reached vmA's server: %v\n%s", err, out)
	}
	out, err = run(e.sockC, "vmC", "-s", "-a", "0.0.0.0", "-p", port)
	if err == nil || !regexp.MustCompile(`rdma_listen: Address already in use`).MatchString(out) {
		t.Fatalf("a second rping server on port %s (vmC, another VM of the host) did not fail with EADDRINUSE: %v\n%s", port, err, out)
	}
	stop()
	srv, cli := runCMPair(t, lib,
		cmSide{e.sockC, "vmC", "/usr/bin/rping", []string{"-s", "-a", "0.0.0.0", "-p", port, "-C", "3"}},
		cmSide{e.sockB, "vmB", "/usr/bin/rping", []string{"-c", "-a", "127.0.0.1", "-p", port, "-C", "3"}})
	t.Logf("server:\n%s\nclient:\n%s", srv, cli)
}
