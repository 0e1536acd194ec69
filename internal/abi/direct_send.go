// SPDX-License-Identifier: Apache-2.0

package abi

import "fmt"

// The send channel of the memcpy-direct path (capability direct-send, ops
// 63 and 67; docs/wire-local.md §4.22). For an RC QP pair bound to
// memcpy-direct whose two sessions set CapDirect and CapDirectSend, the
// agent makes one shared file of two rings, one per direction, and grants
// it to each side's library (a slot in its grant table, revoked as a
// region grant is). The sender's library writes a small SEND or
// SEND_WITH_IMM into a slot of the ring it produces into; the receiver's
// library takes it with a receive of its own RQ, copies it and makes the
// receive completion; the sender makes the send completion from the
// receiver's verdict. Whatever the receiver will not take it refuses, and
// the sender retracts and relays it and every later one (the agent's
// relayed memcpy path gives every case its right status).

// The channel file's geometry: two rings, each a header then Entries
// slots of Stride bytes.
const (
	// ChanHeaderSize is the bytes of a ring's header: ChanRingHeader.
	ChanHeaderSize = 512
	// OffChanTail, OffChanHead, OffChanRxArmed, OffChanTxArmed and
	// OffChanReady are the offsets of a ring header's words, each on
	// its own cache line.
	OffChanTail    = 0
	OffChanHead    = 64
	OffChanRxArmed = 128
	OffChanTxArmed = 192
	OffChanReady   = 256
	// ChanSlotHeader is the bytes of a slot's header (ChanSlot); the
	// message's bytes follow it.
	ChanSlotHeader = 64
	// OffSlotState, OffSlotOpcode, OffSlotFlags, OffSlotStatus,
	// OffSlotLength and OffSlotImm are the offsets of a slot header's
	// fields.
	OffSlotState  = 0
	OffSlotOpcode = 4
	OffSlotFlags  = 5
	OffSlotStatus = 6
	OffSlotLength = 8
	OffSlotImm    = 12

	// ChanMaxEntries and the stride bounds are what a library accepts
	// in a DirectChannel; ChanStride and the entries between
	// ChanMinEntries and ChanAgentMaxEntries are what this agent makes.
	ChanMaxEntries      = 4096
	ChanMinStride       = 128
	ChanMaxStride       = 65536
	ChanStride          = 4096 + ChanSlotHeader // 4 KiB of message a slot
	ChanMinEntries      = 16
	ChanAgentMaxEntries = 256
	// ChanRelayNS is the agent's relay_ns: how long a posted slot may
	// wait untaken before its sender retracts and relays it.
	ChanRelayNS = 1_000_000
)

// HoldsChannel reports whether a QP in state s may hold and take from a
// send channel: RTR or RTS. A QP in RTR receives through it (a
// receive-only QP may stay there, as perftest's ib_send_bw server does);
// it sends through it once in RTS; the channel stays across the move.
func (s QPState) HoldsChannel() bool { return s == QPSRTR || s == QPSRTS }

// The states of a channel slot (its state word).
const (
	SlotFree      uint32 = 0 // the sender's to fill (it reaped the slot)
	SlotPosted    uint32 = 1 // the sender published a message
	SlotTaken     uint32 = 2 // the receiver is taking it (CAS 1 → 2)
	SlotDone      uint32 = 3 // the receiver took it: status is its verdict
	SlotRetracted uint32 = 4 // the sender took it back (CAS 1 → 4 or 5 → 4) and relays it
	SlotRefused   uint32 = 5 // the receiver will not take it (CAS 2 → 5): the sender retracts and relays it
)

// The flags of a channel slot (the bits of the send WQE's flags).
const (
	ChanFlagSignaled  uint8 = uint8(SendSignaled)
	ChanFlagSolicited uint8 = uint8(SendSolicited)
)

// ChanRingHeader is the header of one ring of a channel file
// (wire-local.md §4.22); every word is accessed atomically.
type ChanRingHeader struct {
	Tail    uint32 `c:"tail"` // sender: the next index it fills (§5.1 index rule)
	_       [60]byte
	Head    uint32 `c:"head"` // receiver: the next index it takes
	_       [60]byte
	RxArmed uint32 `c:"rx_armed"` // receiver: its receive CQ is armed (ArmAll, ArmSolicited); the sender swaps it to 0
	_       [60]byte
	TxArmed uint32 `c:"tx_armed"` // sender: its send CQ is armed (ArmAll); the receiver swaps it to 0
	_       [60]byte
	Ready   uint32 `c:"ready"` // receiver: 1 once it mapped the ring and takes messages from it
	_       [252]byte
}

// ChanSlot is the header of a channel slot; Length message bytes follow.
type ChanSlot struct {
	State  uint32 `c:"state"`  // SlotFree … SlotRefused
	Opcode uint8  `c:"opcode"` // OpSend, OpSendWithImm
	Flags  uint8  `c:"flags"`  // ChanFlagSignaled, ChanFlagSolicited
	Status uint8  `c:"status"` // the receiver's verdict (WCStatus) once SlotDone
	_      uint8  //
	Length uint32 `c:"length"`   // message bytes, at most the stride less ChanSlotHeader
	Imm    uint32 `c:"imm_data"` // SEND_WITH_IMM's immediate as a number
	_      [48]byte
}

// DirectChannel answers direct-channel (op 63); its descriptor is the
// channel file. Each side's reply names the same file: its tx ring is the
// peer's rx ring.
type DirectChannel struct {
	Slot     uint32 `json:"slot"`
	State    uint32 `json:"state"`
	Size     uint64 `json:"size"`
	TxOffset uint64 `json:"tx_offset"`
	RxOffset uint64 `json:"rx_offset"`
	Entries  uint32 `json:"entries"`
	Stride   uint32 `json:"stride"`
	PeerQPN  uint32 `json:"peer_qpn"`
	RelayNS  uint64 `json:"relay_ns"`
}

// ChanRingBytes is the bytes of one ring of entries slots of stride.
func ChanRingBytes(entries, stride uint32) uint64 {
	return ChanHeaderSize + uint64(entries)*uint64(stride)
}

// Check checks a channel grant as the library must before it maps it: a
// slot of a table of slots entries and a valid state word; the ring
// geometry in bounds; both rings, 64-byte aligned, inside size bytes
// without overlapping; size inside the file's fileSize bytes; a QPN of 24
// bits; a relay delay of 1 µs to 1 minute.
func (c *DirectChannel) Check(slots uint32, fileSize int64) error {
	ring := ChanRingBytes(c.Entries, c.Stride)
	inside := func(off uint64) bool { return off%64 == 0 && off <= c.Size && ring <= c.Size-off }
	switch {
	case c.Slot >= slots:
		return fmt.Errorf("channel: slot %d outside the table's %d", c.Slot, slots)
	case c.State&^GrantGenMask != GrantValid || c.State&GrantGenMask == 0:
		return fmt.Errorf("channel: state word 0x%x is not a valid grant's", c.State)
	case c.Entries == 0 || c.Entries > ChanMaxEntries || c.Entries&(c.Entries-1) != 0:
		return fmt.Errorf("channel: %d entries, want a power of two 1..%d", c.Entries, ChanMaxEntries)
	case c.Stride < ChanMinStride || c.Stride > ChanMaxStride || c.Stride%64 != 0:
		return fmt.Errorf("channel: stride %d, want a multiple of 64 in %d..%d", c.Stride, ChanMinStride, ChanMaxStride)
	case c.Size == 0 || c.Size > 1<<40 || fileSize < 0 || c.Size > uint64(fileSize):
		return fmt.Errorf("channel: size %d is empty, too large or beyond the file's %d bytes", c.Size, fileSize)
	case !inside(c.TxOffset) || !inside(c.RxOffset):
		return fmt.Errorf("channel: a ring of %d bytes at 0x%x or 0x%x is not 64-byte aligned inside the %d-byte mapping", ring, c.TxOffset, c.RxOffset, c.Size)
	case max(c.TxOffset, c.RxOffset)-min(c.TxOffset, c.RxOffset) < ring:
		return fmt.Errorf("channel: the rings at 0x%x and 0x%x overlap (%d bytes each)", c.TxOffset, c.RxOffset, ring)
	case c.PeerQPN > 0xffffff:
		return fmt.Errorf("channel: peer QPN 0x%x is not a QPN", c.PeerQPN)
	case c.RelayNS < 1000 || c.RelayNS > 60_000_000_000:
		return fmt.Errorf("channel: relay delay %d ns outside 1 µs..1 min", c.RelayNS)
	}
	return nil
}

// Which CQ a direct-notify names, of the peer QP.
const (
	NotifySend = "send"
	NotifyRecv = "recv"
)

// DirectNotify asks the agent to raise the event of a CQ of the peer of
// QP (op 67): its send CQ ("send") or receive CQ ("recv"), as if a
// completion had been published there; Solicited as a solicited
// completion's (a CQ armed for solicited completions wakes too).
type DirectNotify struct {
	QP        uint32 `json:"qp"`
	CQ        string `json:"cq"`
	Solicited bool   `json:"solicited,omitempty"`
}
