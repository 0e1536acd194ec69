// SPDX-License-Identifier: Apache-2.0

package rocewire

import (
	"bytes"
	"encoding/hex"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestXRCOpcodes checks the XRC opcode table against RC's: every RC
// opcode has its XRC form (bits 101), named XRC_…, with RC's headers and
// payload rule; a request's adds the XRCETH, a response's does not.
func TestXRCOpcodes(t *testing.T) {
	n := 0
	for op := SendFirst; op <= SendOnlyWithInvalidate; op++ {
		rc, ok := op.Info()
		if !ok {
			continue
		}
		x, ok := (XRC | op).Info()
		if !ok {
			t.Errorf("%s has no XRC form", op)
			continue
		}
		n++
		want := rc.Headers
		extra := 0
		if rc.Request {
			want |= HasXRCETH
			extra = XRCETHLen
		}
		if x.Name != "XRC_"+rc.Name || x.Headers != want || x.Payload != rc.Payload || x.Position != rc.Position || x.Request != rc.Request ||
			x.RecvWQE != rc.RecvWQE || x.Completes != rc.Completes {
			t.Errorf("XRC form of %s is %+v", op, x)
		}
		if HeaderLen(XRC|op) != HeaderLen(op)+extra {
			t.Errorf("%s: headers of %d bytes, want %d", XRC|op, HeaderLen(XRC|op), HeaderLen(op)+extra)
		}
		if (XRC|op).Transport() != XRC || (XRC|op).Operation() != op {
			t.Errorf("%s: transport 0x%x, operation %s", XRC|op, uint8((XRC | op).Transport()), (XRC | op).Operation())
		}
	}
	if n != 23 { // RC's 0x00..0x14, 0x16, 0x17
		t.Errorf("%d XRC opcodes, want 23", n)
	}
	if _, ok := Opcode(0xb5).Info(); ok {
		t.Error("0xb5 (XRC's reserved 0x15) is known")
	}
}

// xrcVectors are XRC packets byte for byte (BTH, XRCETH, the RC headers,
// payload and pad; ICRC space zero), as IBTA 9.2 lays them out.
var xrcVectors = []struct {
	name string
	hex  string
	op   Opcode
	srqn uint32
	rc   Opcode
}{
	{"XRC_SEND_ONLY", "a420ffff 00000012 80000064 00abcdef 68690000 00000000", XRC | SendOnly, 0xabcdef, SendOnly},
	{"XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "ab00ffff 00000013 80000065 00000102 00007f00 00001000 cafef00d 00000004 deadbeef 01020304 00000000",
		XRC | RDMAWriteOnlyWithImmediate, 0x102, RDMAWriteOnlyWithImmediate},
	{"XRC_RDMA_READ_REQUEST", "ac00ffff 00000014 00000066 00fffffe 00007f00 00002000 0000abcd 00010000 00000000", XRC | RDMAReadRequest, 0xfffffe, RDMAReadRequest},
	{"XRC_COMPARE_SWAP", "b300ffff 00000015 80000067 00000001 00007f00 00003000 0000abcd 00000000 00000002 00000000 00000001 00000000",
		XRC | CompareSwap, 1, CompareSwap},
	{"XRC_ACKNOWLEDGE", "b100ffff 00000016 00000068 1f000005 00000000", XRC | Acknowledge, 0, Acknowledge},
	{"XRC_ACKNOWLEDGE", "b100ffff 00000017 00000069 61000006 00000000", XRC | Acknowledge, 0, Acknowledge}, // a NAK: Invalid Request
}

// TestXRCVectors parses each vector: its XRCETH names the SRQ, its RC
// headers follow it, and StripXRC leaves the RC packet the RC code serves.
func TestXRCVectors(t *testing.T) {
	for _, v := range xrcVectors {
		b := unhex(t, v.hex)
		var p Packet
		if err := Parse(b, 1024, &p); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		if p.BTH.Opcode() != v.op || p.Info.Name != v.name {
			t.Errorf("%s: opcode %s", v.name, p.BTH.Opcode())
		}
		if p.Info.Request != (p.XRCETH != nil) {
			t.Errorf("%s: XRCETH %x on a packet with Request %v", v.name, []byte(p.XRCETH), p.Info.Request)
		}
		switch v.rc {
		case RDMAWriteOnlyWithImmediate:
			if p.RETH.VA() != 0x7f0000001000 || p.RETH.RKey() != 0xcafef00d || p.ImmDt.Imm() != 0xdeadbeef || !bytes.Equal(p.Payload, []byte{1, 2, 3, 4}) {
				t.Errorf("%s: RETH %x ImmDt %x payload %x", v.name, []byte(p.RETH), []byte(p.ImmDt), p.Payload)
			}
		case CompareSwap:
			if p.AtomicETH.VA() != 0x7f0000003000 || p.AtomicETH.SwapAdd() != 2 || p.AtomicETH.Compare() != 1 {
				t.Errorf("%s: AtomicETH %x", v.name, []byte(p.AtomicETH))
			}
		case SendOnly:
			if string(p.Payload) != "hi" || len(p.Pad) != 2 {
				t.Errorf("%s: payload %q pad %d", v.name, p.Payload, len(p.Pad))
			}
		}
		srqn, ok := p.StripXRC()
		if !ok || srqn != v.srqn || p.BTH.Opcode() != v.rc || p.Info != ops[v.rc] {
			t.Errorf("%s: StripXRC = 0x%x, %v; opcode %s", v.name, srqn, ok, p.BTH.Opcode())
		}
		if _, ok := p.StripXRC(); ok {
			t.Errorf("%s: stripped twice", v.name)
		}
	}
	// The encoder writes the reserved bits zero and keeps 24 bits.
	x := make(XRCETH, XRCETHLen)
	x.Encode(0xff123456)
	if hex.EncodeToString(x) != "00123456" || x.SRQN() != 0x123456 {
		t.Errorf("XRCETH encodes 0xff123456 as %x", []byte(x))
	}
}

// TestXRCTshark has Wireshark's dissector read XRC packets vrdma writes:
// it must name each XRC opcode and read the BTH, and find nothing
// malformed. Wireshark 4.0 (Debian 12's) does not dissect the headers
// after an XRC BTH: it shows them, with the payload and ICRC, as
// "vendor specific" data (its last such field holds them all), which
// must be exactly the bytes vrdma wrote; the ICRC is checked with
// VerifyICRC on the same frames.
func TestXRCTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (apt-get install tshark): the wire check needs Wireshark's dissector")
	}
	var frames [][]byte
	for _, v := range xrcVectors {
		frames = append(frames, frame(t, unhex(t, v.hex)))
	}
	path := filepath.Join(t.TempDir(), "xrc.pcap")
	writePcap(t, path, frames)
	out, err := exec.Command(tshark, "-r", path, "--disable-protocol", "rpcordma", "-Y", "infiniband", "-T", "fields", "-E", "separator=,", "-E", "occurrence=l",
		"-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn", "-e", "infiniband.vendor", "-e", "_ws.malformed").Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr(err))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(xrcVectors) {
		t.Fatalf("tshark decoded %d RoCEv2 packets of %d:\n%s", len(lines), len(xrcVectors), out)
	}
	for i, l := range lines {
		f := strings.Split(l, ",")
		tp := frames[i][14+IPv4HeaderLen+UDPHeaderLen:]
		b := BTH(tp)
		rest := hex.EncodeToString(tp[BTHLen:])
		if len(f) != 5 || f[0] != strconv.Itoa(int(b.Opcode())) || f[1] != "0x"+hex.EncodeToString(tp[5:8]) || f[2] != strconv.Itoa(int(b.PSN())) || f[3] != rest || f[4] != "" {
			t.Errorf("%s: tshark read %q; want opcode %d, destqp 0x%s, psn %d, vendor data %s, not malformed",
				xrcVectors[i].name, l, uint8(b.Opcode()), hex.EncodeToString(tp[5:8]), b.PSN(), rest)
		}
		ip := frames[i][14 : 14+IPv4HeaderLen]
		udp := frames[i][14+IPv4HeaderLen : 14+IPv4HeaderLen+UDPHeaderLen]
		if ok, err := VerifyICRC(ip, udp, tp); !ok || err != nil {
			t.Errorf("%s: ICRC does not verify: %v", xrcVectors[i].name, err)
		}
	}
}
