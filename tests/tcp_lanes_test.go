// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Multi-lane tcp between two vrdmad processes: large messages striped over
// several connections keep RC's order and land exactly (TestTCPLanes), and
// a host that takes one lane gets none striped (TestTCPLanesOneSide), and
// an agent's goroutines do not grow with striped traffic
// (TestTCPLanesGoroutines).

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/fault"
	"github.com/vrdma/vrdma/internal/testenv"
)

// lanesCluster starts two hosts whose agents offer lanesA and lanesB
// lanes and stripe every message of 8 KiB or more.
func lanesCluster(t *testing.T, lanesA, lanesB int) (ha, hb *testenv.Host) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, ExtraArgs: func(h *testenv.Host) []string {
		n := lanesB
		if h.Name == "hostA" {
			n = lanesA
		}
		return []string{"--tcp-lanes", fmt.Sprint(n), "--tcp-stripe-min", "4096"}
	}})
	return c.Hosts[0], c.Hosts[1]
}

// TestTCPLanes: hostA offers 4 lanes, hostB 3; each carries its requests
// on 3. Striped WRITEs, each followed by a SEND, land before the SEND's
// receive completes; two striped WRITEs to one place leave the second's
// bytes; a striped WRITE_IMM and SEND from several SGEs land across the
// receive's SGEs; a READ behind them reads what they wrote. Both agents
// report 3 lanes and striped batches.
func TestTCPLanes(t *testing.T) {
	ha, hb := lanesCluster(t, 4, 3)
	vma := ha.Open(t, "lanes1", testenv.VMOptions{MemMB: 48})
	vmb := hb.Open(t, "lanes2", testenv.VMOptions{MemMB: 48})
	p := newFaultPair(t, vma, vmb, defaultRC, defaultRC)
	faultTraffic(t, p, 1) // connections open
	faultTraffic(t, p.reverse(), 2)
	waitLanes(t, ha, hb, 3)
	waitLanes(t, hb, ha, 3)
	for _, d := range []fpair{p, p.reverse()} {
		laneTraffic(t, d)
	}
	for _, h := range [][2]*testenv.Host{{ha, hb}, {hb, ha}} {
		u := uplinkTo(t, h[0], h[1])
		if u.Lanes != 3 || u.StripedBatches == 0 {
			t.Errorf("%s → %s: %d lanes, %d striped batches; want 3 lanes, and batches striped", h[0].Name, h[1].Name, u.Lanes, u.StripedBatches)
		}
	}
}

// laneTraffic runs the striped traffic of TestTCPLanes from p.a to p.b.
func laneTraffic(t *testing.T, p fpair) {
	t.Helper()
	const n, msg = 8, 1<<20 + 4099 // 8 WRITE+SEND pairs of a MiB and an odd tail
	src, dst := p.a.mr(t, n*msg, vrdma.AccessAll), p.b.mr(t, n*msg, vrdma.AccessAll)
	flag := p.b.mr(t, 64*n, vrdma.AccessAll)
	for k := range n {
		fill(src.Bytes()[k*msg:(k+1)*msg], uint64(100+k))
		postRecv(t, p.b.qp, vrdma.RecvWR{ID: uint64(k + 1), SGL: sgl(flag.SGE(64*k, 64))})
	}
	var wrs []vrdma.SendWR
	for k := range n {
		wrs = append(wrs,
			vrdma.SendWR{ID: uint64(1000 + k), Opcode: vrdma.OpRDMAWrite, SGL: sgl(src.SGE(k*msg, msg)), RemoteAddr: off(dst, k*msg), RKey: dst.RKey()},
			vrdma.SendWR{ID: uint64(k + 1), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(0, 8))})
	}
	postSend(t, p.a.qp, wrs...)
	// Each SEND's receive completes after its WRITE's bytes are all there.
	for k := range n {
		w := waitWC(t, p.b.rcq, 1)[0]
		expectRecv(t, w, p.b.qp, uint64(k+1), vrdma.WCRecv, 8, 0, false)
		expectBytes(t, fmt.Sprintf("striped WRITE %d when its SEND arrived", k), dst.Bytes()[k*msg:(k+1)*msg], src.Bytes()[k*msg:(k+1)*msg])
	}
	for k, w := range waitWC(t, p.a.scq, n) {
		expectWC(t, w, p.a.qp, uint64(k+1), vrdma.WCSuccess, vrdma.WCSend)
	}

	// Two striped WRITEs to one place: the second's bytes stay.
	postSend(t, p.a.qp,
		vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, SGL: sgl(src.SGE(0, msg)), RemoteAddr: off(dst, 0), RKey: dst.RKey()},
		vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(msg, msg)), RemoteAddr: off(dst, 0), RKey: dst.RKey()})
	expectWC(t, waitWC(t, p.a.scq, 1)[0], p.a.qp, 2, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	expectBytes(t, "the second of two striped WRITEs to one place", dst.Bytes()[:msg], src.Bytes()[msg:2*msg])

	// A striped WRITE_IMM and SEND from three SGEs, into a receive of
	// three SGEs; then a READ of what the WRITE_IMM wrote.
	sges := sgl(src.SGE(5, 300<<10), src.SGE(msg, 512<<10+7), src.SGE(3*msg, 200<<10))
	total := 300<<10 + 512<<10 + 7 + 200<<10
	var want []byte
	for _, s := range sges {
		o := int(s.Addr - src.Addr())
		want = append(want, src.Bytes()[o:o+int(s.Length)]...)
	}
	recvSGL := sgl(dst.SGE(4*msg, 100<<10), dst.SGE(5*msg, 700<<10), dst.SGE(6*msg, msg))
	postRecv(t, p.b.qp, vrdma.RecvWR{ID: 50, SGL: sgl(flag.SGE(0, 64))}, vrdma.RecvWR{ID: 51, SGL: recvSGL})
	postSend(t, p.a.qp,
		vrdma.SendWR{ID: 50, Opcode: vrdma.OpRDMAWriteWithImm, Imm: 0xfeedbeef, SGL: sges, RemoteAddr: off(dst, 2*msg), RKey: dst.RKey()},
		vrdma.SendWR{ID: 51, Opcode: vrdma.OpSend, SGL: sges},
		vrdma.SendWR{ID: 52, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(7*msg, total)), RemoteAddr: off(dst, 2*msg), RKey: dst.RKey()})
	expectWC(t, waitWC(t, p.a.scq, 1)[0], p.a.qp, 52, vrdma.WCSuccess, vrdma.WCRDMARead)
	expectRecv(t, waitWC(t, p.b.rcq, 1)[0], p.b.qp, 50, vrdma.WCRecvRDMAWithImm, total, 0xfeedbeef, true)
	expectRecv(t, waitWC(t, p.b.rcq, 1)[0], p.b.qp, 51, vrdma.WCRecv, total, 0, false)
	expectBytes(t, "striped WRITE_IMM", dst.Bytes()[2*msg:2*msg+total], want)
	var got []byte
	for _, s := range recvSGL {
		o := int(s.Addr - dst.Addr())
		got = append(got, dst.Bytes()[o:o+int(s.Length)]...)
	}
	expectBytes(t, "striped SEND across the receive's SGEs", got[:total], want)
	expectBytes(t, "READ behind striped requests", src.Bytes()[7*msg:7*msg+total], want)
	if err := src.Dereg(opCtx(t)); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*vrdma.MR{dst, flag} {
		if err := m.Dereg(opCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTCPLanesOneSide: hostA takes one lane (as an agent of a release
// without lanes: its HELLO offers none, and it takes none of hostB's
// offer), hostB offers 4: neither stripes, and a MiB goes on one
// connection each way.
func TestTCPLanesOneSide(t *testing.T) {
	ha, hb := lanesCluster(t, 1, 4)
	vma := ha.Open(t, "lanes3", testenv.VMOptions{MemMB: 16})
	vmb := hb.Open(t, "lanes4", testenv.VMOptions{MemMB: 16})
	p := newFaultPair(t, vma, vmb, defaultRC, defaultRC)
	for _, d := range []fpair{p, p.reverse()} {
		src, dst := d.a.mr(t, 1<<20, vrdma.AccessAll), d.b.mr(t, 1<<20, vrdma.AccessAll)
		fill(src.Bytes(), 7)
		postSend(t, d.a.qp, vrdma.SendWR{ID: 9, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 1<<20)), RemoteAddr: off(dst, 0), RKey: dst.RKey()})
		expectWC(t, waitWC(t, d.a.scq, 1)[0], d.a.qp, 9, vrdma.WCSuccess, vrdma.WCRDMAWrite)
		expectBytes(t, "a MiB on one lane", dst.Bytes(), src.Bytes())
	}
	for _, h := range [][2]*testenv.Host{{ha, hb}, {hb, ha}} {
		if u := uplinkTo(t, h[0], h[1]); u.Lanes != 1 || u.StripedBatches != 0 {
			t.Errorf("%s → %s: %d lanes, %d striped batches; want 1 lane and none striped", h[0].Name, h[1].Name, u.Lanes, u.StripedBatches)
		}
	}
}

// TestTCPLanesGoroutines: a connection's goroutines live as long as it
// and its lanes do, whatever crosses them: once two agents' connections
// are open (lanes included), striped traffic each way leaves neither
// agent with more goroutines than before it. (A lane reader made at the first
// striped request left agents with more, for as long as the connection
// lived; one blocked on a lane whose connection closed, for ever.)
func TestTCPLanesGoroutines(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOn, ExtraArgs: func(h *testenv.Host) []string {
		return []string{"--tcp-lanes", "4", "--tcp-stripe-min", "4096",
			"--metrics-listen", netip.AddrPortFrom(h.Addr(), faultMetricsPort).String(), "--metrics-pprof"}
	}})
	ha, hb := c.Hosts[0], c.Hosts[1]
	vma := ha.Open(t, "lanesg1", testenv.VMOptions{MemMB: 48})
	vmb := hb.Open(t, "lanesg2", testenv.VMOptions{MemMB: 48})
	p := newFaultPair(t, vma, vmb, defaultRC, defaultRC)
	faultTraffic(t, p, 1)           // A's connection to B open: nothing striped yet
	faultTraffic(t, p.reverse(), 2) // and B's to A
	waitLanes(t, ha, hb, 4)         // and their lanes
	waitLanes(t, hb, ha, 4)
	for _, h := range [][2]*testenv.Host{{ha, hb}, {hb, ha}} {
		if u := uplinkTo(t, h[0], h[1]); u.StripedBatches != 0 {
			t.Fatalf("%s → %s before striped traffic: %d striped batches", h[0].Name, h[1].Name, u.StripedBatches)
		}
	}
	ss := []faultSurvivor{agentSurvivor(ha), agentSurvivor(hb)}
	base := make([]fault.Resources, len(ss))
	for i, s := range ss {
		r, err := s.snap()
		if err != nil {
			t.Fatal(err)
		}
		base[i] = r
	}
	for _, d := range []fpair{p, p.reverse()} {
		laneTraffic(t, d)
	}
	for _, h := range [][2]*testenv.Host{{ha, hb}, {hb, ha}} {
		if u := uplinkTo(t, h[0], h[1]); u.StripedBatches == 0 {
			t.Errorf("%s → %s: no batch striped", h[0].Name, h[1].Name)
		}
	}
	checkLeaksWithin(t, ss, base, 5*time.Second)
}

// waitLanes waits until h's connection to peer carries its requests on
// n connections: lanes join a connection after it opened.
func waitLanes(t *testing.T, h, peer *testenv.Host, n int) {
	t.Helper()
	t0 := time.Now()
	for {
		u := uplinkTo(t, h, peer)
		if u.Lanes == n {
			return
		}
		if time.Since(t0) > waitTimeout {
			t.Fatalf("%s → %s: %d lanes after %v, want %d", h.Name, peer.Name, u.Lanes, waitTimeout, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
