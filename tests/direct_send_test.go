// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// The send channel of the memcpy-direct path (wire-local.md §4.22): small
// SENDs between the two libraries without the agent, and every case the
// libraries leave to the agent's relay (refusals, retractions, the
// channel's revocation) completing as it always did.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/libdiag"
	"github.com/vrdma/vrdma/internal/testenv"
)

// patientRelay makes the send channels mapped until t ends wait a minute
// before they relay an untaken message (libdiag.RelayAfter): a test that
// counts what the agent relayed does not depend on how soon the machine
// lets the receiver poll.
func patientRelay(t *testing.T) {
	libdiag.RelayAfter.Store(int64(time.Minute))
	t.Cleanup(func() { libdiag.RelayAfter.Store(0) })
}

// directPair connects a memcpy-direct pair in two new VMs named after
// prefix.
func directPair(t *testing.T, prefix string, c pairConfig) (*suite, *end, *end) {
	t.Helper()
	env := testenv.Start(t)
	s := &suite{env: &directEnv{memcpyEnv{env: env, prefix: prefix}}, how: connOOB}
	a, b := s.pair(t, c)
	if p := a.qp.Path(); p.Path != vrdma.PathMemcpyDirect {
		t.Fatalf("path %+v, want memcpy-direct", p)
	}
	return s, a, b
}

// TestDirectSendNotRelayed sends small SENDs and SEND_WITH_IMMs, signaled
// and not, of 0 to 4096 bytes, both ways: each arrives whole, in order,
// with its immediate, and the agent's counters show it executed none of
// them (its op counters count only what it relayed).
func TestDirectSendNotRelayed(t *testing.T) {
	patientRelay(t)
	s, a, b := directPair(t, "dsn", pairConfig{})
	sizes := []int{0, 1, 8, 64, 1000, 4096}
	for dir, e := range [][2]*end{{a, b}, {b, a}} {
		src, dst := e[0], e[1]
		sm, rm := src.mr(t, 4096*len(sizes), vrdma.AccessAll), dst.mr(t, 4096*len(sizes), vrdma.AccessAll)
		for i := range sm.Bytes() {
			sm.Bytes()[i] = byte(i*13 + dir)
		}
		var recvs []vrdma.RecvWR
		var sends []vrdma.SendWR
		for i, n := range sizes {
			recvs = append(recvs, vrdma.RecvWR{ID: uint64(100 + i), SGL: sgl(rm.SGE(4096*i, 4096))})
			wr := vrdma.SendWR{ID: uint64(i), Opcode: vrdma.OpSend, SGL: sgl(sm.SGE(4096*i, n))}
			if i%2 == 1 {
				wr.Opcode, wr.Imm = vrdma.OpSendWithImm, uint32(0xabc0+i)
			}
			if i != 2 {
				wr.Flags = vrdma.SendSignaled
			}
			sends = append(sends, wr)
		}
		postRecv(t, dst.qp, recvs...)
		postSend(t, src.qp, sends...)
		got := waitWC(t, dst.rcq, len(sizes))
		for i, w := range got {
			n := sizes[i]
			if w.WRID != uint64(100+i) || w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCRecv || w.ByteLen != uint32(n) ||
				w.SrcQP != src.qp.QPN() || w.QPNum != dst.qp.QPN() {
				t.Fatalf("direction %d: receive %d: %+v", dir, i, w)
			}
			if imm := i%2 == 1; imm != (w.Flags&vrdma.WCWithImm != 0) || imm && w.Imm != uint32(0xabc0+i) {
				t.Fatalf("direction %d: receive %d: flags %v imm 0x%x", dir, i, w.Flags, w.Imm)
			}
			expectBytes(t, "received", rm.Bytes()[4096*i:4096*i+n], sm.Bytes()[4096*i:4096*i+n])
		}
		sc := waitWC(t, src.scq, len(sizes)-1)
		for _, w := range sc {
			if w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCSend || w.WRID == 2 {
				t.Fatalf("direction %d: send completion %+v", dir, w)
			}
		}
		if c := s.qpCounters(t, src); c.Ops["SEND"] != 0 || c.Ops["SEND_WITH_IMM"] != 0 {
			t.Fatalf("direction %d: the agent relayed SENDs the channel should have carried: %v", dir, c.Ops)
		}
	}
}

// TestDirectSendReceiverInRTR leaves the receiving QP in RTR, as a
// receive-only QP may stay (perftest's ib_send_bw server does): its
// library takes the channel in RTR, so the sender's SENDs go through it —
// the agent relays none — and arrive whole and in order; the channel then
// stays across the receiver's move to RTS, and carries SENDs both ways.
func TestDirectSendReceiverInRTR(t *testing.T) {
	patientRelay(t)
	env := testenv.Start(t)
	s := &suite{env: &directEnv{memcpyEnv{env: env, prefix: "dsr"}}, how: connOOB}
	vms := s.env.OpenVMs(t, 2)
	a, b := newEnd(t, vms[0], qpConfig{}), newEnd(t, vms[1], qpConfig{})
	ctx := opCtx(t)
	// The receiver first: it asks in RTR before its peer is connected
	// ("unavailable"), and gets the channel at its next post once the
	// sender did (the channel-offer word).
	remote := a.qp.Endpoint()
	if err := b.qp.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSInit, Port: 1, AccessFlags: vrdma.AccessAll}, initMask); err != nil {
		t.Fatal(err)
	}
	rtr := vrdma.QPAttr{State: vrdma.QPSRTR, DGID: remote.GID, PathMTU: 1024, DestQPN: remote.QPN, RQPSN: remote.PSN,
		MaxDestRdAtomic: 1, MinRNRTimer: 12}
	if err := b.qp.Modify(ctx, &rtr, rtrMask); err != nil {
		t.Fatal(err)
	}
	if err := modifyToRTS(ctx, a.qp, a.ad, b.qp.Endpoint(), defaultRC); err != nil {
		t.Fatal(err)
	}
	if st := b.qp.State(); st != vrdma.QPSRTR {
		t.Fatalf("the receiver is in %s, want RTR", st)
	}
	if p := a.qp.Path(); p.Path != vrdma.PathMemcpyDirect {
		t.Fatalf("path %+v, want memcpy-direct", p)
	}
	const n, size = 200, 64
	sm, rm := a.mr(t, n*size, vrdma.AccessAll), b.mr(t, n*size, vrdma.AccessAll)
	for i := range sm.Bytes() {
		sm.Bytes()[i] = byte(i*7 + 1)
	}
	var recvs []vrdma.RecvWR
	for i := range n {
		recvs = append(recvs, vrdma.RecvWR{ID: uint64(i), SGL: sgl(rm.SGE(size*i, size))})
	}
	postRecv(t, b.qp, recvs...)
	p := startPoller(b.rcq)
	defer func() {
		if p != nil {
			p.end() // the test failed before the poll ended
		}
	}()
	for i := range n {
		postSend(t, a.qp, vrdma.SendWR{ID: uint64(i), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(sm.SGE(size*i, size))})
		if i%32 == 31 {
			waitWC(t, a.scq, 32)
		}
	}
	for i, w := range p.wait(t, n) {
		if w.WRID != uint64(i) || w.Status != vrdma.WCSuccess || w.Opcode != vrdma.WCRecv || w.ByteLen != size {
			t.Fatalf("receive %d: %+v", i, w)
		}
	}
	p.end()
	p = nil
	expectBytes(t, "received", rm.Bytes(), sm.Bytes())
	if c := s.qpCounters(t, a); c.Ops["SEND"] != 0 {
		t.Fatalf("the agent relayed %d SENDs to a receiver in RTR: the channel should have carried them", c.Ops["SEND"])
	}

	// RTR -> RTS keeps the channel; the receiver now sends too.
	rts := vrdma.QPAttr{State: vrdma.QPSRTS, SQPSN: b.qp.Endpoint().PSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}
	if err := b.qp.Modify(ctx, &rts, rtsMask); err != nil {
		t.Fatal(err)
	}
	postRecv(t, a.qp, vrdma.RecvWR{ID: 7, SGL: sgl(sm.SGE(0, size))})
	postSend(t, b.qp, vrdma.SendWR{ID: 8, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(rm.SGE(size, size))})
	if w := waitWC(t, a.rcq, 1)[0]; w.WRID != 7 || w.Status != vrdma.WCSuccess || w.ByteLen != size {
		t.Fatalf("receive in the other direction: %+v", w)
	}
	if w := waitWC(t, b.scq, 1)[0]; w.WRID != 8 || w.Status != vrdma.WCSuccess {
		t.Fatalf("send completion in the other direction: %+v", w)
	}
	for _, e := range []*end{a, b} {
		if c := s.qpCounters(t, e); c.Ops["SEND"] != 0 {
			t.Fatalf("QP 0x%x: the agent relayed %d SENDs after the receiver's move to RTS", e.qp.QPN(), c.Ops["SEND"])
		}
	}
}

// directPairWith is directPair with explicit RC attributes.
func directPairWith(t *testing.T, prefix string, c pairConfig, pa, pb rcParams) (*suite, *end, *end) {
	t.Helper()
	env := testenv.Start(t)
	s := &suite{env: &directEnv{memcpyEnv{env: env, prefix: prefix}}, how: connOOB}
	a, b := s.pairWith(t, c, pa, pb)
	if p := a.qp.Path(); p.Path != vrdma.PathMemcpyDirect {
		t.Fatalf("path %+v, want memcpy-direct", p)
	}
	return s, a, b
}

// poller polls cq in a goroutine until stop, collecting its completions:
// a receiver that takes channel messages as they come.
type poller struct {
	mu   sync.Mutex
	got  []vrdma.WorkCompletion
	err  error
	stop chan struct{}
	done chan struct{}
}

func startPoller(cq *vrdma.CQ) *poller {
	p := &poller{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		wc := make([]vrdma.WorkCompletion, 16)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			n, err := cq.Poll(wc)
			p.mu.Lock()
			p.got = append(p.got, wc[:n]...)
			if err != nil && p.err == nil {
				p.err = err
			}
			p.mu.Unlock()
			if n == 0 {
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()
	return p
}

// wait returns the first n completions, waiting at most waitTimeout.
func (p *poller) wait(t *testing.T, n int) []vrdma.WorkCompletion {
	t.Helper()
	for deadline := time.Now().Add(waitTimeout); ; time.Sleep(100 * time.Microsecond) {
		p.mu.Lock()
		got, err := append([]vrdma.WorkCompletion(nil), p.got...), p.err
		p.mu.Unlock()
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if len(got) >= n {
			return got[:n]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d completions of %d after %v: %s", len(got), n, waitTimeout, fmtWCs(got))
		}
	}
}

func (p *poller) end() {
	close(p.stop)
	<-p.done
}

// TestDirectSendOrdering posts, on one QP, small SENDs (the channel), a
// SEND too long for a slot and a WRITE_WITH_IMM (both relayed), RDMA
// WRITEs after SENDs (direct or relayed) and a SEND_WITH_INV-free mix of
// immediates, in several rounds, while the receiver polls: the receives
// complete in posting order with their bytes, every WRITE before a later
// SEND has landed when that SEND's receive completes, and every send
// completes once, in order.
func TestDirectSendOrdering(t *testing.T) {
	_, a, b := directPair(t, "dso", pairConfig{})
	const rounds = 20
	src, dst, win := a.mr(t, 64<<10, vrdma.AccessAll), b.mr(t, 64<<10, vrdma.AccessAll), b.mr(t, 4096, vrdma.AccessAll)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7 + i>>9)
	}
	rp := startPoller(b.rcq)
	defer rp.end()
	type msg struct {
		n   int
		imm bool
	}
	var want []msg
	id := uint64(0)
	for r := 0; r < rounds; r++ {
		var recvs []vrdma.RecvWR
		for k := 0; k < 5; k++ {
			recvs = append(recvs, vrdma.RecvWR{ID: uint64(len(want) + len(recvs)), SGL: sgl(dst.SGE(8192*((len(want)+len(recvs))%8), 8192))})
		}
		postRecv(t, b.qp, recvs...)
		binary.LittleEndian.PutUint64(src.Bytes()[60000:], uint64(r+1))
		wrs := []vrdma.SendWR{
			{Opcode: vrdma.OpSend, SGL: sgl(src.SGE(r, 16))},
			{Opcode: vrdma.OpSend, SGL: sgl(src.SGE(100, 5000+r))}, // longer than a slot: relayed
			{Opcode: vrdma.OpSendWithImm, Imm: uint32(r), SGL: sgl(src.SGE(r+1, 32))},
			{Opcode: vrdma.OpRDMAWrite, SGL: sgl(src.SGE(60000, 8)), RemoteAddr: win.Addr() + 8, RKey: win.RKey()},
			{Opcode: vrdma.OpRDMAWriteWithImm, Imm: uint32(r + 1000), RemoteAddr: win.Addr(), RKey: win.RKey(), SGL: sgl(src.SGE(60000, 8))},
			{Opcode: vrdma.OpSend, SGL: sgl(src.SGE(r+2, 8))},
		}
		want = append(want, msg{16, false}, msg{5000 + r, false}, msg{32, true}, msg{8, true}, msg{8, false})
		for i := range wrs {
			wrs[i].ID, wrs[i].Flags = id, vrdma.SendSignaled
			id++
		}
		postSend(t, a.qp, wrs...)
		got := rp.wait(t, len(want))
		// The last SEND's receive: the WRITE before it has landed.
		if v := binary.LittleEndian.Uint64(win.Bytes()[8:]); v != uint64(r+1) {
			t.Fatalf("round %d: the RDMA WRITE posted before the last SEND is not there when its receive completed: %d", r, v)
		}
		_ = got
	}
	got := rp.wait(t, len(want))
	for i, w := range got {
		m := want[i]
		op := vrdma.WCRecv
		if i%5 == 3 {
			op = vrdma.WCRecvRDMAWithImm
		}
		if w.WRID != uint64(i) || w.Status != vrdma.WCSuccess || w.Opcode != op || int(w.ByteLen) != m.n || (w.Flags&vrdma.WCWithImm != 0) != m.imm {
			t.Fatalf("receive %d: %s, want wr_id %d %s of %d bytes, with imm %v", i, fmtWC(w), i, op, m.n, m.imm)
		}
	}
	for i, w := range waitWC(t, a.scq, int(id)) {
		if w.WRID != uint64(i) || w.Status != vrdma.WCSuccess {
			t.Fatalf("send completion %d: %s", i, fmtWC(w))
		}
	}
}

// TestDirectSendRetractions ping-pongs 4,000 SENDs of varying
// sizes, some over a slot's payload, with a relay delay of a few
// microseconds (libdiag.RelayAfter), so that many messages are retracted
// and relayed while the receiver is taking others: every message
// arrives once, in order, with its bytes, the receive queues' heads stay
// in step between the libraries and the agent (no QP leaves RTS), and both
// ways went through both the channel and the relay.
func TestDirectSendRetractions(t *testing.T) {
	libdiag.RelayAfter.Store(int64(3 * time.Microsecond))
	t.Cleanup(func() { libdiag.RelayAfter.Store(0) })
	s, a, b := directPair(t, "dsr", pairConfig{})
	const n = 2000
	ends := [2]*end{a, b}
	var mrs [2]*vrdma.MR
	for i, e := range ends {
		mrs[i] = e.mr(t, 2*8192, vrdma.AccessAll)
		var recvs []vrdma.RecvWR
		for k := range 64 {
			recvs = append(recvs, vrdma.RecvWR{ID: uint64(k), SGL: sgl(mrs[i].SGE(8192, 8192))})
		}
		postRecv(t, e.qp, recvs...)
	}
	// Message k (0, 1, 2 … 2n-1) goes from side k%2 to the other, size(k)
	// bytes, its first 8 bytes k when it has 8; each side answers the
	// message it receives with the next.
	size := func(k int) int { return []int{8, 0, 100, 4096, 5000, 64, 4160, 9}[k%8] }
	errc := make(chan error, 2)
	for i := range ends {
		go func() {
			me, buf := ends[i], mrs[i]
			wc := make([]vrdma.WorkCompletion, 8)
			send := func(k int) error {
				if size(k) >= 8 {
					binary.LittleEndian.PutUint64(buf.Bytes(), uint64(k))
				}
				flags := vrdma.SendFlags(0)
				if k%8 >= 6 {
					flags = vrdma.SendSignaled
				}
				return me.qp.PostSend([]vrdma.SendWR{{ID: uint64(k), Opcode: vrdma.OpSend, Flags: flags, SGL: sgl(buf.SGE(0, size(k)))}})
			}
			if i == 0 {
				if err := send(0); err != nil {
					errc <- err
					return
				}
			}
			for g, deadline := 0, time.Now().Add(waitTimeout); g < n; {
				if time.Now().After(deadline) {
					errc <- fmt.Errorf("side %d: %d messages of %d, none for %v; %s; %s", i, g, n, waitTimeout,
						libdiag.RingWords(me.qp, me.rcq), libdiag.RingWords(ends[1-i].qp, ends[1-i].rcq))
					return
				}
				m, err := me.rcq.Poll(wc)
				if err != nil {
					errc <- err
					return
				}
				for _, w := range wc[:m] {
					k := 2*g + 1 - i
					if w.Status != vrdma.WCSuccess || int(w.ByteLen) != size(k) {
						errc <- fmt.Errorf("side %d: message %d: %s, want %d bytes", i, k, fmtWC(w), size(k))
						return
					}
					if v := binary.LittleEndian.Uint64(buf.Bytes()[8192:]); size(k) >= 8 && v != uint64(k) {
						errc <- fmt.Errorf("side %d: message %d carries %d", i, k, v)
						return
					}
					g++
					deadline = time.Now().Add(waitTimeout) // each message in time, however slow the machine (-race)
					if err := me.qp.PostRecv([]vrdma.RecvWR{{ID: uint64(g), SGL: sgl(buf.SGE(8192, 8192))}}); err != nil {
						errc <- err
						return
					}
					if k+1 < 2*n {
						if err := send(k + 1); err != nil {
							errc <- err
							return
						}
					}
				}
				if m == 0 {
					runtime.Gosched() // the agent runs in this process: let its goroutines have the CPU
				}
				m, err = me.scq.Poll(wc)
				for _, w := range wc[:m] {
					if w.Status != vrdma.WCSuccess {
						errc <- fmt.Errorf("side %d: send completion %s", i, fmtWC(w))
						return
					}
				}
				if err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	var errs []error
	for range 2 {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	for _, e := range ends {
		if st := e.qp.State(); st != vrdma.QPSRTS {
			t.Fatalf("QP 0x%x in %s after the stream", e.qp.QPN(), st)
		}
		if c := s.qpCounters(t, e); c.Ops["SEND"] == 0 || c.Ops["SEND"] >= n {
			t.Fatalf("QP 0x%x: the agent relayed %d SENDs of %d: want both the channel and the relay used", e.qp.QPN(), c.Ops["SEND"], n)
		}
	}
}

// TestDirectSendRNR: a SEND to a receiver that has no receive posted but
// polls (so its library refuses the message, and the sender relays it)
// fails with RNR_RETRY_EXC_ERR after rnr_retry retries when rnr_retry is
// below 7, both QPs' states as the relay leaves them; with rnr_retry 7 it
// waits, and completes once a receive is posted.
func TestDirectSendRNR(t *testing.T) {
	for _, retry := range []uint8{2, 7} {
		t.Run(fmt.Sprintf("rnr_retry=%d", retry), func(t *testing.T) {
			pa, pb := defaultRC, defaultRC
			pa.rnrRetry, pb.minRNRTimer = retry, 1 // 0.01 ms
			_, a, b := directPairWith(t, "drn"+strconv.Itoa(int(retry)), pairConfig{}, pa, pb)
			src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
			rp := startPoller(b.rcq)
			defer rp.end()
			postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
			if retry < 7 {
				expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCRNRRetryExcErr, vrdma.WCSend)
				waitState(t, a.qp, vrdma.QPSErr)
				return
			}
			expectNoWC(t, a.scq, 20*time.Millisecond, "a SEND retried forever")
			postRecv(t, b.qp, vrdma.RecvWR{ID: 7, SGL: sgl(dst.SGE(0, 64))})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCSend)
			expectRecv(t, rp.wait(t, 1)[0], b.qp, 7, vrdma.WCRecv, 64, 0, false)
		})
	}
}

// TestDirectSendRecvTooSmall: a message longer than its receive's
// buffers, and one whose receive has a bad SGE, fail on both sides as on
// the relayed path: the receiver LOC_LEN_ERR and the sender
// REM_INV_REQ_ERR; the receiver LOC_PROT_ERR and the sender REM_OP_ERR;
// both QPs in ERR.
func TestDirectSendRecvTooSmall(t *testing.T) {
	for _, c := range []struct {
		name         string
		recvSt, send vrdma.WCStatus
	}{{"too-small", vrdma.WCLocLenErr, vrdma.WCRemInvReqErr}, {"bad-sge", vrdma.WCLocProtErr, vrdma.WCRemOpErr}} {
		t.Run(c.name, func(t *testing.T) {
			_, a, b := directPair(t, "drs"+c.name[:3], pairConfig{})
			src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
			sge := dst.SGE(0, 8)
			if c.name == "bad-sge" {
				sge = dst.SGE(0, 64)
				sge.LKey ^= 0x5a5a00
			}
			postRecv(t, b.qp, vrdma.RecvWR{ID: 3, SGL: sgl(sge)})
			rp := startPoller(b.rcq)
			defer rp.end()
			postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
			expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, c.send, vrdma.WCSend)
			expectWC(t, rp.wait(t, 1)[0], b.qp, 3, c.recvSt, vrdma.WCRecv)
			waitState(t, a.qp, vrdma.QPSErr)
			waitState(t, b.qp, vrdma.QPSErr)
		})
	}
}

// TestDirectSendFlush: the receiver takes some channel messages, then its
// QP moves to ERR with more messages in the channel and receives posted:
// every receive completes exactly once (success or WR_FLUSH_ERR, the
// flush starting after the ones its library took), every send exactly
// once, the ones taken successfully, and the sender's QP ends in ERR.
func TestDirectSendFlush(t *testing.T) {
	// SENDs 3 and 4 wait in the channel for b's move to ERR, not for
	// relay_ns: relayed before it, they would complete at b (seen on a
	// loaded machine, where the modify took longer than 1 ms).
	patientRelay(t)
	pa := defaultRC
	pa.timeout, pa.retryCnt = 8, 1 // ~1 ms: the relay of the untaken ones gives up soon
	_, a, b := directPairWith(t, "dfl", pairConfig{}, pa, defaultRC)
	src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64*10, vrdma.AccessAll)
	var recvs []vrdma.RecvWR
	for i := range 10 {
		recvs = append(recvs, vrdma.RecvWR{ID: uint64(100 + i), SGL: sgl(dst.SGE(64*i, 64))})
	}
	postRecv(t, b.qp, recvs...)
	send := func(ids ...uint64) {
		for _, id := range ids {
			postSend(t, a.qp, vrdma.SendWR{ID: id, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 8))})
		}
	}
	send(0, 1, 2)
	taken := waitWC(t, b.rcq, 3)
	for i, w := range taken {
		expectRecv(t, w, b.qp, uint64(100+i), vrdma.WCRecv, 8, 0, false)
	}
	send(3, 4) // into the channel; b does not poll
	if err := b.qp.Modify(opCtx(t), &vrdma.QPAttr{State: vrdma.QPSErr}, vrdma.MaskState); err != nil {
		t.Fatal(err)
	}
	rest := waitWC(t, b.rcq, 7)
	seen := map[uint64]bool{}
	for _, w := range append(taken, rest...) {
		if seen[w.WRID] {
			t.Fatalf("receive %d completed twice", w.WRID)
		}
		seen[w.WRID] = true
	}
	for i, w := range rest {
		if w.WRID != uint64(103+i) || w.Status != vrdma.WCWRFlushErr {
			t.Fatalf("flushed receive %d: %s, want wr_id %d WR_FLUSH_ERR", i, fmtWC(w), 103+i)
		}
	}
	expectNoWC(t, b.rcq, quiet, "after the flush")
	sc := waitWC(t, a.scq, 5)
	for i, w := range sc {
		if w.WRID != uint64(i) || (i < 3) != (w.Status == vrdma.WCSuccess) {
			t.Fatalf("send completion %d: %s", i, fmtWC(w))
		}
	}
	expectNoWC(t, a.scq, quiet, "after every send completed")
	waitState(t, a.qp, vrdma.QPSErr)
}

// TestDirectSendEvents: a receiver that sleeps on its CQ's event
// (ReqNotify, WaitEvent) is woken by a channel message — through
// direct-notify, since the agent relays none (its counters) — and one
// armed for solicited completions only sleeps through an unsolicited
// message and wakes for a solicited one.
func TestDirectSendEvents(t *testing.T) {
	patientRelay(t)
	s, a, b := directPair(t, "dev", pairConfig{})
	src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64*4, vrdma.AccessAll)
	ctx := opCtx(t)
	wc := make([]vrdma.WorkCompletion, 4)
	for i, solicitedOnly := range []bool{false, true} {
		postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(2 * i), SGL: sgl(dst.SGE(128*i, 64))})
		if solicitedOnly {
			postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(2*i + 1), SGL: sgl(dst.SGE(128*i+64, 64))})
		}
		b.rcq.ReqNotify(solicitedOnly)
		woke := make(chan error, 1)
		go func() { woke <- b.rcq.WaitEvent(ctx) }()
		time.Sleep(quiet)
		postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, SGL: sgl(src.SGE(0, 8))})
		if solicitedOnly {
			select {
			case err := <-woke:
				t.Fatalf("armed for solicited completions, woken (%v) by an unsolicited message", err)
			case <-time.After(5 * quiet):
			}
			postSend(t, a.qp, vrdma.SendWR{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSolicited, SGL: sgl(src.SGE(0, 8))})
		}
		select {
		case err := <-woke:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("armed (solicited only: %v), not woken by the message", solicitedOnly)
		}
		want := 1
		if solicitedOnly {
			want = 2
		}
		got := 0
		for deadline := time.Now().Add(waitTimeout); got < want && time.Now().Before(deadline); {
			n, err := b.rcq.Poll(wc[got:])
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		if got != want {
			t.Fatalf("%d receives after the event, want %d", got, want)
		}
	}
	// Wait (arm and sleep in one) too.
	postRecv(t, b.qp, vrdma.RecvWR{ID: 9, SGL: sgl(dst.SGE(0, 64))})
	woke := make(chan error, 1)
	go func() { woke <- b.rcq.Wait(ctx) }()
	time.Sleep(quiet)
	postSend(t, a.qp, vrdma.SendWR{ID: 3, Opcode: vrdma.OpSend, SGL: sgl(src.SGE(0, 8))})
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	expectRecv(t, waitWC(t, b.rcq, 1)[0], b.qp, 9, vrdma.WCRecv, 8, 0, false)
	if c := s.qpCounters(t, a); c.Ops["SEND"] != 0 {
		t.Fatalf("the agent relayed %d of the SENDs: the events did not come through the channel", c.Ops["SEND"])
	}
}

// TestDirectSendEventAfterRetraction: a message that raised the receive
// CQ's event when it was posted (its sender's direct-notify), then was
// retracted and relayed because the receiver did not take it in time,
// leaves one event with one completion behind it, as a program that polls
// once per event (ibv_get_cq_event, ibv_req_notify_cq, ibv_poll_cq:
// perftest's -e) needs: the poll after the arming finds it, and no second
// event follows.
func TestDirectSendEventAfterRetraction(t *testing.T) {
	libdiag.RelayAfter.Store(int64(time.Millisecond))
	t.Cleanup(func() { libdiag.RelayAfter.Store(0) })
	s, a, b := directPair(t, "der", pairConfig{})
	src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
	ctx := opCtx(t)
	postRecv(t, b.qp, vrdma.RecvWR{ID: 7, SGL: sgl(dst.SGE(0, 64))})
	b.rcq.ReqNotify(false)
	postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 8))})
	waitWC(t, a.scq, 1) // the receiver takes nothing meanwhile: retracted after 1 ms and relayed
	if c := s.qpCounters(t, a); c.Ops["SEND"] != 1 {
		t.Fatalf("the agent relayed %d SENDs, want the retracted one", c.Ops["SEND"])
	}
	if err := b.rcq.WaitEvent(ctx); err != nil {
		t.Fatal(err)
	}
	b.rcq.ReqNotify(false)
	wc := make([]vrdma.WorkCompletion, 2)
	n, err := b.rcq.Poll(wc)
	if err != nil || n != 1 {
		t.Fatalf("the poll after the event and the arming: %d completions (%v), want the relayed message", n, err)
	}
	expectRecv(t, wc[0], b.qp, 7, vrdma.WCRecv, 8, 0, false)
	quietCtx, cancel := context.WithTimeout(ctx, 5*quiet)
	defer cancel()
	if err := b.rcq.WaitEvent(quietCtx); err == nil {
		n, _ := b.rcq.Poll(wc)
		t.Fatalf("a second event after the relayed message, with %d completions behind it", n)
	}
}

// TestDirectSendArmedBeforePost: a send CQ armed before a signaled SEND
// goes into the channel gets its event when the receiver takes the
// message, with the completion behind it (ibv_req_notify_cq, post,
// ibv_get_cq_event, ibv_poll_cq: perftest's -e on the sending side).
func TestDirectSendArmedBeforePost(t *testing.T) {
	patientRelay(t)
	s, a, b := directPair(t, "dap", pairConfig{})
	src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64, vrdma.AccessAll)
	ctx := opCtx(t)
	wc := make([]vrdma.WorkCompletion, 2)
	for i := range 3 {
		postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(i), SGL: sgl(dst.SGE(0, 64))})
		a.scq.ReqNotify(false)
		postSend(t, a.qp, vrdma.SendWR{ID: uint64(10 + i), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 8))})
		expectRecv(t, waitWC(t, b.rcq, 1)[0], b.qp, uint64(i), vrdma.WCRecv, 8, 0, false)
		evCtx, cancel := context.WithTimeout(ctx, waitTimeout)
		err := a.scq.WaitEvent(evCtx)
		cancel()
		if err != nil {
			t.Fatalf("send %d: no event of the armed send CQ after the receiver took the message: %v", i, err)
		}
		if n, err := a.scq.Poll(wc); err != nil || n != 1 || wc[0].WRID != uint64(10+i) || wc[0].Status != vrdma.WCSuccess {
			t.Fatalf("send %d: the poll after the event: %d %+v %v, want its completion", i, n, wc[:n], err)
		}
	}
	if c := s.qpCounters(t, a); c.Ops["SEND"] != 0 {
		t.Fatalf("the agent relayed %d of the SENDs: the events did not come through the channel", c.Ops["SEND"])
	}
}

// directSenderWorkload is the peer of TestDirectSendPeerKilled: it
// attaches $VRDMA_TEST_VM, connects through the CM to $VRDMA_TEST_REMOTE
// port $VRDMA_TEST_PORT, prints "ready", then sends 8-byte signaled SENDs
// in a loop, printing "sending" after its first 100 completions, until
// its standard input closes or a send fails.
func directSenderWorkload() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, pd, cq, qp, err := connectWorkload(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "direct-sender:", err)
		return 1
	}
	buf, err := v.Alloc(8)
	if err != nil {
		return 1
	}
	mr, err := pd.RegMR(ctx, buf, vrdma.AccessLocalWrite)
	if err != nil {
		return 1
	}
	fmt.Println("ready", qp.QPN(), qp.Path().Path)
	wc := make([]vrdma.WorkCompletion, 1)
	for i := uint64(0); ctx.Err() == nil; i++ {
		binary.LittleEndian.PutUint64(buf, i)
		if err := qp.PostSend([]vrdma.SendWR{{ID: i, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{mr.SGE(0, 8)}}}); err != nil {
			break
		}
		n := 0
		for n == 0 && ctx.Err() == nil {
			if n, err = cq.Poll(wc); err != nil {
				return 1
			}
		}
		if wc[0].Status != vrdma.WCSuccess {
			break
		}
		if i == 100 {
			fmt.Println("sending")
		}
	}
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestDirectSendPeerKilled kills a peer process while it sends to us
// through the channel: our receives that its messages did not take
// complete exactly once (flushed: the agent moves our QP to ERR), our
// process maps no channel file any more, and the agent serves on.
func TestDirectSendPeerKilled(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	a := lcNewSide(t, ctx, env.Open(t, "dpks-own", testenv.VMOptions{MemMB: 16, DirectPeers: []string{"dpks-peer"}}))
	env.Define(t, "dpks-peer", testenv.VMOptions{MemMB: 16, DirectPeers: []string{"dpks-own"}})
	l, err := a.vm.Adapters()[0].Listen(ctx, 80)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	const nrecv, batch = 200, 20
	var recvs []vrdma.RecvWR
	for i := range nrecv {
		recvs = append(recvs, vrdma.RecvWR{ID: uint64(i), SGL: sgl(a.mr.SGE(8*(i%64), 8))})
	}
	acc := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err == nil {
			err = r.Accept(ctx, a.qp)
		}
		acc <- err
	}()
	c := lcStartChild(t, "direct-sender", "VRDMA_TEST_SOCKET="+env.Socket, "VRDMA_TEST_VM=dpks-peer", "VRDMA_TEST_REMOTE=dpks-own/vrdma0", "VRDMA_TEST_PORT=80")
	if line := c.expect(t, "ready"); !strings.HasSuffix(line, " memcpy-direct") {
		t.Fatalf("the peer: %q, want its QP on memcpy-direct", line)
	}
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
	rp := startPoller(a.cq)
	posted := 0
	for ; posted < 120; posted += batch { // 120 of the peer's messages taken
		if err := a.qp.PostRecv(recvs[posted : posted+batch]); err != nil {
			t.Fatal(err)
		}
		rp.wait(t, posted+batch)
	}
	c.expect(t, "sending")
	if !mapsChannel(t, os.Getpid(), a.qp.QPN()) {
		t.Fatal("we do not map the channel while the peer sends")
	}
	if err := a.qp.PostRecv(recvs[posted : posted+batch]); err != nil {
		t.Fatal(err)
	}
	posted += batch
	c.kill()
	got := rp.wait(t, posted)
	rp.end()
	seen := map[uint64]bool{}
	for _, w := range got {
		if seen[w.WRID] {
			t.Fatalf("receive %d completed twice", w.WRID)
		}
		seen[w.WRID] = true
	}
	if len(got) != posted {
		t.Fatalf("%d receive completions for %d receives", len(got), posted)
	}
	waitState(t, a.qp, vrdma.QPSErr)
	if mapsChannel(t, os.Getpid(), a.qp.QPN()) {
		t.Fatal("we still map the channel of a peer that was killed")
	}
	b := lcNewSide(t, ctx, env.Open(t, "dpks-new", testenv.VMOptions{MemMB: 16}))
	cc := lcNewSide(t, ctx, env.Open(t, "dpks-new2", testenv.VMOptions{MemMB: 16}))
	lcConnectCM(t, ctx, b, cc, 81)
	if err := lcRoundTrip(ctx, b, cc, 1); err != nil {
		t.Fatal(err)
	}
}

// mapsChannel reports whether process pid maps a send channel file of
// QP qpn (the agent names it after the two QPNs).
func mapsChannel(t *testing.T, pid int, qpn uint32) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.Index(l, "/memfd:vrdma-chan-"); i >= 0 {
			name := strings.Fields(l[i+len("/memfd:vrdma-chan-"):])[0]
			for _, part := range strings.Split(name, "-") {
				if part == strconv.FormatUint(uint64(qpn), 16) {
					return true
				}
			}
		}
	}
	return false
}

// TestDirectSendFlushAfterPeerGone is rping's end on memcpy-direct: the
// receiver, with rping's one-receive queue (a ring of 2 slots, indices
// modulo 4), takes channel messages and reposts a receive after each;
// the sender's VM goes (its process exits), then the receiver's QP moves
// to ERR: its posted receive completes with WR_FLUSH_ERR. With 4 taken
// by its library, the agent's own head (0) equals the RQ tail (4 ≡ 0)
// while one receive is posted: the agent must judge the queue by the
// RQ-head word its library stores, or it never flushes (rping's server
// then waits forever for its CQ's event).
func TestDirectSendFlushAfterPeerGone(t *testing.T) {
	small := qpConfig{caps: defaultCaps}
	small.caps.MaxRecvWR = 1
	_, a, b := directPairWith(t, "dpg", pairConfig{a: qpConfig{caps: defaultCaps}, b: small}, defaultRC, defaultRC)
	src, dst := a.mr(t, 64, vrdma.AccessAll), b.mr(t, 64*10, vrdma.AccessAll)
	for i := range 3 {
		postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(100 + i), SGL: sgl(dst.SGE(64*i, 64))})
		postSend(t, a.qp, vrdma.SendWR{ID: uint64(i), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 8))})
		expectRecv(t, waitWC(t, b.rcq, 1)[0], b.qp, uint64(100+i), vrdma.WCRecv, 8, 0, false)
		waitWC(t, a.scq, 1)
	}
	postRecv(t, b.qp, vrdma.RecvWR{ID: 103, SGL: sgl(dst.SGE(64*3, 64))})
	a.vm.Close()
	if err := b.qp.Modify(opCtx(t), &vrdma.QPAttr{State: vrdma.QPSErr}, vrdma.MaskState); err != nil {
		t.Fatal(err)
	}
	w := waitWC(t, b.rcq, 1)[0]
	if w.WRID != 103 || w.Status != vrdma.WCWRFlushErr {
		t.Fatalf("flushed receive: %s, want wr_id 103 WR_FLUSH_ERR", fmtWC(w))
	}
	expectNoWC(t, b.rcq, quiet, "after the flush")
}
