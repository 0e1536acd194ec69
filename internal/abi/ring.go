// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Ring index rules, as in PVRDMA (pvrdma_ring.h): a ring has a power-of-two
// number of slots, size; producer and consumer indices run over 2*size so
// that full (tail == head^size) and empty (tail == head) differ. An index
// is valid iff idx &^ (2*size-1) == 0. Indices live in shared memory and the
// other side may write anything there: every index read from a ring must be
// checked with ValidIndex, and counts with Pending, before use.

// ValidIndex reports whether idx is a legal index for a ring of size slots.
func ValidIndex(idx, size uint32) bool { return idx&^(2*size-1) == 0 }

// Pending returns how many entries lie between head and tail, and whether
// that is a legal count (at most size).
func Pending(tail, head, size uint32) (uint32, bool) {
	if !ValidIndex(tail, size) || !ValidIndex(head, size) {
		return 0, false
	}
	n := (tail - head) & (2*size - 1)
	return n, n <= size
}

// Next returns the index after idx.
func Next(idx, size uint32) uint32 { return (idx + 1) & (2*size - 1) }

// Slot returns the slot number of idx.
func Slot(idx, size uint32) uint32 { return idx & (size - 1) }

// Limits on ring geometry. They bound what a workload may ask for, so the
// memory an agent maps for rings stays small and known.
const (
	MaxQPWR    = 4096  // max_qp_wr: slots per send or receive queue
	MaxCQE     = 65536 // max_cqe: slots per completion queue
	MaxSGE     = 16    // max_sge: SGEs per work request
	MaxInline  = 256   // max_inline_data, bytes
	CQESize    = 64    // bytes per completion entry
	SGESize    = 16    // bytes per SGE
	SendHdr    = 64    // bytes of a send WQE before its SGEs or inline data
	RecvHdr    = 16    // bytes of a receive WQE before its SGEs
	HeaderSize = 4096  // the ring-state page at the start of every ring file
	MaxStride  = 4096  // the largest send or receive stride a layout may have
)

// Offsets of the ring-state words in the header page (QPRingState,
// CQRingState). Each word sits on its own cache line. "P" words are written
// by the producer, "C" words by the consumer, and flags as documented.
const (
	// QP ring file.
	OffSQTail     = int(unsafe.Offsetof(QPRingState{}.SQTail))     // u32, library: next SQ slot it will fill
	OffSQHead     = int(unsafe.Offsetof(QPRingState{}.SQHead))     // u32, agent: next SQ slot it will consume
	OffSQDoorbell = int(unsafe.Offsetof(QPRingState{}.SQDoorbell)) // u32, agent: 1 = agent sleeps, ring the doorbell after posting
	OffRQTail     = int(unsafe.Offsetof(QPRingState{}.RQTail))     // u32, library
	OffRQHead     = int(unsafe.Offsetof(QPRingState{}.RQHead))     // u32, agent
	OffQPState    = int(unsafe.Offsetof(QPRingState{}.QPState))    // u32, agent: the QP's state, for the library's fast checks
	OffChanOffer  = int(unsafe.Offsetof(QPRingState{}.ChanOffer))  // u32, agent: bumped when the peer QP got the send channel

	// CQ ring file.
	OffCQTail  = int(unsafe.Offsetof(CQRingState{}.CQTail))  // u32, agent: next CQE slot it will fill
	OffCQHead  = int(unsafe.Offsetof(CQRingState{}.CQHead))  // u32, library: next CQE slot it will read
	OffCQArmed = int(unsafe.Offsetof(CQRingState{}.CQArmed)) // u32, library sets 1 to ask for an event; agent clears it and signals
)

// QPLayout is the geometry of a QP's ring file: header page, then the send
// queue, then the receive queue, each starting on a page boundary.
type QPLayout struct {
	SQEntries uint32 `json:"sq_entries"`
	SQStride  uint32 `json:"sq_stride"`
	RQEntries uint32 `json:"rq_entries"`
	RQStride  uint32 `json:"rq_stride"`
	SQOffset  uint32 `json:"sq_offset"`
	RQOffset  uint32 `json:"rq_offset"`
	Size      uint32 `json:"size"`
}

// CQLayout is the geometry of a CQ's ring file: header page, then the CQEs.
type CQLayout struct {
	Entries uint32 `json:"entries"`
	Offset  uint32 `json:"offset"`
	Size    uint32 `json:"size"`
}

func roundPow2(n uint32) uint32 {
	p := uint32(1)
	for p < n {
		p <<= 1
	}
	return p
}

func roundPage(n uint32) uint32 { return (n + HeaderSize - 1) &^ (HeaderSize - 1) }

// QPCaps are the sizes a QP is created with (ibv_qp_cap).
type QPCaps struct {
	MaxSendWR     uint32 `json:"max_send_wr"`
	MaxRecvWR     uint32 `json:"max_recv_wr"`
	MaxSendSGE    uint32 `json:"max_send_sge"`
	MaxRecvSGE    uint32 `json:"max_recv_sge"`
	MaxInlineData uint32 `json:"max_inline_data"`
}

// NewQPLayout checks caps against the device limits and returns the ring
// geometry, with the caps rounded up to what the rings really hold.
func NewQPLayout(c QPCaps) (QPLayout, QPCaps, error) {
	switch {
	case c.MaxSendWR == 0 || c.MaxSendWR > MaxQPWR:
		return QPLayout{}, c, fmt.Errorf("max_send_wr %d out of range 1..%d (max_qp_wr)", c.MaxSendWR, MaxQPWR)
	case c.MaxRecvWR == 0 || c.MaxRecvWR > MaxQPWR:
		return QPLayout{}, c, fmt.Errorf("max_recv_wr %d out of range 1..%d (max_qp_wr)", c.MaxRecvWR, MaxQPWR)
	case c.MaxSendSGE > MaxSGE:
		return QPLayout{}, c, fmt.Errorf("max_send_sge %d exceeds max_sge %d", c.MaxSendSGE, MaxSGE)
	case c.MaxRecvSGE > MaxSGE:
		return QPLayout{}, c, fmt.Errorf("max_recv_sge %d exceeds max_sge %d", c.MaxRecvSGE, MaxSGE)
	case c.MaxInlineData > MaxInline:
		return QPLayout{}, c, fmt.Errorf("max_inline_data %d exceeds the device's %d", c.MaxInlineData, MaxInline)
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 1
	}
	var l QPLayout
	l.SQEntries = roundPow2(c.MaxSendWR)
	l.RQEntries = roundPow2(c.MaxRecvWR)
	l.SQStride = roundPow2(SendHdr + max(c.MaxSendSGE*SGESize, c.MaxInlineData))
	l.RQStride = roundPow2(RecvHdr + c.MaxRecvSGE*SGESize)
	c.MaxSendWR, c.MaxRecvWR = l.SQEntries, l.RQEntries
	c.MaxSendSGE = (l.SQStride - SendHdr) / SGESize
	c.MaxSendSGE = min(c.MaxSendSGE, MaxSGE)
	c.MaxRecvSGE = min((l.RQStride-RecvHdr)/SGESize, MaxSGE)
	c.MaxInlineData = min(l.SQStride-SendHdr, MaxInline)
	l.SQOffset = HeaderSize
	l.RQOffset = l.SQOffset + roundPage(l.SQEntries*l.SQStride)
	l.Size = l.RQOffset + roundPage(l.RQEntries*l.RQStride)
	return l, c, nil
}

// Check verifies a layout received from the other side against the size of
// the file that backs it, so that no slot lies outside the mapping.
func (l QPLayout) Check(fileSize int64) error {
	ok := l.SQEntries > 0 && l.SQEntries <= MaxQPWR && l.SQEntries&(l.SQEntries-1) == 0 &&
		l.RQEntries > 0 && l.RQEntries <= MaxQPWR && l.RQEntries&(l.RQEntries-1) == 0 &&
		l.SQStride >= SendHdr+SGESize && l.SQStride <= MaxStride && l.RQStride >= RecvHdr+SGESize && l.RQStride <= MaxStride &&
		l.SQOffset >= HeaderSize && uint64(l.RQOffset) >= uint64(l.SQOffset)+uint64(l.SQEntries)*uint64(l.SQStride) &&
		uint64(l.RQOffset)+uint64(l.RQEntries)*uint64(l.RQStride) <= uint64(l.Size) &&
		int64(l.Size) <= fileSize
	if !ok {
		return fmt.Errorf("QP ring layout %+v does not fit its %d-byte ring file", l, fileSize)
	}
	return nil
}

// NewCQLayout returns the geometry of a CQ of at least cqe entries.
func NewCQLayout(cqe uint32) (CQLayout, error) {
	if cqe == 0 || cqe > MaxCQE {
		return CQLayout{}, fmt.Errorf("cqe %d out of range 1..%d (max_cqe)", cqe, MaxCQE)
	}
	n := roundPow2(cqe)
	return CQLayout{Entries: n, Offset: HeaderSize, Size: HeaderSize + roundPage(n*CQESize)}, nil
}

// Check verifies a CQ layout against the size of its file.
func (l CQLayout) Check(fileSize int64) error {
	ok := l.Entries > 0 && l.Entries <= MaxCQE && l.Entries&(l.Entries-1) == 0 && l.Offset >= HeaderSize &&
		uint64(l.Offset)+uint64(l.Entries)*CQESize <= uint64(l.Size) && int64(l.Size) <= fileSize
	if !ok {
		return fmt.Errorf("CQ ring layout %+v does not fit its %d-byte ring file", l, fileSize)
	}
	return nil
}

// SGE is a scatter/gather element: Length bytes at guest address Addr,
// inside the memory region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWQE is a decoded send work request. Decoding into a reused value does
// not allocate.
type SendWQE struct {
	WRID       uint64
	Opcode     Opcode
	Flags      SendFlags
	NumSGE     uint8
	Imm        uint32
	RemoteAddr uint64
	RKey       uint32
	InlineLen  uint32
	CompareAdd uint64
	Swap       uint64
	XRCSRQN    uint32 // an XRC initiator QP's: the remote XRC SRQ number (24 bits)
	SGE        [MaxSGE]SGE
}

var le = binary.LittleEndian

func putSGE(b []byte, s *SGE) {
	le.PutUint64(b[sgeAddr:], s.Addr)
	le.PutUint32(b[sgeLength:], s.Length)
	le.PutUint32(b[sgeLKey:], s.LKey)
}

func getSGE(b []byte) SGE {
	return SGE{Addr: le.Uint64(b[sgeAddr:]), Length: le.Uint32(b[sgeLength:]), LKey: le.Uint32(b[sgeLKey:])}
}

// EncodeSend writes w into slot (one SQ stride), with inline data if the
// SendInline flag is set. The caller has checked sizes against the caps.
func EncodeSend(slot []byte, w *SendWQE, inline []byte) {
	le.PutUint64(slot[swWRID:], w.WRID)
	slot[swOpcode] = byte(w.Opcode)
	slot[swFlags] = byte(w.Flags)
	slot[swNumSGE] = w.NumSGE
	slot[swReserved] = 0
	le.PutUint32(slot[swImm:], w.Imm)
	le.PutUint64(slot[swRemoteAddr:], w.RemoteAddr)
	le.PutUint32(slot[swRKey:], w.RKey)
	le.PutUint32(slot[swInlineLen:], w.InlineLen)
	le.PutUint64(slot[swCompareAdd:], w.CompareAdd)
	le.PutUint64(slot[swSwap:], w.Swap)
	le.PutUint32(slot[swXRCSRQN:], w.XRCSRQN)
	if w.Flags&SendInline != 0 {
		copy(slot[SendHdr:], inline)
		return
	}
	for i := 0; i < int(w.NumSGE); i++ {
		o := SendHdr + i*SGESize
		putSGE(slot[o:], &w.SGE[i])
	}
}

// WQEError says why a work request was refused before any memory was
// touched; Status is the completion status it gets.
type WQEError struct {
	Status WCStatus
	Msg    string
}

func (e *WQEError) Error() string { return e.Status.String() + ": " + e.Msg }

// DecodeSend decodes slot, a private copy of one SQ slot, into w. It checks
// everything that can be checked without the QP's context: the opcode, the
// SGE count against maxSGE, and the inline length against maxInline. The
// returned status is WCSuccess when the WQE is well formed.
func DecodeSend(slot []byte, w *SendWQE, maxSGE, maxInline uint32) WCStatus {
	if len(slot) < SendHdr {
		return WCLocQPOpErr
	}
	w.WRID = le.Uint64(slot[swWRID:])
	w.Opcode = Opcode(slot[swOpcode])
	w.Flags = SendFlags(slot[swFlags])
	w.NumSGE = slot[swNumSGE]
	w.Imm = le.Uint32(slot[swImm:])
	w.RemoteAddr = le.Uint64(slot[swRemoteAddr:])
	w.RKey = le.Uint32(slot[swRKey:])
	w.InlineLen = le.Uint32(slot[swInlineLen:])
	w.CompareAdd = le.Uint64(slot[swCompareAdd:])
	w.Swap = le.Uint64(slot[swSwap:])
	w.XRCSRQN = le.Uint32(slot[swXRCSRQN:]) & MaxSRQN
	if !w.Opcode.Valid() {
		return WCLocQPOpErr
	}
	if w.Flags&SendInline != 0 {
		if w.InlineLen > maxInline || uint64(SendHdr)+uint64(w.InlineLen) > uint64(len(slot)) {
			return WCLocLenErr
		}
		if w.Opcode == OpRDMARead || w.Opcode.IsAtomic() {
			return WCLocQPOpErr // inline data is a source; READ and atomics need a destination
		}
		w.NumSGE = 0
		return WCSuccess
	}
	if uint32(w.NumSGE) > min(maxSGE, MaxSGE) || int(SendHdr+uint32(w.NumSGE)*SGESize) > len(slot) {
		return WCLocLenErr
	}
	for i := 0; i < int(w.NumSGE); i++ {
		o := SendHdr + i*SGESize
		w.SGE[i] = getSGE(slot[o:])
	}
	return WCSuccess
}

// Inline returns the inline bytes of a decoded WQE within its slot copy.
func Inline(slot []byte, w *SendWQE) []byte { return slot[SendHdr : SendHdr+w.InlineLen] }

// RecvWQE is a decoded receive work request.
type RecvWQE struct {
	WRID   uint64
	NumSGE uint8
	SGE    [MaxSGE]SGE
}

// EncodeRecv writes w into slot (one RQ stride).
func EncodeRecv(slot []byte, w *RecvWQE) {
	le.PutUint64(slot[rwWRID:], w.WRID)
	slot[rwNumSGE] = w.NumSGE
	for i := 0; i < int(w.NumSGE); i++ {
		o := RecvHdr + i*SGESize
		putSGE(slot[o:], &w.SGE[i])
	}
}

// DecodeRecv decodes slot, a private copy of one RQ slot, into w, checking
// the SGE count against maxSGE.
func DecodeRecv(slot []byte, w *RecvWQE, maxSGE uint32) WCStatus {
	if len(slot) < RecvHdr {
		return WCLocQPOpErr
	}
	w.WRID = le.Uint64(slot[rwWRID:])
	w.NumSGE = slot[rwNumSGE]
	if uint32(w.NumSGE) > min(maxSGE, MaxSGE) || int(RecvHdr+uint32(w.NumSGE)*SGESize) > len(slot) {
		return WCLocLenErr
	}
	for i := 0; i < int(w.NumSGE); i++ {
		o := RecvHdr + i*SGESize
		w.SGE[i] = getSGE(slot[o:])
	}
	return WCSuccess
}

// CQE is a work completion as it sits in a CQ ring (64 bytes).
type CQE struct {
	WRID      uint64
	QPNum     uint32
	Opcode    WCOpcode
	Status    WCStatus
	Flags     WCFlags
	SL        uint8 // a UD receive's: RoCEUDPIPv4 or RoCEUDPIPv6; 0 otherwise
	ByteLen   uint32
	Imm       uint32
	SrcQP     uint32
	VendorErr uint32
}

// EncodeCQE writes c into slot (CQESize bytes).
func EncodeCQE(slot []byte, c *CQE) {
	_ = slot[CQESize-1]
	le.PutUint64(slot[cqeWRID:], c.WRID)
	le.PutUint32(slot[cqeQPNum:], c.QPNum)
	slot[cqeOpcode] = byte(c.Opcode)
	slot[cqeStatus] = byte(c.Status)
	slot[cqeFlags] = byte(c.Flags)
	slot[cqeSL] = c.SL
	le.PutUint32(slot[cqeByteLen:], c.ByteLen)
	le.PutUint32(slot[cqeImm:], c.Imm)
	le.PutUint32(slot[cqeSrcQP:], c.SrcQP)
	le.PutUint32(slot[cqeVendorErr:], c.VendorErr)
}

// DecodeCQE reads the completion in slot.
func DecodeCQE(slot []byte, c *CQE) {
	_ = slot[CQESize-1]
	c.WRID = le.Uint64(slot[cqeWRID:])
	c.QPNum = le.Uint32(slot[cqeQPNum:])
	c.Opcode = WCOpcode(slot[cqeOpcode])
	c.Status = WCStatus(slot[cqeStatus])
	c.Flags = WCFlags(slot[cqeFlags])
	c.SL = slot[cqeSL]
	c.ByteLen = le.Uint32(slot[cqeByteLen:])
	c.Imm = le.Uint32(slot[cqeImm:])
	c.SrcQP = le.Uint32(slot[cqeSrcQP:])
	c.VendorErr = le.Uint32(slot[cqeVendorErr:])
}
