// SPDX-License-Identifier: Apache-2.0

package rdma

// The IPv4 ID a receiver cannot see (conn.go). The kernel gives the k-th
// segment of a GSO batch ID k; a UDP socket shows neither the ID nor where
// a lone datagram sat in the batch it was cut from. The CRC is linear, so
// the ICRC of a packet with ID k differs from the one with ID 0 by a value
// that depends only on k and on how many bytes follow the ID: the receiver
// computes the ICRC with the ID it expects and, when that is not the one
// on the wire, looks the difference up among those of IDs below
// maxSegments for that length.

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"

	"github.com/vrdma/vrdma/internal/rocewire"
)

// idDeltas holds, per packet length, the ICRC differences of IDs 0 to
// maxSegments-1 against ID 0; owned by the engine's reader. A length's
// table is built on first need and kept: at most maxCachedLengths of
// them, the cache emptied beyond (lengths come from peers).
type idDeltas struct {
	byLen map[int]*[maxSegments]uint32
	last  int // the length of the last table looked up, which is lastT
	lastT *[maxSegments]uint32

	sum rocewire.Checksummer
	ipu [maxIPUDP]byte
	tp  [1][]byte
}

const maxCachedLengths = 64

// idBits are the IDs of one bit, as the header holds them.
var idBits = [6][2]byte{{0, 1}, {0, 2}, {0, 4}, {0, 8}, {0, 16}, {0, 32}}

// zeros feeds the CRC the bytes after the ID, whose values cancel out.
var zeros [maxDatagram + rocewire.IPv4HeaderLen + rocewire.UDPHeaderLen]byte

// verify reports whether pkt (the transport packet with its ICRC), from
// src to dst, carries the ICRC of its IP header: on IPv4 with ID id, or
// failing that with any ID below maxSegments.
func (d *idDeltas) verify(src, dst netip.AddrPort, pkt []byte, id uint16) bool {
	if len(pkt) < rocewire.BTHLen+rocewire.ICRCLen || len(pkt) > maxDatagram {
		return false
	}
	ip, udp := ipUDP(d.ipu[:], src, dst, len(pkt), 0)
	end := len(pkt) - rocewire.ICRCLen
	d.tp[0] = pkt[:end]
	crc0, err := d.sum.Sum(ip, udp, d.tp[:])
	d.tp[0] = nil
	if err != nil {
		return false
	}
	diff := crc0 ^ binary.LittleEndian.Uint32(pkt[end:])
	if diff == 0 {
		return true
	}
	if !src.Addr().Is4() {
		return false // IPv6 has no ID
	}
	t := d.table(len(pkt))
	if id < maxSegments && t[id] == diff {
		return true
	}
	for _, x := range t[1:] {
		if x == diff {
			return true
		}
	}
	return false
}

// table returns the differences for packets of n bytes.
func (d *idDeltas) table(n int) *[maxSegments]uint32 {
	if d.lastT != nil && d.last == n {
		return d.lastT
	}
	t, ok := d.byLen[n]
	if !ok {
		t = d.build(n)
	}
	d.last, d.lastT = n, t
	return t
}

// build makes and keeps the table for packets of n bytes.
func (d *idDeltas) build(n int) *[maxSegments]uint32 {
	if d.byLen == nil || len(d.byLen) >= maxCachedLengths {
		d.byLen = make(map[int]*[maxSegments]uint32)
	}
	// The CRC input after the ID: the rest of the IP header (14 bytes),
	// the UDP header and the packet up to its ICRC.
	after := rocewire.IPv4HeaderLen - 6 + rocewire.UDPHeaderLen + n - rocewire.ICRCLen
	base := crc32.Update(0, crc32.IEEETable, zeros[:2+after])
	var bit [6]uint32 // maxSegments is 2^6
	for b := range bit {
		bit[b] = crc32.Update(crc32.Update(0, crc32.IEEETable, idBits[b][:]), crc32.IEEETable, zeros[:after]) ^ base
	}
	t := new([maxSegments]uint32)
	for k := range t {
		for b := range bit {
			if k&(1<<b) != 0 {
				t[k] ^= bit[b]
			}
		}
	}
	d.byLen[n] = t
	return t
}
