// SPDX-License-Identifier: Apache-2.0

package device

import (
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// windowPath stands for a windowed path (the RC requester engine) that
// has taken n WQEs from the SQ head and not completed them: its Flush
// completes them with WR_FLUSH_ERR from the head, as requester.Engine's
// does.
type windowPath struct {
	q    *QP
	n    int
	slot []byte
}

func (w *windowPath) Kind() abi.PathKind        { return abi.PathTest }
func (w *windowPath) Pump()                     {}
func (w *windowPath) Busy() bool                { return w.n > 0 }
func (w *windowPath) Drop()                     { w.n = 0 }
func (w *windowPath) PollBudget() time.Duration { return 0 }
func (w *windowPath) Flush() {
	for ; w.n > 0; w.n-- {
		var wqe abi.SendWQE
		w.q.ReadWQE(w.q.SQHead(), w.slot, &wqe)
		w.q.CompleteHead(&wqe, abi.WCWRFlushErr, 0)
	}
}

// TestSecurityFlushRevalidatesSQTail: a workload whose QP has six WQEs in
// its path's window moves its SQ tail back to 2 — a tail that is valid
// against the head before the window is flushed, and invalid after — and
// its QP goes to ERR. The ERR flush completes the window's six and stops:
// it checks the tail against the head the window's flush left, instead of
// flushing on from there round the ring through twelve slots that hold no
// posted WQE (completions of work requests never posted, and a head past
// the workload's tail).
func TestSecurityFlushRevalidatesSQTail(t *testing.T) {
	h := newRingHarness(t)
	var ws []abi.SendWQE
	for range 6 {
		ws = append(ws, abi.SendWQE{Opcode: abi.OpSend, Flags: abi.SendSignaled | abi.SendInline})
	}
	rc := h.setup(t, sendSlots(ws...), 6, 0, nil, 0, nil, 0, 0, 0)
	q := rc.q
	q.cur = &windowPath{q: q, n: 6, slot: make([]byte, q.layout.SQStride)}
	abi.Word(q.ring.Bytes(), abi.OffSQTail).Store(2) // behind the window
	q.MoveToErr("test: the QP fails with six WQEs in flight")
	q.drain()
	got := completions(rc.cq)
	if len(got) != 6 {
		t.Fatalf("the ERR flush wrote %d completions, want the window's 6: %+v", len(got), got)
	}
	for i, e := range got {
		if e.WRID != wrSQ+uint64(i) || e.Status != abi.WCWRFlushErr {
			t.Fatalf("completion %d: WR 0x%x %s, want WR 0x%x flushed", i, e.WRID, e.Status, wrSQ+i)
		}
	}
	if q.sqHead != 6 {
		t.Fatalf("SQ head %d after the flush, want 6 (the window's end)", q.sqHead)
	}
	if q.hasWork(2) {
		t.Fatal("the invalid tail is work for the QP's goroutine: it would spin on it")
	}
	h.teardown(t, rc)
}
