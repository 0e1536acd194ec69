// SPDX-License-Identifier: Apache-2.0

package abi

// Memory windows (capability mw, docs/wire-local.md §4.17): alloc-mw and
// dealloc-mw, and the work requests that bind, invalidate and use them.
// A window is bound by a BIND_MW work request on a QP's send queue (type
// 1 through ibv_bind_mw, type 2 through IBV_WR_BIND_MW), invalidated by a
// LOCAL_INV work request, by a SEND_WITH_INV from the peer, or (type 1)
// by binding it again with length 0.

// MWType is a memory window's type (IBV_MW_TYPE_*).
type MWType uint8

// Window types, valued as in ibv_mw_type. A type 1 window belongs to its
// PD: any QP of the PD may use its rkey. A type 2 window (2B) belongs to
// the QP that bound it: only that QP's requests may use it.
const (
	MWType1 MWType = 1
	MWType2 MWType = 2
)

// MWKeyBit is set in every memory window's rkey, and in no memory
// region's key: the agent tells the two apart by it. A window's rkey is
// this bit, the window's index (23 bits), and a tag in the low 8 bits
// that the consumer chooses at each bind (ibv_inc_rkey).
const MWKeyBit = 1 << 31

// MWKeyTag is the part of a window's rkey a bind may change.
const MWKeyTag = 0xff

// AllocMW allocates a memory window of Type in PD (op 54).
type AllocMW struct {
	PD   uint32 `json:"pd"`
	Type MWType `json:"type"`
}

// Validate checks the type.
func (a *AllocMW) Validate() error {
	if a.Type != MWType1 && a.Type != MWType2 {
		return Errorf(CodeInvalid, "type", "memory window type %d: give 1 or 2 (IBV_MW_TYPE_1, IBV_MW_TYPE_2)", a.Type)
	}
	return nil
}

// AllocMWReply returns the window's handle and its first rkey (the one
// the next bind increments).
type AllocMWReply struct {
	Handle uint32 `json:"handle"`
	RKey   uint32 `json:"rkey"`
}

// MWBind is a BIND_MW work request's fields as the WQE carries them: the
// window (its handle), the rkey it takes (RKey, the MW's index with a new
// tag), the region it is bound to (its lkey), the range in the region's
// addresses and the window's rights (AccessRemote, and AccessLocalWrite,
// which is ignored). Length 0 unbinds a type 1 window.
type MWBind struct {
	MW     uint32
	RKey   uint32
	MRKey  uint32
	Addr   uint64
	Length uint64
	Access Access
}

// BindMW is the bind a BIND_MW WQE carries: the window's handle in
// imm_data, the new rkey in rkey, the range in remote_addr and
// compare_add, the region's lkey in the low 32 bits of swap and the
// access flags in its high 32.
func (w *SendWQE) BindMW() MWBind {
	return MWBind{MW: w.Imm, RKey: w.RKey, MRKey: uint32(w.Swap), Addr: w.RemoteAddr, Length: w.CompareAdd, Access: Access(w.Swap >> 32)}
}

// SetBindMW fills w's fields with b (the inverse of BindMW).
func (w *SendWQE) SetBindMW(b MWBind) {
	w.Imm, w.RKey, w.RemoteAddr, w.CompareAdd = b.MW, b.RKey, b.Addr, b.Length
	w.Swap = uint64(b.Access)<<32 | uint64(b.MRKey)
	w.NumSGE = 0
}

// InvalidateRKey is the rkey a LOCAL_INV or SEND_WITH_INV WQE invalidates:
// its imm_data, as ibv_send_wr's invalidate_rkey shares imm_data's place.
func (w *SendWQE) InvalidateRKey() uint32 { return w.Imm }
