package agent

// The memcpy path: two QPs of this host. The requester's send-queue
// goroutine plays the responder (respond.go) against the remote VM's
// memory, under that VM's memMu for reading, and copies once between the
// two guest memories. A work request is executed to its end before the
// next is looked at, so nothing is ever in flight between two WQEs.

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/rc"
)

// memcpyPath is the memcpy path of one QP; owned by its send-queue
// goroutine.
type memcpyPath struct {
	q      *QP
	peer   *QP // the remote QP, resolved on first use
	segs   [abi.MaxSGE][]byte
	busyWR atomic.Bool // a WR is being executed (for status reports)
	req    Request   // the request the goroutine plays at the responder
	rx     Message   // ... and its state there
	pay    memPayload  // q's segments as the responder's payload
}

func (m *memcpyPath) Kind() abi.PathKind        { return abi.PathMemcpy }
func (m *memcpyPath) Busy() bool                { return false }
func (m *memcpyPath) Drop()                     {}
func (m *memcpyPath) Flush()                    {}
func (m *memcpyPath) PollBudget() time.Duration { return DoorbellPoll }

func (m *memcpyPath) status(st *mgmt.QPStatus) {
	if m.busyWR.Load() {
		st.InFlight = 1
	}
}

// Pump executes the send queue in RTS, one WQE after the other; in SQD it
// holds the queue.
func (m *memcpyPath) Pump() {
	q := m.q
	for q.Sending() && q.State() == abi.QPSRTS {
		n, ok := q.SQPending()
		if !ok || n == 0 {
			return // an invalid tail: drain handles it
		}
		q.ExecOne(m)
	}
}

// Execute gathers the local side of w and delivers it under the RC retry
// rules: transport retries (timeout × retry_cnt) when the responder does
// not answer, RNR retries (min_rnr_timer × rnr_retry, 7 = infinite) when
// it has no receive posted.
func (m *memcpyPath) Execute(w *abi.SendWQE) (abi.WCStatus, uint32) {
	q := m.q
	st, nseg, total := q.GatherLocal(w, q.sqSlot, &m.segs)
	if st != abi.WCSuccess {
		return st, 0
	}
	m.busyWR.Store(true)
	defer m.busyWR.Store(false)
	at := q.RCAttrs()
	var budget RetryBudget
	budget.Arm(&at)
	for {
		out, st, n, rnrTimer := m.deliver(w, m.segs[:nseg], total)
		var d time.Duration
		switch out {
		case OutDone:
			if st == abi.WCSuccess {
				q.bytesSent.Add(total)
			}
			return st, n
		case OutNoPeer:
			if st, ok := budget.Transport(&q.ctr); !ok {
				return st, 0
			}
			d = rc.LocalACKTimeout(at.Timeout)
		case OutRNR:
			if st, ok := budget.RNRNak(&q.ctr); !ok {
				return st, 0
			}
			d = rc.RNRDelay(rnrTimer)
		}
		if !q.Sleep(d) {
			return abi.WCWRFlushErr, 0
		}
	}
}

// peerQP returns the QP at the remote end, resolving it on first use.
func (m *memcpyPath) peerQP() *QP {
	if m.peer != nil && !m.peer.destroyed.Load() {
		return m.peer
	}
	m.peer = nil
	q := m.q
	qpn, gid := q.Remote()
	a := q.vm.a
	a.mu.Lock()
	p := a.qps[qpn]
	a.mu.Unlock()
	if p == nil || p.ad.gid != gid {
		return nil
	}
	m.peer = p
	return p
}

// deliver plays w at the responder p against p's VM's memory. Checks
// happen before any byte moves, so a refused request leaves the target
// untouched.
func (m *memcpyPath) deliver(w *abi.SendWQE, segs [][]byte, total uint64) (Outcome, abi.WCStatus, uint32, uint8) {
	q := m.q
	p := m.peerQP()
	if p == nil {
		return OutNoPeer, 0, 0, 0
	}
	pv := p.vm
	pv.memMu.RLock()
	defer pv.memMu.RUnlock()
	if pv.dead || p.destroyed.Load() {
		return OutNoPeer, 0, 0, 0
	}
	if s := p.State(); s != abi.QPSRTR && s != abi.QPSRTS && s != abi.QPSSQD {
		p.ctr.Dropped.Add(1)
		return OutNoPeer, 0, 0, 0 // a responder outside RTR..SQD drops what it gets
	}
	p.mu.Lock()
	bound := p.remoteQPN == q.qpn && p.remoteGID == q.ad.gid
	p.mu.Unlock()
	if !bound {
		p.ctr.Dropped.Add(1)
		return OutNoPeer, 0, 0, 0 // p is connected to another QP: it ignores us
	}
	if isRdAtomic(w.Opcode) {
		q.ctr.NotePeak(1) // the memcpy path executes one WR at a time
	}
	m.req = Request{Op: w.Opcode, SrcQPN: q.qpn, RKey: w.RKey, RAddr: w.RemoteAddr, Total: total, Imm: w.Imm,
		Compare: w.CompareAdd, Swap: w.Swap}
	m.pay.reset(segs)
	out, st, n, rnrTimer, _ := p.Respond(&m.req, &m.rx, &m.pay)
	return out, st, n, rnrTimer
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

func (m *memPayload) In(dst []byte) error {
	for len(dst) > 0 {
		for len(m.segs[0]) == 0 {
			m.segs = m.segs[1:]
		}
		n := copy(dst, m.segs[0])
		m.segs[0] = m.segs[0][n:]
		dst = dst[n:]
	}
	return nil
}

func (m *memPayload) Out(src []byte) error {
	scatterBytes(m.segs, src)
	return nil
}

func (m *memPayload) Atomic(old uint64) { binary.LittleEndian.PutUint64(m.segs[0], old) }
