// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// waitOutput waits until side's output holds s.
func (s *nativeSide) waitOutput(t *testing.T, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(s.out.String(), what); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("vrdmactl %v did not say %q within 30s:\n%s", s.cmd.Args, what, s.out.String())
		}
	}
}

// nativeCMHost starts a one-host cluster whose host has PVRDMA namespaces,
// with VM "nat" (native endpoints) and VM "plain" (without), and a plain
// peer's namespace (prefix "cm") at peerAddr.
func nativeCMHost(t *testing.T, peerAddr netip.Addr) (*testenv.Cluster, *testenv.Host, string) {
	t.Helper()
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 1, RDMA: true, Netns: testenv.NetnsOn})
	ha := c.Hosts[0]
	if out, err := exec.Command(testenv.Binary(t, "vrdmactl"), "--etcd-endpoints", c.Endpoint(), "host", "configure", ha.Name, "--pvrdma-namespaces", "on").CombinedOutput(); err != nil {
		t.Fatalf("host configure --pvrdma-namespaces on: %v\n%s", err, out)
	}
	ha.DefineVMX(t, "nat", ha.VMX(testenv.VMOptions{MemMB: 16})+"vrdma0.nativeEndpointSupport = \"TRUE\"\n")
	ha.DefineVMX(t, "plain", ha.VMX(testenv.VMOptions{MemMB: 16}))
	return c, ha, c.PeerNetns(t, "cm", peerAddr)
}

// TestNativeCM: RDMA CM over QP1 in both directions between the plain
// peer (vrdmactl native-peer --address, its own engine in a namespace of
// its own, no agent) and a VM adapter with native endpoints: each listens
// by port in turn, the other connects by IP address and port (REQ, REP,
// RTU), runs every operation and disconnects (DREQ, DREP). A REQ to a
// port nobody listens on gets a REJ (invalid service ID), and so does one
// to a port only an adapter without native endpoints listens on (counted).
// The capture decodes as InfiniBand, the CM MADs as CM, none malformed,
// every ICRC checks.
func TestNativeCM(t *testing.T) {
	script := roceScapy(t)
	peerAddr := netip.MustParseAddr("10.199.1.211")
	_, ha, ns := nativeCMHost(t, peerAddr)
	check := func(what string, s *nativeSide, active bool) {
		t.Helper()
		out, err := s.wait(t)
		if err != nil || !strings.Contains(out, "all checks passed") || strings.Contains(out, "ATOMIC_FETCH_AND_ADD") != active {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		t.Logf("%s:\n%s", what, out)
	}
	before := rdmaStatus(t, ha.Socket)
	pcap, stopCapture := nativeCapture(t, ns, ha, peerAddr)
	t0 := time.Now()

	// The plain peer listens; the VM's side connects by its address.
	// 16 KiB regions: WRITEs and READs of several packets at the path MTU
	// (4096, the two interfaces' 9000 bytes allowing it).
	peer := startNative(t, ns, "native-peer", "--address", peerAddr.String(), "--cm", "-p", "7471", "-s", "16384", "--timeout", "45s")
	peer.waitOutput(t, "listening with RDMA CM")
	vm := startNative(t, ha.Netns, "--socket", ha.Socket, "native-peer", "--vm", "nat", "--cm", "-p", "7471", "-s", "16384", "--timeout", "45s", peerAddr.String())
	check("the VM's side, connecting", vm, true)
	check("the plain peer, listening", peer, false)

	// The VM's side listens; the plain peer connects to the host's uplink.
	vm = startNative(t, ha.Netns, "--socket", ha.Socket, "native-peer", "--vm", "nat", "--cm", "-p", "7472", "--timeout", "45s")
	vm.waitOutput(t, "listening with RDMA CM")
	peer = startNative(t, ns, "native-peer", "--address", peerAddr.String(), "--cm", "-p", "7472", "--timeout", "45s", ha.Addr().String())
	check("the plain peer, connecting", peer, true)
	check("the VM's side, listening", vm, false)
	t.Logf("both directions with RDMA CM: %v", time.Since(t0))

	// Nobody listens on 7473: REJ, reason 8 (invalid service ID).
	peer = startNative(t, ns, "native-peer", "--address", peerAddr.String(), "--cm", "-p", "7473", "--timeout", "20s", ha.Addr().String())
	if out, err := peer.wait(t); err == nil || !strings.Contains(out, "REJECTED (status 8") {
		t.Errorf("a connect to a port nobody listens on: %v\n%s", err, out)
	}
	// Only an adapter without native endpoints listens on 7474: refused
	// alike, and counted.
	vm = startNative(t, ha.Netns, "--socket", ha.Socket, "native-peer", "--vm", "plain", "--cm", "-p", "7474", "--timeout", "20s")
	vm.waitOutput(t, "listening with RDMA CM")
	peer = startNative(t, ns, "native-peer", "--address", peerAddr.String(), "--cm", "-p", "7474", "--timeout", "20s", ha.Addr().String())
	if out, err := peer.wait(t); err == nil || !strings.Contains(out, "REJECTED (status 8") {
		t.Errorf("a connect to a listener without native endpoints: %v\n%s", err, out)
	}
	vm.cmd.Process.Kill()

	after := rdmaStatus(t, ha.Socket)
	if got := after.CMRefusedNotNative - before.CMRefusedNotNative; got != 1 {
		t.Errorf("host A counted %d REQs refused for a listener without native endpoints, want 1", got)
	}
	if after.CMDropped != before.CMDropped || after.BadICRC != before.BadICRC || after.Malformed != before.Malformed || after.CMRejected-before.CMRejected != 2 {
		t.Errorf("host A's CM counters: before %+v, after %+v; want no drops and 2 REJs", before, after)
	}
	text, err := exec.Command(testenv.Binary(t, "vrdmactl"), "--socket", ha.Socket, "status").CombinedOutput()
	if want := fmt.Sprintf("%d requests refused (listener without native endpoints)", after.CMRefusedNotNative); err != nil || !strings.Contains(string(text), want) {
		t.Errorf("vrdmactl status does not say %q (%v):\n%s", want, err, text)
	}

	stopCapture(int(after.PacketsOut - before.PacketsOut + after.PacketsIn - before.PacketsIn))
	checkNativeCapture(t, pcap, script, 1)
	out, err := exec.Command("tshark", "-r", pcap, "-Y", "infiniband.mad.attributeid", "-T", "fields", "-e", "infiniband.mad.attributeid", "-e", "_ws.malformed").Output()
	if err != nil {
		t.Fatalf("tshark -r: %v", err)
	}
	attrs := map[string]int{}
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		f := strings.Split(l, "\t")
		if len(f) != 2 || f[1] != "" {
			t.Fatalf("a CM MAD Wireshark finds malformed: %q", l)
		}
		attrs[f[0]]++
	}
	// REQ, REP, RTU, DREQ, DREP twice; REJ twice.
	for attr, n := range map[string]int{"0x0010": 4, "0x0013": 2, "0x0014": 2, "0x0015": 2, "0x0016": 2, "0x0012": 2} {
		if attrs[attr] < n {
			t.Errorf("the capture has %d CM MADs of attribute %s, want %d (%v)", attrs[attr], attr, n, attrs)
		}
	}
	t.Logf("CM MADs in the capture by attribute: %v", attrs)
}

// TestNativeCMRetries: the timeouts and retries of RDMA CM over QP1, and
// hostile packets to QP1 (testdata/roce_peer.py cmhostile: cut short,
// another Q_Key, another class, a LAP, messages of comm IDs nobody has),
// dropped, counted and unanswered. A
// REQ, from a peer written by hand with scapy (testdata/roce_peer.py cm),
// to a port nobody listens on gets one REJ (invalid service ID); to a VM
// listener with native endpoints that accepts, a REP, resent after the
// REQ's local CM response timeout while the RTU does not come, 1 + the
// REQ's 2 Max CM Retries times, then a REJ (timeout), and the listener
// gets UNREACHABLE (-ETIMEDOUT) as rdma_cm gives it. The plain peer's REQ to an address whose QP1 never
// answers is sent 1 + its retries times, then its connect is UNREACHABLE.
func TestNativeCMRetries(t *testing.T) {
	script := roceScapy(t)
	peerAddr := netip.MustParseAddr("10.199.1.212")
	c, ha, ns := nativeCMHost(t, peerAddr)
	scapyCM := func(port int) string {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", script, "cm", ha.Addr().String(), peerAddr.String(), fmt.Sprint(port), "1.5").CombinedOutput()
		if err != nil {
			t.Fatalf("the scapy peer: %v\n%s", err, out)
		}
		t.Logf("scapy peer, port %d:\n%s", port, out)
		return string(out)
	}
	// Hostile packets to QP1 first: dropped and counted, unanswered, and
	// the CM goes on as before.
	before := rdmaStatus(t, ha.Socket)
	hout, err := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", script, "cmhostile", ha.Addr().String()).CombinedOutput()
	if err != nil || !strings.Contains(string(hout), "sent 6\nanswers 0\n") {
		t.Errorf("hostile packets to QP1: want 6 sent and no answer (%v):\n%s", err, hout)
	}
	after := rdmaStatus(t, ha.Socket)
	if after.Malformed-before.Malformed != 2 || after.CMIn-before.CMIn != 4 || after.CMDropped-before.CMDropped != 4 || after.BadICRC != before.BadICRC || after.Panics != 0 {
		t.Errorf("hostile packets to QP1: malformed +%d (want 2: short, wrong Q_Key), cm_in +%d and cm_dropped +%d (want 4: another class, a LAP, an RTU and a REP of nobody's), bad_icrc +%d, panics %d",
			after.Malformed-before.Malformed, after.CMIn-before.CMIn, after.CMDropped-before.CMDropped, after.BadICRC-before.BadICRC, after.Panics)
	}
	if out := scapyCM(7481); !strings.HasPrefix(out, "REJ reason 8 msg 0\nicrc: ok 1 bad 0\n") {
		t.Errorf("a REQ to a port nobody listens on: want one REJ (reason 8, of the REQ), got:\n%s", out)
	}

	vm := startNative(t, ha.Netns, "--socket", ha.Socket, "native-peer", "--vm", "nat", "--cm", "-p", "7482", "--timeout", "20s")
	vm.waitOutput(t, "listening with RDMA CM")
	before = rdmaStatus(t, ha.Socket)
	out := scapyCM(7482)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "REP qpn ") || lines[1] != lines[0] || lines[2] != lines[0] ||
		lines[3] != "REJ reason 4 msg 1" || lines[4] != "icrc: ok 4 bad 0" || strings.Contains(out, "bad comm ID") {
		t.Errorf("a REQ whose REP is never answered: want 3 REPs (1 + 2 retries) then a REJ (timeout, of the REP), got:\n%s", out)
	}
	after = rdmaStatus(t, ha.Socket)
	if after.CMResent-before.CMResent != 2 || after.CMTimedOut-before.CMTimedOut != 1 {
		t.Errorf("host A resent %d MADs and timed out %d connections, want 2 and 1", after.CMResent-before.CMResent, after.CMTimedOut-before.CMTimedOut)
	}
	if vout, err := vm.wait(t); err == nil || !strings.Contains(vout, "UNREACHABLE (status -110") {
		t.Errorf("the VM's listener after the RTU never came: %v\n%s", err, vout)
	}

	// A plain peer's REQ into a namespace where nothing answers on QP1
	// (its port 4791 swallows datagrams): 1 + 3 REQs, then UNREACHABLE.
	deaf := netip.MustParseAddr("10.199.1.213")
	dns := c.PeerNetns(t, "cn", deaf)
	sink := exec.Command("ip", "netns", "exec", dns, "/usr/bin/python3", "-c", `
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 4791))
s.settimeout(0.2)
print("bound", flush=True)
n, end = 0, time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        d = s.recv(4096)
    except socket.timeout:
        continue
    if len(d) >= 20 + 18 and d[0] == 0x64 and d[20 + 16:20 + 18] == b"\x00\x10":
        n += 1
print("REQs %d" % n)
`, deaf.String(), "6")
	var sinkOut testenv.SyncBuffer
	sink.Stdout, sink.Stderr = &sinkOut, &sinkOut
	if err := sink.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(sinkOut.String(), "bound"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the deaf listener did not start: %s", sinkOut.String())
		}
	}
	t0 := time.Now()
	peer := startNative(t, ns, "native-peer", "--address", peerAddr.String(), "--cm", "--cm-response-timeout", "16", "--cm-retries", "3",
		"-p", "7483", "--timeout", "20s", deaf.String())
	pout, err := peer.wait(t)
	took := time.Since(t0)
	if err == nil || !strings.Contains(pout, "UNREACHABLE") {
		t.Errorf("a connect to an address whose QP1 never answers: %v\n%s", err, pout)
	}
	sink.Wait()
	t.Logf("the plain peer gave up after %v:\n%s\ndeaf listener: %s", took, pout, sinkOut.String())
	if !strings.Contains(sinkOut.String(), "REQs 4\n") {
		t.Errorf("the deaf listener got %q, want 4 REQs (1 + 3 retries)", sinkOut.String())
	}
	// 4 timeouts of 4.096 µs × 2^16 (268 ms) and two packet lifetimes each.
	if took < time.Second {
		t.Errorf("the plain peer gave up after %v, before its 4 response timeouts", took)
	}
}

// nativeAgent runs vrdmad --native-peer addr in network namespace ns (a
// plain RoCEv2 peer with RDMA CM on QP1, no control plane) with VM "peer",
// and returns its socket.
func nativeAgent(t *testing.T, ns string, addr netip.Addr) string {
	t.Helper()
	dir := t.TempDir()
	sock := dir + "/s"
	d := exec.Command("ip", "netns", "exec", ns, testenv.Binary(t, "vrdmad"), "--no-control-plane", "--native-peer", addr.String(),
		"--socket", sock, "--state-dir", dir+"/state", "--host", "native")
	var out testenv.SyncBuffer
	d.Stdout, d.Stderr = &out, &out
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Process.Kill()
		d.Wait()
		if t.Failed() {
			t.Logf("vrdmad --native-peer:\n%s", out.String())
		}
	})
	vmx := testenv.VMX(testenv.VMOptions{MemMB: 64})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		def := exec.Command(testenv.Binary(t, "vrdmactl"), "--socket", sock, "vm", "define", "peer", "-")
		def.Stdin = strings.NewReader(vmx)
		o, err := def.CombinedOutput()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("define VM peer at the native peer's agent: %v\n%s\n%s", err, o, out.String())
		}
	}
	return sock
}

// TestNativeCMDropIn: unmodified programs through the drop-in, in a VM
// with native endpoints, learn the address native endpoints reach it at
// from its GID table (ibv_devinfo), and reach a native endpoint's listener
// by its IP address with rdma_cm: rping (and the native peer's rping
// reaches the VM's listener) and perftest's ib_write_bw -R. The native
// endpoint is vrdmad --native-peer, a plain RoCEv2 peer in a namespace of
// its own with no control plane, which runs the same unmodified programs
// as their servers; every connection's CM MADs cross the wire on QP1.
func TestNativeCMDropIn(t *testing.T) {
	peerAddr := netip.MustParseAddr("10.199.1.214")
	_, ha, ns := nativeCMHost(t, peerAddr)
	sock := nativeAgent(t, ns, peerAddr)
	ctl := testenv.Binary(t, "vrdmactl")
	// The adapter with native endpoints has its host's uplink address in
	// its GID table (entry 1, RoCE v2), as ibv_devinfo reads it through
	// the drop-in; the one without has no entry 1.
	uplink := "::ffff:" + ha.Addr().String()
	for vm, want := range map[string]bool{"nat": true, "plain": false} {
		out, err := exec.Command("ip", "netns", "exec", ha.Netns, ctl, "--socket", ha.Socket, "exec", "--vm", vm, "--", "ibv_devinfo", "-v").CombinedOutput()
		if err != nil {
			t.Fatalf("ibv_devinfo -v in VM %s: %v\n%s", vm, err, out)
		}
		if got := strings.Contains(string(out), "GID[  1]:\t\t"+uplink+", RoCE v2"); got != want || strings.Contains(string(out), "GID[  2]") {
			t.Errorf("ibv_devinfo -v in VM %s: GID[1] %s is %v, want %v:\n%s", vm, uplink, got, want, out)
		}
	}
	// The Go library reads the same table (Adapter.QueryGID).
	for name, native := range map[string]bool{"gidnat": true, "gidplain": false} {
		vmx := ha.VMX(testenv.VMOptions{MemMB: 16})
		if native {
			vmx += "vrdma0.nativeEndpointSupport = \"TRUE\"\n"
		}
		ad := ha.OpenVMX(t, name, vmx).Adapters()[0]
		g, err := ad.QueryGID(opCtx(t), vrdma.NativeGIDIndex)
		if native && (err != nil || netip.AddrFrom16(g).String() != uplink) || !native && !errors.Is(err, vrdma.ErrNoGID) {
			t.Errorf("VM %s: QueryGID(1) = %v, %v; want %s for native endpoints, else ErrNoGID", name, netip.AddrFrom16(g), err, uplink)
		}
		if _, err := ad.QueryGID(opCtx(t), 2); !errors.Is(err, vrdma.ErrNoGID) {
			t.Errorf("VM %s: QueryGID(2): %v, want ErrNoGID", name, err)
		}
		if g, err := ad.QueryGID(opCtx(t), 0); err != nil || g != ad.GID() {
			t.Errorf("VM %s: QueryGID(0) = %v, %v; want the adapter's GID", name, g, err)
		}
	}
	inPeer := func(args ...string) []string {
		return append([]string{"netns", "exec", ns, ctl, "--socket", sock, "exec", "--vm", "peer", "--"}, args...)
	}
	// The native peer's port MTU follows its interface's, as a RoCE NIC's
	// follows its netdev's: 4096 on the peer's veth of MTU 9000 (its
	// default, 1024, cut bandwidth to a third).
	if out, err := exec.Command("ip", inPeer("ibv_devinfo")...).CombinedOutput(); err != nil || !strings.Contains(string(out), "active_mtu:\t\t4096 (5)") {
		t.Errorf("ibv_devinfo on the native peer: %v, want active_mtu 4096:\n%s", err, out)
	}
	before := rdmaStatus(t, ha.Socket)
	inVM := func(args ...string) []string {
		return append([]string{"netns", "exec", ha.Netns, ctl, "--socket", ha.Socket, "exec", "--vm", "nat", "--"}, args...)
	}
	// run runs server srv (ip's arguments) and, once it listens, client
	// cli, and returns the client's output.
	run := func(name string, srv, cli []string) string {
		t.Helper()
		t0 := time.Now()
		s := exec.Command("ip", srv...)
		var sout testenv.SyncBuffer
		s.Stdout, s.Stderr = &sout, &sout
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Wait() }()
		defer func() {
			select {
			case <-done:
			default:
				s.Process.Kill()
				<-done
			}
		}()
		var cout []byte
		var err error
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			cout, err = exec.Command("ip", cli...).CombinedOutput()
			if err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s, the client: %v\n%s\nthe server:\n%s", name, err, cout, sout.String())
		}
		select {
		case err := <-done:
			done <- err
			if err != nil {
				t.Errorf("%s, the server: %v\n%s", name, err, sout.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s, the server still runs:\n%s", name, sout.String())
		}
		t.Logf("%s in %v", name, time.Since(t0))
		return string(cout)
	}
	pings := func(what, out string) {
		t.Helper()
		if n := strings.Count(out, "ping data: rdma-ping-"); n != 10 {
			t.Errorf("%s: %d pings, want 10:\n%s", what, n, out)
		}
	}
	pings("rping, the VM to the native peer", run("rping, the VM to the native peer",
		inPeer("rping", "-s", "-a", "0.0.0.0", "-p", "7491", "-C", "10", "-v"), inVM("rping", "-c", "-a", peerAddr.String(), "-p", "7491", "-C", "10", "-v")))
	pings("rping, the native peer to the VM", run("rping, the native peer to the VM",
		inVM("rping", "-s", "-a", "0.0.0.0", "-p", "7493", "-C", "10", "-v"), inPeer("rping", "-c", "-a", ha.Addr().String(), "-p", "7493", "-C", "10", "-v")))
	bw := []string{"ib_write_bw", "-R", "-d", "vrdma0", "-p", "7492", "-s", "65536", "-n", "500"}
	cout := run("ib_write_bw -R", inPeer(bw...), inVM(append(bw, peerAddr.String())...))
	if !strings.Contains(cout, "65536      500") {
		t.Errorf("ib_write_bw client printed no result line for 65536 bytes × 500:\n%s", cout)
	}
	t.Logf("ib_write_bw -R, the VM to the native peer:\n%s", cout)
	after := rdmaStatus(t, ha.Socket)
	if after.CMOut-before.CMOut < 4 || after.CMIn-before.CMIn < 4 || after.CMDropped != before.CMDropped {
		t.Errorf("host A's RDMA CM on QP1: before %+v, after %+v; want the connections' MADs both ways, none dropped", before, after)
	}
}
