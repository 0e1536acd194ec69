// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestSecurityStaleRKey registers a region, notes its rkey and
// deregisters it, then registers and deregisters a region over the same
// memory a thousand times: no registration gets the old key again, and a
// peer's WRITE with it to the last region is refused with REM_ACCESS_ERR
// and writes nothing. (With an 8-bit generation and the first free slot
// reused, the 256th registration had the old key.)
func TestSecurityStaleRKey(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	va := env.Open(t, "rk-a", testenv.VMOptions{MemMB: 8})
	vb := env.Open(t, "rk-b", testenv.VMOptions{MemMB: 8})
	p, err := perf.Connect(ctx, va.Adapters()[0], vb.Adapters()[0], perf.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	buf, err := vb.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	const access = vrdma.AccessLocalWrite | vrdma.AccessRemoteWrite
	first, err := p.B.PD.RegMR(ctx, buf, access)
	if err != nil {
		t.Fatal(err)
	}
	stale := first.RKey()
	if err := first.Dereg(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]int{stale: 0}
	var live *vrdma.MR
	const n = 1000
	for i := 1; live == nil; i++ {
		m, err := p.B.PD.RegMR(ctx, buf, access)
		if err != nil {
			t.Fatalf("registration %d: %v", i, err)
		}
		if j, dup := seen[m.RKey()]; dup {
			t.Errorf("registration %d has key 0x%x again, as registration %d had", i, m.RKey(), j)
			live = m
			break
		}
		seen[m.RKey()] = i
		if i == n {
			live = m
			break
		}
		if err := m.Dereg(ctx); err != nil {
			t.Fatal(err)
		}
	}
	defer live.Dereg(ctx)
	clear(buf)
	src := p.A.MR.Bytes()
	for i := range 64 {
		src[i] = 0xa5
	}
	if err := p.A.QP.PostSend([]vrdma.SendWR{{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
		SGL: []vrdma.SGE{p.A.MR.SGE(0, 64)}, RemoteAddr: live.Addr(), RKey: stale}}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, p.A.CQ, 1)
	if wc[0].Status != vrdma.WCRemAccessErr {
		t.Errorf("WRITE with the stale rkey 0x%x (the live region has 0x%x): %s, want REM_ACCESS_ERR", stale, live.RKey(), wc[0].Status)
	}
	if !allZero(buf) {
		t.Errorf("a WRITE with the stale rkey 0x%x landed in the region registered after it: %x…", stale, buf[:16])
	}
}

// allZero reports whether every byte of b is zero.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
