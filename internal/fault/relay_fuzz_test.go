// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// udpFrame is a frame as a relay reads one on lo: virtio header asking
// for the checksum, Ethernet header of zeros, IPv4 and UDP from 127.0.0.1
// to 127.0.0.2 with payload p, the checksum field holding the
// pseudo-header's sum (as the stack leaves it for the device).
func udpFrame(p []byte) []byte {
	f := make([]byte, vnetHdrLen+14+20+8+len(p))
	f[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
	binary.LittleEndian.PutUint16(f[6:], 14+20) // csum_start
	binary.LittleEndian.PutUint16(f[8:], 6)     // csum_offset
	pkt := f[vnetHdrLen:]
	binary.BigEndian.PutUint16(pkt[12:], unix.ETH_P_IP)
	ip := pkt[14:]
	ip[0], ip[9] = 0x45, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(p)))
	copy(ip[12:], []byte{127, 0, 0, 1, 127, 0, 0, 2})
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(p)))
	copy(udp[8:], p)
	pseudo := make([]byte, 12)
	copy(pseudo, ip[12:20])
	pseudo[9] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pseudo[10:], uint16(8+len(p)))
	binary.BigEndian.PutUint16(udp[6:], onesSum(pseudo))
	return f
}

// udpValid reports whether the UDP checksum of IPv4 packet ip (20-byte
// header) checks, computed from scratch over pseudo-header and datagram.
func udpValid(ip []byte) bool {
	whole := make([]byte, 12, 12+len(ip)-20)
	copy(whole, ip[12:20])
	whole[9] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(whole[10:], uint16(len(ip)-20))
	whole = append(whole, ip[20:]...)
	return onesSum(whole) == 0xffff
}

// TestLocalPacketsChecksum checks the completed checksum of a datagram.
func TestLocalPacketsChecksum(t *testing.T) {
	for _, p := range [][]byte{nil, []byte("x"), []byte("vrdma relay"), make([]byte, 1001)} {
		ps, err := localPackets(udpFrame(p))
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 1 || !udpValid(ps[0]) {
			t.Errorf("payload %q: %d packets, the first's checksum not valid", p, len(ps))
		}
	}
	if _, err := localPackets(make([]byte, 20)); err == nil {
		t.Error("a 20-byte frame was taken for an IPv4 packet")
	}
}

// TestLocalPacketsCutsUDPGSO checks that a UDP GSO datagram is cut into
// datagrams of gso_size, each with its lengths and a valid checksum, their
// payloads together the original's.
func TestLocalPacketsCutsUDPGSO(t *testing.T) {
	payload := make([]byte, 2500)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	f := udpFrame(payload)
	f[1] = virtioGSOUDPL4
	binary.LittleEndian.PutUint16(f[4:], 1000) // gso_size
	ps, err := localPackets(f)
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for i, ip := range ps {
		if n := int(binary.BigEndian.Uint16(ip[2:])); n != len(ip) {
			t.Errorf("datagram %d: IP length %d, packet %d bytes", i, n, len(ip))
		}
		if n := int(binary.BigEndian.Uint16(ip[24:])); n != len(ip)-20 {
			t.Errorf("datagram %d: UDP length %d, datagram %d bytes", i, n, len(ip)-20)
		}
		if !udpValid(ip) {
			t.Errorf("datagram %d: checksum not valid", i)
		}
		got = append(got, ip[28:]...)
	}
	if len(ps) != 3 || string(got) != string(payload) {
		t.Errorf("cut into %d datagrams carrying %d bytes, want 3 carrying the 2500 sent", len(ps), len(got))
	}
}

// FuzzLocalPackets feeds localPackets any frame: it must refuse it or
// return packets no longer than the one in the frame, never panic.
func FuzzLocalPackets(f *testing.F) {
	f.Add(udpFrame([]byte("seed")))
	f.Add(udpFrame(nil))
	f.Add(make([]byte, vnetHdrLen+14+20))
	gso := udpFrame(make([]byte, 300))
	gso[1], gso[4] = virtioGSOUDPL4, 100
	f.Add(gso)
	f.Fuzz(func(t *testing.T, frame []byte) {
		ps, err := localPackets(frame)
		if err != nil {
			return
		}
		for _, ip := range ps {
			if len(ip) > len(frame)-vnetHdrLen-14 {
				t.Fatalf("a frame of %d bytes gave a packet of %d", len(frame), len(ip))
			}
		}
	})
}
