// SPDX-License-Identifier: Apache-2.0

package abi

import "unsafe"

// The memory layouts of the ring files (wire-local.md §5), as Go structs:
// the one source of the offsets the encoders of ring.go use and of the C
// drop-in's guest/ibverbs/vrdma-abi.h, which cgen generates from these
// types (go generate ./internal/abi). Each field's `c` tag is its C name;
// blank fields are reserved bytes. Every field sits at its natural
// alignment, so Go and C lay them out alike (the generated header asserts
// each offset and size). The agent and the library never access shared
// memory through these types: they encode and decode byte slices.

//go:generate go run ./cgen -o ../../guest/ibverbs/vrdma-abi.h

// WireMsgHeader is the header of a command message (CmdHeaderSize bytes):
// "VR", the ABI version, flags, the op, the sequence number and the length
// of the JSON body that follows.
type WireMsgHeader struct {
	Magic   [2]byte `c:"magic"`
	Version uint8   `c:"version"`
	Flags   uint8   `c:"flags"` // FlagResponse, FlagError
	Op      uint16  `c:"op"`
	_       [2]byte
	Seq     uint32 `c:"seq"`
	Len     uint32 `c:"len"`
}

// QPRingState is page 0 of a QP ring file: its ring-state words, each on
// its own 64-byte cache line (wire-local.md §5.2).
type QPRingState struct {
	SQTail     uint32 `c:"sq_tail"` // library: next SQ index it fills
	_          [60]byte
	SQHead     uint32 `c:"sq_head"` // agent: next SQ index it consumes
	_          [60]byte
	SQDoorbell uint32 `c:"sq_doorbell"` // agent: 1 = it sleeps, ring the doorbell after posting
	_          [60]byte
	RQTail     uint32 `c:"rq_tail"` // library
	_          [60]byte
	RQHead     uint32 `c:"rq_head"` // agent
	_          [60]byte
	QPState    uint32 `c:"qp_state"` // agent: the QP's state, for the library's fast checks
	_          [60]byte
	ChanOffer  uint32 `c:"chan_offer"` // agent: bumped when the peer QP got the send channel (§4.22)
	_          [60]byte
}

// CQRingState is page 0 of a CQ ring file (wire-local.md §5.3).
type CQRingState struct {
	CQTail  uint32 `c:"cq_tail"` // agent: next CQ index it fills
	_       [60]byte
	CQHead  uint32 `c:"cq_head"` // library: next CQ index it reads
	_       [60]byte
	CQArmed uint32 `c:"cq_armed"` // library stores 1 to ask for an event; the agent swaps it to 0
	_       [60]byte
}

// WireSendWQE is the header of a send WQE, the first SendHdr bytes of an
// SQ slot; NumSGE SGEs or InlineLen inline bytes follow it.
type WireSendWQE struct {
	WRID       uint64 `c:"wr_id"`
	Opcode     uint8  `c:"opcode"`  // Opcode
	Flags      uint8  `c:"flags"`   // SendFlags
	NumSGE     uint8  `c:"num_sge"` // ignored with SendInline
	_          uint8
	Imm        uint32 `c:"imm_data"` // the immediate as a number
	RemoteAddr uint64 `c:"remote_addr"`
	RKey       uint32 `c:"rkey"`
	InlineLen  uint32 `c:"inline_len"`
	CompareAdd uint64 `c:"compare_add"`
	Swap       uint64 `c:"swap"`
	_          [12]byte
	XRCSRQN    uint32 `c:"xrc_srqn"` // an XRC initiator QP's WQE: the remote XRC SRQ number (xrc.go)
}

// WireRecvWQE is the header of a receive WQE, the first RecvHdr bytes of
// an RQ slot; NumSGE SGEs follow it.
type WireRecvWQE struct {
	WRID   uint64 `c:"wr_id"`
	NumSGE uint8  `c:"num_sge"`
	_      [7]byte
}

// WireSGE is an SGE as it sits in a WQE (SGESize bytes); SGE is its
// decoded form.
type WireSGE struct {
	Addr   uint64 `c:"addr"`
	Length uint32 `c:"length"`
	LKey   uint32 `c:"lkey"`
}

// WireCQE is a completion as it sits in a CQ ring (CQESize bytes).
type WireCQE struct {
	WRID      uint64 `c:"wr_id"`
	QPNum     uint32 `c:"qp_num"`
	Opcode    uint8  `c:"opcode"` // WCOpcode
	Status    uint8  `c:"status"` // WCStatus
	Flags     uint8  `c:"flags"`  // WCFlags
	SL        uint8  `c:"sl"`     // a UD receive's L3 header type, as mlx5 reports it (RoCEUDPIPv4, RoCEUDPIPv6)
	ByteLen   uint32 `c:"byte_len"`
	Imm       uint32 `c:"imm_data"` // the immediate as a number
	SrcQP     uint32 `c:"src_qp"`
	VendorErr uint32 `c:"vendor_err"`
	_         [32]byte
}

// Offsets of the fields, for the encoders.
const (
	mhMagic   = unsafe.Offsetof(WireMsgHeader{}.Magic)
	mhVersion = unsafe.Offsetof(WireMsgHeader{}.Version)
	mhFlags   = unsafe.Offsetof(WireMsgHeader{}.Flags)
	mhOp      = unsafe.Offsetof(WireMsgHeader{}.Op)
	mhSeq     = unsafe.Offsetof(WireMsgHeader{}.Seq)
	mhLen     = unsafe.Offsetof(WireMsgHeader{}.Len)

	swWRID       = unsafe.Offsetof(WireSendWQE{}.WRID)
	swOpcode     = unsafe.Offsetof(WireSendWQE{}.Opcode)
	swFlags      = unsafe.Offsetof(WireSendWQE{}.Flags)
	swNumSGE     = unsafe.Offsetof(WireSendWQE{}.NumSGE)
	swReserved   = swNumSGE + 1
	swImm        = unsafe.Offsetof(WireSendWQE{}.Imm)
	swRemoteAddr = unsafe.Offsetof(WireSendWQE{}.RemoteAddr)
	swRKey       = unsafe.Offsetof(WireSendWQE{}.RKey)
	swInlineLen  = unsafe.Offsetof(WireSendWQE{}.InlineLen)
	swCompareAdd = unsafe.Offsetof(WireSendWQE{}.CompareAdd)
	swSwap       = unsafe.Offsetof(WireSendWQE{}.Swap)
	swXRCSRQN    = unsafe.Offsetof(WireSendWQE{}.XRCSRQN)

	rwWRID   = unsafe.Offsetof(WireRecvWQE{}.WRID)
	rwNumSGE = unsafe.Offsetof(WireRecvWQE{}.NumSGE)

	sgeAddr   = unsafe.Offsetof(WireSGE{}.Addr)
	sgeLength = unsafe.Offsetof(WireSGE{}.Length)
	sgeLKey   = unsafe.Offsetof(WireSGE{}.LKey)

	cqeWRID      = unsafe.Offsetof(WireCQE{}.WRID)
	cqeQPNum     = unsafe.Offsetof(WireCQE{}.QPNum)
	cqeOpcode    = unsafe.Offsetof(WireCQE{}.Opcode)
	cqeStatus    = unsafe.Offsetof(WireCQE{}.Status)
	cqeFlags     = unsafe.Offsetof(WireCQE{}.Flags)
	cqeSL        = unsafe.Offsetof(WireCQE{}.SL)
	cqeByteLen   = unsafe.Offsetof(WireCQE{}.ByteLen)
	cqeImm       = unsafe.Offsetof(WireCQE{}.Imm)
	cqeSrcQP     = unsafe.Offsetof(WireCQE{}.SrcQP)
	cqeVendorErr = unsafe.Offsetof(WireCQE{}.VendorErr)
)

// The sizes the ring geometry uses are those of the layouts; a layout
// that changes size without them does not compile.
var (
	_ [CmdHeaderSize - unsafe.Sizeof(WireMsgHeader{})]struct{}
	_ [unsafe.Sizeof(WireMsgHeader{}) - CmdHeaderSize]struct{}
	_ [SendHdr - unsafe.Sizeof(WireSendWQE{})]struct{}
	_ [unsafe.Sizeof(WireSendWQE{}) - SendHdr]struct{}
	_ [RecvHdr - unsafe.Sizeof(WireRecvWQE{})]struct{}
	_ [unsafe.Sizeof(WireRecvWQE{}) - RecvHdr]struct{}
	_ [SGESize - unsafe.Sizeof(WireSGE{})]struct{}
	_ [unsafe.Sizeof(WireSGE{}) - SGESize]struct{}
	_ [CQESize - unsafe.Sizeof(WireCQE{})]struct{}
	_ [unsafe.Sizeof(WireCQE{}) - CQESize]struct{}
	_ [HeaderSize - unsafe.Sizeof(QPRingState{})]struct{} // the words fit page 0
	_ [HeaderSize - unsafe.Sizeof(CQRingState{})]struct{}
)
