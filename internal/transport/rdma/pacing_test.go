// SPDX-License-Identifier: Apache-2.0

package rdma_test

// READ responses are paced (reads.go): a long READ is sent a turn at a
// time by the engine's READ sender, round robin with the other QPs, not
// streamed whole by the engine's only reader; and a READ that loses
// packets is sent again from each loss, not whole.

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/rc"
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/testlink"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/rdma/rdmatest"
)

// paceConn is an engine's socket that watches, in the order the engine
// hands them to the socket, the READ response packets to one QP and the
// WRITE requests and ACKs of another pair: how many READ response
// packets the engine sent while each WRITE waited for its ACK. It reads
// each packet's header where the batch puts it, a piece of its own at the
// packet's start, without copying the payload.
type paceConn struct {
	rdma.Conn

	mu sync.Mutex
	// The QPs watched: the READ's requester, the WRITEs' responder and
	// requester.
	readQPN, writeQPN, ackQPN uint32
	readPkts                  int            // READ response packets sent to readQPN
	readPSNs                  map[uint32]int // how often each READ response PSN was sent
	readResent                int            // READ response packets sent again
	waiting                   map[uint32]int // a WRITE request's PSN → readPkts when it first went
	maxBehind                 int            // the most READ response packets sent while a WRITE waited for its ACK
	acked                     int            // WRITEs acknowledged
}

// watch starts watching: the READ's requester QP, and the WRITEs'
// responder and requester QPs.
func (c *paceConn) watch(readQPN, writeQPN, ackQPN uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readQPN, c.writeQPN, c.ackQPN = readQPN, writeQPN, ackQPN
	c.waiting, c.readPSNs = map[uint32]int{}, map[uint32]int{}
}

func (c *paceConn) WriteTo(bufs [][]byte, dgrams []rdma.Datagram, dst netip.AddrPort, m rdma.Marks) error {
	c.mu.Lock()
	if c.waiting != nil {
		start := 0
		for _, d := range dgrams {
			off := 0
			for _, b := range bufs[start:d.End] {
				if (off == 0 || d.Seg > 0 && off%d.Seg == 0) && len(b) >= rocewire.BTHLen {
					c.note(b)
				}
				off += len(b)
			}
			start = d.End
		}
	}
	c.mu.Unlock()
	return c.Conn.WriteTo(bufs, dgrams, dst, m)
}

// note notes the packet whose headers h starts with; c.mu is held.
func (c *paceConn) note(h []byte) {
	bth := rocewire.BTH(h)
	psn := bth.PSN()
	switch op := bth.Opcode(); {
	case bth.DestQP() == c.readQPN && op >= rocewire.RDMAReadResponseFirst && op <= rocewire.RDMAReadResponseOnly:
		c.readPkts++
		if c.readPSNs[psn] > 0 {
			c.readResent++
		}
		c.readPSNs[psn]++
	case bth.DestQP() == c.writeQPN && op == rocewire.RDMAWriteOnly:
		if _, ok := c.waiting[psn]; !ok {
			c.waiting[psn] = c.readPkts
		}
	case bth.DestQP() == c.ackQPN && op == rocewire.Acknowledge && len(h) >= rocewire.BTHLen+rocewire.AETHLen &&
		rocewire.AETH(h[rocewire.BTHLen:]).Syndrome().Kind() == rocewire.KindACK:
		for p, at := range c.waiting {
			if rc.PSNDiff(psn, p) >= 0 {
				c.maxBehind = max(c.maxBehind, c.readPkts-at)
				c.acked++
				delete(c.waiting, p)
			}
		}
	}
}

// mtu is the path MTU of pacingEnv's pairs (the loop's adapters' MTU).
const mtu = 1024

// pacingEnv is an agent whose rdma engine sends to itself on addr through
// c (and then through wrap, if not nil), with two pairs of QPs at a path
// MTU of mtu between four of its VMs: r, with size-byte buffers, and w,
// with small ones.
func pacingEnv(t *testing.T, addr string, size int, c *paceConn, wrap func(rdma.Conn) rdma.Conn) (r, w *perf.Pair) {
	t.Helper()
	env := testenv.StartWith(t, testenv.Options{RDMALoop: netip.MustParseAddrPort(addr),
		RDMALoopConn: func(u rdma.Conn) rdma.Conn {
			if wrap != nil {
				u = wrap(u)
			}
			c.Conn = u
			return c
		}})
	vms := [4]*vrdma.VM{}
	for i, name := range []string{"read1", "read2", "write1", "write2"} {
		mb := 4
		if i < 2 {
			mb = size>>20 + 16
		}
		vms[i] = env.Open(t, name, testenv.VMOptions{MemMB: mb})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	connect := func(a, b *vrdma.VM, buf int) *perf.Pair {
		p, err := perf.Connect(ctx, a.Adapters()[0], b.Adapters()[0], perf.PairConfig{BufSize: buf, MTU: mtu})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(context.Background()) })
		if p.A.QP.Path().Path != vrdma.PathRDMA {
			t.Fatalf("the pair takes the %s path, want rdma", p.A.QP.Path().Path)
		}
		if info, err := p.A.QP.Query(ctx); err != nil || info.Attr.PathMTU != mtu {
			t.Fatalf("the pair's path MTU: %+v, %v; want %d", info, err, mtu)
		}
		return p
	}
	return connect(vms[0], vms[1], size), connect(vms[2], vms[3], 1<<16)
}

// readAll is an RDMA READ of r's B side's first n bytes into its A side.
func readAll(r *perf.Pair, n int) vrdma.SendWR {
	return vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{r.A.MR.SGE(0, n)},
		RemoteAddr: r.B.MR.Addr(), RKey: r.B.MR.RKey()}
}

// TestFaultReadPacing runs an RDMA READ of 1 GiB (1,048,576 packets) on
// one pair while the other pair of the same engine WRITEs 64 bytes at a
// time, each after the one before completed. The READ is answered a turn
// of at most 256 packets at a time, round robin with the other QPs, by
// the engine's READ sender, within the requester's credit, and the reader
// goes on reading meanwhile: the WRITEs keep completing during the READ,
// and while any one of them waits for its ACK the engine sends a bounded
// number of the READ's packets — counted on the socket, not timed. Before,
// the reader streamed the whole READ before it read the next datagram:
// every WRITE that met the READ waited for all of it (and the reader's
// own socket overflowed).
func TestFaultReadPacing(t *testing.T) {
	const size = 1 << 30
	c := new(paceConn)
	r, w := pacingEnv(t, "127.0.33.44:4791", size, c, nil)
	c.watch(r.A.QP.QPN(), w.B.QP.QPN(), w.A.QP.QPN())

	if err := r.A.QP.PostSend([]vrdma.SendWR{readAll(r, size)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wr := vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{w.A.MR.SGE(0, 64)},
		RemoteAddr: w.B.MR.Addr(), RKey: w.B.MR.RKey()}
	var read *vrdma.WorkCompletion
	var writes int
	var slowest time.Duration
	wc := make([]vrdma.WorkCompletion, 1)
	for read == nil {
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("the 1 GiB READ did not complete in 2 minutes; %d WRITEs of the other pair completed meanwhile", writes)
		}
		posted := time.Now()
		if err := w.A.QP.PostSend([]vrdma.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		for {
			if n, err := r.A.CQ.Poll(wc); err != nil {
				t.Fatal(err)
			} else if n == 1 {
				read = &vrdma.WorkCompletion{}
				*read = wc[0]
			}
			n, err := w.A.CQ.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				if wc[0].Status != vrdma.WCSuccess {
					t.Fatalf("a WRITE of the other pair during the READ: %+v", wc[0])
				}
				break
			}
			if time.Since(posted) > time.Minute {
				t.Fatalf("a WRITE of the other pair waited a minute for its completion during the READ")
			}
			time.Sleep(50 * time.Microsecond)
		}
		if read == nil {
			writes++
			slowest = max(slowest, time.Since(posted))
		}
	}
	took := time.Since(start)
	if read.Status != vrdma.WCSuccess {
		t.Fatalf("the 1 GiB READ: %+v", *read)
	}
	if !bytes.Equal(r.A.MR.Bytes()[:size], r.B.MR.Bytes()[:size]) {
		t.Fatal("the 1 GiB READ's bytes differ from its source's")
	}
	c.mu.Lock()
	behind, acked, pkts, resent := c.maxBehind, c.acked, c.readPkts, c.readResent
	c.mu.Unlock()
	t.Logf("READ of 1 GiB in %v (%d response packets sent, %d of them again); %d WRITEs of the other pair completed meanwhile, the slowest in %v; at most %d READ response packets went while a WRITE waited for its ACK (%d ACKs)",
		took, pkts, resent, writes, slowest, behind, acked)
	// While a WRITE waits, the READ's packets sent before it (at most
	// one and a half credits, 768) are read ahead of it, and their
	// continuations let the sender send a few credits more: 4,096
	// packets, a 256th of the READ, is a generous bound. Before, the
	// WRITEs that met the READ waited for all of it.
	if limit := 4096; behind > limit {
		t.Errorf("%d READ response packets went while a WRITE of the other pair waited for its ACK, want at most %d (of %d): the READ is not paced and interleaved", behind, limit, size/mtu)
	}
	if writes < 10 {
		t.Errorf("%d WRITEs of the other pair completed during a READ of 1 GiB that took %v, want at least 10", writes, took)
	}
}

// TestFaultReadLoss runs an RDMA READ of 64 MiB (65,536 packets) with 1 %
// of the engine's packets lost. The requester asks again from the first
// packet lost as soon as a later one comes, and the responder goes on from
// there instead of sending the rest it had queued: each loss costs the
// packets in flight, at most one and a half credits (768), and the READ
// is sent a few times over. Before, each loss cost a local ACK timeout
// and the whole rest of the response, sent again: some hundred times the
// READ, and more the longer the READ.
func TestFaultReadLoss(t *testing.T) {
	const size = 64 << 20
	c := new(paceConn)
	var st testlink.Stats
	r, w := pacingEnv(t, "127.0.33.45:4791", size, c, func(u rdma.Conn) rdma.Conn {
		return rdmatest.Faulty(u, testlink.Faults{Drop: 0.01, Seed: 7}, &st)
	})
	c.watch(r.A.QP.QPN(), w.B.QP.QPN(), w.A.QP.QPN())
	start := time.Now()
	if err := r.A.QP.PostSend([]vrdma.SendWR{readAll(r, size)}); err != nil {
		t.Fatal(err)
	}
	got := waitOne(t, r.A, 2*time.Minute, "the 64 MiB READ with 1 % loss")
	took := time.Since(start)
	if got.Status != vrdma.WCSuccess {
		t.Fatalf("the 64 MiB READ with 1 %% loss: %+v", got)
	}
	if !bytes.Equal(r.A.MR.Bytes()[:size], r.B.MR.Bytes()[:size]) {
		t.Fatal("the 64 MiB READ's bytes differ from its source's")
	}
	c.mu.Lock()
	pkts := c.readPkts
	c.mu.Unlock()
	const want = size / mtu
	t.Logf("READ of 64 MiB with 1 %% loss in %v: %d response packets sent for %d (%.1f×)", took, pkts, want, float64(pkts)/want)
	if pkts > 16*want {
		t.Errorf("%d READ response packets sent for a READ of %d, want at most %d (16×): the READ is sent again whole, not from each loss", pkts, want, 16*want)
	}
}

// TestFaultReadDereg deregisters the region a READ of 256 MiB reads while
// its response is being sent. The READ sender holds the region one turn
// at a time and checks it again at each: the deregistration waits for the
// turn under way at most, no READ response packet leaves after it
// returned (nothing is read from a region after its deregistration), and
// the READ completes with REM_ACCESS_ERR (the responder's NAK Remote
// Access Error for the packet it could not send). Before, the reader held
// the region for the whole response, the deregistration waited for all of
// it, and the READ completed as if the region were still there.
func TestFaultReadDereg(t *testing.T) {
	const size = 256 << 20
	c := new(paceConn)
	r, w := pacingEnv(t, "127.0.33.46:4791", size, c, nil)
	c.watch(r.A.QP.QPN(), w.B.QP.QPN(), w.A.QP.QPN())
	if err := r.A.QP.PostSend([]vrdma.SendWR{readAll(r, size)}); err != nil {
		t.Fatal(err)
	}
	sent := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.readPkts
	}
	for deadline := time.Now().Add(10 * time.Second); sent() < 2*256; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d READ response packets sent in 10 s", sent())
		}
	}
	if err := r.B.MR.Dereg(t.Context()); err != nil {
		t.Fatal(err)
	}
	after := sent()
	if wc := waitOne(t, r.A, time.Minute, "the READ whose region was deregistered"); wc.Status != vrdma.WCRemAccessErr {
		t.Errorf("the READ whose region was deregistered while its response was sent: %+v, want REM_ACCESS_ERR", wc)
	}
	if now := sent(); now != after {
		t.Errorf("%d READ response packets left after the deregistration returned, want none", now-after)
	}
	if after >= size/mtu {
		t.Errorf("the whole READ (%d packets) went before the deregistration returned: it waited for the whole response", after)
	}
	t.Logf("deregistered after %d of %d READ response packets", after, size/mtu)
	r.B.MR = nil // deregistered: the pair's Close leaves it
}

// waitOne waits up to d for a completion on s's CQ and returns it.
func waitOne(t *testing.T, s *perf.Side, d time.Duration, what string) vrdma.WorkCompletion {
	t.Helper()
	wc := make([]vrdma.WorkCompletion, 1)
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Microsecond) {
		n, err := s.CQ.Poll(wc)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not complete in %v", what, d)
		}
	}
}
