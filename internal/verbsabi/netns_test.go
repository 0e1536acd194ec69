// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/vrdma/vrdma/internal/vmnet"
)

// The VMs of the netns tests: vmA and vmB on the cluster's port group
// (dvportgroup-10, subnet netnsSubnet; vmB's address is assigned from
// it), vmC on another port group (dvportgroup-20) with an address in the
// same IP subnet, so that only the layer 2 keeps it apart.
const (
	netnsSubnet  = "10.66.0.0/24"
	netnsAddrA   = "10.66.0.10"
	netnsAddrC   = "10.66.0.20"
	netnsOtherPG = "dvportgroup-20"
	// netnsOtherVLAN is netnsOtherPG's VLAN: path selection isolates
	// RDMA by VLAN, the VMs' layer 2 by port group and VLAN.
	netnsOtherVLAN = 7
)

// netnsEnv is a cluster whose agents make VM namespaces, with vmA on its
// first host and vmB and vmC on its last.
type netnsEnv struct {
	c            *testenv.Cluster
	ctl, lib     string
	hostA, hostB *testenv.Host
}

// startNetnsEnv starts a cluster of hosts hosts (in network namespaces,
// joined by veths to a bridge) with vrdmad --vm-netns, and defines the
// VMs.
func startNetnsEnv(t *testing.T, hosts int) *netnsEnv {
	t.Helper()
	return startNetnsEnvMem(t, hosts, 16)
}

// startNetnsEnvMem is startNetnsEnv with VMs of memMB MiB.
func startNetnsEnvMem(t *testing.T, hosts, memMB int) *netnsEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("VM network namespaces need root (euid %d): run the test as root (CI does)", os.Geteuid())
	}
	for _, tool := range []string{"ping", "iperf3", "rping", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s: apt-get install -y iputils-ping iperf3 rdmacm-utils iproute2", tool)
		}
	}
	e := &netnsEnv{lib: BuildRDMACM(t), ctl: testenv.Binary(t, "vrdmactl")}
	e.c = testenv.StartCluster(t, testenv.ClusterOptions{Hosts: hosts, Netns: testenv.NetnsOn, Subnet: netnsSubnet,
		ExtraArgs: func(*testenv.Host) []string { return []string{"--vm-netns"} }})
	// Before the cluster's cleanup kills the agents (a VM namespace
	// outlives a killed agent until it starts again): stop them, which
	// removes everything they made, and check that it did.
	t.Cleanup(func() {
		for _, h := range e.c.Hosts {
			h.Stop(t)
			if left := leftovers(t, h); len(left) > 0 {
				t.Errorf("%s stopped and left %v", h.Name, left)
				for _, ns := range left {
					if strings.HasPrefix(ns, "/run/netns/") {
						exec.Command("ip", "netns", "delete", filepath.Base(ns)).Run()
					}
				}
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pg := e.c.PortGroup
	pg.Key, pg.Name, pg.Subnet, pg.VLAN = netnsOtherPG, netnsOtherPG, "", netnsOtherVLAN
	if _, err := e.c.Store().Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
		t.Fatal(err)
	}
	e.hostA, e.hostB = e.c.Hosts[0], e.c.Hosts[hosts-1]
	e.hostA.Define(t, "vmA", testenv.VMOptions{MemMB: memMB, IPv4: []string{netnsAddrA}})
	e.hostB.Define(t, "vmB", testenv.VMOptions{MemMB: memMB})
	e.hostB.DefineVMX(t, "vmC", testenv.VMXOn(testenv.VMOptions{MemMB: 16, IPv4: []string{netnsAddrC}}, e.c.Switch.UUID, netnsOtherPG))
	return e
}

// exec returns the command that runs args in VM vm's namespace on host h
// through vrdmactl exec --netns.
func (e *netnsEnv) exec(ctx context.Context, h *testenv.Host, vm string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, e.ctl, append([]string{"--socket", h.Socket, "exec", "--netns", "--vm", vm, "--lib", e.lib, "--"}, args...)...)
}

// side is exec as a cmSide for runCMPair.
func (e *netnsEnv) side(h *testenv.Host, vm string, args ...string) cmSide {
	return cmSide{socket: h.Socket, vm: vm, prog: e.ctl,
		args: append([]string{"--socket", h.Socket, "exec", "--netns", "--vm", vm, "--lib", e.lib, "--"}, args...)}
}

// hold runs iperf3's server in vmA's namespace for the rest of the test
// (it keeps vmA attached, so its namespace stays), and waits until the
// agent reports the namespace.
func (e *netnsEnv) hold(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv := e.exec(ctx, e.hostA, "vmA", "iperf3", "-s")
	var out testenv.SyncBuffer
	srv.Stdout, srv.Stderr = &out, &out
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		srv.Wait()
		if t.Failed() {
			t.Logf("iperf3 -s in vmA:\n%s", out.String())
		}
	})
	if ns := waitNetns(t, e.hostA.Socket, "vmA"); ns == "" {
		t.Fatalf("vmA has no network namespace:\n%s", out.String())
	}
}

// waitNetns waits until VM vm is attached at the agent at sock with a
// namespace, and returns it ("" after 20 s).
func waitNetns(t *testing.T, sock, vm string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(sock))
		if err == nil {
			st, err := ag.Status(ctx)
			ag.Close()
			if err == nil {
				for _, v := range st.VMs {
					if v.Name == vm && v.Attached && v.Netns != "" {
						cancel()
						return v.Netns
					}
				}
			}
		}
		cancel()
		time.Sleep(50 * time.Millisecond)
	}
	return ""
}

// iperf3 runs iperf3's client in vmB's namespace toward vmA, UDP with
// udp, until the server answers, and returns the bits per second it
// received.
func (e *netnsEnv) iperf3(t *testing.T, udp bool) float64 {
	t.Helper()
	args := []string{"iperf3", "-c", netnsAddrA, "-t", "2", "-J"}
	if udp {
		args = append(args, "-u", "-b", "100M")
	}
	var out []byte
	var err error
	for try := 0; try < 50; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err = e.exec(ctx, e.hostB, "vmB", args...).Output()
		cancel()
		if err == nil || !strings.Contains(string(out), "Connection refused") && !strings.Contains(string(out), "busy") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("iperf3 %v in vmB: %v\n%s", args, err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			Sum struct {
				BitsPerSecond float64 `json:"bits_per_second"`
				Packets       int     `json:"packets"`
				LostPackets   int     `json:"lost_packets"`
			} `json:"sum"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("iperf3's JSON: %v\n%s", err, out)
	}
	if udp {
		if r.End.Sum.Packets == 0 || r.End.Sum.LostPackets == r.End.Sum.Packets {
			t.Fatalf("iperf3 -u: %d packets, %d lost\n%s", r.End.Sum.Packets, r.End.Sum.LostPackets, out)
		}
		return r.End.Sum.BitsPerSecond
	}
	if r.End.SumReceived.BitsPerSecond <= 0 {
		t.Fatalf("iperf3: nothing received\n%s", out)
	}
	return r.End.SumReceived.BitsPerSecond
}

// checkNetns runs the netns tests' checks on e: vmB (address assigned by
// the control plane, there before its program starts) pings vmA and runs
// iperf3 over TCP and UDP to it, and rping to the same address; vmC, on
// another port group, reaches vmA neither by ICMP nor by TCP.
func checkNetns(t *testing.T, e *netnsEnv) {
	e.hold(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := e.exec(ctx, e.hostB, "vmB", "/bin/sh", "-c", "ip -4 -o addr show dev vrdma0; ping -c 3 -W 5 "+netnsAddrA).CombinedOutput()
	if err != nil {
		t.Fatalf("ping from vmB to vmA: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "inet 10.66.0.") || !strings.Contains(string(out), " 0% packet loss") {
		t.Errorf("vmB's address or ping:\n%s", out)
	}
	t.Logf("vmB: %s", firstLine(string(out)))
	t.Logf("iperf3 TCP vmB -> vmA: %.0f Mbit/s", e.iperf3(t, false)/1e6)
	t.Logf("iperf3 UDP vmB -> vmA: %.0f Mbit/s", e.iperf3(t, true)/1e6)

	port := "7174"
	so, co := runCMPair(t, e.lib, e.side(e.hostA, "vmA", "rping", "-s", "-a", netnsAddrA, "-p", port, "-v", "-C", "10"),
		e.side(e.hostB, "vmB", "rping", "-c", "-a", netnsAddrA, "-p", port, "-v", "-C", "10"))
	if n := len(pingData.FindAllString(co.stdout, -1)); n != 10 {
		t.Errorf("rping client: %d pings, want 10\nserver:\n%s\nclient:\n%s", n, so, co)
	}

	// perftest to the same address: with -R through rdma_cm; without, its
	// QP numbers and GIDs exchanged over TCP to that address (the VMs'
	// layer 2), then RDMA.
	if _, err := os.Stat("/usr/bin/ib_write_bw"); err != nil {
		t.Fatal("no ib_write_bw: apt-get install -y perftest")
	}
	c := perftestCase{"ib_write_bw", 65536, 500, false}
	for i, mode := range [][]string{{"-R"}, {"-x", "0"}} {
		args := append([]string{"-d", "vrdma0", "-p", fmt.Sprint(7180 + i), "-n", "500", "-s", "65536"}, mode...)
		srv, cli := runCMPair(t, e.lib, e.side(e.hostA, "vmA", append([]string{"ib_write_bw"}, args...)...),
			e.side(e.hostB, "vmB", append(append([]string{"ib_write_bw"}, args...), netnsAddrA)...))
		checkPerftest(t, c, srv.String(), cli.String())
		t.Logf("ib_write_bw %v vmB -> vmA: %s", mode, perftestBW(cli.String()))
	}

	// Another port group: no layer 2 to vmA, whatever the addresses.
	if out, err := e.exec(ctx, e.hostB, "vmC", "ping", "-c", "2", "-W", "1", netnsAddrA).CombinedOutput(); err == nil {
		t.Errorf("vmC, on port group %s, pings vmA:\n%s", netnsOtherPG, out)
	}
	if out, err := e.exec(ctx, e.hostB, "vmC", "iperf3", "-c", netnsAddrA, "-t", "1", "--connect-timeout", "2000").CombinedOutput(); err == nil {
		t.Errorf("vmC, on port group %s, connects to vmA's iperf3:\n%s", netnsOtherPG, out)
	}
	// Nor by RDMA: rping to vmA's address, where vmA's rping listens.
	rsrv := e.exec(ctx, e.hostA, "vmA", "rping", "-s", "-a", netnsAddrA, "-p", "7175", "-C", "1")
	if err := rsrv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { rsrv.Process.Kill(); rsrv.Wait() }()
	time.Sleep(time.Second)
	if out, err := e.exec(ctx, e.hostB, "vmC", "rping", "-c", "-a", netnsAddrA, "-p", "7175", "-C", "1", "-v").CombinedOutput(); err == nil {
		t.Errorf("vmC, on port group %s, rpings vmA:\n%s", netnsOtherPG, out)
	} else {
		t.Logf("rping from vmC: %v: %s", err, strings.TrimSpace(string(out)))
	}
}

// perftestBW is the average bandwidth of a perftest bw client's result
// line (MB/s), or "?".
func perftestBW(out string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "#bytes") && i+1 < len(lines) {
			if f := strings.Fields(lines[i+1]); len(f) > 3 {
				return f[3] + " MB/s"
			}
		}
	}
	return "?"
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

// TestNetnsOneHost: two VMs of one port group on one host, each in its
// namespace on the host's bridge, reach each other by their adapters'
// addresses with ICMP, TCP, UDP and rdma_cm (rping); a VM of another port
// group does not.
func TestNetnsOneHost(t *testing.T) {
	checkNetns(t, startNetnsEnv(t, 1))
}

// TestNetnsTwoHosts is TestNetnsOneHost with the VMs on two hosts (two
// network namespaces joined by veths): the layer 2 is the port group's
// VXLAN tunnel between the hosts' PVRDMA addresses, which carried the
// traffic (hostA's received vmB's iperf3 data).
func TestNetnsTwoHosts(t *testing.T) {
	e := startNetnsEnv(t, 2)
	checkNetns(t, e)
	// hostA's tunnel lives as long as vmA (hostB's goes with each of
	// vmB's programs): it received what vmB sent.
	if rx := vxlanRxBytes(t, e.hostA); rx < 1<<20 {
		t.Errorf("hostA's VXLAN devices received %d bytes, want iperf3's", rx)
	}
}

// vxlanRxBytes returns the bytes host h's VXLAN devices received.
func vxlanRxBytes(t *testing.T, h *testenv.Host) uint64 {
	t.Helper()
	out, err := h.Exec("ip", "-s", "-j", "link", "show", "type", "vxlan")
	if err != nil {
		t.Fatal(err)
	}
	var links []struct {
		Name  string `json:"ifname"`
		Stats struct {
			RX struct {
				Bytes uint64 `json:"bytes"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Fatalf("ip -j: %v\n%s", err, out)
	}
	var n uint64
	for _, l := range links {
		n += l.Stats.RX.Bytes
	}
	return n
}

// TestNetnsRefusedWithoutRoot: vrdmad --vm-netns run as another user than
// root refuses to start, and says what to do.
func TestNetnsRefusedWithoutRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skipf("the test drops root to nobody: run it as root (euid %d; CI does)", os.Geteuid())
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv: apt-get install -y util-linux")
	}
	bin := testenv.AgentBinary(t)
	dir, err := os.MkdirTemp("", "vrdma-netns-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
		bin, "--vm-netns", "--no-control-plane", "--socket", filepath.Join(dir, "s"), "--state-dir", filepath.Join(dir, "state")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "need root") || !strings.Contains(string(out), "without --vm-netns") {
		t.Errorf("vrdmad --vm-netns as nobody: %v\n%s", err, out)
	}
}

// leftovers lists what agent h's vmnet made and still exists: links in
// its namespace named with its prefix, and VM namespaces.
func leftovers(t *testing.T, h *testenv.Host) []string {
	t.Helper()
	var left []string
	out, err := h.Exec("ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	tag := h.ID()[:4]
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		for _, k := range []string{"vrb", "vre", "vrx"} {
			if strings.HasPrefix(name, k+tag) {
				left = append(left, name)
			}
		}
	}
	ns, _ := filepath.Glob(filepath.Join("/run/netns", vmnet.NamespacePrefix+h.ID()[:8]+"-*"))
	return append(left, ns...)
}

// TestNetnsCleanup: a tunnel's far ends follow the hosts as they stop and
// start; an agent killed (SIGKILL) while its VMs' namespaces, veths,
// bridges and tunnels exist removes them all when it starts again;
// one stopped (SIGTERM) removes them as it stops. A VM whose port group
// has no VNI is refused with what to do, and nothing of it is left.
func TestNetnsCleanup(t *testing.T) {
	e := startNetnsEnv(t, 2)
	h := e.hostA
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := e.exec(ctx, h, "vmA", "sleep", "600")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	if waitNetns(t, h.Socket, "vmA") == "" {
		t.Fatal("vmA has no network namespace")
	}
	left := leftovers(t, h)
	if len(left) < 4 { // the veth, the bridge, the tunnel, the namespace
		t.Fatalf("before the crash: %v, want vmA's veth, its port group's bridge and VXLAN, and its namespace", left)
	}
	out, _ := h.Exec("ip", "-d", "link", "show", "type", "vxlan")
	if !strings.Contains(out, "vxlan id 40960 ") || !strings.Contains(out, "local "+h.Addr().String()) {
		t.Errorf("the tunnel of dvportgroup-10 (VLAN 0) is not VNI 40960 from %s:\n%s", h.Addr(), out)
	}
	t.Logf("before the crash: %v", left)

	// The tunnel's far ends follow the hosts: hostB stopped (its lease
	// revoked) leaves hostA's flood list, and comes back with it.
	peer := "dst " + e.hostB.Addr().String()
	waitFDB := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			fdb, err := h.Exec("bridge", "fdb", "show", "dev", "vrx"+h.ID()[:4]+"00a000")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(fdb, "00:00:00:00:00:00 "+peer) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("hostA's tunnel's FDB, waiting for hostB's entry present=%v:\n%s", want, fdb)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t0 := time.Now()
	waitFDB(true)
	e.hostB.Stop(t)
	waitFDB(false)
	t.Logf("hostB stopped: out of hostA's FDB after %v", time.Since(t0))
	e.hostB.Restart(t)
	waitFDB(true)
	t.Logf("hostB restarted: in hostA's FDB after %v", time.Since(t0))
	h.Kill()
	if after := leftovers(t, h); len(after) == 0 {
		t.Fatalf("the crash removed everything already (%v): nothing to test", after)
	}
	h.ExpireLease(t)
	h.Restart(t)
	if after := leftovers(t, h); len(after) != 0 {
		t.Errorf("after a crash and a restart: %v left", after)
	}
	srv.Process.Kill()
	srv.Wait()

	// A clean stop removes what exists.
	c2 := e.exec(ctx, h, "vmA", "sleep", "600")
	if err := c2.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { c2.Process.Kill(); c2.Wait() }()
	if waitNetns(t, h.Socket, "vmA") == "" {
		t.Fatal("vmA has no network namespace after the restart")
	}
	h.Stop(t)
	if after := leftovers(t, h); len(after) != 0 {
		t.Errorf("after a stop: %v left", after)
	}
	h.Restart(t)

	// A port group without a VNI.
	bad := e.c.PortGroup
	bad.Key, bad.Name, bad.Subnet = "pg-blue", "pg-blue", ""
	if _, err := e.c.Store().Create(ctx, records.PortGroupKey(bad.Key), bad); err != nil {
		t.Fatal(err)
	}
	h.DefineVMX(t, "vmD", testenv.VMXOn(testenv.VMOptions{MemMB: 16, IPv4: []string{"10.66.1.1"}}, e.c.Switch.UUID, bad.Key))
	out2, err := e.exec(ctx, h, "vmD", "true").CombinedOutput()
	if err == nil || !strings.Contains(string(out2), `port group "pg-blue" has no VNI`) || !strings.Contains(string(out2), "without --vm-netns") {
		t.Errorf("exec --netns in a VM whose port group has no VNI: %v\n%s", err, out2)
	}
	if after := leftovers(t, h); len(after) != 0 {
		t.Errorf("after a refused VM: %v left", after)
	}
}

// TestNetnsMPI runs an Open MPI job with one rank per VM, on two hosts,
// in netns mode: mpirun itself in vmA's namespace, rank 0 there and rank
// 1 in vmB's (each through vrdmactl exec --netns), PMIx's connections
// from the ranks to mpirun over TCP to vmA's adapter address (PMIx told
// to listen on vrdma0 for other machines; without that, rank 1's MPI_Init
// finds mpirun unreachable), the messages on pml ucx over rc_verbs (the
// drop-in), UCX's log naming it as both ranks' tag lane.
func TestNetnsMPI(t *testing.T) {
	lib, ctl := needUCX(t)
	needMPI(t)
	dir := t.TempDir()
	pingpong := mpiBuild(t, dir, "pingpong")
	e := startNetnsEnvMem(t, 2, ucxMemMB)
	e.lib, e.ctl = lib, ctl
	// vmB's namespace exists before mpirun's mount namespace is made (a
	// namespace made later is not in it).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := e.exec(ctx, e.hostB, "vmB", "sleep", "600")
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { hold.Process.Kill(); hold.Wait() }()
	if waitNetns(t, e.hostB.Socket, "vmB") == "" {
		t.Fatal("vmB has no network namespace")
	}
	args := append([]string{"mpirun"}, mpirunUCX()...)
	for i, side := range []struct {
		h  *testenv.Host
		vm string
	}{{e.hostA, "vmA"}, {e.hostB, "vmB"}} {
		if i > 0 {
			args = append(args, ":")
		}
		args = append(args, "-np", "1", "-x", "UCX_TLS=rc_verbs,ud_verbs:aux", "-x", "UCX_LOG_LEVEL=info",
			ctl, "--socket", side.h.Socket, "exec", "--netns", "--lib", lib, "--vm", side.vm, "--", pingpong, "200", "65536")
	}
	cmd := e.exec(ctx, e.hostA, "vmA", args...)
	cmd.Env = append(hostEnv(), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
		"PMIX_MCA_ptl_tcp_if_include=vrdma0", "PMIX_MCA_ptl_tcp_remote_connections=1")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^pingpong ok 200 65536 `).MatchString(string(out)) {
		t.Fatalf("mpirun in vmA's namespace: %v\n%s", err, tail(string(out), 80))
	}
	if lanes := regexp.MustCompile(`ep_cfg\[\d+\]: tag\([^)]*rc_verbs/vrdma0:1`).FindAllString(string(out), -1); len(lanes) < 2 {
		t.Errorf("UCX's log does not show rc_verbs on vrdma0:1 as both ranks' tag lane:\n%s", tail(string(out), 60))
	}
	t.Logf("%s", grepLines(string(out), " ok "))
}
