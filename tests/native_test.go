// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// roceScapy checks that Debian's python3 has scapy's RoCE layer, which the
// independent peer (testdata/roce_peer.py) is written with.
func roceScapy(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import scapy.contrib.roce").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import scapy.contrib.roce (%v: %s): apt-get install -y python3-scapy", py, err, out)
	}
	script, err := filepath.Abs("testdata/roce_peer.py")
	if err != nil {
		t.Fatal(err)
	}
	return script
}

// nativePeerNetns makes a network namespace for a peer that is not a
// vrdma host (prefix "ne"), joined to cluster c's bridge at address addr.
func nativePeerNetns(t *testing.T, c *testenv.Cluster, addr netip.Addr) string {
	t.Helper()
	return c.PeerNetns(t, "ne", addr)
}

// rdmaStatus returns the RoCE v2 engine's status of the agent at socket.
func rdmaStatus(t *testing.T, socket string) vrdma.RDMAStatus {
	t.Helper()
	a, err := vrdma.DialAgent(opCtx(t), vrdma.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st, err := a.Status(opCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.RDMA {
		if r.RoCE == "v2" {
			return r
		}
	}
	t.Fatalf("the agent at %s has no RoCE v2 engine: %+v", socket, st.RDMA)
	return vrdma.RDMAStatus{}
}

// TestNativeIsolation: an adapter without native endpoints never answers
// a peer that is not a vrdma host of its switch. A RoCEv2 peer written
// with scapy, in a namespace of its own on the hosts' network, sends real
// packets (valid ICRC) to a connected QP of a VM on host B: a SEND, an
// RDMA WRITE into a registered region (with its real rkey), an RDMA READ
// and a UD SEND. Host B's engine drops all four unanswered and counts
// them (not_vrdma, shown by vrdmactl status), the QP completes nothing
// and the region is unchanged; the same kind of packet from host A (a
// vrdma host) to a QPN that is not bound is counted as no_qp instead.
func TestNativeIsolation(t *testing.T) {
	script := roceScapy(t)
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, RDMA: true, Netns: testenv.NetnsOn})
	s := &suite{env: &rdmaEnv{tcpEnv{c: c, prefix: "ni"}}, how: connOOB}
	a, b := s.pair(t, pairConfig{})
	hb := c.Hosts[1]
	if b.vm.Host() != hb.Name {
		a, b = b, a
	}
	mr := b.mr(t, 4096, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite|vrdma.AccessRemoteRead)
	copy(mr.Bytes(), bytes.Repeat([]byte{0x5a}, 4096))
	postRecv(t, b.qp, vrdma.RecvWR{ID: 1, SGL: sgl(mr.SGE(0, 4096))})
	peerAddr := netip.MustParseAddr("10.199.1.200") // on testenv.ClusterSubnet, no host's
	ns := nativePeerNetns(t, c, peerAddr)

	before := rdmaStatus(t, hb.Socket)
	out, err := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", script, "isolation", hb.Addr().String(),
		fmt.Sprint(b.qp.QPN()), fmt.Sprint(a.qp.Endpoint().PSN), fmt.Sprint(mr.Addr()), fmt.Sprint(mr.RKey()), "1.5").CombinedOutput()
	if err != nil {
		t.Fatalf("the scapy peer: %v\n%s", err, out)
	}
	t.Logf("scapy peer:\n%s", out)
	if !strings.Contains(string(out), "sent 4\n") || !strings.Contains(string(out), "answers 0\n") || !strings.Contains(string(out), "echo replies 1\n") {
		t.Errorf("the peer that is not a vrdma host was answered, did not send its 4 packets, or did not hear host B at all (echo replies):\n%s", out)
	}
	after := rdmaStatus(t, hb.Socket)
	if got := after.NotVRDMA - before.NotVRDMA; got != 4 {
		t.Errorf("host B counted %d packets from a peer that is not a vrdma host, want 4 (before %+v, after %+v)", got, before, after)
	}
	// The ICRC is checked first: the packets were well formed, and no
	// other counter took them.
	if after.BadICRC != before.BadICRC || after.Malformed != before.Malformed || after.NoQP != before.NoQP {
		t.Errorf("the peer's packets were counted elsewhere: before %+v, after %+v", before, after)
	}
	expectNoWC(t, b.rcq, 3*quiet, "a SEND from a peer that is not a vrdma host")
	if !bytes.Equal(mr.Bytes(), bytes.Repeat([]byte{0x5a}, 4096)) {
		t.Errorf("an RDMA WRITE from a peer that is not a vrdma host changed the region")
	}
	text, err := exec.Command(testenv.Binary(t, "vrdmactl"), "--socket", hb.Socket, "status").CombinedOutput()
	if want := fmt.Sprintf("%d dropped from peers that are not vrdma hosts of the switch", after.NotVRDMA); err != nil || !strings.Contains(string(text), want) {
		t.Errorf("vrdmactl status does not say %q (%v):\n%s", want, err, text)
	}

	// From host A, a vrdma host of the switch, to a QPN that no QP facing
	// A has: no_qp, not not_vrdma.
	before = after
	if out, err := c.Hosts[0].Exec("/usr/bin/python3", script, "isolation", hb.Addr().String(), "0xfffff0", "0", "0", "0", "0.5"); err != nil {
		t.Fatalf("the scapy peer on host A: %v\n%s", err, out)
	}
	after = rdmaStatus(t, hb.Socket)
	if after.NotVRDMA != before.NotVRDMA || after.NoQP-before.NoQP != 3 {
		t.Errorf("packets from host A to an unbound QPN: not_vrdma %d -> %d (want unchanged), no_qp %d -> %d (want +3: the UD one goes to the datagram checks)",
			before.NotVRDMA, after.NotVRDMA, before.NoQP, after.NoQP)
	}

	// The pair still works: nothing of the above disturbed it.
	src := a.mr(t, 64, vrdma.AccessLocalWrite)
	copy(src.Bytes(), "a real peer")
	postSend(t, a.qp, vrdma.SendWR{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 11))})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 2, vrdma.WCSuccess, vrdma.WCSend)
	if w := waitWC(t, b.rcq, 1)[0]; w.Status != vrdma.WCSuccess || w.ByteLen != 11 || !bytes.HasPrefix(mr.Bytes(), []byte("a real peer")) {
		t.Errorf("the pair after the peer's packets: %+v, region %q", w, mr.Bytes()[:11])
	}
}

// nativeSide is one vrdmactl native-peer run, in network namespace ns.
type nativeSide struct {
	cmd  *exec.Cmd
	out  testenv.SyncBuffer
	done chan error
}

// startNative starts vrdmactl native-peer args in network namespace ns.
func startNative(t *testing.T, ns string, args ...string) *nativeSide {
	t.Helper()
	s := &nativeSide{done: make(chan error, 1)}
	s.cmd = exec.Command("ip", append([]string{"netns", "exec", ns, testenv.Binary(t, "vrdmactl")}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.done
		s.done <- nil
	})
	return s
}

// wait waits for the run to end and returns its output and exit error.
func (s *nativeSide) wait(t *testing.T) (string, error) {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
		return s.out.String(), err
	case <-time.After(60 * time.Second):
		t.Fatalf("vrdmactl %v still runs after 60s:\n%s", s.cmd.Args, s.out.String())
		return "", nil
	}
}

// nativeCapture starts tshark on eth0 of namespace ns (the plain peer's
// at addr) and returns the capture file once it is live (a probe from host
// h shows in it), and stop, which ends it once it holds a number of
// RoCEv2 packets.
func nativeCapture(t *testing.T, ns string, h *testenv.Host, addr netip.Addr) (string, func(int)) {
	t.Helper()
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is missing: apt-get install -y tshark")
	}
	pcap := filepath.Join(t.TempDir(), "native.pcap")
	var stderr testenv.SyncBuffer
	capture := exec.Command("ip", "netns", "exec", ns, tshark, "-i", "eth0", "-f", "udp", "-w", pcap, "-q")
	capture.Stderr = &stderr
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	count := func(filter string) int {
		out, _ := exec.Command(tshark, "-r", pcap, "-Y", filter, "-T", "fields", "-e", "frame.number").Output()
		return len(strings.Fields(string(out)))
	}
	// stop ends the capture once it holds want RoCEv2 packets (dumpcap
	// writes as it goes; a loaded machine may lag), or after 20 s.
	stop := func(want int) {
		if stopped {
			return
		}
		stopped = true
		for deadline := time.Now().Add(20 * time.Second); count("udp.port == 4791") < want && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
		capture.Process.Signal(os.Interrupt)
		capture.Wait()
	}
	t.Cleanup(func() { stop(0) })
	probe, err := h.Dial(opCtx(t), "udp", netip.AddrPortFrom(addr, 9).String())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	for deadline := time.Now().Add(30 * time.Second); count("udp.dstport == 9") == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("tshark captured none of its probes: %s", stderr.String())
		}
		probe.Write([]byte("probe"))
	}
	return pcap, stop
}

// checkNativeCapture checks the RoCEv2 packets of capture pcap: Wireshark
// decodes every one as InfiniBand, none malformed, every operation of a
// native-peer run (runs of them) is there, and scapy finds every ICRC
// right.
func checkNativeCapture(t *testing.T, pcap, script string, runs int) {
	t.Helper()
	out, err := exec.Command("tshark", "-r", pcap, "--disable-protocol", "rpcordma", "-Y", "udp.port == 4791", "-T", "fields", "-E", "separator=,",
		"-e", "frame.protocols", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed").Output()
	if err != nil {
		t.Fatalf("tshark -r: %v", err)
	}
	opcodes := map[string]int{}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) < 3 || !strings.Contains(f[0], "infiniband") || f[2] != "" {
			t.Fatalf("a packet Wireshark does not decode as InfiniBand, or malformed: %q", l)
		}
		opcodes[f[1]]++
	}
	// SEND_ONLY; RDMA_WRITE_FIRST and _LAST_WITH_IMMEDIATE (4096 bytes at an
	// MTU of 1024); RDMA_READ_REQUEST, RDMA_READ_RESPONSE_FIRST and _LAST;
	// ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE, COMPARE_SWAP, FETCH_ADD
	for _, op := range []string{"4", "6", "9", "12", "13", "15", "17", "18", "19", "20"} {
		if opcodes[op] < runs {
			t.Errorf("the capture has %d packets of opcode %s, want at least %d (opcodes %v)", opcodes[op], op, runs, opcodes)
		}
	}
	res, err := exec.Command("/usr/bin/python3", script, "icrc", pcap).CombinedOutput()
	if want := fmt.Sprintf("icrc: ok %d bad 0\n", len(lines)); err != nil || string(res) != want {
		t.Errorf("scapy on the capture: %q (%v), want %q", res, err, want)
	}
	t.Logf("capture: %d RoCEv2 packets, opcodes %v: Wireshark decodes them all, every ICRC checks", len(lines), opcodes)
}

// TestNativePeer: vrdmactl native-peer --address, vrdma's RoCEv2 engine on
// its own in a namespace of its own (no agent, no control plane), runs
// SEND/RECV, RDMA WRITE with immediate, RDMA READ, compare and swap and
// fetch and add against a VM adapter with native endpoints on host A, both
// as the side that runs them and as the side they run against; an adapter
// without native endpoints cannot reach it.
func TestNativePeer(t *testing.T) {
	script := roceScapy(t)
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 1, RDMA: true, Netns: testenv.NetnsOn})
	ha := c.Hosts[0]
	ctl := testenv.Binary(t, "vrdmactl")
	if out, err := exec.Command(ctl, "--etcd-endpoints", c.Endpoint(), "host", "configure", ha.Name, "--pvrdma-namespaces", "on").CombinedOutput(); err != nil {
		t.Fatalf("host configure --pvrdma-namespaces on: %v\n%s", err, out)
	}
	ha.DefineVMX(t, "nat", ha.VMX(testenv.VMOptions{MemMB: 16})+"vrdma0.nativeEndpointSupport = \"TRUE\"\n")
	ha.DefineVMX(t, "plain", ha.VMX(testenv.VMOptions{MemMB: 16}))
	peerAddr := netip.MustParseAddr("10.199.1.201")
	ns := nativePeerNetns(t, c, peerAddr)
	ops := []string{"SEND", "RDMA_WRITE_WITH_IMM", "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"}
	check := func(what, out string, err error, active bool) {
		t.Helper()
		if err != nil || !strings.Contains(out, "all checks passed") {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		for _, op := range ops {
			if strings.Contains(out, op) != active {
				t.Errorf("%s: %s in the output is %v, want %v:\n%s", what, op, !active, active, out)
			}
		}
		t.Logf("%s:\n%s", what, out)
	}

	before := rdmaStatus(t, ha.Socket)
	pcap, stopCapture := nativeCapture(t, ns, ha, peerAddr)
	// The plain peer listens; the VM's side connects and runs everything.
	peer := startNative(t, ns, "native-peer", "--address", peerAddr.String(), "--timeout", "45s")
	vm := startNative(t, ha.Netns, "--socket", ha.Socket, "native-peer", "--vm", "nat", "--timeout", "45s", peerAddr.String())
	out, err := vm.wait(t)
	pout, perr := peer.wait(t)
	check("the plain peer, passive", pout, perr, false)
	check("the VM's side, active", out, err, true)

	mid := rdmaStatus(t, ha.Socket)
	stopCapture(int(mid.PacketsOut - before.PacketsOut + mid.PacketsIn - before.PacketsIn))
	checkNativeCapture(t, pcap, script, 1)

	// The other way round: the VM's side listens on host A, the plain peer
	// connects to it and runs everything.
	vm = startNative(t, ha.Netns, "--socket", ha.Socket, "native-peer", "--vm", "nat", "--timeout", "45s", "-p", "18516")
	peer = startNative(t, ns, "native-peer", "--address", peerAddr.String(), "--timeout", "45s", "-p", "18516", ha.Addr().String())
	out, err = peer.wait(t)
	vout, verr := vm.wait(t)
	check("the VM's side, passive", vout, verr, false)
	check("the plain peer, active", out, err, true)

	// Host A's engine carried it all, and took none of the plain peer's
	// packets for a stranger's: the QPs faced its address.
	after := rdmaStatus(t, ha.Socket)
	if after.NotVRDMA != before.NotVRDMA || after.NoQP != before.NoQP || after.PacketsIn-before.PacketsIn < 10 || after.PacketsOut-before.PacketsOut < 10 {
		t.Errorf("host A's engine: before %+v, after %+v; want packets both ways and none dropped", before, after)
	}

	// An adapter without native endpoints cannot reach the plain peer: its
	// GID is no vrdma adapter's.
	peer = startNative(t, ns, "native-peer", "--address", peerAddr.String(), "--timeout", "5s", "-p", "18517")
	vm = startNative(t, ha.Netns, "--socket", ha.Socket, "native-peer", "--vm", "plain", "--timeout", "20s", "-p", "18517", peerAddr.String())
	out, err = vm.wait(t)
	if err == nil || !strings.Contains(out, "not attached on any host") {
		t.Errorf("an adapter without native endpoints reached the plain peer (%v):\n%s", err, out)
	}
	peer.wait(t)
}

// TestNativeScapyPeer: a second plain peer, written independently of the
// engine with scapy (testdata/roce_peer.py rc), is the requester of an RC
// QP of a VM adapter with native endpoints: its SEND lands in the VM's
// receive, its RDMA WRITE in the VM's region, its RDMA READ returns the
// region's bytes, and a WRITE with a wrong rkey is NAKed (remote access
// error) and writes nothing; every answer's ICRC checks.
func TestNativeScapyPeer(t *testing.T) {
	script := roceScapy(t)
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 1, RDMA: true, Netns: testenv.NetnsOn})
	ha := c.Hosts[0]
	if out, err := exec.Command(testenv.Binary(t, "vrdmactl"), "--etcd-endpoints", c.Endpoint(), "host", "configure", ha.Name, "--pvrdma-namespaces", "on").CombinedOutput(); err != nil {
		t.Fatalf("host configure --pvrdma-namespaces on: %v\n%s", err, out)
	}
	vm := ha.OpenVMX(t, "scapynat", ha.VMX(testenv.VMOptions{MemMB: 16})+"vrdma0.nativeEndpointSupport = \"TRUE\"\n")
	peerAddr := netip.MustParseAddr("10.199.1.202")
	ns := nativePeerNetns(t, c, peerAddr)
	e := newEnd(t, vm, qpConfig{})
	mr := e.mr(t, 4096, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite|vrdma.AccessRemoteRead)
	m := mr.Bytes()
	for i := range 64 {
		m[256+i] = byte(0xa0 + i)
	}
	const peerQPN, peerPSN = 0x123456, 0x100
	if err := e.qp.ConnectTo(opCtx(t), vrdma.Endpoint{GID: vrdma.GID(netip.AddrFrom4(peerAddr.As4()).As16()), QPN: peerQPN, PSN: peerPSN, MTU: 1024}); err != nil {
		t.Fatal(err)
	}
	if p := e.qp.Path(); p.Path != vrdma.PathRDMA || !strings.Contains(p.Reason, "native endpoint 10.199.1.202") {
		t.Errorf("the QP's path: %+v; want rdma to native endpoint 10.199.1.202", p)
	}
	postRecv(t, e.qp, vrdma.RecvWR{ID: 7, SGL: sgl(mr.SGE(1024, 1024))})

	out, err := exec.Command("ip", "netns", "exec", ns, "/usr/bin/python3", script, "rc", ha.Addr().String(),
		fmt.Sprint(e.qp.QPN()), fmt.Sprint(mr.Addr()), fmt.Sprint(mr.RKey()), fmt.Sprint(peerQPN), fmt.Sprint(peerPSN)).CombinedOutput()
	t.Logf("scapy peer:\n%s", out)
	if err != nil {
		t.Fatalf("the scapy peer: %v", err)
	}
	want := make([]byte, 64)
	copy(want, m[256:320])
	for _, line := range []string{"send: ACK\n", "write: ACK\n", fmt.Sprintf("read: %x\n", want), "badkey: NAK 0x62\n"} {
		if !strings.Contains(string(out), line) {
			t.Errorf("the scapy peer did not see %q", strings.TrimSpace(line))
		}
	}
	if !strings.Contains(string(out), "icrc: ok ") || !strings.Contains(string(out), " bad 0\n") || strings.Contains(string(out), "icrc: ok 0 ") {
		t.Errorf("the answers' ICRCs did not all check")
	}
	w := waitWC(t, e.rcq, 1)[0]
	if w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCRecv || w.ByteLen != uint32(len("scapy send")) || string(m[1024:1024+w.ByteLen]) != "scapy send" {
		t.Errorf("the VM's receive: %+v, %q", w, m[1024:1034])
	}
	for i := range 64 {
		if m[i] != byte(0x30+i*3) {
			t.Fatalf("the VM's region after the scapy peer's WRITE: %x", m[:64])
		}
	}
}
