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
	q      *qp
	peer   *qp // the remote QP, resolved on first use
	segs   [abi.MaxSGE][]byte
	busyWR atomic.Bool // a WR is being executed (for status reports)
	req    rcRequest   // the request the goroutine plays at the responder
	rx     rxMessage   // ... and its state there
	pay    memPayload  // q's segments as the responder's payload
}

func (m *memcpyPath) kind() abi.PathKind        { return abi.PathMemcpy }
func (m *memcpyPath) busy() bool                { return false }
func (m *memcpyPath) drop()                     {}
func (m *memcpyPath) flush()                    {}
func (m *memcpyPath) pollBudget() time.Duration { return doorbellPoll }

func (m *memcpyPath) status(st *mgmt.QPStatus) {
	if m.busyWR.Load() {
		st.InFlight = 1
	}
}

// pump executes the send queue in RTS, one WQE after the other; in SQD it
// holds the queue.
func (m *memcpyPath) pump() {
	q := m.q
	for q.sending() && q.State() == abi.QPSRTS {
		n, ok := q.sqPending()
		if !ok || n == 0 {
			return // an invalid tail: drain handles it
		}
		q.execOne(m)
	}
}

// execute gathers the local side of w and delivers it under the RC retry
// rules: transport retries (timeout × retry_cnt) when the responder does
// not answer, RNR retries (min_rnr_timer × rnr_retry, 7 = infinite) when
// it has no receive posted.
func (m *memcpyPath) execute(w *abi.SendWQE) (abi.WCStatus, uint32) {
	q := m.q
	st, nseg, total := q.gatherLocal(w, q.sqSlot, &m.segs)
	if st != abi.WCSuccess {
		return st, 0
	}
	m.busyWR.Store(true)
	defer m.busyWR.Store(false)
	at := q.rcAttrs()
	var budget retryBudget
	budget.arm(&at)
	for {
		out, st, n, rnrTimer := m.deliver(w, m.segs[:nseg], total)
		var d time.Duration
		switch out {
		case outDone:
			if st == abi.WCSuccess {
				q.bytesSent.Add(total)
			}
			return st, n
		case outNoPeer:
			if st, ok := budget.transport(&q.ctr); !ok {
				return st, 0
			}
			d = rc.LocalACKTimeout(at.timeout)
		case outRNR:
			if st, ok := budget.rnrNak(&q.ctr); !ok {
				return st, 0
			}
			d = rc.RNRDelay(rnrTimer)
		}
		if !q.sleep(d) {
			return abi.WCWRFlushErr, 0
		}
	}
}

// peerQP returns the QP at the remote end, resolving it on first use.
func (m *memcpyPath) peerQP() *qp {
	if m.peer != nil && !m.peer.destroyed.Load() {
		return m.peer
	}
	m.peer = nil
	q := m.q
	qpn, gid := q.remote()
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
func (m *memcpyPath) deliver(w *abi.SendWQE, segs [][]byte, total uint64) (outcome, abi.WCStatus, uint32, uint8) {
	q := m.q
	p := m.peerQP()
	if p == nil {
		return outNoPeer, 0, 0, 0
	}
	pv := p.vm
	pv.memMu.RLock()
	defer pv.memMu.RUnlock()
	if pv.dead || p.destroyed.Load() {
		return outNoPeer, 0, 0, 0
	}
	if s := p.State(); s != abi.QPSRTR && s != abi.QPSRTS && s != abi.QPSSQD {
		p.ctr.dropped.Add(1)
		return outNoPeer, 0, 0, 0 // a responder outside RTR..SQD drops what it gets
	}
	p.mu.Lock()
	bound := p.remoteQPN == q.qpn && p.remoteGID == q.ad.gid
	p.mu.Unlock()
	if !bound {
		p.ctr.dropped.Add(1)
		return outNoPeer, 0, 0, 0 // p is connected to another QP: it ignores us
	}
	if isRdAtomic(w.Opcode) {
		q.ctr.notePeak(1) // the memcpy path executes one WR at a time
	}
	m.req = rcRequest{op: w.Opcode, srcQPN: q.qpn, rkey: w.RKey, raddr: w.RemoteAddr, total: total, imm: w.Imm,
		compare: w.CompareAdd, swap: w.Swap}
	m.pay.reset(segs)
	out, st, n, rnrTimer, _ := p.respond(&m.req, &m.rx, &m.pay)
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

func (m *memPayload) in(dst []byte) error {
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

func (m *memPayload) out(src []byte) error {
	scatterBytes(m.segs, src)
	return nil
}

func (m *memPayload) atomic(old uint64) { binary.LittleEndian.PutUint64(m.segs[0], old) }
