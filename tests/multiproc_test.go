// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestLifecycleSeveralWorkloads checks that several workloads may attach
// one VM at once, as processes open one device: each has its own context
// (objects, guest memory) behind the same adapters; QPs of two of them
// connect and move data; the VM's memSize bounds their memory regions
// together; status lists both; when one leaves, only the QPs facing its
// QPs flush, and the VM stays published until the last one leaves; a VM
// whose memory is reserved and locked stays one workload at a time.
func TestLifecycleSeveralWorkloads(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	a := env.Open(t, "multi", testenv.VMOptions{MemMB: 4})
	b, err := vrdma.Open(ctx, "multi", vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatalf("second workload of VM multi: %v", err)
	}
	bClosed := false
	defer func() {
		if !bClosed {
			b.Close()
		}
	}()
	other := env.Open(t, "other", testenv.VMOptions{MemMB: 4})
	aa, ba := a.Adapters()[0], b.Adapters()[0]
	if aa.GID() != ba.GID() || aa.MAC().String() != ba.MAC().String() || aa.Name() != ba.Name() {
		t.Fatalf("workloads of one VM see different adapters: %s %s %s and %s %s %s", aa.Name(), aa.GID(), aa.MAC(), ba.Name(), ba.GID(), ba.MAC())
	}

	// a's QP faces b's; b has another facing VM other.
	s := &suite{env: &memcpyEnv{env: env}}
	ea, eb := newEnd(t, a, qpConfig{}), newEnd(t, b, qpConfig{})
	s.connect(t, ea, eb, connCM)
	eb2, eo := newEnd(t, b, qpConfig{}), newEnd(t, other, qpConfig{})
	s.connect(t, eb2, eo, connOOB)
	if ea.qp.QPN() == eb.qp.QPN() {
		t.Fatalf("two workloads' QPs share QPN 0x%x", ea.qp.QPN())
	}
	src, dst := ea.mr(t, 4096, vrdma.AccessLocalWrite), eb.mr(t, 4096, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i * 7)
	}
	postSend(t, ea.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 4096)), RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	if w := waitWC(t, ea.scq, 1)[0]; w.Status != vrdma.WCSuccess {
		t.Fatalf("write between two workloads of one VM: %v", w.Status)
	}
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("write between two workloads of one VM: the target's bytes differ")
	}

	// memSize (4 MiB) covers both workloads' regions: a holds 2 MiB and
	// the two small ones hold 8 KiB, so b's 2 MiB more is refused.
	big := ea.mr(t, 2<<20, vrdma.AccessLocalWrite)
	buf, err := b.Alloc(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	_, err = eb.pd.RegMR(ctx, buf, vrdma.AccessLocalWrite)
	var e *vrdma.Error
	if !errors.As(err, &e) || e.Code != "limit-exceeded" {
		t.Fatalf("region that takes the VM's workloads over memSize: %v, want limit-exceeded", err)
	}
	if err := big.Dereg(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := eb.pd.RegMR(ctx, buf, vrdma.AccessLocalWrite); err != nil {
		t.Fatalf("the same region once a's is deregistered: %v", err)
	}

	st := statusAt(t, "agent", env.Socket)
	n := 0
	for _, v := range st.VMs {
		if v.Name != "multi" {
			continue
		}
		n++
		if len(v.Processes) != 2 || v.MemRegistered < 2<<20 || len(v.QPs) != 3 {
			t.Errorf("status of VM multi: processes %v, %d bytes registered, %d QPs; want 2 processes, at least 2 MiB, 3 QPs", v.Processes, v.MemRegistered, len(v.QPs))
		}
	}
	if n != 1 {
		t.Errorf("status lists VM multi %d times, want once", n)
	}

	// a leaves: b's QP facing a flushes, b's QP facing other does not.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitState(t, eb.qp, vrdma.QPSErr)
	src2, dst2 := eb2.mr(t, 64, vrdma.AccessLocalWrite), eo.mr(t, 64, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
	copy(src2.Bytes(), "still connected after another workload of the VM left")
	postSend(t, eb2.qp, vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src2.SGE(0, 64)), RemoteAddr: dst2.Addr(), RKey: dst2.RKey()})
	if w := waitWC(t, eb2.scq, 1)[0]; w.Status != vrdma.WCSuccess || !bytes.Equal(src2.Bytes(), dst2.Bytes()) {
		t.Fatalf("b's QP to VM other after a left: %v", w.Status)
	}
	// The VM is still attached (b), so a third workload joins it.
	c, err := vrdma.Open(ctx, "multi", vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatalf("third workload while b holds the VM: %v", err)
	}
	c.Close()
	if st := eo.qp.State(); st != vrdma.QPSRTS {
		t.Fatalf("other's QP is in %s after two of VM multi's workloads left, one staying", st)
	}
	bClosed = true
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitState(t, eo.qp, vrdma.QPSErr)

	env.Define(t, "pinned", testenv.VMOptions{MemMB: 4, Locked: true})
	p, err := vrdma.Open(ctx, "pinned", vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Skipf("cannot lock 4 MiB here (RLIMIT_MEMLOCK): %v", err)
	}
	defer p.Close()
	_, err = vrdma.Open(ctx, "pinned", vrdma.WithSocket(env.Socket))
	if !errors.As(err, &e) || e.Code != "already-exists" {
		t.Fatalf("second workload of a VM with reserved, locked memory: %v, want already-exists", err)
	}
}

// waitState waits until q reaches state want.
func waitState(t *testing.T, q *vrdma.QP, want vrdma.QPState) {
	t.Helper()
	for deadline := time.Now().Add(waitTimeout); q.State() != want; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("QP 0x%x is in %s after %v, want %s", q.QPN(), q.State(), waitTimeout, want)
		}
	}
}
