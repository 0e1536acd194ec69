// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestSecurityQPNUnpredictable creates 64 QPs one after the other and
// checks that their numbers are drawn across the 24-bit space, not
// counted: at most two of the 63 consecutive pairs may be adjacent
// numbers (random draws make even one such pair a one-in-100,000
// event), and the numbers span more than 2^20.
func TestSecurityQPNUnpredictable(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	side := lcNewSide(t, ctx, env.Open(t, "qpn", testenv.VMOptions{MemMB: 8})) // its QP is the first
	qpns := []uint32{side.qp.QPN()}
	for range 63 {
		q := side.newQP(t, ctx)
		n := q.QPN()
		if n < 2 || n >= 0xffffff {
			t.Fatalf("QPN 0x%x: want 2 … 0xfffffe", n)
		}
		qpns = append(qpns, n)
	}
	adjacent := 0
	lo, hi := qpns[0], qpns[0]
	for i := 1; i < len(qpns); i++ {
		if d := int64(qpns[i]) - int64(qpns[i-1]); d == 1 || d == -1 {
			adjacent++
		}
		lo, hi = min(lo, qpns[i]), max(hi, qpns[i])
	}
	if adjacent > 2 || hi-lo < 1<<20 {
		t.Fatalf("64 QPs created in a row have numbers %x: %d of 63 consecutive pairs adjacent, spanning 0x%x: the next QPN is predictable", qpns, adjacent, hi-lo)
	}
}
