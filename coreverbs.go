// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// ReregFlags say what MR.Rereg changes (IBV_REREG_MR_CHANGE_*).
type ReregFlags = abi.ReregFlags

// Rereg flags.
const (
	ReregTranslation = abi.ReregTranslation // the region's memory (buf)
	ReregPD          = abi.ReregPD          // its protection domain
	ReregAccess      = abi.ReregAccess      // its access rights
)

// Rereg changes the region in place (ibv_rereg_mr): with ReregTranslation
// it covers buf instead (which must lie in the VM's guest memory, as for
// RegMR), with ReregPD it moves to pd, with ReregAccess it gets access;
// what flags does not name stays (buf, pd and access are then ignored).
// The keys stay. Once Rereg returns, no peer can reach memory through the
// old definition (a request that began before completes against it); one
// that fails changes nothing. Needs an agent with capability core-verbs.
func (m *MR) Rereg(ctx context.Context, flags ReregFlags, pd *PD, buf []byte, access Access) error {
	v := m.pd.ad.vm
	r := abi.ReregMR{Handle: m.handle, Flags: flags}
	var addr uint64
	if flags&ReregTranslation != 0 {
		var ok bool
		if addr, ok = v.AddrOf(buf); !ok || len(buf) == 0 {
			return errorf(abi.CodeInvalid, "vrdma: Rereg: the %d-byte buffer is not inside VM %q's guest memory: allocate it with VM.Alloc or slice VM.Memory", len(buf), v.name)
		}
		r.Addr, r.Length, r.IOVA = addr, uint64(len(buf)), addr
	}
	if flags&ReregPD != 0 {
		if pd == nil || pd.ad.vm != v {
			return errorf(abi.CodeInvalid, "vrdma: Rereg: CHANGE_PD needs a PD of the region's VM")
		}
		r.PD = pd.handle
	}
	if flags&ReregAccess != 0 {
		r.Access = access
	}
	if _, err := v.c.call(ctx, abi.OpReregMR, &r, nil); err != nil {
		return fmt.Errorf("vrdma: Rereg: %w", err)
	}
	if flags&ReregTranslation != 0 {
		m.buf, m.addr = buf, addr
	}
	if flags&ReregPD != 0 {
		m.pd = pd
	}
	if flags&ReregAccess != 0 {
		m.access = access
	}
	v.setLocal(m.lkey, &localMR{lkey: m.lkey, pd: m.pd, addr: m.addr, length: uint64(len(m.buf)), access: m.access}) // direct.go
	return nil
}

// Resize gives the CQ room for at least cqe completions (ibv_resize_cq),
// larger or smaller; the completions not yet polled stay, in order, and
// none produced meanwhile is lost. A size below the completions waiting is
// refused (ErrInvalid). Needs an agent with capability core-verbs.
func (cq *CQ) Resize(ctx context.Context, cqe int) error {
	if cqe <= 0 || cqe > abi.MaxCQE {
		return errorf(abi.CodeInvalid, "vrdma: Resize: cqe %d out of range 1..%d (max_cqe)", cqe, abi.MaxCQE)
	}
	// Nothing reads the old ring from the agent's swap to ours.
	cq.mu.Lock()
	defer cq.mu.Unlock()
	var r abi.CreateCQReply
	fds, err := cq.vm.c.call(ctx, abi.OpResizeCQ, &abi.ResizeCQ{Handle: cq.handle, CQE: uint32(cqe)}, &r)
	if err != nil {
		return fmt.Errorf("vrdma: Resize: %w", err)
	}
	defer closeFDs(fds)
	if len(fds) != 1 {
		return fmt.Errorf("vrdma: Resize: the agent sent %d descriptors, want 1: the CQ is lost", len(fds))
	}
	size, err := sys.FileSize(fds[0])
	if err == nil {
		err = r.Layout.Check(size)
	}
	var ring *sys.Mapping
	if err == nil {
		ring, err = sys.Map(fds[0], int(r.Layout.Size), true)
	}
	if err != nil {
		return fmt.Errorf("vrdma: Resize: the new ring: %w: the CQ is lost", err)
	}
	cq.ring.Unmap()
	cq.ring, cq.layout, cq.head = ring, r.Layout, 0
	return nil
}

// ReqNotify arms the CQ's event for its next completion
// (ibv_req_notify_cq): with solicitedOnly, for its next receive completion
// of a message the sender posted with SendSolicited, or its next error
// completion, whichever comes first. WaitEvent waits for it. Against an
// agent without capability core-verbs, solicited-only arms for every
// completion, as the C library does. Wait arms for every completion itself: do not mix the
// two on one CQ at the same time.
func (cq *CQ) ReqNotify(solicitedOnly bool) {
	how := abi.ArmAll
	if solicitedOnly && cq.vm.caps.Has(abi.CapCoreVerbs) {
		how = abi.ArmSolicited
	}
	cq.relayWait() // direct_send.go: retracted messages complete before the arming
	if cq.arm(how) {
		cq.raise() // a send channel's message came before the arming was seen (direct_send.go)
	}
}

// WaitEvent blocks until the event ReqNotify armed has come
// (ibv_get_cq_event), ctx ends, or the agent goes away; it returns at once
// when the CQ is not armed. Completions that do not raise the event (the
// others, after ReqNotify(true)) do not end it: poll them meanwhile from
// another goroutine, since a CQ that fills up stops its producers.
func (cq *CQ) WaitEvent(ctx context.Context) error {
	for {
		if cq.armedWord() == 0 {
			return nil // the agent swapped it to 0: the event came
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if cq.vm.c.dead.Load() {
			return ErrAgentGone
		}
		cq.serveChans() // direct_send.go: take and reap, which may raise the event
		if cq.armedWord() == 0 {
			return nil
		}
		stop := context.AfterFunc(ctx, func() { cq.ev.Wake() })
		var bound *time.Timer
		if d := cq.waitBound(); d > 0 {
			bound = time.AfterFunc(d, cq.ev.Wake)
		}
		err := cq.ev.Wait() // also the hint of a full CQ, or the byte of an earlier arming
		stop()
		if bound != nil {
			bound.Stop()
		}
		if errors.Is(err, io.EOF) {
			return ErrAgentGone
		}
		if err != nil {
			return fmt.Errorf("vrdma: wait on CQ: %w", err)
		}
	}
}

// armedWord loads the CQ's armed word.
func (cq *CQ) armedWord() uint32 {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return abi.Word(cq.ring.Bytes(), abi.OffCQArmed).Load()
}

// cqOf returns the VM's CQ with handle h, or nil.
func (v *VM) cqOf(h uint32) *CQ {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	for cq := range v.cqs {
		if cq.handle == h {
			return cq
		}
	}
	return nil
}
