// SPDX-License-Identifier: Apache-2.0

package rdmatest

import (
	"encoding/binary"
	"net/netip"

	"github.com/vrdma/vrdma/internal/rocewire"
)

// SealLoopback writes the ICRC of pkt (a BTH first, its last 4 bytes the
// ICRC's room) as a lone IPv4 datagram from addr:4791 to addr:4791 would
// carry it: a packet a test injects into an engine that sends to itself,
// as if the network had brought it.
func SealLoopback(pkt []byte, addr netip.Addr) error {
	n := len(pkt)
	var hdr [rocewire.IPv4HeaderLen + rocewire.UDPHeaderLen]byte
	hdr[0], hdr[2], hdr[3], hdr[6], hdr[9] = 0x45, byte((28+n)>>8), byte(28+n), 0x40, 17
	a := addr.As4()
	copy(hdr[12:], a[:])
	copy(hdr[16:], a[:])
	binary.BigEndian.PutUint16(hdr[20:], 4791)
	binary.BigEndian.PutUint16(hdr[22:], 4791)
	binary.BigEndian.PutUint16(hdr[24:], uint16(8+n))
	return rocewire.PutICRC(hdr[:20], hdr[20:], pkt)
}
