// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// The walkthrough of README.md, "Two hosts from nothing", as a test: the
// same commands and flags, on machines made of network namespaces (three
// etcd members, two of them also vrdma hosts), with real etcd processes —
// Debian's etcd-server (3.4) and vrdma-etcd (etcd's server at the version
// vrdmad embeds) — TLS everywhere, RBAC on, and every namespace behind the
// README's firewall port table. Keep the two in step.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestTwoHostsDebianEtcd runs the walkthrough on Debian's etcd-server
// (/usr/bin/etcd, 3.4) and etcd-client (etcdctl).
func TestTwoHostsDebianEtcd(t *testing.T) {
	t.Parallel() // its own namespaces and processes; mostly waiting
	needRoot(t)
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("no etcd in PATH: apt-get install -y etcd-server etcd-client (Debian's etcd, which this test runs)")
	}
	twoHosts(t, etcd, false)
}

// TestTwoHostsEmbeddedEtcd runs the walkthrough on vrdma-etcd: etcd's
// server at the version vrdmad embeds, as its own processes; its hosts
// also have software RoCEv2 uplinks, so their pairs take the rdma path,
// through the firewall's UDP line.
func TestTwoHostsEmbeddedEtcd(t *testing.T) {
	t.Parallel()
	needRoot(t)
	twoHosts(t, testenv.Binary(t, "vrdma-etcd"), true)
}

// needRoot skips t when not root: the walkthrough needs network
// namespaces and firewalls of its own.
func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skipf("the two-host walkthrough runs its machines in network namespaces, which need root (euid %d)", os.Geteuid())
	}
}

// walkthroughSubnet is the machines' network: machine i has .i+1.
var walkthroughSubnet = netip.MustParsePrefix("10.199.7.0/24")

// walk is one run of the walkthrough.
type walk struct {
	t        *testing.T
	lan      *testenv.LAN
	dir      string
	vrdmactl string
	vrdmad   string
	mu       sync.Mutex
	procs    []*walkProc // +checklocks:mu
}

// walkProc is a long-running process of the walkthrough (an etcd member,
// an agent, a perf server) and its output.
type walkProc struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.SyncBuffer
	done chan struct{}
}

// twoHosts runs the walkthrough with etcdBin as the etcd members' server:
// three machines, certificates, firewall, etcd cluster, RBAC, switch and
// port group, two agents, a VM on each, traffic between them (perf as
// root, ib_write_bw as a normal user), a snapshot, and an agent restart
// under a running perf. With rdma, each agent has a software RoCEv2
// uplink on its address, declared lossless (veths report no DCB state),
// and the pairs must take the rdma path; else the tcp path.
func twoHosts(t *testing.T, etcdBin string, rdma bool) {
	for _, tool := range []string{"etcdctl", "nft", "ib_write_bw", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: apt-get install -y etcd-client nftables perftest gcc make libibverbs-dev librdmacm-dev", tool)
		}
	}
	t0 := time.Now()
	w := &walk{t: t, lan: testenv.NewLAN(t, 3, walkthroughSubnet), dir: shortDir(t),
		vrdmactl: testenv.Binary(t, "vrdmactl"), vrdmad: testenv.AgentBinary(t)}
	t.Cleanup(w.stopAll)
	ip := func(i int) string { return w.lan.Addrs[i].String() }

	// 1. Certificates: a CA, one certificate per etcd member (server and
	// peer), one client certificate per host (its CN is its etcd user),
	// one for the operator's vrdmactl and one for etcd's root.
	pki := testenv.NewPKI(t, w.dir)
	for i := range 3 {
		pki.Issue(t, fmt.Sprintf("etcd%d", i+1), w.lan.Addrs[i].AsSlice())
	}
	for _, cn := range []string{"host1", "host2", "vrdma-admin", "root"} {
		pki.Issue(t, cn)
	}

	// 2. The firewall: every machine accepts only the port table.
	for i := range 3 {
		w.firewall(i)
	}

	// 3. The etcd cluster: three members, TLS for clients and peers,
	// client certificates required.
	var initial []string
	for i := range 3 {
		initial = append(initial, fmt.Sprintf("etcd%d=https://%s:2380", i+1, ip(i)))
	}
	for i := range 3 {
		name := fmt.Sprintf("etcd%d", i+1)
		w.start(i, name, etcdBin, "--name", name, "--data-dir", filepath.Join(w.dir, name+".etcd"),
			"--listen-client-urls", "https://"+ip(i)+":2379", "--advertise-client-urls", "https://"+ip(i)+":2379",
			"--listen-peer-urls", "https://"+ip(i)+":2380", "--initial-advertise-peer-urls", "https://"+ip(i)+":2380",
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", "vrdma-etcd", "--initial-cluster-state", "new",
			"--client-cert-auth", "--trusted-ca-file", pki.CA(), "--cert-file", pki.Cert(name), "--key-file", pki.Key(name),
			"--peer-client-cert-auth", "--peer-trusted-ca-file", pki.CA(), "--peer-cert-file", pki.Cert(name), "--peer-key-file", pki.Key(name))
	}
	endpoints := fmt.Sprintf("https://%s:2379,https://%s:2379,https://%s:2379", ip(0), ip(1), ip(2))
	etcdctl := func(args ...string) string {
		return w.run(0, "etcdctl", append([]string{"--endpoints", endpoints, "--cacert", pki.CA(), "--cert", pki.Cert("root"), "--key", pki.Key("root")}, args...)...)
	}
	w.eventually("the etcd cluster is healthy", 60*time.Second, func() error {
		_, err := w.try(0, "etcdctl", "--endpoints", endpoints, "--cacert", pki.CA(), "--cert", pki.Cert("root"), "--key", pki.Key("root"), "endpoint", "health")
		return err
	})
	t.Logf("etcd: %s", strings.TrimSpace(etcdctl("endpoint", "status", "-w", "table")))
	tEtcd := time.Now()

	// 4. RBAC: users named by their certificates' CN, no passwords.
	etcdctl("user", "add", "root", "--no-password")
	etcdctl("user", "grant-role", "root", "root")
	etcdctl("role", "add", "vrdma-agent")
	etcdctl("role", "grant-permission", "vrdma-agent", "--prefix=true", "read", "/vrdma/v1/")
	for _, p := range []string{"hosts/", "alive/", "vms/", "adapters/", "endpoints/", "secrets/switches/"} {
		etcdctl("role", "grant-permission", "vrdma-agent", "--prefix=true", "readwrite", "/vrdma/v1/"+p)
	}
	etcdctl("role", "add", "vrdma-admin")
	etcdctl("role", "grant-permission", "vrdma-admin", "--prefix=true", "readwrite", "/vrdma/v1/")
	for _, u := range [][2]string{{"host1", "vrdma-agent"}, {"host2", "vrdma-agent"}, {"vrdma-admin", "vrdma-admin"}} {
		etcdctl("user", "add", u[0], "--no-password")
		etcdctl("user", "grant-role", u[0], u[1])
	}
	etcdctl("auth", "enable")

	// 5. The switch and port group, by the operator (vrdma-admin).
	ctl := func(i int, args ...string) string {
		return w.run(i, w.vrdmactl, append([]string{"--etcd-endpoints", endpoints, "--etcd-ca", pki.CA(),
			"--etcd-cert", pki.Cert("vrdma-admin"), "--etcd-key", pki.Key("vrdma-admin")}, args...)...)
	}
	const uuid = "3b0c2a4f-108e-4c7b-9a21-550c6d2e8f01"
	ctl(0, "switch", "create", "dvs1", "--uuid", uuid, "--mtu", "1500")
	ctl(0, "portgroup", "create", "dvportgroup-10", "--switch", "dvs1", "--vlan", "10")
	// A host's certificate cannot change the switch (RBAC).
	if out, err := w.try(0, w.vrdmactl, "--etcd-endpoints", endpoints, "--etcd-ca", pki.CA(),
		"--etcd-cert", pki.Cert("host1"), "--etcd-key", pki.Key("host1"), "switch", "create", "dvs2"); err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("host1's certificate created a switch (%v): RBAC does not hold:\n%s", err, out)
	}

	// 6. The agents join the cluster.
	agentArgs := func(i int) []string {
		host := fmt.Sprintf("host%d", i+1)
		args := []string{"--socket", w.socket(i), "--state-dir", filepath.Join(w.dir, host+".state"), "--host", host,
			"--etcd-endpoints", endpoints, "--etcd-ca", pki.CA(), "--etcd-cert", pki.Cert(host), "--etcd-key", pki.Key(host),
			"--switch", "dvs1", "--pvrdma-address", ip(i) + ":4791", "--firewall-pvrdma"}
		if rdma {
			args = append(args, "--rdma-uplink", "rocev2-soft/"+ip(i), "--rdma-uplink-lossless", "3")
		}
		return args
	}
	agents := make([]*walkProc, 2)
	for i := range 2 {
		agents[i] = w.start(i, fmt.Sprintf("vrdmad@host%d", i+1), w.vrdmad, agentArgs(i)...)
	}
	for i := range 2 {
		w.waitAgent(i)
	}
	w.eventually("both hosts are up", 30*time.Second, func() error {
		out := ctl(0, "host", "list")
		if strings.Count(out, " up ") < 2 {
			return fmt.Errorf("host list:\n%s", out)
		}
		return nil
	})
	tAgents := time.Now()

	// 7. A VM on each host, on the port group.
	for i, vm := range []string{"vmA", "vmB"} {
		vmx := filepath.Join(w.dir, vm+".vmx")
		text := strings.Join([]string{`.encoding = "UTF-8"`, `config.version = "8"`, `virtualHW.version = "20"`, `guestOS = "ubuntu-64"`,
			`memSize = "256"`, `sched.mem.min = "256"`, `sched.mem.pin = "TRUE"`,
			`ethernet0.present = "TRUE"`, `ethernet0.virtualDev = "vrdma"`,
			`ethernet0.dvs.switchId = "` + uuid + `"`, `ethernet0.dvs.portgroupId = "dvportgroup-10"`,
			fmt.Sprintf(`vrdma0.ipAddress = "10.77.0.%d"`, i+1)}, "\n") + "\n"
		if err := os.WriteFile(vmx, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		w.run(i, w.vrdmactl, "--socket", w.socket(i), "vm", "define", vm, vmx, "--owner", "65534:65534")
	}

	// 8. Verification: vrdmactl perf, server on host1, client on host2,
	// over the tcp path, or the rdma path.
	path := "tcp"
	if rdma {
		path = "rdma"
	}
	perf := func(what string) {
		srv := w.start(0, "perf server", w.vrdmactl, "--socket", w.socket(0), "perf", "write_bw", "--vm", "vmA", "-s", "65536", "-n", "2000")
		var out string
		w.eventually("perf client "+what, 30*time.Second, func() error {
			var err error
			out, err = w.try(1, w.vrdmactl, "--socket", w.socket(1), "perf", "write_bw", "--vm", "vmB", "-s", "65536", "-n", "2000", "10.77.0.1")
			if err != nil {
				return fmt.Errorf("%w:\n%s", err, out)
			}
			return nil
		})
		w.wait(srv, 30*time.Second)
		if !strings.Contains(out, "Transport       : "+path+"\n") {
			t.Errorf("perf %s: the pair did not take the %s path:\n%s", what, path, out)
		}
		if !strings.Contains(out, "65536") || !strings.Contains(srv.out.String(), "65536") {
			t.Errorf("perf %s: no report for 65536-byte messages on both sides:\nclient:\n%s\nserver:\n%s", what, out, srv.out.String())
		}
		t.Logf("perf %s, client (host2):\n%s", what, out)
	}
	perf("between the hosts")

	// An unmodified program, perftest's ib_write_bw over rdma_cm (-R),
	// through the drop-in, run by a normal user (nobody, the VMs' owner):
	// vrdmactl and the drop-in where that user reaches them.
	pub := filepath.Join(w.dir, "pub")
	if err := os.Mkdir(pub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(w.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	userCtl, lib := filepath.Join(pub, "vrdmactl"), filepath.Join(pub, "lib")
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	built, err := guest.FindIBVerbs(guest.InstalledDir, filepath.Join(cache, "vrdma")) // as vrdmactl exec finds it
	if err != nil {
		t.Fatal(err)
	}
	w.run(0, "install", "-m", "0755", w.vrdmactl, userCtl)
	w.run(0, "install", "-m", "0644", "-D", "-t", lib, filepath.Join(built, "libibverbs.so.1"), filepath.Join(built, "librdmacm.so.1"))
	asUser := func(i int, args ...string) []string {
		return append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "env", "HOME=/nonexistent",
			"VRDMA_SOCKET=" + w.socket(i), userCtl, "exec", "--lib", lib}, args...)
	}
	srv := w.start(0, "ib_write_bw server", "setpriv", asUser(0, "--vm", "vmA", "--",
		"ib_write_bw", "-R", "-d", "vrdma0", "-s", "65536", "-n", "1000")...)
	var out string
	w.eventually("ib_write_bw client", 60*time.Second, func() error {
		var err error
		out, err = w.try(1, "setpriv", asUser(1, "--vm", "vmB", "--",
			"ib_write_bw", "-R", "-d", "vrdma0", "-s", "65536", "-n", "1000", "10.77.0.1")...)
		if err != nil {
			return fmt.Errorf("%w:\n%s", err, out)
		}
		return nil
	})
	w.wait(srv, 30*time.Second)
	if !strings.Contains(out, "65536      1000") {
		t.Errorf("ib_write_bw client printed no result line for 65536 bytes × 1000:\n%s", out)
	}
	t.Logf("ib_write_bw, client (host2):\n%s", out)
	tTraffic := time.Now()

	// 9. Backup of the control plane: a snapshot, and its status.
	snap := filepath.Join(w.dir, "vrdma-etcd.snap")
	w.run(0, "etcdctl", "--endpoints", "https://"+ip(0)+":2379", "--cacert", pki.CA(), "--cert", pki.Cert("root"), "--key", pki.Key("root"), "snapshot", "save", snap)
	st := w.run(0, "etcdctl", "snapshot", "status", snap, "-w", "table")
	t.Logf("snapshot status:\n%s", st)

	// 10. An upgrade: the agent of host2 restarts (as the package's
	// postinst restarts it) under a running perf: the workload on host2
	// loses its QPs and exits with an error, the host comes back, and new
	// QPs connect.
	long := []string{"perf", "write_bw", "-s", "65536", "-n", "100000000"}
	srv = w.start(0, "long perf server", w.vrdmactl, append([]string{"--socket", w.socket(0)}, append(long, "--vm", "vmA")...)...)
	time.Sleep(time.Second)
	cli := w.start(1, "long perf client", w.vrdmactl, append([]string{"--socket", w.socket(1)}, append(long, "--vm", "vmB", "10.77.0.1")...)...)
	// It connects within a second (the runs above took less); three
	// seconds in, it is moving data.
	time.Sleep(3 * time.Second)
	select {
	case <-cli.done:
		t.Fatalf("the long perf client ended before the upgrade (%v):\n%s", cli.cmd.ProcessState, cli.out.String())
	default:
	}
	agents[1].cmd.Process.Signal(syscall.SIGTERM)
	w.wait(agents[1], 30*time.Second)
	select {
	case <-cli.done:
		if cli.cmd.ProcessState.Success() || !strings.Contains(cli.out.String(), "host agent (vrdmad) connection is gone") {
			t.Errorf("the perf client on host2 (%v) did not report its agent gone:\n%s", cli.cmd.ProcessState, cli.out.String())
		}
		t.Logf("perf client on host2 when its agent stopped (%v):\n%s", cli.cmd.ProcessState, cli.out.String())
	case <-time.After(30 * time.Second):
		t.Errorf("the perf client on host2 still runs 30 s after its agent stopped:\n%s", cli.out.String())
	}
	srv.cmd.Process.Kill()
	<-srv.done
	w.start(1, "vrdmad@host2 (after the upgrade)", w.vrdmad, agentArgs(1)...)
	w.waitAgent(1)
	perf("after host2's agent restarted")
	// RBAC granted the agents all they do: none was refused anything, and
	// none logged an error.
	w.mu.Lock()
	for _, p := range w.procs {
		if out := p.out.String(); strings.HasPrefix(p.name, "vrdmad@") && (strings.Contains(out, "permission denied") || strings.Contains(out, "level=ERROR")) {
			t.Errorf("%s was refused something or logged an error:\n%s", p.name, out)
		}
	}
	w.mu.Unlock()
	t.Logf("two hosts on %s: etcd %v, RBAC and agents %v, traffic %v, backup and upgrade %v; total %v", filepath.Base(etcdBin),
		tEtcd.Sub(t0).Round(time.Millisecond), tAgents.Sub(tEtcd).Round(time.Millisecond), tTraffic.Sub(tAgents).Round(time.Millisecond),
		time.Since(tTraffic).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
}

// socket returns agent i's socket.
func (w *walk) socket(i int) string { return filepath.Join(w.dir, fmt.Sprintf("host%d.sock", i+1)) }

// firewall loads README's port table into machine i: input from the
// machines' subnet to etcd's client and peer ports and to the PVRDMA
// address's TCP port (and RoCEv2's UDP port), nothing else.
func (w *walk) firewall(i int) {
	rules := fmt.Sprintf(`table inet vrdma {
	chain input {
		type filter hook input priority filter; policy drop;
		iif lo accept
		ct state established,related accept
		ip saddr %[1]s tcp dport { 2379, 2380, 4791 } accept
		ip saddr %[1]s udp dport 4791 accept
	}
}
`, walkthroughSubnet)
	f := filepath.Join(w.dir, fmt.Sprintf("nft%d", i))
	if err := os.WriteFile(f, []byte(rules), 0o644); err != nil {
		w.t.Fatal(err)
	}
	w.run(i, "nft", "-f", f)
}

// command returns name args as a command on machine i.
func (w *walk) command(ctx context.Context, i int, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", w.lan.Hosts[i], name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// try runs name args on machine i for at most a minute and returns its
// output.
func (w *walk) try(i int, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := w.command(ctx, i, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s on machine %d: %w", filepath.Base(name), strings.Join(args, " "), i+1, err)
	}
	return string(out), nil
}

// run is try that fails the test on an error.
func (w *walk) run(i int, name string, args ...string) string {
	w.t.Helper()
	out, err := w.try(i, name, args...)
	if err != nil {
		w.t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// start starts name args on machine i, killed at cleanup if still
// running.
func (w *walk) start(i int, what, name string, args ...string) *walkProc {
	w.t.Helper()
	p := &walkProc{name: what, out: &testenv.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = w.command(context.Background(), i, name, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		w.t.Fatalf("start %s: %v", what, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	w.mu.Lock()
	w.procs = append(w.procs, p)
	w.mu.Unlock()
	return p
}

// wait waits up to timeout for p to exit, and fails the test if it does
// not, or fails.
func (w *walk) wait(p *walkProc, timeout time.Duration) {
	w.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		<-p.done
		w.t.Fatalf("%s did not exit in %v:\n%s", p.name, timeout, p.out.String())
	}
	if !p.cmd.ProcessState.Success() {
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return
		}
		w.t.Fatalf("%s: %v:\n%s", p.name, p.cmd.ProcessState, p.out.String())
	}
}

// waitAgent waits until agent i answers.
func (w *walk) waitAgent(i int) {
	w.t.Helper()
	w.eventually(fmt.Sprintf("agent of host%d answers", i+1), 60*time.Second, func() error {
		_, err := w.try(i, w.vrdmactl, "--socket", w.socket(i), "status")
		return err
	})
}

// eventually retries fn every 200 ms until it succeeds, and fails the
// test with its last error after timeout.
func (w *walk) eventually(what string, timeout time.Duration, fn func() error) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stopAll kills what still runs and, if the test failed, logs every
// process's output.
func (w *walk) stopAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.procs {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if w.t.Failed() {
			w.t.Logf("%s:\n%s", p.name, p.out.String())
		}
	}
}

// shortDir returns a temporary directory with a short path, for Unix
// sockets; removed at cleanup.
func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "vp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
