// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"encoding/binary"
	"fmt"
)

// Unreliable datagram QPs and address handles (ops 35 and 36,
// docs/wire-local.md §4.15, capability bit ud). A UD QP is created with
// CreateQP.Type QPTypeUD; it is never connected: each SEND names its
// destination by an address handle (create-ah), the remote QPN and the
// remote Q_Key, which a send WQE of a UD QP carries in the fields an RC
// WQE uses for its remote address and rkey (UDDest, SetUDDest). A receive
// gets the 40-byte GRH in front of the payload (GRHSize, PutGRH).

// QPTypeUD is an unreliable datagram QP (IBV_QPT_UD).
const QPTypeUD QPType = "UD"

// Attribute mask bits of a UD QP, valued as in ibv_qp_attr_mask.
const (
	MaskPKeyIndex QPAttrMask = 1 << 4 // IBV_QP_PKEY_INDEX: the only P_Key, index 0
	MaskQKey      QPAttrMask = 1 << 6 // IBV_QP_QKEY
)

// WCGRH: the receive completion's buffer starts with the 40-byte GRH
// (IBV_WC_GRH), as every receive of a UD QP's does.
const WCGRH WCFlags = 1 << 1

// GRHSize is the size of the global route header in front of a UD
// receive's payload (struct ibv_grh): on RoCE v2, IPv4 addresses take
// its last 20 bytes as an IPv4 header, IPv6 ones all 40 as an IPv6
// header, as Linux's software RoCE writes them.
const GRHSize = 40

// PrivilegedQKey is the Q_Key bit that only privileged processes may set
// on a QP (IB_QP_SET_QKEY: root or CAP_NET_RAW, as Linux checks); a send
// WR whose remote Q_Key has it uses the QP's own Q_Key instead (IBTA).
const PrivilegedQKey = 0x80000000

// MaxUDMessage is the largest UD message an adapter with active MTU mtu
// carries: one packet's payload, the MTU (ibv_devinfo's active_mtu). A
// larger SEND completes with LOC_LEN_ERR.
func MaxUDMessage(mtu uint32) uint32 { return mtu }

// UDDest reads a UD send WQE's destination: the address handle (in the
// rkey's place), the remote QPN (the low 24 bits of the remote address)
// and the remote Q_Key (its high 32 bits).
func UDDest(w *SendWQE) (ah, qpn, qkey uint32) {
	return w.RKey, uint32(w.RemoteAddr) & 0xffffff, uint32(w.RemoteAddr >> 32)
}

// SetUDDest writes a UD send WQE's destination (UDDest).
func SetUDDest(w *SendWQE, ah, qpn, qkey uint32) {
	w.RKey = ah
	w.RemoteAddr = uint64(qpn&0xffffff) | uint64(qkey)<<32
}

// CreateAH creates an address handle in protection domain PD
// (ibv_create_ah): a destination of a UD QP's SENDs, by GID. A RoCE
// address always has a GRH; the agent resolves the GID to a path as it
// does a connection's, by the same rules, and refuses one that does not
// qualify.
type CreateAH struct {
	PD           uint32 `json:"pd"`
	DGID         GID    `json:"dgid"`
	SGIDIndex    uint8  `json:"sgid_index"`
	HopLimit     uint8  `json:"hop_limit"`
	TrafficClass uint8  `json:"traffic_class"`
	FlowLabel    uint32 `json:"flow_label"`
	Port         uint8  `json:"port_num"`
}

// Validate checks the address.
func (c *CreateAH) Validate() error {
	switch {
	case c.DGID.IsZero():
		return Errorf(CodeInvalid, "dgid", "an address handle needs the destination's GID (ah_attr.is_global and grh.dgid): RoCE has no LIDs")
	case c.Port != 0 && c.Port != 1:
		return Errorf(CodeInvalid, "port_num", "port %d does not exist: adapters have port 1", c.Port)
	case c.SGIDIndex != 0:
		return Errorf(CodeInvalid, "sgid_index", "GID index %d does not exist: adapters have one GID, index 0", c.SGIDIndex)
	case c.FlowLabel >= 1<<20:
		return Errorf(CodeInvalid, "flow_label", "flow label 0x%x does not fit 20 bits", c.FlowLabel)
	}
	return nil
}

// CreateAHReply returns the address handle and the path its datagrams
// take.
type CreateAHReply struct {
	Handle uint32   `json:"handle"`
	Path   PathInfo `json:"path"`
}

// GRH are the fields of a GRH a UD receive starts with.
type GRH struct {
	SGID, DGID   GID
	TrafficClass uint8
	HopLimit     uint8
	FlowLabel    uint32
	PayLen       uint32 // the datagram's payload bytes
}

// The SL a UD receive's completion reports (ibv_wc.sl): on RoCE, mlx5
// devices put the received packet's type there (bit 3: a UDP header, RoCE
// v2; bits 0–2: 1 IPv6, 2 IPv4, 0 a GRH), and UCX's ud_verbs reads it to
// find the destination address in the 40 bytes in front of the message
// (a datagram whose destination is not its own is dropped). vrdma writes
// the GRH as RoCE v2 and reports its type so.
const (
	RoCEUDPIPv6 uint8 = 0x8 | 1
	RoCEUDPIPv4 uint8 = 0x8 | 2
)

// GRHType is the SL a receive reports for a GRH PutGRH writes from g.
func GRHType(g *GRH) uint8 {
	if mapped4(g.SGID) && mapped4(g.DGID) {
		return RoCEUDPIPv4
	}
	return RoCEUDPIPv6
}

// PutGRH writes g into b (GRHSize bytes) as a RoCE v2 device does: for
// IPv4-mapped GIDs, 20 zero bytes then an IPv4 header (its checksum
// valid, so that ibv_init_ah_from_wc reads it as IPv4); otherwise an IPv6
// header.
func PutGRH(b []byte, g *GRH) {
	_ = b[GRHSize-1]
	clear(b[:GRHSize])
	s4, d4 := mapped4(g.SGID), mapped4(g.DGID)
	if s4 && d4 {
		h := b[20:40]
		h[0] = 0x45
		h[1] = g.TrafficClass
		// total length: IPv4 + UDP + BTH + DETH + payload + ICRC, as on the wire
		binary.BigEndian.PutUint16(h[2:], uint16(20+8+12+8+g.PayLen+4))
		h[6] = 0x40 // DF
		h[8] = g.HopLimit
		h[9] = 17 // UDP
		copy(h[12:16], g.SGID[12:])
		copy(h[16:20], g.DGID[12:])
		binary.BigEndian.PutUint16(h[10:], ipv4Checksum(h))
		return
	}
	binary.BigEndian.PutUint32(b[0:], 6<<28|uint32(g.TrafficClass)<<20|g.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(b[4:], uint16(8+12+8+g.PayLen+4))
	b[6] = 17
	b[7] = g.HopLimit
	copy(b[8:24], g.SGID[:])
	copy(b[24:40], g.DGID[:])
}

// ParseGRH reads the GRH in b (GRHSize bytes, PutGRH's form): the source
// and destination GIDs, traffic class and hop limit. It fails on bytes
// that are neither a valid IPv4 header in the last 20 nor an IPv6 header.
func ParseGRH(b []byte) (GRH, error) {
	if len(b) < GRHSize {
		return GRH{}, fmt.Errorf("GRH of %d bytes, want %d", len(b), GRHSize)
	}
	h := b[20:40]
	if h[0] == 0x45 && ipv4Checksum(h) == binary.BigEndian.Uint16(h[10:]) {
		var g GRH
		g.SGID, g.DGID = mappedGID(h[12:16]), mappedGID(h[16:20])
		g.TrafficClass, g.HopLimit = h[1], h[8]
		if n := int(binary.BigEndian.Uint16(h[2:])) - (20 + 8 + 12 + 8 + 4); n >= 0 {
			g.PayLen = uint32(n)
		}
		return g, nil
	}
	if b[0]>>4 != 6 {
		return GRH{}, fmt.Errorf("GRH is neither an IPv4 header (in bytes 20..39, checksum valid) nor an IPv6 header (version %d)", b[0]>>4)
	}
	var g GRH
	vtf := binary.BigEndian.Uint32(b)
	g.TrafficClass, g.FlowLabel = uint8(vtf>>20), vtf&0xfffff
	g.HopLimit = b[7]
	copy(g.SGID[:], b[8:24])
	copy(g.DGID[:], b[24:40])
	if n := int(binary.BigEndian.Uint16(b[4:])) - (8 + 12 + 8 + 4); n >= 0 {
		g.PayLen = uint32(n)
	}
	return g, nil
}

// mapped4 reports whether g is an IPv4-mapped GID (::ffff:a.b.c.d).
func mapped4(g GID) bool {
	for _, c := range g[:10] {
		if c != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

func mappedGID(a []byte) GID {
	var g GID
	g[10], g[11] = 0xff, 0xff
	copy(g[12:], a)
	return g
}

// ipv4Checksum is the header checksum of the 20-byte IPv4 header h, its
// checksum field taken as zero.
func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i < 20; i += 2 {
		if i == 10 {
			continue
		}
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
