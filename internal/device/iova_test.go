// SPDX-License-Identifier: Apache-2.0

package device

import (
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
)

// TestRegMRIOVA registers a region with an iova (CapMRIOVA) and checks that
// keys resolve addresses in the iova space, and only there, to the guest
// memory the region was registered over; a region without one keeps its
// guest address as iova; an iova range that wraps is refused.
func TestRegMRIOVA(t *testing.T) {
	h, rc := respondCase(t)
	const guest, iova, n = harnessRW + 0x8000, uint64(0x7f12_3456_7000), 4096
	iv := iova
	reg, err := h.pv.RegMR(&abi.RegMR{PD: h.ppd.handle, Addr: guest + 0x10, Length: n - 0x10, Access: abi.AccessAll, IOVA: &iv})
	if err != nil {
		t.Fatal(err)
	}
	mem := h.pv.mem.Bytes()
	for _, c := range []struct {
		addr, len uint64
		ok        bool
		at        uint64 // guest address, when ok
	}{
		{iova, 8, true, guest + 0x10},
		{iova + 100, 32, true, guest + 0x10 + 100},
		{iova + n - 0x10 - 8, 8, true, guest + n - 8},
		{iova + n - 0x10 - 7, 8, false, 0}, // one byte past the end
		{iova - 1, 8, false, 0},
		{guest + 0x10, 8, false, 0}, // the guest address is not in the iova space
	} {
		b, ok := h.pv.resolve(h.ppd, reg.RKey, c.addr, c.len, abi.AccessRemoteWrite)
		if ok != c.ok {
			t.Errorf("resolve(0x%x, %d) ok = %v, want %v", c.addr, c.len, ok, c.ok)
			continue
		}
		if ok && (len(b) != int(c.len) || &b[0] != &mem[c.at]) {
			t.Errorf("resolve(0x%x, %d) is not guest memory at 0x%x", c.addr, c.len, c.at)
		}
	}

	// A WRITE from the peer by iova lands in the guest memory behind it.
	var m Message
	r := Request{Op: abi.OpRDMAWrite, SrcQPN: rc.q.qpn, RKey: reg.RKey, RAddr: iova + 0x40, Total: 16}
	rc.p.vm.memMu.RLock()
	v := rc.p.Begin(&r, &m)
	out, st := v.Out, v.Status
	if out == OutDone && st == abi.WCSuccess {
		copy(m.Place(0, 16), "sixteen bytes!!!")
	}
	rc.p.vm.memMu.RUnlock()
	if out != OutDone || st != abi.WCSuccess {
		t.Fatalf("begin: %v %s", out, st)
	}
	if got := string(mem[guest+0x50 : guest+0x60]); got != "sixteen bytes!!!" {
		t.Errorf("guest memory at the iova's place holds %q", got)
	}

	// Without an iova, the guest address is the iova (ABI 1 as it shipped).
	plain, err := h.pv.RegMR(&abi.RegMR{PD: h.ppd.handle, Addr: guest, Length: 64, Access: abi.AccessAll})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h.pv.resolve(h.ppd, plain.LKey, guest+8, 8, abi.AccessLocalWrite); !ok {
		t.Error("a region without iova does not resolve its guest addresses")
	}

	wrap := ^uint64(0) - 10
	r2 := abi.RegMR{PD: h.ppd.handle, Addr: guest, Length: 64, Access: abi.AccessAll, IOVA: &wrap}
	if err := r2.Validate(); err == nil {
		t.Error("an iova range that wraps validates")
	}
}
