// SPDX-License-Identifier: Apache-2.0

package device

// ibv_rereg_mr and ibv_resize_cq (capability core-verbs).

import (
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/sys"
)

// ReregMR changes memory region r.Handle in place: its translation (guest
// address, length, iova), its PD and its access, as r.Flags says. The
// region keeps its handle and keys, as a provider may keep them
// (ibv_rereg_mr(3)). The new definition replaces the old at once for every
// path (a lookup finds one or the other, never a mix), and ReregMR returns
// only once no path can still touch memory through the old one — the same
// barrier as DeregMR — so that a request that began before it completes
// against the old definition and one after it against the new. A failed
// rereg changes nothing.
func (v *Context) ReregMR(r *abi.ReregMR) (abi.RegMRReply, error) {
	rep, old, err := v.reregMR(r)
	if old != nil {
		v.d.revoke(func(g *grant) bool { return g.mr == old }) // memcpy-direct grants of the old definition (direct.go)
	}
	return rep, err
}

func (v *Context) reregMR(r *abi.ReregMR) (abi.RegMRReply, *MR, error) {
	if r.Flags&abi.ReregTranslation != 0 {
		if err := v.inGuest(r.Addr, r.Length); err != nil {
			return abi.RegMRReply{}, nil, err
		}
	}
	ps := v.procs
	ps.memMu.Lock()
	defer ps.memMu.Unlock()
	others, n := v.othersRegistered()
	v.objMu.Lock()
	m, ok := v.mrHandles[r.Handle]
	if !ok {
		v.objMu.Unlock()
		return abi.RegMRReply{}, nil, abi.Errorf(abi.CodeNotFound, "handle", "no MR with handle %d", r.Handle)
	}
	if err := v.boundWindowsLocked(m); err != nil {
		v.objMu.Unlock()
		return abi.RegMRReply{}, nil, err
	}
	nm := *m
	if r.Flags&abi.ReregPD != 0 {
		p, ok := v.pds[r.PD]
		if !ok {
			v.objMu.Unlock()
			return abi.RegMRReply{}, nil, abi.Errorf(abi.CodeNotFound, "pd", "no PD with handle %d", r.PD)
		}
		nm.pd = p
	}
	if r.Flags&abi.ReregAccess != 0 {
		nm.access = r.Access
	}
	if r.Flags&abi.ReregTranslation != 0 {
		nm.addr, nm.length, nm.iova = r.Addr, r.Length, r.IOVA
		delete(v.mrHandles, m.handle) // count the new range instead of the old
		err := v.fitsMemSizeLocked(others, n, nm.addr, nm.length)
		v.mrHandles[m.handle] = m
		if err != nil {
			v.objMu.Unlock()
			return abi.RegMRReply{}, nil, err
		}
		if nm.length > m.length {
			if err := v.chargeUser(quota.RegisteredMemory, nm.length-m.length); err != nil {
				v.objMu.Unlock()
				return abi.RegMRReply{}, nil, err
			}
		} else {
			v.refundUser(quota.RegisteredMemory, m.length-nm.length)
		}
	}
	m.pd.refs--
	nm.pd.refs++
	v.mrHandles[m.handle] = &nm
	v.mrs[v.keySlot(m.key)].Store(&nm)
	v.objMu.Unlock()
	v.lockMem() // the barrier: see DeregMR
	v.unlockMem()
	return abi.RegMRReply{Handle: nm.handle, LKey: nm.key, RKey: nm.key}, m, nil
}

// ResizeCQ gives completion queue r.Handle a ring of at least r.CQE
// entries. Under the producer lock it copies the completions the workload
// has not consumed yet, in order, to the new ring's first slots, and
// swaps the rings: a completion is produced into the old ring before the
// swap or the new one after it, never lost and never twice. A size below
// the completions waiting is refused, as ibv_resize_cq(3) says. The reply
// carries the new ring's layout and its memfd, the only descriptor (the
// event socket stays).
func (v *Context) ResizeCQ(r *abi.ResizeCQ) (abi.CreateCQReply, []int, error) {
	v.objMu.Lock()
	c, ok := v.cqs[r.Handle]
	v.objMu.Unlock()
	if !ok {
		return abi.CreateCQReply{}, nil, abi.Errorf(abi.CodeNotFound, "handle", "no CQ with handle %d", r.Handle)
	}
	layout, err := abi.NewCQLayout(r.CQE)
	if err != nil {
		return abi.CreateCQReply{}, nil, abi.Errorf(abi.CodeInvalid, "cqe", "%v", err)
	}
	charge := vmCharge{cqe: uint64(layout.Entries)}
	if err := v.chargeQueue(charge, layout.Size); err != nil {
		return abi.CreateCQReply{}, nil, err
	}
	v.settleSenders(c)
	fd, ring, err := newRingFile("vrdma-cq", layout.Size)
	if err != nil {
		v.refundQueue(charge, layout.Size)
		return abi.CreateCQReply{}, nil, err
	}
	old, err := c.swapRing(layout, fd, ring)
	if err != nil {
		ring.Unmap()
		fd.Close()
		v.refundQueue(charge, layout.Size)
		return abi.CreateCQReply{}, nil, err
	}
	v.refundQueue(vmCharge{cqe: uint64(old.Entries)}, old.Size)
	return abi.CreateCQReply{Handle: c.handle, Layout: layout}, []int{fd.Int()}, nil
}

// settleTime bounds how long a resize waits for the send queues feeding
// its CQ (settleSenders).
const settleTime = 100 * time.Millisecond

// settleSenders waits, for at most settleTime, until every QP whose send
// CQ is c has completed what its workload posted before the resize: a
// device works through posted WQEs at once, and a program that posts and
// then resizes (rdma-core's test_resize_cq) counts their completions as
// waiting. A QP waiting on its peer (RNR, a lost packet) or in ERR with a
// garbage tail may hold the resize up to the bound, not longer.
func (v *Context) settleSenders(c *CQ) {
	for end := time.Now().Add(settleTime); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
		if v.sendersSettled(c) {
			return
		}
	}
}

// sendersSettled reports whether every QP of v whose send CQ is c has
// completed every WQE its SQ tail covers.
func (v *Context) sendersSettled(c *CQ) bool {
	v.memMu.RLock() // the QPs' rings stay mapped
	defer v.memMu.RUnlock()
	v.objMu.Lock()
	defer v.objMu.Unlock()
	for _, q := range v.qps {
		if q.sendCQ == c && abi.Word(q.ring.Bytes(), abi.OffSQTail).Load() != q.sqCompleted.Load() {
			return false
		}
	}
	return true
}

// swapRing moves c's waiting completions into ring (of layout, memfd fd)
// and makes it c's ring, releasing the old one, whose layout it returns.
func (c *CQ) swapRing(layout abi.CQLayout, fd sys.FD, ring *sys.Mapping) (abi.CQLayout, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return abi.CQLayout{}, abi.Errorf(abi.CodeNotFound, "handle", "CQ %d was destroyed", c.handle)
	}
	if c.broken {
		return abi.CQLayout{}, abi.Errorf(abi.CodeInvalid, "handle", "CQ %d's consumer index was garbage: it is broken, destroy it", c.handle)
	}
	src, dst := c.ring.Bytes(), ring.Bytes()
	size := c.layout.Entries
	head := abi.Word(src, abi.OffCQHead).Load()
	n, ok := abi.Pending(c.tail, head, size)
	if !ok {
		return abi.CQLayout{}, abi.Errorf(abi.CodeInvalid, "handle", "CQ %d's consumer index %d is not an index of its %d-entry ring", c.handle, head, size)
	}
	if n > layout.Entries {
		return abi.CQLayout{}, abi.Errorf(abi.CodeInvalid, "cqe", "CQ %d holds %d completions not yet polled, more than %d entries: poll them first", c.handle, n, layout.Entries)
	}
	for i, idx := uint32(0), head; i < n; i, idx = i+1, abi.Next(idx, size) {
		from := c.layout.Offset + abi.Slot(idx, size)*abi.CQESize
		to := layout.Offset + i*abi.CQESize
		copy(dst[to:to+abi.CQESize], src[from:from+abi.CQESize])
	}
	abi.Word(dst, abi.OffCQTail).Store(n)
	abi.Word(dst, abi.OffCQArmed).Store(abi.Word(src, abi.OffCQArmed).Load())
	old := c.layout
	c.ring.Unmap()
	c.ringFD.Close()
	c.layout, c.ringFD, c.ring, c.tail = layout, fd, ring, n
	return old, nil
}
