// SPDX-License-Identifier: Apache-2.0

package rdma_test

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/transport/rdma"
)

// TestEngineWire captures the engine's packets with tshark while a
// pair runs every opcode and messages of several packets, and checks them
// with readers that are not the engine's: Wireshark's InfiniBand
// dissector decodes every packet, none malformed, with every opcode the
// traffic needs; and scapy's RoCE layer (python3-scapy) computes the same
// ICRC as the one on the wire, packet by packet — which also checks the
// IPv4 header the engine predicts (DF; ID 0, or k for the k-th packet of
// a batch) against what the kernel sent. The same on IPv6, where scapy
// has no ICRC and the script computes it with zlib's CRC-32.
//
// The engine batches packets with UDP GSO; on a device that offloads UDP
// segmentation, as loopback does, the capture point sees a batch before
// it is cut, so the test runs in a namespace whose loopback has the
// offload off: the kernel cuts every batch before the capture, and each
// captured packet is one a wire would carry. Its receiving engine then
// gets the packets one by one, with the IDs it cannot see.
func TestEngineWire(t *testing.T) {
	for _, addr := range []string{"127.0.33.9:4791", "[::1]:4791"} {
		t.Run(addr, func(t *testing.T) { testEngineWire(t, netip.MustParseAddrPort(addr), rcTraffic, wantEveryOpcode) })
	}
}

// rcTraffic is TestEngineWire's: every RC opcode and messages of several
// packets between two VMs of the agent.
func rcTraffic(t *testing.T, ctx context.Context, v1, v2 *vrdma.VM) {
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{BufSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if got := p.Path().Path; got != vrdma.PathRDMA {
		t.Fatalf("path %q, want rdma", got)
	}
	for _, r := range p.CheckOpcodes(ctx) {
		if r.Err != nil {
			t.Errorf("%s: %v", r.Opcode, r.Err)
		}
	}
	for _, c := range []perf.Config{{Test: perf.WriteBW, Size: 5000, Iters: 8}, {Test: perf.ReadBW, Size: 5000, Iters: 8}, {Test: perf.SendBW, Size: 5000, Iters: 8}} {
		if _, err := p.Run(ctx, c); err != nil {
			t.Fatalf("%s: %v", c.Test.Title(""), err)
		}
	}
}

// testEngineWire is TestEngineWire with the engine on wireAddr, on the
// loopback interface of a namespace of the test's own, the traffic
// between two VMs of the agent traffic's, and the opcodes the capture
// must hold want's.
func testEngineWire(t *testing.T, wireAddr netip.AddrPort, traffic func(t *testing.T, ctx context.Context, v1, v2 *vrdma.VM),
	want func(t *testing.T, opcodes map[int]int, what string, n int)) {
	if os.Geteuid() != 0 {
		t.Skip("capturing packets needs root (CI runs as root)")
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (apt-get install tshark)")
	}
	for _, tool := range []string{"ethtool", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (apt-get install ethtool nftables)", tool)
		}
	}
	const python = "/usr/bin/python3" // Debian's, with python3-scapy
	if err := exec.Command(python, "-c", "import scapy.contrib.roce").Run(); err != nil {
		t.Skipf("scapy's RoCE layer is not importable by %s (apt-get install python3-scapy): %v", python, err)
	}
	v6 := wireAddr.Addr().Is6()
	ns := testenv.NewNetns(t)
	if out, err := ns.Command("ethtool", "-K", "lo", "tx-udp-segmentation", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K lo tx-udp-segmentation off: %v: %s", err, out)
	}
	// The socket priority: nftables counts what leaves for UDP 4791, and
	// what of it has priority 3 (the port group's).
	nft := ns.Command("nft", "-f", "-")
	nft.Stdin = strings.NewReader(`table inet vrdmatest {
	chain out {
		type filter hook output priority 0;
		udp dport 4791 meta priority 0:3 counter
		udp dport 4791 counter
	}
}`)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	var conn rdma.Conn
	if err := ns.Run(func() (err error) { conn, err = rdma.ListenUDP(wireAddr); return err }); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pcap := filepath.Join(dir, "rdma.pcap")
	var stderr bytes.Buffer
	capture := ns.Command(tshark, "-i", "lo", "-f", "udp", "-w", pcap, "-q")
	capture.Stderr = &stderr
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { capture.Process.Kill(); capture.Wait() })
	// The capture is live once a probe (UDP to the discard port of the
	// engine's address) shows in its file.
	var probe *net.UDPConn
	if err := ns.Run(func() (err error) {
		probe, err = net.ListenUDP("udp", &net.UDPAddr{IP: wireAddr.Addr().AsSlice()})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	count := func(filter string) int {
		out, _ := exec.Command(tshark, "-r", pcap, "-Y", filter, "-T", "fields", "-e", "frame.number").Output()
		return len(strings.Fields(string(out)))
	}
	for deadline := time.Now().Add(30 * time.Second); count("udp.dstport == 9") == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("tshark captured none of its probes: %s", stderr.String())
		}
		probe.WriteToUDP([]byte("probe"), &net.UDPAddr{IP: wireAddr.Addr().AsSlice(), Port: 9})
	}

	const dscp, prio = 26, 3
	// The agent's engine runs on the namespace's socket (the one it opens
	// itself, in the host's namespace, is closed unused).
	env := testenv.StartWith(t, testenv.Options{RDMALoop: netip.MustParseAddrPort("127.0.33.10:4791"), RDMALoopDSCP: dscp, RDMALoopPrio: prio,
		RDMALoopConn: func(c rdma.Conn) rdma.Conn { c.Close(); return conn }})
	v1, v2 := env.Open(t, "w1", testenv.VMOptions{}), env.Open(t, "w2", testenv.VMOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	traffic(t, ctx, v1, v2)
	// Every packet the engine sent is in the capture before it stops
	// (dumpcap writes as it goes; a loaded machine may lag).
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(ctx)
	a.Close()
	if err != nil || len(st.RDMA) != 1 {
		t.Fatalf("status: %v %+v", err, st.RDMA)
	}
	sent := int(st.RDMA[0].PacketsOut)
	rules, err := ns.Command("nft", "list", "table", "inet", "vrdmatest").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, rules)
	}
	// Counted before the kernel cuts batches: one per sendmsg.
	if c := nftCounters(string(rules)); len(c) != 2 || c[0] == 0 || c[0] != c[1] {
		t.Errorf("of the sends to UDP 4791, nftables counts %v with priority %d and in all (want them equal, not 0): %s", c, prio, rules)
	}
	captured := 0
	for deadline := time.Now().Add(20 * time.Second); captured < sent && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		captured = count("udp.port == 4791")
	}
	capture.Process.Signal(syscall.SIGINT)
	capture.Wait()
	if captured < sent {
		t.Fatalf("the capture holds %d packets, the engine sent %d (tshark: %s)", captured, sent, stderr.String())
	}

	// Wireshark: every packet is InfiniBand, none malformed.
	dscpField := "ip.dsfield.dscp"
	if v6 {
		dscpField = "ipv6.tclass.dscp"
	}
	out, err := exec.Command(tshark, "-r", pcap, "--disable-protocol", "rpcordma", "-Y", "udp.port == 4791", "-T", "fields", "-E", "separator=,",
		"-e", "frame.protocols", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed", "-e", dscpField, "-e", "ip.id").Output()
	if err != nil {
		t.Fatalf("tshark -r: %v", err)
	}
	opcodes := map[int]int{}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	cut := 0 // packets with a non-zero IP ID: cut from a batch by the kernel
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) < 5 || !strings.Contains(f[0], "infiniband") || f[2] != "" {
			t.Fatalf("a packet Wireshark does not decode as InfiniBand, or malformed: %q", l)
		}
		if f[3] != strconv.Itoa(dscp) {
			t.Fatalf("a packet carries DSCP %q, want the port group's %d: %q", f[3], dscp, l)
		}
		if f[4] != "0x0000" && f[4] != "" {
			cut++
		}
		op, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("packet %q: opcode %q", l, f[1])
		}
		opcodes[op]++
	}
	want(t, opcodes, "packet", len(lines))

	// scapy: the ICRC of every packet.
	script := `
import sys, zlib
from scapy.all import rdpcap, raw, IPv6
from scapy.contrib.roce import BTH

def icrc6(pkt):
    b = bytearray(raw(pkt[IPv6])[:-4])
    b[0] |= 0x0f                        # traffic class
    b[1] = b[2] = b[3] = b[7] = 0xff    # traffic class, flow label; hop limit
    b[46] = b[47] = 0xff                # UDP checksum
    b[52] = 0xff                        # BTH: FECN, BECN, reserved
    return (zlib.crc32(b"\xff" * 8 + bytes(b)) & 0xffffffff).to_bytes(4, "little")

n = bad = 0
for pkt in rdpcap(sys.argv[1]):
    if BTH not in pkt:
        continue
    n += 1
    want = raw(pkt)[-4:]
    if IPv6 in pkt:
        got = icrc6(pkt)
    else:
        again = pkt.copy()
        again[BTH].icrc = None
        got = raw(again)[-4:]
    if got != want:
        bad += 1
print(n, bad)
`
	res, err := exec.Command(python, "-c", script, pcap).CombinedOutput()
	if err != nil {
		t.Fatalf("scapy: %v: %s", err, res)
	}
	f := strings.Fields(string(res))
	if len(f) != 2 || f[0] != strconv.Itoa(len(lines)) || f[1] != "0" {
		t.Fatalf("scapy checked the ICRC of %q packets and found %q wrong; want %d and 0 (%s)", f[0], f[1], len(lines), res)
	}
	if st.RDMA[0].BatchesOut == 0 || cut == 0 && !v6 {
		t.Fatalf("the engine sent %d batches, the capture has %d packets cut from one: want both > 0", st.RDMA[0].BatchesOut, cut)
	}
	t.Logf("%d packets (from %d batches; %d with a non-zero IPv4 ID), opcodes %v: Wireshark decodes them all, every ICRC checks",
		len(lines), st.RDMA[0].BatchesOut, cut, opcodes)
}

// nftCounters are the packet counts of the counters in nft's listing,
// in order.
func nftCounters(listing string) []int {
	var n []int
	for _, l := range strings.Split(listing, "\n") {
		_, rest, ok := strings.Cut(l, "counter packets ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.Atoi(f[0]); err == nil {
			n = append(n, v)
		}
	}
	return n
}

// wantEveryOpcode fails t unless opcodes (counts by BTH opcode, of n
// captured packets or frames) has every opcode the test's traffic needs:
// SEND (first, middle, last, only, only with immediate), WRITE (the
// same), READ request and responses, atomics and their ACK, ACK.
func wantEveryOpcode(t *testing.T, opcodes map[int]int, what string, n int) {
	t.Helper()
	for _, op := range []int{0x00, 0x01, 0x02, 0x04, 0x05, 0x06, 0x07, 0x08, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14} {
		if opcodes[op] == 0 {
			t.Errorf("no %s with opcode 0x%02x in the capture (%d %ss; opcodes %v)", what, op, n, what, opcodes)
		}
	}
}
