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
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/rdma/rdmatest"
)

// TestEngineWireUD captures the engine's UD packets with tshark while
// two UD QPs exchange datagrams of every size up to the MTU, SEND and
// SEND with immediate, and checks them with readers that are not the
// engine's: Wireshark decodes every packet as InfiniBand, none
// malformed, opcodes UD_SEND_ONLY (0x64) and UD_SEND_ONLY_WITH_IMMEDIATE
// (0x65) with a DETH carrying the Q_Key and the source QP; scapy's RoCE
// layer computes the same ICRC as the one on the wire, packet by packet.
// The receivers check every byte.
func TestEngineWireUD(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("capturing packets needs root (CI runs as root)")
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (apt-get install tshark)")
	}
	if _, err := exec.LookPath("ethtool"); err != nil {
		t.Skip("ethtool is not installed (apt-get install ethtool)")
	}
	const python = "/usr/bin/python3" // Debian's, with python3-scapy
	if err := exec.Command(python, "-c", "import scapy.contrib.roce").Run(); err != nil {
		t.Skipf("scapy's RoCE layer is not importable by %s (apt-get install python3-scapy): %v", python, err)
	}
	wireAddr := netip.MustParseAddrPort("127.0.33.11:4791")
	ns := testenv.NewNetns(t)
	if out, err := ns.Command("ethtool", "-K", "lo", "tx-udp-segmentation", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K lo tx-udp-segmentation off: %v: %s", err, out)
	}
	var conn rdma.Conn
	if err := ns.Run(func() (err error) { conn, err = rdma.ListenUDP(wireAddr); return err }); err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(t.TempDir(), "ud.pcap")
	var stderr bytes.Buffer
	capture := ns.Command(tshark, "-i", "lo", "-f", "udp", "-w", pcap, "-q")
	capture.Stderr = &stderr
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { capture.Process.Kill(); capture.Wait() })
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

	env := testenv.StartWith(t, testenv.Options{RDMALoop: netip.MustParseAddrPort("127.0.33.12:4791"),
		RDMALoopConn: func(c rdma.Conn) rdma.Conn { c.Close(); return conn }})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 40
	qpnA, qpnB := udTraffic(t, ctx, env.Open(t, "u1", testenv.VMOptions{}), env.Open(t, "u2", testenv.VMOptions{}), n)
	for deadline := time.Now().Add(20 * time.Second); count("udp.port == 4791") < n && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
	}
	capture.Process.Signal(syscall.SIGINT)
	capture.Wait()

	out, err := exec.Command(tshark, "-r", pcap, "--disable-protocol", "rpcordma", "-Y", "udp.port == 4791", "-T", "fields", "-E", "separator=,",
		"-e", "frame.protocols", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed", "-e", "infiniband.deth.q_key",
		"-e", "infiniband.deth.srcqp", "-e", "infiniband.bth.destqp").Output()
	if err != nil {
		t.Fatalf("tshark -r: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != n {
		t.Fatalf("the capture holds %d RoCE packets, want the %d datagrams:\n%s", len(lines), n, out)
	}
	opcodes := map[string]int{}
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) < 6 || !strings.Contains(f[0], "infiniband") || f[2] != "" {
			t.Fatalf("a packet Wireshark does not decode as InfiniBand, or malformed: %q", l)
		}
		q, err1 := strconv.ParseUint(strings.TrimPrefix(f[3], "0x"), 16, 32)
		sq, err2 := strconv.ParseUint(strings.TrimPrefix(f[4], "0x"), 16, 32)
		dq, err3 := strconv.ParseUint(strings.TrimPrefix(f[5], "0x"), 16, 32)
		if err1 != nil || err2 != nil || err3 != nil || q != udQKey || uint32(sq) != qpnA || uint32(dq) != qpnB {
			t.Fatalf("packet %q: want DETH Q_Key 0x%x, source QP 0x%x, BTH DestQP 0x%x", l, udQKey, qpnA, qpnB)
		}
		opcodes[f[1]]++
	}
	if opcodes["100"] != n/2 || opcodes["101"] != n/2 {
		t.Fatalf("opcodes %v: want %d UD_SEND_ONLY (100) and %d UD_SEND_ONLY_WITH_IMMEDIATE (101)", opcodes, n/2, n/2)
	}
	script := `
import sys
from scapy.all import rdpcap, raw
from scapy.contrib.roce import BTH

n = bad = 0
for pkt in rdpcap(sys.argv[1]):
    if BTH not in pkt:
        continue
    n += 1
    again = pkt.copy()
    again[BTH].icrc = None
    if raw(again)[-4:] != raw(pkt)[-4:]:
        bad += 1
print(n, bad)
`
	res, err := exec.Command(python, "-c", script, pcap).CombinedOutput()
	if err != nil {
		t.Fatalf("scapy: %v: %s", err, res)
	}
	if f := strings.Fields(string(res)); len(f) != 2 || f[0] != strconv.Itoa(n) || f[1] != "0" {
		t.Fatalf("scapy checked the ICRC of %q packets and found %q wrong; want %d and 0 (%s)", f[0], f[1], n, res)
	}
	t.Logf("%d UD packets, opcodes %v: Wireshark decodes them all with their DETH, every ICRC checks", n, opcodes)
}

// udQKey is the Q_Key of udTraffic's QPs.
const udQKey = 0x11111111

// udTraffic exchanges n datagrams from a UD QP of va to one of vb (every
// size up to 1024, SEND and SEND with immediate in turn), each checked
// byte for byte at the receiver, and returns the two QPNs.
func udTraffic(t *testing.T, ctx context.Context, va, vb *vrdma.VM, n int) (qpnA, qpnB uint32) {
	t.Helper()
	type side struct {
		qp       *vrdma.QP
		scq, rcq *vrdma.CQ
		pd       *vrdma.PD
		mr       *vrdma.MR
		gid      vrdma.GID
	}
	open := func(vm *vrdma.VM) *side {
		ad := vm.Adapters()[0]
		pd, err := ad.AllocPD(ctx)
		if err != nil {
			t.Fatal(err)
		}
		scq, err1 := ad.CreateCQ(ctx, 64)
		rcq, err2 := ad.CreateCQ(ctx, 64)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{Type: vrdma.QPTypeUD, SendCQ: scq, RecvCQ: rcq,
			Caps: vrdma.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.ReadyUD(ctx, udQKey); err != nil {
			t.Fatal(err)
		}
		buf, err := vm.Alloc(n*(vrdma.GRHSize+1024) + 1024)
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(ctx, buf, vrdma.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return &side{qp: qp, scq: scq, rcq: rcq, pd: pd, mr: mr, gid: ad.GID()}
	}
	a, b := open(va), open(vb)
	const slot = vrdma.GRHSize + 1024
	for i := range n {
		if err := b.qp.PostRecv([]vrdma.RecvWR{{ID: uint64(i), SGL: []vrdma.SGE{b.mr.SGE(i*slot, slot)}}}); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := a.pd.CreateAH(ctx, vrdma.AHAttr{DGID: b.gid})
	if err != nil {
		t.Fatal(err)
	}
	if p := ah.Path().Path; p != vrdma.PathRDMA {
		t.Fatalf("address handle path %q, want rdma", p)
	}
	src := a.mr.Bytes()[n*slot:]
	sizeOf := func(i int) int { return []int{0, 1, 3, 255, 256, 1021, 1024}[i%7] }
	wc := make([]vrdma.WorkCompletion, 1)
	for i := range n {
		size := sizeOf(i)
		for k := range size {
			src[k] = byte(i*31 + k)
		}
		wr := vrdma.SendWR{ID: uint64(i), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.mr.SGE(n*slot, size)},
			AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: udQKey}
		if i%2 == 1 {
			wr.Opcode, wr.Imm = vrdma.OpSendWithImm, uint32(0xabc000+i)
		}
		if err := a.qp.PostSend([]vrdma.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		if err := a.scq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if k, err := a.scq.Poll(wc); k != 1 || err != nil || wc[0].Status != vrdma.WCSuccess {
			t.Fatalf("send %d: %d %v %+v", i, k, err, wc[0])
		}
		for k := 0; k == 0; {
			if k, err = b.rcq.Poll(wc); err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				if err := b.rcq.Wait(ctx); err != nil {
					t.Fatalf("datagram %d did not arrive: %v", i, err)
				}
			}
		}
		w := wc[0]
		if w.Status != vrdma.WCSuccess || w.ByteLen != uint32(vrdma.GRHSize+size) || w.Flags&vrdma.WCGRH == 0 || w.SrcQP != a.qp.QPN() ||
			(i%2 == 1) != (w.Flags&vrdma.WCWithImm != 0) || i%2 == 1 && w.Imm != uint32(0xabc000+i) {
			t.Fatalf("datagram %d (%d bytes): completion %+v", i, size, w)
		}
		got := b.mr.Bytes()[int(w.WRID)*slot+vrdma.GRHSize:][:size]
		for k := range size {
			if got[k] != byte(i*31+k) {
				t.Fatalf("datagram %d: byte %d is 0x%x, want 0x%x", i, k, got[k], byte(i*31+k))
			}
		}
	}
	return a.qp.QPN(), b.qp.QPN()
}

// TestUDPacketsHostile injects UD packets with correct ICRCs into a
// running engine, as its peer uplink (the rdma loop's own address): one
// whose source GID is an adapter of this host is delivered, with its
// source QP and a GRH naming that GID; one whose source GID is no
// adapter's, one with another Q_Key and one to a QPN that is no UD QP are
// dropped and counted (datagrams_dropped); one too short to hold a
// source GID is malformed. The engine goes on serving.
func TestUDPacketsHostile(t *testing.T) {
	j := &injector{in: make(chan []byte, 1)}
	addr := netip.MustParseAddrPort("127.0.33.13:4791")
	env := testenv.StartWith(t, testenv.Options{RDMALoop: addr, RDMALoopConn: func(c rdma.Conn) rdma.Conn { j.Conn = c; return j }})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vm, src := env.Open(t, "h1", testenv.VMOptions{}), env.Open(t, "h2", testenv.VMOptions{})
	ad := vm.Adapters()[0]
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ad.CreateCQ(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{Type: vrdma.QPTypeUD, SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 4, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.ReadyUD(ctx, udQKey); err != nil {
		t.Fatal(err)
	}
	const slot = vrdma.GRHSize + 64
	buf, err := vm.Alloc(8 * slot)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(ctx, buf, vrdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		if err := qp.PostRecv([]vrdma.RecvWR{{ID: uint64(i), SGL: []vrdma.SGE{mr.SGE(i*slot, slot)}}}); err != nil {
			t.Fatal(err)
		}
	}
	status := func() (dropped, malformed uint64) {
		a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		st, err := a.Status(ctx)
		if err != nil || len(st.RDMA) != 1 {
			t.Fatalf("status: %v %+v", err, st.RDMA)
		}
		return st.DatagramsDropped, st.RDMA[0].Malformed
	}
	inject := func(dqpn, qkey uint32, sgid vrdma.GID, msg []byte, gidLen int) {
		pkt := make([]byte, rocewire.BTHLen+rocewire.DETHLen, 128)
		rocewire.BTH(pkt).Encode(&rocewire.BTHFields{Opcode: rocewire.UDSendOnly, PKey: rocewire.DefaultPKey, DestQP: dqpn,
			PadCount: rocewire.PadCount(gidLen + len(msg))})
		rocewire.DETH(pkt[rocewire.BTHLen:]).Encode(qkey, 0x123)
		pkt = append(pkt, sgid[:gidLen]...)
		pkt = append(pkt, msg...)
		pkt = append(pkt, make([]byte, int(rocewire.PadCount(gidLen+len(msg)))+rocewire.ICRCLen)...)
		if err := rdmatest.SealLoopback(pkt, addr.Addr()); err != nil {
			t.Fatal(err)
		}
		j.in <- pkt
		// Wake the reader: a datagram it reads after the injected one.
		probe := append(append([]byte(nil), pkt[:rocewire.BTHLen]...), 0, 0, 0, 0)
		probe[0] = byte(rocewire.CNP)
		j.Conn.WriteTo([][]byte{probe}, []rdma.Datagram{{End: 1}}, addr, rdma.Marks{})
	}
	wc := make([]vrdma.WorkCompletion, 4)
	expectNone := func(what string) {
		t.Helper()
		time.Sleep(200 * time.Millisecond)
		if n, _ := cq.Poll(wc); n != 0 {
			t.Fatalf("%s: a completion %+v", what, wc[0])
		}
	}
	dropped0, malformed0 := status()
	nobody := vrdma.GID{0xfe, 0x80, 15: 0x77}
	inject(qp.QPN(), udQKey, nobody, []byte("made-up source"), rdma.SourceGIDLen)
	expectNone("a source GID of no adapter")
	inject(qp.QPN(), udQKey+1, src.Adapters()[0].GID(), []byte("another qkey"), rdma.SourceGIDLen)
	expectNone("another Q_Key")
	inject(qp.QPN()^0x1, udQKey, src.Adapters()[0].GID(), []byte("no such QP"), rdma.SourceGIDLen)
	expectNone("a QPN that is no UD QP")
	inject(qp.QPN(), udQKey, src.Adapters()[0].GID(), nil, 8)
	expectNone("a payload shorter than the source GID")
	if dropped, malformed := status(); dropped < dropped0+3 || malformed != malformed0+1 {
		t.Fatalf("datagrams dropped %d → %d (want +3), malformed %d → %d (want +1)", dropped0, dropped, malformed0, malformed)
	}
	msg := []byte("a datagram from an adapter here!")
	inject(qp.QPN(), udQKey, src.Adapters()[0].GID(), msg, rdma.SourceGIDLen)
	if err := cq.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := cq.Poll(wc); n != 1 || wc[0].Status != vrdma.WCSuccess || wc[0].SrcQP != 0x123 || wc[0].ByteLen != uint32(vrdma.GRHSize+len(msg)) {
		t.Fatalf("the good datagram: %d completions, %+v", n, wc[0])
	}
	got := mr.Bytes()[int(wc[0].WRID)*slot:][:vrdma.GRHSize+len(msg)]
	if g, err := vrdma.ParseGRH(got); err != nil || g.SGID != src.Adapters()[0].GID() || g.DGID != ad.GID() {
		t.Fatalf("GRH %+v (%v)", g, err)
	}
	if !bytes.Equal(got[vrdma.GRHSize:], msg) {
		t.Fatalf("message %q, want %q", got[vrdma.GRHSize:], msg)
	}
}
