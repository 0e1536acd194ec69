// SPDX-License-Identifier: Apache-2.0

package rdma

// READ responses longer than a turn, paced and interleaved: a peer's RDMA
// READ asks for up to 2 GiB with one packet, and the responder must not
// send all of it at once from the engine's only reader (which then reads
// nothing: every other QP of the engine starves, and the reader's own
// socket overflows). The reader executes the READ — every check before a
// byte moves, its PSNs and responder resource taken — and sends a
// response of at most readTurn packets itself, as it answers a WRITE; a
// longer one it queues on the QP's answer queue (readQueue) for the
// engine's READ sender. From then until the queue is empty, the QP's
// other answers (ACKs, NAKs, atomic acknowledgements, further READ
// responses) join the queue behind it: a QP's responses leave in PSN
// order, as the requester's coalesced ACKs need (an ACK past a READ
// still being answered would be an implicit NAK of it).
//
// A READ request from a vrdma requester (AckReq clear) asks for a response
// paced by its credit (readCredit): the responder sends readCredit packets
// from the packet asked from, and more when the requester asks for more
// (continuations); a response out of credit waits off the sender's round.
// Its packets carry AckReq, so that the requester knows the responder
// paces and sends continuations; a request from any other requester gets
// its whole response, a turn at a time.
//
// Outbound flow of a queued READ response:
//
//  1. Engine.read (the reader): executes the READ, queues it (readQueue.add)
//     and puts its QP on the sender's round (readSender.put).
//  2. Engine.sendReads (the READ sender): takes the next QP of the round,
//     sends the answers at its queue's head and one turn — at most
//     readTurn packets, a batch, within the credit — of
//     the READ response there (Engine.turn), and puts the QP at the back
//     of the round if its queue still holds something it may send. Round
//     robin: a QP with a 2 GiB READ gets one turn per round like a QP
//     with a 1 MiB one.
//  3. The reader, for a READ request of a READ still queued
//     (readQueue.restart): a continuation extends its credit and puts it
//     back on the round if it waited for credit; a request from before
//     the packet the sender would send next (the requester lost a
//     response packet and asks from it on) moves that READ's cursor back
//     to the packet asked for: the rest is sent once, not once per
//     request, so a READ that loses packets is sent again only from each
//     loss, not whole.
//
// Memory: the sender holds the target's memory for one turn at a time
// (Target.Hold, then Begin: the R_Key, bounds and access checked again,
// the region resolved again), never between turns: a dereg-mr, destroy or
// power-off waits for one turn at most, and the turn after it fails the
// READ with a NAK Remote Access Error (the QP in ERR) instead of reading
// memory that went.
//
// Goroutines: Engine.sendReads, one per engine, started by Start and
// stopped by Close; it owns the READ sender's round and, for each QP it
// serves, its queue's batch, header and message scratch. The reader and
// the sender share each queue under readQueue.mu. A panic in a turn
// drops that QP's queue only (the requester's timeout asks again): the
// sender lives.

import (
	"sync"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/rocewire"
)

// readTurn is the most packets of one READ response the responder sends
// before it serves another QP: a batch, one or two sendmmsg (a MiB of 4 KiB
// packets). A response of at most readTurn packets the reader sends
// itself.
const readTurn = maxPackets

// readCredit is the requester's credit: how many packets of a READ's
// response, from the packet a READ request asks from, that request lets
// the responder send. The requester asks for more before they have all
// come — the same READ request again, from the end of what it was granted
// (a continuation), sent by the engine's reader once half of them have
// landed — so that a long READ flows without a pause, with at most one
// and a half credits of it (768 packets) in the network and in the
// requester's socket: within maxOutstanding, the bound that keeps a fast
// requester from overflowing a slow responder's socket buffer, here
// keeping a fast responder from overflowing a slow requester's. Two turns:
// a smaller credit leaves the sender waiting for continuations (a quarter
// less bandwidth at 256 on a loaded machine), a larger one costs more per
// loss (what is in flight is sent again) and keeps more of the READ ahead
// of other QPs' packets in the requester's socket. A request from before
// the packet the responder would send next asks for packets lost, and the
// responder goes back to it (restart). Only a requester that asks for it
// (AckReq clear) is paced: it sends continuations.
const readCredit = 2 * readTurn

// maxAnswers bounds a QP's answer queue: a requester within its
// max_rd_atomic (at most abi.MaxRdAtom) has that many READs and atomics
// in flight, each answered once, with an ACK between each two and a NAK;
// a peer beyond it has its answers dropped (counted: its timeout asks
// again), as a responder out of resources does.
const maxAnswers = 4 * abi.MaxRdAtom

// answer is one response of a QP waiting in its answer queue: a packet
// without payload (ACK, NAK, ATOMIC_ACKNOWLEDGE), or a READ response and
// the packet it goes on from.
type answer struct {
	t   device.Target // the QP it answers for
	gen uint32        // t.Resets() when it was queued: an answer of a QP reset since is dropped

	read bool // a READ response; otherwise the packet in hdr
	ack  bool // a positive ACK: a later one queued behind it replaces it
	// A READ response paced by its requester's credit (its request had
	// AckReq clear); its packets carry AckReq to say so.
	paced bool

	// A READ response: the READ, its first PSN, its packets, the packet
	// to send next, the packet the requester's credit ends before, its
	// packets' payload and the MSN its AETHs carry.
	req   device.Request
	dqpn  uint32
	psn   uint32
	npkt  uint32
	next  uint32
	limit uint32
	mtu   uint32
	msn   uint32
	xrc   rocewire.Opcode // XRC's opcode bits: an XRC target QP's response

	hlen int
	hdr  [maxHeader]byte
}

// readQueue is a QP's answer queue (its path's), made when its first
// READ response is queued.
type readQueue struct {
	mu sync.Mutex
	// The queue: n answers from head, of which the sender took the first
	// taken (sending them; it removes them once they left).
	ring [maxAnswers]answer // +checklocks:mu
	head int                // +checklocks:mu
	n    int                // +checklocks:mu
	// +checklocks:mu
	taken int
	// busy: on the sender's round or being served by it; false when the
	// queue is empty or its head is a READ response out of credit
	// (parked), until an answer or a continuation is queued.
	// +checklocks:mu
	busy bool

	// The sender's: its batch to the QP's peer, the READ's message at the
	// target, and a copy of the answer it sends.
	out *batch
	msg device.Message
	cur answer
	hdr [maxHeader]byte
	seg [1][]byte

	// nextReady links the sender's round (readSender.mu).
	nextReady *path
}

// add queues a (the reader): it reports false, queuing nothing, when
// the queue is full. put is true when the queue was not on the sender's
// round: the caller puts it there.
func (q *readQueue) add(a *answer) (ok, put bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == maxAnswers {
		return false, false
	}
	q.ring[(q.head+q.n)%maxAnswers] = *a
	q.n++
	put = !q.busy
	q.busy = true
	return true, put
}

// addShort queues the packet h (an ACK, NAK or ATOMIC_ACKNOWLEDGE; ack:
// a positive ACK) for target t of generation gen if the queue holds
// something, and reports whether it did (the reader: otherwise it sends
// h itself, nothing of the QP's being ahead of it). A positive ACK
// replaces one at the queue's tail that the sender has not taken.
func (q *readQueue) addShort(t device.Target, gen uint32, h []byte, ack bool) (queued bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return false
	}
	if ack && q.n > q.taken {
		if tail := &q.ring[(q.head+q.n-1)%maxAnswers]; tail.ack && tail.t == t && tail.gen == gen {
			tail.hlen = copy(tail.hdr[:], h)
			return true
		}
	}
	if q.n == maxAnswers {
		t.Counters().Dropped.Add(1)
		return true // dropped: the requester's timeout asks again
	}
	a := &q.ring[(q.head+q.n)%maxAnswers]
	a.t, a.gen, a.read, a.ack = t, gen, false, ack
	a.hlen = copy(a.hdr[:], h)
	q.n++
	return true
}

// restart is a READ request, from packet k on, for the READ response
// queued at first PSN psn (the reader, for a duplicate READ request): a
// continuation, from at or past the packet to send next, extends its
// credit to k+readCredit; a request from before it asks for packets lost,
// and the response goes back to k, with the credit from there. It
// reports whether such a response is queued (found), whether the request
// was a continuation (cont), and whether the queue was off the sender's
// round (put: the caller puts it there).
func (q *readQueue) restart(t device.Target, gen, psn, k uint32) (found, cont, put bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range q.n {
		a := &q.ring[(q.head+i)%maxAnswers]
		if !a.read || a.psn != psn || a.t != t || a.gen != gen {
			continue
		}
		cont = k >= a.next
		if !cont {
			a.next = k
		}
		if a.paced {
			a.limit = max(a.limit, k+readCredit)
			if !cont {
				a.limit = k + readCredit
			}
		}
		put = !q.busy
		q.busy = true
		return true, cont, put
	}
	return false, false, false
}

// parked reports whether the READ response at the queue's head has
// packets left and no credit for them: it waits for its requester's next
// request.
//
// +checklocks:q.mu
func (q *readQueue) parked() bool {
	a := &q.ring[q.head]
	return q.n > 0 && a.read && a.next < a.npkt && a.next >= a.limit
}

// readSender is an engine's round of QPs with answers queued, in the
// order they are served: a list through readQueue.nextReady.
type readSender struct {
	mu     sync.Mutex
	head   *path // +checklocks:mu
	tail   *path // +checklocks:mu
	closed bool  // +checklocks:mu
	wake   chan struct{}
}

// put puts p at the back of the round.
func (s *readSender) put(p *path) {
	s.mu.Lock()
	if s.tail == nil {
		s.head = p
	} else {
		s.tail.rsp.rq.nextReady = p
	}
	s.tail = p
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// take takes the QP at the front of the round, waiting for one; nil once
// the sender is stopped.
func (s *readSender) take() *path {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil
		}
		if p := s.head; p != nil {
			s.head = p.rsp.rq.nextReady
			if s.head == nil {
				s.tail = nil
			}
			p.rsp.rq.nextReady = nil
			s.mu.Unlock()
			return p
		}
		s.mu.Unlock()
		<-s.wake
	}
}

// stop makes take return nil.
func (s *readSender) stop() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// sendReads is the engine's READ sender: it serves the QPs of its round
// one turn each, until Close.
func (e *Engine) sendReads() {
	defer e.wg.Done()
	for {
		p := e.rd.take()
		if p == nil {
			return
		}
		if e.safeTurn(p) {
			e.rd.put(p)
		}
	}
}

// safeTurn is turn, except that a panic in it — a bug reached by a
// request — drops p's queue only, logged and counted as the reader's
// packet is (Counters.Panics).
func (e *Engine) safeTurn(p *path) (more bool) {
	defer func() {
		if r := recover(); r != nil {
			more = false
			e.panicked("a READ response to "+p.peer.String(), r)
			q := p.rsp.rq
			q.out = nil // unsent: it may point into memory no longer held
			q.mu.Lock()
			q.drop(q.n)
			q.busy = false
			q.mu.Unlock()
		}
	}()
	return e.turn(p)
}

// turn sends the answers at the head of p's queue and one turn of the
// READ response after them, if one is there, then removes from the queue
// what it sent; it reports whether p stays on the round: its queue holds
// more, and not only a READ response waiting for credit (parked).
func (e *Engine) turn(p *path) bool {
	q := p.rsp.rq
	if q.out == nil {
		q.out = newBatch(e, p.peer, p.mac, p.m)
	}
	taken := 0 // answers taken from the queue's head
	read := false
	var from, next uint32 // the READ response's turn: the packets sent
	for {
		q.mu.Lock()
		if q.taken == q.n {
			q.mu.Unlock()
			break
		}
		q.cur = q.ring[(q.head+q.taken)%maxAnswers]
		q.taken++
		q.mu.Unlock()
		a := &q.cur
		taken++
		if a.t.Resets() != a.gen || a.t.BoundPath() != device.Path(p) {
			continue // the QP was reset, or connected again, since: nothing to answer
		}
		if !a.read {
			q.out.add(a.hdr[:a.hlen], nil, 0)
			continue
		}
		n, ok := e.sendTurn(p, a)
		if !ok {
			// The QP is gone or left RTS, or the READ failed (its NAK
			// is in the batch and the QP in ERR): it answers nothing more.
			q.out.flush()
			q.mu.Lock()
			q.drop(q.n)
			q.busy = false
			q.mu.Unlock()
			return false
		}
		read, from, next = true, a.next, n
		break
	}
	q.out.flush()
	q.mu.Lock()
	defer q.mu.Unlock()
	if read {
		a := &q.ring[(q.head+taken-1)%maxAnswers]
		if a.next == from {
			a.next = next // not moved back meanwhile by a request for packets lost (restart)
		}
		if a.next < a.npkt {
			taken-- // it stays at the head
		}
	}
	q.drop(taken)
	q.busy = q.n > 0 && !q.parked()
	return q.busy
}

// drop removes the first n answers of the queue (the sender, after they
// left).
//
// +checklocks:q.mu
func (q *readQueue) drop(n int) {
	for i := range n {
		q.ring[(q.head+i)%maxAnswers].t = nil
	}
	q.head = (q.head + n) % maxAnswers
	q.n -= n
	q.taken = 0
}

// sendTurn sends up to readTurn packets of READ response a from packet
// a.next on, within its credit, under the target's hold (the batch points into its memory:
// it is flushed before the hold ends), and returns the packet to send
// next. false: the target is gone or does not answer (not in RTR..SQD:
// nothing is sent), or the READ failed its checks (the region
// deregistered since): its NAK, at the first PSN not sent, is in the
// batch.
func (e *Engine) sendTurn(p *path, a *answer) (uint32, bool) {
	q := p.rsp.rq
	t := a.t
	end := min(a.next+readTurn, a.npkt, a.limit)
	if end <= a.next {
		return a.next, true // no credit: parked
	}
	if !t.Hold() {
		return 0, false
	}
	defer t.Release()
	if v := t.Begin(&a.req, &q.msg); v.Status != abi.WCSuccess {
		// Begin moved the QP to ERR (a remote access error).
		h := q.hdr[:rocewire.BTHLen+rocewire.AETHLen]
		rocewire.BTH(h).Encode(&rocewire.BTHFields{Opcode: rocewire.Acknowledge | a.xrc, PKey: rocewire.DefaultPKey, DestQP: a.dqpn, PSN: (a.psn + a.next) & rc.PSNMask})
		rocewire.AETH(h[rocewire.BTHLen:]).Encode(nakSyndrome(rc.NAKOf(v.Status)), a.msn)
		q.out.add(h, nil, 0)
		t.End(&q.msg)
		return 0, false
	}
	for i := a.next; i < end; i++ {
		readPacket(q.out, &q.hdr, &q.msg, &q.seg, a, i)
	}
	q.out.flush() // before End and Release: the batch points into the target's memory
	t.End(&q.msg)
	return end, true
}

// readPacket adds packet i of READ response a to out, its payload from
// m's target (held).
func readPacket(out *batch, hdr *[maxHeader]byte, m *device.Message, seg *[1][]byte, a *answer, i uint32) {
	mtu := uint64(a.mtu)
	off := uint64(i) * mtu
	n := min(mtu, a.req.Total-off)
	var op rocewire.Opcode
	switch {
	case a.npkt == 1:
		op = rocewire.RDMAReadResponseOnly
	case i == 0:
		op = rocewire.RDMAReadResponseFirst
	case i == a.npkt-1:
		op = rocewire.RDMAReadResponseLast
	default:
		op = rocewire.RDMAReadResponseMiddle
	}
	h := hdr[:rocewire.BTHLen]
	if op != rocewire.RDMAReadResponseMiddle {
		h = hdr[:rocewire.BTHLen+rocewire.AETHLen]
		rocewire.AETH(h[rocewire.BTHLen:]).Encode(rocewire.ACK, a.msn)
	}
	rocewire.BTH(h).Encode(&rocewire.BTHFields{Opcode: op | a.xrc, PKey: rocewire.DefaultPKey, DestQP: a.dqpn,
		PSN: (a.psn + i) & rc.PSNMask, PadCount: rocewire.PadCount(int(n)), AckReq: a.paced})
	var data [][]byte
	if n > 0 {
		seg[0] = m.Place(off, n)
		data = seg[:]
	}
	out.add(h, data, int(n))
}
