//go:build !race

// The race detector allocates on its own account; this test counts
// allocations, so it runs without it.

package vrdma_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestHotPathAllocs checks that the data path of the library allocates
// nothing: PostSend, PostRecv and Poll, with SGE lists and inline data.
func TestHotPathAllocs(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v1 := env.Open(t, "vm1", testenv.VMOptions{})
	v2 := env.Open(t, "vm2", testenv.VMOptions{})
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{BufSize: 8192, MaxInline: 64})
	if err != nil {
		t.Fatal(err)
	}
	a, b := p.A, p.B
	sends := []vrdma.SendWR{
		{ID: 1, Opcode: vrdma.OpRDMAWrite, SGL: []vrdma.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()},
		{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled | vrdma.SendInline, SGL: []vrdma.SGE{a.MR.SGE(64, 32)}},
	}
	recvs := []vrdma.RecvWR{{ID: 3, SGL: []vrdma.SGE{b.MR.SGE(4096, 64)}}}
	wc := make([]vrdma.WorkCompletion, 8)
	waitOne := func(cq *vrdma.CQ) {
		for {
			n, err := cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				if wc[0].Status != vrdma.WCSuccess {
					t.Fatalf("completion %+v", wc[0])
				}
				return
			}
			runtime.Gosched() // the agent runs in this process
		}
	}
	allocs := testing.AllocsPerRun(200, func() {
		if err := b.QP.PostRecv(recvs); err != nil {
			t.Fatal(err)
		}
		if err := a.QP.PostSend(sends); err != nil {
			t.Fatal(err)
		}
		waitOne(a.CQ)
		waitOne(b.CQ)
	})
	if allocs != 0 {
		t.Fatalf("PostRecv+PostSend+Poll allocate %.1f times per round; the data path must not allocate", allocs)
	}
}
