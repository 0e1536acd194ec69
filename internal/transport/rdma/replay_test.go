// SPDX-License-Identifier: Apache-2.0

package rdma_test

// The responder resources on the wire: an atomic's result is replayed for
// a duplicate of it however many packets came between, a duplicate whose
// result is no longer held is refused (NAK invalid request), and a
// requester whose atomic response never comes spends its retry budget on
// the go-back-Ns that the ACKs past it ask for, and fails, instead of
// going back forever.

import (
	"context"
	"encoding/binary"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/rdma/rdmatest"
)

// tap is an engine's socket with a trap on what it sends, a record of the
// atomic requests and the (atomic) acknowledgements it sends, and a side
// door for packets a test injects (as FuzzEngine's injector).
type tap struct {
	rdma.Conn
	in chan []byte

	mu  sync.Mutex
	got [][]byte // the packets recorded, in order
}

func (c *tap) Read(bufs [][]byte, reads []rdma.Read) (int, error) {
	select {
	case d := <-c.in:
		reads[0] = rdma.Read{N: copy(bufs[0], d), Src: c.LocalAddr()}
		return 1, nil
	default:
	}
	return c.Conn.Read(bufs, reads)
}

func (c *tap) WriteTo(bufs [][]byte, dgrams []rdma.Datagram, dst netip.AddrPort, m rdma.Marks) error {
	start := 0
	for _, d := range dgrams {
		var all []byte
		for _, b := range bufs[start:d.End] {
			all = append(all, b...)
		}
		start = d.End
		seg := d.Seg
		if seg == 0 {
			seg = len(all)
		}
		for len(all) >= rocewire.BTHLen {
			p := all[:min(seg, len(all))]
			all = all[len(p):]
			switch rocewire.BTH(p).Opcode() {
			case rocewire.FetchAdd, rocewire.CompareSwap, rocewire.Acknowledge, rocewire.AtomicAcknowledge:
				c.mu.Lock()
				c.got = append(c.got, slices.Clone(p))
				c.mu.Unlock()
			}
		}
	}
	return c.Conn.WriteTo(bufs, dgrams, dst, m)
}

// find returns the recorded packets of opcode op to QP qpn with PSN psn
// (any PSN if psn is negative).
func (c *tap) find(op rocewire.Opcode, qpn uint32, psn int) [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [][]byte
	for _, p := range c.got {
		b := rocewire.BTH(p)
		if b.Opcode() == op && b.DestQP() == qpn && (psn < 0 || b.PSN() == uint32(psn)) {
			out = append(out, p)
		}
	}
	return out
}

// inject makes the engine read pkt (a packet sent earlier, its ICRC
// recomputed for a lone datagram) as if the network had brought it again.
func (c *tap) inject(t *testing.T, pkt []byte) {
	t.Helper()
	addr := c.LocalAddr()
	pkt = slices.Clone(pkt)
	if err := rdmatest.SealLoopback(pkt, addr.Addr()); err != nil {
		t.Fatal(err)
	}
	c.in <- pkt
	// Wake the reader: a datagram it reads after the injected one.
	probe := append(slices.Clone(pkt[:rocewire.BTHLen]), 0, 0, 0, 0)
	probe[0] = byte(rocewire.CNP)
	c.Conn.WriteTo([][]byte{probe}, []rdma.Datagram{{End: 1}}, addr, rdma.Marks{})
}

// replayEnv is an agent whose rdma engine sends to itself on addr through
// a tap and trap, and a pair of QPs between two of its VMs, connected out
// of band with a path MTU of 1024.
func replayEnv(t *testing.T, addr string) (*tap, *rdmatest.Trap, *perf.Pair) {
	t.Helper()
	trap := new(rdmatest.Trap)
	c := &tap{in: make(chan []byte, 1)}
	env := testenv.StartWith(t, testenv.Options{RDMALoop: netip.MustParseAddrPort(addr),
		RDMALoopConn: func(u rdma.Conn) rdma.Conn { c.Conn = rdmatest.Trapped(u, trap); return c }})
	v1, v2 := env.Open(t, "r1", testenv.VMOptions{MemMB: 64}), env.Open(t, "r2", testenv.VMOptions{MemMB: 64})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{BufSize: 1 << 20, MTU: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	if p.A.QP.Path().Path != vrdma.PathRDMA {
		t.Fatalf("the pair takes the %s path, want rdma", p.A.QP.Path().Path)
	}
	return c, trap, p
}

// complete posts wrs on s's QP and returns their completions, waiting at
// most 10 s.
func complete(t *testing.T, s *perf.Side, wrs ...vrdma.SendWR) []vrdma.WorkCompletion {
	t.Helper()
	if err := s.QP.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	var wc []vrdma.WorkCompletion
	buf := make([]vrdma.WorkCompletion, 16)
	for deadline := time.Now().Add(10 * time.Second); len(wc) < len(wrs); time.Sleep(100 * time.Microsecond) {
		n, err := s.CQ.Poll(buf)
		if err != nil {
			t.Fatal(err)
		}
		wc = append(wc, buf[:n]...)
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d work requests completed in 10 s: %+v", len(wc), len(wrs), wc)
		}
	}
	return wc
}

// waitPackets waits up to 2 s for at least n recorded packets of opcode
// op to QP qpn with PSN psn.
func waitPackets(t *testing.T, c *tap, op rocewire.Opcode, qpn uint32, psn uint32, n int, what string) [][]byte {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		if got := c.find(op, qpn, int(psn)); len(got) >= n {
			return got
		} else if time.Now().After(deadline) {
			t.Fatalf("%s: %d %s packets to QP %#x with PSN %#x in 2 s, want %d", what, len(got), op, qpn, psn, n)
		}
	}
}

// TestAtomicReplay runs a FETCH_ADD, then an RDMA WRITE of 300 packets,
// then brings the FETCH_ADD's request to the responder again, as a
// retransmission whose response was lost would: the responder answers
// with the first execution's original value (the replay cache it
// replaced had lost it to the 64th packet after, and stayed silent) and
// adds nothing. Then max_dest_rd_atomic more atomics, and the same
// request again: its result is no longer held, and the responder answers
// NAK invalid request (rc.NAKUnheld), executes nothing, and stays in RTS;
// the requester, which completed that atomic long ago, ignores the NAK
// and carries on.
func TestAtomicReplay(t *testing.T) {
	c, _, p := replayEnv(t, "127.0.33.40:4791")
	a, b := p.A, p.B
	aq, bq := a.QP.QPN(), b.QP.QPN()
	word := b.MR.Bytes()[0:8]
	binary.LittleEndian.PutUint64(word, 1000)
	fa := vrdma.SendWR{ID: 1, Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.MR.SGE(0, 8)},
		RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey(), CompareAdd: 5}
	if wc := complete(t, a, fa); wc[0].Status != vrdma.WCSuccess || binary.LittleEndian.Uint64(a.MR.Bytes()) != 1000 {
		t.Fatalf("FETCH_ADD: %+v, original %d, want success, 1000", wc[0], binary.LittleEndian.Uint64(a.MR.Bytes()))
	}
	reqs := c.find(rocewire.FetchAdd, bq, -1)
	if len(reqs) != 1 {
		t.Fatalf("%d FETCH_ADD requests on the wire, want 1", len(reqs))
	}
	req := reqs[0]
	psn := rocewire.BTH(req).PSN()
	waitPackets(t, c, rocewire.AtomicAcknowledge, aq, psn, 1, "the FETCH_ADD")

	const n = 300 << 10 // 300 packets of 1024 bytes
	w := vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.MR.SGE(4096, n)},
		RemoteAddr: b.MR.Addr() + 4096, RKey: b.MR.RKey()}
	if wc := complete(t, a, w); wc[0].Status != vrdma.WCSuccess {
		t.Fatalf("WRITE of 300 packets: %+v", wc[0])
	}

	c.inject(t, req)
	acks := waitPackets(t, c, rocewire.AtomicAcknowledge, aq, psn, 2, "the FETCH_ADD sent again after 300 packets")
	if orig := rocewire.AtomicAckETH(acks[1][rocewire.BTHLen+rocewire.AETHLen:]).Orig(); orig != 1000 {
		t.Fatalf("the replayed ATOMIC_ACKNOWLEDGE carries %d, want the first execution's original value 1000", orig)
	}
	if got := binary.LittleEndian.Uint64(word); got != 1005 {
		t.Fatalf("word %d after a FETCH_ADD of 5 and its duplicate, want 1005: executed twice", got)
	}

	info, err := b.QP.Query(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	depth := int(info.Attr.MaxDestRdAtomic)
	var more []vrdma.SendWR
	for i := range depth {
		more = append(more, vrdma.SendWR{ID: uint64(10 + i), Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled,
			SGL: []vrdma.SGE{a.MR.SGE(8, 8)}, RemoteAddr: b.MR.Addr() + 8, RKey: b.MR.RKey(), CompareAdd: 1})
	}
	for _, w := range complete(t, a, more...) {
		if w.Status != vrdma.WCSuccess {
			t.Fatalf("FETCH_ADD to another word: %+v", w)
		}
	}
	c.inject(t, req)
	naks := waitPackets(t, c, rocewire.Acknowledge, aq, psn, 1, "the FETCH_ADD sent again after max_dest_rd_atomic atomics")
	if s := rocewire.AETH(naks[0][rocewire.BTHLen:]).Syndrome(); s.Kind() != rocewire.KindNAK || s.Value() != rocewire.NAKInvReq {
		t.Fatalf("a duplicate atomic older than the last %d (max_dest_rd_atomic) answered with syndrome %#x, want NAK invalid request", depth, uint8(s))
	}
	if n := len(c.find(rocewire.AtomicAcknowledge, aq, int(psn))); n != 2 {
		t.Fatalf("%d ATOMIC_ACKNOWLEDGEs of the FETCH_ADD, want 2: its result was no longer held", n)
	}
	if got := binary.LittleEndian.Uint64(word); got != 1005 {
		t.Fatalf("word %d after an unheld duplicate FETCH_ADD, want 1005: executed again", got)
	}
	if s := b.QP.State(); s != vrdma.QPSRTS {
		t.Fatalf("responder in %s after refusing a duplicate, want RTS (it may be a stale copy)", s)
	}
	fa.ID = 3
	if wc := complete(t, a, fa); wc[0].Status != vrdma.WCSuccess || binary.LittleEndian.Uint64(a.MR.Bytes()) != 1005 {
		t.Fatalf("FETCH_ADD after the NAK of a stale duplicate: %+v, original %d, want success, 1005", wc[0], binary.LittleEndian.Uint64(a.MR.Bytes()))
	}
}

// TestRewindBudget drops every ATOMIC_ACKNOWLEDGE to the requester of a
// FETCH_ADD followed by a 256 KiB WRITE: the WRITE's ACKs ask for a
// go-back-N to the FETCH_ADD again and again (an implicit NAK), and
// nothing ever progresses. Each go-back-N spends a transport retry, so
// the FETCH_ADD ends RETRY_EXC_ERR within retry_cnt (7) go-back-Ns, the
// WRITE is flushed, and the QP is in ERR; before, the go-back-Ns spent
// nothing and went on forever.
func TestRewindBudget(t *testing.T) {
	c, trap, p := replayEnv(t, "127.0.33.41:4791")
	a, b := p.A, p.B
	trap.Arm(rocewire.AtomicAcknowledge, a.QP.QPN(), 1<<30)
	wc := complete(t, a,
		vrdma.SendWR{ID: 1, Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.MR.SGE(0, 8)},
			RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey(), CompareAdd: 5},
		vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{a.MR.SGE(4096, 256<<10)},
			RemoteAddr: b.MR.Addr() + 4096, RKey: b.MR.RKey()})
	if wc[0].WRID != 1 || wc[0].Status != vrdma.WCRetryExcErr || wc[1].WRID != 2 || wc[1].Status != vrdma.WCWRFlushErr {
		t.Fatalf("completions %+v, want the FETCH_ADD RETRY_EXC_ERR, then the WRITE WR_FLUSH_ERR", wc)
	}
	// The first time the WRITE is sent its ACKs acknowledge PSNs never
	// acknowledged before: progress, which reloads the budget (as rxe's
	// retry count is reloaded by an acknowledgement) if a go-back-N was
	// already taken then — a timing the race detector makes likely. Once
	// the WRITE has been acknowledged whole, nothing progresses again,
	// and retry_cnt go-back-Ns end it: at most retry_cnt+1 sends after
	// the last reload, and retry_cnt+1 before it.
	const retryCnt = 7 // QP.ConnectTo's
	sent := len(c.find(rocewire.FetchAdd, b.QP.QPN(), -1))
	if sent < 2 || sent > 2*(retryCnt+1) {
		t.Fatalf("the FETCH_ADD went out %d times, want 2 to %d: the first and one per retry, the budget reloaded at most once by the WRITE's first acknowledgements", sent, 2*(retryCnt+1))
	}
	if d := trap.Dropped(); d < 2 || d > sent {
		t.Fatalf("the trap dropped %d ATOMIC_ACKNOWLEDGEs for %d FETCH_ADD requests", d, sent)
	}
	if s := a.QP.State(); s != vrdma.QPSErr {
		t.Fatalf("requester in %s after RETRY_EXC_ERR, want ERR", s)
	}
	t.Logf("the FETCH_ADD went out %d times, the trap dropped %d answers", sent, trap.Dropped())
}
