// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestMiddlewareUDHostile: a workload that speaks the protocol by hand
// gets errors, never a crash, for address handles it should not make
// (another's PD, no GID, a GID of nothing, a GID index, flow label or
// port that does not exist) or destroy (handles of nothing, of another
// object, twice); and the completion statuses hardware gives for UD
// WQEs written by hand: LOC_QP_OP_ERR for an opcode UD does not carry,
// an address handle that is not one (a made-up handle, a PD's, one
// destroyed), LOC_LEN_ERR for a datagram beyond the MTU. Datagrams to a
// QPN that is not a UD QP of the destination adapter, or with another
// Q_Key, complete SUCCESS and are dropped there, counted; the target
// then still takes a good one, byte for byte.
func TestMiddlewareUDHostile(t *testing.T) {
	env := testenv.Start(t)
	tg := newUDEnd(t, env.Open(t, "udtarget", testenv.VMOptions{}), 8, 1024)
	tg.post(t, 0, 8)
	gid := tg.ad.GID()
	env.Define(t, "hostile", testenv.VMOptions{MemMB: 4})
	h := lcAttachHostile(t, env.Socket, "hostile")

	for _, c := range []struct {
		what string
		req  abi.CreateAH
		code string
	}{
		{"a PD that does not exist", abi.CreateAH{PD: 0xdead, DGID: gid}, abi.CodeNotFound},
		{"no GID", abi.CreateAH{PD: h.pd}, abi.CodeInvalid},
		{"a GID of nothing", abi.CreateAH{PD: h.pd, DGID: abi.GID{0xfe, 0x80, 15: 1}}, abi.CodeUnavailable},
		{"GID index 1", abi.CreateAH{PD: h.pd, DGID: gid, SGIDIndex: 1}, abi.CodeInvalid},
		{"a 21-bit flow label", abi.CreateAH{PD: h.pd, DGID: gid, FlowLabel: 1 << 20}, abi.CodeInvalid},
		{"port 2", abi.CreateAH{PD: h.pd, DGID: gid, Port: 2}, abi.CodeInvalid},
	} {
		if _, e := h.r.call(abi.OpCreateAH, &c.req, nil); e == nil || e.Code != c.code {
			t.Errorf("create-ah with %s: %v, want %s", c.what, e, c.code)
		}
	}
	var ah, gone abi.CreateAHReply
	h.r.must(abi.OpCreateAH, &abi.CreateAH{PD: h.pd, DGID: gid}, &ah)
	h.r.must(abi.OpCreateAH, &abi.CreateAH{PD: h.pd, DGID: gid}, &gone)
	h.r.must(abi.OpDestroyAH, &abi.Handle{Handle: gone.Handle}, nil)
	for _, hd := range []uint32{0, h.pd, 0xffffffff, gone.Handle} {
		if _, e := h.r.call(abi.OpDestroyAH, &abi.Handle{Handle: hd}, nil); e == nil || e.Code != abi.CodeNotFound {
			t.Errorf("destroy-ah of handle %d, no address handle: %v, want not-found", hd, e)
		}
	}
	if _, e := h.r.call(abi.OpDeallocPD, &abi.Handle{Handle: h.pd}, nil); e == nil || e.Code != abi.CodeState {
		t.Errorf("dealloc-pd of a PD with an address handle: %v, want bad-state", e)
	}

	cq := h.newCQ(64)
	q := h.newUDQP(cq)
	ready := func() {
		t.Helper()
		q.modify(abi.MaskState, abi.QPAttr{State: abi.QPSReset})
		q.modify(abi.MaskState|abi.MaskPKeyIndex|abi.MaskPort|abi.MaskQKey, abi.QPAttr{State: abi.QPSInit, Port: 1, QKey: udQKey})
		q.modify(abi.MaskState, abi.QPAttr{State: abi.QPSRTR})
		q.modify(abi.MaskState|abi.MaskSQPSN, abi.QPAttr{State: abi.QPSRTS})
	}
	ready()
	send := func(id uint64, op abi.Opcode, ahh, qpn, qkey uint32, n uint32) abi.CQE {
		t.Helper()
		w := abi.SendWQE{WRID: id, Opcode: op, Flags: abi.SendSignaled, NumSGE: 1,
			SGE: [abi.MaxSGE]abi.SGE{{Addr: lcMRAddr, Length: n, LKey: h.mr.LKey}}}
		abi.SetUDDest(&w, ahh, qpn, qkey)
		q.post(lcSend(w, nil))
		e := cq.next(t)
		if e.WRID != id {
			t.Fatalf("completion %+v, want WR %d", e, id)
		}
		return e
	}
	for _, c := range []struct {
		what  string
		op    abi.Opcode
		ah    uint32
		n     uint32
		want  abi.WCStatus
		errOK bool
	}{
		{"an RDMA WRITE", abi.OpRDMAWrite, ah.Handle, 8, abi.WCLocQPOpErr, true},
		{"an atomic", abi.OpAtomicFetchAdd, ah.Handle, 8, abi.WCLocQPOpErr, true},
		{"a made-up address handle", abi.OpSend, 0x5eed, 8, abi.WCLocQPOpErr, true},
		{"the PD's handle as address handle", abi.OpSend, h.pd, 8, abi.WCLocQPOpErr, true},
		{"a destroyed address handle", abi.OpSend, gone.Handle, 8, abi.WCLocQPOpErr, true},
		{"a datagram beyond the MTU", abi.OpSend, ah.Handle, 1025, abi.WCLocLenErr, true},
	} {
		if e := send(1, c.op, c.ah, tg.qp.QPN(), udQKey, c.n); e.Status != c.want {
			t.Errorf("%s: %+v, want %s", c.what, e, c.want)
		}
		q.waitState(t, abi.QPSErr)
		ready()
	}
	suite := &suite{env: &memcpyEnv{env: env}}
	before := suite.qpCounters(t, tg.end).RequestsDropped
	for _, c := range []struct {
		what      string
		qpn, qkey uint32
	}{
		{"another Q_Key", tg.qp.QPN(), udQKey + 1},
		{"QPN 0", 0, udQKey},
		{"QPN 1", 1, udQKey},
		{"QPN 0xffffff", 0xffffff, udQKey},
		{"the sender's own QPN (not on the destination adapter)", q.qpn, udQKey},
	} {
		if e := send(2, abi.OpSend, ah.Handle, c.qpn, c.qkey, 8); e.Status != abi.WCSuccess {
			t.Errorf("a datagram to %s: %+v, want SUCCESS (UD drops it at the destination)", c.what, e)
		}
	}
	expectNoWC(t, tg.rcq, 3*quiet, "datagrams with another Q_Key or QPN")
	if after := suite.qpCounters(t, tg.end).RequestsDropped; after == before {
		t.Errorf("the target counted no dropped datagram (%d before, %d after)", before, after)
	}
	if st, err := suite.agentOf(t, tg.end).Status(t.Context()); err != nil || st.DatagramsDropped < 5 {
		t.Errorf("the host's datagrams_dropped: %d (%v), want at least the 5 dropped", st.DatagramsDropped, err)
	}
	copy(h.mem.Bytes()[lcMRAddr:], "a good datagram!")
	if e := send(3, abi.OpSend, ah.Handle, tg.qp.QPN(), udQKey, 16); e.Status != abi.WCSuccess {
		t.Fatalf("a good datagram: %+v", e)
	}
	w := waitWC(t, tg.rcq, 1)[0]
	if w.Status != vrdma.WCSuccess || w.ByteLen != vrdma.GRHSize+16 || w.SrcQP != q.qpn {
		t.Fatalf("the good datagram: %s", fmtWC(w))
	}
	expectBytes(t, "the good datagram", tg.buf.Bytes()[int(w.WRID)*tg.slot+vrdma.GRHSize:][:16], []byte("a good datagram!"))
}

// newUDQP makes a UD QP of the hostile VM, both queues on cq.
func (h *lcHostile) newUDQP(cq *lcRawCQ) *lcRawQP {
	h.t.Helper()
	var rep abi.CreateQPReply
	fds := h.r.must(abi.OpCreateQP, &abi.CreateQP{PD: h.pd, SendCQ: cq.handle, RecvCQ: cq.handle, Type: abi.QPTypeUD, SQSigAll: true,
		Caps: abi.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2}}, &rep)
	q := &lcRawQP{h: h, handle: rep.Handle, qpn: rep.QPN, caps: rep.Caps, layout: rep.Layout, fd: fds[0]}
	var err error
	if q.ring, err = sys.Map(fds[0], int(rep.Layout.Size), false); err != nil {
		h.t.Fatal(err)
	}
	if q.db, err = sys.BellFrom(fds[1]); err != nil {
		h.t.Fatal(err)
	}
	h.undo = append(h.undo, func() {
		q.ring.Unmap()
		q.db.Close()
		sys.CloseFD(q.fd)
	})
	return q
}
