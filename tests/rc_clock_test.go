// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// RC timing rules tested step by step on a fake clock: the test path
// (an agent started with a test link) with every frame dropped, or none,
// and the agent's RC timers on a clock only the test moves. Nothing here
// waits for a timeout to expire in real time; each step checks what the
// requester did before and after the clock passes a deadline.

import (
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/testlink"
)

// fakeClockPair starts an agent on a fake clock with a test link of
// faults f and connects a QP of one VM to one of another with p.
func fakeClockPair(t *testing.T, f testlink.Faults, p rcParams) (*clock.Fake, *testenv.Env, *end, *end) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	env := testenv.StartWith(t, testenv.Options{TestLink: &f, Clock: clk})
	s := &suite{env: &lossyEnv{memcpyEnv{env: env, prefix: "fc"}}, how: connOOB, oob: &p}
	a, b := s.pair(t, pairConfig{})
	return clk, env, a, b
}

// waitFor polls cond (real time, bounded) and fails with what if it never
// holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestRCFakeClock checks the local ACK timeout (4.096 µs × 2^timeout),
// retry_cnt, the RNR NAK timer and rnr_retry on a fake clock.
func TestRCFakeClock(t *testing.T) {
	t.Run("retry-timeout", func(t *testing.T) {
		// Every frame is lost: each attempt is one request frame, and
		// the next goes out only once the clock passes the timeout.
		p := lossyRC
		p.timeout, p.retryCnt = 14, 3 // 67.1 ms, 4 attempts
		clk, env, a, b := fakeClockPair(t, testlink.Faults{Drop: 1}, p)
		st := env.TestLinkStats()
		src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
		base := st.Frames.Load()
		postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64)),
			RemoteAddr: dst.Addr(), RKey: dst.RKey()})
		timeout := time.Duration(4096<<14) * time.Nanosecond
		for attempt := 1; attempt <= int(p.retryCnt)+1; attempt++ {
			waitFor(t, "the requester to send and wait on its timer", func() bool {
				return st.Frames.Load()-base == uint64(attempt) && clk.Armed() == 1
			})
			clk.Advance(timeout - time.Microsecond)
			expectNoWC(t, a.scq, quiet, "before the local ACK timeout")
			if n := st.Frames.Load() - base; n != uint64(attempt) {
				t.Fatalf("attempt %d: %d request frames before the timeout expired, want %d", attempt, n, attempt)
			}
			clk.Advance(time.Microsecond)
		}
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCRetryExcErr, 0)
		if n := st.Frames.Load() - base; n != uint64(p.retryCnt)+1 {
			t.Fatalf("%d attempts, want retry_cnt+1 = %d", n, p.retryCnt+1)
		}
		if c := (&suite{env: &lossyEnv{memcpyEnv{env: env}}}).qpCounters(t, a); c.TransportRetries != uint64(p.retryCnt) {
			t.Fatalf("%d transport retries counted, want %d", c.TransportRetries, p.retryCnt)
		}
	})
	t.Run("rnr-timer", func(t *testing.T) {
		// No faults; the responder has no receive posted. Each RNR NAK
		// asks for min_rnr_timer 14 (1.28 ms); the SEND is tried again
		// only once the clock has passed it.
		p := lossyRC
		p.rnrRetry, p.minRNRTimer = 2, 14
		clk, env, a, b := fakeClockPair(t, testlink.Faults{}, p)
		s := &suite{env: &lossyEnv{memcpyEnv{env: env}}}
		src := a.mr(t, 64, vrdma.AccessAll)
		postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
		delay := 1280 * time.Microsecond
		for nak := uint64(1); nak <= uint64(p.rnrRetry); nak++ {
			waitFor(t, "an RNR NAK and the requester's wait", func() bool {
				return s.qpCounters(t, a).RNRNaksReceived == nak && clk.Armed() >= 1
			})
			clk.Advance(delay - time.Microsecond)
			expectNoWC(t, a.scq, quiet, "before the RNR timer expired")
			if c := s.qpCounters(t, b); c.RNRNaksSent != nak {
				t.Fatalf("the responder sent %d RNR NAKs before the RNR timer expired, want %d", c.RNRNaksSent, nak)
			}
			clk.Advance(time.Microsecond)
		}
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCRNRRetryExcErr, 0)
		if c := s.qpCounters(t, a); c.RNRNaksReceived != uint64(p.rnrRetry)+1 || c.TransportRetries != 0 {
			t.Fatalf("%d RNR NAKs, %d transport retries; want %d and 0", c.RNRNaksReceived, c.TransportRetries, p.rnrRetry+1)
		}
	})
}
