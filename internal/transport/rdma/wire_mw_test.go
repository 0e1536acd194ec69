// SPDX-License-Identifier: Apache-2.0

package rdma_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vrdma/vrdma"
)

// TestEngineWireMW is TestEngineWire for SEND with invalidate: Wireshark
// decodes the RC packets of a SEND_WITH_INV of five packets (SEND_FIRST,
// SEND_MIDDLE, SEND_LAST_WITH_INVALIDATE) and of one
// (SEND_ONLY_WITH_INVALIDATE), with their IETH, none malformed; scapy
// checks every ICRC; each receive completes WITH_INV naming the window's
// rkey, and a WRITE through the invalidated window is refused.
func TestEngineWireMW(t *testing.T) {
	for _, addr := range []string{"127.0.33.12:4791", "[::1]:4791"} {
		t.Run(addr, func(t *testing.T) { testEngineWire(t, netip.MustParseAddrPort(addr), mwTraffic, wantMWOpcodes) })
	}
}

// mwTraffic binds a type 2 window of v2's QP and invalidates it with a
// SEND_WITH_INV of 5000 bytes from v1's (path MTU 1024), binds it again
// and invalidates it with one of 100 bytes, then WRITEs through it.
func mwTraffic(t *testing.T, ctx context.Context, v1, v2 *vrdma.VM) {
	a, b := qpPair(t, ctx, v1, v2, vrdma.QPTypeRC, vrdma.AccessLocalWrite|vrdma.AccessMWBind)
	if got := a.qp.Path().Path; got != vrdma.PathRDMA {
		t.Fatalf("path %q, want rdma", got)
	}
	w, err := b.pd.AllocMW(ctx, vrdma.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	wait := func(cq *vrdma.CQ, what string, st vrdma.WCStatus) vrdma.WorkCompletion {
		wc := make([]vrdma.WorkCompletion, 1)
		for {
			if n, err := cq.Poll(wc); err != nil || n == 1 {
				if err != nil || wc[0].Status != st {
					t.Fatalf("%s: %v %+v, want %s", what, err, wc[0], st)
				}
				return wc[0]
			}
			if err := cq.Wait(ctx); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	src := a.mr.Bytes()
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	var rkey uint32
	for k, n := range []int{5000, 100} {
		rkey = vrdma.IncRKey(w.RKey())
		bind := vrdma.SendWR{ID: uint64(k), Opcode: vrdma.OpBindMW, Flags: vrdma.SendSignaled, MW: w, RKey: rkey,
			Bind: vrdma.MWBind{MR: b.mr, Addr: b.mr.Addr(), Length: 4096, Access: vrdma.AccessRemoteWrite}}
		if err := b.qp.PostSend([]vrdma.SendWR{bind}); err != nil {
			t.Fatal(err)
		}
		wait(b.scq, "BIND_MW", vrdma.WCSuccess)
		off := 8192 + k*6000
		if err := b.qp.PostRecv([]vrdma.RecvWR{{ID: uint64(k), SGL: []vrdma.SGE{b.mr.SGE(off, 6000)}}}); err != nil {
			t.Fatal(err)
		}
		send := vrdma.SendWR{ID: uint64(k), Opcode: vrdma.OpSendWithInv, Flags: vrdma.SendSignaled, RKey: rkey, SGL: []vrdma.SGE{a.mr.SGE(0, n)}}
		if err := a.qp.PostSend([]vrdma.SendWR{send}); err != nil {
			t.Fatal(err)
		}
		wait(a.scq, "SEND_WITH_INV", vrdma.WCSuccess)
		if r := wait(b.rcq, "SEND_WITH_INV received", vrdma.WCSuccess); r.ByteLen != uint32(n) || r.Flags&vrdma.WCWithInv == 0 || r.Imm != rkey {
			t.Fatalf("SEND_WITH_INV of %d bytes received as %+v, want WITH_INV of rkey 0x%x", n, r, rkey)
		}
		if string(b.mr.Bytes()[off:off+n]) != string(src[:n]) {
			t.Fatalf("SEND_WITH_INV of %d bytes: the bytes differ", n)
		}
	}
	write := vrdma.SendWR{ID: 9, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, RKey: rkey, RemoteAddr: b.mr.Addr(), SGL: []vrdma.SGE{a.mr.SGE(0, 64)}}
	if err := a.qp.PostSend([]vrdma.SendWR{write}); err != nil {
		t.Fatal(err)
	}
	wait(a.scq, "WRITE through the invalidated window", vrdma.WCRemAccessErr)
}

// wantMWOpcodes fails t unless the capture holds SEND_FIRST, SEND_MIDDLE,
// SEND_LAST_WITH_INVALIDATE, SEND_ONLY_WITH_INVALIDATE, RDMA_WRITE_ONLY
// and ACKNOWLEDGE (the NAK among them).
func wantMWOpcodes(t *testing.T, opcodes map[int]int, what string, n int) {
	t.Helper()
	for _, op := range []int{0x00, 0x01, 0x16, 0x17, 0x0a, 0x11} {
		if opcodes[op] == 0 {
			t.Errorf("no %s with opcode 0x%02x in the capture (%d %ss; opcodes %v)", what, op, n, what, opcodes)
		}
	}
}
