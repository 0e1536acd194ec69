// SPDX-License-Identifier: Apache-2.0

package device

// Unreliable datagram QPs and address handles. A UD QP is never bound to
// one path: each SEND names its destination by an address handle, which
// the Router (as a UDRouter) resolved when it was created to the way its
// datagrams leave the host (a DatagramPath: memcpy to a QP of this host,
// a datagram frame on the tcp uplink, a RoCE UD packet on the rdma
// uplink). The QP's send-queue goroutine executes each SEND to its end —
// the datagram handed to the path — and completes it: UD has no ACK, so a
// datagram lost on the way, or refused at the destination (no such QP,
// another Q_Key, no receive posted, a source that does not qualify), is
// dropped silently and counted there (Device.UDDropped, the target QP's
// Dropped).
//
// Receiving is the same on every path: the path hands the datagram to
// DeliverDatagram with what it knows of its source (Via), which checks
// the target, asks the UDRouter whether the source may reach it (the rules
// connections obey: same switch, port group and VLAN; address-unique;
// fail closed), takes the receive WQE at the QP's head and writes the
// 40-byte GRH and the payload into it.

import (
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

// Datagram is one UD message between two QPs, as a path carries it.
// Payload holds its bytes: the sender's guest memory on the way out
// (valid only during DatagramPath.SendDatagram), the received bytes on
// the way in (valid only during DeliverDatagram).
type Datagram struct {
	SrcQPN, DstQPN uint32
	SGID, DGID     abi.GID
	QKey           uint32
	Imm            uint32
	WithImm        bool
	Solicited      bool // the solicited-event bit (IBV_SEND_SOLICITED)
	TrafficClass   uint8
	HopLimit       uint8
	FlowLabel      uint32
	Payload        [][]byte
	Len            uint32 // the payload's bytes, across its segments
}

// DatagramPath carries an address handle's datagrams to their
// destination. SendDatagram is called by a UD QP's send-queue goroutine
// (one at a time per QP, several QPs at once); it copies what it needs of
// d before it returns, and never waits for the destination: a datagram it
// cannot carry now is dropped.
type DatagramPath interface {
	// Kind names the path (the vocabulary of abi.PathKind).
	Kind() abi.PathKind
	// SendDatagram carries d, or drops it.
	SendDatagram(d *Datagram)
}

// Via is what the path that received a datagram knows of where it came
// from: the path, and the host it came from (tcp: the authenticated
// peer's host ID; rdma: the packet's source address).
type Via struct {
	Path abi.PathKind
	Host string
	Addr netip.Addr
}

// UDRouter is what a Router adds for UD QPs; the device asks it when a
// Router implements it, and a device without one has no UD paths.
type UDRouter interface {
	// RouteAH decides how datagrams from adapter from reach the adapter
	// with GID dgid, as Route does for a connection, and returns the
	// path that carries them. It may block on the control plane.
	RouteAH(from *Adapter, dgid abi.GID) (DatagramPath, abi.PathInfo, error)
	// AdmitDatagram reports whether a datagram from GID sgid, received
	// through via, may reach a QP of adapter to: the rules a connection
	// between them would obey. It may block on the control plane (the
	// first datagram between two adapters).
	AdmitDatagram(to *Adapter, sgid abi.GID, via Via) bool
}

// DatagramSink receives datagrams for this host's UD QPs; *Device
// implements it. Any goroutine may call it.
type DatagramSink interface {
	DeliverDatagram(d *Datagram, via Via)
}

var _ DatagramSink = (*Device)(nil)

// AH is an address handle: a UD QP's destination, resolved to a path.
type AH struct {
	handle uint32
	pd     *PD
	attr   abi.CreateAH
	path   DatagramPath
	info   abi.PathInfo
	// tails, once the AH is destroyed, are the SQ tails its PD's UD QPs
	// had then: the WQEs before them may still use it (DestroyAH).
	// Guarded by the context's objMu.
	tails map[*QP]uint32
}

// Handle is the AH's handle in its session.
func (a *AH) Handle() uint32 { return a.handle }

// Info is the path decision the AH's datagrams follow.
func (a *AH) Info() abi.PathInfo { return a.info }

// udRouter returns the device's UDRouter, nil if it has none.
func (d *Device) udRouter() UDRouter {
	r, _ := d.cfg.Router.(UDRouter)
	return r
}

// CreateAH creates an address handle in a PD of v, resolving its GID to
// a path (ibv_create_ah).
func (v *Context) CreateAH(c *abi.CreateAH) (*AH, error) {
	v.objMu.Lock()
	p, ok := v.pds[c.PD]
	v.objMu.Unlock()
	if !ok {
		return nil, abi.Errorf(abi.CodeNotFound, "pd", "no PD with handle %d", c.PD)
	}
	r := v.d.udRouter()
	if r == nil {
		return nil, abi.Errorf(abi.CodeUnavailable, "dgid", "this device has no paths for datagrams")
	}
	path, info, err := r.RouteAH(p.ad, c.DGID)
	if err != nil {
		return nil, err
	}
	a := &AH{pd: p, attr: *c, path: path, info: info}
	if a.attr.HopLimit == 0 {
		a.attr.HopLimit = 64
	}
	v.objMu.Lock()
	defer v.objMu.Unlock()
	if v.pds[c.PD] != p {
		return nil, abi.Errorf(abi.CodeNotFound, "pd", "PD %d was deallocated meanwhile", c.PD)
	}
	if n := len(v.ahs); n >= maxAH {
		return nil, abi.Errorf(abi.CodeLimit, "", "VM %q has %d address handles, the limit (max_ah): destroy some first", v.name, n)
	}
	a.handle = v.allocHandleLocked()
	p.refs++
	v.ahs[a.handle] = a
	return a, nil
}

// maxAH is the device's max_ah per process context.
const maxAH = 65536

// DestroyAH destroys address handle h (ibv_destroy_ah). The WQEs posted
// with it before still execute with it, as on hardware, which copies the
// address into the WQE at post time (and as rdma-core's software devices
// do): a program may destroy its AH right after posting its last SEND, as
// mckey does. A WQE posted after it names a handle that is gone: it
// completes with LOC_QP_OP_ERR.
func (v *Context) DestroyAH(h uint32) error {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	a, ok := v.ahs[h]
	if !ok {
		return abi.Errorf(abi.CodeNotFound, "handle", "no address handle with handle %d", h)
	}
	delete(v.ahs, h)
	a.pd.refs--
	a.tails = map[*QP]uint32{}
	for _, q := range v.qps {
		if q.IsUD() && q.pd == a.pd {
			a.tails[q] = abi.Word(q.ring.Bytes(), abi.OffSQTail).Load()
		}
	}
	if len(a.tails) > 0 {
		if len(v.retiredAHs) == maxRetiredAH {
			v.retiredAHs = v.retiredAHs[1:]
		}
		v.retiredAHs = append(v.retiredAHs, a)
	}
	return nil
}

// maxRetiredAH bounds the destroyed address handles a context keeps for
// the WQEs posted before their destroy; the oldest goes first.
const maxRetiredAH = 256

// ah returns the address handle h of v if it is in PD pd, for the WQE at
// the head of q's SQ: a destroyed one if the WQE was posted before its
// destroy.
func (v *Context) ah(h uint32, pd *PD, q *QP) *AH {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	if a := v.ahs[h]; a != nil && a.pd == pd {
		return a
	}
	for i, a := range v.retiredAHs {
		if a.handle != h || a.pd != pd {
			continue
		}
		t, ok := a.tails[q]
		if !ok {
			return nil
		}
		if n, ok := abi.Pending(t, q.sqHead, q.layout.SQEntries); ok && n > 0 {
			return a
		}
		// The QP is past the WQEs posted before the destroy.
		if delete(a.tails, q); len(a.tails) == 0 {
			v.retiredAHs = append(v.retiredAHs[:i:i], v.retiredAHs[i+1:]...)
		}
		return nil
	}
	return nil
}

// UD QP attributes (IBTA 10.3.1, the UD column; the kernel's
// qp_state_table).
var (
	reqInitUD = []required{{abi.MaskPKeyIndex, "pkey_index (IBV_QP_PKEY_INDEX)"}, {abi.MaskPort, "port_num (IBV_QP_PORT)"},
		{abi.MaskQKey, "qkey (IBV_QP_QKEY)"}}
	reqRTSUD = []required{{abi.MaskSQPSN, "sq_psn (IBV_QP_SQ_PSN)"}}
)

// knownAttrsUD are the attribute mask bits a UD transition is checked
// against: UD's and RC's, so that an RC attribute (an address, a path
// MTU, a destination QPN, RC's timers) given to a UD QP is refused, as
// the kernel refuses it; others are ignored.
const knownAttrsUD = abi.MaskState | abi.MaskPKeyIndex | abi.MaskPort | abi.MaskQKey | abi.MaskSQPSN | knownAttrs

// optionalAttrsUD are the attributes a UD transition accepts besides its
// required ones.
func optionalAttrsUD(cur, next abi.QPState) abi.QPAttrMask {
	switch {
	case cur == abi.QPSInit && next == abi.QPSInit:
		return abi.MaskPKeyIndex | abi.MaskPort | abi.MaskQKey
	case cur == abi.QPSInit && next == abi.QPSRTR:
		return abi.MaskPKeyIndex | abi.MaskQKey
	case cur == abi.QPSRTR && next == abi.QPSRTS, cur == abi.QPSRTS && next == abi.QPSRTS,
		cur == abi.QPSSQE && next == abi.QPSRTS:
		return abi.MaskQKey
	case cur == abi.QPSSQD && next == abi.QPSRTS, cur == abi.QPSSQD && next == abi.QPSSQD:
		return abi.MaskPKeyIndex | abi.MaskQKey
	}
	return 0
}

// IsUD reports whether q is a UD QP.
func (q *QP) IsUD() bool { return q.typ == abi.QPTypeUD }

// QKey is a UD QP's Q_Key (0 until set, and for other QPs).
func (q *QP) QKey() uint32 { return q.qkey.Load() }

// modifyUD is Modify for a UD QP: the UD column of the state machine; at
// RTR the QP is bound to its datagram sender.
func (q *QP) modifyUD(m *abi.ModifyQP) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed.Load() {
		return abi.Errorf(abi.CodeNotFound, "qp", "QP 0x%x was destroyed", q.qpn)
	}
	cur := abi.QPState(q.state.Load())
	next := cur
	if m.Mask&abi.MaskState != 0 {
		next = m.Attr.State
	}
	if legal[cur]&(1<<next) == 0 {
		return abi.Errorf(abi.CodeState, "qp_state", "QP 0x%x: %s → %s is not a legal transition (IBTA 10.3.1)", q.qpn, cur, next)
	}
	var need []required
	switch {
	case cur == abi.QPSReset && next == abi.QPSInit:
		need = reqInitUD
	case cur == abi.QPSRTR && next == abi.QPSRTS:
		need = reqRTSUD
	}
	allowed := abi.MaskState | optionalAttrsUD(cur, next)
	for _, r := range need {
		if m.Mask&r.mask == 0 {
			return abi.Errorf(abi.CodeInvalid, "mask", "UD QP 0x%x: %s → %s needs %s", q.qpn, cur, next, r.name)
		}
		allowed |= r.mask
	}
	if extra := m.Mask & knownAttrsUD &^ allowed; extra != 0 {
		return abi.Errorf(abi.CodeInvalid, "mask", "UD QP 0x%x: %s → %s does not take the attributes of mask 0x%x (IBTA 10.3.1; ibv_modify_qp fails with EINVAL)",
			q.qpn, cur, next, uint32(extra))
	}
	if m.Mask&abi.MaskQKey != 0 {
		q.attr.QKey = m.Attr.QKey
		q.qkey.Store(m.Attr.QKey)
	}
	if m.Mask&abi.MaskSQPSN != 0 {
		q.attr.SQPSN = m.Attr.SQPSN
	}
	if m.Mask&abi.MaskPort != 0 {
		q.attr.Port = m.Attr.Port
	}
	if cur == abi.QPSInit && next == abi.QPSRTR {
		q.bindPathLocked(&udSender{q: q}, abi.PathInfo{Path: abi.PathNone,
			Reason: "UD: each datagram takes the path of its address handle"})
	}
	if next != cur {
		q.setStateLocked(next)
	}
	return nil
}

// udSender is a UD QP's send side: it executes each SEND to its end,
// handing the datagram to its address handle's path. Owned by the QP's
// send-queue goroutine.
type udSender struct {
	q    *QP
	segs [abi.MaxSGE][]byte
	dg   Datagram
}

var _ SyncExecutor = (*udSender)(nil)

// Kind, Busy, Drop, Flush and PollBudget make u a Path: nothing is ever
// in flight between two calls of Pump.

func (u *udSender) Kind() abi.PathKind        { return abi.PathNone }
func (u *udSender) Busy() bool                { return false }
func (u *udSender) Drop()                     {}
func (u *udSender) Flush()                    {}
func (u *udSender) PollBudget() time.Duration { return DoorbellPoll }

// Pump executes the send queue in RTS, one WQE after the other; in SQD it
// holds the queue.
func (u *udSender) Pump() { u.q.ExecPending(u) }

// Execute sends w's datagram: SEND or SEND with immediate, at most the
// adapter's active MTU, to the address handle, QPN and Q_Key it names.
func (u *udSender) Execute(w *abi.SendWQE, slot []byte) (abi.WCStatus, uint32) {
	q := u.q
	if w.Opcode != abi.OpSend && w.Opcode != abi.OpSendWithImm {
		return abi.WCLocQPOpErr, 0 // UD carries SENDs only
	}
	ahh, dqpn, qkey := abi.UDDest(w)
	a := q.vm.ah(ahh, q.pd, q)
	if a == nil {
		return abi.WCLocQPOpErr, 0 // not an address handle of the QP's PD
	}
	l := q.GatherLocal(w, slot, &u.segs)
	if l.Status != abi.WCSuccess {
		return l.Status, 0
	}
	defer clear(u.segs[:l.NSeg])
	if l.Total > uint64(abi.MaxUDMessage(q.ad.ActiveMTU())) {
		return abi.WCLocLenErr, 0
	}
	if qkey&abi.PrivilegedQKey != 0 {
		qkey = q.qkey.Load() // IBTA: the QP's own Q_Key
	}
	if !q.PortUp() {
		return abi.WCSuccess, 0 // the datagram does not leave: lost, as UD may lose it
	}
	u.dg = Datagram{SrcQPN: q.qpn, DstQPN: dqpn, SGID: q.ad.gid, DGID: a.attr.DGID, QKey: qkey, Imm: w.Imm,
		WithImm: w.Opcode == abi.OpSendWithImm, Solicited: w.Flags&abi.SendSolicited != 0, TrafficClass: a.attr.TrafficClass, HopLimit: a.attr.HopLimit,
		FlowLabel: a.attr.FlowLabel, Payload: u.segs[:l.NSeg], Len: uint32(l.Total)}
	a.path.SendDatagram(&u.dg)
	u.dg.Payload = nil
	q.NoteSent(l.Total)
	return abi.WCSuccess, 0
}

// UDDropped counts the datagrams this device dropped at their
// destination: no such QP or not a UD QP, another Q_Key, a source that
// may not reach it, no receive posted, a QP not in RTR or RTS.
func (d *Device) UDDropped() uint64 { return d.udDropped.Load() }

// DeliverDatagram delivers a datagram received through via to its
// destination QP on this host, or drops it and counts it.
func (d *Device) DeliverDatagram(dg *Datagram, via Via) {
	if !d.deliverDatagram(dg, via) {
		d.udDropped.Add(1)
	}
}

func (d *Device) deliverDatagram(dg *Datagram, via Via) bool {
	if dg.DGID.IsMulticast() {
		return d.deliverMulticast(dg, via) // mcast.go
	}
	q := d.QP(dg.DstQPN)
	if q == nil || !q.IsUD() || q.ad.gid != dg.DGID {
		return false // no UD QP of that number on the adapter the datagram is addressed to
	}
	return d.deliverTo(q, dg, via)
}

// deliverTo delivers dg to UD QP q, or drops it (false).
func (d *Device) deliverTo(q *QP, dg *Datagram, via Via) bool {
	if dg.Len > abi.MaxUDMessage(4096) {
		return false
	}
	r := d.udRouter()
	if r == nil || !q.PortUp() || !r.AdmitDatagram(q.ad, dg.SGID, via) {
		q.ctr.Dropped.Add(1)
		return false
	}
	if !q.Hold() {
		return false // not in RTR, RTS or SQD (counted by Hold), or gone
	}
	defer q.Release()
	if dg.QKey != q.qkey.Load() {
		q.ctr.Dropped.Add(1)
		return false
	}
	q.rqMu.Lock()
	defer q.rqMu.Unlock()
	if q.peekRecvLocked(dg.SrcQPN) != recvReady {
		q.ctr.Dropped.Add(1) // no receive posted: UD drops, it does not wait (no RNR)
		return false
	}
	m := Message{pd: q.pd, mv: q.vm}
	m.nsge = copy(m.sges[:], q.rwqe.SGE[:q.rwqe.NumSGE])
	room, ok := m.resolveRecv(q)
	defer clear(m.segs[:m.nseg])
	total := uint64(abi.GRHSize) + uint64(dg.Len)
	e := abi.CQE{WRID: q.rwqe.WRID, QPNum: q.qpn, Opcode: abi.WCRecv, SrcQP: dg.SrcQPN}
	switch {
	case !ok:
		e.Status = abi.WCLocProtErr
	case room < total:
		e.Status = abi.WCLocLenErr
	default:
		var grh [abi.GRHSize]byte
		g := abi.GRH{SGID: dg.SGID, DGID: dg.DGID, TrafficClass: dg.TrafficClass, HopLimit: dg.HopLimit, FlowLabel: dg.FlowLabel, PayLen: dg.Len}
		abi.PutGRH(grh[:], &g)
		e.SL = abi.GRHType(&g)
		segs := ScatterBytes(m.segs[:m.nseg], grh[:])
		for _, b := range dg.Payload {
			segs = ScatterBytes(segs, b)
		}
		e.Status, e.ByteLen, e.Flags = abi.WCSuccess, uint32(total), abi.WCGRH
		if dg.WithImm {
			e.Imm, e.Flags = dg.Imm, e.Flags|abi.WCWithImm
		}
	}
	q.ctr.noteCompletion(e.Status)
	if e.Status == abi.WCSuccess {
		q.ctr.Recvs.Add(1)
		q.ctr.RecvBytes.Add(uint64(dg.Len))
	}
	if !q.recvCQ.tryPushRecv(&e, q, dg.Solicited) {
		q.ctr.Dropped.Add(1) // the receive CQ is full: the datagram is lost, the receive stays posted
		return false
	}
	return e.Status == abi.WCSuccess
}
