// SPDX-License-Identifier: Apache-2.0

package abi

// The verbs of capability odp: memory regions registered with
// IBV_ACCESS_ON_DEMAND (AccessOnDemand) and ibv_advise_mr (advise-mr, op
// 68). docs/wire-local.md §4.20.
//
// A device reaches a VM's memory regions in its guest memory, a memfd
// whose pages the kernel allocates when either side first touches them.
// An on-demand region is one whose pages the workload does not populate
// at registration (the drop-in libibverbs adopts only the pages of the
// range that hold data); the device's first access, the program's, or a
// prefetch (advise-mr) populates the rest. A region without the flag has
// every page populated at registration, as a pinned region is resident.

// AccessOnDemand marks a region on-demand paged (IBV_ACCESS_ON_DEMAND).
// It is a region's flag only: qp_access_flags never carry it.
const AccessOnDemand Access = 1 << 6

// AccessMR is every flag a memory region may have.
const AccessMR = AccessAll | AccessOnDemand

// Advice is what advise-mr asks of the device (enum ibv_advise_mr_advice).
type Advice uint32

// Advice values, as in ibv_advise_mr_advice.
const (
	// AdvicePrefetch populates the ranges for reading.
	AdvicePrefetch Advice = 0
	// AdvicePrefetchWrite populates the ranges for writing (their regions
	// need LOCAL_WRITE).
	AdvicePrefetchWrite Advice = 1
	// AdvicePrefetchNoFault maps only pages already present, faulting
	// none in: a device that translates through the guest memory file
	// has nothing to map, so it checks the ranges and does nothing else.
	AdvicePrefetchNoFault Advice = 2
)

// AdviseFlush asks advise-mr to finish before it replies
// (IBV_ADVISE_MR_FLAG_FLUSH); without it the agent may finish later. The
// agent finishes before it replies either way.
const AdviseFlush uint32 = 1

// MaxAdviseSGE bounds the ranges of one advise-mr.
const MaxAdviseSGE = 256

// AdviseMR is ibv_advise_mr (op 68): each range (an SGE: address in its
// region's iova space, length, lkey) must lie in an on-demand region of
// protection domain PD, one with LOCAL_WRITE for AdvicePrefetchWrite. An
// unknown lkey, or one of another PD, is CodeNotFound; a region without
// AccessOnDemand, a range outside its region or without the access the
// advice needs, CodeInvalid.
type AdviseMR struct {
	PD     uint32      `json:"pd"`
	Advice Advice      `json:"advice"`
	Flags  uint32      `json:"flags"`
	SGEs   []AdviseSGE `json:"sges"`
}

// AdviseSGE is one range of an advise-mr.
type AdviseSGE struct {
	Addr   uint64 `json:"addr"`
	Length uint32 `json:"length"`
	LKey   uint32 `json:"lkey"`
}

// Validate checks the advice, the flags and the number of ranges.
func (r *AdviseMR) Validate() error {
	if r.Advice > AdvicePrefetchNoFault {
		return Errorf(CodeInvalid, "advice", "advice %d: give PREFETCH (0), PREFETCH_WRITE (1) or PREFETCH_NO_FAULT (2)", r.Advice)
	}
	if r.Flags&^AdviseFlush != 0 {
		return Errorf(CodeInvalid, "flags", "advise flags 0x%x: the only flag is FLUSH (1)", r.Flags)
	}
	if len(r.SGEs) == 0 || len(r.SGEs) > MaxAdviseSGE {
		return Errorf(CodeInvalid, "sges", "%d ranges: give 1..%d", len(r.SGEs), MaxAdviseSGE)
	}
	return nil
}
