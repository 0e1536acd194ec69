// SPDX-License-Identifier: Apache-2.0

package device

// ibv_advise_mr of on-demand regions (capability odp, abi/odp.go).

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// AdviseMR checks r's ranges against the on-demand regions of PD r.PD and
// prefetches them: it populates their pages of guest memory, for reading
// (AdvicePrefetch) or writing (AdvicePrefetchWrite), before it returns,
// whether or not r asks for a flush. AdvicePrefetchNoFault populates
// nothing: the agent reaches guest memory through its own mapping of the
// memfd, so there is no translation to fill with pages already present.
// Nothing is populated unless every range is valid.
func (v *Context) AdviseMR(r *abi.AdviseMR) error {
	v.objMu.Lock()
	p, ok := v.pds[r.PD]
	v.objMu.Unlock()
	if !ok {
		return abi.Errorf(abi.CodeNotFound, "pd", "no PD with handle %d", r.PD)
	}
	need := abi.Access(0)
	if r.Advice == abi.AdvicePrefetchWrite {
		need = abi.AccessLocalWrite
	}
	type span struct{ g, n uint64 }
	spans := make([]span, 0, len(r.SGEs))
	for i, s := range r.SGEs {
		m := v.lookupMR(s.LKey)
		if m == nil || m.pd != p {
			return abi.Errorf(abi.CodeNotFound, "lkey", "range %d: no memory region with lkey 0x%x in PD %d", i, s.LKey, r.PD)
		}
		if m.access&abi.AccessOnDemand == 0 {
			return abi.Errorf(abi.CodeInvalid, "lkey", "range %d: region 0x%x was not registered on demand (IBV_ACCESS_ON_DEMAND): only on-demand regions are prefetched", i, s.LKey)
		}
		if m.access&need != need {
			return abi.Errorf(abi.CodeInvalid, "lkey", "range %d: PREFETCH_WRITE of region 0x%x, which has no LOCAL_WRITE", i, s.LKey)
		}
		if s.Addr < m.iova || !sys.InBounds(s.Addr-m.iova, uint64(s.Length), m.length) {
			return abi.Errorf(abi.CodeInvalid, "addr", "range %d: [0x%x, +%d) is not inside region 0x%x [0x%x, +%d)", i, s.Addr, s.Length, s.LKey, m.iova, m.length)
		}
		spans = append(spans, span{m.addr + (s.Addr - m.iova), uint64(s.Length)})
	}
	if r.Advice == abi.AdvicePrefetchNoFault {
		return nil
	}
	advice := unix.MADV_POPULATE_READ
	if r.Advice == abi.AdvicePrefetchWrite {
		advice = unix.MADV_POPULATE_WRITE
	}
	page := uint64(os.Getpagesize())
	v.memMu.RLock()
	defer v.memMu.RUnlock()
	if v.dead {
		return abi.Errorf(abi.CodeState, "", "VM %q is detaching", v.name)
	}
	mem := v.mem.Bytes()
	for _, s := range spans {
		if s.n == 0 {
			continue
		}
		lo, hi := s.g&^(page-1), min((s.g+s.n+page-1)&^(page-1), uint64(len(mem)))
		if err := unix.Madvise(mem[lo:hi], advice); err != nil {
			return abi.Errorf(abi.CodeInternal, "", "populating guest memory [0x%x, 0x%x) of VM %q: %v", lo, hi, v.name, err)
		}
	}
	return nil
}
