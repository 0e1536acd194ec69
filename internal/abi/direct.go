// SPDX-License-Identifier: Apache-2.0

package abi

import "fmt"

// The memcpy-direct path (capability memcpy-direct, ops 60..62;
// docs/wire-local.md §4.21). For an RC QP between two VMs of one agent
// that allow each other (vrdma.directPeers), the initiator's library
// executes RDMA WRITE, READ, the atomics and ATOMIC_WRITE itself on a
// mapping of the target region's pages that the agent grants (direct-map).
// Each grant has a slot in the session's grant table (direct-open), a
// shared file whose state words the agent writes and whose in-use words
// the library counts its copies in, so that the agent can revoke a grant
// exactly: it marks the slot revoking, waits for in-use 0, and has the
// library unmap the pages (a notice on the revocation socket, answered by
// the same 8 bytes).

// Grant table geometry.
const (
	// GrantSlots is the number of slots in a session's grant table.
	GrantSlots = 1024
	// GrantSlotSize is the bytes of one slot: GrantSlot.
	GrantSlotSize = 16
	// GrantTableSize is the bytes of the grant table file.
	GrantTableSize = (GrantSlots*GrantSlotSize + 4095) &^ 4095
	// OffGrantState, OffGrantInUse and OffGrantRdAtomics are the
	// offsets of a slot's words.
	OffGrantState     = 0
	OffGrantInUse     = 4
	OffGrantRdAtomics = 8
	// RevokeMsgSize is the size of a revocation notice and of its
	// acknowledgement on the revocation socket: the slot and the grant's
	// valid state word, two u32.
	RevokeMsgSize = 8
)

// GrantSlot is one slot of the grant table (wire-local.md §4.21).
type GrantSlot struct {
	State     uint32 `c:"state"`      // agent: 0 free, gen<<2|GrantValid, gen<<2|GrantRevoking
	InUse     uint32 `c:"in_use"`     // library: copies in progress in the grant's pages
	RdAtomics uint32 `c:"rd_atomics"` // library: direct READs and atomics done through the grant (counters)
	_         [4]byte
}

// The low two bits of a grant slot's state word.
const (
	GrantFree     uint32 = 0
	GrantValid    uint32 = 1
	GrantRevoking uint32 = 2
	// GrantGenMask is the generation's bits of a state word.
	GrantGenMask uint32 = ^uint32(3)
)

// GrantWord returns the state word of generation gen (30 bits, nonzero)
// in state st (GrantValid, GrantRevoking).
func GrantWord(gen, st uint32) uint32 { return gen<<2 | st }

// DirectOpenReply answers direct-open (op 60); its descriptors are the
// grant table memfd and the revocation socket.
type DirectOpenReply struct {
	Slots    uint32 `json:"slots"`
	SlotSize uint32 `json:"slot_size"`
	Size     uint32 `json:"size"`
}

// Check checks a grant table's geometry against the file's size, as the
// library must before it maps it.
func (r *DirectOpenReply) Check(fileSize int64) error {
	switch {
	case r.Slots == 0 || r.Slots > 1<<20:
		return fmt.Errorf("grant table: %d slots, want 1..%d", r.Slots, 1<<20)
	case r.SlotSize != GrantSlotSize:
		return fmt.Errorf("grant table: slot size %d, want %d", r.SlotSize, GrantSlotSize)
	case uint64(r.Slots)*uint64(r.SlotSize) > uint64(r.Size):
		return fmt.Errorf("grant table: %d slots of %d bytes do not fit its %d bytes", r.Slots, r.SlotSize, r.Size)
	case int64(r.Size) > fileSize:
		return fmt.Errorf("grant table: size %d exceeds the file's %d bytes", r.Size, fileSize)
	}
	return nil
}

// DirectMap asks for a grant of the peer QP's region rkey to QP (op 61).
type DirectMap struct {
	QP   uint32 `json:"qp"`
	RKey uint32 `json:"rkey"`
}

// DirectGrant answers direct-map: the grant's slot and valid state word,
// the region, what the library may do in it, and the pages to map of the
// descriptor that comes with it (the peer session's guest memory).
type DirectGrant struct {
	Slot      uint32 `json:"slot"`
	State     uint32 `json:"state"`
	IOVA      uint64 `json:"iova"`
	Length    uint64 `json:"length"`
	Access    Access `json:"access"`
	MapOffset uint64 `json:"map_offset"`
	MapLength uint64 `json:"map_length"`
	MROffset  uint64 `json:"mr_offset"`
}

// Check checks a grant as the library must before it maps it: a slot of
// a table of slots entries, a valid state word, page-multiple offset and
// length inside a file of fileSize bytes, and the region inside the
// mapping.
func (g *DirectGrant) Check(slots uint32, pageSize uint64, fileSize int64) error {
	switch {
	case g.Slot >= slots:
		return fmt.Errorf("grant: slot %d outside the table's %d", g.Slot, slots)
	case g.State&^GrantGenMask != GrantValid || g.State&GrantGenMask == 0:
		return fmt.Errorf("grant: state word 0x%x is not a valid grant's", g.State)
	case g.Length == 0 || g.IOVA+g.Length < g.IOVA:
		return fmt.Errorf("grant: region [0x%x,+%d) is empty or wraps", g.IOVA, g.Length)
	case g.Access&^(AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic) != 0 || g.Access == 0:
		return fmt.Errorf("grant: access %s is not a set of remote rights", g.Access)
	case g.MapOffset%pageSize != 0 || g.MapLength%pageSize != 0 || g.MapLength == 0:
		return fmt.Errorf("grant: mapping [0x%x,+%d) is not whole pages", g.MapOffset, g.MapLength)
	case g.MapOffset+g.MapLength < g.MapOffset || g.MapOffset+g.MapLength > uint64(fileSize):
		return fmt.Errorf("grant: mapping [0x%x,+%d) is outside the %d-byte file", g.MapOffset, g.MapLength, fileSize)
	case g.MROffset > g.MapLength || g.Length > g.MapLength-g.MROffset:
		return fmt.Errorf("grant: region at +%d of %d bytes does not fit the %d-byte mapping", g.MROffset, g.Length, g.MapLength)
	}
	return nil
}
