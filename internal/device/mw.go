// SPDX-License-Identifier: Apache-2.0

package device

// Memory windows (capability mw). A window is a range of a memory region,
// with rights of its own, that a peer reaches by the window's rkey. Its
// rkey is abi.MWKeyBit, its index (a slot of the context's window table
// and that slot's generation, as region keys are, keys.go) and an 8-bit
// tag the consumer picks at each bind. A binding is immutable once
// published: a bind, an invalidation or a dealloc replaces or removes it
// at once for every path (a lookup finds one or the other), and those
// that a work request or a command does return only once no path can
// still touch memory through the old one — DeregMR's barrier — so that
// the completion or the reply that reports it comes after its effect.

import (
	"fmt"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// mwIndexWidth is how many bits a window's index has: the rkey's bits
// between abi.MWKeyBit and the tag.
const mwIndexWidth = 23

// MW is a memory window.
type MW struct {
	handle uint32
	typ    abi.MWType
	pd     *PD
	// key is the rkey: its index never changes, a bind sets its tag
	// (under vm.objMu); lookups read it without the lock.
	key atomic.Uint32
	// b is the binding; nil: the window is not bound (invalid).
	b atomic.Pointer[mwBinding]
}

// mwBinding is what a bound window grants: [iova, iova+length) of region
// mr (its definition when bound) with access, to requests that name rkey
// and, for a type 2 window, come to qp.
type mwBinding struct {
	rkey   uint32
	mr     *MR
	qp     *QP // type 2: the QP that bound it
	iova   uint64
	length uint64
	access abi.Access
}

// mwIndex is the index part of a window's rkey.
func mwIndex(key uint32) uint32 { return key &^ abi.MWKeyBit >> 8 }

// AllocMW allocates a memory window of r.Type in PD r.PD.
func (v *Context) AllocMW(r *abi.AllocMW) (abi.AllocMWReply, error) {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	p, ok := v.pds[r.PD]
	if !ok {
		return abi.AllocMWReply{}, abi.Errorf(abi.CodeNotFound, "pd", "no PD with handle %d", r.PD)
	}
	idx, ok := v.mwKeys.take(mwIndexWidth)
	if !ok {
		return abi.AllocMWReply{}, abi.Errorf(abi.CodeLimit, "", "VM %q has %d memory windows, the limit (max_mw): deallocate some first", v.name, len(v.mwHandles))
	}
	w := &MW{handle: v.allocHandleLocked(), typ: r.Type, pd: p}
	w.key.Store(abi.MWKeyBit | idx<<8)
	p.refs++
	v.mwHandles[w.handle] = w
	v.mws[v.mwKeys.slot(idx)].Store(w)
	return abi.AllocMWReply{Handle: w.handle, RKey: w.key.Load()}, nil
}

// DeallocMW frees memory window h, bound or not: its rkey stops working
// before the reply, as at dereg-mr.
func (v *Context) DeallocMW(h uint32) error {
	v.objMu.Lock()
	w, ok := v.mwHandles[h]
	if !ok {
		v.objMu.Unlock()
		return abi.Errorf(abi.CodeNotFound, "handle", "no memory window with handle %d", h)
	}
	delete(v.mwHandles, h)
	idx := mwIndex(w.key.Load())
	v.mws[v.mwKeys.slot(idx)].Store(nil)
	v.mwKeys.put(idx)
	v.unbindLocked(w)
	w.pd.refs--
	v.objMu.Unlock()
	v.lockMem() // the barrier: see DeregMR
	v.unlockMem()
	return nil
}

// unbindLocked removes w's binding, if it has one.
//
// +checklocks:v.objMu
func (v *Context) unbindLocked(w *MW) bool {
	old := w.b.Swap(nil)
	if old == nil {
		return false
	}
	if v.mrWindows[old.mr.handle]--; v.mrWindows[old.mr.handle] <= 0 {
		delete(v.mrWindows, old.mr.handle)
	}
	return true
}

// boundWindowsLocked says why region m may not change or go: windows are
// bound to it (IBTA: a region with bound windows is not deregistered).
//
// +checklocks:v.objMu
func (v *Context) boundWindowsLocked(m *MR) error {
	if n := v.mrWindows[m.handle]; n > 0 {
		return abi.Errorf(abi.CodeState, "handle", "MR %d has %d memory windows bound to it: invalidate or deallocate them first (EBUSY)", m.handle, n)
	}
	return nil
}

// lookupMW returns the window whose index key names, or nil. Lock-free:
// data path.
func (v *Context) lookupMW(key uint32) *MW {
	idx := mwIndex(key)
	slot := v.keySlot(idx)
	if int(slot) >= len(v.mws) {
		return nil
	}
	w := v.mws[slot].Load()
	if w == nil || mwIndex(w.key.Load()) != idx {
		return nil
	}
	return w
}

// resolveWindow is resolve for a window's rkey at responder p: the window
// is bound with exactly key, in p's PD, to p if it is of type 2, grants
// need, and covers [addr, addr+n).
func (v *Context) resolveWindow(p *QP, key uint32, addr, n uint64, need abi.Access) ([]byte, bool) {
	w := v.lookupMW(key)
	if w == nil || w.pd != p.pd {
		return nil, false
	}
	b := w.b.Load()
	if b == nil || b.rkey != key || (w.typ == abi.MWType2 && b.qp != p) || b.access&need != need {
		return nil, false
	}
	if addr < b.iova || !sys.InBounds(addr-b.iova, n, b.length) {
		return nil, false
	}
	g := b.mr.addr + (addr - b.mr.iova) // inside the region: bind checked the range
	return v.mem.Bytes()[g : g+n], true
}

// resolveRemote resolves a remote access with key at responder p: a
// region's key in pd (p's, or the XRC SRQ's the request names), or a
// window's rkey (resolveWindow).
func (v *Context) resolveRemote(p *QP, pd *PD, key uint32, addr, n uint64, need abi.Access) ([]byte, bool) {
	if key&abi.MWKeyBit != 0 && n > 0 {
		return v.resolveWindow(p, key, addr, n, need)
	}
	return v.resolve(pd, key, addr, n, need)
}

// ExecLocal executes w, a BIND_MW or LOCAL_INV work request, at q: the
// QP's send-queue goroutine calls it when every work request before it
// has completed, and completes w with the status it returns. Memory
// windows are RC's: on another QP (a ring written by hand) the work
// request fails with LOC_QP_OP_ERR.
func (q *QP) ExecLocal(w *abi.SendWQE) abi.WCStatus {
	if q.typ != abi.QPTypeRC {
		return abi.WCLocQPOpErr
	}
	v := q.vm
	v.objMu.Lock()
	var st abi.WCStatus
	var barrier bool
	if w.Opcode == abi.OpBindMW {
		st, barrier = q.bindLocked(w.BindMW())
	} else {
		st, barrier = q.invalidateLocked(w.InvalidateRKey())
	}
	v.objMu.Unlock()
	if barrier {
		v.lockMem() // the barrier: no path uses the old binding once w completes
		v.unlockMem()
	}
	return st
}

// bindLocked binds a window as b says, from QP q, checking what IBTA's
// bind checks: the window and the region are of q's PD, the new rkey
// keeps the window's index, a type 2 window is not bound already, the
// region allows binds and holds the range, and the rights are remote
// ones, write and atomic only over a region with local write. It reports
// the status, and whether a binding was replaced (the caller's barrier).
//
// +checklocks:q.vm.objMu
func (q *QP) bindLocked(b abi.MWBind) (abi.WCStatus, bool) {
	v := q.vm
	w, ok := v.mwHandles[b.MW]
	switch {
	case !ok:
		return q.bindRefused(b.MW, "no such window"), false
	case w.pd != q.pd:
		return q.bindRefused(b.MW, "it is of another PD than the QP's"), false
	case mwIndex(b.RKey) != mwIndex(w.key.Load()) || b.RKey&abi.MWKeyBit == 0:
		return q.bindRefused(b.MW, "rkey 0x%x is not of the window (0x%x): only its low 8 bits may change", b.RKey, w.key.Load()), false
	case w.typ == abi.MWType2 && w.b.Load() != nil:
		return q.bindRefused(b.MW, "a type 2 window is bound already: invalidate it first"), false
	case b.Access&^(abi.AccessRemote|abi.AccessLocalWrite) != 0:
		return q.bindRefused(b.MW, "access %s: a window grants remote write, read and atomic only", b.Access), false
	}
	if b.Length == 0 {
		if w.typ == abi.MWType2 {
			return q.bindRefused(b.MW, "a type 2 window is bound to a range of at least 1 byte"), false
		}
		w.key.Store(b.RKey)
		return abi.WCSuccess, v.unbindLocked(w) // type 1: unbound, its old rkey invalid
	}
	m := v.lookupMR(b.MRKey)
	switch {
	case m == nil || m.pd != q.pd:
		return q.bindRefused(b.MW, "lkey 0x%x is no region of the QP's PD", b.MRKey), false
	case m.access&abi.AccessMWBind == 0:
		return q.bindRefused(b.MW, "region %d was registered without MW_BIND", m.handle), false
	case b.Addr < m.iova || !sys.InBounds(b.Addr-m.iova, b.Length, m.length):
		return q.bindRefused(b.MW, "range [0x%x,+%d) is not inside region %d", b.Addr, b.Length, m.handle), false
	case b.Access&(abi.AccessRemoteWrite|abi.AccessRemoteAtomic) != 0 && m.access&abi.AccessLocalWrite == 0:
		return q.bindRefused(b.MW, "remote write and atomic need a region with local write"), false
	}
	nb := &mwBinding{rkey: b.RKey, mr: m, iova: b.Addr, length: b.Length, access: b.Access & abi.AccessRemote}
	if w.typ == abi.MWType2 {
		nb.qp = q
	}
	replaced := v.unbindLocked(w)
	v.mrWindows[m.handle]++
	w.key.Store(b.RKey)
	w.b.Store(nb)
	return abi.WCSuccess, replaced
}

// invalidateLocked invalidates, for a LOCAL_INV of q, the type 2 window
// whose rkey is key: a window of q's PD bound with exactly that rkey. A
// failure (LOC_PROT_ERR) changes nothing. It reports whether a binding
// went (the caller's barrier).
//
// +checklocks:q.vm.objMu
func (q *QP) invalidateLocked(key uint32) (abi.WCStatus, bool) {
	const bad = abi.WCLocProtErr
	v := q.vm
	w := v.lookupMW(key)
	if key&abi.MWKeyBit == 0 || w == nil || w.pd != q.pd || w.typ != abi.MWType2 {
		q.noteMW(fmt.Sprintf("invalidation of rkey 0x%x refused: it is no type 2 memory window of the QP's PD (a region or a type 1 window is not invalidated)", key))
		return bad, false
	}
	b := w.b.Load()
	if b == nil || b.rkey != key {
		q.noteMW(fmt.Sprintf("invalidation of rkey 0x%x refused: the window is not bound with that rkey", key))
		return bad, false
	}
	return abi.WCSuccess, v.unbindLocked(w)
}

// checkInvalidate is Begin's check of a SEND with invalidate's rkey at p:
// it names a type 2 window of p's PD that p bound with that rkey, or whose
// last bind had that rkey and which is invalidated already (a message
// that ended in RNR and comes again invalidated it the first time).
func (p *QP) checkInvalidate(key uint32) bool {
	v := p.vm
	w := v.lookupMW(key)
	if key&abi.MWKeyBit == 0 || w == nil || w.pd != p.pd || w.typ != abi.MWType2 {
		return false
	}
	if b := w.b.Load(); b != nil {
		return b.rkey == key && b.qp == p
	}
	return w.key.Load() == key
}

// refuseInvalidate moves p to ERR for a SEND with invalidate from QP src
// whose rkey it may not invalidate.
func (p *QP) refuseInvalidate(src, rkey uint32) {
	p.MoveToErr(fmt.Sprintf("SEND with invalidate from QP 0x%x names rkey 0x%x, no type 2 memory window bound to this QP", src, rkey))
}

// invalidateRemote invalidates the window of a SEND with invalidate that
// ended at p, before its receive completes. A window that is no longer
// bound with the rkey was invalidated by this message already.
func (p *QP) invalidateRemote(key uint32) {
	v := p.vm
	v.objMu.Lock()
	if w := v.lookupMW(key); w != nil {
		if b := w.b.Load(); b != nil && b.rkey == key && b.qp == p {
			v.unbindLocked(w)
		}
	}
	v.objMu.Unlock()
}

// unbindQPLocked invalidates the type 2 windows bound to q, which is
// being destroyed.
//
// +checklocks:v.objMu
func (v *Context) unbindQPLocked(q *QP) {
	for _, w := range v.mwHandles {
		if b := w.b.Load(); b != nil && b.qp == q {
			v.unbindLocked(w)
		}
	}
}

// bindRefused logs why a bind of window mw was refused and returns its
// status, MW_BIND_ERR.
func (q *QP) bindRefused(mw uint32, why string, args ...any) abi.WCStatus {
	q.noteMW(fmt.Sprintf("bind of memory window %d refused: ", mw) + fmt.Sprintf(why, args...))
	return abi.WCMWBindErr
}

// noteMW logs a refused bind or invalidation at debug level: the
// completion's status is what the workload sees.
func (q *QP) noteMW(msg string) {
	q.vm.d.log.Debug(msg, "vm", q.vm.name, "qpn", q.qpn)
}
