package rocewire

import (
	"encoding/binary"
	"hash/crc32"
)

// The invariant CRC (../shared/specs/rocev2.md §3): CRC-32/IEEE over
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
// transport packet, up to but not including the ICRC, is tp.
//
// It reads the headers in place, feeding the masked bytes from a constant:
// nothing is copied or allocated.
func ICRC(ip, udp, tp []byte) (uint32, error) {
	return ICRCBuffers(ip, udp, [][]byte{tp})
}

// ICRCBuffers is ICRC for a transport packet in pieces, as a sender
// gathers it (headers, then payload straight from memory, then pad): tp
// is the packet up to but not including the ICRC, its first piece at
// least the BTH.
func ICRCBuffers(ip, udp []byte, tp [][]byte) (uint32, error) {
	t := crc32.IEEETable
	crc := crcFF8
	switch {
	case len(ip) == IPv4HeaderLen && ip[0]>>4 == 4:
		crc = crc32.Update(crc, t, ip[0:1])
		crc = crc32.Update(crc, t, ones[:1]) // TOS
		crc = crc32.Update(crc, t, ip[2:8])
		crc = crc32.Update(crc, t, ones[:1]) // TTL
		crc = crc32.Update(crc, t, ip[9:10])
		crc = crc32.Update(crc, t, ones[:2]) // header checksum
		crc = crc32.Update(crc, t, ip[12:20])
	case len(ip) == IPv6HeaderLen && ip[0]>>4 == 6:
		crc = crc32.Update(crc, t, v6First[:]) // version 6 kept, traffic class masked
		crc = crc32.Update(crc, t, ones[:3])   // traffic class, flow label
		crc = crc32.Update(crc, t, ip[4:7])    // payload length, next header
		crc = crc32.Update(crc, t, ones[:1])   // hop limit
		crc = crc32.Update(crc, t, ip[8:40])   // addresses
	default:
		return 0, errorf("the ICRC covers an IPv4 header of 20 bytes or an IPv6 header of 40, not %d bytes (version %d)", len(ip), version(ip))
	}
	if len(udp) != UDPHeaderLen {
		return 0, errorf("UDP header of %d bytes, want %d", len(udp), UDPHeaderLen)
	}
	if len(tp) == 0 || len(tp[0]) < BTHLen {
		return 0, errorf("transport packet whose first piece is shorter than a BTH")
	}
	crc = crc32.Update(crc, t, udp[0:6])
	crc = crc32.Update(crc, t, ones[:2]) // UDP checksum
	crc = crc32.Update(crc, t, tp[0][0:4])
	crc = crc32.Update(crc, t, ones[:1]) // FECN, BECN, reserved
	crc = crc32.Update(crc, t, tp[0][5:])
	for _, b := range tp[1:] {
		crc = crc32.Update(crc, t, b)
	}
	return crc, nil
}

// ones are the masked bytes; v6First an IPv6 header's first byte with
// version 6 and the traffic class's high nibble masked.
var (
	ones    = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	v6First = [1]byte{0x6f}
)

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
