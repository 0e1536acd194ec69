// SPDX-License-Identifier: Apache-2.0

package device

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/sys"
)

// The send channel of the memcpy-direct path (docs/wire-local.md §4.22).
// For a connected RC QP pair bound to memcpy-direct whose sessions set
// direct-send, the device makes one file of two rings (Channel, on the
// first direct-channel of either side) and grants it into each side's
// grant table (a grant with ch set) as each side asks. The libraries pass
// small SENDs through it; the device only
//
//   - waits, before the memcpy path executes a relayed WQE of a channel
//     QP, until the QP's tx ring holds nothing posted, taken or refused
//     (drainChannel, on the QP's send-queue goroutine);
//   - resyncs a channel QP's private RQ head from the RQ-head word, which
//     the receiving library advances too (resyncRQLocked, under rqMu);
//   - raises CQ events a library asks for (NotifyPeer);
//   - revokes the channel's two grants together (finishChannel: both
//     in-use words 0, then both notices and acknowledgements), when either
//     QP leaves RTR/RTS or goes, or either session ends, then drops the
//     file; the ERR flush and the RESET drop of a channel QP's receive
//     queue wait for that (waitChannelGone).
//
// Locks: as direct.go's (q.mu before directMu). A channel's memMu guards
// the device's mapping against its unmapping: the drain reads the ring
// under it for reading, never across a sleep. Nothing waits under
// directMu or memMu.

// channel is the send channel of one connected QP pair.
type channel struct {
	d       *Device
	qps     [2]*QP   // side i's tx ring is at ring[i]
	ring    [2]int   // byte offsets of the two rings in the file
	entries uint32   // slots per ring
	stride  uint32   // bytes per slot
	size    uint64   // the file's bytes
	fd      sys.FD   // the file; closed when the channel is dropped
	owner   *Context // the session charged for it
	// grants[i] is side i's grant, once it asked; revoking is set when
	// both are marked. Guarded by d.directMu.
	grants   [2]*grant
	revoking bool
	done     chan struct{} // closed once revoked and dropped

	memMu sync.RWMutex
	mem   *sys.Mapping // +checklocks:memMu
}

// side returns q's side of ch, or -1.
func (ch *channel) side(q *QP) int {
	switch q {
	case ch.qps[0]:
		return 0
	case ch.qps[1]:
		return 1
	}
	return -1
}

// SetDirectSendCapable records whether v's session set capability
// direct-send in its hello: a channel is granted only to such sessions.
func (v *Context) SetDirectSendCapable(ok bool) { v.directSendCapable.Store(ok) }

// DirectSendCapable reports what SetDirectSendCapable recorded.
func (v *Context) DirectSendCapable() bool { return v.directSendCapable.Load() }

// channelRing is the bytes a ring of the agent's geometry takes in the
// file: a whole number of pages.
func channelRing(entries uint32) uint64 {
	page := uint64(sys.PageSize)
	return (abi.ChanRingBytes(entries, abi.ChanStride) + page - 1) &^ (page - 1)
}

// channelEntries is the agent's ring size for a pair whose send queues
// hold a and b WQEs: the larger, a power of two, 16..256.
func channelEntries(a, b uint32) uint32 {
	n := uint32(abi.ChanMinEntries)
	for n < max(a, b) && n < abi.ChanAgentMaxEntries {
		n <<= 1
	}
	return n
}

// Channel grants v's QP handle qh the send channel of its connection
// (direct-channel), making the channel on the first ask of either side:
// the reply and one descriptor, a duplicate of the channel file, which the
// caller sends and closes.
func (v *Context) Channel(qh uint32) (abi.DirectChannel, []int, error) {
	d := v.d
	if !v.DirectCapable() || !v.DirectSendCapable() {
		return abi.DirectChannel{}, nil, abi.Errorf(abi.CodeState, "", "direct-channel: this session's hello did not set capabilities memcpy-direct and direct-send")
	}
	q, err := v.QPByHandle(qh)
	if err != nil {
		return abi.DirectChannel{}, nil, err
	}
	gi := q.directGen.Load()
	q.mu.Lock()
	path, rqpn, rgid := q.pathInfo.Path, q.remoteQPN, q.remoteGID
	q.mu.Unlock()
	if s := q.State(); q.typ != abi.QPTypeRC || q.srq != nil || path != abi.PathMemcpyDirect || !s.HoldsChannel() {
		return abi.DirectChannel{}, nil, abi.Errorf(abi.CodeState, "qp", "direct-channel: QP 0x%x is not an RC QP without an SRQ, bound to memcpy-direct, in RTR or RTS (%s, %s, path %q)", q.qpn, q.typ, s, path)
	}
	d.mu.Lock()
	t := d.qps[rqpn]
	d.mu.Unlock()
	if t == nil || t.vm == v || t.ad.gid != rgid {
		return abi.DirectChannel{}, nil, abi.Errorf(abi.CodeState, "qp", "direct-channel: QP 0x%x has no peer QP 0x%x of another session on this host", q.qpn, rqpn)
	}
	gt := t.directGen.Load()
	t.mu.Lock()
	tPath, tRemote := t.pathInfo.Path, t.remoteQPN
	t.mu.Unlock()
	if s := t.State(); !s.HoldsChannel() || tRemote != q.qpn {
		return abi.DirectChannel{}, nil, abi.Errorf(abi.CodeUnavailable, "qp", "direct-channel: peer QP 0x%x is in %s, or not connected to QP 0x%x yet: ask again later", t.qpn, s, q.qpn)
	}
	if t.typ != abi.QPTypeRC || t.srq != nil || tPath != abi.PathMemcpyDirect || !t.vm.DirectCapable() || !t.vm.DirectSendCapable() {
		return abi.DirectChannel{}, nil, abi.Errorf(abi.CodeState, "qp", "direct-channel: peer QP 0x%x is not an RC QP without an SRQ bound to memcpy-direct, or the workload of VM %q (pid %d) did not set capability direct-send in its hello", t.qpn, t.vm.name, t.vm.PID())
	}

	d.directMu.Lock()
	r, fds, offer, err := d.grantChannelLocked(v, q, t, gi, gt)
	d.directMu.Unlock()
	if offer {
		t.offerChannel()
	}
	return r, fds, err
}

// grantChannelLocked is Channel's part under directMu: the checks that
// need it, the channel (made if new) and q's grant of it. offer reports
// that t has no grant of it yet: its library may have asked too early.
//
// +checklocks:d.directMu
func (d *Device) grantChannelLocked(v *Context, q, t *QP, gi, gt uint64) (_ abi.DirectChannel, _ []int, offer bool, err error) {
	tab := v.direct
	switch {
	case tab == nil:
		return abi.DirectChannel{}, nil, false, abi.Errorf(abi.CodeState, "", "direct-channel: open the session's grant table first (direct-open)")
	case q.directGen.Load() != gi || t.directGen.Load() != gt || !q.State().HoldsChannel():
		return abi.DirectChannel{}, nil, false, abi.Errorf(abi.CodeUnavailable, "qp", "direct-channel: QP 0x%x or its peer changed while asked: ask again", q.qpn)
	case t.vm.dying.Load() || v.dying.Load():
		return abi.DirectChannel{}, nil, false, abi.Errorf(abi.CodeState, "qp", "direct-channel: a VM of the pair is detaching")
	case !q.ad.Connected() || !t.ad.Connected():
		return abi.DirectChannel{}, nil, false, abi.Errorf(abi.CodeUnavailable, "qp", "direct-channel: an adapter of the pair is disconnected (its port is down): ask again once it is up")
	case q.ch != nil && (q.ch.revoking || q.ch.side(t) < 0), t.ch != nil && (t.ch.revoking || t.ch != q.ch):
		return abi.DirectChannel{}, nil, false, abi.Errorf(abi.CodeUnavailable, "qp", "direct-channel: the last channel of QP 0x%x or its peer is being revoked: ask again", q.qpn)
	}
	ch := q.ch
	if ch == nil {
		if ch, err = d.newChannelLocked(v, q, t); err != nil {
			return abi.DirectChannel{}, nil, false, err
		}
	}
	side := ch.side(q)
	g := ch.grants[side]
	if g == nil {
		slot := d.freeSlotLocked(tab)
		if slot < 0 {
			if ch.grants[1-side] == nil {
				d.dropChannelLocked(ch)
			}
			return abi.DirectChannel{}, nil, false, abi.Errorf(abi.CodeLimit, "", "direct-channel: the session holds %d grants, the most a grant table has", abi.GrantSlots)
		}
		g = d.grantLocked(tab, uint32(slot), q, t, t.vm)
		g.ch = ch
		ch.grants[side] = g
	}
	dup, err := unix.FcntlInt(uintptr(ch.fd.Int()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return abi.DirectChannel{}, nil, false, abi.Errorf(abi.CodeInternal, "", "direct-channel: dup the channel file: %v", err)
	}
	return abi.DirectChannel{Slot: g.slot, State: g.word, Size: ch.size, TxOffset: uint64(ch.ring[side]), RxOffset: uint64(ch.ring[1-side]),
		Entries: ch.entries, Stride: abi.ChanStride, PeerQPN: t.qpn, RelayNS: abi.ChanRelayNS}, []int{dup}, ch.grants[1-side] == nil, nil
}

// offerChannel bumps q's channel-offer word (§4.22 "When a library
// asks"): its peer got the pair's channel, and q's library, which may have
// asked before its peer could be granted, asks again at its next post.
func (q *QP) offerChannel() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.destroyed.Load() { // destroyQP unmaps the rings under q.mu once destroyed is set
		abi.Word(q.ring.Bytes(), abi.OffChanOffer).Add(1)
	}
}

// newChannelLocked makes the channel file of v's QP q and its peer t,
// charged to v.
//
// +checklocks:d.directMu
func (d *Device) newChannelLocked(v *Context, q, t *QP) (*channel, error) {
	entries := channelEntries(q.layout.SQEntries, t.layout.SQEntries)
	ring := channelRing(entries)
	size := 2 * ring
	if err := v.chargeUser(quota.RingMemory, size); err != nil {
		return nil, err
	}
	fd, err := sys.Memfd(fmt.Sprintf("vrdma-chan-%x-%x", q.qpn, t.qpn), int64(size))
	if err != nil {
		v.refundUser(quota.RingMemory, size)
		return nil, abi.Errorf(abi.CodeInternal, "", "direct-channel: %v", err)
	}
	m, err := sys.Map(fd.Int(), int(size), false)
	if err != nil {
		fd.Close()
		v.refundUser(quota.RingMemory, size)
		return nil, abi.Errorf(abi.CodeInternal, "", "direct-channel: %v", err)
	}
	ch := &channel{d: d, qps: [2]*QP{q, t}, ring: [2]int{0, int(ring)}, entries: entries, stride: abi.ChanStride, size: size, fd: fd, owner: v,
		done: make(chan struct{}), mem: m}
	q.ch, t.ch = ch, ch
	q.chanP.Store(ch)
	t.chanP.Store(ch)
	q.chanRQ.Store(true) // not under rqMu: rqMu is taken before directMu (a bad RQ moves its QP to ERR)
	t.chanRQ.Store(true)
	return ch, nil
}

// dropChannelLocked forgets ch and frees what it holds, once no grant of
// it is left (revoked, or never made).
//
// +checklocks:d.directMu
func (d *Device) dropChannelLocked(ch *channel) {
	for _, p := range ch.qps {
		if p.ch == ch {
			p.ch = nil
		}
		p.chanP.CompareAndSwap(ch, nil)
	}
	ch.memMu.Lock()
	if ch.mem != nil {
		ch.mem.Unmap()
		ch.mem = nil
	}
	ch.memMu.Unlock()
	ch.fd.Close()
	ch.owner.refundUser(quota.RingMemory, ch.size)
	close(ch.done)
}

// finishChannel revokes both grants of ch, which markLocked marked: it
// waits until both in-use words read 0, then sends the notice to both
// libraries and waits for both acknowledgements — a side whose session
// ends gets neither — fencing a library that has not done its part within
// RevokeWait; then it frees both slots and drops the channel.
func (d *Device) finishChannel(ch *channel) {
	d.directMu.Lock()
	gs := ch.grants
	d.directMu.Unlock()
	deadline := time.Now().Add(RevokeWait)
	var ok [2]bool
	for i, g := range gs {
		if g != nil {
			ok[i] = g.tab.v.dying.Load() || g.tab.waitInUse(g.slot, deadline)
		}
	}
	var fenced [2]bool
	for i, g := range gs {
		if g != nil && !ok[i] && !g.tab.isClosed() {
			fenced[i] = true
			d.fence(g.tab.v, fmt.Sprintf("its library held the send channel of QP 0x%x (slot %d) for more than %v after its revocation", g.init.qpn, g.slot, RevokeWait))
		}
	}
	var wg sync.WaitGroup
	for i, g := range gs {
		if g == nil || fenced[i] || g.tab.v.dying.Load() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !g.tab.tell(g, deadline) && !g.tab.isClosed() {
				fenced[i] = true
				d.fence(g.tab.v, fmt.Sprintf("its library did not give up the send channel of QP 0x%x (slot %d) within %v of its revocation", g.init.qpn, g.slot, RevokeWait))
			}
		}()
	}
	wg.Wait()
	d.directMu.Lock()
	for i, g := range gs {
		if g == nil {
			continue
		}
		delete(d.grants, g)
		t := g.tab
		if t.slots[g.slot] == g {
			t.slots[g.slot] = nil
			if !t.isClosed() && !fenced[i] {
				abi.StoreFenced(t.stateWord(g.slot), abi.GrantFree)
			}
		}
	}
	d.dropChannelLocked(ch)
	d.directMu.Unlock()
	for _, g := range gs {
		if g != nil {
			close(g.done)
			g.tab.users.Done()
		}
	}
}

// drainChannel waits, on q's send-queue goroutine before the memcpy path
// executes a relayed WQE, until q's tx ring of ch holds no slot posted,
// taken or refused: every message q's library put into the channel
// before the WQE was taken, so the WQE lands after them (RC order). It
// reports false, the WQE not to be executed now, when q stops, leaves RTS
// or is reset meanwhile.
func (q *QP) drainChannel(ch *channel) bool {
	side := ch.side(q)
	if side < 0 {
		return true
	}
	var wait time.Duration
	for spins := 0; ; spins++ {
		if !ch.busy(side) {
			return true
		}
		if q.stop.Load() || q.State() != abi.QPSRTS || q.resets.Load() != q.sqResets {
			return false
		}
		if spins < 64 {
			YieldCPU()
			continue
		}
		q.PublishHead()
		wait = min(max(wait*2, 20*time.Microsecond), 2*time.Millisecond)
		if !q.Sleep(wait) {
			return false
		}
	}
}

// busy reports whether side's tx ring holds a slot posted, taken or
// refused: between the receiver's head and the sender's tail when both
// are valid indices, else anywhere (the words are the libraries' to
// write). A dropped channel is never busy.
func (ch *channel) busy(side int) bool {
	ch.memMu.RLock()
	defer ch.memMu.RUnlock()
	if ch.mem == nil {
		return false
	}
	ring := ch.mem.Bytes()[ch.ring[side]:]
	tail := abi.Word(ring, abi.OffChanTail).Load()
	head := abi.Word(ring, abi.OffChanHead).Load()
	n, ok := abi.Pending(tail, head, ch.entries)
	if !ok {
		head, n = 0, ch.entries
	}
	for i := uint32(0); i < n; i++ {
		off := abi.ChanHeaderSize + int(abi.Slot(head+i, ch.entries))*int(ch.stride)
		switch abi.Word(ring, off+abi.OffSlotState).Load() {
		case abi.SlotPosted, abi.SlotTaken, abi.SlotRefused:
			return true
		}
	}
	return false
}

// waitChannelGone waits, on q's goroutine before it flushes or drops q's
// receive queue, until the revocation of q's channel finished: no library
// consumes q's receives any more. It returns at once when q has none, and
// early when q stops.
func (q *QP) waitChannelGone() {
	ch := q.chanP.Load()
	if ch == nil {
		return
	}
	for !q.stop.Load() {
		select {
		case <-ch.done:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// resyncRQLocked takes, for a QP whose receiving library consumes
// receives too (chanRQ), the RQ-head word as the private head: it must be
// a valid index at most the ring's size behind the RQ tail (the library
// may have consumed any number since the agent last did, so the private
// head bounds nothing). Otherwise the QP moves to ERR as for an invalid
// tail, and false.
//
// +checklocks:q.rqMu
func (q *QP) resyncRQLocked() bool {
	if !q.chanRQ.Load() || q.sharedRQ() {
		return true
	}
	mem := q.ring.Bytes()
	size := q.layout.RQEntries
	w := abi.Word(mem, abi.OffRQHead).Load()
	if w == q.rqHead {
		return true
	}
	tail := abi.Word(mem, abi.OffRQTail).Load()
	if _, ok := abi.Pending(tail, w, size); !ok {
		q.rqBroken = true
		q.vm.d.log.Warn("receive queue head word is not a valid index at most the ring's size behind the tail: the library wrote garbage; QP moved to ERR",
			"vm", q.vm.name, "qpn", q.qpn, "word", w, "head", q.rqHead, "tail", tail)
		q.MoveToErr(fmt.Sprintf("receive queue head word %d is not within %d entries behind tail %d", w, size, tail))
		return false
	}
	q.rqHead = w
	q.rqSeq++
	return true
}

// NotifyPeer raises the event of the send or receive CQ (which: abi.NotifySend,
// abi.NotifyRecv) of the peer of v's QP handle qh, through their channel,
// as if a completion had been published there (direct-notify): armed for
// every completion, or for solicited ones when solicited.
func (v *Context) NotifyPeer(qh uint32, which string, solicited bool) error {
	q, err := v.QPByHandle(qh)
	if err != nil {
		return err
	}
	if which != abi.NotifySend && which != abi.NotifyRecv {
		return abi.Errorf(abi.CodeInvalid, "cq", "direct-notify: cq %q is neither %q nor %q", which, abi.NotifySend, abi.NotifyRecv)
	}
	d := v.d
	d.directMu.Lock()
	ch := q.ch
	var p *QP
	if ch != nil && !ch.revoking {
		p = ch.qps[1-ch.side(q)]
	}
	d.directMu.Unlock()
	if p == nil {
		return abi.Errorf(abi.CodeState, "qp", "direct-notify: QP 0x%x has no send channel", q.qpn)
	}
	c := p.recvCQ
	if which == abi.NotifySend {
		c = p.sendCQ
	}
	if c != nil {
		c.raise(solicited)
	}
	return nil
}

// raise signals the CQ's armed consumer as publishLocked does for a
// completion: armed for every completion, or for solicited ones when
// solicited.
func (c *CQ) raise(solicited bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return
	}
	armed := abi.Word(c.ring.Bytes(), abi.OffCQArmed)
	switch armed.Load() {
	case abi.ArmAll:
		if armed.CompareAndSwap(abi.ArmAll, 0) {
			c.event.Ring()
		}
	case abi.ArmSolicited:
		if solicited && armed.CompareAndSwap(abi.ArmSolicited, 0) {
			c.event.Ring()
		}
	}
}

// ChannelCount returns how many send channels the device holds (tests).
func (d *Device) ChannelCount() int {
	d.directMu.Lock()
	defer d.directMu.Unlock()
	n := 0
	for g := range d.grants {
		if g.ch != nil && g.ch.grants[0] == g || g.ch != nil && g.ch.grants[0] == nil {
			n++
		}
	}
	return n
}
