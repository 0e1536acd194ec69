// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma"
)

// recvIDBase starts the IDs of a responder's receives, far from a run's
// WR IDs.
const recvIDBase = 1 << 48

// Respond serves side s as the target of a run from the QP numbered
// peerQPN: it keeps a receive posted in each of its receive slots, polls
// its receive CQ, records every receive and completion in rec, and for
// each message received records the bytes that landed under the ID the
// message carries (Fill), as a SEND of peerQPN. A duration received on
// stall makes it stop posting and polling for that long: a stalled
// receiver, whose peer meets RNR NAKs and a full CQ.
//
// It returns nil once the QP is in ERR and every receive it posted has
// completed (Side.Fail closes the books that way), or when ctx ends; an
// error wrapping vrdma.ErrAgentGone if the agent died.
func Respond(ctx context.Context, s *Side, peerQPN uint32, rec Recorder, stall <-chan time.Duration) error {
	l := s.L
	qpn := s.QP.QPN()
	next := uint64(recvIDBase)
	outstanding := 0
	failed := false
	// Receive id uses slot (id - recvIDBase) mod Slots: a queue completes
	// in order, so the receive posted when one completes takes its slot.
	post := func() error {
		id := next
		next++
		slot := int((id - recvIDBase) % uint64(l.Slots))
		rec.Posted(WR{QPN: qpn, ID: id, Op: OpRecv})
		err := s.QP.PostRecv([]vrdma.RecvWR{{ID: id, SGL: []vrdma.SGE{s.MR.SGE(l.slot(areaRecv, slot), l.SlotSize)}}})
		if err != nil {
			return fmt.Errorf("fault: responder on QP 0x%x: post receive %d: %w", qpn, id, err)
		}
		outstanding++
		return nil
	}
	for range l.Slots {
		if err := post(); err != nil {
			return err
		}
	}
	wc := make([]vrdma.WorkCompletion, 32)
	for {
		select {
		case d := <-stall:
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil
			}
		default:
		}
		if failed && outstanding == 0 {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := s.RCQ.Wait(wctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("fault: responder on QP 0x%x: wait on its receive CQ: %w", qpn, err)
		}
		n, err := s.RCQ.Poll(wc)
		if err != nil {
			return fmt.Errorf("fault: responder on QP 0x%x: poll its receive CQ: %w", qpn, err)
		}
		for _, w := range wc[:n] {
			rec.Completed(w)
			if w.WRID < recvIDBase || w.WRID >= next {
				continue // not ours: the ledger has reported it
			}
			outstanding--
			slot := int((w.WRID - recvIDBase) % uint64(l.Slots))
			if w.Status != vrdma.WCSuccess {
				failed = true
				continue
			}
			o := l.slot(areaRecv, slot)
			msg := s.MR.Bytes()[o : o+min(int(w.ByteLen), l.SlotSize)]
			if id, ok := PayloadID(msg); ok {
				rec.Landed(peerQPN, id, len(msg), Sum(msg))
			} else {
				rec.Landed(peerQPN, 0, len(msg), Sum(msg))
			}
			if !failed {
				if err := post(); err != nil {
					return err
				}
			}
		}
	}
}
