// SPDX-License-Identifier: Apache-2.0

package rdma_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma"
)

// TestEngineWireUC is TestEngineWire for UC QPs: Wireshark decodes every
// packet of their traffic — SEND and RDMA WRITE, with and without
// immediate, of one packet and of five — as InfiniBand with UC's opcodes
// (0x20 … 0x2b), none malformed, none of another transport and no ACK;
// scapy checks every ICRC; and every message arrived whole.
func TestEngineWireUC(t *testing.T) {
	for _, addr := range []string{"127.0.33.11:4791", "[::1]:4791"} {
		t.Run(addr, func(t *testing.T) { testEngineWire(t, netip.MustParseAddrPort(addr), ucTraffic, wantUCOpcodes) })
	}
}

// ucSide is one end of a pair: its PD, QP, CQs and a 64 KiB region.
type ucSide struct {
	pd       *vrdma.PD
	qp       *vrdma.QP
	scq, rcq *vrdma.CQ
	mr       *vrdma.MR
}

// ucPair connects a UC QP of v1 to one of v2 (QP.ConnectTo).
func ucPair(tb testing.TB, ctx context.Context, v1, v2 *vrdma.VM) (a, b *ucSide) {
	return qpPair(tb, ctx, v1, v2, vrdma.QPTypeUC, vrdma.AccessLocalWrite|vrdma.AccessRemoteWrite)
}

// qpPair connects a QP of type typ of v1 to one of v2 (QP.ConnectTo),
// each with a 64 KiB region of access.
func qpPair(tb testing.TB, ctx context.Context, v1, v2 *vrdma.VM, typ vrdma.QPType, access vrdma.Access) (a, b *ucSide) {
	open := func(vm *vrdma.VM) *ucSide {
		ad := vm.Adapters()[0]
		pd, err := ad.AllocPD(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		s := &ucSide{pd: pd}
		if s.scq, err = ad.CreateCQ(ctx, 64); err == nil {
			s.rcq, err = ad.CreateCQ(ctx, 64)
		}
		if err == nil {
			s.qp, err = pd.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, Type: typ,
				Caps: vrdma.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		}
		var buf []byte
		if err == nil {
			buf, err = vm.Alloc(1 << 16)
		}
		if err == nil {
			s.mr, err = pd.RegMR(ctx, buf, access)
		}
		if err != nil {
			tb.Fatal(err)
		}
		return s
	}
	a, b = open(v1), open(v2)
	if err := a.qp.ConnectTo(ctx, b.qp.Endpoint()); err != nil {
		tb.Fatal(err)
	}
	if err := b.qp.ConnectTo(ctx, a.qp.Endpoint()); err != nil {
		tb.Fatal(err)
	}
	return a, b
}

// ucTraffic connects a UC QP of v1 to one of v2 and sends every UC
// opcode: each operation once of 5000 bytes (FIRST, MIDDLE, LAST at the
// path MTU 1024) and once of 100 (ONLY), checking that each arrived.
func ucTraffic(t *testing.T, ctx context.Context, v1, v2 *vrdma.VM) {
	a, b := ucPair(t, ctx, v1, v2)
	if got := a.qp.Path().Path; got != vrdma.PathRDMA {
		t.Fatalf("path %q, want rdma", got)
	}
	src := a.mr.Bytes()
	for i := range src {
		src[i] = byte(i*13 + 5)
	}
	wait := func(cq *vrdma.CQ, what string) vrdma.WorkCompletion {
		wc := make([]vrdma.WorkCompletion, 1)
		for {
			if n, err := cq.Poll(wc); err != nil || n == 1 {
				if err != nil || wc[0].Status != vrdma.WCSuccess {
					t.Fatalf("%s: %v %+v", what, err, wc[0])
				}
				return wc[0]
			}
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	for i, op := range []vrdma.Opcode{vrdma.OpSend, vrdma.OpSendWithImm, vrdma.OpRDMAWrite, vrdma.OpRDMAWriteWithImm} {
		for j, n := range []int{5000, 100} {
			k := 2*i + j
			off := k * 6000 // where b receives it (SEND) or it is written to (WRITE)
			if op != vrdma.OpRDMAWrite {
				if err := b.qp.PostRecv([]vrdma.RecvWR{{ID: uint64(k), SGL: []vrdma.SGE{b.mr.SGE(off, 6000)}}}); err != nil {
					t.Fatal(err)
				}
			}
			wr := vrdma.SendWR{ID: uint64(k), Opcode: op, Flags: vrdma.SendSignaled, Imm: uint32(k), SGL: []vrdma.SGE{a.mr.SGE(0, n)},
				RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()}
			if err := a.qp.PostSend([]vrdma.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			wait(a.scq, op.String())
			if op != vrdma.OpRDMAWrite {
				if w := wait(b.rcq, op.String()+" received"); w.ByteLen != uint32(n) || w.WRID != uint64(k) {
					t.Fatalf("%s of %d bytes received as %+v", op, n, w)
				}
			} else {
				for string(b.mr.Bytes()[off:off+n]) != string(src[:n]) {
					if ctx.Err() != nil {
						t.Fatalf("%s of %d bytes did not land", op, n)
					}
				}
			}
			if string(b.mr.Bytes()[off:off+n]) != string(src[:n]) {
				t.Fatalf("%s of %d bytes: the bytes differ", op, n)
			}
		}
	}
}

// wantUCOpcodes fails t unless the capture holds every UC opcode and
// nothing else: no ACK, no RC packet.
func wantUCOpcodes(t *testing.T, opcodes map[int]int, what string, n int) {
	t.Helper()
	for op := 0x20; op <= 0x2b; op++ {
		if opcodes[op] == 0 {
			t.Errorf("no %s with opcode 0x%02x in the capture (%d %ss; opcodes %v)", what, op, n, what, opcodes)
		}
	}
	for op, k := range opcodes {
		if op < 0x20 || op > 0x2b {
			t.Errorf("%d %ss with opcode 0x%02x, which is not UC's: UC has no ACK (opcodes %v)", k, what, op, opcodes)
		}
	}
}
