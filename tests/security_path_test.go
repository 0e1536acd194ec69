// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/testlink"
)

// TestSecurityMemcpyToTCPBound aims a memcpy request at a QP bound to
// the tcp path. The victim's QPs go on the test path (the tcp path's
// requester and responder over the agent's test link); the intruder's,
// on the same host, on memcpy. The victim's QP is connected to the
// intruder's QP number and GID: the state a QP bound to tcp is left in
// when its remote VM's address moves to this host and a local QP gets its
// number. The intruder's WRITE and SEND must not land: the memcpy
// responder serves only QPs bound to memcpy.
func TestSecurityMemcpyToTCPBound(t *testing.T) {
	env := testenv.StartWith(t, testenv.Options{TestLink: &testlink.Faults{}, TestLinkVMs: []string{"victim"}})
	ctx := opCtx(t)
	victim := env.Open(t, "victim", testenv.VMOptions{MemMB: 8})
	intruder := env.Open(t, "intruder", testenv.VMOptions{MemMB: 8})
	p, err := perf.Connect(ctx, intruder.Adapters()[0], victim.Adapters()[0], perf.PairConfig{MTU: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	if got := p.A.QP.Path().Path; got != vrdma.PathMemcpy {
		t.Fatalf("intruder's QP on %s, want memcpy", got)
	}
	if got := p.B.QP.Path().Path; got != abi.PathTest {
		t.Fatalf("victim's QP on %s, want the test path (tcp over the test link)", got)
	}
	a, bb := p.A.MR.Bytes(), p.B.MR.Bytes()
	clear(bb)
	for i := range 256 {
		a[i] = byte(i) | 1
	}
	if err := p.B.QP.PostRecv([]vrdma.RecvWR{{ID: 7, SGL: []vrdma.SGE{p.B.MR.SGE(1024, 1024)}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.A.QP.PostSend([]vrdma.SendWR{
		{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{p.A.MR.SGE(0, 128)}, RemoteAddr: p.B.MR.Addr(), RKey: p.B.MR.RKey()},
		{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{p.A.MR.SGE(128, 128)}},
	}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, p.A.CQ, 2)
	if wc[0].Status == vrdma.WCSuccess || wc[1].Status == vrdma.WCSuccess {
		t.Errorf("the intruder's WRITE and SEND at a QP bound to tcp completed %s and %s, want neither to succeed", wc[0].Status, wc[1].Status)
	}
	if !allZero(bb[:2048]) {
		t.Errorf("the victim's memory was written over the memcpy path: %x…", bb[:16])
	}
	expectNoWC(t, p.B.CQ, 100*time.Millisecond, "the victim's receive queue")
}
