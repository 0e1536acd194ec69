// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
)

// AccessOnDemand registers a region on-demand paged
// (IBV_ACCESS_ON_DEMAND): its pages of guest memory are populated when the
// program or the device first touches them, or by PD.AdviseMR, not at
// registration. Needs an agent with capability odp (CapODP).
const AccessOnDemand = abi.AccessOnDemand

// Advice is what PD.AdviseMR asks (enum ibv_advise_mr_advice).
type Advice = abi.Advice

// Advice values.
const (
	AdvicePrefetch        = abi.AdvicePrefetch        // populate for reading
	AdvicePrefetchWrite   = abi.AdvicePrefetchWrite   // populate for writing (the region needs AccessLocalWrite)
	AdvicePrefetchNoFault = abi.AdvicePrefetchNoFault // populate nothing: check the ranges only
)

// AdviseMR prefetches ranges of the PD's on-demand regions
// (ibv_advise_mr): each SGE (address, length, lkey) must lie in a region
// registered with AccessOnDemand. The agent finishes before AdviseMR
// returns, so flush (IBV_ADVISE_MR_FLAG_FLUSH) changes nothing but what is
// sent. Needs an agent with capability odp.
func (pd *PD) AdviseMR(ctx context.Context, advice Advice, flush bool, sges ...SGE) error {
	if !pd.ad.vm.caps.Has(abi.CapODP) {
		return errorf(abi.CodeInvalid, "vrdma: AdviseMR: the agent has no on-demand paging (capability odp): upgrade vrdmad")
	}
	r := abi.AdviseMR{PD: pd.handle, Advice: advice}
	if flush {
		r.Flags = abi.AdviseFlush
	}
	for _, s := range sges {
		r.SGEs = append(r.SGEs, abi.AdviseSGE{Addr: s.Addr, Length: s.Length, LKey: s.LKey})
	}
	if _, err := pd.ad.vm.c.call(ctx, abi.OpAdviseMR, &r, nil); err != nil {
		return fmt.Errorf("vrdma: AdviseMR: %w", err)
	}
	return nil
}
