// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// classes are the library's error classes, each named for the report.
var classes = []struct {
	name string
	err  error
}{
	{"ErrInvalid", vrdma.ErrInvalid},
	{"ErrNotFound", vrdma.ErrNotFound},
	{"ErrLimit", vrdma.ErrLimit},
	{"ErrState", vrdma.ErrState},
	{"ErrExists", vrdma.ErrExists},
	{"ErrPermission", vrdma.ErrPermission},
	{"ErrUnavailable", vrdma.ErrUnavailable},
	{"ErrRefused", vrdma.ErrRefused},
	{"ErrInternal", vrdma.ErrInternal},
}

// TestErrorClasses runs real operations against an agent, each failing
// in one way — an agent's limit, a stale handle, a busy PD, an illegal
// transition, a taken port, a connect nobody accepts, a peer that is not
// there — and the library's own checks, and checks that errors.Is matches the error to its class
// and to no other, that errors.As finds its *vrdma.Error, and that the
// message is still the one that says what failed. ErrPermission (the
// owner rule, which root passes) and ErrInternal (an agent's bug) have no
// operation here; internal/abi's TestErrorIs covers their mapping.
func TestErrorClasses(t *testing.T) {
	limits := agent.DefaultLimits
	limits.MaxPD = 2 // the vm's pair below takes one
	env := testenv.StartWith(t, testenv.Options{Limits: limits})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v1 := env.Open(t, "vm1", testenv.VMOptions{})
	v2 := env.Open(t, "vm2", testenv.VMOptions{})
	ad := v1.Adapters()[0]
	// A connected pair, for the posts that need a QP past RESET.
	p, err := perf.Connect(ctx, ad, v2.Adapters()[0], perf.PairConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ad.CreateCQ(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := v1.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		op   func() error
		want error
		msg  string // in the message
	}{
		{"agent: max_pd reached", func() error {
			pd, err := ad.AllocPD(ctx) // the second of the VM's two
			if err != nil {
				return fmt.Errorf("the second PD: %v", err)
			}
			defer pd.Dealloc(ctx)
			_, err = ad.AllocPD(ctx)
			return err
		}, vrdma.ErrLimit, "max_pd"},
		{"library: guest memory exhausted", func() error {
			_, err := v1.Alloc(1 << 30)
			return err
		}, vrdma.ErrLimit, "raise memSize"},
		{"library: receive queue full", func() error {
			// Post one receive at a time until the queue has no slot.
			for i := 0; i < 1<<16; i++ {
				if err := p.B.QP.PostRecv([]vrdma.RecvWR{{ID: uint64(i), SGL: []vrdma.SGE{p.B.MR.SGE(0, 64)}}}); err != nil {
					if !errors.Is(err, vrdma.ErrQueueFull) {
						return fmt.Errorf("not ErrQueueFull: %w", err)
					}
					return err
				}
			}
			return nil
		}, vrdma.ErrLimit, "queue full"},
		{"agent: PD deallocated twice (stale handle)", func() error {
			pd, err := p.A.Adapter.AllocPD(ctx)
			if err != nil {
				return fmt.Errorf("a PD: %v", err)
			}
			if err := pd.Dealloc(ctx); err != nil {
				return fmt.Errorf("the first dealloc: %v", err)
			}
			return pd.Dealloc(ctx)
		}, vrdma.ErrNotFound, "PD"},
		{"library: no such adapter", func() error {
			_, err := v1.Adapter("vrdma9")
			return err
		}, vrdma.ErrNotFound, "vrdma9"},
		{"agent: dealloc a PD that holds an MR (EBUSY)", func() error {
			return p.A.PD.Dealloc(ctx)
		}, vrdma.ErrState, "destroy them first"},
		{"agent: RESET to RTS", func() error {
			q, err := p.A.PD.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			if err != nil {
				return fmt.Errorf("a QP: %v", err)
			}
			defer q.Destroy(ctx)
			return q.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSRTS}, vrdma.MaskState)
		}, vrdma.ErrState, "legal transition"},
		{"library: PostSend in RESET", func() error {
			q, err := p.A.PD.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			if err != nil {
				return fmt.Errorf("a QP: %v", err)
			}
			defer q.Destroy(ctx)
			return q.PostSend([]vrdma.SendWR{{Opcode: vrdma.OpSend}})
		}, vrdma.ErrState, "RTS"},
		{"agent: REMOTE_WRITE without LOCAL_WRITE", func() error {
			_, err := p.A.PD.RegMR(ctx, buf, vrdma.AccessRemoteWrite)
			return err
		}, vrdma.ErrInvalid, "LOCAL_WRITE"},
		{"library: CQ of 0 entries", func() error {
			_, err := ad.CreateCQ(ctx, 0)
			return err
		}, vrdma.ErrInvalid, "cqe 0"},
		{"library: too many SGEs in a post", func() error {
			sge := p.A.MR.SGE(0, 8)
			sgl := make([]vrdma.SGE, p.A.QP.Caps().MaxSendSGE+1)
			for i := range sgl {
				sgl[i] = sge
			}
			return p.A.QP.PostSend([]vrdma.SendWR{{Opcode: vrdma.OpSend, SGL: sgl}})
		}, vrdma.ErrInvalid, "max_send_sge"},
		{"agent: listen on a taken port", func() error {
			l, err := ad.Listen(ctx, 7000)
			if err != nil {
				return fmt.Errorf("the first listen: %v", err)
			}
			defer l.Close(ctx)
			_, err = ad.Listen(ctx, 7000)
			return err
		}, vrdma.ErrExists, "7000"},
		{"agent: connect to a port nobody listens on", func() error {
			q, err := p.A.PD.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			if err != nil {
				return fmt.Errorf("a QP: %v", err)
			}
			defer q.Destroy(ctx)
			return q.Connect(ctx, "vm2/vrdma0", 7001)
		}, vrdma.ErrRefused, "7001"},
		{"agent: connect to a VM that is not attached", func() error {
			q, err := p.A.PD.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			if err != nil {
				return fmt.Errorf("a QP: %v", err)
			}
			defer q.Destroy(ctx)
			return q.Connect(ctx, "vm9/vrdma0", 7001)
		}, vrdma.ErrUnavailable, "start its workload"},
		{"agent: open a VM that is not defined", func() error {
			v, err := vrdma.Open(ctx, "vm9", vrdma.WithSocket(env.Socket))
			if err == nil {
				v.Close()
			}
			return err
		}, vrdma.ErrNotFound, "define it first"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.op()
			if err == nil {
				t.Fatal("succeeded; want an error")
			}
			for _, cl := range classes {
				if got, want := errors.Is(err, cl.err), cl.err == c.want; got != want {
					t.Errorf("errors.Is(err, vrdma.%s) = %v, want %v; err: %v", cl.name, got, want, err)
				}
			}
			var e *vrdma.Error
			if !errors.As(err, &e) {
				t.Errorf("errors.As finds no *vrdma.Error in %v", err)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("message %q does not say %q", err, c.msg)
			}
			t.Logf("%v", err)
		})
	}
}
