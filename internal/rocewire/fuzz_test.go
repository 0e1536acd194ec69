// SPDX-License-Identifier: Apache-2.0

package rocewire

import (
	"bytes"
	"testing"
)

// FuzzParse: any bytes parse or fail cleanly; what parses is consistent
// with the opcode table, and its views lie inside the input.
func FuzzParse(f *testing.F) {
	for op := range ops {
		f.Add(build(op, 0), 0)
		f.Add(build(op, 256), 256)
	}
	f.Add(build(SendLast, 3), 1024)
	f.Fuzz(func(t *testing.T, b []byte, mtuSel int) {
		mtu := []int{0, 256, 1024, 4096}[uint(mtuSel)%4]
		var p Packet
		if err := Parse(b, mtu, &p); err != nil {
			return
		}
		info, ok := p.BTH.Opcode().Info()
		if !ok || info != p.Info {
			t.Fatal("parsed an unknown opcode")
		}
		if got := HeaderLen(p.BTH.Opcode()) + len(p.Payload) + len(p.Pad) + ICRCLen; got != len(b) {
			t.Fatalf("headers, payload, pad and ICRC are %d bytes of %d", got, len(b))
		}
		if mtu != 0 && len(p.Payload) > mtu {
			t.Fatalf("payload %d beyond the MTU %d", len(p.Payload), mtu)
		}
		if len(p.Payload) > 0 && &p.Payload[0] != &b[HeaderLen(p.BTH.Opcode())] {
			t.Fatal("the payload view is not into the input")
		}
	})
}

// FuzzBTHRoundTrip: what Encode writes, the accessors read back, and
// Parse accepts it for an opcode without extended headers.
func FuzzBTHRoundTrip(f *testing.F) {
	f.Add(uint8(4), true, uint16(0xffff), uint32(1), uint32(2), true)
	f.Fuzz(func(t *testing.T, op uint8, se bool, pkey uint16, qp, psn uint32, ack bool) {
		fl := BTHFields{Opcode: Opcode(op), Solicited: se, PKey: pkey, DestQP: qp & QPNMask, PSN: psn & PSNMask, AckReq: ack}
		b := make(BTH, BTHLen)
		b.Encode(&fl)
		got := BTHFields{Opcode: b.Opcode(), Solicited: b.Solicited(), PKey: b.PKey(), DestQP: b.DestQP(), PSN: b.PSN(), AckReq: b.AckReq()}
		if got != fl {
			t.Fatalf("round trip %+v → %+v", fl, got)
		}
		b2 := make(BTH, BTHLen)
		b2.Encode(&got)
		if !bytes.Equal(b, b2) {
			t.Fatal("encode is not a function of the fields")
		}
	})
}

// FuzzICRC: ICRC never panics, and PutICRC then VerifyICRC agree.
func FuzzICRC(f *testing.F) {
	f.Add([]byte("E\x01\x00@\x04x@\x00@\x11\xb4\xd5\xc0\xa8\x00\x07\xc0\xa8\x00\x07"), []byte("\xc0\x00\x12\xb7\x00,\xac\xa2"), build(SendOnly, 3))
	f.Fuzz(func(t *testing.T, ip, udp, pkt []byte) {
		// The fuzzer may hand in arguments that share memory; on the
		// wire the three headers never overlap.
		ip, udp, pkt = bytes.Clone(ip), bytes.Clone(udp), bytes.Clone(pkt)
		if err := PutICRC(ip, udp, pkt); err != nil {
			return
		}
		if ok, err := VerifyICRC(ip, udp, pkt); !ok || err != nil {
			t.Fatalf("PutICRC then VerifyICRC: %v %v", ok, err)
		}
	})
}
