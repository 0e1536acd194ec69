// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"testing"

	"github.com/vrdma/vrdma"
)

// testMW is the memory-window case of the conformance suite: windows of
// type 1 and 2 bound on b's QP over part of a region that grants no
// remote access itself; a's RDMA WRITE, READ and atomic through a
// window's rkey within the window succeed, and outside it, or beyond its
// rights, fail with REM_ACCESS_ERR leaving the memory untouched; a type 2
// window invalidated by LOCAL_INV or by a's SEND_WITH_INV (whose receive
// completes WITH_INV naming it) is refused afterwards, and so is a type 1
// window deallocated while bound; a bind that breaks the rules fails with
// MW_BIND_ERR.
func testMW(t *testing.T, s *suite) {
	t.Run("type1", func(t *testing.T) { testMWType1(t, s) })
	for _, c := range []struct {
		name string
		// invalidate invalidates the window bound with rkey at address
		// at, from a or b.
		invalidate func(t *testing.T, a, b *end, rkey uint32, at uint64)
	}{
		{"type2-local-inv", func(t *testing.T, a, b *end, rkey uint32, at uint64) {
			postSend(t, b.qp, vrdma.SendWR{ID: 20, Opcode: vrdma.OpLocalInv, Flags: vrdma.SendSignaled, RKey: rkey})
			expectWC(t, waitWC(t, b.scq, 1)[0], b.qp, 20, vrdma.WCSuccess, vrdma.WCLocalInv)
		}},
		{"type2-other-qp", func(t *testing.T, a, b *end, rkey uint32, at uint64) {
			// A type 2 window is its QP's: another QP of the same PD, a
			// new pair facing each other, serves nothing through it.
			a2, b2 := newEndIn(t, a.pd, qpConfig{}), newEndIn(t, b.pd, qpConfig{})
			s.connect(t, a2, b2, connDefault)
			local := a2.mr(t, 64, vrdma.AccessLocalWrite)
			postSend(t, a2.qp, vrdma.SendWR{ID: 23, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 8)), RemoteAddr: at, RKey: rkey})
			s.expectNAK(t, waitWC(t, a2.scq, 1)[0], a2.qp, 23, vrdma.WCRemAccessErr)
			postSend(t, b.qp, vrdma.SendWR{ID: 24, Opcode: vrdma.OpLocalInv, Flags: vrdma.SendSignaled, RKey: rkey})
			expectWC(t, waitWC(t, b.scq, 1)[0], b.qp, 24, vrdma.WCSuccess, vrdma.WCLocalInv)
		}},
		{"type2-send-inv", func(t *testing.T, a, b *end, rkey uint32, at uint64) {
			in := b.mr(t, 64, vrdma.AccessLocalWrite)
			out := a.mr(t, 64, vrdma.AccessLocalWrite)
			fill(out.Bytes(), 9)
			postRecv(t, b.qp, vrdma.RecvWR{ID: 21, SGL: sgl(in.SGE(0, 64))})
			postSend(t, a.qp, vrdma.SendWR{ID: 22, Opcode: vrdma.OpSendWithInv, Flags: vrdma.SendSignaled, SGL: sgl(out.SGE(0, 40)), RKey: rkey})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 22, vrdma.WCSuccess, vrdma.WCSend)
			w := waitWC(t, b.rcq, 1)[0]
			expectWC(t, w, b.qp, 21, vrdma.WCSuccess, vrdma.WCRecv)
			if w.Flags&vrdma.WCWithInv == 0 || w.Flags&vrdma.WCWithImm != 0 || w.Imm != rkey || w.ByteLen != 40 {
				t.Fatalf("receive %s: want 40 bytes, WITH_INV of rkey 0x%x, no immediate", fmtWC(w), rkey)
			}
			expectBytes(t, "the SEND's bytes", in.Bytes()[:40], out.Bytes()[:40])
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := s.pair(t, pairConfig{})
			mr, area := mwTarget(t, b)
			mw, err := b.pd.AllocMW(opCtx(t), vrdma.MWType2)
			if err != nil {
				t.Fatal(err)
			}
			rkey := vrdma.IncRKey(mw.RKey())
			postSend(t, b.qp, vrdma.SendWR{ID: 10, Opcode: vrdma.OpBindMW, Flags: vrdma.SendSignaled, MW: mw, RKey: rkey,
				Bind: vrdma.MWBind{MR: mr, Addr: off(mr, 1024), Length: 1024, Access: vrdma.AccessRemoteWrite}})
			expectWC(t, waitWC(t, b.scq, 1)[0], b.qp, 10, vrdma.WCSuccess, vrdma.WCBindMW)
			local := a.mr(t, 256, vrdma.AccessLocalWrite)
			fill(local.Bytes(), 4)
			postSend(t, a.qp, vrdma.SendWR{ID: 11, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 256)),
				RemoteAddr: off(mr, 1024), RKey: rkey})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 11, vrdma.WCSuccess, vrdma.WCRDMAWrite)
			expectBytes(t, "the window's first bytes", mr.Bytes()[1024:1280], local.Bytes())
			c.invalidate(t, a, b, rkey, off(mr, 1024))
			want := clone(area)
			postSend(t, a.qp, vrdma.SendWR{ID: 12, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 8)),
				RemoteAddr: off(mr, 1024), RKey: rkey})
			s.expectNAK(t, waitWC(t, a.scq, 1)[0], a.qp, 12, vrdma.WCRemAccessErr)
			expectBytes(t, "the region after a WRITE through the invalidated window", area, want)
			if err := mw.Dealloc(opCtx(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, c := range []struct {
		name   string
		access vrdma.Access // the region's
		addr   int          // the bind's range in the region
		length int
		rights vrdma.Access
	}{
		{"bind-mr-without-mw-bind", vrdma.AccessLocalWrite, 0, 64, vrdma.AccessRemoteRead},
		{"bind-outside-mr", vrdma.AccessLocalWrite | vrdma.AccessMWBind, 4096 - 32, 64, vrdma.AccessRemoteRead},
		{"bind-write-without-local-write", vrdma.AccessRemoteRead | vrdma.AccessMWBind, 0, 64, vrdma.AccessRemoteWrite},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, b := s.pair(t, pairConfig{})
			mr := b.mr(t, 4096, c.access)
			mw, err := b.pd.AllocMW(opCtx(t), vrdma.MWType1)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.qp.BindMW(mw, 30, vrdma.SendSignaled, vrdma.MWBind{MR: mr, Addr: off(mr, c.addr), Length: uint64(c.length), Access: c.rights}); err != nil {
				t.Fatal(err)
			}
			expectWC(t, waitWC(t, b.scq, 1)[0], b.qp, 30, vrdma.WCMWBindErr, 0)
			expectState(t, b.qp, vrdma.QPSErr)
		})
	}
}

// mwTarget registers 4 KiB of b's memory with local write and MW_BIND
// only (no remote right of its own) and returns it with its bytes, filled.
func mwTarget(t *testing.T, b *end) (*vrdma.MR, []byte) {
	t.Helper()
	mr := b.mr(t, 4096, vrdma.AccessLocalWrite|vrdma.AccessMWBind)
	fill(mr.Bytes(), 1)
	return mr, mr.Bytes()
}

// testMWType1: a type 1 window's rights and bounds; the region is held
// while it is bound; rebinding moves the rkey on; dealloc while bound.
func testMWType1(t *testing.T, s *suite) {
	a, b := s.pair(t, pairConfig{})
	mr, area := mwTarget(t, b)
	mw, err := b.pd.AllocMW(opCtx(t), vrdma.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	// The window: [1024, 2048) with write, read and atomic.
	rkey, err := b.qp.BindMW(mw, 1, vrdma.SendSignaled, vrdma.MWBind{MR: mr, Addr: off(mr, 1024), Length: 1024,
		Access: vrdma.AccessRemoteWrite | vrdma.AccessRemoteRead | vrdma.AccessRemoteAtomic})
	if err != nil {
		t.Fatal(err)
	}
	expectWC(t, waitWC(t, b.scq, 1)[0], b.qp, 1, vrdma.WCSuccess, vrdma.WCBindMW)
	if rkey == mr.RKey() || rkey != mw.RKey() {
		t.Fatalf("window rkey 0x%x (MW says 0x%x), the region's 0x%x: want the window's own", rkey, mw.RKey(), mr.RKey())
	}
	// The region may not go while a window is bound to it.
	if err := mr.Dereg(opCtx(t)); err == nil {
		t.Fatal("a region with a bound window was deregistered")
	}
	local := a.mr(t, 256, vrdma.AccessLocalWrite)
	fill(local.Bytes(), 5)
	put64(area[2040:], 40)
	postSend(t, a.qp,
		vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 100)), RemoteAddr: off(mr, 1024), RKey: rkey},
		vrdma.SendWR{ID: 3, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(128, 100)), RemoteAddr: off(mr, 1940), RKey: rkey},
		vrdma.SendWR{ID: 4, Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(248, 8)), RemoteAddr: off(mr, 2040), RKey: rkey, CompareAdd: 2})
	wc := waitWC(t, a.scq, 3)
	expectWC(t, wc[0], a.qp, 2, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	expectWC(t, wc[1], a.qp, 3, vrdma.WCSuccess, vrdma.WCRDMARead)
	expectWC(t, wc[2], a.qp, 4, vrdma.WCSuccess, vrdma.WCFetchAdd)
	expectBytes(t, "WRITE through the window", area[1024:1124], local.Bytes()[:100])
	expectBytes(t, "READ through the window", local.Bytes()[128:228], area[1940:2040])
	if old, now := le64(local.Bytes()[248:]), le64(area[2040:]); old != 40 || now != 42 {
		t.Fatalf("FETCH_ADD through the window: returned %d, left %d; want 40, 42", old, now)
	}
	// Rebinding it read-only moves the rkey on: the old one is refused
	// by the next test's WRITE, and so is a WRITE through the new one.
	old := rkey
	if rkey, err = b.qp.BindMW(mw, 5, vrdma.SendSignaled, vrdma.MWBind{MR: mr, Addr: off(mr, 1024), Length: 1024, Access: vrdma.AccessRemoteRead}); err != nil {
		t.Fatal(err)
	}
	expectWC(t, waitWC(t, b.scq, 1)[0], b.qp, 5, vrdma.WCSuccess, vrdma.WCBindMW)
	if rkey == old {
		t.Fatalf("a rebind kept the rkey 0x%x", rkey)
	}
	postSend(t, a.qp, vrdma.SendWR{ID: 6, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 64)), RemoteAddr: off(mr, 1024), RKey: rkey})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 6, vrdma.WCSuccess, vrdma.WCRDMARead)
	for _, c := range []struct {
		name string
		wr   vrdma.SendWR
	}{
		{"write-old-rkey", vrdma.SendWR{Opcode: vrdma.OpRDMAWrite, RemoteAddr: off(mr, 1024), RKey: old}},
		{"write-read-only-window", vrdma.SendWR{Opcode: vrdma.OpRDMAWrite, RemoteAddr: off(mr, 1024), RKey: rkey}},
		{"read-past-window", vrdma.SendWR{Opcode: vrdma.OpRDMARead, RemoteAddr: off(mr, 2048-32), RKey: rkey}},
		{"read-before-window", vrdma.SendWR{Opcode: vrdma.OpRDMARead, RemoteAddr: off(mr, 1024-8), RKey: rkey}},
		{"read-after-dealloc", vrdma.SendWR{Opcode: vrdma.OpRDMARead, RemoteAddr: off(mr, 1024), RKey: rkey}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "read-after-dealloc" {
				if err := mw.Dealloc(opCtx(t)); err != nil {
					t.Fatal(err)
				}
				if err := mr.Dereg(opCtx(t)); err != nil {
					t.Fatalf("deregistering the region once its window went: %v", err)
				}
			}
			a, b := a, b
			if c.name != "write-old-rkey" {
				// Each refusal moves a's QP to ERR: the next one takes a
				// new pair of QPs in the same PDs, facing each other.
				a, b = newEndIn(t, a.pd, qpConfig{}), newEndIn(t, b.pd, qpConfig{})
				s.connect(t, a, b, connDefault)
				if c.name != "read-after-dealloc" {
					// A type 1 window is its PD's: the new QP of the
					// PD serves it too.
					postSend(t, a.qp, vrdma.SendWR{ID: 8, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 8)), RemoteAddr: off(mr, 1024), RKey: rkey})
					expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 8, vrdma.WCSuccess, vrdma.WCRDMARead)
				}
			}
			want := clone(area)
			wr := c.wr
			wr.ID, wr.Flags, wr.SGL = 7, vrdma.SendSignaled, sgl(local.SGE(0, 64))
			postSend(t, a.qp, wr)
			s.expectNAK(t, waitWC(t, a.scq, 1)[0], a.qp, 7, vrdma.WCRemAccessErr)
			expectBytes(t, "the region", area, want)
		})
	}
}
