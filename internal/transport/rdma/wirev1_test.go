// SPDX-License-Identifier: Apache-2.0

package rdma_test

import (
	"bytes"
	"context"
	"encoding/binary"
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

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestEngineWireV1 runs RoCE v1 between two hosts in network namespaces
// joined by veths through a bridge, captures the frames on host A's
// switch port with tshark while a pair runs every opcode and messages of
// several packets, UD datagrams and SENDs with invalidate, and checks
// them with readers that are not the engine's: Wireshark decodes every frame as InfiniBand over Ethertype
// 0x8915, none malformed, with every opcode the traffic needs, the port
// group's PFC priority as the 802.1Q PCP and its DSCP as the GRH traffic
// class; and a Python script computes every frame's ICRC with zlib's
// CRC-32 over the masked GRH (scapy computes no RoCE v1 ICRC). Then it
// sends host B hostile frames from host A's namespace and checks that
// each is dropped and counted as it should be. Twice: a port group of
// VLAN 0 (its frames carry a priority tag) and of VLAN 100 (the bridge
// forwards the tag; the receiving hosts have no VLAN interface, so their
// kernel classes the frames as for another host, and the engine checks
// the destination MAC itself).
func TestEngineWireV1(t *testing.T) {
	for _, vid := range []int{0, 100} {
		t.Run("vid"+strconv.Itoa(vid), func(t *testing.T) { testEngineWireV1(t, vid) })
	}
}

func testEngineWireV1(t *testing.T, vid int) {
	if os.Geteuid() != 0 {
		t.Skip("RoCE v1 frames and their capture need root (CI runs as root)")
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (apt-get install tshark)")
	}
	const python = "/usr/bin/python3" // Debian's, with python3-scapy (for rdpcap)
	if err := exec.Command(python, "-c", "import scapy.all").Run(); err != nil {
		t.Skipf("scapy is not importable by %s (apt-get install python3-scapy): %v", python, err)
	}
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, RDMA: true, RoCEVersion: records.RoCEv1, Netns: testenv.NetnsOn, VLAN: vid})
	ha, hb := c.Hosts[0], c.Hosts[1]
	macA, macB := hostMAC(t, ha), hostMAC(t, hb)

	dir := t.TempDir()
	pcap := filepath.Join(dir, "rocev1.pcap")
	var stderr bytes.Buffer
	port := "v" + ha.Name // host A's switch port (testenv's naming)
	capture := exec.Command("ip", "netns", "exec", c.SwitchNetns(), tshark, "-i", port, "-f", "ether proto 0x8915 or vlan", "-F", "pcap", "-w", pcap, "-q")
	capture.Stderr = &stderr
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { capture.Process.Kill(); capture.Wait() })
	count := func(filter string) int {
		out, _ := exec.Command(tshark, "-r", pcap, "-Y", filter, "-T", "fields", "-e", "frame.number").Output()
		return len(strings.Fields(string(out)))
	}
	// The capture is live once a probe frame (RoCE v1 Ethertype, to a
	// MAC nobody has) shows in its file.
	probe := make([]byte, 60)
	copy(probe, []byte{0x02, 0, 0, 0, 0, 0x99})
	copy(probe[6:], macA[:])
	binary.BigEndian.PutUint16(probe[12:], rocewire.EtherTypeRoCE)
	for deadline := time.Now().Add(30 * time.Second); count("eth.dst == 02:00:00:00:00:99") == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("tshark captured none of its probes: %s", stderr.String())
		}
		inject(t, ha, probe)
	}

	// The socket priority: nftables counts on host A's interface the
	// RoCE v1 frames that leave, and those of priority 3 (the port
	// group's PFC priority).
	nft := exec.Command("ip", "netns", "exec", ha.Netns, "nft", "-f", "-")
	nft.Stdin = strings.NewReader(`table netdev vrdmatest {
	chain out {
		type filter hook egress device "` + ha.Link + `" priority 0;
		meta protocol 0x8915 meta priority 0:3 counter
		meta protocol 0x8915 counter
	}
}`)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	// The probes reached B too (the bridge floods them): what B counts
	// from here on is the pair's.
	baseA, baseB := v1Status(t, ha), v1Status(t, hb)
	const pairFrames = "(eth.type == 0x8915 || vlan.etype == 0x8915) && eth.dst != 02:00:00:00:00:99"
	vmA, vmB := ha.Open(t, "w1", testenv.VMOptions{}), hb.Open(t, "w2", testenv.VMOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, vmA.Adapters()[0], vmB.Adapters()[0], perf.PairConfig{BufSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Path(); got.Path != vrdma.PathRDMA || !strings.Contains(got.Reason, "RoCE v1") {
		t.Fatalf("path %q (%s), want rdma over RoCE v1", got.Path, got.Reason)
	}
	for _, r := range p.CheckOpcodes(ctx) {
		if r.Err != nil {
			t.Errorf("%s: %v", r.Opcode, r.Err)
		}
	}
	// Messages of three packets and more at the path MTU (4096 on the
	// cluster's MTU of 9000): first, middle and last.
	for _, cf := range []perf.Config{{Test: perf.WriteBW, Size: 10000, Iters: 8}, {Test: perf.ReadBW, Size: 10000, Iters: 8}, {Test: perf.SendBW, Size: 10000, Iters: 8}} {
		if _, err := p.Run(ctx, cf); err != nil {
			t.Fatalf("%s: %v", cf.Test.Title(""), err)
		}
	}
	// UD datagrams between the two hosts (ud_wire_test.go): UD_SEND_ONLY
	// and UD_SEND_ONLY_WITH_IMMEDIATE frames.
	udTraffic(t, ctx, vmA, vmB, 14)
	// SEND with invalidate (wire_mw_test.go): SEND_LAST_WITH_INVALIDATE
	// and SEND_ONLY_WITH_INVALIDATE frames with their IETH.
	mwTraffic(t, ctx, vmA, vmB)
	p.Close(context.Background())
	stA, stB := v1Status(t, ha), v1Status(t, hb)
	rules, err := exec.Command("ip", "netns", "exec", ha.Netns, "nft", "list", "table", "netdev", "vrdmatest").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, rules)
	}
	if c := nftCounters(string(rules)); len(c) != 2 || c[1] != int(stA.PacketsOut) || c[0] != c[1] {
		t.Errorf("of host A's RoCE v1 frames, nftables counts %v with priority 3 and in all; want both %d: %s", c, stA.PacketsOut, rules)
	}
	sent := int(stA.PacketsOut + stB.PacketsOut)
	captured := 0
	for deadline := time.Now().Add(20 * time.Second); captured < sent && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		captured = count(pairFrames)
	}
	capture.Process.Signal(syscall.SIGINT)
	capture.Wait()
	if captured < sent {
		t.Fatalf("the capture holds %d frames, the engines sent %d (tshark: %s)", captured, sent, stderr.String())
	}
	if drops := func(s mgmt.RDMAStatus) uint64 { return s.BadICRC + s.Malformed + s.NoQP }; drops(stA) != drops(baseA) || drops(stB) != drops(baseB) {
		t.Fatalf("the engines dropped frames of each other's: %+v %+v", stA, stB)
	}

	// Wireshark: every frame is InfiniBand over Ethertype 0x8915, none
	// malformed, tagged with PCP 3 and the VID (0: a priority tag), between the
	// two uplinks' MACs and GIDs, traffic class DSCP 26 << 2.
	out, err := exec.Command(tshark, "-r", pcap, "--disable-protocol", "rpcordma", "-Y", pairFrames, "-T", "fields", "-E", "separator=,",
		"-e", "frame.protocols", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed", "-e", "vlan.priority", "-e", "vlan.id",
		"-e", "infiniband.grh.tclass", "-e", "infiniband.grh.nxthdr", "-e", "eth.src", "-e", "eth.dst", "-e", "infiniband.grh.sgid", "-e", "infiniband.grh.dgid").Output()
	if err != nil {
		t.Fatalf("tshark -r: %v", err)
	}
	macs := map[string]bool{net.HardwareAddr(macA[:]).String(): true, net.HardwareAddr(macB[:]).String(): true}
	gids := map[string]bool{"::ffff:" + ha.Addr().String(): true, "::ffff:" + hb.Addr().String(): true}
	opcodes := map[int]int{}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) < 11 || !strings.HasPrefix(f[0], "eth:ethertype:vlan:ethertype:infiniband") || f[2] != "" {
			t.Fatalf("a frame Wireshark does not decode as tagged InfiniBand over Ethernet, or malformed: %q", l)
		}
		if f[3] != "3" || f[4] != strconv.Itoa(vid) || f[5] != strconv.Itoa(26<<2) || f[6] != "27" {
			t.Fatalf("a frame with PCP %s, VID %s, traffic class %s, next header %s; want 3, %d, %d, 27: %q", f[3], f[4], f[5], f[6], vid, 26<<2, l)
		}
		if !macs[f[7]] || !macs[f[8]] || f[7] == f[8] || !gids[f[9]] || !gids[f[10]] || f[9] == f[10] {
			t.Fatalf("a frame not between the uplinks' MACs %v and GIDs %v: %q", macs, gids, l)
		}
		op, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("frame %q: opcode %q", l, f[1])
		}
		opcodes[op]++
	}
	wantEveryOpcode(t, opcodes, "frame", len(lines))
	if opcodes[0x16] == 0 || opcodes[0x17] == 0 {
		t.Errorf("%d SEND_LAST_WITH_INVALIDATE and %d SEND_ONLY_WITH_INVALIDATE frames, want both > 0 (opcodes %v)", opcodes[0x16], opcodes[0x17], opcodes)
	}
	if opcodes[0x64] != 7 || opcodes[0x65] != 7 {
		t.Errorf("%d UD_SEND_ONLY and %d UD_SEND_ONLY_WITH_IMMEDIATE frames, want 7 each (opcodes %v)", opcodes[0x64], opcodes[0x65], opcodes)
	}
	// The ICRC of every frame, computed from the brief's rules alone.
	res, err := exec.Command(python, "-c", testenv.ICRCv1Script, pcap).CombinedOutput()
	if err != nil {
		t.Fatalf("ICRC script: %v: %s", err, res)
	}
	f := strings.Fields(string(res))
	if len(f) != 2 || f[0] != strconv.Itoa(len(lines)) || f[1] != "0" {
		t.Fatalf("the script checked the ICRC of %q frames and found %q wrong; want %d and 0 (%s)", f[0], f[1], len(lines), res)
	}
	t.Logf("%d frames, opcodes %v: Wireshark decodes them all as InfiniBand over Ethertype 0x8915, every ICRC checks", len(lines), opcodes)

	t.Run("hostile", func(t *testing.T) { testHostileFrames(t, ha, hb, macA, macB, uint16(vid)) })
}

// testHostileFrames sends host B frames from host A's namespace that a
// RoCE v1 receiver must drop, and checks B's counters: each is counted
// where it should be, none is served, the engine keeps running.
func testHostileFrames(t *testing.T, ha, hb *testenv.Host, macA, macB [6]byte, vid uint16) {
	gidA, gidB := netip.MustParseAddr("::ffff:"+ha.Addr().String()).As16(), netip.MustParseAddr("::ffff:"+hb.Addr().String()).As16()
	// A well-formed ACKNOWLEDGE from A to B, with its ICRC.
	frame := func(mod func(eth, grh, tp []byte)) []byte {
		b := rocewire.EthHeader(make([]byte, 128), macB, macA, true, rocewire.TCI(3, vid))
		tp := make([]byte, rocewire.BTHLen+rocewire.AETHLen+rocewire.ICRCLen)
		rocewire.BTH(tp).Encode(&rocewire.BTHFields{Opcode: rocewire.Acknowledge, PKey: rocewire.DefaultPKey, DestQP: 0x77, PSN: 5})
		rocewire.AETH(tp[rocewire.BTHLen:]).Encode(rocewire.ACK, 1)
		grh := make([]byte, rocewire.GRHLen)
		rocewire.GRH(grh).Encode(&rocewire.GRHFields{TClass: 104, HopLimit: 64, PayLen: uint16(len(tp)), SGID: gidA, DGID: gidB})
		if err := rocewire.PutICRCGRH(grh, tp); err != nil {
			t.Fatal(err)
		}
		eth := b
		if mod != nil {
			mod(eth, grh, tp)
		}
		return append(append(bytes.Clone(eth), grh...), tp...)
	}
	before := v1Status(t, hb)
	cases := []struct {
		name                      string
		b                         []byte
		in, icrc, malformed, noQP uint64
	}{
		{"well formed, to no QP", frame(nil), 1, 0, 0, 1},
		{"bad ICRC", frame(func(_, _, tp []byte) { tp[len(tp)-1] ^= 1 }), 1, 1, 0, 0},
		{"a covered bit flipped", frame(func(_, _, tp []byte) { tp[9] ^= 0x10 }), 1, 1, 0, 0},
		{"PayLen beyond the frame", frame(func(_, g, _ []byte) { rocewire.GRH(g).SetPayLen(200) }), 1, 0, 1, 0},
		{"PayLen shorter than a BTH and an ICRC", frame(func(_, g, _ []byte) { rocewire.GRH(g).SetPayLen(12) }), 1, 0, 1, 0},
		{"PayLen short of the ICRC", frame(func(_, g, _ []byte) { rocewire.GRH(g).SetPayLen(18) }), 1, 1, 0, 0},
		{"truncated", frame(nil)[:rocewire.EthHeaderLen+rocewire.VLANTagLen+rocewire.GRHLen+10], 1, 0, 1, 0},
		{"not a GRH (IP version 4)", frame(func(_, g, _ []byte) { g[0] = 0x45 }), 1, 0, 1, 0},
		{"next header UDP", frame(func(_, g, _ []byte) { g[6] = 17 }), 1, 0, 1, 0},
		{"another DGID", frame(func(_, g, _ []byte) { g[39] ^= 1 }), 1, 0, 0, 1},
		{"unknown opcode", frame(func(_, g, tp []byte) { tp[0] = 0x1f; rocewire.PutICRCGRH(g, tp) }), 1, 0, 1, 0},
		// The kernel hands an ETH_P_IBOE socket nothing else: these never
		// reach the engine.
		{"IPv4 Ethertype", frame(func(eth, _, _ []byte) { binary.BigEndian.PutUint16(eth[16:], 0x0800) }), 0, 0, 0, 0},
		// The bridge floods a frame to a MAC it has not learnt: B's socket
		// sees it, as not addressed to it.
		{"RoCE v1 Ethertype in a frame to another MAC", frame(func(eth, _, _ []byte) { eth[5] ^= 1 }), 1, 0, 0, 1},
	}
	var want struct{ in, icrc, malformed, noQP uint64 }
	for _, c := range cases {
		inject(t, ha, c.b)
		want.in += c.in
		want.icrc += c.icrc
		want.malformed += c.malformed
		want.noQP += c.noQP
	}
	var st mgmt.RDMAStatus
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st = v1Status(t, hb)
		if st.PacketsIn-before.PacketsIn >= want.in || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(200 * time.Millisecond) // anything more would have come by now
	st = v1Status(t, hb)
	got := [4]uint64{st.PacketsIn - before.PacketsIn, st.BadICRC - before.BadICRC, st.Malformed - before.Malformed, st.NoQP - before.NoQP}
	if exp := [4]uint64{want.in, want.icrc, want.malformed, want.noQP}; got != exp {
		t.Fatalf("host B counted (in, bad ICRC, malformed, no QP) %v of the hostile frames, want %v", got, exp)
	}
	if st.PacketsOut != before.PacketsOut {
		t.Errorf("host B answered hostile frames: %d packets out", st.PacketsOut-before.PacketsOut)
	}
	t.Logf("%d hostile frames: host B counted %v (in, bad ICRC, malformed, no QP)", len(cases), got)
}

// hostMAC is the MAC of host h's interface.
func hostMAC(t *testing.T, h *testenv.Host) [6]byte {
	var mac [6]byte
	if err := h.Do(func() error {
		ifc, err := net.InterfaceByName(h.Link)
		if err == nil {
			mac = [6]byte(ifc.HardwareAddr)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// inject sends frame b whole on host h's interface.
func inject(t *testing.T, h *testenv.Host, b []byte) {
	t.Helper()
	if err := h.Do(func() error {
		ifc, err := net.InterfaceByName(h.Link)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, b, 0, &unix.SockaddrLinklayer{Ifindex: ifc.Index})
	}); err != nil {
		t.Fatalf("inject a frame from %s: %v", h.Name, err)
	}
}

// v1Status is the status of host h's RoCE v1 engine.
func v1Status(t *testing.T, h *testenv.Host) mgmt.RDMAStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(h.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.RDMA {
		if r.RoCE == "v1" {
			return r
		}
	}
	t.Fatalf("%s has no RoCE v1 engine: %+v", h.Name, st.RDMA)
	return mgmt.RDMAStatus{}
}
