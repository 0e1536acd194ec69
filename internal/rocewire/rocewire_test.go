// SPDX-License-Identifier: Apache-2.0

package rocewire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestICRCVectors checks the two public vectors of the brief (§3.2): a
// CNP captured on a ConnectX-4 Lx, and scapy's UC SEND_ONLY with pad
// bytes; and an RC SEND_ONLY_WITH_INVALIDATE (IETH 0x80000107, 9 bytes
// and 3 pad bytes, solicited) whose ICRC scapy's RoCE layer computed.
func TestICRCVectors(t *testing.T) {
	for _, v := range []struct {
		name          string
		ip, udp, rest string
		want          uint32
		wire          string
	}{
		{"ConnectX-4 Lx CNP", "45c2003c718c400040119161 0a001101 0a001201", "000012b700280000",
			"8100ffff4000011800000000 00000000000000000000000000000000", 0x2A00FD82, "82fd002a"},
		{"scapy UC SEND_ONLY", "45010040047840004011b4d5c0a80007c0a80007", "c00012b7002caca2",
			"2460ffff000000d300cf1710 4630818be28935d90e9a95505401be885e500000", 0xF353F378, "78f353f3"},
		{"scapy RC SEND_ONLY_WITH_INVALIDATE", "4568003c123440004011a6b5c0a80007c0a80008", "c00012b700285268",
			"17b0ffff0000001280abcdef 800001077672646d612d696e76000000", 0x1B2E2228, "28222e1b"},
	} {
		t.Run(v.name, func(t *testing.T) {
			ip, udp, rest := unhex(t, v.ip), unhex(t, v.udp), unhex(t, v.rest)
			got, err := ICRC(ip, udp, rest)
			if err != nil || got != v.want {
				t.Fatalf("ICRC = %#08x, %v; want %#08x", got, err, v.want)
			}
			pkt := append(bytes.Clone(rest), 0, 0, 0, 0)
			if err := PutICRC(ip, udp, pkt); err != nil {
				t.Fatal(err)
			}
			if w := hex.EncodeToString(pkt[len(pkt)-4:]); w != v.wire {
				t.Fatalf("wire bytes %s, want %s", w, v.wire)
			}
			// Routers may change what is masked; nothing else.
			ip2, udp2, pkt2 := bytes.Clone(ip), bytes.Clone(udp), bytes.Clone(pkt)
			ip2[1], ip2[8], ip2[10], udp2[6], pkt2[4] = 0x0a, 1, 0x12, 0x34, 0x80|pkt2[4]
			if ok, err := VerifyICRC(ip2, udp2, pkt2); !ok || err != nil {
				t.Fatalf("a remarked TOS, TTL, checksums or FECN broke the ICRC: %v %v", ok, err)
			}
			for _, c := range []struct {
				what string
				b    []byte
				i    int
			}{{"IPv4 ID", ip2, 4}, {"IPv4 flags", ip2, 6}, {"UDP length", udp2, 5}, {"BTH PSN", pkt2, 11}, {"payload", pkt2, 14}} {
				c.b[c.i] ^= 1
				if ok, _ := VerifyICRC(ip2, udp2, pkt2); ok {
					t.Errorf("a flipped bit in the %s went unnoticed", c.what)
				}
				c.b[c.i] ^= 1
			}
		})
	}
}

func TestICRCIPv6Masks(t *testing.T) {
	ip := make([]byte, IPv6HeaderLen)
	ip[0] = 0x60
	ip[6], ip[7] = 17, 64
	udp := []byte{0xc0, 0x00, 0x12, 0xb7, 0, 24, 0, 0}
	pkt := make([]byte, BTHLen+ICRCLen)
	BTH(pkt).Encode(&BTHFields{Opcode: Acknowledge, PKey: DefaultPKey, DestQP: 17, PSN: 5})
	if err := PutICRC(ip, udp, pkt); err != nil {
		t.Fatal(err)
	}
	ip[0], ip[1], ip[3], ip[7] = 0x6b, 0xcd, 0x01, 3 // traffic class, flow label, hop limit
	if ok, _ := VerifyICRC(ip, udp, pkt); !ok {
		t.Fatal("IPv6 traffic class, flow label or hop limit is inside the ICRC")
	}
	ip[5] ^= 1 // payload length
	if ok, _ := VerifyICRC(ip, udp, pkt); ok {
		t.Fatal("the IPv6 payload length is outside the ICRC")
	}
	if _, err := ICRC(ip[:39], udp, pkt); err == nil {
		t.Fatal("a 39-byte IP header was accepted")
	}
}

func TestICRCAllocs(t *testing.T) {
	ip := unhex(t, "45010040047840004011b4d5c0a80007c0a80007")
	udp := unhex(t, "c00012b7002caca2")
	pkt := append(unhex(t, "2460ffff000000d300cf1710 4630818be28935d90e9a95505401be885e500000"), 0, 0, 0, 0)
	if n := testing.AllocsPerRun(100, func() { PutICRC(ip, udp, pkt) }); n != 0 {
		t.Fatalf("PutICRC allocates %.0f times", n)
	}
}

// TestHeaderSizes checks HeaderLen against the brief's table (§2.3).
func TestHeaderSizes(t *testing.T) {
	for op, want := range map[Opcode]int{
		SendFirst: 12, SendLastWithImmediate: 16, RDMAWriteFirst: 28, RDMAWriteOnlyWithImmediate: 32,
		RDMAReadRequest: 28, RDMAReadResponseMiddle: 12, RDMAReadResponseOnly: 16, Acknowledge: 16,
		AtomicAcknowledge: 24, CompareSwap: 40, FetchAdd: 40, SendOnlyWithInvalidate: 16, UDSendOnly: 20,
		UDSendOnlyWithImmediate: 24, CNP: 12,
	} {
		if got := HeaderLen(op); got != want {
			t.Errorf("%s: headers %d bytes, want %d", op, got, want)
		}
	}
	// UC's are RC's SEND and RDMA WRITE opcodes with transport 001.
	for op, want := range map[Opcode]int{UC | SendFirst: 12, UC | SendOnlyWithImmediate: 16, UC | RDMAWriteFirst: 28,
		UC | RDMAWriteOnlyWithImmediate: 32} {
		if got := HeaderLen(op); got != want || op.Operation().Transport() != 0 || op.Transport() != UC {
			t.Errorf("%s: headers %d bytes, want %d", op, got, want)
		}
	}
	if HeaderLen(UC|RDMAReadRequest) != 0 || HeaderLen(UC|Acknowledge) != 0 || HeaderLen(0x44) != 0 || HeaderLen(0x15) != 0 {
		t.Error("UC READ or ACK, RD or reserved opcodes have a header length")
	}
	if s := (UC | SendOnly).String(); s != "UC_SEND_ONLY" {
		t.Errorf("0x24 is %q, want UC_SEND_ONLY", s)
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	b := make(BTH, BTHLen)
	f := BTHFields{Opcode: RDMAWriteLast, Solicited: true, PadCount: 3, PKey: 0x8001, BECN: true, DestQP: 0xabcdef, AckReq: true, PSN: 0xfedcba}
	b.Encode(&f)
	if b.Opcode() != f.Opcode || !b.Solicited() || b.MigReq() || b.PadCount() != 3 || b.TVer() != 0 || b.PKey() != 0x8001 ||
		b.FECN() || !b.BECN() || b.DestQP() != 0xabcdef || !b.AckReq() || b.PSN() != 0xfedcba {
		t.Fatalf("BTH round trip: % x", []byte(b))
	}
	b.Encode(&BTHFields{DestQP: 0xff123456, PSN: 0xff000001})
	if b.DestQP() != 0x123456 || b.PSN() != 1 || b.AckReq() || b[4] != 0 || b[8] != 0 {
		t.Fatalf("BTH: values beyond 24 bits leak into other fields: % x", []byte(b))
	}
	r := make(RETH, RETHLen)
	r.Encode(0x0102030405060708, 0xa1b2c3d4, 1<<31)
	if r.VA() != 0x0102030405060708 || r.RKey() != 0xa1b2c3d4 || r.DMALen() != 1<<31 {
		t.Fatal("RETH round trip")
	}
	a := make(AETH, AETHLen)
	a.Encode(RNRNak(14), 0x1ffffff)
	if a.Syndrome().Kind() != KindRNR || a.Syndrome().Value() != 14 || a.MSN() != 0xffffff {
		t.Fatal("AETH round trip")
	}
	if !ACK.Valid() || ACK.Kind() != KindACK || NAK(NAKRemAccess) != 0x62 || !NAK(NAKInvRDReq).Valid() || NAK(5).Valid() || Syndrome(0x40).Valid() || Syndrome(0x80).Valid() {
		t.Fatal("syndromes")
	}
	at := make(AtomicETH, AtomicETHLen)
	at.Encode(0x1000, 7, 0x1111222233334444, 0x5555666677778888)
	if at.VA() != 0x1000 || at.RKey() != 7 || at.SwapAdd() != 0x1111222233334444 || at.Compare() != 0x5555666677778888 {
		t.Fatal("AtomicETH round trip")
	}
	d := make(DETH, DETHLen)
	d.Encode(0x80010000, 0xff000001)
	if d.QKey() != 0x80010000 || d.SrcQP() != 1 || d[4] != 0 {
		t.Fatal("DETH round trip")
	}
	for n, want := range map[int]uint8{0: 0, 1: 3, 2: 2, 3: 1, 4: 0, 1025: 3} {
		if PadCount(n) != want {
			t.Errorf("PadCount(%d) = %d, want %d", n, PadCount(n), want)
		}
	}
}

// build encodes a transport packet of op with n payload bytes (pattern)
// and a zero ICRC.
func build(op Opcode, n int) []byte {
	pad := int(PadCount(n))
	b := make([]byte, HeaderLen(op)+n+pad+ICRCLen)
	BTH(b).Encode(&BTHFields{Opcode: op, PadCount: uint8(pad), PKey: DefaultPKey, DestQP: 0x11, PSN: 7})
	if i, _ := op.Info(); i.Headers&HasAETH != 0 {
		off := HeaderLen(op) - AETHLen
		if i.Headers&HasAtomicAckETH != 0 {
			off -= AtomicAckETHLen
		}
		AETH(b[off:]).Encode(ACK, 1)
	}
	for i := range n {
		b[HeaderLen(op)+i] = byte(i + 1)
	}
	return b
}

func TestParse(t *testing.T) {
	var p Packet
	for op, info := range ops {
		n := map[Payload]int{PayloadNone: 0, PayloadFull: 1024, PayloadLast: 3, PayloadOnly: 0, PayloadFixed16: 16}[info.Payload]
		b := build(op, n)
		if err := Parse(b, 1024, &p); err != nil {
			t.Errorf("%s with %d bytes: %v", op, n, err)
			continue
		}
		if len(p.Payload) != n || p.BTH.Opcode() != op || (info.Headers&HasRETH != 0) != (p.RETH != nil) || (info.Headers&HasAETH != 0) != (p.AETH != nil) {
			t.Errorf("%s: parsed %+v", op, p)
		}
		if n > 0 && p.Payload[0] != 1 {
			t.Errorf("%s: payload starts at the wrong byte", op)
		}
	}
	bad := []struct {
		name, why string
		b         []byte
		mtu       int
	}{
		{"short", "shorter than a BTH", make([]byte, 15), 0},
		{"unknown opcode", "not an opcode", build(SendOnly, 0), 0},
		{"tver", "version 1", build(SendOnly, 0), 0},
		{"middle shorter than the MTU", "exactly the path MTU", build(SendMiddle, 1020), 1024},
		{"last empty", "1 to 1024", build(SendLast, 0), 1024},
		{"only beyond the MTU", "at most the path MTU", build(RDMAWriteOnly, 1028), 1024},
		{"payload on an ACK", "no payload", build(Acknowledge, 4), 0},
		{"reserved syndrome", "reserved", build(Acknowledge, 0), 0},
		{"not a whole number of words", "pad bytes", func() []byte { b := build(SendOnly, 5); return b[:len(b)-1] }(), 0},
		{"headers cut", "shorter than its headers", build(RDMAReadRequest, 0)[:20], 0},
		{"bad MTU", "path MTU 1000", build(SendOnly, 0), 1000},
		{"NAK in a read response", "carries an ACK syndrome", func() []byte {
			b := build(RDMAReadResponseOnly, 4)
			b[BTHLen] = byte(NAK(NAKRemAccess))
			return b
		}(), 0},
		{"WRITE_ONLY shorter than its RETH", "the RETH says", func() []byte {
			b := build(RDMAWriteOnly, 8)
			RETH(b[BTHLen:]).Encode(0x1000, 1, 1<<30)
			return b
		}(), 0},
		{"pad beyond the body", "pad count 3", func() []byte { b := build(RDMAReadResponseMiddle, 0); b[1] |= 3 << 4; return b }(), 0},
	}
	bad[1].b[0] = 0x44      // RD SEND_ONLY
	bad[2].b[1] |= 1        // TVer 1
	bad[7].b[BTHLen] = 0x40 // syndrome kind 2
	for _, c := range bad {
		err := Parse(c.b, c.mtu, &p)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.why)
		}
	}
	// The IETH is where the table says: the SEND_ONLY_WITH_INVALIDATE of
	// TestICRCVectors.
	b := unhex(t, "17b0ffff0000001280abcdef800001077672646d612d696e7600000028222e1b")
	if err := Parse(b, 1024, &p); err != nil || p.IETH.RKey() != 0x80000107 || string(p.Payload) != "vrdma-inv" || !p.BTH.Solicited() || p.ImmDt != nil {
		t.Fatalf("SEND_ONLY_WITH_INVALIDATE: %v %+v", err, p)
	}
	// ATOMIC_WRITE (0x1d): BTH, RETH (VA, R_Key, DMA length 8), the 8
	// bytes, the ICRC (not checked by Parse), byte for byte.
	aw := unhex(t, "1d 00 ff ff 00 00 00 12 80 00 00 07"+
		" 00 00 7f 00 12 34 50 08 00 00 04 04 00 00 00 08"+
		" 88 77 66 55 44 33 22 11"+
		" 00 00 00 00")
	if err := Parse(aw, 1024, &p); err != nil || p.Info.Name != "ATOMIC_WRITE" || p.RETH.VA() != 0x7f0012345008 ||
		p.RETH.RKey() != 0x404 || p.RETH.DMALen() != 8 || binary.LittleEndian.Uint64(p.Payload) != 0x1122334455667788 ||
		!p.BTH.AckReq() || p.BTH.PSN() != 7 {
		t.Fatalf("ATOMIC_WRITE: %v %+v", err, p)
	}
	// ImmDt and AtomicETH are where the table says.
	b = build(SendOnlyWithImmediate, 2)
	binary.BigEndian.PutUint32(b[BTHLen:], 0xdeadbeef)
	if err := Parse(b, 1024, &p); err != nil || p.ImmDt.Imm() != 0xdeadbeef || len(p.Pad) != 2 {
		t.Fatalf("SEND_ONLY_WITH_IMMEDIATE: %v %+v", err, p)
	}
}
