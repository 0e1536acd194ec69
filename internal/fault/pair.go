// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma"
)

// Pair is two sides connected in this process: A runs traffic (Run) at B,
// whose responder runs on a goroutine of the pair's.
//
// Goroutines: NewPair starts B's responder (Respond); it ends when B's QP
// is in ERR with every receive flushed (Finish), when the agent dies, or
// when Close cancels it. Close waits for it.
type Pair struct {
	A, B *Side
	L    *Ledger

	stall  chan time.Duration
	cancel context.CancelFunc
	done   chan struct{} // closed when the responder returned
	err    error         // the responder's, once done is closed
}

// NewPair creates a side in va and one in vb, each with layout lay and
// seed, connects them with rc, and starts B's responder recording into l.
func NewPair(ctx context.Context, va, vb *vrdma.VM, lay Layout, rc RC, seed uint64, l *Ledger) (*Pair, error) {
	a, err := NewSide(ctx, va, lay, seed)
	if err != nil {
		return nil, err
	}
	b, err := NewSide(ctx, vb, lay, seed)
	if err != nil {
		a.Close(ctx)
		return nil, err
	}
	if err := errors.Join(a.Connect(ctx, b.QP.Endpoint(), rc), b.Connect(ctx, a.QP.Endpoint(), rc)); err != nil {
		a.Close(ctx)
		b.Close(ctx)
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &Pair{A: a, B: b, L: l, stall: make(chan time.Duration, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = Respond(rctx, b, a.QP.QPN(), l, p.stall)
		if errors.Is(p.err, vrdma.ErrAgentGone) {
			l.Abandon(b.QP.QPN(), "its agent died")
		}
	}()
	return p, nil
}

// Run runs traffic from A to B (see Run).
func (p *Pair) Run(ctx context.Context, cfg Config) (Result, error) {
	return Run(ctx, p.A, p.B.Target(), p.L, cfg)
}

// Stall makes B's responder stop posting receives and polling for d.
func (p *Pair) Stall(d time.Duration) { p.stall <- d }

// Finish closes the books (Ledger.CloseBooks): it moves both QPs to ERR,
// so that every WR still held flushes, records A's last completions, and waits (until ctx
// ends) for B's responder to record its flushed receives. It returns the
// responder's error (one wrapping vrdma.ErrAgentGone if the agent died).
func (p *Pair) Finish(ctx context.Context) error {
	p.L.CloseBooks()
	if err := errors.Join(p.A.Fail(ctx), p.B.Fail(ctx)); err != nil {
		return err
	}
	if err := Drain(ctx, p.A, p.L); err != nil {
		return err
	}
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("fault: the responder on QP 0x%x did not finish: %w (%d WRs outstanding)", p.B.QP.QPN(), ctx.Err(), p.L.Outstanding())
	}
}

// Close stops the responder if it still runs, waits for it, and destroys
// both sides' objects.
func (p *Pair) Close(ctx context.Context) error {
	p.cancel()
	<-p.done
	return errors.Join(p.A.Close(ctx), p.B.Close(ctx))
}

// Drain records the completions of s's send CQ in l until none of s's
// WRs is outstanding or ctx ends; the agent's death ends it too (what is
// left will never complete: the caller abandons it).
func Drain(ctx context.Context, s *Side, l *Ledger) error {
	qpn := s.QP.QPN()
	wc := make([]vrdma.WorkCompletion, 32)
	for l.OutstandingOn(qpn) > 0 {
		n, err := s.SCQ.Poll(wc)
		if errors.Is(err, vrdma.ErrAgentGone) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("fault: drain QP 0x%x: %w", qpn, err)
		}
		for _, w := range wc[:n] {
			l.Completed(w)
		}
		if n > 0 {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err = s.SCQ.Wait(wctx)
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("fault: drain QP 0x%x: %w (%d WRs outstanding)", qpn, ctx.Err(), l.OutstandingOn(qpn))
		}
		if errors.Is(err, vrdma.ErrAgentGone) {
			return nil
		}
	}
	return nil
}
