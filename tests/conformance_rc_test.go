// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Conformance cases for RC ordering and depth (IBTA 10.8.3.3 fence,
// 9.9.2 responder resources, 9.7.5.2.8 RNR and transport retries), checked
// by what arrives and by the QPs' counters in the agents' status.

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
)

// qpCounters returns the counters of e's QP from the status of the agent
// that serves it.
func (s *suite) qpCounters(t *testing.T, e *end) vrdma.QPCounters {
	t.Helper()
	return s.qpStatus(t, e).Counters
}

// agentOf dials the agent that serves e's VM; the connection closes when
// t ends.
func (s *suite) agentOf(t *testing.T, e *end) *vrdma.Agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(s.env.Socket(t, e.vm)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// qpStatus returns e's QP's status report from the agent that serves it.
func (s *suite) qpStatus(t *testing.T, e *end) vrdma.QPStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	st, err := s.agentOf(t, e).Status(ctx)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	for _, v := range st.VMs {
		if v.Name != e.vm.Name() {
			continue
		}
		for _, q := range v.QPs {
			if q.QPN == e.qp.QPN() {
				return q
			}
		}
	}
	t.Fatalf("QP 0x%x of VM %s is not in its agent's status", e.qp.QPN(), e.vm.Name())
	return vrdma.QPStatus{}
}

// testInFlight checks the status report's in_flight: a SEND that waits for
// a receive (RNR, retried forever) counts, and once the receive is posted
// and the SEND completes, nothing does.
func testInFlight(t *testing.T, s *suite) {
	pa, pb := defaultRC, defaultRC
	pa.rnrRetry, pb.minRNRTimer = 7, 1 // forever, 0.01 ms
	a, b := s.pairWith(t, pairConfig{}, pa, pb)
	src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
	if n := s.qpStatus(t, a).InFlight; n != 0 {
		t.Fatalf("in flight before any post: %d", n)
	}
	postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
	waitFor(t, "the SEND waiting for a receive to show in flight", func() bool { return s.qpStatus(t, a).InFlight == 1 })
	postRecv(t, b.qp, vrdma.RecvWR{ID: 5, SGL: sgl(dst.SGE(0, 64))})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCSend)
	if n := s.qpStatus(t, a).InFlight; n != 0 {
		t.Fatalf("in flight after the SEND completed: %d", n)
	}
}

// testFence checks that a fenced WR waits for every earlier RDMA READ and
// atomic of its QP: a fenced SEND or WRITE of the buffer a READ fills
// carries the READ's data, and a fenced SEND of an atomic's result buffer
// carries the original value.
func testFence(t *testing.T, s *suite) {
	t.Run("read", func(t *testing.T) {
		const n = 64 << 10
		a, b := s.pair(t, pairConfig{})
		local := a.mr(t, n, vrdma.AccessAll)
		remote, inbox, wdst := b.mr(t, n, vrdma.AccessAll), b.mr(t, n, vrdma.AccessAll), b.mr(t, n, vrdma.AccessAll)
		fill(local.Bytes(), 1) // stale: what an unfenced SEND would carry
		fill(remote.Bytes(), 2)
		clear(inbox.Bytes())
		clear(wdst.Bytes())
		want := clone(remote.Bytes())
		postRecv(t, b.qp, vrdma.RecvWR{ID: 7, SGL: sgl(inbox.SGE(0, n))})
		postSend(t, a.qp,
			vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, n)),
				RemoteAddr: remote.Addr(), RKey: remote.RKey()},
			vrdma.SendWR{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled | vrdma.SendFence, SGL: sgl(local.SGE(0, n))},
			vrdma.SendWR{ID: 3, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled | vrdma.SendFence, SGL: sgl(local.SGE(0, n)),
				RemoteAddr: wdst.Addr(), RKey: wdst.RKey()})
		wc := waitWC(t, a.scq, 3)
		expectWC(t, wc[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCRDMARead)
		expectWC(t, wc[1], a.qp, 2, vrdma.WCSuccess, vrdma.WCSend)
		expectWC(t, wc[2], a.qp, 3, vrdma.WCSuccess, vrdma.WCRDMAWrite)
		expectRecv(t, waitWC(t, b.rcq, 1)[0], b.qp, 7, vrdma.WCRecv, n, 0, false)
		expectBytes(t, "READ into the local buffer", local.Bytes(), want)
		expectBytes(t, "fenced SEND of the READ's buffer", inbox.Bytes(), want)
		expectBytes(t, "fenced WRITE of the READ's buffer", wdst.Bytes(), want)
	})
	t.Run("atomic", func(t *testing.T) {
		a, b := s.pair(t, pairConfig{})
		res := a.mr(t, 16, vrdma.AccessAll)
		ctr, inbox := b.mr(t, 8, vrdma.AccessAll), b.mr(t, 16, vrdma.AccessAll)
		put64(res.Bytes(), 0xdead)
		put64(res.Bytes()[8:], 0xbeef)
		put64(ctr.Bytes(), 1000)
		postRecv(t, b.qp, vrdma.RecvWR{ID: 7, SGL: sgl(inbox.SGE(0, 16))})
		postSend(t, a.qp,
			vrdma.SendWR{ID: 1, Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled, SGL: sgl(res.SGE(0, 8)),
				RemoteAddr: ctr.Addr(), RKey: ctr.RKey(), CompareAdd: 5},
			vrdma.SendWR{ID: 2, Opcode: vrdma.OpAtomicCmpAndSwp, Flags: vrdma.SendSignaled, SGL: sgl(res.SGE(8, 8)),
				RemoteAddr: ctr.Addr(), RKey: ctr.RKey(), CompareAdd: 1005, Swap: 7},
			vrdma.SendWR{ID: 3, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled | vrdma.SendFence, SGL: sgl(res.SGE(0, 16))})
		wc := waitWC(t, a.scq, 3)
		expectWC(t, wc[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCFetchAdd)
		expectWC(t, wc[1], a.qp, 2, vrdma.WCSuccess, vrdma.WCCompSwap)
		expectWC(t, wc[2], a.qp, 3, vrdma.WCSuccess, vrdma.WCSend)
		expectRecv(t, waitWC(t, b.rcq, 1)[0], b.qp, 7, vrdma.WCRecv, 16, 0, false)
		if got := [2]uint64{le64(inbox.Bytes()), le64(inbox.Bytes()[8:])}; got != [2]uint64{1000, 1005} {
			t.Fatalf("fenced SEND of the atomics' results carried %d, %d, want the original values 1000, 1005", got[0], got[1])
		}
		if got := le64(ctr.Bytes()); got != 7 {
			t.Fatalf("counter %d after FETCH_ADD 5 and CMP_SWP 1005→7, want 7", got)
		}
	})
}

// testRdAtomicDepth checks max_rd_atomic (the requester never has more
// READs and atomics outstanding) and max_dest_rd_atomic (a responder
// without resources refuses them: REM_INV_REQ_ERR at the requester, both
// QPs in ERR, as rxe does).
func testRdAtomicDepth(t *testing.T, s *suite) {
	for _, depth := range []int{1, 2} {
		t.Run(fmt.Sprintf("max_rd_atomic=%d", depth), func(t *testing.T) {
			const nReads, blk = 8, 8 << 10
			pa := defaultRC
			pa.rdAtomic = depth
			a, b := s.pairWith(t, pairConfig{}, pa, defaultRC)
			local := a.mr(t, nReads*blk+8*nReads, vrdma.AccessAll)
			remote, ctr := b.mr(t, nReads*blk, vrdma.AccessAll), b.mr(t, 8, vrdma.AccessAll)
			fill(remote.Bytes(), 3)
			put64(ctr.Bytes(), 0)
			var wrs []vrdma.SendWR
			for i := range nReads {
				wrs = append(wrs,
					vrdma.SendWR{ID: uint64(2 * i), Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled,
						SGL: sgl(local.SGE(i*blk, blk)), RemoteAddr: off(remote, i*blk), RKey: remote.RKey()},
					vrdma.SendWR{ID: uint64(2*i + 1), Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled,
						SGL: sgl(local.SGE(nReads*blk+8*i, 8)), RemoteAddr: ctr.Addr(), RKey: ctr.RKey(), CompareAdd: 1})
			}
			postSend(t, a.qp, wrs...)
			wc := waitWC(t, a.scq, len(wrs))
			for i, w := range wc {
				expectWC(t, w, a.qp, uint64(i), vrdma.WCSuccess, wcOpcode(wrs[i].Opcode))
			}
			expectBytes(t, "READs", local.Bytes()[:nReads*blk], remote.Bytes())
			for i := range nReads {
				if got := le64(local.Bytes()[nReads*blk+8*i:]); got != uint64(i) {
					t.Fatalf("FETCH_ADD %d returned %d, want %d", i, got, i)
				}
			}
			c := s.qpCounters(t, a)
			if c.RdAtomicPeak < 1 || c.RdAtomicPeak > uint32(depth) {
				t.Fatalf("the requester had %d READs and atomics outstanding at once, want 1..%d (max_rd_atomic)", c.RdAtomicPeak, depth)
			}
			expectState(t, a.qp, vrdma.QPSRTS)
		})
	}
	for _, op := range []vrdma.Opcode{vrdma.OpRDMARead, vrdma.OpAtomicCmpAndSwp, vrdma.OpAtomicFetchAdd} {
		t.Run(fmt.Sprintf("max_dest_rd_atomic=0/%s", op), func(t *testing.T) {
			pb := defaultRC
			pb.destRdAtomic = 0
			a, b := s.pairWith(t, pairConfig{}, defaultRC, pb)
			local, remote := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
			fill(local.Bytes(), 4)
			postRecv(t, b.qp, vrdma.RecvWR{ID: 9, SGL: sgl(remote.SGE(32, 32))})
			postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
				SGL: sgl(local.SGE(0, 32)), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCRDMAWrite)
			expectBytes(t, "WRITE to a responder without READ resources", remote.Bytes()[:32], local.Bytes()[:32])
			n := 32
			if op != vrdma.OpRDMARead {
				n = 8
			}
			postSend(t, a.qp, vrdma.SendWR{ID: 2, Opcode: op, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(32, n)),
				RemoteAddr: remote.Addr(), RKey: remote.RKey(), CompareAdd: 1, Swap: 2})
			s.expectNAK(t, waitWC(t, a.scq, 1)[0], a.qp, 2, vrdma.WCRemInvReqErr)
			expectState(t, a.qp, vrdma.QPSErr)
			expectState(t, b.qp, vrdma.QPSErr)
			expectWC(t, waitWC(t, b.rcq, 1)[0], b.qp, 9, vrdma.WCWRFlushErr, 0)
		})
	}
}

// testRetryCounts checks that rnr_retry and retry_cnt are honoured
// exactly, by counting the attempts on both sides: rnr_retry n gives n+1
// RNR NAKs, retry_cnt n gives n+1 requests to a responder that drops
// them.
func testRetryCounts(t *testing.T, s *suite) {
	for _, retry := range []uint8{0, 3} {
		t.Run(fmt.Sprintf("rnr_retry=%d", retry), func(t *testing.T) {
			pa, pb := defaultRC, defaultRC
			pa.rnrRetry, pb.minRNRTimer = retry, 1 // 0.01 ms
			a, b := s.pairWith(t, pairConfig{}, pa, pb)
			src := a.mr(t, 64, vrdma.AccessAll)
			postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCRNRRetryExcErr, 0)
			want := uint64(retry) + 1
			// On a lossy path frames are lost and duplicated too:
			// transport retries happen, some RNR NAKs sent never arrive,
			// and one that arrives twice counts twice at the requester
			// (nothing on the wire tells it from a second refusal).
			if c := s.qpCounters(t, a); c.RNRNaksReceived != want || c.TransportRetries != 0 && !s.lossy() {
				t.Fatalf("requester: %d RNR NAKs received, %d transport retries; want %d (rnr_retry %d + 1) and 0", c.RNRNaksReceived, c.TransportRetries, want, retry)
			}
			if c := s.qpCounters(t, b); c.RNRNaksSent != want && !(s.lossy() && c.RNRNaksSent > 0) {
				t.Fatalf("responder: %d RNR NAKs sent, want %d (rnr_retry %d + 1)", c.RNRNaksSent, want, retry)
			}
		})
	}
	for _, retry := range []uint8{0, 2} {
		t.Run(fmt.Sprintf("retry_cnt=%d", retry), func(t *testing.T) {
			pa := defaultRC
			pa.retryCnt, pa.timeout = retry, 10 // 4.2 ms
			a, b := s.pairWith(t, pairConfig{}, pa, defaultRC)
			// A responder in RESET drops what it gets, without an answer.
			if err := b.qp.Modify(opCtx(t), &vrdma.QPAttr{State: vrdma.QPSReset}, vrdma.MaskState); err != nil {
				t.Fatal(err)
			}
			src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
			postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64)),
				RemoteAddr: dst.Addr(), RKey: dst.RKey()})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCRetryExcErr, 0)
			expectState(t, a.qp, vrdma.QPSErr)
			if c := s.qpCounters(t, a); c.TransportRetries != uint64(retry) || c.RNRNaksReceived != 0 {
				t.Fatalf("requester: %d transport retries, %d RNR NAKs; want %d (retry_cnt) and 0", c.TransportRetries, c.RNRNaksReceived, retry)
			}
			// On a lossy path some attempts never reach the responder
			// (all of them, at times), and duplicates reach it twice.
			if c := s.qpCounters(t, b); c.RequestsDropped != uint64(retry)+1 && !s.lossy() {
				t.Fatalf("responder: dropped %d requests, want %d (retry_cnt %d + 1 attempts)", c.RequestsDropped, retry+1, retry)
			}
		})
	}
}

// testPortDown disconnects an adapter (vrdmactl vm disconnect): a WRITE
// whose responder's port is down, or whose requester's is, is never
// answered — the requester retries retry_cnt times and fails with
// RETRY_EXC_ERR, and not a byte lands — and once the adapter is
// connected again a new pair on it talks.
func testPortDown(t *testing.T, s *suite) {
	for _, side := range []string{"responder", "requester"} {
		t.Run(side, func(t *testing.T) {
			pa := defaultRC
			pa.retryCnt, pa.timeout = 2, 10 // 4.2 ms
			a, b := s.pairWith(t, pairConfig{}, pa, defaultRC)
			down := b
			if side == "requester" {
				down = a
			}
			s.setConnected(t, down, false)
			src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
			copy(src.Bytes(), "not to be delivered")
			postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64)),
				RemoteAddr: dst.Addr(), RKey: dst.RKey()})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCRetryExcErr, 0)
			if !bytes.Equal(dst.Bytes(), make([]byte, 64)) {
				t.Fatalf("a WRITE across a disconnected adapter landed: %q", dst.Bytes())
			}
			if c := s.qpCounters(t, b); side == "requester" && c.RequestsDropped != 0 && !s.lossy() {
				t.Fatalf("responder: dropped %d requests from a requester whose port is down, want 0 (none left it)", c.RequestsDropped)
			}
			s.setConnected(t, down, true)
			// A new pair on the same adapters.
			a, b = newEnd(t, a.vm, qpConfig{}), newEnd(t, b.vm, qpConfig{})
			ctx := opCtx(t)
			if err := modifyToRTS(ctx, a.qp, a.ad, b.qp.Endpoint(), defaultRC); err != nil {
				t.Fatal(err)
			}
			if err := modifyToRTS(ctx, b.qp, b.ad, a.qp.Endpoint(), defaultRC); err != nil {
				t.Fatal(err)
			}
			src, dst = a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
			copy(src.Bytes(), "delivered")
			postSend(t, a.qp, vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64)),
				RemoteAddr: dst.Addr(), RKey: dst.RKey()})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 2, vrdma.WCSuccess, vrdma.WCRDMAWrite)
		})
	}
}

// setConnected connects or disconnects e's adapter through the agent that
// serves its VM, and checks its port's state.
func (s *suite) setConnected(t *testing.T, e *end, connected bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	if r, err := s.agentOf(t, e).ConnectAdapter(ctx, e.vm.Name(), e.ad.Name(), connected); err != nil || !r.Changed {
		t.Fatalf("connect %s/%s %v: %+v %v", e.vm.Name(), e.ad.Name(), connected, r, err)
	}
	want := "PORT_ACTIVE"
	if !connected {
		want = "PORT_DOWN"
	}
	if p, err := e.ad.QueryPort(ctx); err != nil || p.State != want {
		t.Fatalf("port of %s/%s: %+v %v, want %s", e.vm.Name(), e.ad.Name(), p, err, want)
	}
}

// testStream runs a long mixed stream — SENDs, WRITEs, READs and
// FETCH_ADDs, more than the requester keeps in flight — and checks that
// every work request completes exactly once, in order, with the right
// bytes, and that every atomic was executed exactly once (the counter).
// On a lossy path this is where duplicates and retransmissions must stay
// invisible.
func testStream(t *testing.T, s *suite) {
	const n, blk = 600, 256
	a, b := s.pair(t, pairConfig{})
	src := a.mr(t, n*blk, vrdma.AccessAll)
	dst := b.mr(t, n*blk, vrdma.AccessAll)
	rd := a.mr(t, n*blk, vrdma.AccessAll)
	old := a.mr(t, 8*n, vrdma.AccessAll)
	ctr := b.mr(t, 8, vrdma.AccessAll)
	fill(src.Bytes(), 21)
	put64(ctr.Bytes(), 0)
	var wrs []vrdma.SendWR
	nAtomic := 0
	for i := range n {
		w := vrdma.SendWR{ID: uint64(i), Flags: vrdma.SendSignaled}
		switch i % 4 {
		case 0:
			w.Opcode, w.SGL = vrdma.OpSend, sgl(src.SGE(i*blk, blk))
		case 1:
			w.Opcode, w.SGL, w.RemoteAddr, w.RKey = vrdma.OpRDMAWrite, sgl(src.SGE(i*blk, blk)), off(dst, i*blk), dst.RKey()
		case 2:
			// Read back what the WRITE before wrote: RC orders a READ
			// after the WRITEs posted before it.
			w.Opcode, w.SGL, w.RemoteAddr, w.RKey = vrdma.OpRDMARead, sgl(rd.SGE(i*blk, blk)), off(dst, (i-1)*blk), dst.RKey()
		case 3:
			w.Opcode, w.SGL, w.RemoteAddr, w.RKey, w.CompareAdd = vrdma.OpAtomicFetchAdd, sgl(old.SGE(8*nAtomic, 8)), ctr.Addr(), ctr.RKey(), 1
			nAtomic++
		}
		wrs = append(wrs, w)
	}
	// Post in batches the queues can hold, completing as we go.
	var got []vrdma.WorkCompletion
	sent, posted := 0, 0
	for sent < n {
		// Receives for the SENDs of the next batch.
		batch := min(n-sent, int(defaultCaps.MaxSendWR)/2)
		for i := sent; i < sent+batch; i++ {
			if wrs[i].Opcode == vrdma.OpSend {
				postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(i), SGL: sgl(dst.SGE(i*blk, blk))})
				posted++
			}
		}
		postSend(t, a.qp, wrs[sent:sent+batch]...)
		got = append(got, waitWC(t, a.scq, batch)...)
		sent += batch
	}
	recvs := waitWC(t, b.rcq, posted)
	for i, w := range got {
		expectWC(t, w, a.qp, uint64(i), vrdma.WCSuccess, wcOpcode(wrs[i].Opcode))
	}
	for k, w := range recvs {
		expectRecv(t, w, b.qp, uint64(4*k), vrdma.WCRecv, blk, 0, false)
	}
	expectNoWC(t, a.scq, quiet, "send CQ after the stream")
	expectNoWC(t, b.rcq, quiet, "receive CQ after the stream")
	for i := 0; i < n; i += 4 {
		expectBytes(t, fmt.Sprintf("SEND %d and WRITE %d", i, i+1), dst.Bytes()[i*blk:(i+2)*blk], src.Bytes()[i*blk:(i+2)*blk])
	}
	for i := 2; i < n; i += 4 {
		expectBytes(t, fmt.Sprintf("READ %d", i), rd.Bytes()[i*blk:(i+1)*blk], src.Bytes()[(i-1)*blk:i*blk])
	}
	if c := le64(ctr.Bytes()); c != uint64(nAtomic) {
		t.Fatalf("counter %d after %d FETCH_ADDs: an atomic was executed more or less than once", c, nAtomic)
	}
	for k := range nAtomic {
		if v := le64(old.Bytes()[8*k:]); v != uint64(k) {
			t.Fatalf("FETCH_ADD %d returned %d, want %d", k, v, k)
		}
	}
}

// testAtomicAckLost checks that an atomic whose response is lost is
// answered again however much traffic follows it: a FETCH_ADD, then a
// 256 KiB WRITE (64 packets or more at any path MTU), posted together.
// On a path that can lose exactly the first ATOMIC_ACKNOWLEDGE to the
// requester (rdma-lossy: atomicAckDropper) it is lost: the WRITE's ACKs
// then tell the requester the FETCH_ADD's response went missing (an
// implicit NAK), it sends the FETCH_ADD again, and the responder must
// answer with the original value from its responder resources, without
// adding again. Both complete successfully, within the retry budget (a
// spent one ends RETRY_EXC_ERR). Elsewhere nothing is lost and the same
// must hold. The replay cache the responder resources replaced kept one
// response per PSN modulo 64 and lost the atomic's to the WRITE's 64th
// packet: the duplicate went unanswered, and the requester, sent back by
// each ACK past it without spending its budget, went back forever.
func testAtomicAckLost(t *testing.T, s *suite) {
	const n = 256 << 10
	a, b := s.pair(t, pairConfig{})
	local := a.mr(t, 8+n, vrdma.AccessAll)
	ctr, dst := b.mr(t, 8, vrdma.AccessAll), b.mr(t, n, vrdma.AccessAll)
	put64(local.Bytes(), 0xdead)
	fill(local.Bytes()[8:], 31)
	clear(dst.Bytes())
	put64(ctr.Bytes(), 1000)
	dropped := func() bool { return true }
	d, lossy := s.env.(atomicAckDropper)
	if lossy {
		dropped = d.dropFirstAtomicAck(a.qp.QPN())
	}
	t0 := time.Now()
	postSend(t, a.qp,
		vrdma.SendWR{ID: 1, Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 8)),
			RemoteAddr: ctr.Addr(), RKey: ctr.RKey(), CompareAdd: 5},
		vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(8, n)),
			RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	wc := waitWC(t, a.scq, 2)
	expectWC(t, wc[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCFetchAdd)
	expectWC(t, wc[1], a.qp, 2, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	if !dropped() {
		t.Fatal("the first ATOMIC_ACKNOWLEDGE to the requester was not dropped: the case did not test its loss")
	}
	if got := le64(local.Bytes()); got != 1000 {
		t.Fatalf("FETCH_ADD returned %d, want the original value 1000", got)
	}
	if got := le64(ctr.Bytes()); got != 1005 {
		t.Fatalf("counter %d after one FETCH_ADD of 5 from 1000, want 1005 (executed %s)", got, map[bool]string{true: "twice", false: "never"}[got > 1005])
	}
	expectBytes(t, "WRITE after the FETCH_ADD", dst.Bytes(), local.Bytes()[8:])
	expectState(t, a.qp, vrdma.QPSRTS)
	if lossy {
		t.Logf("the FETCH_ADD's ATOMIC_ACKNOWLEDGE was dropped; both completed in %v, %d transport retries", time.Since(t0).Round(time.Millisecond), s.qpCounters(t, a).TransportRetries)
	}
}
