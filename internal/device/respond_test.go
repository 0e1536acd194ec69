// SPDX-License-Identifier: Apache-2.0

package device

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
)

// respondCase is a connected pair from the ring harness whose responder p
// has one receive posted: 1,000 bytes at harnessRW and 2,500 at
// harnessRW+0x2000.
func respondCase(t *testing.T) (*ringHarness, *ringCase) {
	h := newRingHarness(t)
	n, s := sges(abi.SGE{Addr: harnessRW, Length: 1000, LKey: harnessKeyRW}, abi.SGE{Addr: harnessRW + 0x2000, Length: 2500, LKey: harnessKeyRW})
	rc := h.setup(t, nil, 0, 0, recvSlots(abi.RecvWQE{NumSGE: n, SGE: s}), 1, nil, 0, 0, 0)
	t.Cleanup(func() { h.teardown(t, rc) })
	return h, rc
}

// TestResumableResponder delivers a SEND in chunks, out of order and some
// twice (retransmitted packets), and checks that the bytes land across the
// receive's buffers exactly and that the receive completes once.
func TestResumableResponder(t *testing.T) {
	h, rc := respondCase(t)
	p := rc.p
	const total, chunk = 3000, 256
	msg := make([]byte, total)
	for i := range msg {
		msg[i] = byte(i*7 + 1)
	}
	var m Message
	r := Request{Op: abi.OpSendWithImm, SrcQPN: rc.q.qpn, Total: total, Imm: 0xfeed}
	p.vm.memMu.RLock()
	v := p.Begin(&r, &m)
	out, st := v.Out, v.Status
	p.vm.memMu.RUnlock()
	if out != OutDone || st != abi.WCSuccess {
		t.Fatalf("begin: %v %s", out, st)
	}
	if m.Place(total-1, 2) != nil || m.Place(0, 0) != nil {
		t.Fatal("place beyond the message returned memory")
	}
	var offs []uint64
	for off := uint64(0); off < total; off += chunk {
		offs = append(offs, off)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
	offs = append(offs, offs[:4]...) // retransmissions
	for _, off := range offs {
		// As a packet engine places a packet of a message that took a
		// receive: under memMu and rqMu, the receive still taken.
		p.vm.memMu.RLock()
		p.rqMu.Lock()
		if !p.Revalidate(&m) || !m.taken(p) {
			t.Fatal("revalidate or taken failed with every region and the receive in place")
		}
		for o, end := off, min(off+chunk, total); o < end; {
			b := m.Place(o, end-o)
			if len(b) == 0 {
				t.Fatalf("place(%d, %d) returned nothing", o, end-o)
			}
			copy(b, msg[o:])
			o += uint64(len(b))
		}
		p.rqMu.Unlock()
		p.vm.memMu.RUnlock()
	}
	if out, st := p.End(&m); out != OutDone || st != abi.WCSuccess {
		t.Fatalf("end: %v %s", out, st)
	}
	mem := h.pv.mem.Bytes()
	got := append(bytes.Clone(mem[harnessRW:harnessRW+1000]), mem[harnessRW+0x2000:harnessRW+0x2000+2000]...)
	if !bytes.Equal(got, msg) {
		t.Fatal("the message's bytes differ from what was placed")
	}
	if !bytes.Equal(mem[harnessRW+0x2000+2000:harnessRW+0x2000+2500], h.pattern[harnessRW+0x2000+2000:harnessRW+0x2000+2500]) {
		t.Fatal("bytes beyond the message's end changed")
	}
	cqes := completions(rc.pcq)
	if len(cqes) != 1 || cqes[0].WRID != wrPRQ || cqes[0].Status != abi.WCSuccess || cqes[0].ByteLen != total || cqes[0].Imm != 0xfeed ||
		cqes[0].Flags&abi.WCWithImm == 0 || cqes[0].SrcQP != rc.q.qpn {
		t.Fatalf("receive completions %+v: want one, of the whole message with its immediate", cqes)
	}
}

// TestResumableResponderFlushed: a receive flushed while its message is
// under way (the responder went to ERR) is not completed a second time;
// the message ends as a request the responder dropped.
func TestResumableResponderFlushed(t *testing.T) {
	_, rc := respondCase(t)
	p := rc.p
	var m Message
	r := Request{Op: abi.OpSend, SrcQPN: rc.q.qpn, Total: 10}
	p.vm.memMu.RLock()
	v := p.Begin(&r, &m)
	out, st := v.Out, v.Status
	p.vm.memMu.RUnlock()
	if out != OutDone || st != abi.WCSuccess {
		t.Fatalf("begin: %v %s", out, st)
	}
	p.MoveToErr("test")
	p.flushRQ()
	p.rqMu.Lock()
	still := m.taken(p)
	p.rqMu.Unlock()
	if still {
		t.Fatal("the receive still counts as taken after the flush: its buffers would be written")
	}
	if out, _ := p.End(&m); out != OutNoPeer {
		t.Fatalf("end after the flush: %v, want outNoPeer", out)
	}
	cqes := completions(rc.pcq)
	if len(cqes) != 1 || cqes[0].Status != abi.WCWRFlushErr {
		t.Fatalf("receive completions %+v: want only the flush", cqes)
	}
}

// TestResumableResponderDeregistered: a region deregistered between two
// packets fails revalidate, so no later packet touches it.
func TestResumableResponderDeregistered(t *testing.T) {
	h, rc := respondCase(t)
	p := rc.p
	reg, err := h.pv.RegMR(&abi.RegMR{PD: h.ppd.handle, Addr: harnessRW + 0x8000, Length: 4096, Access: abi.AccessAll})
	if err != nil {
		t.Fatal(err)
	}
	var m Message
	r := Request{Op: abi.OpRDMAWrite, SrcQPN: rc.q.qpn, RKey: reg.RKey, RAddr: harnessRW + 0x8000, Total: 4096}
	p.vm.memMu.RLock()
	v := p.Begin(&r, &m)
	out, st := v.Out, v.Status
	p.vm.memMu.RUnlock()
	if out != OutDone || st != abi.WCSuccess {
		t.Fatalf("begin: %v %s", out, st)
	}
	if err := h.pv.DeregMR(reg.Handle); err != nil {
		t.Fatal(err)
	}
	p.vm.memMu.RLock()
	ok := p.Revalidate(&m)
	p.vm.memMu.RUnlock()
	if ok {
		t.Fatal("revalidate succeeded after the region was deregistered")
	}
}
