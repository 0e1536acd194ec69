// SPDX-License-Identifier: Apache-2.0

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
	c, head := cq.ringAndHead()
	return fmt.Sprintf("QP 0x%x: SQ tail %d, agent head %d, doorbell flag %d; RQ tail %d, agent head %d; state %d. CQ: agent tail %d, head word %d, library head %d, armed %d",
		q.qpn, word(m, abi.OffSQTail), word(m, abi.OffSQHead), word(m, abi.OffSQDoorbell), word(m, abi.OffRQTail), word(m, abi.OffRQHead), word(m, abi.OffQPState),
		word(c, abi.OffCQTail), word(c, abi.OffCQHead), head, word(c, abi.OffCQArmed))
}

// ringAndHead returns cq's ring (which Resize replaces) and the library's
// head.
func (cq *CQ) ringAndHead() ([]byte, uint32) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.ring.Bytes(), cq.head
}

// word loads the shared word at off of b.
func word(b []byte, off int) uint32 { return abi.Word(b, off).Load() }
