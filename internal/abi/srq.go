// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"fmt"
	"unsafe"
)

// Shared receive queues (ops 31..34, docs/wire-local.md §4.14). An SRQ
// is a receive ring of its own, which the library fills as it fills a
// QP's receive queue (the same WQE format, RecvHdr bytes and SGEs per
// slot) and which the agent consumes for every QP created on it: the
// responder of whichever QP a message arrives for takes the WQE at the
// SRQ's head, under the SRQ's one consumer lock.

// SRQRingState is page 0 of an SRQ ring file: its tail (the library's)
// and head (the agent's), each on its own 64-byte cache line.
type SRQRingState struct {
	SRQTail uint32 `c:"srq_tail"` // library: next SRQ index it fills
	_       [60]byte
	SRQHead uint32 `c:"srq_head"` // agent: next SRQ index it consumes
	_       [60]byte
}

// Offsets of the SRQ ring-state words.
const (
	OffSRQTail = int(unsafe.Offsetof(SRQRingState{}.SRQTail)) // u32, library: next SRQ slot it will fill
	OffSRQHead = int(unsafe.Offsetof(SRQRingState{}.SRQHead)) // u32, agent: next SRQ slot it will consume
)

var _ [HeaderSize - unsafe.Sizeof(SRQRingState{})]struct{} // the words fit page 0

// Limits of an SRQ: max_srq_wr and max_srq_sge.
const (
	MaxSRQWR  = MaxQPWR
	MaxSRQSGE = MaxSGE
)

// SRQAttr are an SRQ's attributes (ibv_srq_attr): its size in work
// requests, SGEs per work request, and the armed limit (0: not armed).
type SRQAttr struct {
	MaxWR  uint32 `json:"max_wr"`
	MaxSGE uint32 `json:"max_sge"`
	Limit  uint32 `json:"srq_limit"`
}

// SRQLayout is the geometry of an SRQ's ring file: the header page, then
// Entries slots of Stride bytes from Offset.
type SRQLayout struct {
	Entries uint32 `json:"entries"`
	Stride  uint32 `json:"stride"`
	Offset  uint32 `json:"offset"`
	Size    uint32 `json:"size"`
}

// NewSRQLayout checks a's sizes against the device's limits and returns
// the ring geometry, with a's sizes rounded up to what the ring holds.
func NewSRQLayout(a SRQAttr) (SRQLayout, SRQAttr, error) {
	switch {
	case a.MaxWR == 0 || a.MaxWR > MaxSRQWR:
		return SRQLayout{}, a, fmt.Errorf("max_wr %d out of range 1..%d (max_srq_wr)", a.MaxWR, MaxSRQWR)
	case a.MaxSGE > MaxSRQSGE:
		return SRQLayout{}, a, fmt.Errorf("max_sge %d exceeds max_srq_sge %d", a.MaxSGE, MaxSRQSGE)
	}
	// a.Limit is taken as it is, as rxe takes it (ibv_create_srq(3) calls
	// it irrelevant at create; a limit above the size fires at the first
	// receive taken).
	if a.MaxSGE == 0 {
		a.MaxSGE = 1
	}
	var l SRQLayout
	l.Entries = roundPow2(a.MaxWR)
	l.Stride = roundPow2(RecvHdr + a.MaxSGE*SGESize)
	a.MaxWR = l.Entries
	a.MaxSGE = min((l.Stride-RecvHdr)/SGESize, MaxSRQSGE)
	l.Offset = HeaderSize
	l.Size = l.Offset + roundPage(l.Entries*l.Stride)
	return l, a, nil
}

// Check verifies an SRQ layout received from the other side against the
// size of the file that backs it, so that no slot lies outside the
// mapping.
func (l SRQLayout) Check(fileSize int64) error {
	ok := l.Entries > 0 && l.Entries <= MaxSRQWR && l.Entries&(l.Entries-1) == 0 &&
		l.Stride >= RecvHdr+SGESize && l.Stride <= MaxStride && l.Offset >= HeaderSize &&
		uint64(l.Offset)+uint64(l.Entries)*uint64(l.Stride) <= uint64(l.Size) && int64(l.Size) <= fileSize
	if !ok {
		return fmt.Errorf("SRQ ring layout %+v does not fit its %d-byte ring file", l, fileSize)
	}
	return nil
}

// CreateSRQ creates a shared receive queue in protection domain PD
// (ibv_create_srq).
type CreateSRQ struct {
	PD   uint32  `json:"pd"`
	Attr SRQAttr `json:"attr"`
	// Type SRQTypeXRC makes an XRC SRQ (capability xrc, xrc.go) in XRC
	// domain XRCD, whose receives complete in CQ; "" is a basic SRQ.
	Type string `json:"srq_type,omitempty"`
	XRCD uint32 `json:"xrcd,omitempty"`
	CQ   uint32 `json:"cq,omitempty"`
}

// Validate checks the type.
func (c *CreateSRQ) Validate() error {
	switch {
	case c.Type != "" && c.Type != "basic" && c.Type != SRQTypeXRC:
		return Errorf(CodeInvalid, "srq_type", "SRQ type %q is not supported: basic or xrc (tag matching needs hardware)", c.Type)
	case c.Type == SRQTypeXRC && (c.XRCD == 0 || c.CQ == 0):
		return Errorf(CodeInvalid, "xrcd", "an XRC SRQ needs its XRC domain and its CQ (IBV_SRQ_INIT_ATTR_XRCD, IBV_SRQ_INIT_ATTR_CQ)")
	case c.Type != SRQTypeXRC && (c.XRCD != 0 || c.CQ != 0):
		return Errorf(CodeInvalid, "xrcd", "only an XRC SRQ takes an XRC domain and a CQ")
	}
	return nil
}

// CreateSRQReply returns the SRQ, its real sizes and its ring geometry;
// SRQN is an XRC SRQ's number, which senders name (ibv_get_srq_num).
type CreateSRQReply struct {
	Handle uint32    `json:"handle"`
	Attr   SRQAttr   `json:"attr"`
	Layout SRQLayout `json:"layout"`
	SRQN   uint32    `json:"srq_num,omitempty"`
}

// SRQAttrMask selects what a ModifySRQ changes (ibv_srq_attr_mask).
type SRQAttrMask uint32

// SRQ attribute mask bits, valued as in enum ibv_srq_attr_mask.
const (
	SRQMaskMaxWR SRQAttrMask = 1 << 0 // IBV_SRQ_MAX_WR: resize (vrdma does not: no IBV_DEVICE_SRQ_RESIZE)
	SRQMaskLimit SRQAttrMask = 1 << 1 // IBV_SRQ_LIMIT: arm the limit event
)

// ModifySRQ changes the attributes of SRQ Handle that Mask selects.
type ModifySRQ struct {
	Handle uint32      `json:"handle"`
	Mask   SRQAttrMask `json:"mask"`
	Attr   SRQAttr     `json:"attr"`
}

// Validate checks the mask.
func (m *ModifySRQ) Validate() error {
	if m.Mask&^(SRQMaskMaxWR|SRQMaskLimit) != 0 {
		return Errorf(CodeInvalid, "mask", "unknown SRQ attribute mask bits 0x%x", uint32(m.Mask&^(SRQMaskMaxWR|SRQMaskLimit)))
	}
	return nil
}
