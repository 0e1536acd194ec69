// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
)

// testUC is the conformance case of unreliable connected QPs: UC's
// attributes (RC's retry, RNR and READ/atomic ones refused), READ and
// atomics refused at post, SEND and RDMA WRITE with and without
// immediate byte-exact, a send completing once it left whatever became of
// it, and every refusal at the responder a silent drop of the message
// with the QP going on: no receive posted, a bad rkey, a receive too
// small. On the lossy paths, a stream of messages of several packets
// each: every message that completes at the receiver is whole and exact,
// none twice; those a loss broke are dropped whole.
func testUC(t *testing.T, s *suite) {
	t.Run("attributes", func(t *testing.T) { ucAttributes(t, s) })
	t.Run("connect", func(t *testing.T) { ucConnectMethods(t, s) })
	t.Run("opcodes", func(t *testing.T) { ucOpcodes(t, s) })
	t.Run("stream", func(t *testing.T) { ucStream(t, s) })
	t.Run("rc-peer", func(t *testing.T) { ucRCPeer(t, s) })
}

// ucRCPeer connects a UC QP to an RC QP (a misconfiguration): what each
// sends the other is dropped, as a RoCE responder drops a packet of
// another transport — the UC SEND completes (it left) and nothing
// arrives; the RC SEND is never answered and ends RETRY_EXC_ERR — and
// nothing else breaks.
func ucRCPeer(t *testing.T, s *suite) {
	vms := s.env.OpenVMs(t, 2)
	u, r := newEnd(t, vms[0], ucConfig), newEnd(t, vms[1], qpConfig{})
	ucConnect(t, u.qp, r.qp.Endpoint())
	p := defaultRC
	p.timeout, p.retryCnt = 8, 1 // 1 ms, one retry
	if err := modifyToRTS(opCtx(t), r.qp, r.ad, u.qp.Endpoint(), p); err != nil {
		t.Fatal(err)
	}
	s.checkConnected(t, u, r)
	um, rm := u.mr(t, 256, vrdma.AccessLocalWrite), r.mr(t, 256, vrdma.AccessLocalWrite)
	postRecv(t, u.qp, vrdma.RecvWR{ID: 1, SGL: sgl(um.SGE(0, 256))})
	postRecv(t, r.qp, vrdma.RecvWR{ID: 2, SGL: sgl(rm.SGE(0, 256))})
	postSend(t, u.qp, vrdma.SendWR{ID: 3, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(um.SGE(0, 64))})
	expectWC(t, waitWC(t, u.scq, 1)[0], u.qp, 3, vrdma.WCSuccess, vrdma.WCSend)
	postSend(t, r.qp, vrdma.SendWR{ID: 4, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(rm.SGE(0, 64))})
	expectWC(t, waitWC(t, r.scq, 1)[0], r.qp, 4, vrdma.WCRetryExcErr, 0)
	expectNoWC(t, u.rcq, quiet, "the UC QP, sent RC packets")
	expectState(t, u.qp, vrdma.QPSRTS)
	// The RC QP's receive is flushed by its own error, not completed by
	// the UC SEND.
	for _, w := range waitWC(t, r.rcq, 1) {
		expectWC(t, w, r.qp, 2, vrdma.WCWRFlushErr, 0)
	}
}

var ucConfig = qpConfig{typ: vrdma.QPTypeUC}

const (
	ucRTRMask = vrdma.MaskState | vrdma.MaskAV | vrdma.MaskPathMTU | vrdma.MaskDestQPN | vrdma.MaskRQPSN
	ucRTSMask = vrdma.MaskState | vrdma.MaskSQPSN
)

// ucPair opens two VMs and connects a UC QP of each to the other, as
// ibv_uc_pingpong does (out of band, UC's masks).
func (s *suite) ucPair(t *testing.T) (a, b *end) {
	t.Helper()
	vms := s.env.OpenVMs(t, 2)
	a, b = newEnd(t, vms[0], ucConfig), newEnd(t, vms[1], ucConfig)
	ucConnect(t, a.qp, b.qp.Endpoint())
	ucConnect(t, b.qp, a.qp.Endpoint())
	s.checkConnected(t, a, b)
	return a, b
}

// ucConnect moves UC QP q from RESET to RTS facing remote.
func ucConnect(t *testing.T, q *vrdma.QP, remote vrdma.Endpoint) {
	t.Helper()
	ctx := opCtx(t)
	init := vrdma.QPAttr{State: vrdma.QPSInit, Port: 1, AccessFlags: vrdma.AccessLocalWrite | vrdma.AccessRemoteWrite}
	rtr := vrdma.QPAttr{State: vrdma.QPSRTR, DGID: remote.GID, PathMTU: 1024, DestQPN: remote.QPN, RQPSN: remote.PSN}
	rts := vrdma.QPAttr{State: vrdma.QPSRTS, SQPSN: q.Endpoint().PSN}
	for _, m := range []struct {
		a    *vrdma.QPAttr
		mask vrdma.QPAttrMask
	}{{&init, initMask}, {&rtr, ucRTRMask}, {&rts, ucRTSMask}} {
		if err := q.Modify(ctx, m.a, m.mask); err != nil {
			t.Fatalf("UC QP 0x%x to %s: %v", q.QPN(), m.a.State, err)
		}
	}
}

func ucAttributes(t *testing.T, s *suite) {
	vms := s.env.OpenVMs(t, 2)
	a, b := newEnd(t, vms[0], ucConfig), newEnd(t, vms[1], ucConfig)
	if a.qp.Type() != vrdma.QPTypeUC {
		t.Fatalf("Type() = %q, want UC", a.qp.Type())
	}
	ctx := opCtx(t)
	remote := b.qp.Endpoint()
	if err := a.qp.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSInit, Port: 1, AccessFlags: vrdma.AccessRemoteWrite}, initMask); err != nil {
		t.Fatal(err)
	}
	// RC's RTR and RTS masks carry attributes UC has not: EINVAL, as rxe.
	rtr := vrdma.QPAttr{State: vrdma.QPSRTR, DGID: remote.GID, PathMTU: 1024, DestQPN: remote.QPN, RQPSN: remote.PSN, MinRNRTimer: 12, MaxDestRdAtomic: 1}
	if err := a.qp.Modify(ctx, &rtr, rtrMask); !errors.Is(err, vrdma.ErrInvalid) {
		t.Fatalf("UC RTR with max_dest_rd_atomic and min_rnr_timer: %v, want ErrInvalid", err)
	}
	if err := a.qp.Modify(ctx, &rtr, ucRTRMask&^vrdma.MaskRQPSN); !errors.Is(err, vrdma.ErrInvalid) {
		t.Fatalf("UC RTR without rq_psn: %v, want ErrInvalid", err)
	}
	if err := a.qp.Modify(ctx, &rtr, ucRTRMask); err != nil {
		t.Fatal(err)
	}
	rts := vrdma.QPAttr{State: vrdma.QPSRTS, SQPSN: a.qp.Endpoint().PSN, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}
	if err := a.qp.Modify(ctx, &rts, rtsMask); !errors.Is(err, vrdma.ErrInvalid) {
		t.Fatalf("UC RTS with timeout, retry_cnt, rnr_retry and max_rd_atomic: %v, want ErrInvalid", err)
	}
	if err := a.qp.Modify(ctx, &rts, ucRTSMask); err != nil {
		t.Fatal(err)
	}
	expectState(t, a.qp, vrdma.QPSRTS)
	// READ and atomics: refused at post (EINVAL), nothing posted.
	buf := a.mr(t, 64, vrdma.AccessAll)
	for _, op := range []vrdma.Opcode{vrdma.OpRDMARead, vrdma.OpAtomicCmpAndSwp, vrdma.OpAtomicFetchAdd} {
		err := a.qp.PostSend([]vrdma.SendWR{{ID: 9, Opcode: op, Flags: vrdma.SendSignaled, SGL: sgl(buf.SGE(0, 8)), RemoteAddr: 0x1000, RKey: 1}})
		var pe *vrdma.PostError
		if !errors.As(err, &pe) || pe.Index != 0 || !errors.Is(err, vrdma.ErrInvalid) {
			t.Fatalf("%s on a UC QP: %v, want a PostError at 0 of class ErrInvalid", op, err)
		}
	}
	expectNoWC(t, a.scq, quiet, "refused posts")
	expectState(t, a.qp, vrdma.QPSRTS)
}

// ucSend posts wr on a (signaled) and checks it completes with success.
// On a lossy path it sends again, up to 50 times, until got reports that
// the message arrived; elsewhere once, and got must hold within
// waitTimeout.
func (s *suite) ucSend(t *testing.T, a *end, wr vrdma.SendWR, op vrdma.WCOpcode, got func(wait time.Duration) bool) {
	t.Helper()
	wr.Flags |= vrdma.SendSignaled
	tries, wait := 1, waitTimeout
	if s.lossy() {
		tries, wait = 50, 200*time.Millisecond
	}
	for i := 0; i < tries; i++ {
		postSend(t, a.qp, wr)
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, wr.ID, vrdma.WCSuccess, op)
		if got(wait) {
			return
		}
	}
	t.Fatalf("%s (wr %d) did not arrive in %d sends", wr.Opcode, wr.ID, tries)
}

// recvWithin returns a completion of cq within d, false if none came.
func recvWithin(t *testing.T, cq *vrdma.CQ, d time.Duration) (vrdma.WorkCompletion, bool) {
	t.Helper()
	wc := make([]vrdma.WorkCompletion, 1)
	for deadline := time.Now().Add(d); ; time.Sleep(time.Millisecond) {
		n, err := cq.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0], true
		}
		if time.Now().After(deadline) {
			return vrdma.WorkCompletion{}, false
		}
	}
}

// ucConnectMethods connects UC QPs through connection management and
// with QP.ConnectTo, which leave out RC's attributes for them, and sends
// a message each way.
func ucConnectMethods(t *testing.T, s *suite) {
	for _, how := range []connMethod{connCM, connOOB} {
		t.Run(how.String(), func(t *testing.T) {
			vms := s.env.OpenVMs(t, 2)
			a, b := newEnd(t, vms[0], ucConfig), newEnd(t, vms[1], ucConfig)
			ctx := opCtx(t)
			if how == connCM {
				s.cmConnect(t, a, b, false)
			} else if err := a.qp.ConnectTo(ctx, b.qp.Endpoint()); err != nil {
				t.Fatal(err)
			} else if err := b.qp.ConnectTo(ctx, a.qp.Endpoint()); err != nil {
				t.Fatal(err)
			}
			s.checkConnected(t, a, b)
			for _, d := range [][2]*end{{a, b}, {b, a}} {
				src, dst := d[0].mr(t, 2000, vrdma.AccessLocalWrite), d[1].mr(t, 2000, vrdma.AccessLocalWrite)
				fill(src.Bytes(), 3)
				postRecv(t, d[1].qp, vrdma.RecvWR{ID: 1, SGL: sgl(dst.SGE(0, 2000))})
				s.ucSend(t, d[0], vrdma.SendWR{ID: 2, Opcode: vrdma.OpSend, SGL: sgl(src.SGE(0, 2000))}, vrdma.WCSend,
					func(wait time.Duration) bool {
						w, ok := recvWithin(t, d[1].rcq, wait)
						if ok {
							expectRecv(t, w, d[1].qp, 1, vrdma.WCRecv, 2000, 0, false)
						}
						return ok
					})
				expectBytes(t, "message", dst.Bytes(), src.Bytes())
			}
		})
	}
}

func ucOpcodes(t *testing.T, s *suite) {
	a, b := s.ucPair(t)
	src := a.mr(t, 16384, vrdma.AccessLocalWrite)
	fill(src.Bytes(), 1)
	dst := b.mr(t, 16384, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
	fill(dst.Bytes(), 2)
	recv := b.mr(t, 4*4096, vrdma.AccessLocalWrite)

	// A SEND with no receive posted: it completes at the sender (it
	// left), and is dropped at the receiver, which stays in RTS.
	postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 100))})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCSuccess, vrdma.WCSend)
	expectNoWC(t, b.rcq, 3*quiet, "a UC SEND with no receive posted")
	expectState(t, b.qp, vrdma.QPSRTS)
	if c := s.qpCounters(t, b); !s.lossy() && (c.RequestsDropped == 0 || c.RNRNaksSent != 0) {
		t.Errorf("responder counters %+v: want a request dropped and no RNR NAK", c)
	}

	for i := range 4 {
		postRecv(t, b.qp, vrdma.RecvWR{ID: uint64(10 + i), SGL: sgl(recv.SGE(i*4096, 4096))})
	}
	recvd := func(id uint64, op vrdma.WCOpcode, n int, imm uint32, withImm bool) func(time.Duration) bool {
		return func(d time.Duration) bool {
			w, ok := recvWithin(t, b.rcq, d)
			if ok {
				expectRecv(t, w, b.qp, id, op, n, imm, withImm)
			}
			return ok
		}
	}
	// SEND of three packets, SEND with immediate of one byte.
	s.ucSend(t, a, vrdma.SendWR{ID: 2, Opcode: vrdma.OpSend, SGL: sgl(src.SGE(0, 3000))}, vrdma.WCSend, recvd(10, vrdma.WCRecv, 3000, 0, false))
	expectBytes(t, "SEND", recv.Bytes()[:3000], src.Bytes()[:3000])
	s.ucSend(t, a, vrdma.SendWR{ID: 3, Opcode: vrdma.OpSendWithImm, Imm: 0x1234, SGL: sgl(src.SGE(5000, 1))}, vrdma.WCSend,
		recvd(11, vrdma.WCRecv, 1, 0x1234, true))
	expectBytes(t, "SEND with immediate", recv.Bytes()[4096:4097], src.Bytes()[5000:5001])
	// RDMA WRITE of five packets; RDMA WRITE with immediate of three.
	s.ucSend(t, a, vrdma.SendWR{ID: 4, Opcode: vrdma.OpRDMAWrite, SGL: sgl(src.SGE(0, 5000)), RemoteAddr: dst.Addr(), RKey: dst.RKey()}, vrdma.WCRDMAWrite,
		func(d time.Duration) bool {
			for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				if string(dst.Bytes()[:5000]) == string(src.Bytes()[:5000]) {
					return true
				}
			}
			return false
		})
	s.ucSend(t, a, vrdma.SendWR{ID: 5, Opcode: vrdma.OpRDMAWriteWithImm, Imm: 0xabcd, SGL: sgl(src.SGE(6000, 2500)), RemoteAddr: dst.Addr() + 8192, RKey: dst.RKey()},
		vrdma.WCRDMAWrite, recvd(12, vrdma.WCRecvRDMAWithImm, 2500, 0xabcd, true))
	expectBytes(t, "WRITE with immediate", dst.Bytes()[8192:8192+2500], src.Bytes()[6000:8500])

	// A WRITE with a bad rkey: completes at the sender, dropped at the
	// receiver (its memory untouched), which stays in RTS.
	before := append([]byte(nil), dst.Bytes()[12000:13000]...)
	postSend(t, a.qp, vrdma.SendWR{ID: 6, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 1000)),
		RemoteAddr: dst.Addr() + 12000, RKey: dst.RKey() ^ 0x100})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 6, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	time.Sleep(3 * quiet)
	expectBytes(t, "memory behind a bad rkey", dst.Bytes()[12000:13000], before)
	expectState(t, b.qp, vrdma.QPSRTS)

	// A SEND larger than the receive at the head: dropped, the receive
	// left posted for the next message, which arrives.
	postSend(t, a.qp, vrdma.SendWR{ID: 7, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 5000))})
	expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 7, vrdma.WCSuccess, vrdma.WCSend)
	expectNoWC(t, b.rcq, 3*quiet, "a UC SEND larger than its receive")
	expectState(t, b.qp, vrdma.QPSRTS)
	s.ucSend(t, a, vrdma.SendWR{ID: 8, Opcode: vrdma.OpSend, SGL: sgl(src.SGE(100, 200))}, vrdma.WCSend, recvd(13, vrdma.WCRecv, 200, 0, false))
	expectBytes(t, "SEND after a dropped one", recv.Bytes()[3*4096:3*4096+200], src.Bytes()[100:300])
}

// ucStream sends 64 messages of 1 to 5 packets, SENDs and WRITEs with
// immediate in turn, without waiting, and checks what arrived: on a
// lossless path every one, on a lossy one those that came through; each
// whole, exact and once.
func ucStream(t *testing.T, s *suite) {
	a, b := s.ucPair(t)
	const n, slot = 64, 8192
	size := func(i int) int { return 1 + i*997%5000 }
	src := a.mr(t, n*slot, vrdma.AccessLocalWrite)
	recv := b.mr(t, n*slot, vrdma.AccessLocalWrite)
	dst := b.mr(t, n*slot, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
	msg := func(i int) []byte {
		m := make([]byte, size(i))
		fill(m, uint64(100+i))
		if len(m) >= 4 {
			binary.LittleEndian.PutUint32(m, uint32(i))
		}
		return m
	}
	for i := range n {
		copy(src.Bytes()[i*slot:], msg(i))
	}
	recvs := make([]vrdma.RecvWR, n)
	for i := range recvs {
		recvs[i] = vrdma.RecvWR{ID: uint64(i), SGL: sgl(recv.SGE(i*slot, slot))}
	}
	postRecv(t, b.qp, recvs...)
	wrs := make([]vrdma.SendWR, n)
	for i := range wrs {
		wrs[i] = vrdma.SendWR{ID: uint64(i), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(i*slot, size(i)))}
		if i%2 == 1 {
			wrs[i].Opcode, wrs[i].Imm, wrs[i].RemoteAddr, wrs[i].RKey = vrdma.OpRDMAWriteWithImm, uint32(i), dst.Addr()+uint64(i*slot), dst.RKey()
		}
	}
	postSend(t, a.qp, wrs...)
	for i, w := range waitWC(t, a.scq, n) {
		op := vrdma.WCSend
		if i%2 == 1 {
			op = vrdma.WCRDMAWrite
		}
		expectWC(t, w, a.qp, uint64(i), vrdma.WCSuccess, op)
	}
	var got []vrdma.WorkCompletion
	if s.lossy() {
		for len(got) < n {
			w, ok := recvWithin(t, b.rcq, 300*time.Millisecond)
			if !ok {
				break
			}
			got = append(got, w)
		}
	} else {
		got = waitWC(t, b.rcq, n)
	}
	seen := map[int]bool{}
	for k, w := range got {
		if w.Status != vrdma.WCSuccess || w.QPNum != b.qp.QPN() || w.WRID != uint64(k) {
			t.Fatalf("receive completion %d: %s, want wr_id %d SUCCESS (receives complete in order)", k, fmtWC(w), k)
		}
		var i int
		var body []byte
		switch w.Opcode {
		case vrdma.WCRecv:
			body = recv.Bytes()[k*slot : k*slot+int(w.ByteLen)]
			if len(body) < 4 {
				i = 0 // only message 0 is shorter than its number
			} else {
				i = int(binary.LittleEndian.Uint32(body))
			}
			if w.Flags&vrdma.WCWithImm != 0 || i%2 != 0 {
				t.Fatalf("receive %s holds message %d, which is no SEND", fmtWC(w), i)
			}
		case vrdma.WCRecvRDMAWithImm:
			i = int(w.Imm)
			if i%2 != 1 || i >= n {
				t.Fatalf("receive %s: immediate %d names no WRITE with immediate", fmtWC(w), i)
			}
			body = dst.Bytes()[i*slot : i*slot+int(w.ByteLen)]
		default:
			t.Fatalf("receive completion %s", fmtWC(w))
		}
		if i < 0 || i >= n || seen[i] {
			t.Fatalf("receive %s: message %d unknown or completed twice", fmtWC(w), i)
		}
		seen[i] = true
		expectBytes(t, fmt.Sprintf("message %d", i), body, msg(i))
	}
	if !s.lossy() && len(seen) != n {
		t.Fatalf("%d of %d messages arrived on a lossless path", len(seen), n)
	}
	if len(seen) == 0 {
		t.Fatalf("none of %d messages arrived", n)
	}
	t.Logf("%d of %d messages arrived whole, %d dropped", len(seen), n, n-len(seen))
}
