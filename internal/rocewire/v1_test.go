// SPDX-License-Identifier: Apache-2.0

package rocewire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"testing"
)

// The two ConnectX-captured RoCE v1 frames of the brief (Part A2, from
// scapy's test/contrib/roce.uts), without their FCS.
var v1Vectors = []struct {
	name, frame, icrc string
	op                Opcode
}{
	{"RC RDMA WRITE ONLY", "7cfe90753cd87cfe90753cd889156020000000281b4000000000000000000000ffff0f00000200000000000000000000ffff0f0000020a70ffff0000010a80a788bc000055d4c0726000000047b3000000050000000001000000e3d856bb", "e3d856bb", RDMAWriteOnly},
	{"RC ACKNOWLEDGE", "7cfe90753cd87cfe90753cd889156020000000141b4000000000000000000000ffff0f00000200000000000000000000ffff0f0000021140ffff0000010900a788c00000000525f0c038", "25f0c038", Acknowledge},
}

// TestICRCv1Vectors checks ParseFrame and the RoCE v1 ICRC against the
// vectors: the ICRC bytes as captured, the masked fields free to change,
// every other covered bit noticed, a VLAN tag not covered.
func TestICRCv1Vectors(t *testing.T) {
	for _, v := range v1Vectors {
		t.Run(v.name, func(t *testing.T) {
			b := unhex(t, v.frame)
			var f Frame
			if err := ParseFrame(b, &f); err != nil {
				t.Fatal(err)
			}
			if f.Tagged || len(f.Transport) != int(f.GRH.PayLen()) || f.GRH.TClass() != 2 || f.GRH.HopLimit() != 64 {
				t.Fatalf("frame %+v", f)
			}
			if want := [16]byte{10: 0xff, 11: 0xff, 12: 15, 15: 2}; f.GRH.SGID() != want || f.GRH.DGID() != want {
				t.Fatalf("GIDs %x %x, want ::ffff:15.0.0.2", f.GRH.SGID(), f.GRH.DGID())
			}
			var p Packet
			if err := Parse(f.Transport, 0, &p); err != nil || p.BTH.Opcode() != v.op {
				t.Fatalf("Parse: %v, opcode %s", err, p.BTH.Opcode())
			}
			var c Checksummer
			if !c.VerifyGRH(f.GRH, f.Transport) {
				t.Fatal("the captured ICRC does not verify")
			}
			pkt := bytes.Clone(f.Transport)
			clear(pkt[len(pkt)-4:])
			if err := PutICRCGRH(f.GRH, pkt); err != nil {
				t.Fatal(err)
			}
			if w := hex.EncodeToString(pkt[len(pkt)-4:]); w != v.icrc {
				t.Fatalf("ICRC bytes %s, want %s", w, v.icrc)
			}
			g := bytes.Clone(f.GRH)
			g[0], g[1], g[2], g[3], g[7] = 0x6f, 0xff, 0xff, 0xff, 1 // traffic class, flow label, hop limit
			pkt[4] ^= 0xc0                                           // FECN, BECN
			if !c.VerifyGRH(g, pkt) {
				t.Fatal("a remarked traffic class, flow label, hop limit or FECN broke the ICRC")
			}
			for _, k := range []struct {
				what string
				b    []byte
				i    int
			}{{"PayLen", g, 5}, {"NxtHdr", g, 6}, {"SGID", g, 20}, {"DGID", g, 39}, {"opcode", pkt, 0}, {"PKey", pkt, 3}, {"QPN", pkt, 7}, {"PSN", pkt, 11}, {"last byte", pkt, len(pkt) - 5}} {
				k.b[k.i] ^= 1
				if c.VerifyGRH(g, pkt) {
					t.Errorf("a flipped bit in the %s went unnoticed", k.what)
				}
				k.b[k.i] ^= 1
			}
			if g[0] ^= 0x10; c.VerifyGRH(g, pkt) {
				t.Error("a flipped bit in the IP version went unnoticed")
			}
			g[0] ^= 0x10
			// A tagged copy, padded as Ethernet may pad: the same packet.
			tagged := append(EthHeader(make([]byte, 18), f.Dst, f.Src, true, TCI(3, 100)), b[EthHeaderLen:]...)
			tagged = append(tagged, 0, 0, 0, 0, 0, 0)
			var f2 Frame
			if err := ParseFrame(tagged, &f2); err != nil || !f2.Tagged || f2.TCI != 3<<13|100 || !bytes.Equal(f2.Transport, f.Transport) || !c.VerifyGRH(f2.GRH, f2.Transport) {
				t.Fatalf("tagged: %v %+v", err, f2)
			}
		})
	}
}

func TestGRHRoundTrip(t *testing.T) {
	f := GRHFields{TClass: 0x68, FlowLabel: 0xabcde, PayLen: 1040, HopLimit: 64,
		SGID: [16]byte{0xfe, 0x80, 15: 1}, DGID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 2}}
	g := GRH(make([]byte, GRHLen))
	g.Encode(&f)
	got := GRHFields{TClass: g.TClass(), FlowLabel: g.FlowLabel(), PayLen: g.PayLen(), HopLimit: g.HopLimit(), SGID: g.SGID(), DGID: g.DGID()}
	if got != f || g.IPVer() != 6 || g.NxtHdr() != NxtHdrIBA {
		t.Fatalf("round trip %+v, want %+v", got, f)
	}
	g.SetPayLen(7)
	if g.PayLen() != 7 {
		t.Fatal("SetPayLen")
	}
}

// TestParseFrameBad: every way a frame can be wrong is an error, none a
// panic.
func TestParseFrameBad(t *testing.T) {
	good := unhex(t, v1Vectors[1].frame)
	for _, c := range []struct {
		name string
		mod  func([]byte) []byte
	}{
		{"empty", func(b []byte) []byte { return nil }},
		{"short Ethernet", func(b []byte) []byte { return b[:13] }},
		{"IPv4 Ethertype", func(b []byte) []byte { b[12], b[13] = 0x08, 0x00; return b }},
		{"RoCE v2 has no Ethertype of its own", func(b []byte) []byte { b[12], b[13] = 0x86, 0xdd; return b }},
		{"tag with nothing behind", func(b []byte) []byte { binary.BigEndian.PutUint16(b[12:], EtherTypeVLAN); return b[:16] }},
		{"short GRH", func(b []byte) []byte { return b[:EthHeaderLen+GRHLen-1] }},
		{"IP version 4", func(b []byte) []byte { b[14] = 0x40; return b }},
		{"NxtHdr UDP", func(b []byte) []byte { b[20] = 17; return b }},
		{"PayLen too long", func(b []byte) []byte { binary.BigEndian.PutUint16(b[18:], uint16(len(b)-53)); return b }},
		{"PayLen too short", func(b []byte) []byte { binary.BigEndian.PutUint16(b[18:], 15); return b }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }},
	} {
		var f Frame
		if err := ParseFrame(c.mod(bytes.Clone(good)), &f); err == nil {
			t.Errorf("%s: parsed", c.name)
		}
	}
	// A PayLen shorter than the frame (Ethernet padding) is fine, and the
	// ICRC is then looked for at PayLen's end.
	b := append(bytes.Clone(good), 0, 0)
	var f Frame
	if err := ParseFrame(b, &f); err != nil || len(f.Transport) != len(good)-EthHeaderLen-GRHLen {
		t.Fatalf("padded: %v", err)
	}
}

func TestICRCv1Allocs(t *testing.T) {
	b := unhex(t, v1Vectors[0].frame)
	var f Frame
	var c Checksummer
	if n := testing.AllocsPerRun(100, func() {
		if ParseFrame(b, &f) != nil || !c.VerifyGRH(f.GRH, f.Transport) {
			t.Fatal("bad")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per frame", n)
	}
}

// FuzzParseFrame: any bytes parse or fail cleanly; what parses has its
// views inside the input and a PayLen that adds up; the ICRC check of
// what parses never panics.
func FuzzParseFrame(f *testing.F) {
	for _, v := range v1Vectors {
		b, _ := hex.DecodeString(v.frame)
		f.Add(b)
		f.Add(append(EthHeader(make([]byte, 18), [6]byte{1}, [6]byte{2}, true, TCI(3, 0)), b[EthHeaderLen:]...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr Frame
		if err := ParseFrame(b, &fr); err != nil {
			return
		}
		hl := EthHeaderLen
		if fr.Tagged {
			hl += VLANTagLen
		}
		if len(fr.GRH) != GRHLen || &fr.GRH[0] != &b[hl] || len(fr.Transport) != int(fr.GRH.PayLen()) || &fr.Transport[0] != &b[hl+GRHLen] {
			t.Fatal("views not where the headers are")
		}
		var c Checksummer
		c.VerifyGRH(fr.GRH, fr.Transport)
		var p Packet
		Parse(fr.Transport, 0, &p)
	})
}
