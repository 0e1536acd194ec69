// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// XRC on every path (the conformance case "xrc"): an XRC initiator QP in
// one VM sends to the XRC SRQs of a domain in another VM through one XRC
// target QP, each message to the SRQ it names; RDMA operations through the
// target QP are checked against the named SRQ's PD; hostile SRQ numbers
// (another domain's, another VM's, a destroyed SRQ's, a closed domain's)
// are invalid requests. TestXRCDomainShared: the processes of one VM share
// a domain through a file.

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// xrcTarget is the receiving VM's side: a PD, an XRC domain, two XRC SRQs
// each with its own CQ, one target QP, and receive buffers (slot i of
// srqSlot bytes).
type xrcTarget struct {
	vm   *vrdma.VM
	ad   *vrdma.Adapter
	pd   *vrdma.PD
	xrcd *vrdma.XRCD
	srqs [2]*vrdma.SRQ
	cqs  [2]*vrdma.CQ
	tgt  *vrdma.QP
	buf  *vrdma.MR
}

// newXRCTarget makes the receiving side in vm's first adapter, in a
// private domain.
func newXRCTarget(t *testing.T, vm *vrdma.VM) *xrcTarget {
	t.Helper()
	ctx := opCtx(t)
	xrcd, err := vm.Adapters()[0].OpenXRCD(ctx, nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	x := newXRCSRQs(t, vm, xrcd)
	if x.tgt, err = x.xrcd.CreateTargetQP(ctx); err != nil {
		t.Fatal(err)
	}
	return x
}

// newXRCSRQs makes the receiving side's SRQs, CQs and buffers in vm's
// first adapter, in domain xrcd, without a target QP.
func newXRCSRQs(t *testing.T, vm *vrdma.VM, xrcd *vrdma.XRCD) *xrcTarget {
	t.Helper()
	ctx := opCtx(t)
	x := &xrcTarget{vm: vm, ad: vm.Adapters()[0], xrcd: xrcd}
	var err error
	if x.pd, err = x.ad.AllocPD(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range x.srqs {
		if x.cqs[i], err = x.ad.CreateCQ(ctx, 64); err != nil {
			t.Fatal(err)
		}
		if x.srqs[i], err = x.pd.CreateXRCSRQ(ctx, x.xrcd, x.cqs[i], vrdma.SRQAttr{MaxWR: 16, MaxSGE: 1}); err != nil {
			t.Fatal(err)
		}
		if n := x.srqs[i].Num(); n == 0 || n > 0xffffff {
			t.Fatalf("XRC SRQ number 0x%x", n)
		}
	}
	if x.srqs[0].Num() == x.srqs[1].Num() {
		t.Fatalf("two XRC SRQs of one domain have number 0x%x", x.srqs[0].Num())
	}
	buf, err := vm.Alloc(32 * srqSlot)
	if err != nil {
		t.Fatal(err)
	}
	if x.buf, err = x.pd.RegMR(ctx, buf, vrdma.AccessAll); err != nil {
		t.Fatal(err)
	}
	return x
}

// post posts receives [from, to) to SRQ i, receive k into slot k.
func (x *xrcTarget) post(t *testing.T, i, from, to int) {
	t.Helper()
	for k := from; k < to; k++ {
		if err := x.srqs[i].PostRecv([]vrdma.RecvWR{{ID: uint64(k), SGL: sgl(x.buf.SGE(k*srqSlot, srqSlot))}}); err != nil {
			t.Fatal(err)
		}
	}
}

func (x *xrcTarget) slot(k int) []byte { return x.buf.Bytes()[k*srqSlot : (k+1)*srqSlot] }

// xrcPair opens two VMs: an XRC initiator QP in the first connected to
// the target QP of an xrcTarget in the second.
func (s *suite) xrcPair(t *testing.T) (*end, *xrcTarget) {
	t.Helper()
	vms := s.env.OpenVMs(t, 2)
	a := newEnd(t, vms[0], qpConfig{typ: vrdma.QPTypeXRCSend, caps: vrdma.QPCaps{MaxSendWR: 64, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
	x := newXRCTarget(t, vms[1])
	b := &end{vm: x.vm, ad: x.ad, pd: x.pd, qp: x.tgt}
	s.connect(t, a, b, connOOB)
	return a, x
}

func testXRC(t *testing.T, s *suite) {
	t.Run("routed", func(t *testing.T) {
		a, x := s.xrcPair(t)
		x.post(t, 0, 0, 4)
		x.post(t, 1, 4, 8)
		src := a.mr(t, 4*64, vrdma.AccessAll)
		fill(src.Bytes(), 11)
		// Messages k = 0..3 alternate between the SRQs: even ones to
		// SRQ 0, odd ones to SRQ 1; one of each with immediate data.
		for k := range 4 {
			wr := vrdma.SendWR{ID: uint64(k), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(k*64, 64)), XRCSRQN: x.srqs[k%2].Num()}
			if k >= 2 {
				wr.Opcode, wr.Imm = vrdma.OpSendWithImm, uint32(0xa0+k)
			}
			postSend(t, a.qp, wr)
		}
		for k, w := range waitWC(t, a.scq, 4) {
			expectWC(t, w, a.qp, uint64(k), vrdma.WCSuccess, vrdma.WCSend)
		}
		for i := range 2 {
			ws := waitWC(t, x.cqs[i], 2)
			for j, w := range ws {
				k := i + 2*j    // the message
				slot := 4*i + j // the receive it took: SRQ i's j-th
				expectRecv(t, w, x.tgt, uint64(slot), vrdma.WCRecv, 64, uint32(0xa0+k), k >= 2)
				expectBytes(t, "message", x.slot(slot)[:64], src.Bytes()[k*64:(k+1)*64])
			}
		}
		// A WRITE with immediate takes its receive from the SRQ it names.
		dst := x.buf
		postSend(t, a.qp, vrdma.SendWR{ID: 9, Opcode: vrdma.OpRDMAWriteWithImm, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 32)),
			RemoteAddr: off(dst, 15*srqSlot), RKey: dst.RKey(), Imm: 0xfeed, XRCSRQN: x.srqs[1].Num()})
		expectWC(t, waitWC(t, a.scq, 1)[0], a.qp, 9, vrdma.WCSuccess, vrdma.WCRDMAWrite)
		expectRecv(t, waitWC(t, x.cqs[1], 1)[0], x.tgt, 6, vrdma.WCRecvRDMAWithImm, 32, 0xfeed, true)
		expectBytes(t, "written", x.slot(15)[:32], src.Bytes()[:32])
		expectNoWC(t, x.cqs[0], quiet, "the other SRQ's CQ")
	})

	t.Run("rdma", func(t *testing.T) {
		a, x := s.xrcPair(t)
		loc := a.mr(t, 4096, vrdma.AccessAll)
		fill(loc.Bytes()[:1024], 21)
		n := x.srqs[0].Num()
		postSend(t, a.qp,
			vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(loc.SGE(0, 1024)), RemoteAddr: off(x.buf, 0), RKey: x.buf.RKey(), XRCSRQN: n},
			vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(loc.SGE(2048, 1024)), RemoteAddr: off(x.buf, 0), RKey: x.buf.RKey(), XRCSRQN: n})
		put64(x.slot(8), 40)
		postSend(t, a.qp,
			vrdma.SendWR{ID: 3, Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled, SGL: sgl(loc.SGE(1024, 8)), RemoteAddr: off(x.buf, 8*srqSlot), RKey: x.buf.RKey(), CompareAdd: 2, XRCSRQN: n},
			vrdma.SendWR{ID: 4, Opcode: vrdma.OpAtomicCmpAndSwp, Flags: vrdma.SendSignaled, SGL: sgl(loc.SGE(1032, 8)), RemoteAddr: off(x.buf, 8*srqSlot), RKey: x.buf.RKey(), CompareAdd: 42, Swap: 7, XRCSRQN: x.srqs[1].Num()})
		ws := waitWC(t, a.scq, 4)
		for i, op := range []vrdma.WCOpcode{vrdma.WCRDMAWrite, vrdma.WCRDMARead, vrdma.WCFetchAdd, vrdma.WCCompSwap} {
			expectWC(t, ws[i], a.qp, uint64(i+1), vrdma.WCSuccess, op)
		}
		expectBytes(t, "written", x.buf.Bytes()[:1024], loc.Bytes()[:1024])
		expectBytes(t, "read back", loc.Bytes()[2048:3072], loc.Bytes()[:1024])
		if old, cas, now := le64(loc.Bytes()[1024:]), le64(loc.Bytes()[1032:]), le64(x.slot(8)); old != 40 || cas != 42 || now != 7 {
			t.Fatalf("FETCH_ADD returned %d, CMP_SWAP %d, the word is %d; want 40, 42, 7", old, cas, now)
		}
	})

	t.Run("other-pd", func(t *testing.T) {
		// The target QP checks an RDMA WRITE against the PD of the SRQ
		// the request names: a region of another PD is a remote access
		// error, and nothing is written.
		a, x := s.xrcPair(t)
		ctx := opCtx(t)
		pd2, err := x.ad.AllocPD(ctx)
		if err != nil {
			t.Fatal(err)
		}
		buf, err := x.vm.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		other, err := pd2.RegMR(ctx, buf, vrdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		loc := a.mr(t, 64, vrdma.AccessAll)
		fill(loc.Bytes(), 5)
		postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(loc.SGE(0, 64)),
			RemoteAddr: off(other, 0), RKey: other.RKey(), XRCSRQN: x.srqs[0].Num()})
		s.expectNAK(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCRemAccessErr)
		expectBytes(t, "region of another PD", other.Bytes()[:64], make([]byte, 64))
	})

	hostile := func(t *testing.T, what string, srqn func(t *testing.T, a *end, x *xrcTarget) uint32) {
		a, x := s.xrcPair(t)
		x.post(t, 0, 0, 2)
		x.post(t, 1, 2, 4)
		n := srqn(t, a, x)
		loc := a.mr(t, 64, vrdma.AccessAll)
		postSend(t, a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(loc.SGE(0, 64)), XRCSRQN: n})
		s.expectNAK(t, waitWC(t, a.scq, 1)[0], a.qp, 1, vrdma.WCRemInvReqErr)
		for i := range x.cqs {
			expectNoWC(t, x.cqs[i], quiet, what+": the domain's SRQs")
		}
		if info, err := x.tgt.Query(opCtx(t)); err != nil || info.Attr.State != vrdma.QPSErr {
			t.Fatalf("target QP after an invalid request: %+v, %v; want ERR", info.Attr.State, err)
		}
	}
	t.Run("other-domain", func(t *testing.T) {
		hostile(t, "another domain's SRQ", func(t *testing.T, _ *end, x *xrcTarget) uint32 {
			ctx := opCtx(t)
			x2, err := x.ad.OpenXRCD(ctx, nil, false, false)
			if err != nil {
				t.Fatal(err)
			}
			cq, err := x.ad.CreateCQ(ctx, 16)
			if err != nil {
				t.Fatal(err)
			}
			srq, err := x.pd.CreateXRCSRQ(ctx, x2, cq, vrdma.SRQAttr{MaxWR: 4, MaxSGE: 1})
			if err != nil {
				t.Fatal(err)
			}
			if err := srq.PostRecv([]vrdma.RecvWR{{ID: 99, SGL: sgl(x.buf.SGE(31*srqSlot, srqSlot))}}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { expectNoWC(t, cq, 0, "the other domain's SRQ") })
			return srq.Num()
		})
	})
	t.Run("other-vm", func(t *testing.T) {
		hostile(t, "another VM's SRQ", func(t *testing.T, a *end, _ *xrcTarget) uint32 {
			// A domain of the sending VM: a number valid there only.
			other := newXRCTarget(t, a.vm)
			other.post(t, 0, 0, 1)
			return other.srqs[0].Num()
		})
	})
	t.Run("destroyed", func(t *testing.T) {
		hostile(t, "a destroyed SRQ", func(t *testing.T, _ *end, x *xrcTarget) uint32 {
			ctx := opCtx(t)
			srq, err := x.pd.CreateXRCSRQ(ctx, x.xrcd, x.cqs[0], vrdma.SRQAttr{MaxWR: 4, MaxSGE: 1})
			if err != nil {
				t.Fatal(err)
			}
			n := srq.Num()
			if err := srq.Destroy(ctx); err != nil {
				t.Fatal(err)
			}
			return n
		})
	})
	t.Run("closed-domain", func(t *testing.T) {
		hostile(t, "a closed domain's SRQ", func(t *testing.T, _ *end, x *xrcTarget) uint32 {
			ctx := opCtx(t)
			x2, err := x.ad.OpenXRCD(ctx, nil, false, false)
			if err != nil {
				t.Fatal(err)
			}
			cq, err := x.ad.CreateCQ(ctx, 16)
			if err != nil {
				t.Fatal(err)
			}
			srq, err := x.pd.CreateXRCSRQ(ctx, x2, cq, vrdma.SRQAttr{MaxWR: 4, MaxSGE: 1})
			if err != nil {
				t.Fatal(err)
			}
			expectCode(t, x2.Close(ctx), "bad-state", "closing a domain that holds an SRQ")
			n := srq.Num()
			if err := srq.Destroy(ctx); err != nil {
				t.Fatal(err)
			}
			if err := x2.Close(ctx); err != nil {
				t.Fatal(err)
			}
			return n
		})
	})
}

// TestXRCDomainShared: two processes of one VM (two sessions) open the XRC
// domain of one file: the second finds it without O_CREAT, O_EXCL refuses
// it, and once both closed it the
// file names no domain. A process of another VM opening the same
// file makes a domain of its own.
func TestXRCDomainShared(t *testing.T) {
	ctx := opCtx(t)
	_, f, openVM := xrcVMs(t)
	open := func(vm string) *vrdma.Adapter { return openVM(vm).Adapters()[0] }
	p1, p2, other := open("vm1"), open("vm1"), open("vm2")
	if _, err := p2.OpenXRCD(ctx, f, false, false); err == nil {
		t.Fatal("a file that names no domain opened without O_CREAT")
	}
	x1, err := p1.OpenXRCD(ctx, f, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.OpenXRCD(ctx, f, true, true); err == nil {
		t.Fatal("O_EXCL opened a domain the file names")
	}
	x2, err := p2.OpenXRCD(ctx, f, false, false)
	if err != nil {
		t.Fatalf("the second process of the VM does not find the domain: %v", err)
	}
	if _, err := other.OpenXRCD(ctx, f, false, false); err == nil {
		t.Fatal("another VM found the domain of vm1's processes")
	}
	xo, err := other.OpenXRCD(ctx, f, true, true)
	if err != nil {
		t.Fatalf("another VM cannot make a domain of its own for the same file: %v", err)
	}
	for _, x := range []*vrdma.XRCD{x1, x2, xo} {
		if err := x.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p2.OpenXRCD(ctx, f, false, false); err == nil {
		t.Fatal("the file still names a domain once every process closed it")
	}
}

// xrcVMs starts an agent with VMs vm1 and vm2, and gives a file to name
// XRC domains by and a function that attaches a process to a VM.
func xrcVMs(t *testing.T) (*testenv.Env, *os.File, func(vm string) *vrdma.VM) {
	t.Helper()
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	env.Define(t, "vm2", testenv.VMOptions{MemMB: 8})
	f, err := os.Create(filepath.Join(t.TempDir(), "xrc_domain"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return env, f, func(vm string) *vrdma.VM {
		v, err := vrdma.Open(opCtx(t), vm, vrdma.WithSocket(env.Socket))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { v.Close() })
		return v
	}
}

// TestXRCSRQProcessEnds: a target QP delivers to the SRQ of another
// process of its VM in its domain; once that process ended, the SRQ's
// number is refused as one outside the domain (REM_INV_REQ_ERR, the
// target QP to ERR), and nothing touches the memory that process had.
func TestXRCSRQProcessEnds(t *testing.T) {
	ctx := opCtx(t)
	env, f, open := xrcVMs(t)
	owner, other := open("vm1"), open("vm1")
	xa, err := owner.Adapters()[0].OpenXRCD(ctx, f, true, false)
	if err != nil {
		t.Fatal(err)
	}
	xb, err := other.Adapters()[0].OpenXRCD(ctx, f, false, false)
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := xa.CreateTargetQP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	xs := newXRCSRQs(t, other, xb)
	xs.post(t, 0, 0, 4)
	snd := newEnd(t, open("vm2"), qpConfig{typ: vrdma.QPTypeXRCSend, caps: vrdma.QPCaps{MaxSendWR: 16, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1}})
	if err := snd.qp.ConnectTo(ctx, tgt.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := tgt.ConnectTo(ctx, snd.qp.Endpoint()); err != nil {
		t.Fatal(err)
	}
	src := snd.mr(t, 64, vrdma.AccessAll)
	fill(src.Bytes(), 41)
	wr := vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64)), XRCSRQN: xs.srqs[0].Num()}
	postSend(t, snd.qp, wr)
	expectWC(t, waitWC(t, snd.scq, 1)[0], snd.qp, 1, vrdma.WCSuccess, vrdma.WCSend)
	expectRecv(t, waitWC(t, xs.cqs[0], 1)[0], tgt, 0, vrdma.WCRecv, 64, 0, false)
	expectBytes(t, "message in the other process's memory", xs.slot(0)[:64], src.Bytes())
	if n := processes(t, env, "vm1"); n != 2 {
		t.Fatalf("vm1 has %d processes, want 2", n)
	}
	other.Close()
	for processes(t, env, "vm1") != 1 { // its teardown is the agent's, after the session ends
		time.Sleep(5 * time.Millisecond)
	}
	wr.ID = 2
	postSend(t, snd.qp, wr)
	expectWC(t, waitWC(t, snd.scq, 1)[0], snd.qp, 2, vrdma.WCRemInvReqErr, 0)
	if info, err := tgt.Query(ctx); err != nil || info.Attr.State != vrdma.QPSErr {
		t.Fatalf("target QP after an invalid request: %v, %v; want ERR", info.Attr.State, err)
	}
}

// processes counts the processes attached as VM name.
func processes(t *testing.T, env *testenv.Env, name string) int {
	t.Helper()
	for _, v := range env.Status(t).VMs {
		if v.Name == name {
			return len(v.Processes)
		}
	}
	return 0
}

// TestXRCOpenQP: an XRC target QP shared by two processes of one VM
// (XRCD.OpenQP, ibv_open_qp). The creator's QP, opened by the other
// process, delivers a SEND to the opener's SRQ — its memory, its CQ —
// and goes on doing so after the creator destroyed its handle; the
// opener's destroy ends it, and its number opens no more. Numbers that are
// no target QP of the domain are refused: an RC QP's, another VM's target
// QP's, the QP through a private domain. A target QP whose creator's
// process ends goes with it: the opener hears IBV_EVENT_QP_FATAL, and its
// handle no longer modifies.
func TestXRCOpenQP(t *testing.T) {
	ctx := opCtx(t)
	env, f, open := xrcVMs(t)
	creatorVM, openerVM := open("vm1"), open("vm1")
	creator, opener := creatorVM.Adapters()[0], openerVM.Adapters()[0]
	xc, err := creator.OpenXRCD(ctx, f, true, false)
	if err != nil {
		t.Fatal(err)
	}
	xo, err := opener.OpenXRCD(ctx, f, false, false)
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := xc.CreateTargetQP(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The sender, in vm2, with a target QP of its own domain.
	snd := newEnd(t, open("vm2"), qpConfig{typ: vrdma.QPTypeXRCSend, caps: vrdma.QPCaps{MaxSendWR: 16, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1}})
	xs, err := snd.ad.OpenXRCD(ctx, nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	otherTgt, err := xs.CreateTargetQP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mine := newEnd(t, openerVM, qpConfig{})
	xp, err := opener.OpenXRCD(ctx, nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	for what, try := range map[string]func() (*vrdma.QP, error){
		"an RC QP":               func() (*vrdma.QP, error) { return xo.OpenQP(ctx, mine.qp.QPN()) },
		"another VM's target":    func() (*vrdma.QP, error) { return xo.OpenQP(ctx, otherTgt.QPN()) },
		"through another domain": func() (*vrdma.QP, error) { return xp.OpenQP(ctx, tgt.QPN()) },
	} {
		_, err := try()
		expectCode(t, err, "invalid-argument", "OpenQP of "+what)
	}

	q, err := xo.OpenQP(ctx, tgt.QPN())
	if err != nil {
		t.Fatal(err)
	}
	if q.QPN() != tgt.QPN() || q.Type() != vrdma.QPTypeXRCRecv {
		t.Fatalf("opened QP 0x%x of type %s, want 0x%x XRC_RECV", q.QPN(), q.Type(), tgt.QPN())
	}
	expectCode(t, xo.Close(ctx), "bad-state", "closing the domain an open was made through")
	ox := newXRCSRQs(t, openerVM, xo)
	ox.post(t, 0, 0, 4)
	srq, cq := ox.srqs[0], ox.cqs[0]
	// The opener connects the QP it opened; the creator's handle sees it.
	if err := snd.qp.ConnectTo(ctx, q.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := q.ConnectTo(ctx, snd.qp.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if info, err := tgt.Query(ctx); err != nil || info.Attr.State != vrdma.QPSRTS {
		t.Fatalf("the creator's handle after the opener connected: %v, %v; want RTS", info.Attr.State, err)
	}
	src := snd.mr(t, 2*64, vrdma.AccessAll)
	fill(src.Bytes(), 31)
	send := func(k int) {
		t.Helper()
		postSend(t, snd.qp, vrdma.SendWR{ID: uint64(k), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(k*64, 64)), XRCSRQN: srq.Num()})
		expectWC(t, waitWC(t, snd.scq, 1)[0], snd.qp, uint64(k), vrdma.WCSuccess, vrdma.WCSend)
		expectRecv(t, waitWC(t, cq, 1)[0], q, uint64(k), vrdma.WCRecv, 64, 0, false)
		expectBytes(t, "message in the opener's memory", ox.slot(k)[:64], src.Bytes()[k*64:(k+1)*64])
	}
	send(0)
	// The creator lets go: the QP is the opener's now.
	if err := tgt.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if err := xc.Close(ctx); err != nil {
		t.Fatalf("the creator's domain handle is still held by the QP it let go: %v", err)
	}
	send(1)
	listed := false
	for _, v := range env.Status(t).VMs {
		for _, s := range v.QPs {
			listed = listed || v.Name == "vm1" && s.QPN == tgt.QPN() && s.Counters.Recvs == 2
		}
	}
	if !listed {
		t.Fatal("the status does not list the target QP its creator let go of, with its 2 receives")
	}
	if err := q.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = xo.OpenQP(ctx, tgt.QPN())
	expectCode(t, err, "invalid-argument", "OpenQP of a QP whose last handle was destroyed")

	// A target QP goes with its creator's process.
	x2, err := creator.OpenXRCD(ctx, f, false, false)
	if err != nil {
		t.Fatal(err)
	}
	tgt2, err := x2.CreateTargetQP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := opener.OpenAsyncEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	q2, err := xo.OpenQP(ctx, tgt2.QPN())
	if err != nil {
		t.Fatal(err)
	}
	creatorVM.Close()
	e, err := ev.Next(ctx)
	if err != nil || e.Type != vrdma.EventQPFatal || e.QPN != tgt2.QPN() {
		t.Fatalf("the opener's event when the creator's process ended: %+v, %v; want QP_FATAL of 0x%x", e, err, tgt2.QPN())
	}
	if err := q2.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSErr}, vrdma.MaskState); err == nil {
		t.Fatal("an open of a QP whose creator's process ended still modifies it")
	}
	if err := q2.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range ox.srqs {
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := xo.Close(ctx); err != nil {
		t.Fatalf("closing the opener's domain once its opens are gone: %v", err)
	}
}
