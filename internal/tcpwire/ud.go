// SPDX-License-Identifier: Apache-2.0

package tcpwire

// Datagram frames (UD_SEND, UD_SEND_IMM; docs/wire-tcp.md, "Datagrams")
// carry one UD message between two QPs. Nothing answers them: a frame the
// receiver cannot deliver is dropped there. The header's DstQPN and
// SrcQPN are the two QPs, RKey the Q_Key, ImmOrLen the immediate
// (UD_SEND_IMM), RemoteAddr the GRH fields (DatagramRoute); the payload
// starts with the source and destination GIDs (DatagramPrefix bytes),
// then the message, at most MaxDatagram bytes.

// DatagramPrefix is the length of the GIDs in front of a datagram's
// message.
const DatagramPrefix = 32

// MaxDatagram is the largest UD message a frame carries: the largest
// MTU.
const MaxDatagram = 4096

// IsDatagram reports whether t is a datagram frame.
func (t Type) IsDatagram() bool { return t == UDSend || t == UDSendImm }

// DatagramRoute packs a datagram's GRH fields into a header's
// RemoteAddr: traffic class, hop limit and the 20-bit flow label.
func DatagramRoute(trafficClass, hopLimit uint8, flowLabel uint32) uint64 {
	return uint64(trafficClass)<<32 | uint64(hopLimit)<<24 | uint64(flowLabel&0xfffff)
}

// SplitDatagramRoute unpacks DatagramRoute.
func SplitDatagramRoute(v uint64) (trafficClass, hopLimit uint8, flowLabel uint32) {
	return uint8(v >> 32), uint8(v >> 24), uint32(v) & 0xfffff
}

// PutDatagramPrefix writes the source and destination GIDs into
// b[:DatagramPrefix].
func PutDatagramPrefix(b []byte, sgid, dgid [16]byte) {
	copy(b[:16], sgid[:])
	copy(b[16:32], dgid[:])
}

// DatagramGIDs reads the GIDs of a datagram's payload prefix (at least
// DatagramPrefix bytes).
func DatagramGIDs(b []byte) (sgid, dgid [16]byte) {
	copy(sgid[:], b[:16])
	copy(dgid[:], b[16:32])
	return sgid, dgid
}
