// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestMcastGoLibrary drives multicast through the Go library on one host:
// JoinMulticast's MULTICAST_JOIN carries the group's GID (IPv4-mapped),
// QPN 0xFFFFFF and RDMA_UDP_QKEY; a SEND from vmS to the group reaches
// both of vmR's attached QPs; once one detaches (DetachMcast) only the
// other receives.
func TestMcastGoLibrary(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	vs := env.Open(t, "mcS", testenv.VMOptions{MemMB: 8})
	vr := env.Open(t, "mcR", testenv.VMOptions{MemMB: 8})

	ch, err := vr.OpenEventChannel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close(ctx)
	cookie, err := ch.JoinMulticast(ctx, "239.5.6.7", "")
	if err != nil {
		t.Fatal(err)
	}
	ev, err := ch.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	group := vrdma.GID(netip.MustParseAddr("::ffff:239.5.6.7").As16())
	if ev.Type != vrdma.CMMulticastJoin || ev.Cookie != cookie || ev.RemoteGID != group || ev.RemoteQPN != vrdma.MulticastQPN || ev.QKey != vrdma.UDPQKey {
		t.Fatalf("join event %+v: want MULTICAST_JOIN, cookie %d, group %s, QPN 0xffffff, Q_Key 0x%x", ev, cookie, group, vrdma.UDPQKey)
	}
	if _, err := ch.JoinMulticast(ctx, "10.1.2.3", ""); err == nil {
		t.Errorf("joining a unicast address succeeded")
	}

	type end struct {
		pd *vrdma.PD
		qp *vrdma.QP
		cq *vrdma.CQ
		mr *vrdma.MR
	}
	open := func(vm *vrdma.VM) end {
		ad := vm.Adapters()[0]
		pd, err := ad.AllocPD(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cq, err := ad.CreateCQ(ctx, 16)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{Type: vrdma.QPTypeUD, SendCQ: cq, RecvCQ: cq,
			Caps: vrdma.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.ReadyUD(ctx, vrdma.UDPQKey); err != nil {
			t.Fatal(err)
		}
		buf, err := vm.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(ctx, buf, vrdma.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return end{pd, qp, cq, mr}
	}
	s, r1, r2 := open(vs), open(vr), open(vr)
	for _, r := range []end{r1, r2} {
		if err := r.qp.AttachMcast(ctx, group); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := s.pd.CreateAH(ctx, vrdma.AHAttr{DGID: group})
	if err != nil {
		t.Fatal(err)
	}
	wc := make([]vrdma.WorkCompletion, 1)
	// send posts a receive on each receiver, sends one datagram to the
	// group and reports which receivers got it: on one host the memcpy
	// path delivers before the SEND completes.
	send := func() (got1, got2 bool) {
		t.Helper()
		for _, r := range []end{r1, r2} {
			if err := r.qp.PostRecv([]vrdma.RecvWR{{ID: 1, SGL: []vrdma.SGE{r.mr.SGE(0, vrdma.GRHSize+64)}}}); err != nil {
				t.Fatal(err)
			}
		}
		wr := vrdma.SendWR{ID: 9, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{s.mr.SGE(0, 64)},
			AH: ah, RemoteQPN: vrdma.MulticastQPN, RemoteQKey: vrdma.UDPQKey}
		if err := s.qp.PostSend([]vrdma.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		if err := s.cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if k, err := s.cq.Poll(wc); k != 1 || err != nil || wc[0].Status != vrdma.WCSuccess {
			t.Fatalf("send: %d %v %+v", k, err, wc[0])
		}
		received := func(r end) bool {
			k, err := r.cq.Poll(wc)
			return err == nil && k == 1 && wc[0].Status == vrdma.WCSuccess && wc[0].SrcQP == s.qp.QPN()
		}
		return received(r1), received(r2)
	}
	if g1, g2 := send(); !g1 || !g2 {
		t.Fatalf("members received %v, %v: want both", g1, g2)
	}
	if err := r2.qp.DetachMcast(ctx, group); err != nil {
		t.Fatal(err)
	}
	if g1, g2 := send(); !g1 || g2 {
		t.Fatalf("after r2 detached: r1 %v, r2 %v; want r1 only", g1, g2)
	}
	if err := r2.qp.DetachMcast(ctx, group); err == nil {
		t.Errorf("detaching a QP twice succeeded")
	}
}
