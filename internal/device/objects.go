// SPDX-License-Identifier: Apache-2.0

package device

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/sys"
)

// newRing creates what every queue object shares with its workload: a
// sealed memfd of size bytes for its rings, mapped here, and a doorbell
// socketpair.
func newRing(name string, size uint32) (sys.FD, *sys.Mapping, *sys.Bell, error) {
	fd, ring, err := newRingFile(name, size)
	if err != nil {
		return sys.FD{}, nil, nil, err
	}
	bell, err := sys.NewBellPair()
	if err != nil {
		ring.Unmap()
		fd.Close()
		return sys.FD{}, nil, nil, abi.Errorf(abi.CodeInternal, "", "%v", err)
	}
	return fd, ring, bell, nil
}

// newRingFile creates a sealed memfd of size bytes and maps it here.
func newRingFile(name string, size uint32) (sys.FD, *sys.Mapping, error) {
	fd, err := sys.Memfd(name, int64(size))
	if err != nil {
		return sys.FD{}, nil, abi.Errorf(abi.CodeInternal, "", "%v", err)
	}
	ring, err := sys.Map(fd.Int(), int(size), true)
	if err != nil {
		fd.Close()
		return sys.FD{}, nil, abi.Errorf(abi.CodeInternal, "", "%v", err)
	}
	return fd, ring, nil
}

// PD is a protection domain.
type PD struct {
	handle uint32
	ad     *Adapter
	refs   int // MRs and QPs in it; guarded by ad.vm.objMu
}

// MR is a registered memory region. Immutable once published.
type MR struct {
	handle uint32
	key    uint32 // lkey == rkey
	pd     *PD
	addr   uint64 // guest address of the first byte
	iova   uint64 // the first byte's address in SGEs and remote addresses
	length uint64
	access abi.Access
}

// AllocPD allocates a protection domain on adapter adName and returns its handle.
func (v *Context) AllocPD(adName string) (uint32, error) {
	ad, err := v.Adapter(adName)
	if err != nil {
		return 0, err
	}
	v.objMu.Lock()
	defer v.objMu.Unlock()
	if len(v.pds) >= v.d.cfg.Limits.MaxPD {
		return 0, abi.Errorf(abi.CodeLimit, "", "VM %q has %d PDs, the limit (max_pd): deallocate some first", v.name, len(v.pds))
	}
	p := &PD{handle: v.allocHandleLocked(), ad: ad}
	v.pds[p.handle] = p
	return p.handle, nil
}

// DeallocPD frees protection domain h; one still used by an MR or a QP is refused.
func (v *Context) DeallocPD(h uint32) error {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	p, ok := v.pds[h]
	if !ok {
		return abi.Errorf(abi.CodeNotFound, "handle", "no PD with handle %d", h)
	}
	if p.refs > 0 {
		return abi.Errorf(abi.CodeState, "handle", "PD %d still holds %d MRs or QPs: destroy them first (EBUSY)", h, p.refs)
	}
	delete(v.pds, h)
	return nil
}

// RegMR registers a memory region of guest memory, checked against the VM's memory.
func (v *Context) RegMR(r *abi.RegMR) (abi.RegMRReply, error) {
	if r.Length == 0 {
		return abi.RegMRReply{}, abi.Errorf(abi.CodeInvalid, "length", "a memory region must be at least 1 byte")
	}
	if err := v.inGuest(r.Addr, r.Length); err != nil {
		return abi.RegMRReply{}, err
	}
	ps := v.procs
	ps.memMu.Lock()
	defer ps.memMu.Unlock()
	others, n := v.othersRegistered()
	v.objMu.Lock()
	defer v.objMu.Unlock()
	p, ok := v.pds[r.PD]
	if !ok {
		return abi.RegMRReply{}, abi.Errorf(abi.CodeNotFound, "pd", "no PD with handle %d", r.PD)
	}
	if err := v.fitsMemSizeLocked(others, n, r.Addr, r.Length); err != nil {
		return abi.RegMRReply{}, err
	}
	if err := v.chargeVM(vmCharge{mrs: 1}); err != nil {
		return abi.RegMRReply{}, err
	}
	if err := v.chargeUser(quota.RegisteredMemory, r.Length); err != nil {
		v.refundVM(vmCharge{mrs: 1})
		return abi.RegMRReply{}, err
	}
	key, ok := v.newKeyLocked() // keys.go
	if !ok {
		v.refundUser(quota.RegisteredMemory, r.Length)
		v.refundVM(vmCharge{mrs: 1})
		return abi.RegMRReply{}, abi.Errorf(abi.CodeLimit, "", "VM %q has %d memory regions, the limit (max_mr): deregister some first", v.name, len(v.mrs))
	}
	iova := r.Addr
	if r.IOVA != nil {
		iova = *r.IOVA
	}
	m := &MR{handle: v.allocHandleLocked(), key: key, pd: p, addr: r.Addr, iova: iova, length: r.Length, access: r.Access}
	p.refs++
	v.mrHandles[m.handle] = m
	v.mrs[v.keySlot(key)].Store(m)
	return abi.RegMRReply{Handle: m.handle, LKey: m.key, RKey: m.key}, nil
}

// inGuest checks that [addr, addr+n) lies in the VM's guest memory.
func (v *Context) inGuest(addr, n uint64) error {
	if !sys.InBounds(addr, n, v.memSize) {
		return abi.Errorf(abi.CodeInvalid, "addr", "region [0x%x, +%d) lies outside the VM's %d bytes of guest memory", addr, n, v.memSize)
	}
	return nil
}

// fitsMemSizeLocked checks that v's regions with [addr, addr+n) as one
// more, and the regions of the VM's other processes (others bytes, in
// procs processes: othersRegistered), stay within the VM's memSize.
//
// +checklocks:v.objMu
func (v *Context) fitsMemSizeLocked(others uint64, procs int, addr, n uint64) error {
	if procs == 0 {
		return nil // v's own regions lie in its memory: inGuest
	}
	if mine := v.registeredLocked(addr, n); others+mine > v.memSize {
		return abi.Errorf(abi.CodeLimit, "length",
			"VM %q's memory regions would cover %d bytes of guest memory, over its memSize (%d bytes): the limit covers all %d of its workloads together (%d bytes in the others'); deregister regions or raise memSize",
			v.name, others+mine, v.memSize, procs+1, others)
	}
	return nil
}

// othersRegistered is how much guest memory the regions of the VM's other
// attached processes cover, and how many they are: the VM's memSize covers
// the regions of all its processes. The caller holds procs.memMu, which
// serialises the registrations of the VM so that two cannot both pass.
func (v *Context) othersRegistered() (others uint64, n int) {
	for _, o := range v.d.Attached(v.name) {
		if o != v {
			o.objMu.Lock()
			others += o.registeredLocked(0, 0)
			o.objMu.Unlock()
			n++
		}
	}
	return others, n
}

// registeredLocked is how much guest memory v's memory regions cover,
// each byte once, with [addr, addr+n) as one more region.
//
// +checklocks:v.objMu
func (v *Context) registeredLocked(addr, n uint64) uint64 {
	rs := make([][2]uint64, 0, len(v.mrHandles)+1)
	for _, m := range v.mrHandles {
		rs = append(rs, [2]uint64{m.addr, m.addr + m.length})
	}
	if n > 0 {
		rs = append(rs, [2]uint64{addr, addr + n})
	}
	slices.SortFunc(rs, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	var total, end uint64
	for _, r := range rs {
		switch {
		case r[0] >= end:
			total += r[1] - r[0]
			end = r[1]
		case r[1] > end:
			total += r[1] - end
			end = r[1]
		}
	}
	return total
}

// DeregMR deregisters memory region h; its keys stop working at once,
// and it returns only once no path can still touch the region's memory
// through them: the workload may reuse that memory at once (the C
// drop-in registers it again). Every user of resolved guest memory holds
// the VM's memMu for reading and resolves again after taking it anew
// (responders at least once per chunk or packet, never across socket
// I/O), so taking memMu for writing once the key is gone waits out the
// last use of the old resolution, and no later one can find it.
func (v *Context) DeregMR(h uint32) error {
	v.objMu.Lock()
	m, ok := v.mrHandles[h]
	if !ok {
		v.objMu.Unlock()
		return abi.Errorf(abi.CodeNotFound, "handle", "no MR with handle %d", h)
	}
	if err := v.boundWindowsLocked(m); err != nil {
		v.objMu.Unlock()
		return err
	}
	delete(v.mrHandles, h)
	v.mrs[v.keySlot(m.key)].Store(nil)
	v.freeKeyLocked(m.key)
	m.pd.refs--
	v.objMu.Unlock()
	// memcpy-direct grants of it: unmapped by their libraries (direct.go).
	v.d.revoke(func(g *grant) bool { return g.mr == m })
	v.lockMem() // the barrier: see above
	v.unlockMem()
	v.refundVM(vmCharge{mrs: 1})
	v.refundUser(quota.RegisteredMemory, m.length)
	return nil
}

// CQ is a completion queue. The agent produces; the library consumes.
type CQ struct {
	handle uint32
	vm     *Context
	ad     *Adapter
	event  *sys.Bell
	// overrun: a full CQ overruns (breaks) rather than holding its
	// producers back (CreateCQ.Overrun).
	overrun bool

	mu sync.Mutex // producer lock: completions come from several QPs' goroutines
	// The ring: replaced by a resize, under mu (coreverbs.go).
	layout abi.CQLayout // +checklocks:mu
	ringFD sys.FD       // +checklocks:mu
	ring   *sys.Mapping // +checklocks:mu
	tail   uint32       // +checklocks:mu
	broken bool         // +checklocks:mu
	// onError, if set, is told once when the CQ breaks (overrun).
	onError atomic.Pointer[func(why string)]
	// gone: released (destroyed), no ring to resize.
	// +checklocks:mu
	gone bool
	refs int // QPs using it; guarded by vm.objMu
}

// CreateCQ creates a completion queue and its ring.
func (v *Context) CreateCQ(c *abi.CreateCQ) (*CQ, error) {
	ad, err := v.Adapter(c.Adapter)
	if err != nil {
		return nil, err
	}
	layout, err := abi.NewCQLayout(c.CQE)
	if err != nil {
		return nil, abi.Errorf(abi.CodeInvalid, "cqe", "%v", err)
	}
	v.objMu.Lock()
	n := len(v.cqs)
	v.objMu.Unlock()
	if n >= v.d.cfg.Limits.MaxCQ {
		return nil, abi.Errorf(abi.CodeLimit, "", "VM %q has %d CQs, the limit (max_cq): destroy some first", v.name, n)
	}
	if err := v.chargeQueue(cqCharge(layout), layout.Size); err != nil {
		return nil, err
	}
	fd, ring, ev, err := newRing("vrdma-cq", layout.Size)
	if err != nil {
		v.refundQueue(cqCharge(layout), layout.Size)
		return nil, err
	}
	c2 := &CQ{vm: v, ad: ad, layout: layout, ringFD: fd, ring: ring, event: ev, overrun: c.Overrun}
	v.objMu.Lock()
	c2.handle = v.allocHandleLocked()
	v.cqs[c2.handle] = c2
	v.objMu.Unlock()
	return c2, nil
}

// DestroyCQ destroys completion queue h; one still used by a QP is refused.
func (v *Context) DestroyCQ(h uint32) error {
	v.objMu.Lock()
	c, ok := v.cqs[h]
	if ok && c.refs > 0 {
		refs := c.refs
		v.objMu.Unlock()
		return abi.Errorf(abi.CodeState, "handle", "CQ %d is still used by %d QPs: destroy them first (EBUSY)", h, refs)
	}
	delete(v.cqs, h)
	v.objMu.Unlock()
	if !ok {
		return abi.Errorf(abi.CodeNotFound, "handle", "no CQ with handle %d", h)
	}
	v.lockMem()
	l := c.release()
	v.unlockMem()
	v.refundQueue(cqCharge(l), l.Size)
	return nil
}

// release unmaps and closes the CQ, and returns its ring's layout (what
// to refund). The caller holds vm.memMu.
func (c *CQ) release() abi.CQLayout {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = true
	c.ring.Unmap()
	c.ringFD.Close()
	c.event.Close()
	return c.layout
}

// tryPushRecv writes the completion of the receive WQE at rq's RQ head
// and consumes that WQE — freeing its slot before the completion is
// visible — if the CQ has room. It never waits: a completion for another
// VM's QP comes from the sender's goroutine, which must not stall behind a
// receiver that does not poll. The caller holds rq.rqMu and keeps the VM
// mapped. It reports false when the CQ is full (the sender treats that as
// receiver-not-ready) or broken.
//
// +checklocks:rq.rqMu
func (c *CQ) tryPushRecv(e *abi.CQE, rq *QP, se bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	mem := c.ring.Bytes()
	size := c.layout.Entries
	if c.broken {
		return false
	}
	head := abi.Word(mem, abi.OffCQHead).Load()
	n, ok := abi.Pending(c.tail, head, size)
	if !ok {
		c.breakLocked(head)
		return false
	}
	if n >= size {
		if c.overrun {
			c.overflowLocked()
			return false
		}
		c.event.Ring() // wake a consumer that waits: it has work
		return false
	}
	rq.consumeRecvLocked()
	c.publishLocked(e, se)
	return true
}

// breakLocked marks the CQ broken: its consumer index head is no index of
// its ring, or says it holds more than it can — an overrun, which hardware
// reports as IBV_EVENT_CQ_ERR. Its completions are dropped from now on;
// every QP completing into it moves to ERR and onError hears of it, on a
// goroutine of their own (the caller holds the CQ's lock, and may hold a
// QP's receive lock).
//
// +checklocks:c.mu
func (c *CQ) breakLocked(head uint32) {
	why := fmt.Sprintf("CQ %d overran: its consumer index %d is not within its %d entries behind the agent's %d (the workload wrote garbage)",
		c.handle, head, c.layout.Entries, c.tail)
	c.vm.d.log.Warn("CQ consumer index is invalid: the workload wrote garbage; completions on this CQ are dropped and its QPs moved to ERR",
		"vm", c.vm.name, "cq", c.handle, "head", head, "tail", c.tail, "size", c.layout.Entries)
	c.brokenLocked(why)
}

// overflowLocked breaks a CQ made to overrun (CreateCQ.Overrun) that a
// completion found full, as a device's CQ overruns: the consumer did not
// poll in time.
//
// +checklocks:c.mu
func (c *CQ) overflowLocked() {
	why := fmt.Sprintf("CQ %d overran: a completion found all its %d entries taken (poll it sooner, or make it larger: ibv_resize_cq)",
		c.handle, c.layout.Entries)
	c.vm.d.log.Info("CQ overran: completions on this CQ are dropped and its QPs moved to ERR",
		"vm", c.vm.name, "cq", c.handle, "size", c.layout.Entries)
	c.brokenLocked(why)
}

// brokenLocked marks the CQ broken for why and fails its QPs.
//
// +checklocks:c.mu
func (c *CQ) brokenLocked(why string) {
	c.broken = true
	go c.fail(why)
}

// fail moves the QPs that complete into c to ERR, then tells onError.
func (c *CQ) fail(why string) {
	v := c.vm
	v.objMu.Lock()
	var qs []*QP
	for _, q := range v.qps {
		if q.sendCQ == c || q.recvCQ == c {
			qs = append(qs, q)
		}
	}
	v.objMu.Unlock()
	for _, q := range qs {
		q.MoveToErr(why)
	}
	if f := c.onError.Load(); f != nil {
		(*f)(why)
	}
}

// SetOnError sets the function told, once, when the CQ overruns (nil:
// none).
func (c *CQ) SetOnError(f func(why string)) {
	if f == nil {
		c.onError.Store(nil)
		return
	}
	c.onError.Store(&f)
}

// Handle is the CQ's handle in its session.
func (c *CQ) Handle() uint32 { return c.handle }

// Adapter is the adapter the CQ was created on.
func (c *CQ) Adapter() *Adapter { return c.ad }

// consumeRecvLocked consumes the receive WQE q's message took: the one
// at its RQ head, or the one it holds of its SRQ.
//
// +checklocks:q.rqMu
func (q *QP) consumeRecvLocked() {
	q.rqSeq++
	if q.sharedRQ() {
		q.srqHeld = false
		q.releaseXSRQLocked()
		return
	}
	q.rqHead = abi.Next(q.rqHead, q.layout.RQEntries)
	abi.Word(q.ring.Bytes(), abi.OffRQHead).Store(q.rqHead)
}

// publishLocked writes e at the tail, which has room, and signals an armed
// consumer: one armed for every completion (abi.ArmAll), or one armed for
// solicited completions only (abi.ArmSolicited) when se (the message
// carried the solicited-event bit) or e is an error completion, as IBTA
// and ibv_req_notify_cq(cq, 1) say. The caller holds mu.
//
// +checklocks:c.mu
func (c *CQ) publishLocked(e *abi.CQE, se bool) {
	mem := c.ring.Bytes()
	size := c.layout.Entries
	slot := mem[c.layout.Offset+abi.Slot(c.tail, size)*abi.CQESize:][:abi.CQESize]
	abi.EncodeCQE(slot, e)
	c.tail = abi.Next(c.tail, size)
	abi.StoreFenced(abi.Word(mem, abi.OffCQTail), c.tail) // §6 pair 2: before armed's load
	armed := abi.Word(mem, abi.OffCQArmed)
	switch armed.Load() {
	case abi.ArmAll:
		if armed.CompareAndSwap(abi.ArmAll, 0) {
			c.event.Ring()
		}
	case abi.ArmSolicited:
		if (se || e.Status != abi.WCSuccess) && armed.CompareAndSwap(abi.ArmSolicited, 0) {
			c.event.Ring()
		}
	}
}

// push writes one completion. If the CQ is full it overruns (a CQ made
// with CreateCQ.Overrun), or else waits for the consumer unless the VM is
// going away or one of the abort flags is set (the pushing QP stops, or the QP the completion is for
// is destroyed). It reports false when the completion could not be
// delivered: the CQ is broken (its consumer index is garbage, or it
// overran), or waiting
// was abandoned. The caller keeps the VM's mappings alive (holds memMu for
// reading, or is that VM's own QP goroutine).
func (c *CQ) push(e *abi.CQE, abort1, abort2 *atomic.Bool) bool {
	for wait := time.Duration(0); ; {
		done, full := c.offer(e)
		if !full {
			return done
		}
		if c.vm.dying.Load() || abort1.Load() || abort2.Load() {
			return false
		}
		c.event.Ring() // full: wake a waiting consumer, then back off
		wait = backOff(wait)
	}
}

// offer writes one completion if the CQ has room, without waiting: done
// when it was written; full when the CQ had no room and waits for its
// consumer (a CQ made with CreateCQ.Overrun overruns instead: neither).
// The caller keeps the CQ's VM mapped.
func (c *CQ) offer(e *abi.CQE) (done, full bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	mem := c.ring.Bytes()
	size := c.layout.Entries
	if c.broken {
		return false, false
	}
	head := abi.Word(mem, abi.OffCQHead).Load()
	n, ok := abi.Pending(c.tail, head, size)
	switch {
	case !ok:
		c.breakLocked(head)
		return false, false
	case n < size:
		c.publishLocked(e, false)
		return true, false
	case c.overrun:
		c.overflowLocked()
		return false, false
	}
	return false, true
}

// backOff sleeps before the next offer to a full CQ: twice the last
// wait, from 20 µs up to 2 ms; it returns the wait.
func backOff(wait time.Duration) time.Duration {
	wait = min(max(wait*2, 20*time.Microsecond), 2*time.Millisecond)
	time.Sleep(wait)
	return wait
}

// Reply is the answer to the workload's create or resize, with the
// descriptors of the CQ's ring and event channel to pass along.
func (c *CQ) Reply() (abi.CreateCQReply, []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return abi.CreateCQReply{Handle: c.handle, Layout: c.layout}, []int{c.ringFD.Int(), c.event.PeerFD()}
}
