// SPDX-License-Identifier: Apache-2.0

package rocewire

// RoCE v1 (the InfiniBand specification's RoCE annex): the same
// transport packets in Ethernet frames of Ethertype 0x8915, with an
// InfiniBand Global Route Header where RoCE v2 has IP and UDP:
//
//	Eth dst(6) | Eth src(6) | [0x8100 | TCI(2)] | 0x8915 | GRH(40) | BTH | ext hdrs | payload | pad | ICRC
//
// The GRH has the layout of an IPv6 header (version 6, traffic class,
// flow label, PayLen, NxtHdr 0x1B, hop limit, SGID, DGID); PayLen counts
// every byte after the GRH up to and including the ICRC, and a receiver
// finds the ICRC from it, not from the frame's end (Ethernet may pad).

import (
	"encoding/binary"
)

// RoCE v1 constants.
const (
	// EtherTypeRoCE is RoCE v1's Ethertype (Linux ETH_P_IBOE).
	EtherTypeRoCE = 0x8915
	// EtherTypeVLAN is the 802.1Q tag protocol identifier.
	EtherTypeVLAN = 0x8100
	// EthHeaderLen is an untagged Ethernet header; VLANTagLen the 802.1Q
	// tag a tagged one adds.
	EthHeaderLen = 14
	VLANTagLen   = 4
	// GRHLen is the Global Route Header's length.
	GRHLen = 40
	// NxtHdrIBA is the GRH NxtHdr of an IBA transport header.
	NxtHdrIBA = 0x1b
	// DefaultHopLimit is the hop limit vrdma sends (the ConnectX
	// captures' value; the ICRC masks it).
	DefaultHopLimit = 64
)

// GRH is a Global Route Header view (40 bytes).
type GRH []byte

// GRHFields are a GRH's fields, for Encode.
type GRHFields struct {
	TClass    uint8
	FlowLabel uint32 // 20 bits
	PayLen    uint16
	HopLimit  uint8
	SGID      [16]byte
	DGID      [16]byte
}

// IPVer returns the IP version field (6 in every GRH).
func (g GRH) IPVer() uint8 { return g[0] >> 4 }

// TClass returns the traffic class.
func (g GRH) TClass() uint8 { return g[0]<<4 | g[1]>>4 }

// FlowLabel returns the flow label.
func (g GRH) FlowLabel() uint32 { return binary.BigEndian.Uint32(g) & 0xfffff }

// PayLen returns the number of bytes after the GRH, the ICRC included.
func (g GRH) PayLen() uint16 { return binary.BigEndian.Uint16(g[4:]) }

// NxtHdr returns the next header (NxtHdrIBA).
func (g GRH) NxtHdr() uint8 { return g[6] }

// HopLimit returns the hop limit.
func (g GRH) HopLimit() uint8 { return g[7] }

// SGID returns the source GID.
func (g GRH) SGID() [16]byte { return [16]byte(g[8:24]) }

// DGID returns the destination GID.
func (g GRH) DGID() [16]byte { return [16]byte(g[24:40]) }

// SetPayLen writes PayLen.
func (g GRH) SetPayLen(n uint16) { binary.BigEndian.PutUint16(g[4:], n) }

// Encode writes f, with version 6 and NxtHdr NxtHdrIBA.
func (g GRH) Encode(f *GRHFields) {
	binary.BigEndian.PutUint32(g, 6<<28|uint32(f.TClass)<<20|f.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(g[4:], f.PayLen)
	g[6], g[7] = NxtHdrIBA, f.HopLimit
	copy(g[8:24], f.SGID[:])
	copy(g[24:40], f.DGID[:])
}

// Frame is a parsed RoCE v1 frame: views into the bytes ParseFrame was
// given.
type Frame struct {
	Dst, Src [6]byte
	// Tagged says whether the frame carried an 802.1Q tag (a receiving
	// socket mostly sees frames whose tag the kernel stripped), TCI its
	// tag control information.
	Tagged bool
	TCI    uint16
	GRH    GRH
	// Transport is the PayLen bytes after the GRH: the transport packet
	// from the BTH through the ICRC (Parse).
	Transport []byte
}

// ParseFrame checks b, an Ethernet frame without its FCS, as a RoCE v1
// frame and fills f: Ethertype 0x8915 (after at most one 802.1Q tag), a
// GRH of version 6 with NxtHdr 0x1B, and a PayLen that holds at least a
// BTH and an ICRC and fits in the frame (bytes beyond it are Ethernet
// padding). The ICRC is not checked (VerifyGRH), nor the transport
// packet (Parse).
func ParseFrame(b []byte, f *Frame) error {
	if len(b) < EthHeaderLen {
		return errorf("frame of %d bytes, shorter than an Ethernet header", len(b))
	}
	*f = Frame{Dst: [6]byte(b[0:6]), Src: [6]byte(b[6:12])}
	off := 12
	et := binary.BigEndian.Uint16(b[off:])
	if et == EtherTypeVLAN {
		if len(b) < EthHeaderLen+VLANTagLen {
			return errorf("tagged frame of %d bytes, shorter than its Ethernet header", len(b))
		}
		f.Tagged, f.TCI = true, binary.BigEndian.Uint16(b[off+2:])
		off += VLANTagLen
		et = binary.BigEndian.Uint16(b[off:])
	}
	if et != EtherTypeRoCE {
		return errorf("Ethertype 0x%04x, not RoCE v1's 0x%04x", et, EtherTypeRoCE)
	}
	off += 2
	if len(b)-off < GRHLen {
		return errorf("%d bytes after the Ethernet header, shorter than a GRH", len(b)-off)
	}
	g := GRH(b[off : off+GRHLen : off+GRHLen])
	if v := g.IPVer(); v != 6 {
		return errorf("GRH IP version %d, want 6", v)
	}
	if nh := g.NxtHdr(); nh != NxtHdrIBA {
		return errorf("GRH next header 0x%02x, want 0x%02x (IBA transport)", nh, NxtHdrIBA)
	}
	off += GRHLen
	n := int(g.PayLen())
	if n < BTHLen+ICRCLen {
		return errorf("GRH PayLen %d, shorter than a BTH and an ICRC", n)
	}
	if n > len(b)-off {
		return errorf("GRH PayLen %d, but %d bytes follow the GRH", n, len(b)-off)
	}
	f.GRH, f.Transport = g, b[off:off+n:off+n]
	return nil
}

// EthHeader writes into h an Ethernet header from src to dst for RoCE v1
// — with an 802.1Q tag of control information tci when tagged — and
// returns it (EthHeaderLen or EthHeaderLen+VLANTagLen bytes of h).
func EthHeader(h []byte, dst, src [6]byte, tagged bool, tci uint16) []byte {
	copy(h[0:6], dst[:])
	copy(h[6:12], src[:])
	off := 12
	if tagged {
		binary.BigEndian.PutUint16(h[off:], EtherTypeVLAN)
		binary.BigEndian.PutUint16(h[off+2:], tci)
		off += VLANTagLen
	}
	binary.BigEndian.PutUint16(h[off:], EtherTypeRoCE)
	return h[: off+2 : off+2]
}

// TCI is the 802.1Q tag control information of priority pcp (0–7) and
// VLAN vid (0 for a priority-only tag).
func TCI(pcp uint8, vid uint16) uint16 { return uint16(pcp&7)<<13 | vid&0xfff }

// SumGRH is the RoCE v1 ICRC of a transport packet in pieces behind GRH
// g: CRC-32 over 0xFF×8 ‖ g with its traffic class, flow label and hop
// limit set to ones ‖ the BTH with byte 4 set to ones ‖ the rest, up to
// but not including the ICRC. tp's first piece is at least the BTH. The
// Ethernet header and any VLAN tag are not covered. It allocates
// nothing.
func (c *Checksummer) SumGRH(g []byte, tp [][]byte) (uint32, error) {
	if len(g) != GRHLen {
		return 0, errorf("GRH of %d bytes, want %d", len(g), GRHLen)
	}
	if len(tp) == 0 || len(tp[0]) < BTHLen {
		return 0, errorf("transport packet whose first piece is shorter than a BTH")
	}
	n := copy(c.pre[:], g)
	maskIPv6(c.pre[:])
	return c.finish(n, tp), nil
}

// VerifyGRH reports whether the ICRC at the end of pkt, the transport
// packet behind GRH g (PayLen bytes), is right, computing it in c's
// scratch space.
func (c *Checksummer) VerifyGRH(g []byte, pkt []byte) bool {
	if len(pkt) < BTHLen+ICRCLen {
		return false
	}
	end := len(pkt) - ICRCLen
	c.tp[0] = pkt[:end]
	crc, err := c.SumGRH(g, c.tp[:])
	c.tp[0] = nil
	return err == nil && crc == binary.LittleEndian.Uint32(pkt[end:])
}

// PutICRCGRH computes the RoCE v1 ICRC of pkt, a transport packet behind
// GRH g whose last ICRCLen bytes are its ICRC, and writes it there.
func PutICRCGRH(g, pkt []byte) error {
	if len(pkt) < BTHLen+ICRCLen {
		return errorf("transport packet of %d bytes, shorter than a BTH and an ICRC", len(pkt))
	}
	c := checksummers.Get().(*Checksummer)
	defer checksummers.Put(c)
	end := len(pkt) - ICRCLen
	c.tp[0] = pkt[:end]
	crc, err := c.SumGRH(g, c.tp[:])
	c.tp[0] = nil
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(pkt[end:], crc)
	return nil
}
