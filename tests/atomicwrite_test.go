// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// The conformance case of RDMA atomic write (OpAtomicWrite), run on every
// path by TestConformance.

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vrdma/vrdma"
)

// testAtomicWrite: an atomic write stores its 8 bytes at the target
// (completion ATOMIC_WRITE), again and again; a misaligned target is
// REM_INV_REQ_ERR and a region without REMOTE_WRITE REM_ACCESS_ERR (or,
// on a lossy path whose NAK was lost, RETRY_EXC_ERR), the target
// untouched; the library refuses one with an SGL.
func testAtomicWrite(t *testing.T, s *suite) {
	write := func(a *end, id, addr uint64, rkey uint32, v uint64) vrdma.WorkCompletion {
		t.Helper()
		postSend(t, a.qp, vrdma.SendWR{ID: id, Opcode: vrdma.OpAtomicWrite, Flags: vrdma.SendSignaled, RemoteAddr: addr, RKey: rkey, Swap: v})
		return waitWC(t, a.scq, 1)[0]
	}
	t.Run("stores", func(t *testing.T) {
		a, b := s.pair(t, pairConfig{})
		if !a.vm.Caps().Has(vrdma.CapAtomicWrite) {
			t.Fatalf("the agent does not serve atomic write (caps %v)", a.vm.Caps())
		}
		dst := b.mr(t, 4096, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
		fill(dst.Bytes(), 4)
		want := append([]byte(nil), dst.Bytes()...)
		for i, v := range []uint64{0x1122334455667788, 0, ^uint64(0)} {
			w := write(a, uint64(i+1), dst.Addr()+64, dst.RKey(), v)
			expectWC(t, w, a.qp, uint64(i+1), vrdma.WCSuccess, vrdma.WCAtomicWrite)
			if w.ByteLen != 8 { // as an atomic's, on every path (memcpy-direct's included)
				t.Fatalf("atomic write completion byte_len %d, want 8", w.ByteLen)
			}
			binary.LittleEndian.PutUint64(want[64:], v)
			expectBytes(t, "after the atomic write", dst.Bytes(), want)
		}
		src := a.mr(t, 8, vrdma.AccessAll)
		err := a.qp.PostSend([]vrdma.SendWR{{ID: 9, Opcode: vrdma.OpAtomicWrite, RemoteAddr: dst.Addr(), RKey: dst.RKey(), SGL: sgl(src.SGE(0, 8))}})
		if !errors.Is(err, vrdma.ErrInvalid) {
			t.Errorf("an atomic write with an SGL: %v, want ErrInvalid", err)
		}
	})
	t.Run("misaligned", func(t *testing.T) {
		a, b := s.pair(t, pairConfig{})
		dst := b.mr(t, 4096, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
		s.expectNAK(t, write(a, 1, dst.Addr()+4, dst.RKey(), 1), a.qp, 1, vrdma.WCRemInvReqErr)
		expectBytes(t, "the target of a misaligned atomic write", dst.Bytes(), make([]byte, 4096))
	})
	t.Run("no-remote-write", func(t *testing.T) {
		a, b := s.pair(t, pairConfig{})
		dst := b.mr(t, 4096, vrdma.AccessLocalWrite|vrdma.AccessRemoteRead|vrdma.AccessRemoteAtomic)
		s.expectNAK(t, write(a, 1, dst.Addr(), dst.RKey(), 1), a.qp, 1, vrdma.WCRemAccessErr)
		expectBytes(t, "the target without REMOTE_WRITE", dst.Bytes(), make([]byte, 4096))
	})
}
