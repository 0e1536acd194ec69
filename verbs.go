// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// PD is a protection domain (ibv_pd). Memory regions and QPs of one PD can
// be used together only.
type PD struct {
	ad     *Adapter
	handle uint32
}

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (a *Adapter) AllocPD(ctx context.Context) (*PD, error) {
	var r abi.Handle
	if _, err := a.vm.c.call(ctx, abi.OpAllocPD, &abi.AdapterRef{Adapter: a.name}, &r); err != nil {
		return nil, fmt.Errorf("vrdma: alloc PD on %s: %w", a.name, err)
	}
	return &PD{ad: a, handle: r.Handle}, nil
}

// Dealloc frees the PD (ibv_dealloc_pd); it must hold no MR or QP.
func (pd *PD) Dealloc(ctx context.Context) error {
	_, err := pd.ad.vm.c.call(ctx, abi.OpDeallocPD, &abi.Handle{Handle: pd.handle}, nil)
	return err
}

// Adapter returns the PD's adapter.
func (pd *PD) Adapter() *Adapter { return pd.ad }

// MR is a registered memory region (ibv_mr).
type MR struct {
	pd     *PD
	handle uint32
	buf    []byte
	addr   uint64
	lkey   uint32
	rkey   uint32
	access Access
}

// RegMR registers buf, which must lie in the VM's guest memory (see
// VM.Alloc), with the given access rights (ibv_reg_mr).
func (pd *PD) RegMR(ctx context.Context, buf []byte, access Access) (*MR, error) {
	v := pd.ad.vm
	addr, ok := v.AddrOf(buf)
	if !ok {
		return nil, errorf(abi.CodeInvalid, "vrdma: RegMR: the %d-byte buffer is not inside VM %q's guest memory: allocate it with VM.Alloc or slice VM.Memory", len(buf), v.name)
	}
	var r abi.RegMRReply
	if _, err := v.c.call(ctx, abi.OpRegMR, &abi.RegMR{PD: pd.handle, Addr: addr, Length: uint64(len(buf)), Access: access}, &r); err != nil {
		return nil, fmt.Errorf("vrdma: RegMR: %w", err)
	}
	v.lmrs.Store(r.LKey, &localMR{pd: pd, addr: addr, length: uint64(len(buf)), access: access})
	return &MR{pd: pd, handle: r.Handle, buf: buf, addr: addr, lkey: r.LKey, rkey: r.RKey, access: access}, nil
}

// LKey returns the region's local key.
func (m *MR) LKey() uint32 { return m.lkey }

// RKey returns the region's remote key.
func (m *MR) RKey() uint32 { return m.rkey }

// Addr returns the guest address of the region's first byte.
func (m *MR) Addr() uint64 { return m.addr }

// Bytes returns the region's memory.
func (m *MR) Bytes() []byte { return m.buf }

// SGE returns the scatter/gather element for n bytes at offset off of the
// region.
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: m.addr + uint64(off), Length: uint32(n), LKey: m.lkey}
}

// Dereg deregisters the region (ibv_dereg_mr).
func (m *MR) Dereg(ctx context.Context) error {
	v := m.pd.ad.vm
	v.lmrs.Delete(m.lkey) // memcpy-direct's local checks no longer find it (direct.go)
	_, err := v.c.call(ctx, abi.OpDeregMR, &abi.Handle{Handle: m.handle}, nil)
	if err != nil && !errors.Is(err, ErrAgentGone) {
		v.lmrs.Store(m.lkey, &localMR{pd: m.pd, addr: m.addr, length: uint64(len(m.buf)), access: m.access})
	}
	return err
}

// CQ is a completion queue (ibv_cq) with its completion channel. Poll and
// Wait may be called from several goroutines.
type CQ struct {
	vm     *VM
	handle uint32
	ev     *sys.Bell

	// Resize replaces the ring and its layout.
	mu     sync.Mutex
	layout abi.CQLayout // +checklocks:mu
	ring   *sys.Mapping // +checklocks:mu
	head   uint32       // +checklocks:mu
	cqe    abi.CQE
	// memcpy-direct (direct.go): the local queue, completions taken from
	// the ring ahead of Poll and those the library made itself, older
	// than any left in the ring; and the QPs whose send completions
	// rule 2 counts, by QPN.
	local []WorkCompletion // +checklocks:mu
	lhead int              // +checklocks:mu
	track map[uint32]*QP   // +checklocks:mu
	// chans: the send channels the CQ serves at its polls, as a send
	// or receive CQ (direct_send.go).
	chans []*sendChan // +checklocks:mu
}

// CQOption changes a CreateCQ.
type CQOption func(*abi.CreateCQ)

// CQOverrun makes the CQ overrun when full, as a device's CQ does
// (ibv_create_cq): the completion that finds all its entries taken breaks
// it — EventCQErr on AsyncEvents, its QPs moved to ERR, its completions
// dropped from then on. Without it, a full CQ holds back the work that
// would complete into it until Poll makes room (a full send CQ stalls its
// QPs; a full receive CQ makes senders retry as on RNR). CreateCQ with
// it fails with ErrUnavailable against an agent without capability
// cq-overrun.
func CQOverrun() CQOption { return func(c *abi.CreateCQ) { c.Overrun = true } }

// CreateCQ creates a completion queue of at least cqe entries (ibv_create_cq).
func (a *Adapter) CreateCQ(ctx context.Context, cqe int, opts ...CQOption) (*CQ, error) {
	v := a.vm
	if cqe <= 0 || cqe > abi.MaxCQE {
		return nil, errorf(abi.CodeInvalid, "vrdma: CreateCQ: cqe %d out of range 1..%d (max_cqe)", cqe, abi.MaxCQE)
	}
	req := abi.CreateCQ{Adapter: a.name, CQE: uint32(cqe)}
	for _, o := range opts {
		o(&req)
	}
	if req.Overrun && !v.caps.Has(abi.CapCQOverrun) {
		return nil, errorf(abi.CodeUnavailable, "vrdma: CreateCQ: CQOverrun: the agent does not serve capability cq-overrun (upgrade vrdmad)")
	}
	var r abi.CreateCQReply
	fds, err := v.c.call(ctx, abi.OpCreateCQ, &req, &r)
	if err != nil {
		return nil, fmt.Errorf("vrdma: CreateCQ: %w", err)
	}
	if len(fds) != 2 {
		closeFDs(fds)
		return nil, fmt.Errorf("vrdma: CreateCQ: the agent sent %d descriptors, want 2", len(fds))
	}
	cq := &CQ{vm: v, handle: r.Handle, layout: r.Layout}
	size, err := sys.FileSize(fds[0])
	if err == nil {
		err = r.Layout.Check(size)
	}
	if err == nil {
		cq.ring, err = sys.Map(fds[0], int(r.Layout.Size), true)
	}
	if err == nil {
		cq.ev, err = sys.BellFrom(fds[1])
	}
	if err != nil {
		if cq.ring != nil {
			cq.ring.Unmap()
		}
		closeFDs(fds)
		v.c.call(ctx, abi.OpDestroyCQ, &abi.Handle{Handle: r.Handle}, nil)
		return nil, fmt.Errorf("vrdma: CreateCQ: %w", err)
	}
	sys.CloseFD(fds[0])
	v.objMu.Lock()
	v.cqs[cq] = struct{}{}
	v.objMu.Unlock()
	return cq, nil
}

// Entries returns the number of completions the CQ holds.
func (cq *CQ) Entries() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return int(cq.layout.Entries)
}

// ErrBrokenRing is returned by Poll when the CQ's tail word holds no index
// the agent writes: not an index of the ring, or more than its entries
// ahead of the CQ's head. The ring is not read; as C's ibv_poll_cq returns
// EIO, the CQ is unusable.
var ErrBrokenRing = errors.New("vrdma: the completion queue's tail is not a valid ring index: the ring is broken")

// Poll moves up to len(wc) completions into wc and returns how many
// (ibv_poll_cq). It does not allocate or block. Once the agent is gone and
// the CQ is empty it returns ErrAgentGone; a tail word that is not a valid
// index (wire-local.md §5.1) gives ErrBrokenRing, and no completion.
func (cq *CQ) Poll(wc []WorkCompletion) (int, error) {
	cq.mu.Lock()
	mem := cq.ring.Bytes()
	size := cq.layout.Entries
	tail := abi.Word(mem, abi.OffCQTail).Load()
	if _, ok := abi.Pending(tail, cq.head, size); !ok {
		cq.mu.Unlock()
		return 0, ErrBrokenRing
	}
	after := len(cq.chans) != 0 && cq.chanPollLocked() // the send channels' completions (direct_send.go)
	if after || len(cq.chans) != 0 {
		// A taken message moved the ring's completions ahead of it.
		if tail = abi.Word(mem, abi.OffCQTail).Load(); !validPending(tail, cq.head, size) {
			tail = cq.head
		}
	}
	n := 0
	for n < len(wc) && cq.localLen() > 0 {
		wc[n] = cq.popLocal() // older than the ring's (direct.go)
		n++
	}
	ringFrom := n
	for n < len(wc) && cq.head != tail {
		off := cq.layout.Offset + abi.Slot(cq.head, size)*abi.CQESize
		abi.DecodeCQE(mem[off:off+abi.CQESize], &cq.cqe)
		e := &cq.cqe
		cq.countLocked(e)
		wc[n] = WorkCompletion{WRID: e.WRID, Status: e.Status, Opcode: e.Opcode, Flags: e.Flags, ByteLen: e.ByteLen,
			Imm: e.Imm, QPNum: e.QPNum, SrcQP: e.SrcQP}
		n++
		cq.head = abi.Next(cq.head, size)
	}
	if n > ringFrom {
		abi.Word(mem, abi.OffCQHead).Store(cq.head)
	}
	cq.mu.Unlock()
	if after {
		cq.chanAfter()
	}
	if n == 0 && cq.vm.c.dead.Load() {
		return 0, ErrAgentGone
	}
	return n, nil
}

// validPending reports whether tail is a valid index at most size ahead
// of head.
func validPending(tail, head, size uint32) bool {
	_, ok := abi.Pending(tail, head, size)
	return ok
}

func (cq *CQ) empty() bool {
	cq.mu.Lock()
	after := len(cq.chans) != 0 && cq.chanPollLocked() // direct_send.go
	e := cq.localLen() == 0 && abi.Word(cq.ring.Bytes(), abi.OffCQTail).Load() == cq.head
	cq.mu.Unlock()
	if after {
		cq.chanAfter()
	}
	return e
}

// trackQP adds q to (or removes it from) the QPs whose send completions
// the CQ counts for the memcpy-direct path's rule 2 (direct.go).
func (cq *CQ) trackQP(q *QP, on bool) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if !on {
		if cq.track[q.qpn] == q {
			delete(cq.track, q.qpn)
		}
		return
	}
	if cq.track == nil {
		cq.track = map[uint32]*QP{}
	}
	cq.track[q.qpn] = q
}

// Wait blocks until the CQ holds a completion, ctx ends, or the agent goes
// away. It arms the completion channel (ibv_req_notify_cq) and sleeps on it
// (ibv_get_cq_event), so it costs no CPU while waiting.
func (cq *CQ) Wait(ctx context.Context) error {
	for {
		if !cq.empty() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if cq.vm.c.dead.Load() {
			return ErrAgentGone
		}
		if cq.arm(abi.ArmAll) {
			continue // a send channel's message came meanwhile: take it (direct_send.go)
		}
		if !cq.empty() {
			return nil
		}
		stop := context.AfterFunc(ctx, func() { cq.ev.Wake() })
		var bound *time.Timer
		if d := cq.waitBound(); d > 0 {
			bound = time.AfterFunc(d, cq.ev.Wake) // a channel's message may have to be relayed (direct_send.go)
		}
		err := cq.ev.Wait()
		stop()
		if bound != nil {
			bound.Stop()
		}
		if errors.Is(err, io.EOF) {
			return ErrAgentGone // the agent closed its end of the CQ's event socket
		}
		if err != nil {
			return fmt.Errorf("vrdma: wait on CQ: %w", err)
		}
	}
}

// Destroy destroys the CQ (ibv_destroy_cq); no QP may use it.
func (cq *CQ) Destroy(ctx context.Context) error {
	v := cq.vm
	if _, err := v.c.call(ctx, abi.OpDestroyCQ, &abi.Handle{Handle: cq.handle}, nil); err != nil && !errors.Is(err, ErrAgentGone) {
		return err
	}
	v.objMu.Lock()
	delete(v.cqs, cq)
	v.objMu.Unlock()
	cq.ev.Wake()
	cq.mu.Lock()
	cq.ring.Unmap()
	cq.mu.Unlock()
	cq.ev.Close()
	return nil
}

// arm stores how (abi.ArmAll, abi.ArmSolicited) in the CQ's armed word,
// fenced: §6 pair 2, before the caller's next load of the tail; and the
// send channels' armed words (direct_send.go). It reports whether a
// channel's message came before they could be seen.
func (cq *CQ) arm(how uint32) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	abi.StoreFenced(abi.Word(cq.ring.Bytes(), abi.OffCQArmed), how)
	return len(cq.chans) != 0 && cq.armChans(how)
}
