// SPDX-License-Identifier: Apache-2.0

package rocewire

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// frame wraps transport packet tp (ICRC space included) in Ethernet, IPv4
// (DF, ID 0, as vrdma's engine sends) and UDP to port 4791, and fills in
// the IPv4 checksum and the ICRC.
func frame(t *testing.T, tp []byte) []byte {
	t.Helper()
	eth := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00}
	ip := make([]byte, IPv4HeaderLen)
	ip[0], ip[1] = 0x45, 0
	binary.BigEndian.PutUint16(ip[2:], uint16(IPv4HeaderLen+UDPHeaderLen+len(tp)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8], ip[9] = 64, 17
	copy(ip[12:], []byte{10, 199, 0, 1, 10, 199, 0, 2})
	var sum uint32
	for i := 0; i < len(ip); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := make([]byte, UDPHeaderLen)
	binary.BigEndian.PutUint16(udp, 0xc001)
	binary.BigEndian.PutUint16(udp[2:], UDPPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(UDPHeaderLen+len(tp)))
	if err := PutICRC(ip, udp, tp); err != nil {
		t.Fatal(err)
	}
	return append(append(append(eth, ip...), udp...), tp...)
}

// writePcap writes frames as a classic pcap file (Ethernet link type).
func writePcap(t *testing.T, path string, frames [][]byte) {
	t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, 0xa1b2c3d4)
	b = binary.LittleEndian.AppendUint16(b, 2)
	b = binary.LittleEndian.AppendUint16(b, 4)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 65535)
	b = binary.LittleEndian.AppendUint32(b, 1)
	for i, f := range frames {
		b = binary.LittleEndian.AppendUint32(b, uint32(i+1))
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTshark builds one packet of each header shape and has Wireshark's
// own dissector (tshark) decode them: what vrdma writes is what a RoCE
// analyser reads.
func TestTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark is not installed (apt-get install tshark): the wire check needs Wireshark's dissector")
	}
	var pkts [][]byte
	var want []string
	add := func(tp []byte, w string) { pkts, want = append(pkts, frame(t, tp)), append(want, w) }

	p := make([]byte, HeaderLen(RDMAWriteFirst)+256+ICRCLen)
	BTH(p).Encode(&BTHFields{Opcode: RDMAWriteFirst, PKey: DefaultPKey, DestQP: 0x12, PSN: 100})
	RETH(p[BTHLen:]).Encode(0x7f0000001000, 0xabcd1234, 4096)
	add(p, "6,0x000012,100,0,0,0x00007f0000001000,0xabcd1234,4096,,,,")

	p = make([]byte, HeaderLen(SendOnlyWithImmediate)+5+3+ICRCLen)
	BTH(p).Encode(&BTHFields{Opcode: SendOnlyWithImmediate, PadCount: PadCount(5), PKey: DefaultPKey, DestQP: 0x13, AckReq: true, PSN: 0xffffff})
	ImmDt(p[BTHLen:]).Encode(0xdeadbeef)
	add(p, "5,0x000013,16777215,1,3,,,,,,deadbeef,")

	p = make([]byte, HeaderLen(Acknowledge)+ICRCLen)
	BTH(p).Encode(&BTHFields{Opcode: Acknowledge, PKey: DefaultPKey, DestQP: 0x14, PSN: 7})
	AETH(p[BTHLen:]).Encode(RNRNak(14), 9)
	add(p, "17,0x000014,7,0,0,,,,46,9,,")

	p = make([]byte, HeaderLen(AtomicAcknowledge)+ICRCLen)
	BTH(p).Encode(&BTHFields{Opcode: AtomicAcknowledge, PKey: DefaultPKey, DestQP: 0x15, PSN: 8})
	AETH(p[BTHLen:]).Encode(ACK, 10)
	AtomicAckETH(p[BTHLen+AETHLen:]).Encode(0x0102030405060708)
	// tshark prints the syndrome and the original value in decimal.
	add(p, "18,0x000015,8,0,0,,,,31,10,,72623859790382856")

	p = make([]byte, HeaderLen(Acknowledge)+ICRCLen)
	BTH(p).Encode(&BTHFields{Opcode: Acknowledge, PKey: DefaultPKey, DestQP: 0x16, PSN: 9})
	AETH(p[BTHLen:]).Encode(NAK(NAKRemAccess), 11)
	add(p, "17,0x000016,9,0,0,,,,98,11,,")

	// UC: RC's headers under UC's opcodes, no AckReq.
	p = make([]byte, HeaderLen(UC|RDMAWriteOnlyWithImmediate)+7+1+ICRCLen)
	BTH(p).Encode(&BTHFields{Opcode: UC | RDMAWriteOnlyWithImmediate, PadCount: PadCount(7), PKey: DefaultPKey, DestQP: 0x17, PSN: 10})
	RETH(p[BTHLen:]).Encode(0x7f0000002000, 0x1234abcd, 7)
	ImmDt(p[BTHLen+RETHLen:]).Encode(0xfeedf00d)
	add(p, "43,0x000017,10,0,1,0x00007f0000002000,0x1234abcd,7,,,feedf00d,")

	p = make([]byte, HeaderLen(UC|SendMiddle)+256+ICRCLen)
	BTH(p).Encode(&BTHFields{Opcode: UC | SendMiddle, PKey: DefaultPKey, DestQP: 0x18, PSN: 11})
	add(p, "33,0x000018,11,0,0,,,,,,,")

	// An atomic write's answer, a READ RESPONSE ONLY without payload.
	// (The atomic write itself, 0x1d, is not here: Wireshark 4.0 knows
	// the opcode by number only and dissects neither its RETH nor its
	// ICRC; TestParse checks its bytes.)
	p = make([]byte, HeaderLen(RDMAReadResponseOnly)+ICRCLen)
	BTH(p).Encode(&BTHFields{Opcode: RDMAReadResponseOnly, PKey: DefaultPKey, DestQP: 0x1a, PSN: 12})
	AETH(p[BTHLen:]).Encode(ACK, 12)
	add(p, "16,0x00001a,12,0,0,,,,31,12,,")

	path := filepath.Join(t.TempDir(), "rocev2.pcap")
	writePcap(t, path, pkts)
	fields := []string{"infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn", "infiniband.bth.a", "infiniband.bth.padcnt",
		"infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.aeth.syndrome", "infiniband.aeth.msn",
		"infiniband.immdt", "infiniband.atomicacketh.origremdt", "infiniband.invariant.crc"}
	lines := tsharkFields(t, tshark, path, ",", fields)
	if len(lines) != len(want) {
		t.Fatalf("tshark decoded %d RoCEv2 packets of %d:\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	for i, l := range lines {
		got := l[:strings.LastIndex(l, ",")]
		crc := l[strings.LastIndex(l, ",")+1:]
		tp := pkts[i][14+IPv4HeaderLen+UDPHeaderLen:]
		// tshark shows the ICRC's wire bytes read big-endian.
		wantCRC := fmt.Sprintf("0x%08x", binary.BigEndian.Uint32(tp[len(tp)-ICRCLen:]))
		if got != want[i] || crc != wantCRC {
			t.Errorf("packet %d: tshark read\n  %s,%s\nwant\n  %s,%s", i+1, got, crc, want[i], wantCRC)
		}
	}
}

// tsharkFields has tshark print fields of the InfiniBand packets of the
// pcap at path, sep between them, the first occurrence of each: a line
// per packet.
func tsharkFields(t *testing.T, tshark, path, sep string, fields []string) []string {
	t.Helper()
	args := []string{"-r", path, "--disable-protocol", "rpcordma", "-Y", "infiniband", "-T", "fields", "-E", "separator=" + sep, "-E", "occurrence=f"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command(tshark, args...).Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr(err))
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func stderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
