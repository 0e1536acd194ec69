// SPDX-License-Identifier: Apache-2.0

package abi

// The verbs of capability core-verbs: ibv_rereg_mr (rereg-mr), ibv_resize_cq
// (resize-cq) and solicited-only completion events (the armed word's
// ArmSolicited). docs/wire-local.md §4.16.

// Values of a CQ's armed word (OffCQArmed, §7). The library stores one; the
// agent swaps it back to 0 when it raises the event.
const (
	// ArmAll: an event at the next completion (ibv_req_notify_cq(cq, 0)).
	ArmAll uint32 = 1
	// ArmSolicited: an event at the next receive completion of a message
	// that carried the solicited-event bit, or the next error completion
	// (ibv_req_notify_cq(cq, 1)). Only for an agent with CapCoreVerbs:
	// an older one never raises an event for it.
	ArmSolicited uint32 = 2
)

// ReregFlags say what ibv_rereg_mr changes (IBV_REREG_MR_CHANGE_*).
type ReregFlags uint32

// Rereg flags, valued as in ibv_rereg_mr_flags.
const (
	ReregTranslation ReregFlags = 1 << 0 // Addr, Length and IOVA
	ReregPD          ReregFlags = 1 << 1 // PD
	ReregAccess      ReregFlags = 1 << 2 // Access
	// ReregAll is every flag.
	ReregAll = ReregTranslation | ReregPD | ReregAccess
)

// ReregMR changes memory region Handle in place (op 52): what Flags names
// takes the value given; the rest stays. The region keeps its handle and
// keys (RegMRReply says them); its old definition stops working before the
// reply, as at dereg-mr.
type ReregMR struct {
	Handle uint32     `json:"handle"`
	Flags  ReregFlags `json:"flags"`
	PD     uint32     `json:"pd,omitempty"`     // with ReregPD
	Addr   uint64     `json:"addr,omitempty"`   // with ReregTranslation: the guest address
	Length uint64     `json:"length,omitempty"` // with ReregTranslation
	IOVA   uint64     `json:"iova,omitempty"`   // with ReregTranslation
	Access Access     `json:"access,omitempty"` // with ReregAccess
}

// Validate checks the flags, and the new translation and access as reg-mr
// checks them.
func (r *ReregMR) Validate() error {
	if r.Flags == 0 || r.Flags&^ReregAll != 0 {
		return Errorf(CodeInvalid, "flags", "rereg flags 0x%x: give one or more of CHANGE_TRANSLATION (1), CHANGE_PD (2), CHANGE_ACCESS (4)", uint32(r.Flags))
	}
	if r.Flags&ReregTranslation != 0 {
		if r.Length == 0 {
			return Errorf(CodeInvalid, "length", "a memory region must be at least 1 byte")
		}
		if r.IOVA+r.Length-1 < r.IOVA {
			return Errorf(CodeInvalid, "iova", "region [iova 0x%x, +%d) wraps around the 64-bit address space", r.IOVA, r.Length)
		}
	}
	if r.Flags&ReregAccess != 0 {
		reg := RegMR{Access: r.Access}
		return reg.Validate()
	}
	return nil
}

// ResizeCQ resizes completion queue Handle to at least CQE entries (op
// 53). The agent moves the completions not yet consumed into a new ring,
// in order, from its first slot: the reply's layout and memfd are the new
// ring, whose CQ head and tail start at 0 and the number moved. The
// library polls nothing meanwhile (it holds the CQ's lock across the op),
// then maps the new ring and unmaps the old. The event socket stays. A CQE
// below the completions waiting is refused (CodeInvalid).
type ResizeCQ struct {
	Handle uint32 `json:"handle"`
	CQE    uint32 `json:"cqe"`
}

// Validate checks the size.
func (r *ResizeCQ) Validate() error {
	if r.CQE == 0 || r.CQE > MaxCQE {
		return Errorf(CodeInvalid, "cqe", "cqe %d out of range 1..%d (max_cqe)", r.CQE, MaxCQE)
	}
	return nil
}
