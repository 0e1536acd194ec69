package vrdma

import (
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
)

// RingWords describes the shared words of q's queues and of cq, its
// completion queue, for a test's report of a stall: they tell a doorbell
// the agent never heard (a send queue tail past the agent's head, with
// the doorbell flag set) from an event the workload never got (a
// completion queue tail past the workload's head, not armed).
func RingWords(q *QP, cq *CQ) string {
	m, c := q.ring.Bytes(), cq.ring.Bytes()
	w := func(b []byte, off int) uint32 { return abi.Word(b, off).Load() }
	cq.mu.Lock()
	head := cq.head
	cq.mu.Unlock()
	return fmt.Sprintf("QP 0x%x: SQ tail %d, agent head %d, doorbell flag %d; RQ tail %d, agent head %d; state %d. CQ: agent tail %d, head word %d, library head %d, armed %d",
		q.qpn, w(m, abi.OffSQTail), w(m, abi.OffSQHead), w(m, abi.OffSQDoorbell), w(m, abi.OffRQTail), w(m, abi.OffRQHead), w(m, abi.OffQPState),
		w(c, abi.OffCQTail), w(c, abi.OffCQHead), head, w(c, abi.OffCQArmed))
}
