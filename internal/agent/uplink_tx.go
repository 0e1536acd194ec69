package agent

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
//   - NO_QP, SEQ_ERR, a lost connection, no response within the QP's
//     timeout: transport retry, go-back-N after the timeout; retry_cnt
//     bounds the episodes, then RETRY_EXC_ERR.
//
// A duplicate that reaches the responder (a response was lost, not the
// request) is answered from its cache and never executed twice.

import (
	"fmt"
	"net"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
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
	conn  *tconn // the connection it is in flight on; nil when not sent
	sent  time.Time
	hdr   [tcpwire.HeaderLen]byte // its frame header, as last sent
}

// txState is the window; owned by the QP goroutine.
type txState struct {
	ents    [txWindow]txEntry
	head    int    // ents[head] is the WQE at q.sqHead
	n       int    // entries in the window
	sent    int    // entries [head, head+sent) are in flight
	next    uint32 // SQ index of the next WQE to take into the window
	armed   bool   // retries and rnr hold the oldest's counters
	retries uint8
	rnr     uint8
	failed  bool        // the last send failed (no connection)
	waited  bool        // ... after waiting out the timeout
	probe   bool        // after an RNR, only the oldest goes out until it is accepted
	iov     net.Buffers // the frames of one batch, for one writev
}

// txBatchBytes bounds the payload of one batch of frames: a connection's
// write lock is not held for too long.
const txBatchBytes = 1 << 20

func (q *qp) initTx() {
	for i := range q.tx.ents {
		q.tx.ents[i].slot = make([]byte, q.layout.SQStride)
		q.tx.ents[i].call = newCall()
		q.tx.ents[i].call.wake = q.wakeCh
	}
	q.tx.iov = make(net.Buffers, 0, txWindow*(abi.MaxSGE+1))
}

// poke wakes the QP goroutine wherever it waits.
func (q *qp) poke() {
	q.doorbell.Wake()
	select {
	case q.wakeCh <- struct{}{}:
	default:
	}
}

func (t *txState) at(i int) *txEntry { return &t.ents[(t.head+i)%txWindow] }

// tcpPump runs the window until it is empty and the SQ holds nothing new,
// or the QP leaves RTS/SQD (drain then flushes or drops what is left).
func (q *qp) tcpPump(mem []byte) {
	tx := &q.tx
	if tx.n == 0 {
		tx.next = q.sqHead
	}
	for !q.stop.Load() && q.resets.Load() == q.sqResets {
		s := q.State()
		if s != abi.QPSRTS && s != abi.QPSSQD {
			return
		}
		if !q.txReap() {
			continue
		}
		// A completion may have moved the QP to ERR: nothing more goes out.
		if s = q.State(); s != abi.QPSRTS && s != abi.QPSSQD {
			return
		}
		// In SQD no new WQE is taken, but what the window holds is still
		// sent (again, after a retry) until it completes: the drain.
		if !q.txFill(mem, s == abi.QPSRTS) {
			return // an invalid tail: drain handles it
		}
		if tx.failed {
			tx.failed = false
			q.txRetry(false, 0, tx.waited)
			continue
		}
		if tx.n == 0 {
			return
		}
		q.txWait()
	}
}

// txFill takes new WQEs into the window (when takeNew: not in SQD) and
// sends what is not in flight. It reports false when the SQ tail is
// invalid.
func (q *qp) txFill(mem []byte, takeNew bool) bool {
	tx := &q.tx
	size, stride := q.layout.SQEntries, q.layout.SQStride
	tail := abi.Word(mem, abi.OffSQTail).Load()
	pending, ok := abi.Pending(tail, q.sqHead, size)
	if !ok {
		return false
	}
	for takeNew && tx.n < txWindow && uint32(tx.n) < pending {
		if tx.n > 0 && tx.at(tx.n-1).local != abi.WCSuccess {
			break // nothing after a WR that failed locally: the QP goes to ERR there
		}
		e := tx.at(tx.n)
		off := q.layout.SQOffset + abi.Slot(tx.next, size)*stride
		copy(e.slot, mem[off:off+stride])
		tx.next = abi.Next(tx.next, size)
		tx.n++
		e.conn, e.nseg, e.total = nil, 0, 0
		e.local = abi.DecodeSend(e.slot, &e.wqe, q.caps.MaxSendSGE, q.caps.MaxInlineData)
		if e.local == abi.WCSuccess {
			e.local, e.nseg, e.total = q.gatherLocal(&e.wqe, e.slot, &e.segs)
		}
		if e.local == abi.WCSuccess {
			q.mu.Lock()
			e.psn = q.npsn
			q.npsn = (q.npsn + 1) & tcpwire.PSNMask
			q.mu.Unlock()
		}
	}
	q.mu.Lock()
	depth := max(int(q.attr.MaxRdAtomic), 1) // 0 allows one, as mlx5 and rxe
	q.mu.Unlock()
	// rd counts the READs and atomics among the entries before to: all of
	// them are outstanding (a completed entry leaves the window).
	rd := 0
	for i := 0; i < tx.sent; i++ {
		if isRdAtomic(tx.at(i).wqe.Opcode) {
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
		if isRdAtomic(w.Opcode) {
			if rd >= depth {
				break // max_rd_atomic outstanding
			}
			rd++
		}
		bytes += tx.at(to).total
		to++
	}
	if to > tx.sent {
		q.txSend(to)
		q.ctr.notePeak(uint32(rd))
	}
	return true
}

// isRdAtomic reports whether op is an RDMA READ or an atomic: the requests
// max_rd_atomic counts and a fence waits for.
func isRdAtomic(op abi.Opcode) bool { return op == abi.OpRDMARead || op.IsAtomic() }

// gatherLocal resolves the local side of w (slot is its private copy) into
// segs.
func (q *qp) gatherLocal(w *abi.SendWQE, slot []byte, segs *[abi.MaxSGE][]byte) (abi.WCStatus, int, uint64) {
	var need abi.Access
	if w.Opcode == abi.OpRDMARead || w.Opcode.IsAtomic() {
		need = abi.AccessLocalWrite // the local side is written
	}
	nseg := 0
	var total uint64
	if w.Flags&abi.SendInline != 0 {
		segs[0] = abi.Inline(slot, w)
		nseg, total = 1, uint64(w.InlineLen)
	} else {
		for i := 0; i < int(w.NumSGE); i++ {
			sge := &w.SGE[i]
			b, ok := q.vm.resolve(q.pd, sge.LKey, sge.Addr, uint64(sge.Length), need)
			if !ok {
				return abi.WCLocProtErr, 0, 0
			}
			segs[nseg] = b
			nseg++
			total += uint64(sge.Length)
		}
	}
	if total > maxMessage {
		return abi.WCLocLenErr, 0, 0
	}
	if w.Opcode.IsAtomic() && (nseg != 1 || total != 8) {
		return abi.WCLocLenErr, 0, 0 // an atomic returns 8 bytes into one SGE
	}
	return abi.WCSuccess, nseg, total
}

// txSend sends the entries [tx.sent, to) of the window, in one write when
// it can; on failure (no connection, a write error) tx.failed says so and
// nothing is in flight from tx.sent on.
func (q *qp) txSend(to int) {
	tx := &q.tx
	q.mu.Lock()
	l, dst, timeout := q.link, q.remoteQPN, q.attr.Timeout
	q.mu.Unlock()
	wait := retryTimeout(timeout)
	if l == nil {
		tx.failed, tx.waited = true, false
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
		h := &q.treq
		*h = tcpwire.Header{Version: c.ver, Type: reqTypes[w.Opcode], DstQPN: dst, SrcQPN: q.qpn, PSN: e.psn, RKey: w.RKey,
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
			q.txUnregister(c, i)
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
		q.txUnregister(c, to)
		tx.failed, tx.waited = true, false
		return
	}
	now := time.Now()
	for i := tx.sent; i < to; i++ {
		e := tx.at(i)
		e.conn, e.sent = c, now
	}
	tx.sent = to
}

// txUnregister withdraws the calls of entries [tx.sent, to) from c.
func (q *qp) txUnregister(c *tconn, to int) {
	for i := q.tx.sent; i < to; i++ {
		withdrawCall(c, q.tx.at(i).call)
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
func (q *qp) txReap() bool {
	tx := &q.tx
	for tx.n > 0 {
		e := tx.at(0)
		if e.local != abi.WCSuccess {
			q.txComplete(e.local, 0)
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
			q.txRetry(false, 0, false)
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
			q.txRetry(false, 0, false)
			return false
		}
		switch r.Status {
		case tcpwire.OK:
			n := uint32(e.total)
			if w.Opcode.IsAtomic() {
				putLE64(e.segs[0], r.Compare)
				n = 8
			}
			q.bytesSent.Add(e.total)
			tx.armed, tx.probe = false, false
			q.txComplete(abi.WCSuccess, n)
		case tcpwire.RNR:
			q.txRetry(true, r.RNRTimer, false)
			return false
		case tcpwire.RemAccessErr:
			q.txComplete(abi.WCRemAccessErr, 0)
		case tcpwire.RemOpErr:
			q.txComplete(abi.WCRemOpErr, 0)
		case tcpwire.RemInvReqErr:
			q.txComplete(abi.WCRemInvReqErr, 0)
		default: // NO_QP, SEQ_ERR: as if nothing had answered
			q.txRetry(false, 0, false)
			return false
		}
	}
	return true
}

// txComplete completes the oldest entry with st and removes it from the
// window; an error moves the QP to ERR first.
func (q *qp) txComplete(st abi.WCStatus, n uint32) {
	tx := &q.tx
	e := tx.at(0)
	if st != abi.WCSuccess && st != abi.WCWRFlushErr {
		q.moveToErr(fmt.Sprintf("work request 0x%x (%s) failed: %s", e.wqe.WRID, e.wqe.Opcode, st))
	}
	tx.head = (tx.head + 1) % txWindow
	tx.n--
	if tx.sent > 0 {
		tx.sent--
	}
	clear(e.segs[:e.nseg])
	// Free the slot before the completion is visible.
	q.sqHead = abi.Next(q.sqHead, q.layout.SQEntries)
	abi.Word(q.ring.Bytes(), abi.OffSQHead).Store(q.sqHead)
	q.completeSend(&e.wqe, st, n)
}

// txRecall takes every in-flight entry back: its call is withdrawn (a
// response that arrives later is dropped), and it will be sent again.
func (q *qp) txRecall() {
	tx := &q.tx
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
func (q *qp) txRetry(rnr bool, rnrTimer uint8, waited bool) {
	tx := &q.tx
	q.mu.Lock()
	if !tx.armed {
		tx.retries, tx.rnr, tx.armed = q.attr.RetryCnt, q.attr.RNRRetry, true
	}
	timeout := q.attr.Timeout
	q.mu.Unlock()
	q.txRecall()
	if rnr {
		q.ctr.rnrRcvd.Add(1)
	}
	var delay time.Duration
	switch {
	case rnr && tx.rnr == 0:
		q.txComplete(abi.WCRNRRetryExcErr, 0)
		return
	case rnr:
		if tx.rnr != 7 {
			tx.rnr--
		}
		delay = rnrDelay(rnrTimer)
		tx.probe = true // the rest would only be refused (SEQ_ERR) again
	case tx.retries == 0:
		q.txComplete(abi.WCRetryExcErr, 0)
		return
	default:
		tx.retries--
		q.ctr.retries.Add(1)
		if !waited {
			delay = retryTimeout(timeout)
		}
	}
	q.sleep(delay)
}

// txWait waits for a response, a poke (a state change, a response of a
// later entry) or the oldest entry's timeout. A timeout with no read
// progress on the connection since the request went out closes the
// connection: the peer or the link is gone.
func (q *qp) txWait() {
	tx := &q.tx
	e := tx.at(0)
	if e.conn == nil {
		return
	}
	q.mu.Lock()
	wait := retryTimeout(q.attr.Timeout)
	q.mu.Unlock()
	// Poll first: a response or a new post within doorbellPollTCP then
	// costs no sleep and wake-up of this goroutine's thread.
	tailW := abi.Word(q.ring.Bytes(), abi.OffSQTail)
	takeNew := q.State() == abi.QPSRTS // in SQD new posts wait
	deadline := nanotime() + int64(doorbellPollTCP)
	for {
		if len(e.call.done) > 0 || q.stop.Load() || takeNew && tx.n < txWindow && tailW.Load() != tx.next {
			return
		}
		select {
		case <-q.wakeCh:
			return
		default:
		}
		yieldCPU() // at every turn, as pollHeader
		if nanotime() > deadline {
			break
		}
	}
	left := time.Until(e.sent.Add(wait))
	if left > 0 {
		q.timer.Reset(left)
		select {
		case <-e.call.done:
			e.call.done <- struct{}{} // txReap takes it
			q.timer.Stop()
			return
		case <-q.wakeCh:
			q.timer.Stop()
			return
		case <-q.timer.C:
		}
	}
	if len(e.call.done) > 0 {
		return
	}
	c := e.conn
	if c.lastRead.Load() < e.sent.Sub(monoStart).Nanoseconds() {
		c.close(fmt.Errorf("no response from host %s in %v: link or peer down", c.l.peerID, wait))
		return // the call fails: txReap retries
	}
	// The connection makes progress (other responses flow): the response
	// comes behind them; wait again.
	e.sent = time.Now()
}

// txDrop empties the window without completions (RESET).
func (q *qp) txDrop() {
	q.txRecall()
	tx := &q.tx
	for i := 0; i < tx.n; i++ {
		clear(tx.at(i).segs[:])
	}
	tx.head, tx.n, tx.sent, tx.armed, tx.probe = 0, 0, 0, false, false
}

// txFlush completes every entry of the window with WR_FLUSH_ERR, in order
// (ERR), before drain flushes the rest of the SQ.
func (q *qp) txFlush() {
	q.txRecall()
	for q.tx.n > 0 {
		q.txComplete(abi.WCWRFlushErr, 0)
	}
	q.tx.armed, q.tx.probe = false, false
}
