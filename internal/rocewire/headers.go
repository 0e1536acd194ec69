// SPDX-License-Identifier: Apache-2.0

// Package rocewire is the RoCEv2 wire format, as a pure codec: typed views
// of the InfiniBand transport headers a RoCEv2 packet carries after its
// UDP header (BTH, RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH,
// DETH), the RC and UD opcode table with each opcode's headers and
// payload rule, padding, and the invariant CRC; and the Communication
// Management MADs that RDMA CM exchanges on QP1 (cm.go). The layouts follow the
// InfiniBand Architecture Specification and its RoCE v2 annex, as Linux
// rxe (ib_pack.h) and Wireshark read them, every multi-byte field
// big-endian.
//
// A view is a byte slice of at least the header's length, in the style of
// gVisor's header package: accessors read the wire bytes in place, Encode
// writes them, nothing allocates. Parse checks a whole transport packet
// before any view of it is used.
package rocewire

import "encoding/binary"

// UDPPort is RoCEv2's UDP destination port (IANA), on every packet.
const UDPPort = 4791

// Header lengths in bytes (ib_pack.h).
const (
	BTHLen          = 12
	RETHLen         = 16
	AETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	DETHLen         = 8
	ICRCLen         = 4
)

// PSNMask keeps a PSN's 24 bits; QPNMask a QPN's.
const (
	PSNMask = 0xffffff
	QPNMask = 0xffffff
)

// DefaultPKey is the default partition key (full member).
const DefaultPKey = 0xffff

// BTH is a Base Transport Header view (12 bytes).
type BTH []byte

// BTHFields are a BTH's fields, for Encode.
type BTHFields struct {
	Opcode    Opcode
	Solicited bool
	MigReq    bool
	PadCount  uint8 // 0..3
	PKey      uint16
	FECN      bool
	BECN      bool
	DestQP    uint32 // 24 bits
	AckReq    bool
	PSN       uint32 // 24 bits
}

// Opcode returns the opcode.
func (b BTH) Opcode() Opcode { return Opcode(b[0]) }

// Solicited returns the SE bit.
func (b BTH) Solicited() bool { return b[1]&0x80 != 0 }

// MigReq returns the M bit.
func (b BTH) MigReq() bool { return b[1]&0x40 != 0 }

// PadCount returns how many pad bytes follow the payload.
func (b BTH) PadCount() uint8 { return b[1] >> 4 & 3 }

// TVer returns the transport header version (0 is the only one).
func (b BTH) TVer() uint8 { return b[1] & 0xf }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[2:]) }

// FECN returns the forward congestion notification bit.
func (b BTH) FECN() bool { return b[4]&0x80 != 0 }

// BECN returns the backward congestion notification bit.
func (b BTH) BECN() bool { return b[4]&0x40 != 0 }

// DestQP returns the destination QP number.
func (b BTH) DestQP() uint32 { return binary.BigEndian.Uint32(b[4:]) & QPNMask }

// AckReq returns the acknowledge-request bit.
func (b BTH) AckReq() bool { return b[8]&0x80 != 0 }

// PSN returns the packet sequence number.
func (b BTH) PSN() uint32 { return binary.BigEndian.Uint32(b[8:]) & PSNMask }

// Encode writes f into b; reserved bits are zero. Values beyond a field's
// width are cut to it.
func (b BTH) Encode(f *BTHFields) {
	_ = b[BTHLen-1]
	b[0] = byte(f.Opcode)
	b[1] = bit(f.Solicited, 0x80) | bit(f.MigReq, 0x40) | f.PadCount&3<<4
	binary.BigEndian.PutUint16(b[2:], f.PKey)
	binary.BigEndian.PutUint32(b[4:], f.DestQP&QPNMask)
	b[4] = bit(f.FECN, 0x80) | bit(f.BECN, 0x40)
	binary.BigEndian.PutUint32(b[8:], f.PSN&PSNMask)
	b[8] = bit(f.AckReq, 0x80)
}

func bit(v bool, m byte) byte {
	if v {
		return m
	}
	return 0
}

// RETH is an RDMA Extended Transport Header view (16 bytes): the remote
// address, key and length of an RDMA WRITE or READ.
type RETH []byte

// VA returns the remote virtual address.
func (r RETH) VA() uint64 { return binary.BigEndian.Uint64(r) }

// RKey returns the remote key.
func (r RETH) RKey() uint32 { return binary.BigEndian.Uint32(r[8:]) }

// DMALen returns the length of the whole message.
func (r RETH) DMALen() uint32 { return binary.BigEndian.Uint32(r[12:]) }

// Encode writes the fields.
func (r RETH) Encode(va uint64, rkey, dmaLen uint32) {
	_ = r[RETHLen-1]
	binary.BigEndian.PutUint64(r, va)
	binary.BigEndian.PutUint32(r[8:], rkey)
	binary.BigEndian.PutUint32(r[12:], dmaLen)
}

// AETH is an ACK Extended Transport Header view (4 bytes): a syndrome and
// the responder's message sequence number.
type AETH []byte

// Syndrome returns the syndrome byte.
func (a AETH) Syndrome() Syndrome { return Syndrome(a[0]) }

// MSN returns the message sequence number.
func (a AETH) MSN() uint32 { return binary.BigEndian.Uint32(a) & 0xffffff }

// Encode writes the fields.
func (a AETH) Encode(s Syndrome, msn uint32) {
	binary.BigEndian.PutUint32(a, msn&0xffffff)
	a[0] = byte(s)
}

// Syndrome is an AETH syndrome: bits 6–5 say ACK, RNR NAK or NAK; bits
// 4–0 the credit count, the RNR timer code or the NAK code.
type Syndrome uint8

// The syndrome kinds (bits 6–5).
const (
	KindACK = 0
	KindRNR = 1
	KindNAK = 3
)

// NAK codes (the low bits of a NAK syndrome).
const (
	NAKPSNSeqErr  = 0
	NAKInvReq     = 1
	NAKRemAccess  = 2
	NAKRemOpErr   = 3
	NAKInvRDReq   = 4
	CreditInvalid = 0x1f // an ACK's credit count: none advertised (what rxe sends)
)

// ACK is the syndrome of an ACK advertising no credits.
const ACK Syndrome = CreditInvalid

// RNRNak is the syndrome of an RNR NAK asking for timer code t.
func RNRNak(t uint8) Syndrome { return Syndrome(KindRNR<<5 | t&0x1f) }

// NAK is the syndrome of a NAK with code c.
func NAK(c uint8) Syndrome { return Syndrome(KindNAK<<5 | c&0x1f) }

// Kind returns the syndrome's kind (KindACK, KindRNR, KindNAK; 2 is
// reserved, as is bit 7).
func (s Syndrome) Kind() uint8 { return uint8(s) >> 5 & 3 }

// Value returns the low five bits: credits, RNR timer or NAK code.
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1f }

// Valid reports whether the syndrome is one IBTA defines for RC: bit 7
// clear, kind not reserved, a NAK code 0–4.
func (s Syndrome) Valid() bool {
	return s&0x80 == 0 && s.Kind() != 2 && (s.Kind() != KindNAK || s.Value() <= NAKInvRDReq)
}

// AtomicETH is an Atomic Extended Transport Header view (28 bytes,
// packed: the 8-byte fields are not aligned).
type AtomicETH []byte

// VA returns the remote virtual address.
func (a AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(a) }

// RKey returns the remote key.
func (a AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(a[8:]) }

// SwapAdd returns the swap value (COMPARE_SWAP) or the addend (FETCH_ADD).
func (a AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(a[12:]) }

// Compare returns the compare value (COMPARE_SWAP).
func (a AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(a[20:]) }

// Encode writes the fields.
func (a AtomicETH) Encode(va uint64, rkey uint32, swapAdd, compare uint64) {
	_ = a[AtomicETHLen-1]
	binary.BigEndian.PutUint64(a, va)
	binary.BigEndian.PutUint32(a[8:], rkey)
	binary.BigEndian.PutUint64(a[12:], swapAdd)
	binary.BigEndian.PutUint64(a[20:], compare)
}

// AtomicAckETH is an Atomic Acknowledge Extended Transport Header view (8
// bytes): the original remote value.
type AtomicAckETH []byte

// Orig returns the original remote value.
func (a AtomicAckETH) Orig() uint64 { return binary.BigEndian.Uint64(a) }

// Encode writes the original remote value.
func (a AtomicAckETH) Encode(orig uint64) { binary.BigEndian.PutUint64(a, orig) }

// ImmDt is an Immediate Data header view (4 bytes), opaque: it reaches
// the receiver's completion byte for byte.
type ImmDt []byte

// Imm returns the immediate data as read big-endian.
func (i ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(i) }

// Encode writes the immediate data.
func (i ImmDt) Encode(imm uint32) { binary.BigEndian.PutUint32(i, imm) }

// IETH is an Invalidate Extended Transport Header view (4 bytes): the
// R_Key to invalidate.
type IETH []byte

// RKey returns the key to invalidate.
func (i IETH) RKey() uint32 { return binary.BigEndian.Uint32(i) }

// Encode writes the key.
func (i IETH) Encode(rkey uint32) { binary.BigEndian.PutUint32(i, rkey) }

// DETH is a Datagram Extended Transport Header view (8 bytes, UD).
type DETH []byte

// QKey returns the queue key.
func (d DETH) QKey() uint32 { return binary.BigEndian.Uint32(d) }

// SrcQP returns the source QP number.
func (d DETH) SrcQP() uint32 { return binary.BigEndian.Uint32(d[4:]) & QPNMask }

// Encode writes the fields; the reserved byte is zero.
func (d DETH) Encode(qkey, srcQP uint32) {
	binary.BigEndian.PutUint32(d, qkey)
	binary.BigEndian.PutUint32(d[4:], srcQP&QPNMask)
}

// PadCount returns the pad bytes after a payload of n bytes: (−n) mod 4.
func PadCount(n int) uint8 { return uint8(-n & 3) }
