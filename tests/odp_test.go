// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// The conformance case of on-demand regions (AccessOnDemand) and
// PD.AdviseMR, run on every path by TestConformance.

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vrdma/vrdma"
)

// testODP: a region registered on demand is reached by RDMA WRITE, READ
// and fetch-and-add as any region; PD.AdviseMR prefetches its ranges (for
// writing with a flush, for reading without), and refuses a region not on
// demand (ErrInvalid), an unknown lkey (ErrNotFound), a range past its
// region and PREFETCH_WRITE of a region without LOCAL_WRITE (ErrInvalid).
func testODP(t *testing.T, s *suite) {
	ctx := opCtx(t)
	a, b := s.pair(t, pairConfig{})
	if !b.vm.Caps().Has(vrdma.CapODP) {
		t.Fatalf("the agent does not serve on-demand paging (caps %v)", b.vm.Caps())
	}
	src := a.mr(t, 4096, vrdma.AccessAll)
	odp := b.mr(t, 64<<10, vrdma.AccessAll|vrdma.AccessOnDemand)
	if err := b.pd.AdviseMR(ctx, vrdma.AdvicePrefetchWrite, true, odp.SGE(0, 16<<10)); err != nil {
		t.Fatalf("AdviseMR PREFETCH_WRITE with flush: %v", err)
	}
	if err := b.pd.AdviseMR(ctx, vrdma.AdvicePrefetch, false, odp.SGE(32<<10, 4096), odp.SGE(48<<10, 100)); err != nil {
		t.Fatalf("AdviseMR PREFETCH: %v", err)
	}
	if err := b.pd.AdviseMR(ctx, vrdma.AdvicePrefetchNoFault, true, odp.SGE(60<<10, 4096)); err != nil {
		t.Fatalf("AdviseMR PREFETCH_NO_FAULT: %v", err)
	}

	fill(src.Bytes(), 9)
	postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 4096)),
		RemoteAddr: odp.Addr() + 40<<10, RKey: odp.RKey()})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	expectBytes(t, "WRITE into the on-demand region", odp.Bytes()[40<<10:44<<10], src.Bytes())
	dst := a.mr(t, 4096, vrdma.AccessAll)
	postSend(t, a.qp, vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(dst.SGE(0, 4096)),
		RemoteAddr: odp.Addr() + 40<<10, RKey: odp.RKey()})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 2, vrdma.WCSuccess, vrdma.WCRDMARead)
	expectBytes(t, "READ from the on-demand region", dst.Bytes(), src.Bytes())
	binary.LittleEndian.PutUint64(odp.Bytes()[56<<10:], 41)
	postSend(t, a.qp, vrdma.SendWR{ID: 3, Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled, SGL: sgl(dst.SGE(0, 8)),
		RemoteAddr: odp.Addr() + 56<<10, RKey: odp.RKey(), CompareAdd: 1})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 3, vrdma.WCSuccess, vrdma.WCFetchAdd)
	if old, now := binary.LittleEndian.Uint64(dst.Bytes()), binary.LittleEndian.Uint64(odp.Bytes()[56<<10:]); old != 41 || now != 42 {
		t.Errorf("fetch-and-add on the on-demand region: fetched %d (want 41), now %d (want 42)", old, now)
	}

	pinned := b.mr(t, 4096, vrdma.AccessAll)
	if err := b.pd.AdviseMR(ctx, vrdma.AdvicePrefetch, true, pinned.SGE(0, 4096)); !errors.Is(err, vrdma.ErrInvalid) {
		t.Errorf("AdviseMR of a region not on demand: %v, want ErrInvalid", err)
	}
	bad := odp.SGE(0, 4096)
	bad.LKey ^= 0x5500
	if err := b.pd.AdviseMR(ctx, vrdma.AdvicePrefetch, true, bad); !errors.Is(err, vrdma.ErrNotFound) {
		t.Errorf("AdviseMR of an unknown lkey: %v, want ErrNotFound", err)
	}
	if err := b.pd.AdviseMR(ctx, vrdma.AdvicePrefetch, true, odp.SGE(64<<10-8, 16)); !errors.Is(err, vrdma.ErrInvalid) {
		t.Errorf("AdviseMR of a range past its region: %v, want ErrInvalid", err)
	}
	ro := b.mr(t, 4096, vrdma.AccessRemoteRead|vrdma.AccessOnDemand)
	if err := b.pd.AdviseMR(ctx, vrdma.AdvicePrefetchWrite, true, ro.SGE(0, 4096)); !errors.Is(err, vrdma.ErrInvalid) {
		t.Errorf("AdviseMR PREFETCH_WRITE of a region without LOCAL_WRITE: %v, want ErrInvalid", err)
	}
	if err := b.pd.AdviseMR(ctx, vrdma.AdvicePrefetch, true); !errors.Is(err, vrdma.ErrInvalid) {
		t.Errorf("AdviseMR of no range: %v, want ErrInvalid", err)
	}
}
