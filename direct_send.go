// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/libdiag"
	"github.com/vrdma/vrdma/internal/sys"
)

// The send channel of the memcpy-direct path (docs/wire-local.md §4.22).
// A QP bound to memcpy-direct whose agent and peer serve direct-send gets
// a grant of its connection's channel file (direct-channel), two rings
// shared with the peer's library: it writes small SENDs into its tx ring
// (chanPost, under the QP's send lock) and takes the peer's from its rx
// ring with receives of its own RQ (take, at every poll of its receive
// CQ); the send completions come from the receiver's verdicts (reap, at
// every poll of its send CQ). What a receiver will not take it refuses,
// and the sender retracts that message and every later one and posts them
// to its SQ ring (relayLocked): the agent's relay, which waits for the
// channel to drain first, completes them as it completes any WR.
//
// Goroutines: none of its own. The VM's revocation reader (direct.go)
// takes the channel's notice: it records the state of every message the
// QP has in the channel, unmaps the file and acknowledges; the next post
// or poll settles them. Locks: a QP's sqMu, then a CQ's mu, then a
// channel's mu; the reader takes the table's mu and the channel's mu
// only, and nobody holds a channel's mu across a command. Commands the
// channel needs (direct-notify, a modify to ERR, a relay's doorbell) are
// sent after every lock is released (after).

// sendChan is one QP's grant of its connection's send channel.
type sendChan struct {
	q       *QP
	tab     *directTable
	slot    uint32
	word    uint32 // the grant's valid state word
	entries uint32
	stride  uint32
	peerQPN uint32
	relay   int64 // ns a message may stay posted untaken

	mu sync.Mutex
	m  *sys.Mapping // +checklocks:mu
	tx []byte       // +checklocks:mu
	rx []byte       // +checklocks:mu
	// gone: revoked; m is unmapped and recs hold each message's state.
	gone bool // +checklocks:mu
	// The sender's side: the next index it fills and the next it reaps,
	// each message's record, the signaled ones not reaped.
	tail   uint32  // +checklocks:mu
	reap   uint32  // +checklocks:mu
	recs   []txRec // +checklocks:mu
	sigOut int     // +checklocks:mu
	// unreapedN mirrors unreaped() for the direct path's check without
	// the locks (chanIdle): only the poster, under q.sqMu, adds to it,
	// so a poster that reads 0 has nothing in the channel until it
	// posts again.
	unreapedN atomic.Uint32
	// broken: an error verdict or a bad index: nothing more is posted.
	broken bool // +checklocks:mu
	// waits counts the reaps that found the oldest message still posted;
	// the clock (40-90 ns a read here, a third of an empty poll) is read
	// for relay_ns at one such reap in 32 only.
	waits uint32 // +checklocks:mu
	// The receiver's side: the next index it takes, and how many
	// retracted messages it skipped since relayWait cleared the count.
	rxHead  uint32 // +checklocks:mu
	skipped uint32 // +checklocks:mu
	// Work for after the locks: a retraction due, direct-notify the
	// peer's send CQ (refused: solicited), the QP to ERR.
	needRelay  bool // +checklocks:mu
	notifyTx   bool // +checklocks:mu
	notifyTxSE bool // +checklocks:mu
	toErr      bool // +checklocks:mu
}

// txRec is what the sender keeps of a message it put into the channel.
type txRec struct {
	id       uint64
	op       Opcode
	flags    SendFlags
	signaled bool
	imm      uint32
	length   uint32
	nsge     uint8
	sge      [abi.MaxSGE]SGE
	posted   int64 // mono() when it was posted
	// Once the channel is gone: the slot's state and verdict then, and
	// an INLINE message's bytes (the relay needs them).
	state  uint32
	status uint8
	data   []byte
}

// monoBase anchors mono.
var monoBase = time.Now()

// mono is a monotonic clock in nanoseconds.
func mono() int64 { return int64(time.Since(monoBase)) }

// chanNever in QP.chanNext: ask for no channel until the next RTS.
const chanNever = math.MaxInt64

// enter opens an in-use hold of the channel's grant (§4.21 pair 4);
// false, holding nothing, when the grant is revoked or revoking.
//
// +checklocks:ch.mu
func (ch *sendChan) enter() bool {
	if ch.gone {
		return false
	}
	tab := ch.tab.table.Bytes()
	inUse := abi.Word(tab, int(ch.slot)*abi.GrantSlotSize+abi.OffGrantInUse)
	inUse.Add(1) // a read-modify-write: a full barrier before the state's load
	if abi.Word(tab, int(ch.slot)*abi.GrantSlotSize+abi.OffGrantState).Load() != ch.word {
		inUse.Add(^uint32(0))
		return false
	}
	return true
}

// leave ends enter's hold.
//
// +checklocks:ch.mu
func (ch *sendChan) leave() {
	abi.Word(ch.tab.table.Bytes(), int(ch.slot)*abi.GrantSlotSize+abi.OffGrantInUse).Add(^uint32(0))
}

// slotOf returns the slot of index i in ring r.
func (ch *sendChan) slotOf(r []byte, i uint32) []byte {
	off := abi.ChanHeaderSize + int(abi.Slot(i, ch.entries))*int(ch.stride)
	return r[off : off+int(ch.stride)]
}

// rec returns the record of index i.
//
// +checklocks:ch.mu
func (ch *sendChan) rec(i uint32) *txRec { return &ch.recs[abi.Slot(i, ch.entries)] }

// unreaped is how many messages the sender put in and has not reaped.
//
// +checklocks:ch.mu
func (ch *sendChan) unreaped() uint32 { n, _ := abi.Pending(ch.tail, ch.reap, ch.entries); return n }

// askChannel asks the agent for q's channel, if q may have one and it is
// time to ask (§4.22 "When a library asks": after the backoff of an
// "unavailable", or at once when the channel-offer word says the peer got
// the channel since); it never waits for another ask in progress.
func (q *QP) askChannel(ctx context.Context) {
	next := q.chanNext.Load()
	if !q.direct.Load() || q.sch.Load() != nil || next == chanNever {
		return
	}
	offer := abi.Word(q.ring.Bytes(), abi.OffChanOffer).Load()
	if mono() < next && offer == q.chanOffer.Load() || !q.chanAsking.CompareAndSwap(false, true) {
		return
	}
	defer q.chanAsking.Store(false)
	q.chanOffer.Store(offer)
	if q.sch.Load() != nil || !QPState(abi.Word(q.ring.Bytes(), abi.OffQPState).Load()).HoldsChannel() {
		return
	}
	t := q.dtab.Load()
	var r abi.DirectChannel
	fds, err := q.vm.c.call(ctx, abi.OpDirectChannel, &abi.Handle{Handle: q.handle}, &r)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			w := min(max(2*q.chanWait.Load(), int64(time.Millisecond)), int64(time.Second))
			q.chanWait.Store(w)
			q.chanNext.Store(mono() + w)
		} else {
			q.chanNext.Store(chanNever)
		}
		return
	}
	ch, err := t.mapChannel(q, &r, fds)
	if err != nil {
		q.chanNext.Store(chanNever)
		return
	}
	q.chanWait.Store(0)
	q.sch.Store(ch)
	q.sendCQ.addChan(ch)
	if q.recvCQ != q.sendCQ {
		q.recvCQ.addChan(ch)
	}
}

// mapChannel checks the agent's reply, maps the channel file, marks the
// rx ring ready and records the grant in the table.
func (t *directTable) mapChannel(q *QP, r *abi.DirectChannel, fds []int) (*sendChan, error) {
	defer closeFDs(fds)
	if len(fds) != 1 {
		return nil, errorf(abi.CodeInternal, "vrdma: direct-channel: the agent sent %d descriptors, want 1", len(fds))
	}
	size, err := sys.FileSize(fds[0])
	if err == nil {
		err = r.Check(t.slots, size)
	}
	if err != nil {
		return nil, errorf(abi.CodeInternal, "vrdma: direct-channel: %v", err)
	}
	m, err := sys.Map(fds[0], int(r.Size), false)
	if err != nil {
		return nil, errorf(abi.CodeInternal, "vrdma: direct-channel: %v", err)
	}
	ring := abi.ChanRingBytes(r.Entries, r.Stride)
	if d := libdiag.RelayAfter.Load(); d > 0 {
		r.RelayNS = uint64(d) // a test's
	}
	ch := &sendChan{q: q, tab: t, slot: r.Slot, word: r.State, entries: r.Entries, stride: r.Stride, peerQPN: r.PeerQPN, relay: int64(r.RelayNS),
		m: m, tx: m.Bytes()[r.TxOffset : r.TxOffset+ring], rx: m.Bytes()[r.RxOffset : r.RxOffset+ring], recs: make([]txRec, r.Entries)}
	t.mu.Lock()
	defer t.mu.Unlock()
	if w, ok := t.early[r.Slot]; ok && w == r.State || t.closed {
		delete(t.early, r.Slot)
		m.Unmap() // revoked before we saw it
		return nil, errorf(abi.CodeUnavailable, "vrdma: direct-channel: revoked at once")
	}
	delete(t.early, r.Slot)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !ch.enter() {
		m.Unmap()
		return nil, errorf(abi.CodeUnavailable, "vrdma: direct-channel: revoked at once")
	}
	// Our own indices as the file holds them: a grant asked again after
	// a failed map finds the rings where the peer left them.
	ch.rxHead = abi.Word(ch.rx, abi.OffChanHead).Load()
	ch.tail = abi.Word(ch.tx, abi.OffChanTail).Load()
	if !abi.ValidIndex(ch.rxHead, ch.entries) || !abi.ValidIndex(ch.tail, ch.entries) {
		ch.leave()
		m.Unmap()
		return nil, errorf(abi.CodeInternal, "vrdma: direct-channel: the rings' indices are not valid")
	}
	ch.reap = ch.tail
	abi.StoreFenced(abi.Word(ch.rx, abi.OffChanReady), 1)
	ch.leave()
	t.chans[r.Slot] = ch
	return ch, nil
}

// revoked is the revocation reader's part: it records the state of each
// message the sender has in the channel, and an INLINE one's bytes, then
// unmaps the file. No library copy is in the file: the agent saw both
// in-use words 0 after marking the grants.
func (ch *sendChan) revoked() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.gone {
		return
	}
	for i := ch.reap; i != ch.tail; i = abi.Next(i, ch.entries) {
		r, s := ch.rec(i), ch.slotOf(ch.tx, i)
		r.state, r.status = abi.Word(s, abi.OffSlotState).Load(), s[abi.OffSlotStatus]
		if r.flags&SendInline != 0 && r.state != abi.SlotDone && r.state != abi.SlotRetracted {
			r.data = append([]byte(nil), s[abi.ChanSlotHeader:abi.ChanSlotHeader+int(r.length)]...)
		}
	}
	ch.gone = true
	ch.needRelay = ch.unreaped() != 0
	ch.m.Unmap()
	ch.m, ch.tx, ch.rx = nil, nil, nil
}

// dropChan forgets q's channel once it is gone and settled, or q goes.
func (q *QP) dropChan(ch *sendChan) {
	if q.sch.CompareAndSwap(ch, nil) {
		q.sendCQ.removeChan(ch)
		q.recvCQ.removeChan(ch)
	}
}

// addChan makes the CQ serve ch at its polls (reap, take).
func (cq *CQ) addChan(ch *sendChan) {
	cq.mu.Lock()
	cq.chans = append(cq.chans, ch)
	cq.mu.Unlock()
}

// removeChan stops serving ch.
func (cq *CQ) removeChan(ch *sendChan) {
	cq.mu.Lock()
	for i, c := range cq.chans {
		if c == ch {
			cq.chans = append(cq.chans[:i], cq.chans[i+1:]...)
			break
		}
	}
	cq.mu.Unlock()
}

// chanPost puts wr into q's channel if every rule of §4.22 allows it, and
// reports whether it did (false: relay it). The caller holds q.sqMu.
//
// +checklocks:q.sqMu
func (q *QP) chanPost(ch *sendChan, wr *SendWR) bool {
	if wr.Opcode != OpSend && wr.Opcode != OpSendWithImm {
		return false
	}
	mem := q.ring.Bytes()
	if QPState(abi.Word(mem, abi.OffQPState).Load()) != QPSRTS || abi.Word(mem, abi.OffSQHead).Load() != q.sqTail {
		return false // rules 1 and 2 (the ring's part)
	}
	// Rule 3: the local side.
	inline := wr.Flags&SendInline != 0
	total, valid := q.directLocal(wr, false)
	if !valid {
		return false
	}
	if total > uint64(ch.stride-abi.ChanSlotHeader) || inline && total > uint64(q.caps.MaxInlineData) {
		return false
	}
	signaled := wr.Flags&SendSignaled != 0 || q.sqSigAll
	cq := q.sendCQ
	cq.mu.Lock()
	defer cq.mu.Unlock()
	ok := true
	if q.sendDone.Load() < q.relayedSignaled {
		ok = cq.drainLocked() && q.sendDone.Load() >= q.relayedSignaled // rule 2 (the CQ's part)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.reapLocked(cq)
	if !ok || ch.gone || ch.broken || ch.needRelay || ch.unreaped()+1 > q.layout.SQEntries {
		return false
	}
	if signaled {
		ring := cq.ring.Bytes()
		pending, _ := abi.Pending(abi.Word(ring, abi.OffCQTail).Load(), cq.head, cq.layout.Entries)
		if uint64(cq.localLen())+uint64(pending)+uint64(ch.sigOut) >= uint64(cq.layout.Entries) {
			return false // rule 6, with the channel's completions to come
		}
	}
	if !ch.enter() {
		return false
	}
	defer ch.leave()
	tx := ch.tx
	head := abi.Word(tx, abi.OffChanHead).Load()
	if n, valid := abi.Pending(ch.tail, head, ch.entries); !valid || n >= ch.entries || abi.Word(tx, abi.OffChanReady).Load() != 1 {
		return false // not ready, full, or a head word the peer garbled
	}
	slot := ch.slotOf(tx, ch.tail)
	state := abi.Word(slot, abi.OffSlotState)
	if state.Load() != abi.SlotFree {
		return false
	}
	r := ch.rec(ch.tail)
	*r = txRec{id: wr.ID, op: wr.Opcode, flags: wr.Flags, signaled: signaled, imm: wr.Imm, length: uint32(total), nsge: uint8(len(wr.SGL)), posted: mono()}
	copy(r.sge[:], wr.SGL)
	gm, data := q.vm.mem.Bytes(), slot[abi.ChanSlotHeader:]
	n := 0
	for _, s := range wr.SGL {
		n += copy(data[n:], gm[s.Addr:s.Addr+uint64(s.Length)])
	}
	var flags uint8
	if signaled {
		flags |= abi.ChanFlagSignaled
	}
	if wr.Flags&SendSolicited != 0 {
		flags |= abi.ChanFlagSolicited
	}
	slot[abi.OffSlotOpcode], slot[abi.OffSlotFlags], slot[abi.OffSlotStatus] = uint8(wr.Opcode), flags, 0
	binary.LittleEndian.PutUint32(slot[abi.OffSlotLength:], uint32(total))
	binary.LittleEndian.PutUint32(slot[abi.OffSlotImm:], wr.Imm)
	if signaled && abi.Word(cq.ring.Bytes(), abi.OffCQArmed).Load() == abi.ArmAll {
		// The send CQ armed before this send (ReqNotify): its verdict
		// is to raise the event. Stored before the slot is published: a
		// receiver that takes it at once finds the word set (§4.22).
		abi.StoreFenced(abi.Word(tx, abi.OffChanTxArmed), 1)
	}
	state.Store(abi.SlotPosted)
	ch.tail = abi.Next(ch.tail, ch.entries)
	ch.unreapedN.Add(1)
	abi.StoreFenced(abi.Word(tx, abi.OffChanTail), ch.tail) // seq_cst: before rx_armed's load
	if signaled {
		ch.sigOut++
	}
	if !ch.tab.timerOn.Load() {
		ch.tab.startTimer(time.Duration(ch.relay)) // the reader retracts it if no one takes it (sweep)
	}
	// The receiver's CQ armed: ask for its event (after the locks).
	armed := abi.Word(tx, abi.OffChanRxArmed)
	se := wr.Flags&SendSolicited != 0
	if a := armed.Load(); (a == abi.ArmAll || a == abi.ArmSolicited && se) && armed.CompareAndSwap(a, 0) {
		q.chanNotify = q.chanNotify | 1
		if se {
			q.chanNotify |= 2
		}
	}
	return true
}

// chanIdle reports, without a lock, whether q's channel holds no message
// its library has not reaped: then chanQuiet holds too, and a direct WR
// that adds no completion needs neither the send CQ's lock nor the
// channel's. The caller holds q.sqMu, so no message is added meanwhile.
//
// +checklocks:q.sqMu
func (q *QP) chanIdle() bool {
	ch := q.sch.Load()
	return ch == nil || ch.unreapedN.Load() == 0
}

// chanQuiet reports whether q has nothing in its channel that a direct
// WRITE, READ or atomic must not overtake: every message reaped (rule 2
// extended, §4.22). The caller holds q's SQ lock and the send CQ's.
//
// +checklocks:q.sqMu
// +checklocks:cq.mu
func (q *QP) chanQuiet(cq *CQ) bool {
	if q.chanIdle() {
		return true
	}
	ch := q.sch.Load()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.reapLocked(cq)
	return ch.unreaped() == 0
}

// reapLocked moves the sender's finished messages, in order, into the
// send CQ's local queue: a done one as its completion (if signaled or
// failed), a retracted one without (the relay's is its completion). It
// stops at the first message not finished, and notes a retraction due:
// that message refused, posted longer than relay_ns, or the channel gone.
// The channel's completions are not behind any ring CQE of the QP (rule
// 2), so the ring's are left where they are.
//
// +checklocks:cq.mu
// +checklocks:ch.mu
func (ch *sendChan) reapLocked(cq *CQ) {
	if ch.reap == ch.tail {
		return
	}
	in := !ch.gone && ch.enter()
	if !in && !ch.gone {
		return // revoking: the reader records the states, and the next poll settles them
	}
	for ch.reap != ch.tail {
		r := ch.rec(ch.reap)
		var st uint32
		var status uint8
		var slot []byte
		if in {
			slot = ch.slotOf(ch.tx, ch.reap)
			st, status = abi.Word(slot, abi.OffSlotState).Load(), slot[abi.OffSlotStatus]
		} else {
			st, status = r.state, r.status
		}
		switch st {
		case abi.SlotDone:
			if status != 0 || r.signaled {
				cq.pushLocal(WorkCompletion{WRID: r.id, Status: WCStatus(status), Opcode: WCSend, ByteLen: r.length, QPNum: ch.q.qpn})
			}
			if status != 0 {
				ch.broken, ch.toErr = true, true
			}
		case abi.SlotRetracted:
		default:
			// Posted, taken or refused: wait, or retract (refused, too
			// long, or gone: the receiver will never take it).
			if ch.gone || st == abi.SlotRefused {
				ch.needRelay = true
			} else if st == abi.SlotPosted {
				if ch.waits++; ch.waits%32 == 0 && mono()-r.posted > ch.relay {
					ch.needRelay = true
				}
			}
			if in {
				ch.leave()
			}
			return
		}
		if r.signaled {
			ch.sigOut--
		}
		r.data = nil
		if in {
			abi.Word(slot, abi.OffSlotState).Store(abi.SlotFree)
		}
		ch.reap = abi.Next(ch.reap, ch.entries)
		ch.unreapedN.Add(^uint32(0))
	}
	if in {
		ch.leave()
	}
}

// relayLocked retracts the messages q's library still has posted or
// refused in the channel (from the newest back to the first one the
// receiver took), or all it has not settled once the channel is gone, and
// writes them into the SQ ring from tail on, in posting order, before
// anything posted after them (§4.22 "Retraction"). It returns the new
// tail, how many it wrote and how many of them are signaled; ok false if
// the ring lacks room for them (nothing is retracted then). The caller
// holds q.sqMu and publishes the tail.
//
// +checklocks:q.sqMu
func (q *QP) relayLocked(ch *sendChan, tail uint32) (newTail uint32, n int, ok bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.reap == ch.tail {
		return tail, 0, true
	}
	in := !ch.gone && ch.enter()
	if !in && !ch.gone {
		return tail, 0, true // revoking: settled once the reader recorded the states
	}
	// From the newest back: the ones to relay are a suffix. Count them,
	// then check the ring's room (rule 5 makes it enough), then take
	// them back (fewer if the receiver takes one meanwhile).
	var want uint32
	for i := ch.tail; i != ch.reap; i = chanPrev(ch.entries, i) {
		if s := ch.txState(in, chanPrev(ch.entries, i)); s != abi.SlotPosted && s != abi.SlotRefused && (in || s != abi.SlotTaken) {
			break
		}
		want++
	}
	mem := q.ring.Bytes()
	size, stride := q.layout.SQEntries, q.layout.SQStride
	if ch.gone && QPState(abi.Word(mem, abi.OffQPState).Load()) == QPSReset {
		want = 0 // RESET discards them (dropChanAtReset)
	}
	if pending, valid := abi.Pending(tail, abi.Word(mem, abi.OffSQHead).Load(), size); !valid || pending+want > size {
		if in {
			ch.leave()
		}
		return tail, 0, false
	}
	from := ch.tail
	for k := uint32(0); k < want; k++ {
		i := chanPrev(ch.entries, from)
		if !in {
			ch.rec(i).state = abi.SlotRetracted
		} else if !retract(abi.Word(ch.slotOf(ch.tx, i), abi.OffSlotState)) {
			break
		}
		from = i
	}
	for i := from; i != ch.tail; i = abi.Next(i, ch.entries) {
		r := ch.rec(i)
		data := r.data
		if in && r.flags&SendInline != 0 {
			data = ch.slotOf(ch.tx, i)[abi.ChanSlotHeader:][:r.length]
		}
		q.encodeRec(mem[q.layout.SQOffset+abi.Slot(tail, size)*stride:][:stride], r, data)
		tail = abi.Next(tail, size)
		n++
		if r.signaled {
			q.relayedSignaled++
		}
	}
	if in {
		ch.leave()
	}
	ch.needRelay = false
	return tail, n, true
}

// chanPrev is the index before i in a ring of entries slots.
func chanPrev(entries, i uint32) uint32 { return (i - 1) & (2*entries - 1) }

// txState is the state of the sender's message i: the slot's while the
// caller holds an in-use hold (in), else the one the reader recorded.
//
// +checklocks:ch.mu
func (ch *sendChan) txState(in bool, i uint32) uint32 {
	if in {
		return abi.Word(ch.slotOf(ch.tx, i), abi.OffSlotState).Load()
	}
	return ch.rec(i).state
}

// retract takes a posted or refused message back (1 → 4, 5 → 4) and
// reports whether it did; false: the receiver took it.
func retract(state interface {
	Load() uint32
	CompareAndSwap(old, new uint32) bool
}) bool {
	for {
		switch s := state.Load(); s {
		case abi.SlotPosted, abi.SlotRefused:
			if state.CompareAndSwap(s, abi.SlotRetracted) {
				return true
			}
		default: // taken or done: the receiver has it; retracted: relayed already
			return false
		}
	}
}

// encodeRec writes the send WQE of record r into SQ slot (an INLINE one
// with data, its bytes).
func (q *QP) encodeRec(slot []byte, r *txRec, data []byte) {
	w := abi.SendWQE{WRID: r.id, Opcode: r.op, Flags: r.flags, Imm: r.imm}
	if r.flags&SendInline != 0 {
		n := copy(slot[abi.SendHdr:], data)
		w.InlineLen = uint32(n)
		abi.EncodeSend(slot, &w, slot[abi.SendHdr:abi.SendHdr+n])
		return
	}
	w.NumSGE = r.nsge
	copy(w.SGE[:], r.sge[:r.nsge])
	abi.EncodeSend(slot, &w, nil)
}

// relayNow relays what q's channel has due (a retraction a poll found due,
// or the settling of a channel gone), unless a post holds the send lock:
// that post relays it. It publishes the SQ tail and rings the doorbell.
//
// +checklocksignore: TryLock
func (q *QP) relayNow(ch *sendChan) {
	if !q.sqMu.TryLock() {
		return
	}
	mem := q.ring.Bytes()
	tail, n, _ := q.relayLocked(ch, q.sqTail)
	if n > 0 {
		q.sqTail = tail
		abi.StoreFenced(abi.Word(mem, abi.OffSQTail), tail)
	}
	q.sqMu.Unlock()
	if n > 0 && abi.Word(mem, abi.OffSQDoorbell).Load() != 0 {
		q.db.Ring()
	}
}

// takeLocked takes the peer's messages from ch's rx ring with receives of
// q's RQ, into the receive CQ's local queue (§4.22 "Receiver"), while the
// CQ has room; a message it cannot take for certain it refuses. It
// reports whether it added a completion that the CQ's armed state asks an
// event for.
//
// +checklocks:cq.mu
// +checklocks:ch.mu
func (ch *sendChan) takeLocked(cq *CQ) (event bool) {
	q := ch.q
	qmem := q.ring.Bytes()
	if ch.gone || !QPState(abi.Word(qmem, abi.OffQPState).Load()).HoldsChannel() {
		return false
	}
	rx := ch.rx
	if abi.Word(rx, abi.OffChanTail).Load() == ch.rxHead {
		return false // nothing came: a read of a header word needs no in-use hold (§4.22)
	}
	if !ch.enter() {
		return false
	}
	defer ch.leave()
	v := q.vm
	gm := v.mem.Bytes()
	size := cq.layout.Entries
	for {
		tail := abi.Word(rx, abi.OffChanTail).Load()
		if n, ok := abi.Pending(tail, ch.rxHead, ch.entries); !ok || n == 0 {
			return event
		}
		ring := cq.ring.Bytes()
		pending, _ := abi.Pending(abi.Word(ring, abi.OffCQTail).Load(), cq.head, size)
		if uint64(cq.localLen())+uint64(pending) >= uint64(size) {
			return event // the CQ is full: the sender relays it after relay_ns
		}
		slot := ch.slotOf(rx, ch.rxHead)
		state := abi.Word(slot, abi.OffSlotState)
		switch state.Load() {
		case abi.SlotRetracted, abi.SlotFree: // retracted, and maybe reaped by its sender already
			ch.rxHead = abi.Next(ch.rxHead, ch.entries)
			abi.Word(rx, abi.OffChanHead).Store(ch.rxHead)
			ch.skipped++
			continue
		case abi.SlotPosted:
		default:
			return event
		}
		op, flags := Opcode(slot[abi.OffSlotOpcode]), slot[abi.OffSlotFlags]
		length, imm := binary.LittleEndian.Uint32(slot[abi.OffSlotLength:]), binary.LittleEndian.Uint32(slot[abi.OffSlotImm:])
		rqIdx := abi.Word(qmem, abi.OffRQHead).Load()
		w, ok := q.recvFor(length, rqIdx)
		if !ok || op != OpSend && op != OpSendWithImm || length > ch.stride-abi.ChanSlotHeader {
			if state.CompareAndSwap(abi.SlotPosted, abi.SlotRefused) {
				ch.tellSender(rx, true)
				return event
			}
			continue // retracted meanwhile
		}
		if !state.CompareAndSwap(abi.SlotPosted, abi.SlotTaken) {
			continue
		}
		data := slot[abi.ChanSlotHeader : abi.ChanSlotHeader+int(length)]
		for _, s := range w.SGE[:w.NumSGE] {
			if len(data) == 0 {
				break
			}
			data = data[copy(gm[s.Addr:s.Addr+uint64(s.Length)], data):]
		}
		wc := WorkCompletion{WRID: w.WRID, Status: WCSuccess, Opcode: WCRecv, ByteLen: length, QPNum: q.qpn, SrcQP: ch.peerQPN}
		if op == OpSendWithImm {
			wc.Flags, wc.Imm = WCWithImm, imm
		}
		cq.drainLocked() // the ring's completions are older (§4.22): a relayed SEND before this one
		cq.pushLocal(wc)
		abi.Word(qmem, abi.OffRQHead).Store(abi.Next(rqIdx, q.layout.RQEntries))
		slot[abi.OffSlotStatus] = 0
		state.Store(abi.SlotDone)
		ch.rxHead = abi.Next(ch.rxHead, ch.entries)
		abi.Word(rx, abi.OffChanHead).Store(ch.rxHead)
		if flags&abi.ChanFlagSignaled != 0 {
			ch.tellSender(rx, false)
		}
		armed := abi.Word(ring, abi.OffCQArmed)
		if a := armed.Load(); (a == abi.ArmAll || a == abi.ArmSolicited && flags&abi.ChanFlagSolicited != 0) && armed.CompareAndSwap(a, 0) {
			event = true
		}
	}
}

// tellSender notes, after a verdict the sender may sleep for, that the
// peer's send CQ is to be notified, if the sender armed it (tx_armed in
// the ring it produces into, rx).
//
// +checklocks:ch.mu
func (ch *sendChan) tellSender(rx []byte, refused bool) {
	armed := abi.Word(rx, abi.OffChanTxArmed) // the store before it was seq_cst: the fence
	if armed.Load() == 1 && armed.CompareAndSwap(1, 0) {
		ch.notifyTx = true
		ch.notifyTxSE = ch.notifyTxSE || refused
	}
}

// recvFor returns the receive WQE at RQ index idx of q if it can take a
// message of length bytes for certain (§4.22 step 2): one is posted, it
// decodes, and its SGEs are regions of q's PD with local write that hold
// length bytes.
func (q *QP) recvFor(length, idx uint32) (abi.RecvWQE, bool) {
	var w abi.RecvWQE
	mem := q.ring.Bytes()
	size := q.layout.RQEntries
	if n, ok := abi.Pending(abi.Word(mem, abi.OffRQTail).Load(), idx, size); !ok || n == 0 {
		return w, false
	}
	off := q.layout.RQOffset + abi.Slot(idx, size)*q.layout.RQStride
	if abi.DecodeRecv(mem[off:off+q.layout.RQStride], &w, q.caps.MaxRecvSGE) != abi.WCSuccess {
		return w, false
	}
	var room uint64
	for _, s := range w.SGE[:w.NumSGE] {
		if s.Length == 0 {
			continue
		}
		lm := q.vm.lookupLocal(s.LKey)
		if lm == nil || lm.pd != q.pd || lm.access&abi.AccessLocalWrite == 0 || s.Addr < lm.addr || !sys.InBounds(s.Addr-lm.addr, uint64(s.Length), lm.length) {
			return w, false
		}
		room += uint64(s.Length)
	}
	return w, room >= uint64(length)
}

// chanPollLocked serves the CQ's channels at a poll, before the CQ's
// queues are read: it reaps the senders' finished messages and takes the
// peers' messages, and reports whether a channel has work for after the
// lock (chanAfter).
//
// +checklocks:cq.mu
func (cq *CQ) chanPollLocked() (after bool) {
	for _, ch := range cq.chans {
		ch.mu.Lock()
		if ch.q.sendCQ == cq {
			ch.reapLocked(cq)
		}
		if ch.q.recvCQ == cq && ch.takeLocked(cq) {
			cq.ev.Wake() // our own waiters: the CQ was armed for this completion
		}
		after = after || ch.needRelay || ch.notifyTx || ch.toErr || ch.gone && ch.unreaped() == 0
		ch.mu.Unlock()
	}
	return after
}

// chanAfter does, without the CQ's lock, what chanPollLocked found to do:
// direct-notify the peers whose senders wait, relay what is due, move a
// QP with a failed channel send to ERR, forget a channel gone and
// settled.
func (cq *CQ) chanAfter() {
	var work [8]*sendChan
	n := 0
	cq.mu.Lock()
	for _, ch := range cq.chans {
		if n < len(work) {
			work[n] = ch
			n++
		}
	}
	cq.mu.Unlock()
	for _, ch := range work[:n] {
		ch.mu.Lock()
		notify, se, relay, toErr, drop := ch.notifyTx, ch.notifyTxSE, ch.needRelay, ch.toErr, ch.gone && ch.unreaped() == 0
		ch.notifyTx, ch.notifyTxSE, ch.toErr = false, false, false
		ch.mu.Unlock()
		q := ch.q
		if notify {
			q.vm.c.call(context.Background(), abi.OpDirectNotify, &abi.DirectNotify{QP: q.handle, CQ: abi.NotifySend, Solicited: se}, nil)
		}
		if relay {
			q.relayNow(ch)
		}
		if toErr {
			q.Modify(context.Background(), &QPAttr{State: QPSErr}, MaskState)
		}
		if drop {
			q.dropChan(ch)
		}
	}
}

// armChans stores, as the CQ is armed (how), the channel words that make
// a peer ask for its event: rx_armed in the rx rings it takes from, and
// tx_armed in the tx rings with messages not reaped. It reports whether a
// message came before the arming could be seen (the caller raises the
// event itself).
//
// +checklocks:cq.mu
func (cq *CQ) armChans(how uint32) (came bool) {
	for _, ch := range cq.chans {
		ch.mu.Lock()
		if ch.enter() {
			if ch.q.recvCQ == cq {
				abi.StoreFenced(abi.Word(ch.rx, abi.OffChanRxArmed), how)
				came = came || ch.waiting(how)
			}
			if ch.q.sendCQ == cq && ch.reap != ch.tail {
				abi.StoreFenced(abi.Word(ch.tx, abi.OffChanTxArmed), 1)
				if s := abi.Word(ch.slotOf(ch.tx, ch.reap), abi.OffSlotState).Load(); s != abi.SlotPosted && s != abi.SlotTaken {
					came = true
				}
			}
			ch.leave()
		} else if ch.gone && ch.reap != ch.tail {
			came = true // to settle
		}
		ch.mu.Unlock()
	}
	return came
}

// waiting reports whether the rx ring holds a message a CQ armed with how
// wakes for: one posted (a solicited one for ArmSolicited), or a
// retracted one to skip. The caller holds an in-use hold.
//
// +checklocks:ch.mu
func (ch *sendChan) waiting(how uint32) bool {
	tail := abi.Word(ch.rx, abi.OffChanTail).Load()
	n, ok := abi.Pending(tail, ch.rxHead, ch.entries)
	if !ok {
		return false
	}
	for i, k := ch.rxHead, uint32(0); k < n; i, k = abi.Next(i, ch.entries), k+1 {
		s := ch.slotOf(ch.rx, i)
		switch abi.Word(s, abi.OffSlotState).Load() {
		case abi.SlotPosted:
			if how != abi.ArmSolicited || s[abi.OffSlotFlags]&abi.ChanFlagSolicited != 0 {
				return true
			}
		case abi.SlotRetracted:
			if how != abi.ArmSolicited {
				return true
			}
		default:
			return false
		}
	}
	return false
}

// waitBound is how long a waiter on the CQ may sleep before it must look
// at its channels again: the shortest relay_ns of a channel with a
// message posted, 0 for none (sleep until woken).
func (cq *CQ) waitBound() time.Duration {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	var d time.Duration
	for _, ch := range cq.chans {
		ch.mu.Lock()
		if ch.q.sendCQ == cq && ch.reap != ch.tail && (d == 0 || time.Duration(ch.relay) < d) {
			d = time.Duration(ch.relay)
		}
		ch.mu.Unlock()
	}
	return d
}

// raise raises the CQ's armed event from this process: the armed word to
// 0 and its waiters woken.
func (cq *CQ) raise() {
	cq.mu.Lock()
	armed := abi.Word(cq.ring.Bytes(), abi.OffCQArmed)
	a := armed.Load()
	won := a != 0 && armed.CompareAndSwap(a, 0)
	cq.mu.Unlock()
	if won {
		cq.ev.Wake()
	}
}

// relayWaitMax bounds relayWait.
const relayWaitMax = 100 * time.Millisecond

// relayWait is ReqNotify's first step on a CQ that serves send channels
// (§4.22 "Events"): it serves them as a poll does and, when it skipped
// messages their senders retracted, waits (at most relayWaitMax) until the
// agent completed them in the ring. Such a message may have raised the
// CQ's event already (its sender's direct-notify, when it was posted);
// its completion comes from the relay, later. Completed after a new
// arming, it would raise a second event, and a program that polls once
// per event would find nothing behind one of the two. Completed before
// the arming, it raises none, as a device's CQE that is there when the
// CQ is armed raises none.
func (cq *CQ) relayWait() {
	type due struct{ qpn, n uint32 }
	var want [8]due
	nwant := 0
	cq.mu.Lock()
	if len(cq.chans) == 0 {
		cq.mu.Unlock()
		return
	}
	for _, ch := range cq.chans {
		ch.mu.Lock()
		ch.skipped = 0
		ch.mu.Unlock()
	}
	after := cq.chanPollLocked()
	for _, ch := range cq.chans {
		ch.mu.Lock()
		if ch.skipped > 0 && nwant < len(want) {
			want[nwant] = due{ch.q.qpn, ch.skipped}
			nwant++
		}
		ch.mu.Unlock()
	}
	cq.mu.Unlock()
	if after {
		cq.chanAfter()
	}
	for deadline := time.Now().Add(relayWaitMax); nwant > 0 && time.Now().Before(deadline); time.Sleep(20 * time.Microsecond) {
		waiting := false
		cq.mu.Lock()
		for _, w := range want[:nwant] {
			waiting = waiting || cq.recvPendingLocked(w.qpn) < w.n
		}
		cq.mu.Unlock()
		if !waiting {
			return
		}
	}
}

// recvPendingLocked counts the receive completions of QP qpn that the CQ
// holds unpolled, in its local queue and its ring.
//
// +checklocks:cq.mu
func (cq *CQ) recvPendingLocked(qpn uint32) uint32 {
	var n uint32
	for _, wc := range cq.local[cq.lhead:] {
		if wc.QPNum == qpn && wc.Opcode&WCRecv != 0 {
			n++
		}
	}
	mem, size := cq.ring.Bytes(), cq.layout.Entries
	tail := abi.Word(mem, abi.OffCQTail).Load()
	if _, ok := abi.Pending(tail, cq.head, size); !ok {
		return n
	}
	var e abi.CQE
	for i := cq.head; i != tail; i = abi.Next(i, size) {
		off := cq.layout.Offset + abi.Slot(i, size)*abi.CQESize
		abi.DecodeCQE(mem[off:off+abi.CQESize], &e)
		if e.QPNum == qpn && e.Opcode&WCRecv != 0 {
			n++
		}
	}
	return n
}

// serveChans serves the CQ's send channels as a poll does, for a waiter
// that does not poll (WaitEvent).
func (cq *CQ) serveChans() {
	cq.mu.Lock()
	after := len(cq.chans) != 0 && cq.chanPollLocked()
	cq.mu.Unlock()
	if after {
		cq.chanAfter()
	}
}

// dropChanAtReset forgets q's channel at a move to RESET, which discards
// the WRs posted before it without completions: the agent revoked the
// channel before it answered the modify, so its messages are recorded;
// none is relayed or completed.
func (q *QP) dropChanAtReset() {
	ch := q.sch.Load()
	if ch == nil {
		return
	}
	ch.mu.Lock()
	if ch.gone {
		for ch.reap != ch.tail {
			ch.rec(ch.reap).data = nil
			ch.reap = abi.Next(ch.reap, ch.entries)
			ch.unreapedN.Add(^uint32(0))
		}
		ch.sigOut, ch.needRelay = 0, false
	}
	ch.mu.Unlock()
	q.dropChan(ch)
}

// startTimer sets the revocation reader's read deadline d from now, if it
// is not set: a message posted into a channel is retracted by the reader
// if no one takes it in time, though the application calls nothing.
func (t *directTable) startTimer(d time.Duration) {
	if t.timerOn.CompareAndSwap(false, true) {
		t.conn.SetReadDeadline(time.Now().Add(d))
	}
}

// sweep runs on the revocation reader at its read deadline: it retracts
// and relays the messages that waited longer than relay_ns, or that the
// receiver refused, of every channel of the table whose send lock is
// free (a post that holds it does it), and sets the next deadline while
// messages are outstanding. It never waits for a lock held across a
// command.
func (t *directTable) sweep() {
	t.mu.Lock()
	t.sweepList = t.sweepList[:0]
	for _, ch := range t.chans {
		t.sweepList = append(t.sweepList, ch)
	}
	t.mu.Unlock()
	var next time.Duration
	for _, ch := range t.sweepList {
		ch.mu.Lock()
		due := ch.overdueLocked()
		if ch.reap != ch.tail && !ch.gone && (next == 0 || time.Duration(ch.relay) < next) {
			next = time.Duration(ch.relay)
		}
		ch.mu.Unlock()
		if due {
			ch.q.relayNow(ch)
		}
	}
	if next > 0 {
		t.conn.SetReadDeadline(time.Now().Add(next))
		return
	}
	t.timerOn.Store(false)
	t.conn.SetReadDeadline(time.Time{})
	for _, ch := range t.sweepList { // a post that saw the timer still on
		ch.mu.Lock()
		busy := ch.reap != ch.tail && !ch.gone
		ch.mu.Unlock()
		if busy {
			t.startTimer(time.Duration(ch.relay))
			break
		}
	}
}

// overdueLocked reports whether the first message of the sender's not
// finished is refused, or posted longer than relay_ns: a retraction is
// due.
//
// +checklocks:ch.mu
func (ch *sendChan) overdueLocked() bool {
	if ch.reap == ch.tail || !ch.enter() {
		return false
	}
	defer ch.leave()
	for i := ch.reap; i != ch.tail; i = abi.Next(i, ch.entries) {
		switch abi.Word(ch.slotOf(ch.tx, i), abi.OffSlotState).Load() {
		case abi.SlotDone, abi.SlotRetracted:
		case abi.SlotPosted:
			return mono()-ch.rec(i).posted > ch.relay
		case abi.SlotRefused:
			return true
		default:
			return false
		}
	}
	return false
}
