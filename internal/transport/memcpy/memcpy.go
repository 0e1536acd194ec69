// SPDX-License-Identifier: Apache-2.0

// Package memcpy is the memcpy path: two QPs of this host. The
// requester's send-queue goroutine plays the responder (package device's
// Begin/Place/End, through Respond) against the remote VM's memory, under
// that VM's memory lock for reading, and copies once between the two
// guest memories. A work request is executed to its end before the next
// is looked at, so nothing is ever in flight between two WQEs.
package memcpy

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/bulkcopy"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
)

// path is the memcpy path of one QP; owned by its send-queue goroutine.
type path struct {
	q      device.Source
	ts     device.Targets // the device's QPs, where the remote QP is
	peer   device.Target  // the remote QP, resolved on first use
	segs   [abi.MaxSGE][]byte
	busyWR atomic.Bool    // a WR is being executed (for status reports)
	req    device.Request // the request the goroutine plays at the responder
	rx     device.Message // ... and its state there
	pay    memPayload     // q's segments as the responder's payload
	uc     bool           // q is UC (as Execute last read its attributes)
}

// Bind returns the maker of the memcpy path of a QP bound at RTR to a QP
// of the same device, which it finds in ts; for a device.Route.
func Bind(ts device.Targets) func(q device.Source) device.Path {
	return func(q device.Source) device.Path { return &path{q: q, ts: ts} }
}

// Kind, Busy, Drop, Flush, PollBudget, Pump and Status make m a
// device.Path: nothing is ever in flight between two calls of Pump.

var _ device.PathStatuser = (*path)(nil)

func (m *path) Kind() abi.PathKind        { return abi.PathMemcpy }
func (m *path) Busy() bool                { return false }
func (m *path) Drop()                     {}
func (m *path) Flush()                    {}
func (m *path) PollBudget() time.Duration { return device.DoorbellPoll }

// Status reports a WR waiting out an RNR or retry delay as in flight.
func (m *path) Status(st *mgmt.QPStatus) {
	if m.busyWR.Load() {
		st.InFlight = 1
	}
}

// Pump executes the send queue in RTS, one WQE after the other; in SQD it
// holds the queue.
func (m *path) Pump() { m.q.ExecPending(m) }

// Execute gathers the local side of w and delivers it under the RC retry
// rules: transport retries (timeout × retry_cnt) when the responder does
// not answer, RNR retries (min_rnr_timer × rnr_retry, 7 = infinite) when
// it has no receive posted.
func (m *path) Execute(w *abi.SendWQE, slot []byte) (abi.WCStatus, uint32) {
	q := m.q
	l := q.GatherLocal(w, slot, &m.segs)
	if l.Status != abi.WCSuccess {
		return l.Status, 0
	}
	nseg, total := l.NSeg, l.Total
	m.busyWR.Store(true)
	defer m.busyWR.Store(false)
	at := q.RCAttrs()
	if m.uc = at.UC; m.uc {
		return m.sendUC(w, m.segs[:nseg], total)
	}
	var budget device.RetryBudget
	budget.Arm(&at)
	for {
		r := m.deliver(w, m.segs[:nseg], total)
		var d time.Duration
		switch r.Out {
		case device.OutDone:
			if r.Status == abi.WCSuccess {
				q.NoteSent(total)
			}
			return r.Status, r.N
		case device.OutNoPeer:
			if st, ok := budget.Transport(q.Counters()); !ok {
				return st, 0
			}
			d = rc.LocalACKTimeout(at.Timeout)
		case device.OutRNR:
			if st, ok := budget.RNRNak(q.Counters()); !ok {
				return st, 0
			}
			d = rc.RNRDelay(r.RNRTimer)
		}
		if !q.Sleep(d) {
			return abi.WCWRFlushErr, 0
		}
	}
}

// Bound makes m a device.Binding: p is bound to the memcpy path, is of
// m's QP's transport (RC, UC), and is connected to m's QP. A QP bound to
// another path (tcp, rdma) takes requests only from that path's
// responder, even from a QP of this host whose number and GID are the
// ones it was connected to (a GID that moved here from another host, a
// QPN that came round again).
func (m *path) Bound(p device.Target) bool {
	if _, ok := p.BoundPath().(*path); !ok || (p.Type() == abi.QPTypeUC) != m.uc {
		return false
	}
	qpn, gid := p.Remote()
	return qpn == m.q.QPN() && gid == m.q.GID()
}

// peerQP returns the QP at the remote end, resolving it on first use.
func (m *path) peerQP() device.Target {
	if m.peer != nil && !m.peer.Destroyed() {
		return m.peer
	}
	m.peer = nil
	q := m.q
	qpn, gid := q.Remote()
	p := m.ts.Target(qpn)
	if p == nil || p.GID() != gid {
		return nil
	}
	m.peer = p
	return p
}

// deliver plays w at the responder p against p's VM's memory. Checks
// happen before any byte moves, so a refused request leaves the target
// untouched.
func (m *path) deliver(w *abi.SendWQE, segs [][]byte, total uint64) device.Response {
	q := m.q
	if !q.PortUp() {
		return device.Response{Verdict: device.Verdict{Out: device.OutNoPeer}} // our port is down: the request does not leave
	}
	p := m.peerQP()
	if p == nil || !p.Admit(m) {
		return device.Response{Verdict: device.Verdict{Out: device.OutNoPeer}} // gone, its port down, or connected to another QP
	}
	defer p.Release()
	if w.Opcode.IsRdAtomic() {
		q.Counters().NotePeak(1) // the memcpy path executes one WR at a time
	}
	m.req = device.Request{Op: w.Opcode, SrcQPN: q.QPN(), RKey: w.RKey, RAddr: w.RemoteAddr, Total: total, Imm: w.Imm,
		Compare: w.CompareAdd, Swap: w.Swap, Solicited: w.Flags&abi.SendSolicited != 0, SRQN: w.XRCSRQN}
	if w.Opcode == abi.OpSendWithInv {
		m.req.RKey, m.req.Imm = w.InvalidateRKey(), 0
	}
	m.pay.reset(segs)
	r, _ := p.Respond(&m.req, &m.rx, &m.pay) // memPayload never fails
	return r
}

// memPayload is the memcpy path's payload: the requester's own segments.
type memPayload struct {
	arr  [abi.MaxSGE][]byte
	segs [][]byte
}

func (m *memPayload) reset(segs [][]byte) {
	n := copy(m.arr[:], segs)
	m.segs = m.arr[:n]
}

// In, Out and Atomic make m a device.Payload.

// In fills dst from the requester's segments.
func (m *memPayload) In(dst []byte) error {
	for len(dst) > 0 {
		for len(m.segs[0]) == 0 {
			m.segs = m.segs[1:]
		}
		n := bulkcopy.Copy(dst, m.segs[0])
		m.segs[0] = m.segs[0][n:]
		dst = dst[n:]
	}
	return nil
}

// Out scatters a READ's data into the requester's segments.
func (m *memPayload) Out(src []byte) error {
	device.ScatterBytes(m.segs, src)
	return nil
}

// Atomic writes an atomic's original value into the requester's segment.
func (m *memPayload) Atomic(old uint64) { binary.LittleEndian.PutUint64(m.segs[0], old) }
