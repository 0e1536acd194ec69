// SPDX-License-Identifier: Apache-2.0

package tcpwire_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// unhex decodes hex with spaces and newlines in it, for test vectors laid
// out like a hex dump.
func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatalf("test vector: %v", err)
	}
	return b
}

func encode(h *tcpwire.Header) []byte {
	b := make([]byte, tcpwire.HeaderLen)
	h.Put(b)
	return b
}

// allTypes is every frame type of version 1, with its number and name:
// the numbers are part of the protocol and must never change.
var allTypes = []struct {
	t    tcpwire.Type
	num  uint8
	name string
}{
	{tcpwire.Hello, 1, "HELLO"}, {tcpwire.Challenge, 2, "CHALLENGE"}, {tcpwire.Auth, 3, "AUTH"},
	{tcpwire.Ready, 4, "READY"}, {tcpwire.Refuse, 5, "REFUSE"},
	{tcpwire.Write, 16, "WRITE"}, {tcpwire.WriteImm, 17, "WRITE_IMM"}, {tcpwire.Send, 18, "SEND"},
	{tcpwire.SendImm, 19, "SEND_IMM"}, {tcpwire.Read, 20, "READ"}, {tcpwire.CmpSwap, 21, "CMP_SWAP"},
	{tcpwire.FetchAdd, 22, "FETCH_ADD"}, {tcpwire.SendInv, 23, "SEND_INV"},
	{tcpwire.UDSend, 24, "UD_SEND"},
	{tcpwire.UDSendImm, 25, "UD_SEND_IMM"}, {tcpwire.Stripe, 28, "STRIPE"},
	{tcpwire.UCWrite, 40, "UC_WRITE"}, {tcpwire.UCWriteImm, 41, "UC_WRITE_IMM"}, {tcpwire.UCSend, 42, "UC_SEND"}, {tcpwire.UCSendImm, 43, "UC_SEND_IMM"},
	{tcpwire.Ack, 32, "ACK"}, {tcpwire.ReadResp, 33, "READ_RESP"}, {tcpwire.AtomicWrite, 34, "ATOMIC_WRITE"},
	{tcpwire.CMReq, 48, "CM_REQ"}, {tcpwire.CMResp, 49, "CM_RESP"}, {tcpwire.CMCancel, 50, "CM_CANCEL"}, {tcpwire.CMDisc, 51, "CM_DISC"}, {tcpwire.CMRTU, 52, "CM_RTU"}, {tcpwire.CMWho, 53, "CM_WHO"},
}

// allStatuses is every response status, with its number and name.
var allStatuses = []struct {
	s    tcpwire.Status
	num  uint8
	name string
}{
	{tcpwire.OK, 0, "OK"}, {tcpwire.RNR, 1, "RNR"}, {tcpwire.RemAccessErr, 2, "REM_ACCESS_ERR"},
	{tcpwire.RemOpErr, 3, "REM_OP_ERR"}, {tcpwire.RemInvReqErr, 4, "REM_INV_REQ_ERR"}, {tcpwire.NoQP, 5, "NO_QP"},
	{tcpwire.SeqErr, 6, "SEQ_ERR"},
}

func TestTypesAndStatuses(t *testing.T) {
	known := map[uint8]bool{}
	for _, c := range allTypes {
		known[c.num] = true
		if uint8(c.t) != c.num || c.t.String() != c.name || !c.t.Known() {
			t.Errorf("type %s: number %d, String %q, Known %v; want %d, %q, true", c.name, uint8(c.t), c.t.String(), c.t.Known(), c.num, c.name)
		}
		wantReq := c.num >= 16 && c.num <= 23 || c.num == 34 || c.num >= 40 && c.num <= 43
		wantCtl := c.num <= 5 || c.num >= 48
		if c.t.IsRequest() != wantReq || c.t.IsControl() != wantCtl {
			t.Errorf("%s: IsRequest %v, IsControl %v; want %v, %v", c.name, c.t.IsRequest(), c.t.IsControl(), wantReq, wantCtl)
		}
	}
	for n := range 256 {
		ty := tcpwire.Type(n)
		if ty.Known() != known[uint8(n)] {
			t.Errorf("Type(%d).Known() = %v", n, ty.Known())
		}
		if !known[uint8(n)] && ty.String() != "Type("+strconv.Itoa(n)+")" {
			t.Errorf("Type(%d).String() = %q", n, ty.String())
		}
	}
	for _, c := range allStatuses {
		if uint8(c.s) != c.num || c.s.String() != c.name {
			t.Errorf("status %s: number %d, String %q", c.name, uint8(c.s), c.s.String())
		}
	}
	if s := tcpwire.Status(7).String(); s != "Status(7)" {
		t.Errorf("Status(7).String() = %q", s)
	}
}

// validHeader returns a valid header of type ty that sets every field the
// type uses to a distinct value.
func validHeader(ty tcpwire.Type) tcpwire.Header {
	h := tcpwire.Header{Version: tcpwire.Version, Type: ty, Tag: 0x0102030405060708}
	switch {
	case ty.IsControl():
		h.PayloadLen = 321
		if ty == tcpwire.Ready || ty == tcpwire.CMCancel {
			h.PayloadLen = 0
		}
	case ty == tcpwire.Ack:
		h.SrcQPN, h.PSN, h.Status, h.RNRTimer, h.Compare = 0x123456, 0xabcdef, tcpwire.RNR, 31, 0x1122334455667788
	case ty == tcpwire.ReadResp:
		h.SrcQPN, h.PSN, h.PayloadLen = 0x123456, 0xabcdef, 4096
	default: // requests
		h.DstQPN, h.SrcQPN, h.PSN, h.RKey, h.RemoteAddr = 0x000012, 0x000034, 0xffffff, 0xcafef00d, 0x00007f0012345000
		switch ty {
		case tcpwire.Write, tcpwire.Send, tcpwire.SendInv, tcpwire.UCWrite, tcpwire.UCSend, tcpwire.Stripe:
			h.PayloadLen = 1 << 20
		case tcpwire.WriteImm, tcpwire.SendImm, tcpwire.UCWriteImm, tcpwire.UCSendImm:
			h.PayloadLen, h.ImmOrLen = 1<<20, 0xdeadbeef
		case tcpwire.Read:
			h.ImmOrLen = tcpwire.MaxData
		case tcpwire.CmpSwap:
			h.Compare, h.Swap = 0x0123456789abcdef, 0xfedcba9876543210
		case tcpwire.FetchAdd:
			h.Compare = 42
		case tcpwire.UDSend, tcpwire.UDSendImm:
			h.PayloadLen, h.RKey, h.RemoteAddr = tcpwire.DatagramPrefix+1024, 0x11111111, tcpwire.DatagramRoute(3, 64, 0x12345)
			if ty == tcpwire.UDSendImm {
				h.ImmOrLen = 0xdeadbeef
			}
		}
	}
	return h
}

func TestRoundTrip(t *testing.T) {
	for _, c := range allTypes {
		h := validHeader(c.t)
		b := encode(&h)
		var got tcpwire.Header
		if err := tcpwire.Decode(b, tcpwire.Version, &got); err != nil {
			t.Errorf("%s: Decode: %v", c.name, err)
			continue
		}
		if got != h {
			t.Errorf("%s: decoded %+v, want %+v", c.name, got, h)
		}
		if again := encode(&got); !bytes.Equal(again, b) {
			t.Errorf("%s: re-encoded\n%x, want\n%x", c.name, again, b)
		}
		// A longer buffer (the header followed by its payload) decodes
		// the same.
		if err := tcpwire.Decode(append(b, 1, 2, 3), tcpwire.Version, &got); err != nil || got != h {
			t.Errorf("%s: Decode with trailing bytes: %+v, %v", c.name, got, err)
		}
	}
	// The solicited bit on every frame type that may carry it.
	for _, ty := range []tcpwire.Type{tcpwire.Send, tcpwire.SendImm, tcpwire.SendInv, tcpwire.WriteImm, tcpwire.UCSend, tcpwire.UCSendImm, tcpwire.UCWriteImm, tcpwire.UDSend, tcpwire.UDSendImm} {
		h := validHeader(ty)
		h.Flags = tcpwire.FlagSolicited
		var got tcpwire.Header
		if err := tcpwire.Decode(encode(&h), tcpwire.Version, &got); err != nil || got != h {
			t.Errorf("solicited %s: %+v, %v", ty, got, err)
		}
	}
	// Every status on both response types.
	for _, s := range allStatuses {
		for _, ty := range []tcpwire.Type{tcpwire.Ack, tcpwire.ReadResp} {
			h := tcpwire.Header{Version: tcpwire.Version, Type: ty, Tag: 9, SrcQPN: 1, PSN: 2, Status: s.s}
			if s.s == tcpwire.RNR {
				h.RNRTimer = 14
			}
			var got tcpwire.Header
			if err := tcpwire.Decode(encode(&h), tcpwire.Version, &got); err != nil || got != h {
				t.Errorf("%s %s: %+v, %v", ty, s.name, got, err)
			}
		}
	}
}

// The test vectors of docs/wire-tcp.md: a header's exact bytes, which pin
// the layout, the byte order and the numbers of types and statuses.
var vectors = []struct {
	name string
	h    tcpwire.Header
	hex  string
}{
	{"WRITE_IMM of 4096 bytes", tcpwire.Header{Version: 1, Type: tcpwire.WriteImm, PayloadLen: 4096, Tag: 7,
		DstQPN: 0x12, SrcQPN: 0x34, PSN: 0xabcdef, RKey: 0x101, RemoteAddr: 0x7f0012345000, ImmOrLen: 0xdeadbeef}, `
		56 54 01 11 00 00 10 00  00 00 00 00 00 00 00 07
		00 00 00 12 00 00 00 34  00 ab cd ef 00 00 01 01
		00 00 7f 00 12 34 50 00  00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00  de ad be ef 00 00 00 00`},
	{"ACK RNR, timer 14", tcpwire.Header{Version: 1, Type: tcpwire.Ack, Tag: 7, SrcQPN: 0x12, PSN: 0xabcdef,
		Status: tcpwire.RNR, RNRTimer: 14}, `
		56 54 01 20 00 00 00 00  00 00 00 00 00 00 00 07
		00 00 00 00 00 00 00 12  00 ab cd ef 00 00 00 00
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00  00 00 00 00 01 0e 00 00`},
	{"CMP_SWAP", tcpwire.Header{Version: 1, Type: tcpwire.CmpSwap, Tag: 8, DstQPN: 0x12, SrcQPN: 0x34, PSN: 0xabcdf0,
		RKey: 0x202, RemoteAddr: 0x1000, Compare: 0x0123456789abcdef, Swap: 0xfedcba9876543210}, `
		56 54 01 15 00 00 00 00  00 00 00 00 00 00 00 08
		00 00 00 12 00 00 00 34  00 ab cd f0 00 00 02 02
		00 00 00 00 00 00 10 00  01 23 45 67 89 ab cd ef
		fe dc ba 98 76 54 32 10  00 00 00 00 00 00 00 00`},
	{"ACK of the CMP_SWAP, original value", tcpwire.Header{Version: 1, Type: tcpwire.Ack, Tag: 8, SrcQPN: 0x12, PSN: 0xabcdf0,
		Compare: 0x0123456789abcdef}, `
		56 54 01 20 00 00 00 00  00 00 00 00 00 00 00 08
		00 00 00 00 00 00 00 12  00 ab cd f0 00 00 00 00
		00 00 00 00 00 00 00 00  01 23 45 67 89 ab cd ef
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00`},
	{"ATOMIC_WRITE", tcpwire.Header{Version: 1, Type: tcpwire.AtomicWrite, Tag: 10, DstQPN: 0x12, SrcQPN: 0x34, PSN: 0xabcdf2,
		RKey: 0x404, RemoteAddr: 0x1008, Swap: 0x8877665544332211}, `
		56 54 01 22 00 00 00 00  00 00 00 00 00 00 00 0a
		00 00 00 12 00 00 00 34  00 ab cd f2 00 00 04 04
		00 00 00 00 00 00 10 08  00 00 00 00 00 00 00 00
		88 77 66 55 44 33 22 11  00 00 00 00 00 00 00 00`},
	{"READ of 65536 bytes", tcpwire.Header{Version: 1, Type: tcpwire.Read, Tag: 9, DstQPN: 0x12, SrcQPN: 0x34, PSN: 0xabcdf1,
		RKey: 0x303, RemoteAddr: 0x200000, ImmOrLen: 65536}, `
		56 54 01 14 00 00 00 00  00 00 00 00 00 00 00 09
		00 00 00 12 00 00 00 34  00 ab cd f1 00 00 03 03
		00 00 00 00 00 20 00 00  00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00  00 01 00 00 00 00 00 00`},
	{"READ_RESP with its 65536 bytes", tcpwire.Header{Version: 1, Type: tcpwire.ReadResp, PayloadLen: 65536, Tag: 9,
		SrcQPN: 0x12, PSN: 0xabcdf1}, `
		56 54 01 21 00 01 00 00  00 00 00 00 00 00 00 09
		00 00 00 00 00 00 00 12  00 ab cd f1 00 00 00 00
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00`},
	{"SEND_INV of 64 bytes, solicited, invalidating rkey 0x80000107", tcpwire.Header{Version: 2, Type: tcpwire.SendInv, PayloadLen: 64, Tag: 10,
		DstQPN: 0x12, SrcQPN: 0x34, PSN: 0xabcdf2, RKey: 0x80000107, Flags: tcpwire.FlagSolicited}, `
		56 54 02 17 00 00 00 40  00 00 00 00 00 00 00 0a
		00 00 00 12 00 00 00 34  00 ab cd f2 80 00 01 07
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 01 00`},
	{"HELLO with 256 bytes of JSON", tcpwire.Header{Version: 1, Type: tcpwire.Hello, PayloadLen: 256}, `
		56 54 01 01 00 00 01 00  00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00
		00 00 00 00 00 00 00 00  00 00 00 00 00 00 00 00`},
}

func TestVectors(t *testing.T) {
	for _, v := range vectors {
		want := unhex(t, v.hex)
		if len(want) != tcpwire.HeaderLen {
			t.Fatalf("%s: vector of %d bytes", v.name, len(want))
		}
		if got := encode(&v.h); !bytes.Equal(got, want) {
			t.Errorf("%s: Put wrote\n% x\nwant\n% x", v.name, got, want)
		}
		var h tcpwire.Header
		if err := tcpwire.Decode(want, v.h.Version, &h); err != nil || h != v.h {
			t.Errorf("%s: Decode: %+v, %v; want %+v", v.name, h, err, v.h)
		}
	}
}

// TestLayout puts a distinct pattern in every field and checks where each
// lands, so that a field moved or resized fails here by name.
func TestLayout(t *testing.T) {
	h := tcpwire.Header{Version: 0xa1, Type: 0xa2, PayloadLen: 0xb1b2b3b4, Tag: 0xc1c2c3c4c5c6c7c8, DstQPN: 0xd1d2d3d4,
		SrcQPN: 0xe1e2e3e4, PSN: 0xf1f2f3f4, RKey: 0x91929394, RemoteAddr: 0x8182838485868788, Compare: 0x7172737475767778,
		Swap: 0x6162636465666768, ImmOrLen: 0x51525354, Status: 0x41, RNRTimer: 0x31, Flags: 0x21}
	b := make([]byte, tcpwire.HeaderLen)
	for i := range b {
		b[i] = 0xee // Put must write every byte
	}
	h.Put(b)
	fields := []struct {
		name string
		off  int
		hex  string
	}{
		{"magic", 0, "5654"}, {"version", 2, "a1"}, {"type", 3, "a2"}, {"payload length", 4, "b1b2b3b4"},
		{"tag", 8, "c1c2c3c4c5c6c7c8"}, {"dst QPN", 16, "d1d2d3d4"}, {"src QPN", 20, "e1e2e3e4"}, {"PSN", 24, "f1f2f3f4"},
		{"rkey", 28, "91929394"}, {"remote address", 32, "8182838485868788"}, {"compare", 40, "7172737475767778"},
		{"swap", 48, "6162636465666768"}, {"imm/length", 56, "51525354"}, {"status", 60, "41"}, {"RNR timer", 61, "31"},
		{"flags", 62, "21"}, {"reserved", 63, "00"},
	}
	end := 0
	for _, f := range fields {
		want := unhex(t, f.hex)
		if f.off != end {
			t.Fatalf("field table: %s at %d, previous field ends at %d", f.name, f.off, end)
		}
		end = f.off + len(want)
		if got := b[f.off:end]; !bytes.Equal(got, want) {
			t.Errorf("%s at offset %d: %x, want %x", f.name, f.off, got, want)
		}
	}
	if end != tcpwire.HeaderLen {
		t.Errorf("fields end at %d, want %d", end, tcpwire.HeaderLen)
	}
}

func TestPutShortBufferPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Put into a 63-byte buffer did not panic")
		}
	}()
	var h tcpwire.Header
	h.Put(make([]byte, tcpwire.HeaderLen-1))
}

// TestDecodeRefuses checks every rule of Decode: each case breaks one
// rule of an otherwise valid header.
func TestDecodeRefuses(t *testing.T) {
	type mut func(h *tcpwire.Header, b []byte) []byte
	hdr := func(f func(h *tcpwire.Header)) mut {
		return func(h *tcpwire.Header, _ []byte) []byte { f(h); return encode(h) }
	}
	cases := []struct {
		name string
		base tcpwire.Type
		ver  uint8 // the connection's version; 0: Version
		m    mut
		want string
	}{
		{"empty", tcpwire.Write, 0, func(_ *tcpwire.Header, b []byte) []byte { return nil }, "truncated header: 0 of 64"},
		{"truncated", tcpwire.Write, 0, func(_ *tcpwire.Header, b []byte) []byte { return b[:63] }, "truncated header: 63 of 64"},
		{"bad magic", tcpwire.Write, 0, func(_ *tcpwire.Header, b []byte) []byte { b[0] = 'X'; return b }, "bad magic 0x5854"},
		{"byte-swapped magic", tcpwire.Write, 0, func(_ *tcpwire.Header, b []byte) []byte { b[0], b[1] = b[1], b[0]; return b }, "bad magic 0x5456"},
		{"version 3 on a version 2 connection", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.Version = 3 }), "version 3 on a connection that agreed on version 2"},
		{"version 0", tcpwire.Ack, 0, hdr(func(h *tcpwire.Header) { h.Version = 0 }), "version 0 on a connection"},
		{"version 2 on a version 1 connection", tcpwire.Write, 1, hdr(func(*tcpwire.Header) {}), "version 2 on a connection that agreed on version 1"},
		{"solicited WRITE", tcpwire.Write, 0, func(_ *tcpwire.Header, b []byte) []byte { b[62] = 1; return b }, "WRITE: flags 0x01: only a SEND's"},
		{"solicited READ", tcpwire.Read, 0, func(_ *tcpwire.Header, b []byte) []byte { b[62] = 1; return b }, "READ: flags 0x01"},
		{"solicited ACK", tcpwire.Ack, 0, func(_ *tcpwire.Header, b []byte) []byte { b[62] = 1; return b }, "ACK: flags 0x01"},
		{"unknown flag", tcpwire.Send, 0, func(_ *tcpwire.Header, b []byte) []byte { b[62] = 9; return b }, "SEND: flags 0x09"},
		{"reserved byte 63", tcpwire.Ack, 0, func(_ *tcpwire.Header, b []byte) []byte { b[63] = 0x80; return b }, "reserved byte 0x80 is not zero"},
		{"type 0", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.Type = 0 }), "unknown frame type 0"},
		{"type 6", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.Type = 6 }), "unknown frame type 6"},
		{"type 39", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.Type = 39 }), "unknown frame type 39"},
		{"type 35", tcpwire.Ack, 0, hdr(func(h *tcpwire.Header) { h.Type = 35 }), "unknown frame type 35"},
		{"type 54", tcpwire.CMReq, 0, hdr(func(h *tcpwire.Header) { h.Type = 54 }), "unknown frame type 54"},
		{"type 255", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.Type = 255 }), "unknown frame type 255"},
		{"PSN of 25 bits", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.PSN = 0x1000000 }), "WRITE: PSN 0x1000000 wider than 24 bits"},
		{"PSN all ones", tcpwire.Ack, 0, hdr(func(h *tcpwire.Header) { h.PSN = 0xffffffff }), "PSN 0xffffffff wider than 24 bits"},
		{"status 7", tcpwire.Ack, 0, hdr(func(h *tcpwire.Header) { h.Status = 7 }), "ACK: unknown status 7"},
		{"status 255", tcpwire.ReadResp, 0, hdr(func(h *tcpwire.Header) { h.Status, h.PayloadLen = 255, 0 }), "READ_RESP: unknown status 255"},
		{"RNR timer 32", tcpwire.Ack, 0, hdr(func(h *tcpwire.Header) { h.RNRTimer = 32 }), "ACK: RNR timer 32 out of range 0..31"},
		{"RNR timer 255", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.RNRTimer = 255 }), "RNR timer 255 out of range"},

		// Payload lengths, per type.
		{"HELLO over 64 KiB", tcpwire.Hello, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxControl + 1 }), "HELLO: 65537-byte payload exceeds the 65536-byte limit of control frames"},
		{"CM_REQ over 64 KiB", tcpwire.CMReq, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = 0xffffffff }), "CM_REQ: 4294967295-byte payload exceeds the 65536-byte limit"},
		{"REFUSE over 64 KiB", tcpwire.Refuse, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = 1 << 20 }), "limit of control frames"},
		{"WRITE over 2 GiB", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxData + 1 }), "WRITE: 2147483649-byte payload exceeds the 2 GiB message limit"},
		{"WRITE_IMM over 2 GiB", tcpwire.WriteImm, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = 0xffffffff }), "WRITE_IMM: 4294967295-byte payload exceeds"},
		{"SEND over 2 GiB", tcpwire.Send, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxData + 1 }), "SEND: 2147483649-byte payload"},
		{"SEND_IMM over 2 GiB", tcpwire.SendImm, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxData + 1 }), "SEND_IMM: 2147483649-byte payload"},
		{"READ with a payload", tcpwire.Read, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = 1 }), "READ carries a 1-byte payload; it must carry none"},
		{"READ over 2 GiB", tcpwire.Read, 0, hdr(func(h *tcpwire.Header) { h.ImmOrLen = tcpwire.MaxData + 1 }), "READ of 2147483649 bytes exceeds the 2 GiB message limit"},
		{"READ_RESP over 2 GiB", tcpwire.ReadResp, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxData + 1 }), "READ_RESP: 2147483649-byte payload exceeds"},
		{"READ_RESP error with data", tcpwire.ReadResp, 0, hdr(func(h *tcpwire.Header) { h.Status, h.PayloadLen = tcpwire.RemAccessErr, 8 }), "READ_RESP with status REM_ACCESS_ERR carries 8 bytes; only OK carries data"},
		{"READ_RESP NO_QP with data", tcpwire.ReadResp, 0, hdr(func(h *tcpwire.Header) { h.Status, h.PayloadLen = tcpwire.NoQP, 1 }), "READ_RESP with status NO_QP carries 1 bytes"},
		{"CMP_SWAP with a payload", tcpwire.CmpSwap, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = 8 }), "CMP_SWAP carries a 8-byte payload; it must carry none"},
		{"FETCH_ADD with a payload", tcpwire.FetchAdd, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = 1 }), "FETCH_ADD carries a 1-byte payload"},
		{"ATOMIC_WRITE with a payload", tcpwire.AtomicWrite, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = 8 }), "ATOMIC_WRITE carries a 8-byte payload"},
		{"ACK with a payload", tcpwire.Ack, 0, hdr(func(h *tcpwire.Header) { h.PayloadLen = 0xffffffff }), "ACK carries a 4294967295-byte payload"},

		// Requests carry no status.
		{"WRITE with status RNR", tcpwire.Write, 0, hdr(func(h *tcpwire.Header) { h.Status = tcpwire.RNR }), "request WRITE carries status RNR"},
		{"READ with status NO_QP", tcpwire.Read, 0, hdr(func(h *tcpwire.Header) { h.Status = tcpwire.NoQP }), "request READ carries status NO_QP"},
		{"FETCH_ADD with status SEQ_ERR", tcpwire.FetchAdd, 0, hdr(func(h *tcpwire.Header) { h.Status = tcpwire.SeqErr }), "request FETCH_ADD carries status SEQ_ERR"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := validHeader(c.base)
			b := c.m(&h, encode(&h))
			ver := c.ver
			if ver == 0 {
				ver = tcpwire.Version
			}
			var got tcpwire.Header
			err := tcpwire.Decode(b, ver, &got)
			var fe *tcpwire.Error
			if !errors.As(err, &fe) {
				t.Fatalf("Decode: %v, want a *tcpwire.Error", err)
			}
			if !strings.Contains(fe.Reason, c.want) {
				t.Errorf("reason %q does not say %q", fe.Reason, c.want)
			}
			if !strings.HasPrefix(err.Error(), "tcp path frame: ") {
				t.Errorf("error %q does not start with \"tcp path frame: \"", err)
			}
		})
	}
}

// TestDecodeAccepts checks the edges of every limit from the inside.
func TestDecodeAccepts(t *testing.T) {
	cases := []struct {
		name string
		ty   tcpwire.Type
		f    func(h *tcpwire.Header)
	}{
		{"HELLO of 64 KiB", tcpwire.Hello, func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxControl }},
		{"CM_RESP of 64 KiB", tcpwire.CMResp, func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxControl }},
		{"READY empty", tcpwire.Ready, func(h *tcpwire.Header) {}},
		{"WRITE of 2 GiB", tcpwire.Write, func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxData }},
		{"WRITE of 0 bytes", tcpwire.Write, func(h *tcpwire.Header) { h.PayloadLen = 0 }},
		{"SEND_IMM of 2 GiB", tcpwire.SendImm, func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxData }},
		{"READ of 2 GiB", tcpwire.Read, func(h *tcpwire.Header) { h.ImmOrLen = tcpwire.MaxData }},
		{"READ of 0 bytes", tcpwire.Read, func(h *tcpwire.Header) { h.ImmOrLen = 0 }},
		{"READ_RESP of 2 GiB", tcpwire.ReadResp, func(h *tcpwire.Header) { h.PayloadLen = tcpwire.MaxData }},
		{"READ_RESP error without data", tcpwire.ReadResp, func(h *tcpwire.Header) { h.Status, h.PayloadLen = tcpwire.RemAccessErr, 0 }},
		{"PSN 0xffffff", tcpwire.Ack, func(h *tcpwire.Header) { h.PSN = 0xffffff }},
		{"RNR timer 31", tcpwire.Ack, func(h *tcpwire.Header) { h.RNRTimer = 31 }},
		{"RNR timer 0", tcpwire.Ack, func(h *tcpwire.Header) { h.RNRTimer = 0 }},
		{"SEQ_ERR", tcpwire.Ack, func(h *tcpwire.Header) { h.Status = tcpwire.SeqErr }},
		// QPNs and unused fields are not the decoder's business: an
		// unknown QPN is the responder's NO_QP.
		{"QPN wider than 24 bits", tcpwire.Write, func(h *tcpwire.Header) { h.DstQPN, h.SrcQPN = 0xffffffff, 0x1000000 }},
		{"tag on a handshake frame", tcpwire.Hello, func(h *tcpwire.Header) { h.Tag = 1 }},
	}
	for _, c := range cases {
		h := validHeader(c.ty)
		c.f(&h)
		var got tcpwire.Header
		if err := tcpwire.Decode(encode(&h), tcpwire.Version, &got); err != nil || got != h {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, h)
		}
	}
}

func TestDecodeDoesNotAllocate(t *testing.T) {
	h := validHeader(tcpwire.WriteImm)
	b := encode(&h)
	var got tcpwire.Header
	if n := testing.AllocsPerRun(100, func() { tcpwire.Decode(b, tcpwire.Version, &got) }); n != 0 {
		t.Errorf("Decode of a valid header: %v allocations, want 0", n)
	}
}
