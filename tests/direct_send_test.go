// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// The send channel of the memcpy-direct path (wire-local.md §4.22): small
// SENDs between the two libraries without the agent, and every case the
// libraries leave to the agent's relay (refusals, retractions, the
// channel's revocation) completing as it always did.

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// directPair connects a memcpy-direct pair in two new VMs named after
// prefix.
func directPair(t *testing.T, prefix string, c pairConfig) (*suite, *end, *end) {
	t.Helper()
	env := testenv.Start(t)
	s := &suite{env: &directEnv{memcpyEnv{env: env, prefix: prefix}}, how: connOOB}
	a, b := s.pair(t, c)
	if p := a.qp.Path(); p.Path != vrdma.PathMemcpyDirect {
		t.Fatalf("path %+v, want memcpy-direct", p)
	}
	return s, a, b
}

// TestDirectSendNotRelayed sends small SENDs and SEND_WITH_IMMs, signaled
// and not, of 0 to 4096 bytes, both ways: each arrives whole, in order,
// with its immediate, and the agent's counters show it executed none of
// them (its op counters count only what it relayed).
func TestDirectSendNotRelayed(t *testing.T) {
	s, a, b := directPair(t, "dsn", pairConfig{})
	sizes := []int{0, 1, 8, 64, 1000, 4096}
	for dir, e := range [][2]*end{{a, b}, {b, a}} {
		src, dst := e[0], e[1]
		sm, rm := src.mr(t, 4096*len(sizes), vrdma.AccessAll), dst.mr(t, 4096*len(sizes), vrdma.AccessAll)
		for i := range sm.Bytes() {
			sm.Bytes()[i] = byte(i*13 + dir)
		}
		var recvs []vrdma.RecvWR
		var sends []vrdma.SendWR
		for i, n := range sizes {
			recvs = append(recvs, vrdma.RecvWR{ID: uint64(100 + i), SGL: sgl(rm.SGE(4096*i, 4096))})
			wr := vrdma.SendWR{ID: uint64(i), Opcode: vrdma.OpSend, SGL: sgl(sm.SGE(4096*i, n))}
			if i%2 == 1 {
				wr.Opcode, wr.Imm = vrdma.OpSendWithImm, uint32(0xabc0+i)
			}
			if i != 2 {
				wr.Flags = vrdma.SendSignaled
			}
			sends = append(sends, wr)
		}
		postRecv(t, dst.qp, recvs...)
		postSend(t, src.qp, sends...)
		got := waitWC(t, dst.rcq, len(sizes))
		for i, w := range got {
			n := sizes[i]
			if w.WRID != uint64(100+i) || w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCRecv || w.ByteLen != uint32(n) ||
				w.SrcQP != src.qp.QPN() || w.QPNum != dst.qp.QPN() {
				t.Fatalf("direction %d: receive %d: %+v", dir, i, w)
			}
			if imm := i%2 == 1; imm != (w.Flags&vrdma.WCWithImm != 0) || imm && w.Imm != uint32(0xabc0+i) {
				t.Fatalf("direction %d: receive %d: flags %v imm 0x%x", dir, i, w.Flags, w.Imm)
			}
			expectBytes(t, "received", rm.Bytes()[4096*i:4096*i+n], sm.Bytes()[4096*i:4096*i+n])
		}
		sc := waitWC(t, src.scq, len(sizes)-1)
		for _, w := range sc {
			if w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCSend || w.WRID == 2 {
				t.Fatalf("direction %d: send completion %+v", dir, w)
			}
		}
		if c := s.qpCounters(t, src); c.Ops["SEND"] != 0 || c.Ops["SEND_WITH_IMM"] != 0 {
			t.Fatalf("direction %d: the agent relayed SENDs the channel should have carried: %v", dir, c.Ops)
		}
	}
}

var _ = bytes.Equal
var _ = binary.LittleEndian
