// SPDX-License-Identifier: Apache-2.0

package vrdma

// Shared receive queues (ibv_create_srq) and an adapter's asynchronous
// events (ibv_get_async_event), which is where an SRQ's limit event
// arrives. docs/wire-local.md §4.13, §4.14.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// SRQAttr are an SRQ's attributes (ibv_srq_attr): its size in work
// requests, the SGEs a work request may have, and the armed limit (0:
// not armed).
type SRQAttr = abi.SRQAttr

// SRQAttrMask selects what SRQ.Modify changes (ibv_srq_attr_mask).
type SRQAttrMask = abi.SRQAttrMask

// SRQ attribute mask bits.
const (
	// SRQMaxWR asks for a resize, which vrdma refuses (ErrInvalid,
	// EINVAL): create a larger SRQ instead.
	SRQMaxWR = abi.SRQMaskMaxWR
	// SRQLimit arms the limit event (0 disarms it).
	SRQLimit = abi.SRQMaskLimit
)

// SRQ is a shared receive queue (ibv_srq): receive work requests that
// every QP created on it (QPInitAttr.SRQ) takes from as messages arrive,
// each completion in the receiving QP's receive CQ with that QP's QPN.
// PostRecv may be called from several goroutines.
type SRQ struct {
	pd     *PD
	vm     *VM
	handle uint32
	attr   SRQAttr
	layout abi.SRQLayout
	ring   *sys.Mapping
	srqn   uint32 // an XRC SRQ's number (xrc.go)

	mu   sync.Mutex
	tail uint32 // +checklocks:mu
}

// CreateSRQ creates a shared receive queue in pd (ibv_create_srq): attr's
// MaxWR and MaxSGE are rounded up to what the ring holds (SRQ.Attr
// reports them); a nonzero Limit arms the limit event at once.
func (pd *PD) CreateSRQ(ctx context.Context, attr SRQAttr) (*SRQ, error) {
	return pd.createSRQ(ctx, &abi.CreateSRQ{PD: pd.handle, Attr: attr})
}

func (pd *PD) createSRQ(ctx context.Context, req *abi.CreateSRQ) (*SRQ, error) {
	v := pd.ad.vm
	var r abi.CreateSRQReply
	fds, err := v.c.call(ctx, abi.OpCreateSRQ, req, &r)
	if err != nil {
		return nil, fmt.Errorf("vrdma: CreateSRQ: %w", err)
	}
	if len(fds) != 1 {
		closeFDs(fds)
		v.c.call(ctx, abi.OpDestroySRQ, &abi.Handle{Handle: r.Handle}, nil)
		return nil, fmt.Errorf("vrdma: CreateSRQ: the agent sent %d descriptors, want 1", len(fds))
	}
	s := &SRQ{pd: pd, vm: v, handle: r.Handle, attr: r.Attr, layout: r.Layout, srqn: r.SRQN}
	size, err := sys.FileSize(fds[0])
	if err == nil {
		err = r.Layout.Check(size)
	}
	if err == nil {
		s.ring, err = sys.Map(fds[0], int(r.Layout.Size), true)
	}
	sys.CloseFD(fds[0])
	if err != nil {
		v.c.call(ctx, abi.OpDestroySRQ, &abi.Handle{Handle: r.Handle}, nil)
		return nil, fmt.Errorf("vrdma: CreateSRQ: %w", err)
	}
	return s, nil
}

// Attr returns the SRQ's real sizes, and the limit it was created with.
func (s *SRQ) Attr() SRQAttr { return s.attr }

// PostRecv posts receive work requests to the SRQ (ibv_post_srq_recv).
// It does not allocate.
func (s *SRQ) PostRecv(wrs []RecvWR) error {
	if err := s.vm.check(); err != nil {
		return err
	}
	mem := s.ring.Bytes()
	s.mu.Lock()
	tail, posted, err := fillRecvRing(mem[s.layout.Offset:], s.layout.Entries, s.layout.Stride, abi.Word(mem, abi.OffSRQHead).Load(), s.tail,
		s.attr.MaxSGE, "the SRQ's max_sge", wrs)
	if posted > 0 {
		s.tail = tail
		abi.Word(mem, abi.OffSRQTail).Store(tail) // after the slots' bytes
	}
	s.mu.Unlock()
	return err
}

// Modify changes the attributes mask selects (ibv_modify_srq): SRQLimit
// arms the limit event, which fires once, when fewer than attr.Limit
// receives stay posted. SRQMaxWR is refused.
func (s *SRQ) Modify(ctx context.Context, attr SRQAttr, mask SRQAttrMask) error {
	if _, err := s.vm.c.call(ctx, abi.OpModifySRQ, &abi.ModifySRQ{Handle: s.handle, Mask: mask, Attr: attr}, nil); err != nil {
		return fmt.Errorf("vrdma: modify SRQ %d: %w", s.handle, err)
	}
	return nil
}

// Query returns the SRQ's attributes (ibv_query_srq); Limit is 0 once the
// limit event fired.
func (s *SRQ) Query(ctx context.Context) (SRQAttr, error) {
	var r abi.SRQAttr
	if _, err := s.vm.c.call(ctx, abi.OpQuerySRQ, &abi.Handle{Handle: s.handle}, &r); err != nil {
		return SRQAttr{}, fmt.Errorf("vrdma: query SRQ %d: %w", s.handle, err)
	}
	return r, nil
}

// Destroy destroys the SRQ (ibv_destroy_srq); the receives still posted
// are discarded without completions. It fails with ErrState (EBUSY) while a QP
// uses it: destroy those first.
func (s *SRQ) Destroy(ctx context.Context) error {
	if _, err := s.vm.c.call(ctx, abi.OpDestroySRQ, &abi.Handle{Handle: s.handle}, nil); err != nil && !errors.Is(err, ErrAgentGone) {
		return fmt.Errorf("vrdma: destroy SRQ %d: %w", s.handle, err)
	}
	s.ring.Unmap()
	return nil
}

// AsyncEventType is an asynchronous event's type, numbered as enum
// ibv_event_type.
type AsyncEventType int

// The asynchronous events the agent sends.
const (
	EventQPFatal    AsyncEventType = abi.EventQPFatal
	EventPortActive AsyncEventType = abi.EventPortActive
	EventPortErr    AsyncEventType = abi.EventPortErr
	EventSRQLimit   AsyncEventType = abi.EventSRQLimit
	EventQPLastWQE  AsyncEventType = abi.EventQPLastWQE
	// EventCommEst: a QP in RTR received its first message
	// (IBV_EVENT_COMM_EST); from an agent with capability qp-events.
	EventCommEst AsyncEventType = abi.EventCommEst
	// EventSQDrained: a QP moved to SQD has no send work left in flight
	// (IBV_EVENT_SQ_DRAINED); from an agent with capability qp-events.
	EventSQDrained AsyncEventType = abi.EventSQDrained
	// EventCQErr: a CQ overran — a completion found a CQ made with
	// CQOverrun full, or its consumer index was overwritten with one the
	// agent cannot write behind — and its QPs moved to ERR
	// (IBV_EVENT_CQ_ERR; AsyncEvent.CQ); from an agent with capability
	// qp-events.
	EventCQErr AsyncEventType = abi.EventCQErr
)

// AsyncEvent is one asynchronous event (ibv_async_event): its type, the
// QP (QPN) or SRQ it is about, the port, and what the agent saw.
type AsyncEvent struct {
	Type   AsyncEventType
	QPN    uint32
	SRQ    *SRQ // SRQ events: the SRQ, if it is one this AsyncEvents knows (Watch)
	CQ     *CQ  // CQ events: the VM's CQ
	Port   int
	Reason string
}

// AsyncEvents is an adapter's event socket (a context's async_fd). Next
// is for one reader at a time; the other methods are safe for concurrent
// use.
type AsyncEvents struct {
	vm *VM
	f  *os.File

	mu   sync.Mutex
	srqs map[uint32]*SRQ // +checklocks:mu

	readMu sync.Mutex
	buf    []byte // +checklocks:readMu
}

// OpenAsyncEvents opens the adapter's event socket: the VM's QPs the agent
// moves to ERR, its SRQs' limit events, its QPs on SRQs that entered ERR,
// the port going down and up, its QPs' first message in RTR and their send
// queues drained in SQD.
func (a *Adapter) OpenAsyncEvents(ctx context.Context) (*AsyncEvents, error) {
	fds, err := a.vm.c.call(ctx, abi.OpAsyncOpen, &abi.AdapterRef{Adapter: a.name}, nil)
	if err != nil {
		return nil, fmt.Errorf("vrdma: open %s's async events: %w", a.name, err)
	}
	if len(fds) != 1 {
		closeFDs(fds)
		return nil, fmt.Errorf("vrdma: open %s's async events: the agent sent %d descriptors, want 1", a.name, len(fds))
	}
	if err := sys.SetNonblock(fds[0]); err != nil {
		closeFDs(fds)
		return nil, fmt.Errorf("vrdma: open %s's async events: %w", a.name, err)
	}
	return &AsyncEvents{vm: a.vm, f: os.NewFile(uintptr(fds[0]), "vrdma-async-events"), srqs: map[uint32]*SRQ{}, buf: make([]byte, 4096)}, nil
}

// Watch makes the SRQ events of s name it (AsyncEvent.SRQ).
func (e *AsyncEvents) Watch(s *SRQ) {
	e.mu.Lock()
	e.srqs[s.handle] = s
	e.mu.Unlock()
}

// Close closes the event socket.
func (e *AsyncEvents) Close() error { return e.f.Close() }

// Next waits for the next event, as ibv_get_async_event.
func (e *AsyncEvents) Next(ctx context.Context) (AsyncEvent, error) {
	e.readMu.Lock()
	defer e.readMu.Unlock()
	n, err := readCtx(ctx, e.f, e.buf)
	if err != nil {
		if ctx.Err() != nil {
			return AsyncEvent{}, ctx.Err()
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return AsyncEvent{}, context.DeadlineExceeded
		}
		return AsyncEvent{}, fmt.Errorf("vrdma: read the async event socket: %w", err)
	}
	if n == 0 {
		return AsyncEvent{}, fmt.Errorf("vrdma: the async event socket was closed by the agent: %w", ErrAgentGone)
	}
	var ae abi.AsyncEvent
	if err := json.Unmarshal(e.buf[:n], &ae); err != nil {
		return AsyncEvent{}, fmt.Errorf("vrdma: bad async event from the agent: %v", err)
	}
	ev := AsyncEvent{Type: AsyncEventType(ae.Event), QPN: ae.QPN, Port: ae.Port, Reason: ae.Why}
	if ae.SRQ != 0 {
		e.mu.Lock()
		ev.SRQ = e.srqs[ae.SRQ]
		e.mu.Unlock()
	}
	if ae.Event == abi.EventCQErr {
		ev.CQ = e.vm.cqOf(ae.CQ)
	}
	return ev, nil
}

// readCtx reads one message of f into buf until ctx ends. The deadline
// set when ctx ends does not outlive the call: it waits for it to be
// set, or a late one would fail the next call's read.
func readCtx(ctx context.Context, f *os.File, buf []byte) (int, error) {
	if d, ok := ctx.Deadline(); ok {
		f.SetReadDeadline(d)
	} else {
		f.SetReadDeadline(time.Time{})
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { f.SetReadDeadline(time.Now()); close(fired) })
	n, err := f.Read(buf)
	if !stop() {
		<-fired
	}
	return n, err
}
