// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/vrdma/vrdma"
)

// Op is what a ledgered work request does.
type Op uint8

// The operations the harness posts.
const (
	OpSend     Op = iota + 1 // SEND; lands at the receiver
	OpWrite                  // RDMA WRITE; lands at the target, seen by a READ back
	OpRead                   // RDMA READ; lands at the requester
	OpFetchAdd               // ATOMIC FETCH_AND_ADD of 1
	OpRecv                   // a receive
	// OpReadCounter is the READ of the FETCH_ADD target that ends a run
	// (Ledger.Counter): no checksum, the ledger checks the value.
	OpReadCounter
)

var opNames = [...]string{OpSend: "SEND", OpWrite: "WRITE", OpRead: "READ", OpFetchAdd: "FETCH_ADD", OpRecv: "RECV", OpReadCounter: "READ_COUNTER"}

// String returns the operation's name.
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// WR is a work request as the ledger records it when it is posted.
type WR struct {
	QPN uint32 `json:"qpn"`
	ID  uint64 `json:"id"`
	Op  Op     `json:"op"`
	// Len and Sum are the length and checksum (Sum) of the bytes that
	// must land where the WR puts them: the message at the receiver
	// (SEND), the target's bytes (WRITE), the requester's (READ). Zero for
	// a FETCH_ADD and a receive.
	Len int    `json:"len,omitempty"`
	Sum uint64 `json:"sum,omitempty"`
}

// Recorder takes what a side sees: the WRs it posts, their completions,
// and the bytes that landed. A Ledger is one; a workload process writes
// the same records to its standard output (Workload).
type Recorder interface {
	// Posted records a WR just posted.
	Posted(w WR)
	// Completed records a completion polled from a CQ.
	Completed(wc vrdma.WorkCompletion)
	// Landed records the n bytes, of checksum sum, that WR id of QP qpn
	// put where it lands, as they were found there.
	Landed(qpn uint32, id uint64, n int, sum uint64)
}

// RunRecorder is a Recorder that also takes what a requester learns: the
// results of its FETCH_ADDs, the target's final count, and the WRs that
// died with its agent. A Ledger is one; so is a workload process's
// output.
type RunRecorder interface {
	Recorder
	// Fetched records the value FETCH_ADD id of QP qpn returned.
	Fetched(qpn uint32, id uint64, old uint64)
	// Counter records the final value of the FETCH_ADDs' target.
	Counter(v uint64)
	// Abandon records that QP qpn's outstanding WRs will never complete.
	Abandon(qpn uint32, why string)
}

// Policy says which outcomes a run may have.
type Policy struct {
	// Allowed are the error statuses a WR may complete with (a fault ran:
	// a peer killed, a link cut for good); none means every WR must
	// succeed.
	Allowed []vrdma.WCStatus
}

// Lenient allows what a kill or a cut may cause: the oldest WR in flight
// fails with RETRY_EXC_ERR (no answer) and the rest flush; a receive or a
// WR posted to a QP in ERR flushes.
var Lenient = Policy{Allowed: []vrdma.WCStatus{vrdma.WCRetryExcErr, vrdma.WCWRFlushErr}}

// Report counts what a ledger saw, for a test's log or a soak's report.
type Report struct {
	Posted     int            `json:"posted"`
	Completed  int            `json:"completed"`
	Bytes      uint64         `json:"bytes"`      // of WRs completed successfully
	ByStatus   map[string]int `json:"by_status"`  // completions
	ByOp       map[string]int `json:"by_op"`      // WRs posted
	Verified   int            `json:"verified"`   // WRs whose bytes were checked where they landed
	Unverified int            `json:"unverified"` // successful WRs whose landing could not be checked after a fault
	Abandoned  int            `json:"abandoned"`  // WRs of a side whose process or agent died
	Lost       int            `json:"lost"`       // posted, never completed
	Duplicates int            `json:"duplicates"` // completed or delivered twice
	Mismatches int            `json:"mismatches"` // bytes that landed wrong
	Violations []string       `json:"violations"` // every failure, in words
}

// String summarises the report on one line.
func (r Report) String() string {
	var st []string
	for k, v := range r.ByStatus {
		st = append(st, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(st)
	return fmt.Sprintf("%d WRs posted, %d completed (%s), %d bytes, %d verified end to end, %d unverified, %d abandoned; %d lost, %d duplicates, %d mismatches",
		r.Posted, r.Completed, strings.Join(st, " "), r.Bytes, r.Verified, r.Unverified, r.Abandoned, r.Lost, r.Duplicates, r.Mismatches)
}

// Ledger is the record of every WR of a run. It is safe for concurrent
// use: requesters and responders record into it from their goroutines.
type Ledger struct {
	mu      sync.Mutex
	entries map[wrKey]*entry // +checklocks:mu
	// order is every entry in posting order.
	order  []*entry        // +checklocks:mu
	queues map[qKey]*queue // +checklocks:mu
	// gone holds the QPs whose peer died, and why.
	gone map[uint32]string // +checklocks:mu
	// early are the violations found as records arrived; dups and mism
	// count duplicates and mismatches among them.
	early []string // +checklocks:mu
	dups  int      // +checklocks:mu
	mism  int      // +checklocks:mu
	// counter is the FETCH_ADD target's final value, once read.
	counter *uint64 // +checklocks:mu
	// closing is set once the run is over and its QPs go to ERR
	// (CloseBooks).
	closing bool // +checklocks:mu
	// orphans are landings of WRs not on record yet: a workload
	// process's records of its posts may reach the ledger after the
	// bytes landed here. Verify resolves them.
	orphans []landing // +checklocks:mu
}

// landing is one Landed record.
type landing struct {
	qpn uint32
	id  uint64
	n   int
	sum uint64
}

type wrKey struct {
	qpn uint32
	id  uint64
}

// qKey is one work queue: a QP's send queue or its receive queue.
type qKey struct {
	qpn  uint32
	recv bool
}

// queue is what the ledger knows of one work queue's order.
type queue struct {
	posted []uint64 // IDs in posting order
	next   int      // index in posted of the next completion expected
	failed string   // the first error completion, "" while none
	warned bool     // an order violation was reported already
}

type entry struct {
	wr        WR
	pos       int // index in its queue's posted
	wcs       []vrdma.WorkCompletion
	landed    int
	landedOK  bool
	abandoned string // why it will never complete, "" if it must
	closed    bool   // flushed as the books closed (CloseBooks)
	fetched   bool
	old       uint64 // FETCH_ADD's result
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{entries: map[wrKey]*entry{}, queues: map[qKey]*queue{}, gone: map[uint32]string{}}
}

// Posted records WR w. Posting the same QP and ID twice is a bug of the
// driver and is reported as a violation.
func (l *Ledger) Posted(w WR) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := wrKey{w.QPN, w.ID}
	if _, ok := l.entries[k]; ok {
		l.early = append(l.early, fmt.Sprintf("WR %d posted twice on QP 0x%x (a bug of the driver: IDs must be unique)", w.ID, w.QPN))
		return
	}
	q := l.queue(qKey{w.QPN, w.Op == OpRecv})
	e := &entry{wr: w, pos: len(q.posted)}
	q.posted = append(q.posted, w.ID)
	l.entries[k] = e
	l.order = append(l.order, e)
}

// +checklocks:l.mu
func (l *Ledger) queue(k qKey) *queue {
	q := l.queues[k]
	if q == nil {
		q = &queue{}
		l.queues[k] = q
	}
	return q
}

// Completed records completion wc (its QPNum and WRID name the WR).
func (l *Ledger) Completed(wc vrdma.WorkCompletion) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[wrKey{wc.QPNum, wc.WRID}]
	if e == nil {
		l.early = append(l.early, fmt.Sprintf("completion of WR %d on QP 0x%x, which was never posted: %s", wc.WRID, wc.QPNum, fmtWC(wc)))
		return
	}
	e.wcs = append(e.wcs, wc)
	if len(e.wcs) == 1 && l.closing && wc.Status == vrdma.WCWRFlushErr {
		e.closed = true
	}
	if len(e.wcs) == 2 {
		l.dups++
		l.early = append(l.early, fmt.Sprintf("%s completed twice: first %s, then %s", e.wr, fmtWC(e.wcs[0]), fmtWC(wc)))
	}
	if len(e.wcs) > 1 {
		return
	}
	q := l.queue(qKey{wc.QPNum, e.wr.Op == OpRecv})
	if e.pos != q.next && !q.warned {
		q.warned = true
		l.early = append(l.early, fmt.Sprintf("%s completed out of order: WR %d was next on its queue (a queue completes in posting order)", e.wr, q.posted[min(q.next, len(q.posted)-1)]))
	}
	q.next = max(q.next, e.pos+1)
	switch {
	case q.failed != "" && wc.Status != vrdma.WCWRFlushErr:
		l.early = append(l.early, fmt.Sprintf("%s completed %s after %s on the same queue: after an error every later WR must flush", e.wr, wc.Status, q.failed))
	case q.failed == "" && wc.Status != vrdma.WCSuccess:
		q.failed = fmt.Sprintf("%s failed with %s", e.wr, wc.Status)
	}
}

// Landed records the bytes WR id of QP qpn put where it lands: n bytes of
// checksum sum. A SEND's bytes are recorded by its receiver, a WRITE's by
// the READ that reads them back, a READ's by its requester.
func (l *Ledger) Landed(qpn uint32, id uint64, n int, sum uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.land(landing{qpn, id, n, sum}, false)
}

// land applies a landing; one of a WR not on record is kept for Verify,
// unless final.
//
// +checklocks:l.mu
func (l *Ledger) land(g landing, final bool) {
	e := l.entries[wrKey{g.qpn, g.id}]
	if e == nil {
		if !final {
			l.orphans = append(l.orphans, g)
			return
		}
		l.mism++
		l.early = append(l.early, fmt.Sprintf("%d bytes landed for WR %d of QP 0x%x, which was never posted", g.n, g.id, g.qpn))
		return
	}
	e.landed++
	if e.landed == 2 && e.wr.Op == OpSend {
		l.dups++
		l.early = append(l.early, fmt.Sprintf("%s delivered twice", e.wr))
	}
	ok := g.n == e.wr.Len && g.sum == e.wr.Sum
	if !ok {
		l.mism++
		l.early = append(l.early, fmt.Sprintf("byte mismatch: %s: %d bytes of checksum %016x landed, want %d bytes of checksum %016x", e.wr, g.n, g.sum, e.wr.Len, e.wr.Sum))
	}
	if e.landed == 1 {
		e.landedOK = ok
	}
}

// Fetched records the value FETCH_ADD id of QP qpn returned.
func (l *Ledger) Fetched(qpn uint32, id uint64, old uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.entries[wrKey{qpn, id}]; e != nil {
		e.fetched, e.old = true, old
	}
}

// Counter records the final value of the FETCH_ADDs' target, which
// started at 0.
func (l *Ledger) Counter(v uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counter = &v
}

// CloseBooks records that the run is over and its QPs are being moved to
// ERR so that every WR still posted (a responder's receives) completes:
// the WR_FLUSH_ERR completions from now on are allowed under every
// policy.
func (l *Ledger) CloseBooks() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closing = true
}

// Abandon records that QP qpn's WRs still outstanding will never
// complete: the process or the agent that held the QP died with them.
func (l *Ledger) Abandon(qpn uint32, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.order {
		if e.wr.QPN == qpn && len(e.wcs) == 0 && e.abandoned == "" {
			e.abandoned = why
		}
	}
}

// PeerGone records that QP qpn's peer died (why): the bytes of its WRs
// that completed may not have been checked where they land.
func (l *Ledger) PeerGone(qpn uint32, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gone[qpn] = why
}

// Outstanding returns how many WRs are posted and neither completed nor
// abandoned.
func (l *Ledger) Outstanding() int { return l.outstanding(func(uint32) bool { return true }) }

// OutstandingOn is Outstanding for the WRs of QP qpn.
func (l *Ledger) OutstandingOn(qpn uint32) int {
	return l.outstanding(func(q uint32) bool { return q == qpn })
}

func (l *Ledger) outstanding(on func(qpn uint32) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.order {
		if len(e.wcs) == 0 && e.abandoned == "" && on(e.wr.QPN) {
			n++
		}
	}
	return n
}

// Verify checks the whole record under p and returns its report; the
// error lists every violation (nil if none).
func (l *Ledger) Verify(p Policy) (Report, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	orphans := l.orphans
	l.orphans = nil
	for _, g := range orphans {
		l.land(g, true)
	}
	r := Report{ByStatus: map[string]int{}, ByOp: map[string]int{}, Duplicates: l.dups, Mismatches: l.mism}
	v := slices.Clone(l.early)
	var adds, addsOK int
	olds := map[uint64]*entry{}
	for _, e := range l.order {
		r.Posted++
		r.ByOp[e.wr.Op.String()]++
		if e.wr.Op == OpFetchAdd {
			adds++
		}
		if len(e.wcs) == 0 {
			if e.abandoned != "" {
				r.Abandoned++
				continue
			}
			r.Lost++
			v = append(v, fmt.Sprintf("lost: %s was posted and never completed", e.wr))
			continue
		}
		wc := e.wcs[0]
		r.Completed++
		r.ByStatus[wc.Status.String()]++
		if wc.Status != vrdma.WCSuccess {
			if !e.closed && !slices.Contains(p.Allowed, wc.Status) {
				v = append(v, fmt.Sprintf("%s completed %s, a status this run must not see (allowed: %v)", e.wr, fmtWC(wc), p.Allowed))
			}
			continue
		}
		r.Bytes += uint64(e.wr.Len)
		switch e.wr.Op {
		case OpSend, OpWrite, OpRead:
			switch {
			case e.landed > 0 && e.landedOK:
				r.Verified++
			case e.landed > 0: // a mismatch, reported as it landed
			case l.gone[e.wr.QPN] != "" && e.wr.Op != OpRead:
				r.Unverified++
			case e.wr.Op == OpWrite && len(p.Allowed) > 0:
				r.Unverified++ // its READ back failed with the fault
			default:
				v = append(v, fmt.Sprintf("%s completed successfully but its bytes were never seen where they land", e.wr))
			}
		case OpFetchAdd:
			addsOK++
			if !e.fetched {
				v = append(v, fmt.Sprintf("%s completed successfully but its result was never read", e.wr))
				continue
			}
			if prev := olds[e.old]; prev != nil {
				r.Duplicates++
				v = append(v, fmt.Sprintf("%s and %s both returned %d: an atomic executed twice, or its result is wrong", prev.wr, e.wr, e.old))
			}
			olds[e.old] = e
		}
	}
	if l.counter != nil {
		c := *l.counter
		switch {
		case c < uint64(addsOK) || c > uint64(adds):
			v = append(v, fmt.Sprintf("the FETCH_ADD target holds %d after %d adds of 1 posted, %d succeeded: an atomic was executed twice or lost", c, adds, addsOK))
		case len(p.Allowed) == 0 && c != uint64(addsOK):
			v = append(v, fmt.Sprintf("the FETCH_ADD target holds %d after %d adds of 1 succeeded", c, addsOK))
		}
		for old, e := range olds {
			if old >= c {
				v = append(v, fmt.Sprintf("%s returned %d, not below the target's final %d", e.wr, old, c))
			}
		}
	}
	r.Violations = v
	if len(v) == 0 {
		return r, nil
	}
	const most = 20
	shown := v[:min(len(v), most)]
	more := ""
	if len(v) > most {
		more = fmt.Sprintf("\n… and %d more", len(v)-most)
	}
	return r, errors.New("ledger: " + fmt.Sprint(len(v)) + " violations:\n" + strings.Join(shown, "\n") + more)
}

// String names a WR in messages.
func (w WR) String() string {
	return fmt.Sprintf("WR %d (%s, %d bytes) on QP 0x%x", w.ID, w.Op, w.Len, w.QPN)
}

// fmtWC formats a completion for messages.
func fmtWC(wc vrdma.WorkCompletion) string {
	return fmt.Sprintf("{wr %d %s %s len %d qp 0x%x}", wc.WRID, wc.Opcode, wc.Status, wc.ByteLen, wc.QPNum)
}
