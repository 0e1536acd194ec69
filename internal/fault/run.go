// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/vrdma/vrdma"
)

// Config shapes a run of traffic (Run).
type Config struct {
	// Seed makes the run's choices and payloads; the responder's side
	// must have been made with the same seed (its read slots).
	Seed uint64
	// FirstID is the ID before the run's first WR: runs of one QP that
	// share a ledger must not reuse IDs (start a run at the previous
	// one's Result.LastID).
	FirstID uint64
	// WRs is how many WRs to post, not counting the READs that check
	// WRITEs and the final READ of the FETCH_ADD target.
	WRs int
	// Window is the most WRs in flight; at most the layout's slots.
	Window int
	// MaxLen is the longest message; at most the layout's slot size.
	MaxLen int
	// Drain bounds the wait for the last completions once posting has
	// stopped; default 30 s. WRs still outstanding then are lost.
	Drain time.Duration
	// Progress, if set, is called on the run's goroutine after each
	// completion with the number of completions so far: where a test
	// injects its fault. It must not block for long.
	Progress func(done int)
}

// Result is how a run ended.
type Result struct {
	Posted    int    // WRs posted, READs back and the final READ included
	Completed int    // completions polled
	LastID    uint64 // the ID of the last WR posted
	Failed    bool   // a WR completed with an error: the QP is in ERR
	AgentGone bool   // the side's agent died
	// Outstanding is how many WRs had not completed when the run gave up
	// waiting (Config.Drain): the ledger counts them as lost.
	Outstanding int
}

// flight is a WR in flight.
type flight struct {
	op    Op
	n     int    // bytes
	sum   uint64 // of the bytes it moves, as posted
	own   int    // own slot
	wslot int    // the peer's write slot it holds, -1 for none
	write uint64 // for a READ back: the WRITE it checks
}

// verifyWrite is a WRITE that completed and waits for its READ back.
type verifyWrite struct {
	id    uint64
	wslot int
	n     int
	sum   uint64
}

// Run posts cfg.WRs work requests from side a to target t — SENDs,
// RDMA WRITEs (each read back once it completed, and the bytes checked),
// RDMA READs of the target's read slots and FETCH_ADDs of 1 on its
// counter, in a mix drawn from cfg.Seed — with at most cfg.Window in
// flight, records each in l, and waits for every completion. A SEND needs
// a receive at the target: run a Responder there. Once a WR fails (the
// QP is in ERR) it posts two more, which must flush, and stops posting.
// When all went well it reads the FETCH_ADD target last (Ledger.Counter).
//
// Run returns an error only when the harness cannot go on (a post
// refused for a reason other than the agent's death, a context ended);
// what the WRs did is in the ledger, how the run ended in the Result.
func Run(ctx context.Context, a *Side, t Target, l RunRecorder, cfg Config) (Result, error) {
	if cfg.Window <= 0 || cfg.Window > a.L.Slots || cfg.Window > t.Layout.Slots {
		return Result{}, fmt.Errorf("fault: run: window %d must be in [1, %d]", cfg.Window, min(a.L.Slots, t.Layout.Slots))
	}
	if cfg.MaxLen < 8 || cfg.MaxLen > a.L.SlotSize || cfg.MaxLen > t.Layout.SlotSize {
		return Result{}, fmt.Errorf("fault: run: max length %d must be in [8, %d]", cfg.MaxLen, min(a.L.SlotSize, t.Layout.SlotSize))
	}
	if cfg.Drain == 0 {
		cfg.Drain = 30 * time.Second
	}
	r := &runner{a: a, t: t, l: l, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), inflight: map[uint64]*flight{}, nextID: cfg.FirstID}
	for i := range a.L.Slots {
		r.freeOwn = append(r.freeOwn, i)
	}
	for i := range t.Layout.Slots {
		r.freeWrite = append(r.freeWrite, i)
	}
	return r.run(ctx)
}

// runner is one Run's state, on the run's goroutine only.
type runner struct {
	a   *Side
	t   Target
	l   RunRecorder
	cfg Config
	rng *rand.Rand

	res       Result
	nextID    uint64
	chosen    int // WRs of cfg.WRs posted
	inflight  map[uint64]*flight
	freeOwn   []int
	freeWrite []int
	verify    []verifyWrite
	markers   int    // WRs posted after the failure
	counterID uint64 // the final READ of the FETCH_ADD target, 0 before
}

func (r *runner) run(ctx context.Context) (Result, error) {
	wc := make([]vrdma.WorkCompletion, 32)
	var drainBy time.Time
	for {
		if err := r.post(); err != nil {
			return r.res, err
		}
		if r.res.AgentGone {
			// Nothing more completes: the WRs still in flight, posted
			// before the library saw the agent's death, died with it.
			r.res.Outstanding = len(r.inflight)
			r.l.Abandon(r.a.QP.QPN(), "its agent died")
			return r.res, nil
		}
		if len(r.inflight) == 0 && r.doneposting() {
			if r.res.Failed || r.counterID != 0 {
				return r.res, nil
			}
			if err := r.postCounterRead(); err != nil {
				return r.res, err
			}
			continue
		}
		if r.doneposting() && drainBy.IsZero() {
			drainBy = time.Now().Add(r.cfg.Drain)
		}
		if !drainBy.IsZero() && time.Now().After(drainBy) {
			r.res.Outstanding = len(r.inflight)
			return r.res, nil
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := r.a.SCQ.Wait(wctx)
		cancel()
		if ctx.Err() != nil {
			return r.res, fmt.Errorf("fault: run on QP 0x%x: %w (%d WRs in flight)", r.a.QP.QPN(), ctx.Err(), len(r.inflight))
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			if errors.Is(err, vrdma.ErrAgentGone) {
				r.res.AgentGone = true
				continue
			}
			return r.res, fmt.Errorf("fault: run on QP 0x%x: wait on its send CQ: %w", r.a.QP.QPN(), err)
		}
		n, err := r.a.SCQ.Poll(wc)
		if errors.Is(err, vrdma.ErrAgentGone) {
			r.res.AgentGone = true
			continue
		}
		if err != nil {
			return r.res, fmt.Errorf("fault: run on QP 0x%x: poll its send CQ: %w", r.a.QP.QPN(), err)
		}
		for _, w := range wc[:n] {
			r.complete(w)
		}
	}
}

// doneposting reports whether the run posts no more WRs of its own.
func (r *runner) doneposting() bool {
	if r.res.Failed {
		return r.markers == 2
	}
	return r.chosen == r.cfg.WRs && len(r.verify) == 0
}

// post posts what the window allows.
func (r *runner) post() error {
	for len(r.inflight) < r.cfg.Window && !r.res.AgentGone {
		switch {
		case r.res.Failed && r.markers < 2:
			r.markers++
			if err := r.postOne(OpSend, 8, nil); err != nil {
				return err
			}
		case r.res.Failed:
			return nil
		case len(r.verify) > 0 && len(r.freeOwn) > 0:
			v := r.verify[0]
			r.verify = r.verify[1:]
			if err := r.postOne(OpRead, v.n, &v); err != nil {
				return err
			}
		case r.chosen < r.cfg.WRs && len(r.freeOwn) > 0:
			op := r.choose()
			r.chosen++
			n := 8 + r.rng.IntN(r.cfg.MaxLen-7)
			if err := r.postOne(op, n, nil); err != nil {
				return err
			}
		default:
			return nil
		}
	}
	return nil
}

// choose draws the next WR's operation: 35 % SEND, 30 % WRITE (if a write
// slot is free), 25 % READ, 10 % FETCH_ADD.
func (r *runner) choose() Op {
	switch p := r.rng.IntN(100); {
	case p < 35:
		return OpSend
	case p < 65 && len(r.freeWrite) > 0:
		return OpWrite
	case p < 90:
		return OpRead
	default:
		return OpFetchAdd
	}
}

// postOne posts one WR of op and n bytes; v, if set, is the WRITE a READ
// checks.
func (r *runner) postOne(op Op, n int, v *verifyWrite) error {
	r.nextID++
	id := r.nextID
	r.res.LastID = id
	a, t := r.a, r.t
	f := &flight{op: op, own: r.freeOwn[0], wslot: -1}
	r.freeOwn = r.freeOwn[1:]
	own := a.MR.Bytes()[a.L.slot(areaOwn, f.own):][:a.L.SlotSize]
	ownSGE := a.MR.SGE(a.L.slot(areaOwn, f.own), n)
	w := WR{QPN: a.QP.QPN(), ID: id, Op: op, Len: n}
	f.n = n
	wr := vrdma.SendWR{ID: id, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{ownSGE}, RKey: t.RKey}
	switch {
	case op == OpSend:
		Fill(own[:n], r.cfg.Seed, id)
		w.Sum = Sum(own[:n])
		wr.Opcode = vrdma.OpSend
	case op == OpWrite:
		f.wslot = r.freeWrite[0]
		r.freeWrite = r.freeWrite[1:]
		Fill(own[:n], r.cfg.Seed, id)
		w.Sum = Sum(own[:n])
		wr.Opcode, wr.RemoteAddr = vrdma.OpRDMAWrite, t.Addr+uint64(t.Layout.slot(areaWrite, f.wslot))
	case op == OpRead && v != nil:
		f.wslot, f.write = v.wslot, v.id
		w.Sum = v.sum
		clear(own[:n])
		wr.Opcode, wr.RemoteAddr = vrdma.OpRDMARead, t.Addr+uint64(t.Layout.slot(areaWrite, v.wslot))
	case op == OpRead:
		k := r.rng.IntN(t.Layout.Slots)
		want := make([]byte, t.Layout.SlotSize)
		Fill(want, r.cfg.Seed, ReadSlotID(k))
		w.Sum = Sum(want[:n])
		clear(own[:n])
		wr.Opcode, wr.RemoteAddr = vrdma.OpRDMARead, t.Addr+uint64(t.Layout.slot(areaRead, k))
	case op == OpFetchAdd:
		w.Len = 0
		wr.SGL = []vrdma.SGE{a.MR.SGE(a.L.slot(areaOwn, f.own), 8)}
		wr.Opcode, wr.RemoteAddr, wr.CompareAdd = vrdma.OpAtomicFetchAdd, t.Addr+uint64(t.Layout.counter()), 1
	case op == OpReadCounter:
		w.Len = 0
		wr.SGL = []vrdma.SGE{a.MR.SGE(a.L.slot(areaOwn, f.own), 8)}
		wr.Opcode, wr.RemoteAddr = vrdma.OpRDMARead, t.Addr+uint64(t.Layout.counter())
	}
	f.sum = w.Sum
	r.l.Posted(w)
	if err := a.QP.PostSend([]vrdma.SendWR{wr}); err != nil {
		if errors.Is(err, vrdma.ErrAgentGone) {
			r.l.Abandon(a.QP.QPN(), "its agent died")
			r.res.AgentGone = true
			return nil
		}
		return fmt.Errorf("fault: post %s: %w", w, err)
	}
	r.inflight[id] = f
	r.res.Posted++
	return nil
}

// postCounterRead posts the READ of the FETCH_ADD target.
func (r *runner) postCounterRead() error {
	if err := r.postOne(OpReadCounter, 8, nil); err != nil {
		return err
	}
	r.counterID = r.nextID
	return nil
}

// complete takes completion w of the run's QP. What the WR landed is
// recorded before its completion: a recorder in a process killed between
// the two records then holds no completion without its bytes.
func (r *runner) complete(w vrdma.WorkCompletion) {
	r.res.Completed++
	f := r.inflight[w.WRID]
	if f == nil {
		r.l.Completed(w) // never posted here: the ledger reports it
		return
	}
	delete(r.inflight, w.WRID)
	a := r.a
	own := a.MR.Bytes()[a.L.slot(areaOwn, f.own):][:a.L.SlotSize]
	keepWrite := false
	if w.Status == vrdma.WCSuccess {
		qpn := a.QP.QPN()
		switch f.op {
		case OpWrite:
			r.verify = append(r.verify, verifyWrite{id: w.WRID, wslot: f.wslot, n: f.n, sum: f.sum})
			keepWrite = true
		case OpRead:
			got := Sum(own[:f.n])
			if f.write != 0 {
				r.l.Landed(qpn, f.write, f.n, got)
			}
			r.l.Landed(qpn, w.WRID, f.n, got)
		case OpFetchAdd:
			r.l.Fetched(qpn, w.WRID, binary.LittleEndian.Uint64(own))
		case OpReadCounter:
			r.l.Counter(binary.LittleEndian.Uint64(own))
		}
	} else {
		r.res.Failed = true
	}
	r.l.Completed(w)
	if f.wslot >= 0 && !keepWrite {
		r.freeWrite = append(r.freeWrite, f.wslot)
	}
	r.freeOwn = append(r.freeOwn, f.own)
	if r.cfg.Progress != nil {
		r.cfg.Progress(r.res.Completed)
	}
}
