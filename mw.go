// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
)

// MWType is a memory window's type (IBV_MW_TYPE_*).
type MWType = abi.MWType

// Memory window types: a type 1 window belongs to its PD, and any QP of
// the PD serves requests through its rkey; a type 2 window belongs to
// the QP that bound it, which alone serves them.
const (
	MWType1 = abi.MWType1
	MWType2 = abi.MWType2
)

// MW is a memory window (ibv_mw): a range of a memory region, with remote
// rights of its own, that peers reach through the window's rkey. A window
// is bound by a BIND_MW work request (QP.BindMW for type 1, a SendWR with
// OpBindMW for either type), and invalidated by LOCAL_INV, by a peer's
// SEND_WITH_INV (type 2), by a bind of length 0 (type 1), or by Dealloc.
// Needs an agent with capability mw.
type MW struct {
	pd     *PD
	handle uint32
	typ    MWType
	rkey   uint32
}

// MWBind is what a BIND_MW binds a window to (ibv_mw_bind_info): Length
// bytes at Addr of MR (which must have AccessMWBind), with the remote
// rights Access (remote write and atomic need an MR with local write).
// Length 0 unbinds a type 1 window.
type MWBind struct {
	MR     *MR
	Addr   uint64
	Length uint64
	Access Access
}

// AllocMW allocates a memory window of type typ in the PD (ibv_alloc_mw).
func (pd *PD) AllocMW(ctx context.Context, typ MWType) (*MW, error) {
	var r abi.AllocMWReply
	if _, err := pd.ad.vm.c.call(ctx, abi.OpAllocMW, &abi.AllocMW{PD: pd.handle, Type: typ}, &r); err != nil {
		return nil, fmt.Errorf("vrdma: alloc MW: %w", err)
	}
	return &MW{pd: pd, handle: r.Handle, typ: typ, rkey: r.RKey}, nil
}

// Dealloc frees the window (ibv_dealloc_mw), bound or not: once it
// returns, no peer reaches memory through its rkey.
func (w *MW) Dealloc(ctx context.Context) error {
	_, err := w.pd.ad.vm.c.call(ctx, abi.OpDeallocMW, &abi.Handle{Handle: w.handle}, nil)
	return err
}

// RKey is the window's rkey: the one of the last bind posted, or the
// first before any.
func (w *MW) RKey() uint32 { return w.rkey }

// Type is the window's type.
func (w *MW) Type() MWType { return w.typ }

// IncRKey returns rkey with its low 8 bits, the part a bind may change,
// moved on by one (ibv_inc_rkey): the rkey of a window's next bind.
func IncRKey(rkey uint32) uint32 { return rkey&^abi.MWKeyTag | (rkey+1)&abi.MWKeyTag }

// BindMW binds type 1 window w to b (ibv_bind_mw): it posts a BIND_MW
// with ID id and flags and returns the window's new rkey, which is
// w.RKey() from then on; the bind takes effect, and the old rkey stops
// working, before its completion.
func (q *QP) BindMW(w *MW, id uint64, flags SendFlags, b MWBind) (uint32, error) {
	if w.typ != MWType1 {
		return 0, errorf(abi.CodeInvalid, "vrdma: BindMW: a type %d window is bound with a SendWR of OpBindMW on its QP", w.typ)
	}
	wr := [1]SendWR{{ID: id, Opcode: OpBindMW, Flags: flags, MW: w, RKey: IncRKey(w.rkey), Bind: b}}
	if err := q.PostSend(wr[:]); err != nil {
		return 0, err
	}
	return w.rkey, nil
}

// encodeMW fills w, the WQE of wr, a BIND_MW, LOCAL_INV or SEND_WITH_INV:
// memory-window operations go on RC QPs only. A bind's window and region
// must be of q's VM; the window takes the bind's rkey (one that keeps its
// index).
func (q *QP) encodeMW(w *abi.SendWQE, wr *SendWR) error {
	if q.typ != QPTypeRC {
		return errorf(abi.CodeInvalid, "%s on a %s QP: memory windows go on RC QPs", wr.Opcode, q.typ)
	}
	if wr.Opcode != OpBindMW {
		w.Imm, w.RKey = wr.RKey, 0 // the rkey to invalidate, where the WQE carries it
		return nil
	}
	b := wr.Bind
	switch {
	case wr.MW == nil || wr.MW.pd.ad.vm != q.vm:
		return errorf(abi.CodeInvalid, "BIND_MW needs a memory window of the QP's VM (SendWR.MW)")
	case b.Length > 0 && (b.MR == nil || b.MR.pd.ad.vm != q.vm):
		return errorf(abi.CodeInvalid, "BIND_MW of %d bytes needs a memory region of the QP's VM (SendWR.Bind.MR)", b.Length)
	}
	var lkey uint32
	if b.MR != nil {
		lkey = b.MR.lkey
	}
	w.SetBindMW(abi.MWBind{MW: wr.MW.handle, RKey: wr.RKey, MRKey: lkey, Addr: b.Addr, Length: b.Length, Access: b.Access})
	if wr.RKey&^abi.MWKeyTag == wr.MW.rkey&^abi.MWKeyTag {
		wr.MW.rkey = wr.RKey // an rkey of another window's index is refused by the bind
	}
	return nil
}
