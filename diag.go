package vrdma

import (
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/libdiag"
)

func init() {
	libdiag.RingWords = func(q, cq any) string { return ringWords(q.(*QP), cq.(*CQ)) }
}

// ringWords is libdiag.RingWords: the shared words of q's queues and of
// cq, and the library's own CQ head, for a report of a stall.
func ringWords(q *QP, cq *CQ) string {
	m := q.ring.Bytes()
	w := func(b []byte, off int) uint32 { return abi.Word(b, off).Load() }
	cq.mu.Lock()
	defer cq.mu.Unlock()
	c, head := cq.ring.Bytes(), cq.head
	return fmt.Sprintf("QP 0x%x: SQ tail %d, agent head %d, doorbell flag %d; RQ tail %d, agent head %d; state %d. CQ: agent tail %d, head word %d, library head %d, armed %d",
		q.qpn, w(m, abi.OffSQTail), w(m, abi.OffSQHead), w(m, abi.OffSQDoorbell), w(m, abi.OffRQTail), w(m, abi.OffRQHead), w(m, abi.OffQPState),
		w(c, abi.OffCQTail), w(c, abi.OffCQHead), head, w(c, abi.OffCQArmed))
}
