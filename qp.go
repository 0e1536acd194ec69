// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// QPInitAttr are the attributes a QP is created with (ibv_qp_init_attr).
type QPInitAttr struct {
	SendCQ   *CQ
	RecvCQ   *CQ
	Caps     QPCaps
	SQSigAll bool // every send WR completes with a CQE, signaled or not
	// SRQ, if set, is the shared receive queue the QP takes its receives
	// from (ibv_qp_init_attr.srq): Caps' receive sizes are then ignored,
	// and the QP's own PostRecv is refused.
	SRQ *SRQ
	// Type is the QP's transport (ibv_qp_init_attr.qp_type): QPTypeRC
	// (the zero value means RC too), QPTypeUC or QPTypeUD (ud.go: never
	// connected; each SendWR names its destination).
	Type QPType
}

// QP is a queue pair (ibv_qp): reliable connected (IBV_QPT_RC),
// unreliable connected (IBV_QPT_UC: uc.go) or unreliable datagram
// (IBV_QPT_UD: ud.go). PostSend and
// PostRecv may be called from several goroutines.
type QP struct {
	pd     *PD
	vm     *VM
	handle uint32
	qpn    uint32
	caps   QPCaps
	layout abi.QPLayout
	ring   *sys.Mapping
	db     *sys.Bell
	sendCQ *CQ
	recvCQ *CQ
	srq    *SRQ
	typ    QPType
	psn    uint32

	sqMu   sync.Mutex
	sqTail uint32 // +checklocks:sqMu
	rqMu   sync.Mutex
	rqTail uint32 // +checklocks:rqMu

	pathMu sync.Mutex
	path   PathInfo // +checklocks:pathMu

	tgtState atomic.Uint32 // the state the last Modify set: State's of an XRC target QP (no ring)

	// memcpy-direct (direct.go): bound to the path; the VM's grant table;
	// the max_rd_atomic the last Modify set; the signaled WRs posted to
	// the ring, and the send completions of this QP its send CQ took
	// from its ring (rule 2); the grants by rkey, and the rkeys the
	// agent refused, with the relays left before asking again.
	direct          atomic.Bool
	dtab            atomic.Pointer[directTable]
	sqSigAll        bool
	maxRdAtomic     atomic.Uint32
	relayedSignaled uint64 // +checklocks:sqMu
	sendDone        atomic.Uint64
	gmu             sync.Mutex
	grants          map[uint32]*grant // +checklocks:gmu
	refused         map[uint32]uint32 // +checklocks:gmu
	// One-entry caches of directPost's lookups: the grant and the local
	// region of the QP's last direct WR (a WR stream reuses them), each
	// valid while not dropped (grant.dropped) or stale (localMR.stale).
	lastGrant *grant   // +checklocks:sqMu
	lastLocal *localMR // +checklocks:sqMu

	// The send channel (direct_send.go): the grant; when it may be
	// asked for next (mono, chanNever) and the back-off; the
	// direct-notify a post owes the receiver (1, 2: solicited).
	sch        atomic.Pointer[sendChan]
	chanNext   atomic.Int64
	chanAsking atomic.Bool
	chanWait   atomic.Int64
	chanOffer  atomic.Uint32 // the channel-offer word at the last ask
	chanNotify uint8         // +checklocks:sqMu
}

// CreateQP creates a queue pair in pd (ibv_create_qp), RC unless
// attr.Type says UC. Caps are
// rounded up to what the queues hold; QP.Caps reports them.
func (pd *PD) CreateQP(ctx context.Context, attr QPInitAttr) (*QP, error) {
	v := pd.ad.vm
	if attr.Type == QPTypeXRCSend && attr.RecvCQ == nil {
		attr.RecvCQ = attr.SendCQ // an XRC initiator never receives
	}
	if attr.SendCQ == nil || attr.RecvCQ == nil {
		return nil, errorf(abi.CodeInvalid, "vrdma: CreateQP: SendCQ and RecvCQ are required")
	}
	if attr.Type == "" {
		attr.Type = QPTypeRC
	}
	if attr.Type == QPTypeXRCRecv {
		return nil, errorf(abi.CodeInvalid, "vrdma: CreateQP: an XRC target QP is made by XRCD.CreateTargetQP")
	}
	req := &abi.CreateQP{PD: pd.handle, SendCQ: attr.SendCQ.handle, RecvCQ: attr.RecvCQ.handle,
		Type: attr.Type, SQSigAll: attr.SQSigAll, Caps: attr.Caps}
	if attr.SRQ != nil {
		req.SRQ = attr.SRQ.handle
	}
	var r abi.CreateQPReply
	fds, err := v.c.call(ctx, abi.OpCreateQP, req, &r)
	if err != nil {
		return nil, fmt.Errorf("vrdma: CreateQP: %w", err)
	}
	if len(fds) != 2 {
		closeFDs(fds)
		return nil, fmt.Errorf("vrdma: CreateQP: the agent sent %d descriptors, want 2", len(fds))
	}
	q := &QP{pd: pd, vm: v, handle: r.Handle, qpn: r.QPN, caps: r.Caps, layout: r.Layout, sendCQ: attr.SendCQ, recvCQ: attr.RecvCQ, srq: attr.SRQ, typ: attr.Type,
		sqSigAll: attr.SQSigAll, grants: map[uint32]*grant{}, refused: map[uint32]uint32{}}
	q.psn = randomPSN()
	size, err := sys.FileSize(fds[0])
	if err == nil {
		err = r.Layout.Check(size)
	}
	if err == nil {
		q.ring, err = sys.Map(fds[0], int(r.Layout.Size), true)
	}
	if err == nil {
		q.db, err = sys.BellFrom(fds[1])
	}
	if err != nil {
		if q.ring != nil {
			q.ring.Unmap()
		}
		closeFDs(fds)
		v.c.call(ctx, abi.OpDestroyQP, &abi.Handle{Handle: r.Handle}, nil)
		return nil, fmt.Errorf("vrdma: CreateQP: %w", err)
	}
	sys.CloseFD(fds[0])
	v.objMu.Lock()
	v.qps[q] = struct{}{}
	v.objMu.Unlock()
	if q.typ == QPTypeRC && v.caps.Has(abi.CapDirect) {
		q.sendCQ.trackQP(q, true) // direct.go: rule 2 counts its send completions
	}
	return q, nil
}

// randomPSN draws a QP's first PSN (24 bits) at random.
func randomPSN() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:]) & 0xffffff
}

// QPN returns the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// Caps returns the QP's real sizes.
func (q *QP) Caps() QPCaps { return q.caps }

// State returns the QP's current state, as the agent last published it;
// an XRC target QP, which has no ring, reports the state its last Modify
// set (Query asks the agent).
func (q *QP) State() QPState {
	if q.ring == nil {
		return QPState(q.tgtState.Load())
	}
	return QPState(abi.Word(q.ring.Bytes(), abi.OffQPState).Load())
}

// Path returns the path the connected QP uses and why; the zero PathInfo
// before the QP is connected.
func (q *QP) Path() PathInfo {
	q.pathMu.Lock()
	defer q.pathMu.Unlock()
	return q.path
}

func (q *QP) setPath(p PathInfo) {
	q.pathMu.Lock()
	q.path = p
	q.pathMu.Unlock()
	q.setDirect(context.Background(), p.Path == PathMemcpyDirect) // direct.go
}

// Modify changes the attributes mask selects (ibv_modify_qp), following
// the IBTA state machine.
func (q *QP) Modify(ctx context.Context, attr *QPAttr, mask QPAttrMask) error {
	if _, err := q.vm.c.call(ctx, abi.OpModifyQP, &abi.ModifyQP{Handle: q.handle, Mask: mask, Attr: *attr}, nil); err != nil {
		return fmt.Errorf("vrdma: modify QP 0x%x: %w", q.qpn, err)
	}
	if mask&MaskState != 0 {
		q.tgtState.Store(uint32(attr.State))
	}
	if mask&MaskMaxRdAtomic != 0 {
		q.maxRdAtomic.Store(uint32(attr.MaxRdAtomic))
	}
	if mask&MaskState != 0 && attr.State == QPSReset && q.typ == QPTypeRC {
		q.dropChanAtReset() // direct_send.go
		q.resync()          // direct.go
	}
	if mask&MaskState != 0 && (attr.State == QPSRTR || attr.State == QPSReset) {
		r, err := q.Query(ctx)
		if err == nil {
			q.setPath(r.Path)
		}
	}
	if mask&MaskState != 0 && (attr.State == QPSRTR || attr.State == QPSRTS) {
		// RTR too: a receive-only QP may never reach RTS, and its
		// sender's SENDs would all be relayed.
		q.chanNext.Store(0)
		q.askChannel(ctx) // direct_send.go
	}
	return nil
}

// QPInfo is what Query reports.
type QPInfo struct {
	QPN  uint32
	Attr QPAttr
	Caps QPCaps
	Path PathInfo
}

// Query returns the QP's attributes and path (ibv_query_qp).
func (q *QP) Query(ctx context.Context) (QPInfo, error) {
	var r abi.QueryQPReply
	if _, err := q.vm.c.call(ctx, abi.OpQueryQP, &abi.Handle{Handle: q.handle}, &r); err != nil {
		return QPInfo{}, err
	}
	return QPInfo{QPN: r.QPN, Attr: r.Attr, Caps: r.Caps, Path: r.Path}, nil
}

// Destroy destroys the QP (ibv_destroy_qp). Once the agent is gone the QP
// is gone with it: Destroy then only releases what this process holds.
func (q *QP) Destroy(ctx context.Context) error {
	if _, err := q.vm.c.call(ctx, abi.OpDestroyQP, &abi.Handle{Handle: q.handle}, nil); err != nil && !errors.Is(err, ErrAgentGone) {
		return err
	}
	if q.ring != nil { // an XRC target QP has none
		v := q.vm
		v.objMu.Lock()
		delete(v.qps, q)
		v.objMu.Unlock()
		q.direct.Store(false)
		if ch := q.sch.Load(); ch != nil {
			q.dropChan(ch) // direct_send.go: the agent revoked it before it answered
		}
		q.sendCQ.trackQP(q, false)
		q.ring.Unmap()
		q.db.Close()
	}
	return nil
}

// PostError says which work request of a post failed and why; the ones
// before it were posted (the bad_wr of ibv_post_send).
type PostError struct {
	Index int
	Err   error
}

func (e *PostError) Error() string { return fmt.Sprintf("vrdma: work request %d: %v", e.Index, e.Err) }
func (e *PostError) Unwrap() error { return e.Err }

// ErrQueueFull is returned (in a PostError) when a queue has no free slot:
// poll completions first. It is of class ErrLimit (ENOMEM, as
// ibv_post_send reports a full queue): errors.Is matches either.
var ErrQueueFull error = errorf(abi.CodeLimit, "queue full: poll completions to free slots")

// PostSend posts send work requests (ibv_post_send). They execute in
// order; each signaled one (or every one, with SQSigAll) completes on the
// send CQ. Posting to a QP in ERR completes the requests with WR_FLUSH_ERR.
// It does not allocate.
func (q *QP) PostSend(wrs []SendWR) error {
	if err := q.vm.check(); err != nil {
		return err
	}
	if q.ring == nil {
		return errorf(abi.CodeInvalid, "vrdma: PostSend on XRC target QP 0x%x: it has no send queue", q.qpn)
	}
	mem := q.ring.Bytes()
	switch s := QPState(abi.Word(mem, abi.OffQPState).Load()); s {
	case QPSRTS, QPSSQD, QPSErr, QPSSQE:
	default:
		return errorf(abi.CodeState, "vrdma: PostSend on QP 0x%x in %s: a QP sends in RTS", q.qpn, s)
	}
	size, stride := q.layout.SQEntries, q.layout.SQStride
	if q.direct.Load() && q.sch.Load() == nil {
		q.askChannel(context.Background()) // direct_send.go: after an agent's "not yet"
	}
	q.sqMu.Lock()
	first := 0
	ch := q.sch.Load()
	if q.direct.Load() {
		// memcpy-direct (direct.go): the library executes what it can
		// prove valid until the first WR it cannot; that one and every
		// later one go to the ring. Small SENDs go into the send
		// channel (direct_send.go).
		for first < len(wrs) && (ch != nil && q.chanPost(ch, &wrs[first]) || q.directPost(&wrs[first])) {
			first++
		}
	}
	head := abi.Word(mem, abi.OffSQHead).Load()
	tail := q.sqTail
	var err error
	posted := 0
	if ch != nil && first < len(wrs) {
		// The channel's messages not taken yet go to the ring first
		// (§4.22 "Retraction").
		var ok bool
		if tail, posted, ok = q.relayLocked(ch, tail); !ok {
			err = &PostError{Index: first, Err: ErrQueueFull}
			first = len(wrs)
		}
	}
	for i := first; i < len(wrs); i++ {
		if n, _ := abi.Pending(tail, head, size); n >= size {
			err = &PostError{Index: i, Err: ErrQueueFull}
			break
		}
		slot := mem[q.layout.SQOffset+abi.Slot(tail, size)*stride:][:stride]
		if err = q.encodeSend(slot, &wrs[i]); err != nil {
			err = &PostError{Index: i, Err: err}
			break
		}
		tail = abi.Next(tail, size)
		posted++
		if wrs[i].Flags&SendSignaled != 0 || q.sqSigAll {
			q.relayedSignaled++
		}
	}
	if posted > 0 {
		q.sqTail = tail
		abi.StoreFenced(abi.Word(mem, abi.OffSQTail), tail) // §6 pair 1: before the flag's load
	}
	notify := q.chanNotify
	q.chanNotify = 0
	q.sqMu.Unlock()
	if posted > 0 && abi.Word(mem, abi.OffSQDoorbell).Load() != 0 {
		q.db.Ring()
	}
	if notify != 0 { // the receiver's CQ was armed (direct_send.go)
		q.vm.c.call(context.Background(), abi.OpDirectNotify, &abi.DirectNotify{QP: q.handle, CQ: abi.NotifyRecv, Solicited: notify&2 != 0}, nil)
	}
	return err
}

func (q *QP) encodeSend(slot []byte, wr *SendWR) error {
	if !wr.Opcode.Valid() {
		return errorf(abi.CodeInvalid, "unknown opcode %d", wr.Opcode)
	}
	if err := q.checkUC(wr); err != nil {
		return err
	}
	if wr.Opcode == OpAtomicWrite && (q.typ != QPTypeRC || len(wr.SGL) != 0 || wr.Flags&SendInline != 0 || !q.vm.caps.Has(abi.CapAtomicWrite)) {
		return errorf(abi.CodeInvalid, "ATOMIC_WRITE: RC QPs only, its 8 bytes in Swap (no SGL, not inline), from an agent with capability atomic-write")
	}
	w := abi.SendWQE{WRID: wr.ID, Opcode: wr.Opcode, Flags: wr.Flags, Imm: wr.Imm, RemoteAddr: wr.RemoteAddr, RKey: wr.RKey,
		CompareAdd: wr.CompareAdd, Swap: wr.Swap, XRCSRQN: wr.XRCSRQN}
	if wr.Opcode.IsMW() {
		if err := q.encodeMW(&w, wr); err != nil { // mw.go
			return err
		}
		if wr.Opcode.IsLocal() {
			abi.EncodeSend(slot, &w, nil)
			return nil
		}
	}
	if q.typ == QPTypeUD {
		if err := encodeUD(&w, wr); err != nil { // ud.go
			return err
		}
	}
	if wr.Flags&SendInline != 0 {
		if wr.Opcode == OpRDMARead || wr.Opcode.IsAtomic() {
			return errorf(abi.CodeInvalid, "%s cannot be inline: it writes into local memory", wr.Opcode)
		}
		// Copy the bytes now, straight into the slot: the buffers may be
		// reused as soon as PostSend returns.
		mem := q.vm.mem.Bytes()
		n := uint32(0)
		for _, s := range wr.SGL {
			if !sys.InBounds(s.Addr, uint64(s.Length), uint64(len(mem))) {
				return errorf(abi.CodeInvalid, "inline SGE [0x%x,+%d) is outside guest memory", s.Addr, s.Length)
			}
			if n+s.Length > q.caps.MaxInlineData || n+s.Length < n {
				return errorf(abi.CodeInvalid, "inline data exceeds max_inline_data %d", q.caps.MaxInlineData)
			}
			copy(slot[abi.SendHdr+n:], mem[s.Addr:s.Addr+uint64(s.Length)])
			n += s.Length
		}
		w.InlineLen = n
		abi.EncodeSend(slot, &w, slot[abi.SendHdr:abi.SendHdr+n])
		return nil
	}
	if len(wr.SGL) > int(q.caps.MaxSendSGE) {
		return errorf(abi.CodeInvalid, "%d SGEs exceed the QP's max_send_sge %d", len(wr.SGL), q.caps.MaxSendSGE)
	}
	w.NumSGE = uint8(len(wr.SGL))
	copy(w.SGE[:], wr.SGL)
	abi.EncodeSend(slot, &w, nil)
	return nil
}

// PostRecv posts receive work requests (ibv_post_recv). It does not
// allocate.
func (q *QP) PostRecv(wrs []RecvWR) error {
	if err := q.vm.check(); err != nil {
		return err
	}
	if q.srq != nil || q.typ.IsXRC() {
		return errorf(abi.CodeInvalid, "vrdma: PostRecv on QP 0x%x, which takes its receives from an SRQ (an XRC target's: the SRQ each sender names) or never (an XRC initiator): post them with SRQ.PostRecv", q.qpn)
	}
	mem := q.ring.Bytes()
	if s := QPState(abi.Word(mem, abi.OffQPState).Load()); s == QPSReset {
		return errorf(abi.CodeState, "vrdma: PostRecv on QP 0x%x in RESET: move it to INIT first", q.qpn)
	}
	if q.direct.Load() && q.sch.Load() == nil {
		q.askChannel(context.Background()) // direct_send.go: after an agent's "not yet"
	}
	q.rqMu.Lock()
	tail, posted, err := fillRecvRing(mem[q.layout.RQOffset:], q.layout.RQEntries, q.layout.RQStride, abi.Word(mem, abi.OffRQHead).Load(), q.rqTail,
		q.caps.MaxRecvSGE, "the QP's max_recv_sge", wrs)
	if posted > 0 {
		q.rqTail = tail
		abi.StoreFenced(abi.Word(mem, abi.OffRQTail), tail) // §6 pair 3: before the state's load
	}
	q.rqMu.Unlock()
	// In ERR the agent flushes receives; tell it there are new ones.
	if posted > 0 && QPState(abi.Word(mem, abi.OffQPState).Load()) == QPSErr {
		q.db.Ring()
	}
	return err
}

// fillRecvRing writes wrs into the slots of a receive ring (a QP's RQ or
// an SRQ) from tail on, while the ring holds fewer than size entries past
// head (the agent's), each with at most maxSGE SGEs (limit names that cap
// in an error). It returns the new tail and how many it wrote; err is a
// *PostError naming the first it refused. Publishing the tail is the
// caller's, with the ordering its ring needs. It does not allocate.
func fillRecvRing(slots []byte, size, stride, head, tail, maxSGE uint32, limit string, wrs []RecvWR) (uint32, int, error) {
	var w abi.RecvWQE
	for i := range wrs {
		if n, _ := abi.Pending(tail, head, size); n >= size {
			return tail, i, &PostError{Index: i, Err: ErrQueueFull}
		}
		wr := &wrs[i]
		if len(wr.SGL) > int(maxSGE) {
			return tail, i, &PostError{Index: i, Err: errorf(abi.CodeInvalid, "%d SGEs exceed %s %d", len(wr.SGL), limit, maxSGE)}
		}
		w.WRID, w.NumSGE = wr.ID, uint8(len(wr.SGL))
		copy(w.SGE[:], wr.SGL)
		abi.EncodeRecv(slots[abi.Slot(tail, size)*stride:][:stride], &w)
		tail = abi.Next(tail, size)
	}
	return tail, len(wrs), nil
}

// Endpoint is what a peer needs to connect to a QP out of band, as
// perftest exchanges it: GID, QPN and starting PSN, and the adapter's
// active MTU.
type Endpoint struct {
	GID GID    `json:"gid"`
	QPN uint32 `json:"qpn"`
	PSN uint32 `json:"psn"`
	MTU uint32 `json:"mtu,omitempty"` // 0: not said
}

// Endpoint returns this QP's endpoint for out-of-band exchange.
func (q *QP) Endpoint() Endpoint {
	return Endpoint{GID: q.pd.ad.gid, QPN: q.qpn, PSN: q.psn, MTU: q.activeMTU(context.Background())}
}

// activeMTU is the active MTU of the QP's adapter's port, or the default
// path MTU if the agent does not say.
func (q *QP) activeMTU(ctx context.Context) uint32 {
	if p, err := q.pd.ad.QueryPort(ctx); err == nil && abi.ValidMTU(p.ActiveMTU) {
		return p.ActiveMTU
	}
	return abi.DefaultPathMTU
}

// ConnectTo brings the QP from RESET to RTS facing remote, exchanged out
// of band, with full remote access, the smaller of the two adapters'
// active MTUs as path MTU (remote's counts if it says one) and the usual
// RC defaults (timeout 14, retry_cnt 7, rnr_retry 7, min_rnr_timer 12),
// which a UC QP goes without.
func (q *QP) ConnectTo(ctx context.Context, remote Endpoint) error {
	mtu := q.activeMTU(ctx)
	if abi.ValidMTU(remote.MTU) && remote.MTU < mtu {
		mtu = remote.MTU
	}
	steps := []struct {
		attr QPAttr
		mask QPAttrMask
	}{
		{QPAttr{State: QPSInit, Port: 1, AccessFlags: AccessAll}, MaskState | MaskPort | MaskAccessFlags},
		{QPAttr{State: QPSRTR, DGID: remote.GID, PathMTU: mtu, DestQPN: remote.QPN, RQPSN: remote.PSN, MaxDestRdAtomic: abi.MaxRdAtom,
			MinRNRTimer: abi.DefaultMinRNRTimer},
			MaskState | MaskAV | MaskPathMTU | MaskDestQPN | MaskRQPSN | MaskMaxDestRdAtomic | MaskMinRNRTimer},
		{QPAttr{State: QPSRTS, SQPSN: q.psn, Timeout: abi.DefaultTimeout, RetryCnt: abi.DefaultRetryCnt, RNRRetry: abi.DefaultRNRRetry,
			MaxRdAtomic: abi.MaxRdAtom},
			MaskState | MaskSQPSN | MaskTimeout | MaskRetryCnt | MaskRNRRetry | MaskMaxRdAtomic},
	}
	for _, s := range steps {
		if q.typ == QPTypeUC {
			s.mask &^= abi.MaskRCOnly // UC takes none of RC's retry, RNR and READ/atomic attributes
		}
		if err := q.Modify(ctx, &s.attr, s.mask); err != nil {
			return err
		}
	}
	return nil
}
