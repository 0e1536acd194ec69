// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/bulkcopy"
	"github.com/vrdma/vrdma/internal/libdiag"
	"github.com/vrdma/vrdma/internal/sys"
)

// The memcpy-direct path (docs/wire-local.md §4.21). A QP bound to it
// executes RDMA WRITE, READ, the atomics and ATOMIC_WRITE itself when it
// can prove them valid (directPost), on a mapping of the target region's
// pages that the agent grants (direct-map), and posts everything else to
// its ring as any QP: the relayed memcpy path underneath gives every other
// WR, and every WR it cannot prove valid, its right completion.
//
// Goroutines: one per VM with a grant table, the revocation reader
// (directTable.reader), started by the first QP bound to the path and
// ended by VM.Close (the socket closes). It unmaps the grants the agent
// revokes and acknowledges them; it never waits for a command (the agent
// may be serving the one that waits for it), and takes only the table's
// and the QPs' grant locks, which no one holds across a command.

// directTable is a VM's grant table and revocation socket.
type directTable struct {
	v     *VM
	table *sys.Mapping
	slots uint32
	conn  *net.UnixConn

	mu     sync.Mutex
	bySlot map[uint32]*grant // +checklocks:mu
	// early: notices for grants not seen yet (a direct-map reply in
	// flight), by slot: the grant's state word.
	early  map[uint32]uint32 // +checklocks:mu
	closed bool              // +checklocks:mu
	// chans: the send channels' grants, by slot (direct_send.go).
	chans map[uint32]*sendChan // +checklocks:mu
	// timerOn: the reader's read deadline is set, to retract messages
	// that wait too long (sweep); sweepList is the reader's scratch.
	timerOn   atomic.Bool
	sweepList []*sendChan
}

// grant is a mapping of a peer's region, granted to one QP for one rkey.
type grant struct {
	q      *QP
	rkey   uint32
	slot   uint32
	word   uint32 // the slot's state word while the grant is valid
	iova   uint64
	length uint64
	access abi.Access
	m      *sys.Mapping
	mr     []byte // the region's bytes in m
	// dropped: the grant is revoked or being unmapped (dropGrant); the
	// QP's one-grant cache (QP.lastGrant) no longer serves it.
	dropped atomic.Bool
}

// localMR is what the library knows of one of its regions, by lkey, for
// the local checks of a direct WR.
type localMR struct {
	lkey   uint32
	pd     *PD
	addr   uint64 // guest address of the first byte (the Go library's iova)
	length uint64
	access abi.Access
	// stale: the region was deregistered or reregistered (its entry in
	// VM.lmrs replaced); the QPs' one-region caches (QP.lastLocal) no
	// longer serve it.
	stale atomic.Bool
}

// setLocal records m as the library's region with m.lkey, or forgets
// the region with lkey when m is nil, and marks the entry it replaces
// stale.
func (v *VM) setLocal(lkey uint32, m *localMR) {
	var old any
	if m != nil {
		old, _ = v.lmrs.Swap(lkey, m)
	} else {
		old, _ = v.lmrs.LoadAndDelete(lkey)
	}
	if lm, _ := old.(*localMR); lm != nil {
		lm.stale.Store(true)
	}
}

// refuseFor is how many WRs with an rkey the agent refused a grant for
// are relayed before the library asks again.
const refuseFor = 256

// directTable returns v's grant table, opening it on first use.
func (v *VM) directTable(ctx context.Context) (*directTable, error) {
	v.dirMu.Lock()
	defer v.dirMu.Unlock()
	if v.dir != nil {
		return v.dir, nil
	}
	var r abi.DirectOpenReply
	fds, err := v.c.call(ctx, abi.OpDirectOpen, &abi.Empty{}, &r)
	if err != nil {
		return nil, err
	}
	if len(fds) != 2 {
		closeFDs(fds)
		return nil, errorf(abi.CodeInternal, "vrdma: direct-open: the agent sent %d descriptors, want 2", len(fds))
	}
	size, err := sys.FileSize(fds[0])
	if err == nil {
		err = r.Check(size)
	}
	var m *sys.Mapping
	if err == nil {
		m, err = sys.Map(fds[0], int(r.Size), false)
	}
	sys.CloseFD(fds[0])
	if err != nil {
		sys.CloseFD(fds[1])
		return nil, errorf(abi.CodeInternal, "vrdma: direct-open: %v", err)
	}
	uc, err := sys.UnixConn(fds[1], "the revocation socket")
	if err != nil {
		m.Unmap()
		return nil, errorf(abi.CodeInternal, "vrdma: direct-open: %v", err)
	}
	t := &directTable{v: v, table: m, slots: r.Slots, conn: uc, bySlot: map[uint32]*grant{}, early: map[uint32]uint32{}, chans: map[uint32]*sendChan{}}
	v.dir = t
	go t.reader()
	return t, nil
}

// reader unmaps the grants the agent revokes and acknowledges each
// notice; it ends when the socket closes.
func (t *directTable) reader() {
	var b [64]byte
	for {
		n, err := t.conn.Read(b[:])
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.sweep() // direct_send.go
			continue
		}
		if err != nil {
			return
		}
		if n != abi.RevokeMsgSize || libdiag.IgnoreRevocations.Load() {
			continue
		}
		slot, word := binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint32(b[4:])
		t.mu.Lock()
		if g := t.bySlot[slot]; g != nil && g.word == word {
			delete(t.bySlot, slot)
			g.q.dropGrant(g)
			g.m.Unmap() // no copy is inside: the agent saw in-use 0 after marking the slot
		} else if ch := t.chans[slot]; ch != nil && ch.word == word {
			delete(t.chans, slot)
			ch.revoked() // direct_send.go
		} else {
			t.early[slot] = word
		}
		t.mu.Unlock()
		if _, err := t.conn.Write(b[:abi.RevokeMsgSize]); err != nil {
			return
		}
	}
}

// close unmaps every grant, at VM.Close: the agent drops them with the
// session.
func (t *directTable) close() {
	t.conn.Close()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	for s, g := range t.bySlot {
		delete(t.bySlot, s)
		g.q.dropGrant(g)
		g.m.Unmap()
	}
	for s, ch := range t.chans {
		delete(t.chans, s)
		ch.revoked()
	}
}

// mapGrant asks the agent for a grant of rkey to q and maps it; nil if
// the agent refused (the WR is then relayed).
func (t *directTable) mapGrant(q *QP, rkey uint32) *grant {
	var r abi.DirectGrant
	fds, err := t.v.c.call(context.Background(), abi.OpDirectMap, &abi.DirectMap{QP: q.handle, RKey: rkey}, &r)
	if err != nil {
		return nil
	}
	defer closeFDs(fds)
	if len(fds) != 1 {
		return nil
	}
	size, err := sys.FileSize(fds[0])
	if err != nil || r.Check(t.slots, uint64(sys.PageSize), size) != nil || r.MapLength > 1<<62 {
		return nil
	}
	m, err := sys.MapAt(fds[0], int64(r.MapOffset), int(r.MapLength), r.MapLength <= directPopulateMax)
	if err != nil {
		return nil
	}
	g := &grant{q: q, rkey: rkey, slot: r.Slot, word: r.State, iova: r.IOVA, length: r.Length, access: r.Access, m: m,
		mr: m.Bytes()[r.MROffset : r.MROffset+r.Length]}
	t.mu.Lock()
	defer t.mu.Unlock()
	if w, ok := t.early[r.Slot]; ok && w == r.State || t.closed {
		delete(t.early, r.Slot)
		m.Unmap() // revoked before we saw it
		return nil
	}
	delete(t.early, r.Slot)
	if old := t.bySlot[r.Slot]; old != nil {
		// The agent reuses a slot only after our acknowledgement, so
		// this is a grant whose notice we lost: drop it.
		old.q.dropGrant(old)
		old.m.Unmap()
	}
	t.bySlot[r.Slot] = g
	q.gmu.Lock()
	q.grants[rkey] = g
	q.gmu.Unlock()
	return g
}

// grantFor returns q's grant for rkey, asking the agent on a miss; nil
// when there is none (relay).
func (q *QP) grantFor(rkey uint32) *grant {
	q.gmu.Lock()
	if g := q.grants[rkey]; g != nil {
		q.gmu.Unlock()
		return g
	}
	if left, ok := q.refused[rkey]; ok {
		if left > 0 {
			q.refused[rkey] = left - 1
			q.gmu.Unlock()
			return nil
		}
		delete(q.refused, rkey)
	}
	q.gmu.Unlock()
	g := q.dtab.Load().mapGrant(q, rkey)
	if g == nil {
		q.gmu.Lock()
		if len(q.refused) < 4096 {
			q.refused[rkey] = refuseFor
		}
		q.gmu.Unlock()
	}
	return g
}

// dropGrant forgets g, if it is still q's grant for its rkey; unmapping
// is the caller's (the revocation reader's). g is dead for the one-grant
// cache whatever the map held.
func (q *QP) dropGrant(g *grant) {
	g.dropped.Store(true)
	q.gmu.Lock()
	if q.grants[g.rkey] == g {
		delete(q.grants, g.rkey)
	}
	q.gmu.Unlock()
}

// setDirect records whether the QP is bound to memcpy-direct, after a
// Modify that moved it to RTR (p, its path) or RESET.
func (q *QP) setDirect(ctx context.Context, on bool) {
	q.gmu.Lock()
	clear(q.refused)
	q.gmu.Unlock()
	if !on || q.typ != QPTypeRC || !q.vm.caps.Has(abi.CapDirect) {
		q.direct.Store(false)
		return
	}
	t, err := q.vm.directTable(ctx)
	if err != nil {
		q.direct.Store(false)
		return
	}
	if r, err := q.Query(ctx); err == nil && r.Attr.MaxRdAtomic != 0 {
		q.maxRdAtomic.Store(uint32(r.Attr.MaxRdAtomic)) // a QP rdma_cm connected: the agent set it
	}
	q.dtab.Store(t)
	q.direct.Store(true)
	q.chanNext.Store(0) // direct_send.go: may ask for the send channel at RTS
}

// resync starts rule 2's count anew at a move to RESET, which discards
// the WQEs posted before it without completions: the send CQ's pending
// completions are taken (and counted) first, so that those of older WRs
// cannot be counted against newer ones.
func (q *QP) resync() {
	if q.ring == nil {
		return
	}
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	cq := q.sendCQ
	cq.mu.Lock()
	cq.drainLocked()
	cq.mu.Unlock()
	q.sendDone.Store(q.relayedSignaled)
}

// lookupLocal returns the library's region with lkey, or nil.
func (v *VM) lookupLocal(lkey uint32) *localMR {
	m, _ := v.lmrs.Load(lkey)
	lm, _ := m.(*localMR)
	return lm
}

// localFor returns the library's region with lkey for a direct WR of q:
// the QP's last one when it has that lkey and is still registered as it
// was, else VM.lmrs's (a sync.Map: an interface hash and a trie walk,
// a fifth of a 4 KiB WRITE's own cost).
//
// +checklocks:q.sqMu
func (q *QP) localFor(lkey uint32) *localMR {
	if lm := q.lastLocal; lm != nil && lm.lkey == lkey && !lm.stale.Load() {
		return lm
	}
	lm := q.vm.lookupLocal(lkey)
	if lm != nil {
		q.lastLocal = lm
	}
	return lm
}

// directPost executes wr on the memcpy-direct path if it can prove it
// valid (wire-local.md §4.21, rules 1-6), and reports whether it did;
// false: post it to the ring. The caller holds q.sqMu.
//
// Per WR it takes the CQ's lock once for a signaled WR (rules 2 and 6,
// the copy and the completion under one hold when the message is at most
// directHoldMax bytes; two holds, before and after the copy, above) and
// not at all for an unsignaled one while rule 2 holds on the QP's own
// counts; the grant and the local region come from one-entry caches.
//
// +checklocks:q.sqMu
func (q *QP) directPost(wr *SendWR) bool {
	mem := q.ring.Bytes()
	if QPState(abi.Word(mem, abi.OffQPState).Load()) != QPSRTS || abi.Word(mem, abi.OffSQHead).Load() != q.sqTail {
		return false // rules 1 and 2 (the ring's part)
	}
	var need abi.Access
	var op WCOpcode
	switch wr.Opcode {
	case OpRDMAWrite:
		need, op = abi.AccessRemoteWrite, WCRDMAWrite
	case OpRDMARead:
		need, op = abi.AccessRemoteRead, WCRDMARead
	case OpAtomicCmpAndSwp:
		need, op = abi.AccessRemoteAtomic, WCCompSwap
	case OpAtomicFetchAdd:
		need, op = abi.AccessRemoteAtomic, WCFetchAdd
	case OpAtomicWrite:
		need, op = abi.AccessRemoteWrite, WCAtomicWrite
	default:
		return false
	}
	if wr.Opcode.IsRdAtomic() && q.maxRdAtomic.Load() == 0 {
		return false
	}
	// Rule 4: the local side.
	inline := wr.Flags&SendInline != 0
	if inline && wr.Opcode != OpRDMAWrite {
		return false
	}
	total, ok := q.directLocal(wr, wr.Opcode != OpRDMAWrite)
	if !ok {
		return false
	}
	n := total
	switch wr.Opcode {
	case OpAtomicCmpAndSwp, OpAtomicFetchAdd:
		if len(wr.SGL) != 1 || wr.SGL[0].Length != 8 {
			return false
		}
	case OpAtomicWrite:
		if len(wr.SGL) != 0 {
			return false
		}
		n = 8
	default:
		if total == 0 || total > 1<<31 || inline && total > uint64(q.caps.MaxInlineData) {
			return false
		}
	}
	atomicOp := n == 8 && wr.Opcode != OpRDMAWrite && wr.Opcode != OpRDMARead
	if atomicOp && wr.RemoteAddr&7 != 0 {
		return false
	}
	// Rule 5: the grant, the QP's last one if it has the rkey and was not
	// dropped (a revoked grant the cache still held would fail the state
	// word's check below all the same).
	g := q.lastGrant
	if g == nil || g.rkey != wr.RKey || g.dropped.Load() {
		if g = q.grantFor(wr.RKey); g == nil {
			return false
		}
		q.lastGrant = g
	}
	if g.access&need == 0 || wr.RemoteAddr < g.iova || !sys.InBounds(wr.RemoteAddr-g.iova, n, g.length) {
		return false
	}
	off := wr.RemoteAddr - g.iova
	if atomicOp && !abi.Aligned8(g.mr, off) {
		return false
	}
	// Rules 2 (the CQ's part) and 6, then the operation and, for a
	// signaled WR, its completion.
	signaled := wr.Flags&SendSignaled != 0 || q.sqSigAll
	cq := q.sendCQ
	wc := WorkCompletion{WRID: wr.ID, Status: WCSuccess, Opcode: op, ByteLen: uint32(n), QPNum: q.qpn}
	if signaled && n <= directHoldMax {
		cq.mu.Lock()
		ok := q.directRoomLocked(true) && q.directExec(wr, g, n, off)
		notify := ok && cq.completeLocked(wc)
		cq.mu.Unlock()
		if notify {
			cq.notify()
		}
		return ok
	}
	if signaled || q.sendDone.Load() < q.relayedSignaled || !q.chanIdle() {
		cq.mu.Lock()
		ok := q.directRoomLocked(signaled)
		cq.mu.Unlock()
		if !ok {
			return false
		}
	}
	if !q.directExec(wr, g, n, off) {
		return false
	}
	if signaled {
		cq.complete(wc)
	}
	return true
}

// directLocal checks the local side of wr for the library's own
// execution (§4.21 rule 4, §4.22): at most max_send_sge SGEs, each of
// nonzero length in a region of this session the library registered, of
// q's PD, with LOCAL_WRITE if the library writes there (READ, atomics);
// an INLINE WR's only in guest memory. It returns the SGEs' total.
//
// +checklocks:q.sqMu
func (q *QP) directLocal(wr *SendWR, writes bool) (uint64, bool) {
	if len(wr.SGL) > int(q.caps.MaxSendSGE) {
		return 0, false
	}
	inline := wr.Flags&SendInline != 0
	gm := q.vm.mem.Bytes()
	var total uint64
	for _, s := range wr.SGL {
		if s.Length == 0 {
			continue
		}
		if inline {
			if !sys.InBounds(s.Addr, uint64(s.Length), uint64(len(gm))) {
				return 0, false
			}
		} else {
			lm := q.localFor(s.LKey)
			if lm == nil || lm.pd != q.pd || s.Addr < lm.addr || !sys.InBounds(s.Addr-lm.addr, uint64(s.Length), lm.length) ||
				writes && lm.access&abi.AccessLocalWrite == 0 {
				return 0, false
			}
		}
		total += uint64(s.Length)
	}
	return total, true
}

// directRoomLocked checks rules 2 (the CQ's part: every signaled WR
// relayed before has its completion taken from the ring; and, §4.22,
// every message of the QP's send channel reaped) and, for a signaled WR,
// 6 (the send CQ has room for one more completion).
//
// +checklocks:q.sqMu
// +checklocks:q.sendCQ.mu
func (q *QP) directRoomLocked(signaled bool) bool {
	cq := q.sendCQ
	if q.sendDone.Load() < q.relayedSignaled && (!cq.drainLocked() || q.sendDone.Load() < q.relayedSignaled) {
		return false
	}
	if !q.chanQuiet(cq) {
		return false
	}
	if !signaled {
		return true
	}
	pending, _ := abi.Pending(abi.Word(cq.ring.Bytes(), abi.OffCQTail).Load(), cq.head, cq.layout.Entries)
	return uint64(cq.localLen())+uint64(pending) < uint64(cq.layout.Entries)
}

// directExec does wr's n bytes (or its atomic) at offset off of grant g,
// each copy inside an in-use hold that saw the grant's state word still
// valid (§4.21 pair 4); false if the grant was revoked first (the WR is
// then relayed, and the relay gives it the status a revoked region gets).
func (q *QP) directExec(wr *SendWR, g *grant, n, off uint64) bool {
	gm := q.vm.mem.Bytes()
	tab := q.dtab.Load().table.Bytes()
	inUse := abi.Word(tab, int(g.slot)*abi.GrantSlotSize+abi.OffGrantInUse)
	state := abi.Word(tab, int(g.slot)*abi.GrantSlotSize+abi.OffGrantState)
	inUse.Add(1) // §4.21 pair 4: a read-modify-write, a full barrier before the state's load
	if state.Load() != g.word {
		inUse.Add(^uint32(0))
		q.dropGrant(g) // revoked or revoking: the reader unmaps it
		return false
	}
	switch wr.Opcode {
	case OpRDMAWrite, OpRDMARead:
		// In chunks of directChunk, each inside an in-use hold of its own,
		// so that no hold outlasts the agent's fence deadline; a grant
		// revoked between two chunks sends the WR to the relay, which
		// completes it with the status a revoked region gets. Each
		// piece is one bulkcopy.Copy: a string move from 64 KiB, which
		// stays in the cache as glibc's memcpy does.
		var done, so uint64 // bytes of the message moved; offset in SGE si
		si := 0
		for done < n {
			if done > 0 {
				inUse.Add(1)
				if state.Load() != g.word {
					inUse.Add(^uint32(0))
					q.dropGrant(g)
					return false
				}
			}
			end := min(done+directChunk, n)
			for done < end {
				s := wr.SGL[si]
				k := min(uint64(s.Length)-so, end-done)
				local, remote := gm[s.Addr+so:s.Addr+so+k], g.mr[off+done:off+done+k]
				if wr.Opcode == OpRDMAWrite {
					bulkcopy.Copy(remote, local)
				} else {
					bulkcopy.Copy(local, remote)
				}
				done, so = done+k, so+k
				if so == uint64(s.Length) {
					si, so = si+1, 0
				}
			}
			if done < n {
				inUse.Add(^uint32(0))
			}
		}
	case OpAtomicCmpAndSwp, OpAtomicFetchAdd:
		w := abi.Word64(g.mr, off)
		var old uint64
		if wr.Opcode == OpAtomicFetchAdd {
			old = w.Add(wr.CompareAdd) - wr.CompareAdd
		} else {
			for {
				old = w.Load()
				if old != wr.CompareAdd || w.CompareAndSwap(old, wr.Swap) {
					break
				}
			}
		}
		s := wr.SGL[0]
		binary.LittleEndian.PutUint64(gm[s.Addr:s.Addr+8], old)
	case OpAtomicWrite:
		abi.Word64(g.mr, off).Store(wr.Swap)
	}
	inUse.Add(^uint32(0))
	if wr.Opcode.IsRdAtomic() {
		abi.Word(tab, int(g.slot)*abi.GrantSlotSize+abi.OffGrantRdAtomics).Add(1) // the QP's counters (rd_atomic_peak)
	}
	return true
}

// directChunk is the most one in-use hold of a direct WRITE or READ copies
// (§4.21): a library that holds a grant's in-use word past the agent's
// 200 ms deadline is fenced, and 4 MiB takes about a millisecond.
const directChunk = 4 << 20

// directPopulateMax is the largest grant mapped with its pages faulted in
// at once (MAP_POPULATE): the region's pages are the owner's, locked, so
// this only fills page tables, about 5 ms for 64 MiB here, where a WRITE
// that touched each 4 KiB page first paid a fault for it (a tenth of a
// 64 MiB write_bw). Larger grants fault in as they are touched.
const directPopulateMax = 256 << 20

// directHoldMax is the largest signaled direct WR whose copy runs under
// the send CQ's lock, between its rules 2 and 6 and its completion (one
// hold instead of two): 64 KiB copies in a few microseconds, the longest a
// Poll of the CQ on another thread may wait for it.
const directHoldMax = 64 << 10

// localLen is how many completions the CQ's local queue holds.
//
// +checklocks:cq.mu
func (cq *CQ) localLen() int { return len(cq.local) - cq.lhead }

// pushLocal appends wc to the CQ's local queue. The room of the
// completions already taken is reused before the slice grows: a queue
// that Poll never empties (write_bw signaling every WRITE, 128 posted
// for each Poll of 64) grew by one completion a WR, without bound.
//
// +checklocks:cq.mu
func (cq *CQ) pushLocal(wc WorkCompletion) {
	if cq.lhead > 0 && (cq.lhead == len(cq.local) || len(cq.local) == cap(cq.local)) {
		n := copy(cq.local, cq.local[cq.lhead:])
		cq.local, cq.lhead = cq.local[:n], 0
	}
	cq.local = append(cq.local, wc)
}

// popLocal takes the oldest completion of the local queue.
//
// +checklocks:cq.mu
func (cq *CQ) popLocal() WorkCompletion {
	wc := cq.local[cq.lhead]
	cq.lhead++
	if cq.lhead == len(cq.local) {
		cq.local, cq.lhead = cq.local[:0], 0
	}
	return wc
}

// drainLocked moves the ring's pending completions into the local queue,
// counting its QPs' send completions; false if the ring's tail is not a
// valid index (Poll reports it).
//
// +checklocks:cq.mu
func (cq *CQ) drainLocked() bool {
	mem := cq.ring.Bytes()
	size := cq.layout.Entries
	tail := abi.Word(mem, abi.OffCQTail).Load()
	if _, ok := abi.Pending(tail, cq.head, size); !ok {
		return false
	}
	if tail == cq.head {
		return true
	}
	for cq.head != tail {
		off := cq.layout.Offset + abi.Slot(cq.head, size)*abi.CQESize
		abi.DecodeCQE(mem[off:off+abi.CQESize], &cq.cqe)
		e := &cq.cqe
		cq.countLocked(e)
		cq.pushLocal(WorkCompletion{WRID: e.WRID, Status: e.Status, Opcode: e.Opcode, Flags: e.Flags, ByteLen: e.ByteLen,
			Imm: e.Imm, QPNum: e.QPNum, SrcQP: e.SrcQP})
		cq.head = abi.Next(cq.head, size)
	}
	abi.Word(mem, abi.OffCQHead).Store(cq.head)
	return true
}

// countLocked counts e against its QP if it is a send completion of a QP
// that may go direct (rule 2).
//
// +checklocks:cq.mu
func (cq *CQ) countLocked(e *abi.CQE) {
	if len(cq.track) != 0 && e.Opcode < WCRecv {
		if q := cq.track[e.QPNum]; q != nil {
			q.sendDone.Add(1)
		}
	}
}

// complete adds a completion the library made itself and raises the
// CQ's event if it is armed for every completion (a direct completion is
// never solicited).
func (cq *CQ) complete(wc WorkCompletion) {
	cq.mu.Lock()
	notify := cq.completeLocked(wc)
	cq.mu.Unlock()
	if notify {
		cq.notify()
	}
}

// completeLocked adds wc to the local queue and reports whether the CQ
// was armed for every completion (the caller then calls notify, without
// the lock). The armed word is read under the CQ's lock, which arm holds
// while it stores it: an arm before this hold is seen here, one after it
// is followed by a Poll (or Wait's check) that sees wc. Only when it
// reads armed does it take the word with a compare-and-swap, against the
// agent's clearing it for a completion of its own.
//
// +checklocks:cq.mu
func (cq *CQ) completeLocked(wc WorkCompletion) bool {
	// The ring's pending completions first (§4.21), so that every one in
	// the local queue is older than every one left in the ring; a ring
	// whose tail is not a valid index is left for Poll to report.
	cq.drainLocked()
	cq.pushLocal(wc)
	armed := abi.Word(cq.ring.Bytes(), abi.OffCQArmed)
	return armed.Load() == abi.ArmAll && armed.CompareAndSwap(abi.ArmAll, 0)
}

// notify asks the agent to raise the CQ's completion event.
func (cq *CQ) notify() {
	cq.vm.c.call(context.Background(), abi.OpCQNotify, &abi.Handle{Handle: cq.handle}, nil)
}
