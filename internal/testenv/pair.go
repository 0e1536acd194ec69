// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
)

// Pair is two connected QPs of two VMs of an in-process agent, each with
// a CQ and a registered 64 KiB buffer: the smallest traffic a test checks
// a path with.
type Pair struct {
	AVM, BVM *vrdma.VM
	A, B     *vrdma.QP
	ACQ, BCQ *vrdma.CQ
	Src, Dst *vrdma.MR
	Name     string
	nextWRID uint64
}

// NewPair opens VMs name-a and name-b on e and connects a QP of each
// (ConnectTo: the usual RC defaults).
func (e *Env) NewPair(t testing.TB, name string) *Pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	p := &Pair{Name: name}
	end := func(vm string) (*vrdma.VM, *vrdma.QP, *vrdma.CQ, *vrdma.MR) {
		v := e.Open(t, vm, VMOptions{})
		ad := v.Adapters()[0]
		pd, err := ad.AllocPD(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cq, err := ad.CreateCQ(ctx, 64)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq,
			Caps: vrdma.QPCaps{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		buf, err := v.Alloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(ctx, buf, vrdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		return v, qp, cq, mr
	}
	p.AVM, p.A, p.ACQ, p.Src = end(name + "-a")
	p.BVM, p.B, p.BCQ, p.Dst = end(name + "-b")
	if err := p.A.ConnectTo(ctx, p.B.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := p.B.ConnectTo(ctx, p.A.Endpoint()); err != nil {
		t.Fatal(err)
	}
	return p
}

// NewQP creates an RC QP on adapter ad, in RESET, with a PD and a CQ of
// its own: a QP to connect or move, not to carry traffic (8 work
// requests each way).
func NewQP(t testing.TB, ad *vrdma.Adapter) *vrdma.QP {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	pd, err := ad.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ad.CreateCQ(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: cq, RecvCQ: cq, Caps: vrdma.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// Write RDMA-WRITEs n bytes (at most 64 KiB) of fresh data from A to B
// and checks that it completes successfully, within 10 s, and lands.
func (p *Pair) Write(t testing.TB, n int, fill byte) {
	t.Helper()
	p.move(t, vrdma.OpRDMAWrite, n, fill)
}

// Read RDMA-READs n bytes (at most 64 KiB) of fresh data of B into A and
// checks that it completes successfully, within 10 s, and lands.
func (p *Pair) Read(t testing.TB, n int, fill byte) {
	t.Helper()
	p.move(t, vrdma.OpRDMARead, n, fill)
}

// move runs one WRITE or READ of n bytes between A's Src and B's Dst.
func (p *Pair) move(t testing.TB, op vrdma.Opcode, n int, fill byte) {
	t.Helper()
	from, to := p.Src.Bytes()[:n], p.Dst.Bytes()[:n]
	if op == vrdma.OpRDMARead {
		from, to = to, from
	}
	for i := range from {
		from[i] = fill + byte(i)
	}
	p.nextWRID++
	if err := p.A.PostSend([]vrdma.SendWR{{ID: p.nextWRID, Opcode: op, Flags: vrdma.SendSignaled,
		SGL: []vrdma.SGE{p.Src.SGE(0, n)}, RemoteAddr: p.Dst.Addr(), RKey: p.Dst.RKey()}}); err != nil {
		t.Fatalf("%s: post a %s: %v", p.Name, op, err)
	}
	wc := make([]vrdma.WorkCompletion, 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		k, err := p.ACQ.Poll(wc)
		if err != nil {
			t.Fatalf("%s: poll: %v", p.Name, err)
		}
		if k == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the %s did not complete within 10 s", p.Name, op)
		}
	}
	if wc[0].WRID != p.nextWRID || wc[0].Status != vrdma.WCSuccess {
		t.Fatalf("%s: %s %d completed as WR %d with %s, want success", p.Name, op, p.nextWRID, wc[0].WRID, wc[0].Status)
	}
	if !bytes.Equal(to, from) {
		t.Fatalf("%s: the %s completed but its bytes did not land", p.Name, op)
	}
}

// Status returns the in-process agent's status report, as vrdmactl status
// reads it.
func (e *Env) Status(t testing.TB) vrdma.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(e.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ErrorsWith returns the errors the in-process agent logged that contain
// sub.
func (e *Env) ErrorsWith(sub string) []string {
	var out []string
	for _, l := range e.Logs(slog.LevelError) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}
