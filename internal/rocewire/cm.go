// SPDX-License-Identifier: Apache-2.0

package rocewire

// Communication Management MADs: how RDMA CM connects RC QPs over RoCE.
// A CM message is one 256-byte MAD, the payload of a UD SEND_ONLY packet
// from QP1 to QP1 with the GSI Q_Key (QP1QKey); its layouts are the
// InfiniBand Architecture Specification's chapter 12 (and Annex A11 for
// RDMA CM's service IDs and private-data header), as Linux's cm_msgs.h
// and Wireshark read them. Bit fields are numbered from a byte's most
// significant bit, as the specification draws them.
//
// A message is a struct (REQ, REP, RTU, REJ, MRA, DREQ, DREP) with Put,
// which writes it into a MAD after the header, and Read, which checks and
// reads one; ParseMAD checks a MAD's header. Nothing allocates.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// MAD sizes and the constants of CM MADs.
const (
	MADLen       = 256 // a MAD on QP1, header and data
	MADHeaderLen = 24  // the common MAD header
	CMDataLen    = MADLen - MADHeaderLen
	QP1QKey      = 0x80010000 // the GSI Q_Key (IB_QP1_QKEY)
	GSIQPN       = 1          // QP1, the General Services Interface QP

	MADBaseVersion = 1
	MgmtClassCM    = 0x07 // Communication Management
	CMClassVersion = 2
	MADMethodSend  = 0x03
	cmaVersion     = 0 // the IP CM header's version (cma_hdr.cma_version)
)

// CMAttr is a CM MAD's attribute ID: which message it carries.
type CMAttr uint16

// The CM messages RDMA CM uses (IBTA 16.7.2; LAP, APR and SIDR are not).
const (
	AttrREQ  CMAttr = 0x0010 // ConnectRequest
	AttrMRA  CMAttr = 0x0011 // MsgRcptAck
	AttrREJ  CMAttr = 0x0012 // ConnectReject
	AttrREP  CMAttr = 0x0013 // ConnectReply
	AttrRTU  CMAttr = 0x0014 // ReadyToUse
	AttrDREQ CMAttr = 0x0015 // DisconnectRequest
	AttrDREP CMAttr = 0x0016 // DisconnectReply
)

func (a CMAttr) String() string {
	switch a {
	case AttrREQ:
		return "REQ"
	case AttrMRA:
		return "MRA"
	case AttrREJ:
		return "REJ"
	case AttrREP:
		return "REP"
	case AttrRTU:
		return "RTU"
	case AttrDREQ:
		return "DREQ"
	case AttrDREP:
		return "DREP"
	}
	return fmt.Sprintf("CMAttr(0x%04x)", uint16(a))
}

// MAD is a view of a whole MAD (MADLen bytes).
type MAD []byte

// BaseVersion is the MAD format's version (1).
func (m MAD) BaseVersion() uint8 { return m[0] }

// MgmtClass is the management class (MgmtClassCM for CM).
func (m MAD) MgmtClass() uint8 { return m[1] }

// ClassVersion is the class's version (CMClassVersion for CM).
func (m MAD) ClassVersion() uint8 { return m[2] }

// Method is the MAD's method (MADMethodSend for CM messages).
func (m MAD) Method() uint8 { return m[3] }

// Status is the MAD's status field.
func (m MAD) Status() uint16 { return binary.BigEndian.Uint16(m[4:]) }

// TID is the transaction ID: a message and the answers to it share it.
func (m MAD) TID() uint64 { return binary.BigEndian.Uint64(m[8:]) }

// Attr is the attribute ID: which CM message the MAD carries.
func (m MAD) Attr() CMAttr { return CMAttr(binary.BigEndian.Uint16(m[16:])) }

// AttrMod is the attribute modifier.
func (m MAD) AttrMod() uint32 { return binary.BigEndian.Uint32(m[20:]) }

// Data is the MAD's data after the header: the CM message.
func (m MAD) Data() []byte { return m[MADHeaderLen:MADLen] }

// EncodeCM writes a CM MAD header (base version 1, class CM version 2,
// method Send, status 0) with transaction ID tid and attribute attr, and
// zeroes the data.
func (m MAD) EncodeCM(tid uint64, attr CMAttr) {
	clear(m[:MADLen])
	m[0], m[1], m[2], m[3] = MADBaseVersion, MgmtClassCM, CMClassVersion, MADMethodSend
	binary.BigEndian.PutUint64(m[8:], tid)
	binary.BigEndian.PutUint16(m[16:], uint16(attr))
}

// Errors of ParseMAD and the messages' Read.
var (
	ErrMADLength = errors.New("CM MAD: not 256 bytes")
	ErrNotCM     = errors.New("CM MAD: not a CM Send MAD (base version 1, class 0x07 version 2, method 0x03)")
	ErrCMAttr    = errors.New("CM MAD: an attribute RDMA CM does not use")
	ErrCMField   = errors.New("CM MAD: a field out of its range")
)

// ParseMAD checks that b is one CM MAD of a message RDMA CM uses, and
// returns its view.
func ParseMAD(b []byte) (MAD, error) {
	if len(b) != MADLen {
		return nil, ErrMADLength
	}
	m := MAD(b)
	if m.BaseVersion() != MADBaseVersion || m.MgmtClass() != MgmtClassCM || m.ClassVersion() != CMClassVersion || m.Method() != MADMethodSend {
		return nil, ErrNotCM
	}
	if a := m.Attr(); a < AttrREQ || a > AttrDREP {
		return nil, ErrCMAttr
	}
	return m, nil
}

func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }
func get24(b []byte) uint32    { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

// REQ is a ConnectRequest (IBTA 12.6.5), primary path only.
type REQ struct {
	LocalCommID         uint32
	ServiceID           uint64
	LocalCAGUID         uint64
	LocalQKey           uint32
	LocalQPN            uint32 // 24 bits
	ResponderResources  uint8
	InitiatorDepth      uint8
	RemoteCMRespTimeout uint8 // 5 bits: 4.096 µs × 2^n
	TransportType       uint8 // 2 bits: 0 RC, 1 UC
	EndToEndFlowControl bool
	StartingPSN         uint32 // 24 bits
	LocalCMRespTimeout  uint8  // 5 bits
	RetryCount          uint8  // 3 bits
	PKey                uint16
	PathMTU             uint8 // 4 bits: 1 256 … 5 4096
	RNRRetryCount       uint8 // 3 bits
	MaxCMRetries        uint8 // 4 bits
	SRQ                 bool
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID [16]byte
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6 bits
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalAckTimeout     uint8 // 5 bits
	PrivateData         [REQPrivateLen]byte
}

// REQPrivateLen is the size of a REQ's private data.
const REQPrivateLen = 92

// Put writes r as m's data (after EncodeCM with AttrREQ).
func (r *REQ) Put(m MAD) {
	d := m.Data()
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint64(d[8:], r.ServiceID)
	binary.BigEndian.PutUint64(d[16:], r.LocalCAGUID)
	binary.BigEndian.PutUint32(d[28:], r.LocalQKey)
	put24(d[32:], r.LocalQPN)
	d[35] = r.ResponderResources
	d[39] = r.InitiatorDepth
	d[43] = r.RemoteCMRespTimeout<<3 | r.TransportType&3<<1 | bit(r.EndToEndFlowControl, 1)
	put24(d[44:], r.StartingPSN)
	d[47] = r.LocalCMRespTimeout<<3 | r.RetryCount&7
	binary.BigEndian.PutUint16(d[48:], r.PKey)
	d[50] = r.PathMTU<<4 | r.RNRRetryCount&7
	d[51] = r.MaxCMRetries<<4 | bit(r.SRQ, 0x08)
	binary.BigEndian.PutUint16(d[52:], r.LocalLID)
	binary.BigEndian.PutUint16(d[54:], r.RemoteLID)
	copy(d[56:72], r.LocalGID[:])
	copy(d[72:88], r.RemoteGID[:])
	binary.BigEndian.PutUint32(d[88:], r.FlowLabel<<12|uint32(r.PacketRate&0x3f))
	d[92], d[93] = r.TrafficClass, r.HopLimit
	d[94] = r.SL<<4 | bit(r.SubnetLocal, 0x08)
	d[95] = r.LocalAckTimeout << 3
	copy(d[140:], r.PrivateData[:])
}

// Read reads a REQ from m, checking the fields whose range is narrower
// than their bits: the QPN and PSN are 24 bits by construction.
func (r *REQ) Read(m MAD) error {
	d := m.Data()
	*r = REQ{
		LocalCommID:         binary.BigEndian.Uint32(d[0:]),
		ServiceID:           binary.BigEndian.Uint64(d[8:]),
		LocalCAGUID:         binary.BigEndian.Uint64(d[16:]),
		LocalQKey:           binary.BigEndian.Uint32(d[28:]),
		LocalQPN:            get24(d[32:]),
		ResponderResources:  d[35],
		InitiatorDepth:      d[39],
		RemoteCMRespTimeout: d[43] >> 3,
		TransportType:       d[43] >> 1 & 3,
		EndToEndFlowControl: d[43]&1 != 0,
		StartingPSN:         get24(d[44:]),
		LocalCMRespTimeout:  d[47] >> 3,
		RetryCount:          d[47] & 7,
		PKey:                binary.BigEndian.Uint16(d[48:]),
		PathMTU:             d[50] >> 4,
		RNRRetryCount:       d[50] & 7,
		MaxCMRetries:        d[51] >> 4,
		SRQ:                 d[51]&0x08 != 0,
		LocalLID:            binary.BigEndian.Uint16(d[52:]),
		RemoteLID:           binary.BigEndian.Uint16(d[54:]),
		FlowLabel:           binary.BigEndian.Uint32(d[88:]) >> 12,
		PacketRate:          d[91] & 0x3f,
		TrafficClass:        d[92],
		HopLimit:            d[93],
		SL:                  d[94] >> 4,
		SubnetLocal:         d[94]&0x08 != 0,
		LocalAckTimeout:     d[95] >> 3,
	}
	copy(r.LocalGID[:], d[56:72])
	copy(r.RemoteGID[:], d[72:88])
	copy(r.PrivateData[:], d[140:])
	if r.PathMTU < 1 || r.PathMTU > 5 || r.TransportType > 1 {
		return fmt.Errorf("%w: REQ with path MTU code %d (1..5) or transport type %d (0 RC, 1 UC)", ErrCMField, r.PathMTU, r.TransportType)
	}
	return nil
}

// REP is a ConnectReply (IBTA 12.6.8).
type REP struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  uint32 // 24 bits
	StartingPSN               uint32 // 24 bits
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetAckDelay            uint8 // 5 bits
	FailoverAccepted          uint8 // 2 bits
	EndToEndFlowControl       bool
	RNRRetryCount             uint8 // 3 bits
	SRQ                       bool
	LocalCAGUID               uint64
	PrivateData               [REPPrivateLen]byte
}

// REPPrivateLen is the size of a REP's private data.
const REPPrivateLen = 196

// Put writes r as m's data (after EncodeCM with AttrREP).
func (r *REP) Put(m MAD) {
	d := m.Data()
	binary.BigEndian.PutUint32(d[0:], r.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], r.RemoteCommID)
	binary.BigEndian.PutUint32(d[8:], r.LocalQKey)
	put24(d[12:], r.LocalQPN)
	put24(d[20:], r.StartingPSN)
	d[24], d[25] = r.ResponderResources, r.InitiatorDepth
	d[26] = r.TargetAckDelay<<3 | r.FailoverAccepted&3<<1 | bit(r.EndToEndFlowControl, 1)
	d[27] = r.RNRRetryCount<<5 | bit(r.SRQ, 0x10)
	binary.BigEndian.PutUint64(d[28:], r.LocalCAGUID)
	copy(d[36:], r.PrivateData[:])
}

// Read reads a REP from m.
func (r *REP) Read(m MAD) error {
	d := m.Data()
	*r = REP{
		LocalCommID:         binary.BigEndian.Uint32(d[0:]),
		RemoteCommID:        binary.BigEndian.Uint32(d[4:]),
		LocalQKey:           binary.BigEndian.Uint32(d[8:]),
		LocalQPN:            get24(d[12:]),
		StartingPSN:         get24(d[20:]),
		ResponderResources:  d[24],
		InitiatorDepth:      d[25],
		TargetAckDelay:      d[26] >> 3,
		FailoverAccepted:    d[26] >> 1 & 3,
		EndToEndFlowControl: d[26]&1 != 0,
		RNRRetryCount:       d[27] >> 5,
		SRQ:                 d[27]&0x10 != 0,
		LocalCAGUID:         binary.BigEndian.Uint64(d[28:]),
	}
	copy(r.PrivateData[:], d[36:])
	return nil
}

// CommIDs are the two communication IDs every message after a REQ
// carries first: the sender's and the receiver's.
type CommIDs struct{ Local, Remote uint32 }

func (c CommIDs) put(d []byte) {
	binary.BigEndian.PutUint32(d[0:], c.Local)
	binary.BigEndian.PutUint32(d[4:], c.Remote)
}

func readCommIDs(d []byte) CommIDs {
	return CommIDs{binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:])}
}

// RTU is a ReadyToUse (IBTA 12.6.9); DREP a DisconnectReply (12.6.11):
// the communication IDs and private data.
type RTU struct {
	CommIDs
	PrivateData [RTUPrivateLen]byte
}

// RTUPrivateLen is the size of an RTU's or a DREP's private data.
const RTUPrivateLen = 224

// Put writes r as m's data.
func (r *RTU) Put(m MAD) { d := m.Data(); r.CommIDs.put(d); copy(d[8:], r.PrivateData[:]) }

// Read reads an RTU from m.
func (r *RTU) Read(m MAD) error {
	d := m.Data()
	r.CommIDs = readCommIDs(d)
	copy(r.PrivateData[:], d[8:])
	return nil
}

// DREP is a DisconnectReply; its layout is an RTU's.
type DREP = RTU

// DREQ is a DisconnectRequest (IBTA 12.6.10).
type DREQ struct {
	CommIDs
	RemoteQPN   uint32 // 24 bits: the receiver's QP
	PrivateData [DREQPrivateLen]byte
}

// DREQPrivateLen is the size of a DREQ's private data.
const DREQPrivateLen = 220

// Put writes r as m's data.
func (r *DREQ) Put(m MAD) {
	d := m.Data()
	r.CommIDs.put(d)
	put24(d[8:], r.RemoteQPN)
	copy(d[12:], r.PrivateData[:])
}

// Read reads a DREQ from m.
func (r *DREQ) Read(m MAD) error {
	d := m.Data()
	r.CommIDs, r.RemoteQPN = readCommIDs(d), get24(d[8:])
	copy(r.PrivateData[:], d[12:])
	return nil
}

// Which message an MRA or a REJ is about (2 bits).
const (
	MsgREQ   = 0
	MsgREP   = 1
	MsgOther = 2 // LAP for an MRA; "other" for a REJ
)

// REJ is a ConnectReject (IBTA 12.6.7).
type REJ struct {
	CommIDs
	MessageRejected uint8 // 2 bits: MsgREQ, MsgREP, MsgOther
	RejectInfoLen   uint8 // 7 bits: bytes of ARI that count
	Reason          uint16
	ARI             [72]byte
	PrivateData     [REJPrivateLen]byte
}

// REJPrivateLen is the size of a REJ's private data.
const REJPrivateLen = 148

// Reject reasons RDMA CM sends or acts on (IBTA table 112; Linux
// ib_cm.h).
const (
	RejNoQP            = 1
	RejTimeout         = 4  // the sender's CM timed out waiting for an answer
	RejInvalidServerID = 8  // no listener on the service ID
	RejStaleConn       = 10 // the QPN is in use by another connection of the peer
	RejConsumer        = 28 // the application refused (rdma_reject)
)

// Put writes r as m's data.
func (r *REJ) Put(m MAD) {
	d := m.Data()
	r.CommIDs.put(d)
	d[8] = r.MessageRejected << 6
	d[9] = r.RejectInfoLen << 1
	binary.BigEndian.PutUint16(d[10:], r.Reason)
	copy(d[12:84], r.ARI[:])
	copy(d[84:], r.PrivateData[:])
}

// Read reads a REJ from m.
func (r *REJ) Read(m MAD) error {
	d := m.Data()
	r.CommIDs, r.MessageRejected, r.RejectInfoLen, r.Reason = readCommIDs(d), d[8]>>6, d[9]>>1, binary.BigEndian.Uint16(d[10:])
	copy(r.ARI[:], d[12:84])
	copy(r.PrivateData[:], d[84:])
	if r.MessageRejected > MsgOther || r.RejectInfoLen > 72 {
		return fmt.Errorf("%w: REJ of message %d (0..2) with %d bytes of reject information (at most 72)", ErrCMField, r.MessageRejected, r.RejectInfoLen)
	}
	return nil
}

// MRA is a MsgRcptAck (IBTA 12.6.6): the sender needs more time before
// it answers the message named.
type MRA struct {
	CommIDs
	MessageMRAed   uint8 // 2 bits: MsgREQ, MsgREP, MsgOther
	ServiceTimeout uint8 // 5 bits: 4.096 µs × 2^n more
	PrivateData    [MRAPrivateLen]byte
}

// MRAPrivateLen is the size of an MRA's private data.
const MRAPrivateLen = 222

// Put writes r as m's data.
func (r *MRA) Put(m MAD) {
	d := m.Data()
	r.CommIDs.put(d)
	d[8] = r.MessageMRAed << 6
	d[9] = r.ServiceTimeout << 3
	copy(d[10:], r.PrivateData[:])
}

// Read reads an MRA from m.
func (r *MRA) Read(m MAD) error {
	d := m.Data()
	r.CommIDs, r.MessageMRAed, r.ServiceTimeout = readCommIDs(d), d[8]>>6, d[9]>>3
	copy(r.PrivateData[:], d[10:])
	if r.MessageMRAed > MsgOther {
		return fmt.Errorf("%w: MRA of message %d (0..2)", ErrCMField, r.MessageMRAed)
	}
	return nil
}

// RDMA CM's port spaces (rdma_cma.h): the high half of a service ID's
// low 32 bits.
const (
	PortSpaceTCP = 0x0106
	PortSpaceUDP = 0x0111
	PortSpaceIB  = 0x013F
)

// ServiceID is RDMA CM's service ID of port space ps and port (IBTA
// Annex A11): 0x0000_0000_PPPP_pppp.
func ServiceID(ps, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// ServicePort returns the port space and port of an RDMA CM service ID;
// ok is false for a service ID outside RDMA CM's range.
func ServicePort(sid uint64) (ps, port uint16, ok bool) {
	ps, port = uint16(sid>>16), uint16(sid)
	return ps, port, sid>>32 == 0 && (ps == PortSpaceTCP || ps == PortSpaceUDP || ps == PortSpaceIB)
}

// CMAHeaderLen is the size of RDMA CM's IP header at the start of a REQ's
// private data (cma_hdr); the application's private data follows it.
const CMAHeaderLen = 36

// CMAHeader is RDMA CM's IP addressing in a REQ's private data: the
// source port and the two addresses, IPv4 or IPv6.
type CMAHeader struct {
	SrcPort  uint16
	Src, Dst netip.Addr
}

// Put writes h into b (at least CMAHeaderLen bytes). An IPv4 address
// takes the last 4 of its 16 bytes, the rest zero.
func (h *CMAHeader) Put(b []byte) {
	clear(b[:CMAHeaderLen])
	b[0] = cmaVersion
	b[1] = 0x40
	if h.Src.Is6() && !h.Src.Is4In6() {
		b[1] = 0x60
	}
	binary.BigEndian.PutUint16(b[2:], h.SrcPort)
	for i, a := range []netip.Addr{h.Src, h.Dst} {
		f := b[4+16*i : 20+16*i]
		if b[1] == 0x40 {
			v := a.Unmap().As4()
			copy(f[12:], v[:])
		} else {
			v := a.As16()
			copy(f, v[:])
		}
	}
}

// ReadCMAHeader reads RDMA CM's IP header from private data b.
func ReadCMAHeader(b []byte) (CMAHeader, error) {
	if len(b) < CMAHeaderLen {
		return CMAHeader{}, fmt.Errorf("%w: RDMA CM header of %d bytes (%d)", ErrCMField, len(b), CMAHeaderLen)
	}
	if b[0] != cmaVersion {
		return CMAHeader{}, fmt.Errorf("%w: RDMA CM header version %d (0)", ErrCMField, b[0])
	}
	h := CMAHeader{SrcPort: binary.BigEndian.Uint16(b[2:])}
	switch b[1] >> 4 {
	case 4:
		h.Src = netip.AddrFrom4([4]byte(b[16:20]))
		h.Dst = netip.AddrFrom4([4]byte(b[32:36]))
	case 6:
		h.Src = netip.AddrFrom16([16]byte(b[4:20]))
		h.Dst = netip.AddrFrom16([16]byte(b[20:36]))
	default:
		return CMAHeader{}, fmt.Errorf("%w: RDMA CM header IP version %d (4 or 6)", ErrCMField, b[1]>>4)
	}
	return h, nil
}
