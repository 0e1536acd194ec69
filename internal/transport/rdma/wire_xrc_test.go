// SPDX-License-Identifier: Apache-2.0

package rdma_test

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma"
)

// TestEngineWireXRC is TestEngineWire for XRC QPs: an XRC initiator QP
// runs every RC operation, of one packet and of five, through an XRC
// target QP to an XRC SRQ; Wireshark decodes every packet as InfiniBand
// with XRC's opcodes (0xa0 … 0xb4: requests, read responses and ACKs),
// none malformed and none of another transport; scapy checks every ICRC;
// and every message arrived whole.
func TestEngineWireXRC(t *testing.T) {
	for _, addr := range []string{"127.0.33.12:4791", "[::1]:4791"} {
		t.Run(addr, func(t *testing.T) { testEngineWire(t, netip.MustParseAddrPort(addr), xrcTraffic, wantXRCOpcodes) })
	}
}

// xrcSides are an XRC initiator QP (ini, with its send CQ and PD) of one
// VM connected to an XRC target QP (tgt) of another, whose domain has one
// XRC SRQ (with its CQ, in pd2).
type xrcSides struct {
	ini, tgt *vrdma.QP
	scq, rcq *vrdma.CQ
	srq      *vrdma.SRQ
	pd1, pd2 *vrdma.PD
}

// xrcPair connects an XRC initiator QP of v1 to an XRC target QP of v2
// (QP.ConnectTo).
func xrcPair(t testing.TB, ctx context.Context, v1, v2 *vrdma.VM) *xrcSides {
	ad1, ad2 := v1.Adapters()[0], v2.Adapters()[0]
	pd1, err := ad1.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pd2, err := ad2.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scq, err := ad1.CreateCQ(ctx, 64)
	if err != nil {
		t.Fatal(err)
	}
	ini, err := pd1.CreateQP(ctx, vrdma.QPInitAttr{SendCQ: scq, Type: vrdma.QPTypeXRCSend, Caps: vrdma.QPCaps{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	x, err := ad2.OpenXRCD(ctx, nil, false, false)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := ad2.CreateCQ(ctx, 64)
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd2.CreateXRCSRQ(ctx, x, rcq, vrdma.SRQAttr{MaxWR: 16, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := x.CreateTargetQP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ini.ConnectTo(ctx, tgt.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := tgt.ConnectTo(ctx, ini.Endpoint()); err != nil {
		t.Fatal(err)
	}
	return &xrcSides{ini: ini, tgt: tgt, scq: scq, rcq: rcq, srq: srq, pd1: pd1, pd2: pd2}
}

// xrcTraffic connects an XRC initiator QP of v1 to an XRC target QP of
// v2, whose domain has one XRC SRQ, and runs SEND, SEND with immediate,
// RDMA WRITE, WRITE with immediate and READ of 5000 bytes (FIRST, MIDDLE,
// LAST at the path MTU 1024) and of 100 (ONLY), and both atomics,
// checking each.
func xrcTraffic(t *testing.T, ctx context.Context, v1, v2 *vrdma.VM) {
	s := xrcPair(t, ctx, v1, v2)
	ini, tgt, scq, rcq, srq, pd1, pd2 := s.ini, s.tgt, s.scq, s.rcq, s.srq, s.pd1, s.pd2
	if got := ini.Path().Path; got != vrdma.PathRDMA {
		t.Fatalf("path %q, want rdma", got)
	}
	reg := func(vm *vrdma.VM, pd *vrdma.PD) *vrdma.MR {
		buf, err := vm.Alloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		m, err := pd.RegMR(ctx, buf, vrdma.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, b := reg(v1, pd1), reg(v2, pd2)
	src := a.Bytes()
	for i := range 6000 {
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
	n := srq.Num()
	for i, op := range []vrdma.Opcode{vrdma.OpSend, vrdma.OpSendWithImm, vrdma.OpRDMAWrite, vrdma.OpRDMAWriteWithImm, vrdma.OpRDMARead} {
		for j, size := range []int{5000, 100} {
			k := 2*i + j
			off := k * 6000 // where b receives it or it is written to or read from
			recv := op != vrdma.OpRDMAWrite && op != vrdma.OpRDMARead
			if recv {
				if err := srq.PostRecv([]vrdma.RecvWR{{ID: uint64(k), SGL: []vrdma.SGE{b.SGE(off, 6000)}}}); err != nil {
					t.Fatal(err)
				}
			}
			local := a.SGE(0, size)
			if op == vrdma.OpRDMARead {
				copy(b.Bytes()[off:], src[:size])
				local = a.SGE(off, size)
			}
			wr := vrdma.SendWR{ID: uint64(k), Opcode: op, Flags: vrdma.SendSignaled, Imm: uint32(k), SGL: []vrdma.SGE{local},
				RemoteAddr: b.Addr() + uint64(off), RKey: b.RKey(), XRCSRQN: n}
			if err := ini.PostSend([]vrdma.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			wait(scq, op.String())
			if recv {
				if w := wait(rcq, op.String()+" received"); w.ByteLen != uint32(size) || w.WRID != uint64(k) || w.QPNum != tgt.QPN() {
					t.Fatalf("%s of %d bytes received as %+v", op, size, w)
				}
			}
			got := b.Bytes()[off : off+size]
			if op == vrdma.OpRDMARead {
				got = a.Bytes()[off : off+size]
			}
			if string(got) != string(src[:size]) {
				t.Fatalf("%s of %d bytes: the bytes differ", op, size)
			}
		}
	}
	word := b.Bytes()[60000:]
	binary.LittleEndian.PutUint64(word, 10)
	for k, wr := range []vrdma.SendWR{
		{Opcode: vrdma.OpAtomicFetchAdd, CompareAdd: 5},
		{Opcode: vrdma.OpAtomicCmpAndSwp, CompareAdd: 15, Swap: 99},
	} {
		wr.ID, wr.Flags, wr.SGL, wr.RemoteAddr, wr.RKey, wr.XRCSRQN = uint64(20+k), vrdma.SendSignaled, []vrdma.SGE{a.SGE(62000, 8)}, b.Addr()+60000, b.RKey(), n
		if err := ini.PostSend([]vrdma.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		wait(scq, wr.Opcode.String())
	}
	if v := binary.LittleEndian.Uint64(word); v != 99 {
		t.Fatalf("after FETCH_ADD 5 and CMP_SWAP 15→99 of 10, the word is %d", v)
	}
}

// wantXRCOpcodes fails t unless the capture holds every XRC opcode of
// the traffic (0xa0 … 0xb4) and nothing else: no RC packet.
func wantXRCOpcodes(t *testing.T, opcodes map[int]int, what string, n int) {
	t.Helper()
	for op := 0xa0; op <= 0xb4; op++ {
		if opcodes[op] == 0 {
			t.Errorf("no %s with opcode 0x%02x in the capture (%d %ss; opcodes %v)", what, op, n, what, opcodes)
		}
	}
	for op, k := range opcodes {
		if op < 0xa0 || op > 0xb4 {
			t.Errorf("%d %ss with opcode 0x%02x, which is not XRC's (opcodes %v)", k, what, op, opcodes)
		}
	}
}
