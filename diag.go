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
	return chanWords(q) + fmt.Sprintf("QP 0x%x: SQ tail %d, agent head %d, doorbell flag %d; RQ tail %d, agent head %d; state %d. CQ: agent tail %d, head word %d, library head %d, armed %d",
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

// chanWords describes q's send channel (direct_send.go), if it has one:
// the sender's indices and the states of its messages not reaped, the
// receiver's, and the ring words, for a report of a stall.
func chanWords(q *QP) string {
	ch := q.sch.Load()
	if ch == nil {
		return ""
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	s := fmt.Sprintf("channel (gone %v, needRelay %v): tail %d reap %d sigOut %d rxHead %d", ch.gone, ch.needRelay, ch.tail, ch.reap, ch.sigOut, ch.rxHead)
	if ch.gone {
		return s + ". "
	}
	s += fmt.Sprintf("; tx words tail %d head %d ready %d; rx words tail %d head %d; tx states", word(ch.tx, abi.OffChanTail), word(ch.tx, abi.OffChanHead),
		word(ch.tx, abi.OffChanReady), word(ch.rx, abi.OffChanTail), word(ch.rx, abi.OffChanHead))
	for i := ch.reap; i != ch.tail; i = abi.Next(i, ch.entries) {
		s += fmt.Sprintf(" %d", word(ch.slotOf(ch.tx, i), abi.OffSlotState))
	}
	s += "; rx states"
	for i, n := ch.rxHead, 0; i != word(ch.rx, abi.OffChanTail) && n < 8; i, n = abi.Next(i, ch.entries), n+1 {
		s += fmt.Sprintf(" %d", word(ch.slotOf(ch.rx, i), abi.OffSlotState))
	}
	return s + ". "
}
