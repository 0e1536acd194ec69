package tcp

// The tcp path's requester: a window of up to txWindow requests in flight
// per QP, completed in order (RC ordering), with go-back-N on RNR and on
// transport errors.
//
// The QP goroutine (runSQ → drain → tcpPump) copies each new send WQE into
// a window entry (the workload may rewrite its slot at any time), resolves
// its local segments, gives it the next PSN and sends it; it does not wait
// for the response before sending the next. Responses arrive on the
// connection's reader goroutine, which signals the entry's call and pokes
// the QP (wakeCh). The QP goroutine completes entries from the oldest, in
// order, freeing each SQ slot only then:
//
//   - OK: the WR completes.
//   - REM_ACCESS_ERR, REM_OP_ERR, REM_INV_REQ_ERR: the WR completes with
//     that status, the QP moves to ERR and the rest of the window flushes.
//   - RNR: the responder executed nothing from that PSN on (it answers the
//     later ones SEQ_ERR). After the RNR delay the oldest is sent again,
//     alone until it is accepted, then the rest (go-back-N); rnr_retry
//     bounds the episodes.
//   - NO_QP, a lost connection, no response within the QP's timeout:
//     transport retry, go-back-N after the timeout; retry_cnt bounds the
//     episodes, then RETRY_EXC_ERR. SEQ_ERR (an earlier request was lost
//     or overtaken, on the test link) spends a transport retry too, but
//     goes back at once.
//
// A duplicate that reaches the responder (a response was lost, not the
// request) is answered as the first time (an atomic from the responder
// resources, rc.Seq) and never executed twice.

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// txWindow is how many requests a QP keeps in flight on the tcp path.
const txWindow = 16

// txEntry is one send WQE in the window.
type txEntry struct {
	slot  []byte // private copy of the SQ slot
	wqe   abi.SendWQE
	segs  [abi.MaxSGE][]byte
	nseg  int
	total uint64
	psn   uint32
	local abi.WCStatus // not success: failed before it left the host
	call  *call
	conn  *tconn                  // the connection it is in flight on; nil when not sent
	sent  time.Time               // when it was sent, or last found waiting on a live peer (the real clock)
	first time.Time               // when it was sent
	due   time.Time               // when its response is overdue (the QP's clock)
	hdr   [tcpwire.HeaderLen]byte // its frame header, as last sent
}

// txState is the window; owned by the QP goroutine.
type txState struct {
	ents   [txWindow]txEntry
	head   int    // ents[head] is the WQE at the SQ head
	n      int    // entries in the window
	sent   int    // entries [head, head+sent) are in flight
	next   uint32 // SQ index of the next WQE to take into the window
	budget device.RetryBudget
	failed bool        // the last send failed (no connection)
	waited bool        // ... after waiting out the timeout
	probe  bool        // after an RNR, only the oldest goes out until it is accepted
	iov    net.Buffers // the frames of one batch, for one writev
}

// responsePoll is how long a requester with a request in flight polls for
// its response before it sleeps: a response due soon (the ACK of a WRITE,
// a READ's data) then costs no sleep and wake-up of a thread. That is the
// only polling of the tcp path in doorbell mode: its QP goroutine sleeps
// at once when the send queue is empty (PollBudget 0), and its reader in
// the network poller between frames. Polling where nothing is due helped
// programs that yield their CPU (vrdmactl perf) and cost programs that
// busy-wait without yielding (perftest's ib_write_lat spins on its
// buffer): a poller that yields gives its CPU to such a spinner until the
// next tick. Measured on two vCPUs, quickstart --keep's tcp pair,
// alternating rounds (docs/PERF-LOG.md): 8-byte write latency, typical,
// perftest 134 µs with every poller and 60 µs with none; in another
// session, 88–104 µs with every poller, 98–101 with none, 55–84 with this
// one alone (vrdmactl perf 113–129, 107–127, 78–93).
const responsePoll = 200 * time.Microsecond

// txBatchBytes bounds the payload of one batch of frames: a connection's
// write lock is not held for too long.
const txBatchBytes = 1 << 20

// tcpPath is the tcp path of one QP: its requester's window and the link
// to the remote end's host, and its responder's PSN state. It is made when
// the QP enters RTR and dropped at RESET.
type tcpPath struct {
	q        *device.QP
	host     string // the remote end's host ID
	link     *link  // the link to host
	pathKind abi.PathKind

	// Requester: owned by the QP's send-queue goroutine.
	tx   txState
	treq tcpwire.Header // the request being written
	// inflight mirrors tx.n for status reports.
	inflight atomic.Int32

	// Responder: the expected PSN and the last responses, for duplicates
	// (a request retried after its response was lost), used by the
	// readers of the connections host opened. rsp.mu is taken before q.mu.
	rsp responderPSN
}

// responderPSN is an RC responder's sequence state (responder.go).
type responderPSN struct {
	mu sync.Mutex
	// the resets generation seq belongs to
	gen uint32 // +checklocks:mu
	seq rc.Seq // +checklocks:mu
}

func newTCPPath(q *device.QP, host string, l *link) *tcpPath {
	t := &tcpPath{q: q, host: host, link: l, pathKind: abi.PathTCP}
	for i := range t.tx.ents {
		t.tx.ents[i].slot = make([]byte, q.SlotSize())
		t.tx.ents[i].call = newCall()
		t.tx.ents[i].call.wake = q.WakeCh()
	}
	t.tx.iov = make(net.Buffers, 0, txWindow*(abi.MaxSGE+1))
	return t
}

// tcpPathOf returns q's tcp path, nil if q is not bound to one.
func tcpPathOf(q *device.QP) *tcpPath {
	t, _ := q.BoundPath().(*tcpPath)
	return t
}

// Kind, Pump, Busy, Drop, Flush, PollBudget and Status make t a
// device.Path that reports what it has in flight.

var _ device.PathStatuser = (*tcpPath)(nil)

func (t *tcpPath) Kind() abi.PathKind        { return t.pathKind }
func (t *tcpPath) Pump()                     { t.tcpPump() }
func (t *tcpPath) Busy() bool                { return t.tx.n > 0 }
func (t *tcpPath) Drop()                     { t.txDrop() }
func (t *tcpPath) Flush()                    { t.txFlush() }
func (t *tcpPath) PollBudget() time.Duration { return 0 }
func (t *tcpPath) Status(st *mgmt.QPStatus)  { st.InFlight = int(t.inflight.Load()) }

func (t *txState) at(i int) *txEntry { return &t.ents[(t.head+i)%txWindow] }

// tcpPump runs the window until it is empty and the SQ holds nothing new,
// or the QP leaves RTS/SQD (drain then flushes or drops what is left).
func (t *tcpPath) tcpPump() {
	q := t.q
	tx := &t.tx
	if tx.n == 0 {
		tx.next = q.SQHead()
	}
	for q.Sending() {
		s := q.State()
		if s != abi.QPSRTS && s != abi.QPSSQD {
			return
		}
		if !t.txReap() {
			continue
		}
		// A completion may have moved the QP to ERR: nothing more goes out.
		if s = q.State(); s != abi.QPSRTS && s != abi.QPSSQD {
			return
		}
		// In SQD no new WQE is taken, but what the window holds is still
		// sent (again, after a retry) until it completes: the drain.
		if !t.txFill(s == abi.QPSRTS) {
			return // an invalid tail: drain handles it
		}
		if tx.failed {
			tx.failed = false
			t.txRetry(false, 0, tx.waited)
			continue
		}
		if tx.n == 0 {
			return
		}
		t.txWait()
	}
}

// txFill takes new WQEs into the window (when takeNew: not in SQD) and
// sends what is not in flight. It reports false when the SQ tail is
// invalid.
func (t *tcpPath) txFill(takeNew bool) bool {
	q := t.q
	tx := &t.tx
	pending, ok := q.SQPending()
	if !ok {
		return false
	}
	for takeNew && tx.n < txWindow && uint32(tx.n) < pending {
		if tx.n > 0 && tx.at(tx.n-1).local != abi.WCSuccess {
			break // nothing after a WR that failed locally: the QP goes to ERR there
		}
		e := tx.at(tx.n)
		e.local = q.ReadWQE(tx.next, e.slot, &e.wqe)
		tx.next = q.SQNext(tx.next)
		tx.n++
		t.inflight.Store(int32(tx.n))
		e.conn, e.nseg, e.total = nil, 0, 0
		if e.local == abi.WCSuccess {
			e.local, e.nseg, e.total = q.GatherLocal(&e.wqe, e.slot, &e.segs)
		}
		if e.local == abi.WCSuccess {
			e.psn = q.NextPSN()
		}
	}
	depth := max(int(q.RCAttrs().MaxRdAtomic), 1) // 0 allows one, as mlx5 and rxe
	// rd counts the READs and atomics among the entries before to: all of
	// them are outstanding (a completed entry leaves the window).
	rd := 0
	for i := 0; i < tx.sent; i++ {
		if tx.at(i).wqe.Opcode.IsRdAtomic() {
			rd++
		}
	}
	to := tx.sent
	var bytes uint64
	for to < tx.n && !(tx.probe && to > 0) && tx.at(to).local == abi.WCSuccess && (to == tx.sent || bytes < txBatchBytes) {
		w := &tx.at(to).wqe
		if w.Flags&abi.SendFence != 0 && rd > 0 {
			break // a fenced WR waits for every earlier READ and atomic
		}
		if w.Opcode.IsRdAtomic() {
			if rd >= depth {
				break // max_rd_atomic outstanding
			}
			rd++
		}
		bytes += tx.at(to).total
		to++
	}
	if to > tx.sent {
		t.txSend(to)
		q.Counters().NotePeak(uint32(rd))
	}
	return true
}

// txSend sends the entries [tx.sent, to) of the window, in one write when
// it can; on failure (no connection, a write error) tx.failed says so and
// nothing is in flight from tx.sent on.
func (t *tcpPath) txSend(to int) {
	q := t.q
	tx := &t.tx
	at := q.RCAttrs()
	l, dst := t.link, at.RemoteQPN
	wait := rc.LocalACKTimeout(at.Timeout)
	if l == nil || !q.Adapter().Connected() {
		tx.failed, tx.waited = true, false // no link, or the port is down
		return
	}
	start := time.Now()
	c, err := l.conn(wait)
	if err != nil {
		tx.failed, tx.waited = true, time.Since(start) >= wait
		return
	}
	tx.iov = tx.iov[:0]
	var n uint64
	for i := tx.sent; i < to; i++ {
		e := tx.at(i)
		w := &e.wqe
		h := &t.treq
		*h = tcpwire.Header{Version: c.ver, Type: reqTypes[w.Opcode], DstQPN: dst, SrcQPN: q.QPN(), PSN: e.psn, RKey: w.RKey,
			RemoteAddr: w.RemoteAddr, Compare: w.CompareAdd, Swap: w.Swap}
		k := e.call
		k.readSegs = nil
		var pay [][]byte
		switch w.Opcode {
		case abi.OpRDMAWrite, abi.OpSend:
			pay, h.PayloadLen = e.segs[:e.nseg], uint32(e.total)
		case abi.OpRDMAWriteWithImm, abi.OpSendWithImm:
			pay, h.PayloadLen, h.ImmOrLen = e.segs[:e.nseg], uint32(e.total), w.Imm
		case abi.OpRDMARead:
			h.ImmOrLen = uint32(e.total)
			k.readSegs = e.segs[:e.nseg]
		}
		if !c.register(k) {
			t.txUnregister(c, i)
			tx.failed, tx.waited = true, false
			return
		}
		h.Tag = k.tag
		h.Put(e.hdr[:])
		tx.iov = append(tx.iov, e.hdr[:])
		n += tcpwire.HeaderLen
		for _, p := range pay {
			if len(p) > 0 {
				tx.iov = append(tx.iov, p)
				n += uint64(len(p))
			}
		}
	}
	err = c.writeFrames(&tx.iov, n, to-tx.sent)
	clear(tx.iov[:cap(tx.iov)]) // do not keep guest memory reachable
	if err != nil {
		t.txUnregister(c, to)
		tx.failed, tx.waited = true, false
		return
	}
	now, due := time.Now(), q.Device().Clock().Now().Add(wait)
	for i := tx.sent; i < to; i++ {
		e := tx.at(i)
		e.conn, e.sent, e.first, e.due = c, now, now, due
	}
	tx.sent = to
}

// txUnregister withdraws the calls of entries [tx.sent, to) from c.
func (t *tcpPath) txUnregister(c *tconn, to int) {
	for i := t.tx.sent; i < to; i++ {
		withdrawCall(c, t.tx.at(i).call)
	}
}

// withdrawCall takes call k back from c. If the connection already took
// it (a response arrived, or the connection closed and failed it), it
// waits for that signal and consumes it, so that no stale signal is left
// to complete the entry's next attempt: it lets a reader that is storing a
// READ's data finish, and cuts a stalled connection.
func withdrawCall(c *tconn, k *call) {
	if c.withdraw(k) {
		return
	}
	select {
	case <-k.done:
	case <-time.After(writeStall):
		c.close(fmt.Errorf("response from host %s stalled", c.l.peerID))
		<-k.done
	}
}

// txReap completes the window's finished entries from the oldest, in
// order. It reports false when it ran a retry (the caller loops again).
func (t *tcpPath) txReap() bool {
	q := t.q
	tx := &t.tx
	for tx.n > 0 {
		e := tx.at(0)
		if e.local != abi.WCSuccess {
			t.txComplete(e.local, 0)
			return true
		}
		if e.conn == nil {
			return true // not in flight (a send failed): txFill sends it
		}
		select {
		case <-e.call.done:
		default:
			return true
		}
		c := e.conn
		e.conn = nil
		k := e.call
		if k.err != nil {
			t.txRetry(false, 0, false)
			return false
		}
		r := &k.resp
		w := &e.wqe
		want := tcpwire.Ack
		if w.Opcode == abi.OpRDMARead {
			want = tcpwire.ReadResp
		}
		if r.Type != want || r.Status == tcpwire.OK && r.Type == tcpwire.ReadResp && uint64(r.PayloadLen) != e.total {
			c.close(fmt.Errorf("host %s answered a %s with a %s of %d bytes", c.l.peerID, w.Opcode, r.Type, r.PayloadLen))
			t.txRetry(false, 0, false)
			return false
		}
		switch r.Status {
		case tcpwire.OK:
			n := uint32(e.total)
			if w.Opcode.IsAtomic() {
				putLE64(e.segs[0], r.Compare)
				n = 8
			}
			q.NoteSent(e.total)
			tx.budget.Reset()
			tx.probe = false
			t.txComplete(abi.WCSuccess, n)
		case tcpwire.RNR:
			t.txRetry(true, r.RNRTimer, false)
			return false
		case tcpwire.RemAccessErr, tcpwire.RemOpErr, tcpwire.RemInvReqErr:
			t.txComplete(wireNAK(r.Status).Status(), 0)
		case tcpwire.SeqErr:
			// The responder expects an earlier PSN: a request before
			// this one was lost or overtaken. Go back to it at once, as
			// IBTA's requester does on a PSN sequence error NAK.
			t.txRetry(false, 0, true)
			return false
		default: // NO_QP: as if nothing had answered
			t.txRetry(false, 0, false)
			return false
		}
	}
	return true
}

// txComplete completes the oldest entry with st and removes it from the
// window; an error moves the QP to ERR first.
func (t *tcpPath) txComplete(st abi.WCStatus, n uint32) {
	q := t.q
	tx := &t.tx
	e := tx.at(0)
	tx.head = (tx.head + 1) % txWindow
	tx.n--
	t.inflight.Store(int32(tx.n))
	if tx.sent > 0 {
		tx.sent--
	}
	clear(e.segs[:e.nseg])
	q.CompleteHead(&e.wqe, st, n)
}

// txRecall takes every in-flight entry back: its call is withdrawn (a
// response that arrives later is dropped), and it will be sent again.
func (t *tcpPath) txRecall() {
	tx := &t.tx
	for i := 0; i < tx.sent; i++ {
		e := tx.at(i)
		if c := e.conn; c != nil {
			withdrawCall(c, e.call)
			e.conn = nil
		}
	}
	tx.sent = 0
}

// txRetry starts a retry episode at the oldest entry: RNR (rnr) or
// transport. It completes the oldest with RNR_RETRY_EXC_ERR or
// RETRY_EXC_ERR when its counter is spent; otherwise it recalls the
// window and waits the delay (none when the timeout has already been
// waited out), after which txFill sends everything again from the oldest.
func (t *tcpPath) txRetry(rnr bool, rnrTimer uint8, waited bool) {
	q := t.q
	tx := &t.tx
	at := q.RCAttrs()
	tx.budget.Arm(&at)
	timeout := at.Timeout
	t.txRecall()
	var delay time.Duration
	if rnr {
		if st, ok := tx.budget.RNRNak(q.Counters()); !ok {
			t.txComplete(st, 0)
			return
		}
		delay = rc.RNRDelay(rnrTimer)
		tx.probe = true // the rest would only be refused (SEQ_ERR) again
	} else {
		if st, ok := tx.budget.Transport(q.Counters()); !ok {
			t.txComplete(st, 0)
			return
		}
		if !waited {
			delay = rc.LocalACKTimeout(timeout)
		}
	}
	q.Sleep(delay)
}

// txWait waits for a response, a poke (a state change, a response of a
// later entry) or the oldest entry's timeout. A timeout with no read
// progress on the connection since the request went out closes the
// connection: the peer or the link is gone.
func (t *tcpPath) txWait() {
	q := t.q
	tx := &t.tx
	e := tx.at(0)
	if e.conn == nil {
		return
	}
	wait := rc.LocalACKTimeout(q.RCAttrs().Timeout)
	takeNew := q.State() == abi.QPSRTS // in SQD new posts wait
	// Poll first, only while a polling slot is free (device.TrySpin):
	// otherwise one look, then sleep.
	spin := device.TrySpin()
	deadline := nanotime() + int64(responsePoll)
	for {
		if len(e.call.done) > 0 || !q.Sending() || takeNew && tx.n < txWindow && q.PostedBeyond(tx.next) {
			break
		}
		select {
		case <-q.WakeCh():
			if spin {
				device.EndSpin()
			}
			return
		default:
		}
		if !spin || nanotime() > deadline {
			break
		}
		device.YieldCPU() // at every turn: the reader that brings the response may need this CPU
	}
	if spin {
		device.EndSpin()
	}
	if len(e.call.done) > 0 || !q.Sending() || takeNew && tx.n < txWindow && q.PostedBeyond(tx.next) {
		return
	}
	clk := q.Device().Clock()
	if left := e.due.Sub(clk.Now()); left > 0 {
		q.Timer().Reset(left)
		select {
		case <-e.call.done:
			e.call.done <- struct{}{} // txReap takes it
			q.Timer().Stop()
			return
		case <-q.WakeCh():
			q.Timer().Stop()
			return
		case <-q.Timer().C():
		}
	}
	if len(e.call.done) > 0 {
		return
	}
	if t.link.lossy {
		// The request or its response was lost, not the connection:
		// go back to the oldest at once (the timeout is waited out).
		t.txRetry(false, 0, true)
		return
	}
	c := e.conn
	if c.lastRead.Load() < e.sent.Sub(monoStart).Nanoseconds() && (!c.peerAcking(wait) || time.Since(e.first) > slowPeerLimit(wait)) {
		c.close(fmt.Errorf("no response from host %s in %v: link or peer down", c.l.peerID, wait))
		return // the call fails: txReap retries
	}
	// The connection makes progress (other responses flow), or the peer's
	// kernel acknowledges what was sent (its agent is slow: a loaded host,
	// a deep queue on the connection): the response comes behind them;
	// wait again.
	e.sent, e.due = time.Now(), clk.Now().Add(wait)
}

// slowPeerLimit bounds how long a requester waits for a response from a
// peer whose kernel acknowledges what was sent (peerAcking) while no
// response comes: a peer host that died after acknowledging the request
// looks the same, so this is how long its death may go unnoticed.
func slowPeerLimit(wait time.Duration) time.Duration { return max(time.Second, 8*wait) }

// txDrop empties the window without completions (RESET).
func (t *tcpPath) txDrop() {
	t.txRecall()
	tx := &t.tx
	for i := 0; i < tx.n; i++ {
		clear(tx.at(i).segs[:])
	}
	tx.head, tx.n, tx.sent, tx.probe = 0, 0, 0, false
	t.inflight.Store(0)
	tx.budget.Reset()
}

// txFlush completes every entry of the window with WR_FLUSH_ERR, in order
// (ERR), before drain flushes the rest of the SQ.
func (t *tcpPath) txFlush() {
	t.txRecall()
	for t.tx.n > 0 {
		t.txComplete(abi.WCWRFlushErr, 0)
	}
	t.tx.probe = false
	t.tx.budget.Reset()
}
