// SPDX-License-Identifier: Apache-2.0

package perf

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma"
)

// opcode is a's work request opcode.
func (a Atomic) opcode() vrdma.Opcode {
	if a == CmpAndSwap {
		return vrdma.OpAtomicCmpAndSwp
	}
	return vrdma.OpAtomicFetchAdd
}

// postRetry posts wrs on s, polling the spinner while the send queue is
// full (the agent has not freed a slot yet).
func postRetry(s *Side, wrs []vrdma.SendWR, sp *spinner) error {
	for {
		err := s.QP.PostSend(wrs)
		if err == nil {
			return nil
		}
		var pe *vrdma.PostError
		if !errors.As(err, &pe) || !errors.Is(pe.Err, vrdma.ErrQueueFull) {
			return err
		}
		if err := sp.spin(); err != nil {
			return err
		}
	}
}

// runRoundTrip is perftest's read_lat and atomic_lat: A posts one
// signaled READ of Size bytes (or one atomic) at a time from B's buffer
// and spins on its completion; each iteration's latency is the whole
// round trip. B is passive: its agent answers.
func runRoundTrip(ctx context.Context, c Config, a *Side, peer Peer, op vrdma.Opcode) (Result, error) {
	wrs := []vrdma.SendWR{{Opcode: op, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.MR.SGE(0, c.Size)},
		RemoteAddr: peer.Addr, RKey: peer.RKey, CompareAdd: 1, Swap: 1}}
	wc := make([]vrdma.WorkCompletion, 4)
	sp := a.spinner(ctx)
	rtt := make([]float64, c.Iters)
	start := time.Now()
	for k := range c.Iters {
		wrs[0].ID = uint64(k)
		t0 := time.Now()
		if err := postRetry(a, wrs, &sp); err != nil {
			return Result{}, fmt.Errorf("perf: %s: %w", c.Test, err)
		}
		for {
			n, err := a.CQ.Poll(wc)
			if err != nil {
				return Result{}, err
			}
			if n == 0 {
				if err := sp.spin(); err != nil {
					return Result{}, fmt.Errorf("perf: %s after %d of %d: %w", c.Test, k, c.Iters, err)
				}
				continue
			}
			if wc[0].Status != vrdma.WCSuccess {
				return Result{}, fmt.Errorf("perf: %s: %w", c.Test, completionError(&wc[0]))
			}
			break
		}
		sp.reset()
		rtt[k] = float64(time.Since(t0)) / 1e3 // µs, the round trip
		c.progress(k + 1)
	}
	r := Result{Iters: c.Iters, Elapsed: time.Since(start)}
	r.TMin, r.TMax, r.TTypical, r.TAvg, r.TStdev, r.P99, r.P999 = latencyStats(rtt)
	return r, nil
}

// runSendLat is perftest's send_lat: A and B ping-pong SENDs of Size
// bytes, each keeping receives posted and answering a message with one;
// A stamps each send, and the latency is half the round trip.
func (p *Pair) runSendLat(ctx context.Context, c Config) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stamps := make([]int64, c.Iters+1)
	errc := make(chan error, 1)
	go func() {
		err := sendLatSide(ctx, p.B, c, nil)
		if err != nil {
			cancel()
		}
		errc <- err
	}()
	err := sendLatSide(ctx, p.A, c, stamps)
	if err != nil {
		cancel()
	}
	errB := <-errc
	switch {
	case err != nil:
		return Result{}, fmt.Errorf("perf: %s: %w", c.Test, err)
	case errB != nil:
		return Result{}, fmt.Errorf("perf: %s: passive side %s: %w", c.Test, p.B.Name(), errB)
	}
	return halfRTT(stamps), nil
}

// sendLatSide runs one side of send_lat. With stamps, s is the active
// side: it sends first and stamps each send and, last, the arrival of the
// final answer; else it answers each message it receives. Both post
// exactly Iters receives in all, so none is left for a later run.
func sendLatSide(ctx context.Context, s *Side, c Config, stamps []int64) error {
	depth := min(int(s.QP.Caps().MaxRecvWR), c.Iters, 64)
	rwrs := make([]vrdma.RecvWR, depth)
	for i := range rwrs {
		rwrs[i] = vrdma.RecvWR{ID: uint64(i), SGL: []vrdma.SGE{s.MR.SGE(0, c.Size)}}
	}
	if err := s.QP.PostRecv(rwrs); err != nil {
		return fmt.Errorf("post receives on %s: %w", s.Name(), err)
	}
	postedRecv := depth
	flags := vrdma.SendFlags(0)
	if c.Size <= int(s.QP.Caps().MaxInlineData) {
		flags = vrdma.SendInline
	}
	wrs := []vrdma.SendWR{{Opcode: vrdma.OpSend, SGL: []vrdma.SGE{s.MR.SGE(0, c.Size)}}}
	wc := make([]vrdma.WorkCompletion, 16)
	sp := s.peerSpinner(ctx) // on memcpy-direct the send channel's: no agent in the round trip
	signaled := 0            // signaled sends whose completion is still to be polled
	received := 0
	// poll waits until received reaches k and signaled drops to
	// sendsLeft, reposting a receive for each one consumed while more are
	// to come.
	poll := func(k, sendsLeft int) error {
		for received < k || signaled > sendsLeft {
			n, err := s.CQ.Poll(wc)
			if err != nil {
				return err
			}
			if n == 0 {
				if err := sp.spin(); err != nil {
					return fmt.Errorf("waiting for message %d of %d: %w", k, c.Iters, err)
				}
				continue
			}
			for i := range n {
				if wc[i].Status != vrdma.WCSuccess {
					return completionError(&wc[i])
				}
				if wc[i].Opcode == vrdma.WCRecv {
					received++
					if postedRecv < c.Iters {
						if err := s.QP.PostRecv(rwrs[:1]); err != nil {
							return err
						}
						postedRecv++
					}
				} else {
					signaled--
				}
			}
		}
		sp.reset()
		return nil
	}
	recv := func(k int) error { return poll(k, 1<<30) }
	active := stamps != nil
	start := time.Now()
	for k := 1; k <= c.Iters; k++ {
		if active {
			stamps[k-1] = int64(time.Since(start))
			c.progress(k - 1)
		} else if err := recv(k); err != nil {
			return err
		}
		wrs[0].ID = uint64(k)
		wrs[0].Flags = flags
		if k%c.CQMod == 0 || k == c.Iters {
			wrs[0].Flags |= vrdma.SendSignaled
			signaled++
		}
		if err := postRetry(s, wrs, &sp); err != nil {
			return err
		}
		if active {
			if err := recv(k); err != nil {
				return err
			}
		}
	}
	if active {
		stamps[c.Iters] = int64(time.Since(start))
	}
	// Drain the signaled sends so the CQ is empty for the next run.
	return poll(c.Iters, 0)
}
