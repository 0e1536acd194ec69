package vrdma_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

func TestSmoke(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v1 := env.Open(t, "vm1", testenv.VMOptions{})
	v2 := env.Open(t, "vm2", testenv.VMOptions{})
	type side struct {
		pd *vrdma.PD
		cq *vrdma.CQ
		qp *vrdma.QP
		mr *vrdma.MR
	}
	mk := func(v *vrdma.VM) side {
		ad := v.Adapters()[0]
		pd, err := ad.AllocPD(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cq, err := ad.CreateCQ(ctx, 64)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2}})
		if err != nil {
			t.Fatal(err)
		}
		buf, _ := v.Alloc(8192)
		mr, err := pd.RegMR(ctx, buf, vrdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		return side{pd, cq, qp, mr}
	}
	a, b := mk(v1), mk(v2)
	l, err := v2.Adapters()[0].Listen(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err != nil {
			done <- err
			return
		}
		done <- r.Accept(ctx, b.qp)
	}()
	if err := a.qp.Connect(ctx, "vm2/vrdma0", 7); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("path %+v", a.qp.Path())
	copy(a.mr.Bytes(), "hello, rdma")
	if err := b.qp.PostRecv([]vrdma.RecvWR{{ID: 9, SGL: []vrdma.SGE{b.mr.SGE(0, 100)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]vrdma.SendWR{{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.mr.SGE(0, 11)}},
		{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.mr.SGE(0, 11)}, RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]vrdma.WorkCompletion, 8)
	got := 0
	for got < 2 {
		if err := a.cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		n, _ := a.cq.Poll(wc[got:])
		got += n
	}
	t.Logf("%+v", wc[:2])
	n, _ := b.cq.Poll(wc)
	t.Logf("recv %d %+v", n, wc[:n])
	if !bytes.Equal(b.mr.Bytes()[:11], []byte("hello, rdma")) || !bytes.Equal(b.mr.Bytes()[4096:4107], []byte("hello, rdma")) {
		t.Fatalf("data %q %q", b.mr.Bytes()[:11], b.mr.Bytes()[4096:4107])
	}
}
