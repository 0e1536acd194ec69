// SPDX-License-Identifier: Apache-2.0

package rocewire

import (
	"encoding/binary"
	"hash/crc32"
	"sync"
)

// The invariant CRC (the RoCE v2 annex; Linux rxe's rxe_icrc.c): CRC-32/IEEE over
// 0xFF×8 ‖ IP header ‖ UDP header ‖ the transport packet up to the ICRC,
// with the fields routers may change masked to ones — IPv4 TOS, TTL and
// header checksum; IPv6 traffic class, flow label and hop limit; the UDP
// checksum; BTH byte 4 (FECN, BECN, reserved) — and placed on the wire
// least significant byte first.

// crcFF8 is the CRC register after the eight 0xFF bytes of the masked LRH.
var crcFF8 = crc32.Update(0, crc32.IEEETable, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})

// IP header lengths the ICRC covers.
const (
	IPv4HeaderLen = 20 // no options: RoCEv2 sends none
	IPv6HeaderLen = 40
	UDPHeaderLen  = 8
)

// ICRC computes the invariant CRC of a packet whose IP header is ip
// (IPv4 without options, or IPv6), whose UDP header is udp and whose
// transport packet, up to but not including the ICRC, is tp. It
// allocates nothing.
func ICRC(ip, udp, tp []byte) (uint32, error) {
	c := checksummers.Get().(*Checksummer)
	defer checksummers.Put(c)
	c.tp[0] = tp
	crc, err := c.Sum(ip, udp, c.tp[:])
	c.tp[0] = nil
	return crc, err
}

var checksummers = sync.Pool{New: func() any { return new(Checksummer) }}

// A Checksummer computes ICRCs, in its own scratch space: the masked
// headers are put together there and fed to the CRC in one piece, and
// nothing is allocated (hash/crc32 keeps what it is given from the
// stack). Not safe for concurrent use.
type Checksummer struct {
	pre [IPv6HeaderLen + UDPHeaderLen + BTHLen]byte
	tp  [1][]byte
}

// Sum is the ICRC of a transport packet in pieces, as a sender gathers
// it (headers, then payload straight from memory, then pad): tp is the
// packet up to but not including the ICRC, its first piece at least the
// BTH.
func (c *Checksummer) Sum(ip, udp []byte, tp [][]byte) (uint32, error) {
	n := copy(c.pre[:], ip)
	switch {
	case len(ip) == IPv4HeaderLen && ip[0]>>4 == 4:
		c.pre[1] = 0xff                   // TOS
		c.pre[8] = 0xff                   // TTL
		c.pre[10], c.pre[11] = 0xff, 0xff // header checksum
	case len(ip) == IPv6HeaderLen && ip[0]>>4 == 6:
		maskIPv6(c.pre[:])
	default:
		return 0, errorf("the ICRC covers an IPv4 header of 20 bytes or an IPv6 header of 40, not %d bytes (version %d)", len(ip), version(ip))
	}
	if len(udp) != UDPHeaderLen {
		return 0, errorf("UDP header of %d bytes, want %d", len(udp), UDPHeaderLen)
	}
	if len(tp) == 0 || len(tp[0]) < BTHLen {
		return 0, errorf("transport packet whose first piece is shorter than a BTH")
	}
	n += copy(c.pre[n:], udp)
	c.pre[n-2], c.pre[n-1] = 0xff, 0xff // UDP checksum
	return c.finish(n, tp), nil
}

// maskIPv6 sets to ones the fields of the IPv6 header (or RoCE v1 GRH,
// which has its layout) at the start of h that routers may change: the
// traffic class, the flow label and the hop limit.
func maskIPv6(h []byte) {
	h[0] |= 0x0f                        // traffic class (high nibble)
	h[1], h[2], h[3] = 0xff, 0xff, 0xff // traffic class, flow label
	h[7] = 0xff                         // hop limit
}

// finish appends tp's BTH, masked, to the n bytes of masked headers in
// c.pre and returns the CRC of those and the rest of tp.
func (c *Checksummer) finish(n int, tp [][]byte) uint32 {
	n += copy(c.pre[n:], tp[0][:BTHLen])
	c.pre[n-BTHLen+4] = 0xff // FECN, BECN, reserved
	t := crc32.IEEETable
	crc := crc32.Update(crcFF8, t, c.pre[:n])
	crc = crc32.Update(crc, t, tp[0][BTHLen:])
	for _, b := range tp[1:] {
		crc = crc32.Update(crc, t, b)
	}
	return crc
}

func version(ip []byte) int {
	if len(ip) == 0 {
		return 0
	}
	return int(ip[0] >> 4)
}

// PutICRC computes the ICRC of pkt, a transport packet whose last
// ICRCLen bytes are its ICRC, and writes it there.
func PutICRC(ip, udp, pkt []byte) error {
	if len(pkt) < BTHLen+ICRCLen {
		return errorf("transport packet of %d bytes, shorter than a BTH and an ICRC", len(pkt))
	}
	end := len(pkt) - ICRCLen
	crc, err := ICRC(ip, udp, pkt[:end])
	if err != nil {
		return err
	}
	binary.LittleEndian.PutUint32(pkt[end:], crc)
	return nil
}

// VerifyICRC reports whether the ICRC at the end of pkt is right.
func VerifyICRC(ip, udp, pkt []byte) (bool, error) {
	if len(pkt) < BTHLen+ICRCLen {
		return false, errorf("transport packet of %d bytes, shorter than a BTH and an ICRC", len(pkt))
	}
	end := len(pkt) - ICRCLen
	crc, err := ICRC(ip, udp, pkt[:end])
	if err != nil {
		return false, err
	}
	return crc == binary.LittleEndian.Uint32(pkt[end:]), nil
}
