// SPDX-License-Identifier: Apache-2.0

package device

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// The memcpy-direct path's grants (docs/wire-local.md §4.21). A session
// that opened a grant table (OpenDirect) may ask for grants (Grant): a
// mapping of the pages of a region of the peer QP's PD, which its library
// then writes, reads and updates atomically itself. Every grant lives in
// the device's registry (Device.grants, under directMu) until it is
// revoked: its slot marked revoking, the library's copies waited out
// (in-use 0), the library told and its acknowledgement awaited, the slot
// freed. A library that does not finish within RevokeWait is fenced.
//
// Goroutines: each table has one reader (tableReader) that takes the
// library's acknowledgements off the revocation socket and wakes the
// revoker waiting for it; it ends when the socket closes (closeTable).
// A revocation the device starts itself (a QP moved to another state by
// a path or a peer) runs its waits in a goroutine of its own (finish);
// the others run them in the caller's, before the owner's call returns.
// Locks: q.mu before directMu (setStateLocked marks under q.mu);
// directMu before a table's mu. No wait happens under directMu.

// RevokeWait is how long a revocation waits for the peer library (in-use
// 0 and its acknowledgement) before it fences the library's session.
const RevokeWait = 200 * time.Millisecond

// directTable is a session's grant table.
type directTable struct {
	v    *Context
	mem  *sys.Mapping // the agent's mapping; unmapped once every finish is done
	conn *net.UnixConn

	mu      sync.Mutex
	waiters map[uint64]chan struct{} // +checklocks:mu
	closed  chan struct{}            // closed by closeTable
	users   sync.WaitGroup           // finishes using mem

	slots [abi.GrantSlots]*grant // guarded by d.directMu
	gens  [abi.GrantSlots]uint32 // guarded by d.directMu
}

// grant is one mapping a library holds of a region of another session.
type grant struct {
	tab    *directTable
	slot   uint32
	word   uint32 // the slot's state word while valid
	init   *QP    // the initiator QP, of tab.v
	target *QP    // its peer, of owner
	mr     *MR
	owner  *Context
	ch     *channel // a send channel's grant (direct_send.go): mr is nil
	// revoking is set under directMu when the grant is marked; done is
	// closed once its slot is free again.
	revoking bool
	done     chan struct{}
}

func slotKey(slot, word uint32) uint64 { return uint64(slot)<<32 | uint64(word) }

func (t *directTable) stateWord(slot uint32) *atomic.Uint32 {
	return abi.Word(t.mem.Bytes(), int(slot)*abi.GrantSlotSize+abi.OffGrantState)
}

func (t *directTable) inUseWord(slot uint32) *atomic.Uint32 {
	return abi.Word(t.mem.Bytes(), int(slot)*abi.GrantSlotSize+abi.OffGrantInUse)
}

// SetDirectCapable records whether v's session set capability
// memcpy-direct in its hello: the path is bound only between such
// sessions.
func (v *Context) SetDirectCapable(ok bool) { v.directCapable.Store(ok) }

// DirectCapable reports what SetDirectCapable recorded.
func (v *Context) DirectCapable() bool { return v.directCapable.Load() }

// OpenDirect makes v's grant table (direct-open): the reply and its two
// descriptors (the table memfd and the library's end of the revocation
// socket), which the caller sends and closes.
func (v *Context) OpenDirect() (abi.DirectOpenReply, []int, error) {
	if !v.DirectCapable() {
		return abi.DirectOpenReply{}, nil, abi.Errorf(abi.CodeState, "", "direct-open: this session's hello did not set capability memcpy-direct")
	}
	d := v.d
	d.directMu.Lock()
	defer d.directMu.Unlock()
	if v.direct != nil {
		return abi.DirectOpenReply{}, nil, abi.Errorf(abi.CodeExists, "", "direct-open: the session has its grant table already")
	}
	if v.dying.Load() {
		return abi.DirectOpenReply{}, nil, abi.Errorf(abi.CodeState, "", "direct-open: the VM is detaching")
	}
	fd, err := sys.Memfd("vrdma-grants-"+v.name, abi.GrantTableSize)
	if err != nil {
		return abi.DirectOpenReply{}, nil, abi.Errorf(abi.CodeInternal, "", "direct-open: %v", err)
	}
	m, err := sys.Map(fd.Int(), abi.GrantTableSize, true)
	if err != nil {
		fd.Close()
		return abi.DirectOpenReply{}, nil, abi.Errorf(abi.CodeInternal, "", "direct-open: %v", err)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		m.Unmap()
		fd.Close()
		return abi.DirectOpenReply{}, nil, abi.Errorf(abi.CodeInternal, "", "direct-open: socketpair: %v", err)
	}
	uc, err := sys.UnixConn(pair[0], "revocation socket")
	if err != nil {
		unix.Close(pair[1])
		m.Unmap()
		fd.Close()
		return abi.DirectOpenReply{}, nil, abi.Errorf(abi.CodeInternal, "", "direct-open: %v", err)
	}
	t := &directTable{v: v, mem: m, conn: uc, waiters: map[uint64]chan struct{}{}, closed: make(chan struct{})}
	v.direct = t
	go t.reader()
	return abi.DirectOpenReply{Slots: abi.GrantSlots, SlotSize: abi.GrantSlotSize, Size: abi.GrantTableSize}, []int{fd.Int(), pair[1]}, nil
}

// reader takes the library's acknowledgements off the revocation socket
// and wakes their revokers; it ends when the socket closes.
func (t *directTable) reader() {
	var b [64]byte
	for {
		n, err := t.conn.Read(b[:])
		if err != nil {
			return
		}
		if n != abi.RevokeMsgSize {
			continue // not an acknowledgement: ignored (a hostile library only delays its own fencing)
		}
		k := slotKey(binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint32(b[4:]))
		t.mu.Lock()
		if ch, ok := t.waiters[k]; ok {
			close(ch)
			delete(t.waiters, k)
		}
		t.mu.Unlock()
	}
}

// Grant makes a grant for v's QP handle qh of the peer's region rkey
// (direct-map): the reply and one descriptor, a duplicate of the peer
// session's guest memory memfd, which the caller sends and closes.
func (v *Context) Grant(qh, rkey uint32) (abi.DirectGrant, []int, error) {
	d := v.d
	q, err := v.QPByHandle(qh)
	if err != nil {
		return abi.DirectGrant{}, nil, err
	}
	gi := q.directGen.Load()
	q.mu.Lock()
	path, rqpn, rgid := q.pathInfo.Path, q.remoteQPN, q.remoteGID
	q.mu.Unlock()
	if path != abi.PathMemcpyDirect || q.State() != abi.QPSRTS {
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeState, "qp", "direct-map: QP 0x%x is not an RTS QP bound to memcpy-direct (%s, path %q)", q.qpn, q.State(), path)
	}
	d.mu.Lock()
	t := d.qps[rqpn]
	d.mu.Unlock()
	if t == nil || t.vm == v || t.ad.gid != rgid || t.typ != abi.QPTypeRC {
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeState, "qp", "direct-map: QP 0x%x has no RC peer QP 0x%x of another session on this host", q.qpn, rqpn)
	}
	gt := t.directGen.Load()
	t.mu.Lock()
	tAccess, tRd, tRemote := t.attr.AccessFlags, t.attr.MaxDestRdAtomic, t.remoteQPN
	t.mu.Unlock()
	if s := t.State(); (s != abi.QPSRTR && s != abi.QPSRTS) || tRemote != q.qpn {
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeState, "qp", "direct-map: peer QP 0x%x is in %s, or not connected to QP 0x%x", t.qpn, s, q.qpn)
	}

	d.directMu.Lock()
	defer d.directMu.Unlock()
	tab := v.direct
	switch {
	case tab == nil:
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeState, "", "direct-map: open the session's grant table first (direct-open)")
	case q.directGen.Load() != gi || t.directGen.Load() != gt || q.State() != abi.QPSRTS:
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeUnavailable, "qp", "direct-map: QP 0x%x or its peer changed while asked: ask again", q.qpn)
	case t.vm.dying.Load() || v.dying.Load():
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeState, "qp", "direct-map: a VM of the pair is detaching")
	case !q.ad.Connected() || !t.ad.Connected():
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeState, "qp", "direct-map: an adapter of the pair is disconnected (its port is down)")
	}
	m := t.vm.lookupMR(rkey)
	if m == nil || m.pd != t.pd || m.access&abi.AccessOnDemand != 0 {
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeNotFound, "rkey", "direct-map: rkey 0x%x is not a region of peer QP 0x%x's PD (or it is on demand)", rkey, t.qpn)
	}
	access := m.access & tAccess & (abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic)
	if tRd == 0 {
		access &^= abi.AccessRemoteRead | abi.AccessRemoteAtomic
	}
	if access == 0 {
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeNotFound, "rkey", "direct-map: rkey 0x%x grants no remote access through peer QP 0x%x", rkey, t.qpn)
	}
	slot := d.freeSlotLocked(tab)
	if slot < 0 {
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeLimit, "", "direct-map: the session holds %d grants, the most a grant table has", abi.GrantSlots)
	}
	dup, err := unix.FcntlInt(uintptr(t.vm.memFD.Int()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return abi.DirectGrant{}, nil, abi.Errorf(abi.CodeInternal, "", "direct-map: dup the peer's guest memory: %v", err)
	}
	g := d.grantLocked(tab, uint32(slot), q, t, t.vm)
	g.mr = m
	word := g.word
	page := uint64(sys.PageSize)
	start := m.addr &^ (page - 1)
	end := (m.addr + m.length + page - 1) &^ (page - 1)
	return abi.DirectGrant{Slot: uint32(slot), State: word, IOVA: m.iova, Length: m.length, Access: access,
		MapOffset: start, MapLength: end - start, MROffset: m.addr - start}, []int{dup}, nil
}

// freeSlotLocked returns a free slot of the table, or -1.
//
// +checklocks:d.directMu
func (d *Device) freeSlotLocked(t *directTable) int {
	for i, g := range t.slots {
		if g == nil && t.stateWord(uint32(i)).Load() == abi.GrantFree {
			return i
		}
	}
	return -1
}

// grantLocked makes a grant in free slot slot for initiator q of target
// t's owner: a new generation, in-use 0, the valid state word stored.
//
// +checklocks:d.directMu
func (d *Device) grantLocked(t *directTable, slot uint32, q, tq *QP, owner *Context) *grant {
	gen := (t.gens[slot] + 1) & (abi.GrantGenMask >> 2)
	if gen == 0 {
		gen = 1
	}
	t.gens[slot] = gen
	word := abi.GrantWord(gen, abi.GrantValid)
	g := &grant{tab: t, slot: slot, word: word, init: q, target: tq, owner: owner, done: make(chan struct{})}
	t.slots[slot] = g
	d.grants[g] = struct{}{}
	t.inUseWord(slot).Store(0)
	abi.StoreFenced(t.stateWord(slot), word)
	return g
}

// markLocked marks the grants pred matches revoking and returns the
// newly marked ones (whose finish is the caller's) and every match, to
// wait for.
//
// +checklocks:d.directMu
func (d *Device) markLocked(pred func(*grant) bool) (fresh, all []*grant) {
	var chans []*channel
	for g := range d.grants {
		if !pred(g) {
			continue
		}
		if g.ch == nil {
			all = append(all, g)
			if d.markGrantLocked(g) {
				fresh = append(fresh, g)
			}
			continue
		}
		// A send channel's two grants go together (direct_send.go):
		// one entry in fresh, its first grant, finishes both.
		if !slices.Contains(chans, g.ch) {
			chans = append(chans, g.ch)
		}
	}
	for _, ch := range chans {
		newly := !ch.revoking
		ch.revoking = true
		var first *grant
		for _, g := range ch.grants {
			if g == nil {
				continue
			}
			all = append(all, g)
			d.markGrantLocked(g)
			if first == nil {
				first = g
			}
		}
		if newly && first != nil {
			fresh = append(fresh, first)
		}
	}
	return fresh, all
}

// markGrantLocked marks g revoking, if it is not yet, and reports
// whether it did.
//
// +checklocks:d.directMu
func (d *Device) markGrantLocked(g *grant) bool {
	if g.revoking {
		return false
	}
	g.revoking = true
	abi.StoreFenced(g.tab.stateWord(g.slot), g.word&abi.GrantGenMask|abi.GrantRevoking) // pair 4: before in-use's load
	g.tab.users.Add(1)
	return true
}

// revoke revokes the grants pred matches and waits until every one of
// them is free (or its library fenced): before the reply of the owner's
// call that caused it.
func (d *Device) revoke(pred func(*grant) bool) {
	d.directMu.Lock()
	if len(d.grants) == 0 {
		d.directMu.Unlock()
		return
	}
	fresh, all := d.markLocked(pred)
	d.directMu.Unlock()
	var wg sync.WaitGroup
	for _, g := range fresh {
		wg.Add(1)
		go func() { defer wg.Done(); d.finish(g) }()
	}
	wg.Wait()
	for _, g := range all {
		<-g.done
	}
}

// revokeAsync marks the grants pred matches at once, so that no direct
// WR lands from now on, and finishes them in goroutines of their own. The
// caller may hold q.mu.
func (d *Device) revokeAsync(pred func(*grant) bool) {
	d.directMu.Lock()
	if len(d.grants) == 0 {
		d.directMu.Unlock()
		return
	}
	fresh, _ := d.markLocked(pred)
	d.directMu.Unlock()
	for _, g := range fresh {
		go d.finish(g)
	}
}

// finish completes the revocation of marked grant g: waits for its
// in-use word to read 0, tells the library, waits for the
// acknowledgement, and frees the slot; a library that has not done its
// part within RevokeWait is fenced.
func (d *Device) finish(g *grant) {
	if g.ch != nil {
		d.finishChannel(g.ch) // both of the channel's grants (direct_send.go)
		return
	}
	t := g.tab
	defer t.users.Done()
	deadline := time.Now().Add(RevokeWait)
	fenced := false
	ok := t.waitInUse(g.slot, deadline) && t.tell(g, deadline)
	if !ok && !t.isClosed() {
		fenced = true
		d.fence(t.v, fmt.Sprintf("its library did not give up grant %d (slot %d) of VM %q within %v of its revocation", g.word>>2, g.slot, g.owner.name, RevokeWait))
	}
	d.directMu.Lock()
	d.foldLocked(g)
	delete(d.grants, g)
	if t.slots[g.slot] == g {
		t.slots[g.slot] = nil
		if !t.isClosed() && !fenced {
			abi.StoreFenced(t.stateWord(g.slot), abi.GrantFree)
		}
	}
	d.directMu.Unlock()
	close(g.done)
}

// tell sends the notice of marked grant g on the revocation socket and
// waits for the library's acknowledgement, until deadline; false if it
// did not come (a table closed meanwhile counts as acknowledged).
func (t *directTable) tell(g *grant, deadline time.Time) bool {
	ch := make(chan struct{})
	t.mu.Lock()
	t.waiters[slotKey(g.slot, g.word)] = ch
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.waiters, slotKey(g.slot, g.word))
		t.mu.Unlock()
	}()
	var b [abi.RevokeMsgSize]byte
	binary.LittleEndian.PutUint32(b[0:], g.slot)
	binary.LittleEndian.PutUint32(b[4:], g.word)
	t.conn.SetWriteDeadline(deadline)
	if _, err := t.conn.Write(b[:]); err != nil {
		return t.isClosed()
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-ch:
	case <-t.closed:
	case <-timer.C:
		return false
	}
	return true
}

// waitInUse waits until slot's in-use word reads 0 (pair 4), the table
// closes, or the deadline passes (false).
func (t *directTable) waitInUse(slot uint32, deadline time.Time) bool {
	w := t.inUseWord(slot)
	for spins := 0; w.Load() != 0; spins++ {
		if t.isClosed() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		if spins < 100 {
			continue
		}
		time.Sleep(20 * time.Microsecond)
	}
	return true
}

func (t *directTable) isClosed() bool {
	select {
	case <-t.closed:
		return true
	default:
		return false
	}
}

// fence ends the session of a library that did not give up a revoked
// grant in time: its QPs to ERR, its process killed (unless it is the
// agent's own), its session closed and its VM detached.
func (d *Device) fence(v *Context, why string) {
	d.log.Warn("fencing a memcpy-direct peer", "vm", v.name, "pid", v.PID(), "why", why)
	v.objMu.Lock()
	qps := make([]*QP, 0, len(v.qps))
	for _, q := range v.qps {
		qps = append(qps, q)
	}
	v.objMu.Unlock()
	for _, q := range qps {
		q.MoveToErr("fenced: " + why)
	}
	if pid := int(v.PID()); pid > 0 && pid != os.Getpid() {
		if err := unix.Kill(pid, unix.SIGKILL); err == nil {
			waitGone(pid, RevokeWait)
		} else if !errors.Is(err, unix.ESRCH) {
			d.log.Warn("fence: kill failed", "vm", v.name, "pid", pid, "err", err)
		}
	}
	v.Kick("fenced: " + why)
}

// waitGone waits, at most max, until process pid is a zombie or gone: it
// runs no more code of its own.
func waitGone(pid int, max time.Duration) {
	for end := time.Now().Add(max); time.Now().Before(end); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state follows the command's closing parenthesis.
		for i := len(b) - 1; i > 0; i-- {
			if b[i] == ')' {
				if i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
					return
				}
				break
			}
		}
	}
}

// closeDirect drops v's grant table, at v's teardown: its grants are
// dropped without notice (the library goes with the session), then the
// table is unmapped once no revocation uses it.
func (v *Context) closeDirect() {
	d := v.d
	d.directMu.Lock()
	t := v.direct
	if t == nil {
		d.directMu.Unlock()
		return
	}
	close(t.closed)
	t.conn.Close()
	var drop []*grant
	for g := range d.grants {
		if g.tab == t && !g.revoking {
			drop = append(drop, g)
		}
	}
	for _, g := range drop {
		d.foldLocked(g)
		delete(d.grants, g)
		t.slots[g.slot] = nil
		close(g.done)
	}
	d.directMu.Unlock()
	t.users.Wait()
	d.directMu.Lock()
	v.direct = nil
	d.directMu.Unlock()
	t.mem.Unmap()
}

// directChanged revokes the grants of q, as initiator or target, after a
// change of its state or attributes: marked at once (the caller may hold
// q.mu); wait also waits for them to be free.
func (q *QP) directChanged(wait bool) {
	q.directGen.Add(1)
	// A send channel stays while q is in RTR or RTS (an RTR → RTS or
	// RTS → RTS modify): it is revoked when q leaves them (§4.22).
	s := q.State()
	keepCh := s.HoldsChannel()
	pred := func(g *grant) bool { return (g.init == q || g.target == q) && (g.ch == nil || !keepCh) }
	if wait {
		q.vm.d.revoke(pred)
	} else {
		q.vm.d.revokeAsync(pred)
	}
}

// GrantCount returns how many grants the device holds (tests, status).
func (d *Device) GrantCount() int {
	d.directMu.Lock()
	defer d.directMu.Unlock()
	return len(d.grants)
}

// NotifyCQ sends one event on CQ h's event socket (cq-notify): the
// library wrote a completion of its own to it and found it armed.
func (v *Context) NotifyCQ(h uint32) error {
	v.objMu.Lock()
	c, ok := v.cqs[h]
	v.objMu.Unlock()
	if !ok {
		return abi.Errorf(abi.CodeNotFound, "handle", "no CQ with handle %d", h)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return abi.Errorf(abi.CodeNotFound, "handle", "CQ %d was destroyed", h)
	}
	c.event.Ring()
	return nil
}

// foldLocked counts g's direct READs and atomics (the library's
// rd_atomics word) in its initiator's counters: each was the one
// outstanding at its time, so the QP's peak is at least 1.
//
// +checklocks:d.directMu
func (d *Device) foldLocked(g *grant) {
	if g.tab.isClosed() && g.tab.mem.Len() == 0 {
		return
	}
	if abi.Word(g.tab.mem.Bytes(), int(g.slot)*abi.GrantSlotSize+abi.OffGrantRdAtomics).Load() != 0 {
		g.init.ctr.RdAtomicPeak.CompareAndSwap(0, 1)
	}
}

// foldDirect folds the live grants of q into its counters (foldLocked),
// before a status report.
func (d *Device) foldDirect(q *QP) {
	d.directMu.Lock()
	defer d.directMu.Unlock()
	for g := range d.grants {
		if g.init == q {
			d.foldLocked(g)
		}
	}
}
