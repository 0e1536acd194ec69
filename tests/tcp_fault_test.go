// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Fault tests of the tcp path: a cut link, a flapping
// link, a peer agent killed with SIGKILL, a peer agent restarted under an
// idle connection, and a stopped receiver (back pressure). Each test runs
// its own cluster of two vrdmad processes (testenv.StartCluster): as root
// each host is a network namespace on a bridge, and the link tests cut a
// host's interface (ip link set eth0 down); when not root the link tests
// are skipped and the others run on loopback addresses.
//
// Bounds. A WR over the tcp path waits retryTimeout(timeout) =
// 4.096 µs × 2^timeout for its response and the QP makes retry_cnt
// retries (go-back-N from the oldest WR in flight), so a WR to a dead peer
// must fail after about timeout × (retry_cnt+1). The tests do
// not measure performance: they assert that the failure comes no sooner
// than timeout × retry_cnt and no later than faultBound, ten times the
// budget plus 2 s, which a loaded 2-core CI machine meets.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/testenv"
)

// ibTimeout is IBTA's local ACK timeout, 4.096 µs × 2^t, as the agent
// reads the QP's timeout attribute.
func ibTimeout(t uint8) time.Duration { return time.Duration(4096<<t) * time.Nanosecond }

// retryBudget is how long a requester tries before RETRY_EXC_ERR: one
// attempt and retry_cnt retries, each waiting the timeout.
func retryBudget(p rcParams) time.Duration {
	return ibTimeout(p.timeout) * time.Duration(p.retryCnt+1)
}

// faultBound is the upper bound the tests allow for a WR to a dead peer to
// fail: ten times its retry budget plus 2 s of slack for a loaded machine.
func faultBound(p rcParams) time.Duration { return 10*retryBudget(p) + 2*time.Second }

// rcWith returns the default RC attributes with timeout and retry_cnt.
func rcWith(timeout, retryCnt uint8) rcParams {
	p := defaultRC
	p.timeout, p.retryCnt = timeout, retryCnt
	return p
}

// faultMR is the size of each end's memory region; the tests use fixed
// offsets in it (faultTraffic: the first 20 KiB).
const faultMR = 64 << 10

// fpair is a connected pair across two hosts, each end with a registered
// region of faultMR bytes.
type fpair struct {
	a, b   *end
	ma, mb *vrdma.MR
}

// reverse returns the pair seen from b.
func (p fpair) reverse() fpair { return fpair{a: p.b, b: p.a, ma: p.mb, mb: p.ma} }

// newFaultPair creates a QP in vma and one in vmb, each in a new PD with a
// region, and connects them out of band with attributes pa and pb. Both
// must report the tcp path.
func newFaultPair(t *testing.T, vma, vmb *vrdma.VM, pa, pb rcParams) fpair {
	t.Helper()
	a, b := newEnd(t, vma, qpConfig{}), newEnd(t, vmb, qpConfig{})
	ctx := opCtx(t)
	if err := modifyToRTS(ctx, a.qp, a.ad, b.qp.Endpoint(), pa); err != nil {
		t.Fatal(err)
	}
	if err := modifyToRTS(ctx, b.qp, b.ad, a.qp.Endpoint(), pb); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*end{a, b} {
		if st := e.qp.State(); st != vrdma.QPSRTS {
			t.Fatalf("QP 0x%x is in %s after connecting, want RTS", e.qp.QPN(), st)
		}
		if p := e.qp.Path(); p.Path != vrdma.PathTCP {
			t.Fatalf("QP 0x%x of VM %s reports path %q (%s), want tcp", e.qp.QPN(), e.vm.Name(), p.Path, p.Reason)
		}
	}
	return fpair{a: a, b: b, ma: a.mr(t, faultMR, vrdma.AccessAll), mb: b.mr(t, faultMR, vrdma.AccessAll)}
}

// faultTraffic runs a WRITE, a SEND and a READ from p.a to p.b and checks
// the data at the far end of each. It uses [0, 20K) of both regions.
func faultTraffic(t *testing.T, p fpair, seed uint64) {
	t.Helper()
	src, dst := p.ma.Bytes(), p.mb.Bytes()
	id := seed * 100
	fill(src[0:4096], seed)
	postSend(t, p.a.qp, vrdma.SendWR{ID: id + 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
		SGL: sgl(p.ma.SGE(0, 4096)), RemoteAddr: off(p.mb, 0), RKey: p.mb.RKey()})
	expectWC(t, waitWC(t, p.a.scq, 1)[0], p.a.qp, id+1, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	expectBytes(t, "WRITE", dst[0:4096], src[0:4096])

	fill(src[4096:5096], seed+1)
	postRecv(t, p.b.qp, vrdma.RecvWR{ID: id + 2, SGL: sgl(p.mb.SGE(8192, 4096))})
	postSend(t, p.a.qp, vrdma.SendWR{ID: id + 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(4096, 1000))})
	expectWC(t, waitWC(t, p.a.scq, 1)[0], p.a.qp, id+2, vrdma.WCSuccess, vrdma.WCSend)
	expectRecv(t, waitWC(t, p.b.rcq, 1)[0], p.b.qp, id+2, vrdma.WCRecv, 1000, 0, false)
	expectBytes(t, "SEND", dst[8192:9192], src[4096:5096])

	fill(dst[16384:18432], seed+2)
	postSend(t, p.a.qp, vrdma.SendWR{ID: id + 3, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled,
		SGL: sgl(p.ma.SGE(16384, 2048)), RemoteAddr: off(p.mb, 16384), RKey: p.mb.RKey()})
	expectWC(t, waitWC(t, p.a.scq, 1)[0], p.a.qp, id+3, vrdma.WCSuccess, vrdma.WCRDMARead)
	expectBytes(t, "READ", src[16384:18432], dst[16384:18432])
}

// waitWCWithin returns n completions of cq, failing the test if they take
// longer than bound, and how long they took since t0.
func waitWCWithin(t *testing.T, cq *vrdma.CQ, n int, t0 time.Time, bound time.Duration, what string) ([]vrdma.WorkCompletion, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithDeadline(t.Context(), t0.Add(bound))
	defer cancel()
	wc, err := pollN(ctx, cq, n)
	if err != nil {
		t.Fatalf("%s: no completion within %v: %v (got %s)", what, bound, err, fmtWCs(wc))
	}
	return wc, time.Since(t0)
}

// expectFailedWithin checks that the QP's next completion, for WR id, is
// RETRY_EXC_ERR, arriving between timeout × retry_cnt and faultBound
// after t0, and that the QP is then in ERR.
func expectFailedWithin(t *testing.T, e *end, id uint64, p rcParams, t0 time.Time, what string) time.Duration {
	t.Helper()
	wc, took := waitWCWithin(t, e.scq, 1, t0, faultBound(p), what)
	expectWC(t, wc[0], e.qp, id, vrdma.WCRetryExcErr, 0)
	if low := ibTimeout(p.timeout) * time.Duration(p.retryCnt); took < low {
		t.Errorf("%s: RETRY_EXC_ERR after %v, sooner than timeout × retry_cnt = %v: the QP did not retry", what, took, low)
	}
	t.Logf("%s: RETRY_EXC_ERR after %v (timeout %v × (retry_cnt %d + 1) = %v, bound %v)", what, took.Round(time.Millisecond),
		ibTimeout(p.timeout), p.retryCnt, retryBudget(p), faultBound(p))
	expectState(t, e.qp, vrdma.QPSErr)
	return took
}

// agentStatus returns the status of h's agent.
func agentStatus(t *testing.T, h *testenv.Host) vrdma.Status {
	t.Helper()
	return statusAt(t, h.Name, h.Socket)
}

// statusAt returns the status of the agent at socket (name, for messages).
func statusAt(t *testing.T, name, socket string) vrdma.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(socket))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer a.Close()
	st, err := a.Status(ctx)
	if err != nil {
		t.Fatalf("%s: status: %v", name, err)
	}
	return st
}

// uplinkTo returns h's agent's view of its link to peer.
func uplinkTo(t *testing.T, h, peer *testenv.Host) mgmt.UplinkStatus {
	t.Helper()
	st := agentStatus(t, h)
	for _, u := range st.Uplinks {
		if u.PeerHostID == peer.ID() {
			return u
		}
	}
	t.Fatalf("%s's status has no uplink to %s (%s): %+v", h.Name, peer.Name, peer.ID(), st.Uplinks)
	return mgmt.UplinkStatus{}
}

// waitReach waits until from reaches to's address again (a TCP connect to
// a closed port is refused), after a LinkUp.
func waitReach(t *testing.T, from, to *testenv.Host) {
	t.Helper()
	addr := netip.AddrPortFrom(to.Addr(), 1).String()
	t0 := time.Now()
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		c, err := from.Dial(ctx, "tcp", addr)
		cancel()
		if err == nil {
			c.Close()
		}
		if err == nil || errors.Is(err, syscall.ECONNREFUSED) {
			t.Logf("%s reaches %s %v after link up", from.Name, to.Name, time.Since(t0).Round(time.Millisecond))
			return
		}
		if time.Since(t0) > waitTimeout {
			t.Fatalf("%s does not reach %s %v after link up: %v", from.Name, to.Name, waitTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitOrphansGone waits until h's namespace holds no TCP socket towards
// peer's PVRDMA address that still has data or a FIN to deliver: a
// connection the agent closed while the link was down lives on in the
// kernel (orphaned) and retransmits what it held once the link is up.
// When it returns, nothing sent before can still arrive at peer.
func waitOrphansGone(t *testing.T, h, peer *testenv.Host, limit time.Duration) {
	t.Helper()
	t0 := time.Now()
	dst := peer.PVRDMAAddress.String()
	for {
		out, err := h.Exec("ss", "-tanH")
		if err != nil {
			t.Fatalf("%s: ss: %v\n%s", h.Name, err, out)
		}
		var pending []string
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) < 5 || f[4] != dst {
				continue
			}
			sendQ, _ := strconv.Atoi(f[2])
			switch {
			case f[0] == "FIN-WAIT-1", f[0] == "LAST-ACK", f[0] == "CLOSING", sendQ > 0:
				pending = append(pending, l)
			}
		}
		if len(pending) == 0 {
			t.Logf("%s: no socket to %s has anything left to deliver (%v)", h.Name, dst, time.Since(t0).Round(time.Millisecond))
			return
		}
		if time.Since(t0) > limit {
			t.Logf("%s: after %v, sockets to %s still have data to deliver:\n%s", h.Name, limit, dst, strings.Join(pending, "\n"))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procKB returns field (VmRSS, RssAnon, ...) of /proc/PID/status, in kB.
func procKB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status: %q: %v", pid, l, err)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// TestTCPFaultLinkDown cuts host B's link under a connected pair whose
// WRs are then in flight: the oldest fails with RETRY_EXC_ERR once
// timeout × retry_cnt is spent, the QP moves to ERR, the rest flushes and
// so does a WR posted later. The application resets the pair and connects
// it again while the link is down. Once the link is back, a new pair works,
// and so does the reconnected one: its data arrives intact, and nothing of
// what its previous connection left in flight executes in the new one.
func TestTCPFaultLinkDown(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOn})
	ha, hb := c.Hosts[0], c.Hosts[1]
	vma := ha.Open(t, "ld1", testenv.VMOptions{MemMB: 16})
	vmb := hb.Open(t, "ld2", testenv.VMOptions{MemMB: 16})
	// Traffic works between the hosts; it opens A's connection to B, on
	// which the WRs posted during the cut go out.
	p0 := newFaultPair(t, vma, vmb, defaultRC, defaultRC)
	faultTraffic(t, p0, 1)
	before := uplinkTo(t, ha, hb)

	// timeout 12 (16.8 ms) rather than 10 (4 ms): the semantics are the
	// same, and a loaded 2-core machine may delay a response by a few ms.
	short := rcWith(12, 3)
	p := newFaultPair(t, vma, vmb, short, short)
	// B's region: [32K,36K) is the target of WR 1 (a WRITE), [40K,44K)
	// of WR 3 (a WRITE), [48K,52K) the receive for WR 2 (a SEND).
	src, dst := p.ma.Bytes(), p.mb.Bytes()
	fill(src[32<<10:52<<10], 7)
	postRecv(t, p.b.qp, vrdma.RecvWR{ID: 900, SGL: sgl(p.mb.SGE(48<<10, 4096))})
	snapshot := clone(dst)

	hb.LinkDown(t)
	t0 := time.Now()
	postSend(t, p.a.qp,
		vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(32<<10, 4096)),
			RemoteAddr: off(p.mb, 32<<10), RKey: p.mb.RKey()},
		vrdma.SendWR{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(48<<10, 4096))},
		vrdma.SendWR{ID: 3, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(40<<10, 4096)),
			RemoteAddr: off(p.mb, 40<<10), RKey: p.mb.RKey()})
	expectFailedWithin(t, p.a, 1, short, t0, "WRITE with B's link down")
	wc := waitWC(t, p.a.scq, 2)
	expectWC(t, wc[0], p.a.qp, 2, vrdma.WCWRFlushErr, 0)
	expectWC(t, wc[1], p.a.qp, 3, vrdma.WCWRFlushErr, 0)
	postSend(t, p.a.qp, vrdma.SendWR{ID: 4, Opcode: vrdma.OpSend, SGL: sgl(p.ma.SGE(0, 8))})
	expectWC(t, waitWC(t, p.a.scq, 1)[0], p.a.qp, 4, vrdma.WCWRFlushErr, 0)
	expectState(t, p.a.qp, vrdma.QPSErr)
	if u := uplinkTo(t, ha, hb); u.State == "up" || u.LastError == "" {
		t.Errorf("%s's uplink to %s with the link cut and the WR failed: state %q, last error %q; want not up, with the reason",
			ha.Name, hb.Name, u.State, u.LastError)
	} else {
		t.Logf("%s's uplink to %s, link cut: state %s, last error %q", ha.Name, hb.Name, u.State, u.LastError)
	}
	expectBytes(t, "B's memory while the link is down", dst, snapshot)

	// The application resets the failed pair and connects it again, the
	// endpoints exchanged out of band, while the link is still down.
	ctx := opCtx(t)
	for _, e := range []*end{p.a, p.b} {
		if err := e.qp.Modify(ctx, &vrdma.QPAttr{State: vrdma.QPSReset}, vrdma.MaskState); err != nil {
			t.Fatal(err)
		}
	}
	if err := modifyToRTS(ctx, p.a.qp, p.a.ad, p.b.qp.Endpoint(), defaultRC); err != nil {
		t.Fatal(err)
	}
	if err := modifyToRTS(ctx, p.b.qp, p.b.ad, p.a.qp.Endpoint(), defaultRC); err != nil {
		t.Fatal(err)
	}

	hb.LinkUp(t)
	waitReach(t, ha, hb)
	// A new pair between the same VMs.
	p2 := newFaultPair(t, vma, vmb, defaultRC, defaultRC)
	faultTraffic(t, p2, 2)
	faultTraffic(t, p2.reverse(), 3)
	after := uplinkTo(t, ha, hb)
	if after.State != "up" || after.Dials <= before.Dials {
		t.Errorf("%s's uplink to %s after link up: state %q, %d dials (%d before the cut); want up with a new dial",
			ha.Name, hb.Name, after.State, after.Dials, before.Dials)
	}

	// What A's kernel still held for the connection A closed during the
	// cut (its requests for WRs 1-3) reaches B now, if it is ever to.
	// Nothing of it may execute in the pair's new connection.
	waitOrphansGone(t, ha, hb, 10*time.Second)
	time.Sleep(50 * time.Millisecond) // B's reader executes what arrived
	what := func(b []byte) string {
		switch string(b) {
		case string(snapshot[32<<10 : 36<<10]), string(snapshot[40<<10 : 44<<10]), string(snapshot[48<<10 : 52<<10]):
			return "what it held before the cut"
		case string(src[32<<10 : 36<<10]):
			return "the payload of WR 1, the WRITE that failed with RETRY_EXC_ERR"
		case string(src[40<<10 : 44<<10]):
			return "the payload of WR 3, a WRITE flushed"
		case string(src[48<<10 : 52<<10]):
			return "the payload of WR 2, a SEND flushed"
		}
		return "bytes of none of the WRs (torn or misplaced data)"
	}
	for _, r := range []struct {
		name   string
		lo, hi int
	}{{"WR 1's target", 32 << 10, 36 << 10}, {"WR 3's target", 40 << 10, 44 << 10}, {"the receive buffer of WR 2", 48 << 10, 52 << 10}} {
		if got := dst[r.lo:r.hi]; string(got) != string(snapshot[r.lo:r.hi]) {
			t.Errorf("B's memory at %s changed after the pair was reset and reconnected: it holds %s. "+
				"A request of the pair's previous connection, which A gave up on during the cut, executed in the new connection",
				r.name, what(got))
		}
	}
	expectBytes(t, "the rest of B's region", append(clone(dst[:32<<10]), dst[52<<10:]...), append(clone(snapshot[:32<<10]), snapshot[52<<10:]...))
	expectNoWC(t, p.b.rcq, 0, "B's receive CQ of the reconnected pair, which has no receive posted")

	// The reconnected pair works, and its data arrives intact.
	fill(src[20<<10:24<<10], 11)
	postSend(t, p.a.qp, vrdma.SendWR{ID: 50, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(20<<10, 4096)),
		RemoteAddr: off(p.mb, 20<<10), RKey: p.mb.RKey()})
	expectWC(t, waitWC(t, p.a.scq, 1)[0], p.a.qp, 50, vrdma.WCSuccess, vrdma.WCRDMAWrite)
	if string(dst[20<<10:24<<10]) != string(src[20<<10:24<<10]) {
		t.Errorf("the reconnected pair's first WRITE (PSN 0x%x) completed successfully, but its data is not in B's memory: "+
			"B answered it as a duplicate of a request with the same PSN that the pair's previous connection left in flight", p.a.qp.Endpoint().PSN)
	}
	faultTraffic(t, p, 4)
	faultTraffic(t, p.reverse(), 5)
}

// TestTCPFaultLinkFlap cuts host B's link for less than the QPs' retry
// budget and longer than one TCP retransmission timeout (host A then
// closes its connection and dials again; a shorter cut TCP repairs
// alone): the WRs posted during the cut complete successfully once the
// link is back, each exactly once — a SEND retried over a new connection
// consumes one receive, an atomic retried adds once — in order.
func TestTCPFaultLinkFlap(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOn})
	ha, hb := c.Hosts[0], c.Hosts[1]
	vma := ha.Open(t, "lf1", testenv.VMOptions{MemMB: 16})
	vmb := hb.Open(t, "lf2", testenv.VMOptions{MemMB: 16})
	prm := rcWith(14, 7) // 67 ms × 8 attempts
	const cut = 450 * time.Millisecond
	if cut >= ibTimeout(prm.timeout)*time.Duration(prm.retryCnt) {
		t.Fatalf("the cut (%v) must be shorter than timeout × retry_cnt", cut)
	}
	p := newFaultPair(t, vma, vmb, prm, prm)
	faultTraffic(t, p, 1)
	src, dst := p.ma.Bytes(), p.mb.Bytes()
	const msg, slot, slots = 512, 1024, 16
	const base = 32 << 10    // receive buffers in B's region, [32K, 48K)
	const results = 48 << 10 // the FETCH_ADDs' results in A's region
	const counter = 60 << 10 // the FETCH_ADDs' target in B's region
	const sends = 5          // SENDs per round
	put64(dst[counter:], 1000)

	// B's receives, oldest first. B keeps sends+2 posted: two spare
	// receives are there for a duplicate to consume, so that delivering a
	// message twice would show as an extra receive completion.
	type recv struct {
		id  uint64
		off int
	}
	var posted []recv
	nextRecv := uint64(1000)
	for round, first := range []vrdma.Opcode{vrdma.OpSend, vrdma.OpAtomicFetchAdd} {
		t.Run("in-flight-"+first.String(), func(t *testing.T) {
			before := uplinkTo(t, ha, hb)
			for len(posted) < sends+2 {
				r := recv{nextRecv, base + int(nextRecv%slots)*slot}
				postRecv(t, p.b.qp, vrdma.RecvWR{ID: r.id, SGL: sgl(p.mb.SGE(r.off, slot))})
				posted = append(posted, r)
				nextRecv++
			}
			// All of the round's WRs go out during the cut (a QP keeps a
			// window of requests in flight) and are sent again from the
			// oldest once the link is back. The oldest is a SEND in one
			// round, a FETCH_ADD in the other.
			var wrs []vrdma.SendWR
			var msgs [][]byte
			wantOld := le64(dst[counter:])
			adds := 0
			add := func(op vrdma.Opcode) {
				id := uint64(len(wrs) + 1)
				wr := vrdma.SendWR{ID: id, Opcode: op, Flags: vrdma.SendSignaled}
				if op == vrdma.OpAtomicFetchAdd {
					wr.SGL, wr.RemoteAddr, wr.RKey, wr.CompareAdd = sgl(p.ma.SGE(results+8*int(id), 8)), off(p.mb, counter), p.mb.RKey(), 1
					adds++
				} else {
					o := int(id) * slot // sources in A's region, [1K, 16K)
					fill(src[o:o+msg], uint64(100*round)+id)
					wr.SGL = sgl(p.ma.SGE(o, msg))
					msgs = append(msgs, src[o:o+msg])
				}
				wrs = append(wrs, wr)
			}
			if first == vrdma.OpAtomicFetchAdd {
				add(vrdma.OpAtomicFetchAdd)
			}
			for range sends {
				add(vrdma.OpSend)
			}
			add(vrdma.OpAtomicFetchAdd)

			hb.LinkDown(t)
			t0 := time.Now()
			postSend(t, p.a.qp, wrs...)
			time.Sleep(cut)
			hb.LinkUp(t)
			wc, took := waitWCWithin(t, p.a.scq, len(wrs), t0, faultBound(prm), "WRs posted during the cut")
			t.Logf("%d WRs posted during a %v cut completed %v after the post", len(wrs), cut, took.Round(time.Millisecond))
			seen := 0
			for i, w := range wc {
				op := wrs[i].Opcode
				expectWC(t, w, p.a.qp, wrs[i].ID, vrdma.WCSuccess, wcOpcode(op))
				if op == vrdma.OpAtomicFetchAdd {
					if got, want := le64(src[results+8*int(wrs[i].ID):]), wantOld+uint64(seen); got != want {
						t.Errorf("FETCH_ADD %d returned %d, want %d", wrs[i].ID, got, want)
					}
					seen++
				}
			}
			expectState(t, p.a.qp, vrdma.QPSRTS)
			for i, w := range waitWC(t, p.b.rcq, sends) {
				r := posted[0]
				posted = posted[1:]
				expectRecv(t, w, p.b.qp, r.id, vrdma.WCRecv, msg, 0, false)
				expectBytes(t, fmt.Sprintf("message %d", i), dst[r.off:r.off+msg], msgs[i])
			}
			// Whatever the cut held back in the kernel (the request on the
			// connection A closed) arrives now: a duplicate, it must
			// execute nothing.
			waitOrphansGone(t, ha, hb, 10*time.Second)
			expectNoWC(t, p.b.rcq, 3*quiet, "receives beyond the messages sent (a message delivered twice)")
			if got := le64(dst[counter:]); got != wantOld+uint64(adds) {
				t.Errorf("the counter is %d after %d FETCH_ADDs of 1 from %d: an atomic executed twice", got, adds, wantOld)
			}
			after := uplinkTo(t, ha, hb)
			if after.State != "up" || after.Dials <= before.Dials {
				t.Errorf("%s's uplink to %s after the flap: state %q, %d dials (%d before); want up with a new dial",
					ha.Name, hb.Name, after.State, after.Dials, before.Dials)
			}
		})
		if t.Failed() {
			return
		}
	}
}

// TestTCPFaultPeerKilled kills host B's agent (SIGKILL) while host A has a
// SEND outstanding (waiting for a receive at B) and more posted behind
// it: they complete with RETRY_EXC_ERR and WR_FLUSH_ERR within the QP's
// retry budget, and the QP is in ERR. Once B's agent is back, a new VM on
// B and a new connection from A work, and A's agent shows its link to B
// up again after a new dial.
func TestTCPFaultPeerKilled(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2})
	t.Logf("hosts in network namespaces: %v %s", c.Netns, c.NoNetnsReason)
	ha, hb := c.Hosts[0], c.Hosts[1]
	vma := ha.Open(t, "pk1", testenv.VMOptions{MemMB: 16})
	vmb := hb.Open(t, "pk2", testenv.VMOptions{MemMB: 16})
	pa, pb := rcWith(12, 3), rcWith(12, 3)
	pa.rnrRetry, pb.minRNRTimer = 7, 14 // SENDs wait for receives, retrying every 1.28 ms
	p := newFaultPair(t, vma, vmb, pa, pb)
	faultTraffic(t, p, 1)
	before := uplinkTo(t, ha, hb)

	fill(p.ma.Bytes()[0:4096], 9)
	postSend(t, p.a.qp,
		vrdma.SendWR{ID: 1, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(0, 512))},
		vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(0, 4096)),
			RemoteAddr: off(p.mb, 0), RKey: p.mb.RKey()},
		vrdma.SendWR{ID: 3, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(p.ma.SGE(0, 512))})
	expectNoWC(t, p.a.scq, 3*quiet, "a SEND waiting for a receive (rnr_retry 7)")

	pid := hb.Pid()
	t0 := time.Now()
	hb.Kill()
	t.Logf("%s's agent (pid %d) killed in %v", hb.Name, pid, time.Since(t0).Round(time.Millisecond))
	expectFailedWithin(t, p.a, 1, pa, t0, "SEND outstanding when the peer agent was killed")
	wc := waitWC(t, p.a.scq, 2)
	expectWC(t, wc[0], p.a.qp, 2, vrdma.WCWRFlushErr, 0)
	expectWC(t, wc[1], p.a.qp, 3, vrdma.WCWRFlushErr, 0)
	if u := uplinkTo(t, ha, hb); u.State == "up" {
		t.Errorf("%s's uplink to %s with %s's agent dead: state %q, want not up", ha.Name, hb.Name, hb.Name, u.State)
	}

	// B's agent back, under a new lease; its VMs are gone with it.
	hb.ExpireLease(t)
	c.WaitHost(t, hb, records.HostDown, 5*time.Second)
	t1 := time.Now()
	hb.Restart(t)
	c.WaitHost(t, hb, records.HostUp, 10*time.Second)
	t.Logf("%s's agent restarted in %v", hb.Name, time.Since(t1).Round(time.Millisecond))
	vmb2 := hb.Open(t, "pk3", testenv.VMOptions{MemMB: 16})
	p2 := newFaultPair(t, vma, vmb2, defaultRC, defaultRC)
	faultTraffic(t, p2, 2)
	faultTraffic(t, p2.reverse(), 3)
	after := uplinkTo(t, ha, hb)
	if after.State != "up" || after.Dials <= before.Dials {
		t.Errorf("%s's uplink to %s after %s's restart: state %q, %d dials (%d before the kill); want up with a new dial",
			ha.Name, hb.Name, hb.Name, after.State, after.Dials, before.Dials)
	}
	t.Logf("%s's uplink to %s: %+v", ha.Name, hb.Name, after)
}

// TestTCPFaultStaleAfterRestart restarts host B's agent while host A holds
// idle connections with it (both directions): the first WR of a new pair
// after the restart works at once — the stale connection is detected and
// replaced, not waited on — A notices the new boot of B's agent, and a WR
// of a pair made before the restart, whose QP at B is gone, fails with
// RETRY_EXC_ERR. B is restarted three ways: stopped (SIGTERM), killed
// (SIGKILL), and killed with its link cut, so that A never hears of the
// connections' end and finds them stale (root only).
func TestTCPFaultStaleAfterRestart(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2})
	t.Logf("hosts in network namespaces: %v %s", c.Netns, c.NoNetnsReason)
	ha, hb := c.Hosts[0], c.Hosts[1]
	vma := ha.Open(t, "sr0", testenv.VMOptions{MemMB: 16})
	prm := rcWith(12, 3) // 16.8 ms × 4 attempts
	variants := []struct {
		name    string
		restart func(t *testing.T)
	}{
		{"stop", func(t *testing.T) {
			hb.Stop(t)
			hb.Restart(t)
		}},
		{"kill", func(t *testing.T) {
			hb.Kill()
			hb.ExpireLease(t)
			hb.Restart(t)
		}},
		{"kill-link-down", func(t *testing.T) {
			// B's kernel closes the dead agent's connections while the
			// link is down: A never sees their FIN (until a retransmit
			// gets through, seconds later).
			hb.LinkDown(t)
			hb.Kill()
			hb.ExpireLease(t)
			hb.Restart(t)
			hb.LinkUp(t)
			waitReach(t, ha, hb)
		}},
	}
	for i, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			if v.name == "kill-link-down" && !c.Netns {
				t.Skipf("cutting the link needs the hosts in network namespaces: %s", c.NoNetnsReason)
			}
			vmb := hb.Open(t, fmt.Sprintf("sr%da", i+1), testenv.VMOptions{MemMB: 16})
			old := newFaultPair(t, vma, vmb, prm, prm)
			faultTraffic(t, old, 1)
			faultTraffic(t, old.reverse(), 2)
			before := uplinkTo(t, ha, hb)
			if before.State != "up" || before.Conns < 2 {
				t.Fatalf("%s's uplink to %s after traffic both ways: state %q, %d connections; want up with 2", ha.Name, hb.Name, before.State, before.Conns)
			}
			noticed := strings.Count(ha.Stderr(), "peer agent restarted")

			t0 := time.Now()
			v.restart(t)
			c.WaitHost(t, hb, records.HostUp, 10*time.Second)
			t.Logf("%s restarted in %v", hb.Name, time.Since(t0).Round(time.Millisecond))

			vmb2 := hb.Open(t, fmt.Sprintf("sr%db", i+1), testenv.VMOptions{MemMB: 16})
			p := newFaultPair(t, vma, vmb2, prm, prm)
			// What A holds now: with B's link cut at the kill, the dead
			// agent's connections usually still look open to A.
			u := uplinkTo(t, ha, hb)
			t.Logf("before the first WR, %s's uplink to %s: state %s, %d connections open, %d dials (%d before the restart)",
				ha.Name, hb.Name, u.State, u.Conns, u.Dials, before.Dials)
			src, dst := p.ma.Bytes(), p.mb.Bytes()
			fill(src[0:4096], 3)
			t1 := time.Now()
			postSend(t, p.a.qp, vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
				SGL: sgl(p.ma.SGE(0, 4096)), RemoteAddr: off(p.mb, 0), RKey: p.mb.RKey()})
			wc, took := waitWCWithin(t, p.a.scq, 1, t1, faultBound(prm), "the first WR after the restart")
			expectWC(t, wc[0], p.a.qp, 1, vrdma.WCSuccess, vrdma.WCRDMAWrite)
			expectBytes(t, "the first WRITE after the restart", dst[0:4096], src[0:4096])
			t.Logf("the first WR after the restart completed in %v (timeout %v)", took.Round(time.Millisecond), ibTimeout(prm.timeout))
			faultTraffic(t, p, 4)
			faultTraffic(t, p.reverse(), 5)

			after := uplinkTo(t, ha, hb)
			if after.State != "up" || after.Dials <= before.Dials {
				t.Errorf("%s's uplink to %s after the restart: state %q, %d dials (%d before); want up with a new dial",
					ha.Name, hb.Name, after.State, after.Dials, before.Dials)
			}
			if n := strings.Count(ha.Stderr(), "peer agent restarted"); n <= noticed {
				t.Errorf("%s's agent did not log that %s's agent restarted (a new boot ID in the handshake)", ha.Name, hb.Name)
			}

			// The old pair's QP at B died with B's agent: A's requests get
			// no answer from it, and the WR fails after the retries.
			t2 := time.Now()
			postSend(t, old.a.qp, vrdma.SendWR{ID: 7, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
				SGL: sgl(old.ma.SGE(0, 64)), RemoteAddr: off(old.mb, 0), RKey: old.mb.RKey()})
			expectFailedWithin(t, old.a, 7, prm, t2, "a WR to a QP of B's previous agent")
		})
	}
}

// TestTCPBackPressure floods SENDs at receivers that post no receives,
// with rnr_retry 7 (retry forever): the senders wait — no completion —
// and neither agent's memory grows while they do; once the receivers post
// receives, every message arrives, once, in order.
func TestTCPBackPressure(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2})
	t.Logf("hosts in network namespaces: %v %s", c.Netns, c.NoNetnsReason)
	ha, hb := c.Hosts[0], c.Hosts[1]
	const qps, wrs, msg = 2, 256, 32 << 10 // 16 MiB posted
	vma := ha.Open(t, "bp1", testenv.VMOptions{MemMB: 48})
	vmb := hb.Open(t, "bp2", testenv.VMOptions{MemMB: 48})
	pa, pb := defaultRC, defaultRC
	pa.rnrRetry, pb.minRNRTimer = 7, 22 // the receivers ask for 20 ms between tries
	type side struct {
		p        fpair
		src, dst *vrdma.MR
	}
	var sides []side
	for i := range qps {
		p := newFaultPair(t, vma, vmb, pa, pb)
		faultTraffic(t, p, uint64(i+1)) // connections open
		sides = append(sides, side{p: p, src: p.a.mr(t, wrs*msg, vrdma.AccessAll), dst: p.b.mr(t, wrs*msg, vrdma.AccessAll)})
	}
	for i, s := range sides {
		for k := range wrs {
			fill(s.src.Bytes()[k*msg:(k+1)*msg], uint64(1000*i+k))
		}
	}
	for _, s := range sides {
		batch := make([]vrdma.SendWR, wrs)
		for k := range batch {
			batch[k] = vrdma.SendWR{ID: uint64(k + 1), Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(s.src.SGE(k*msg, msg))}
		}
		postSend(t, s.p.a.qp, batch...)
	}
	// Nothing completes on either side while the receivers post nothing.
	pressure := func(d time.Duration) {
		t.Helper()
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			for _, s := range sides {
				expectNoWC(t, s.p.a.scq, 0, "a SEND to a receiver that posted no receive")
				expectNoWC(t, s.p.b.rcq, 0, "a receiver that posted no receive")
			}
		}
	}
	type mem struct{ rssA, rssB, anonA, anonB int64 }
	sample := func() mem {
		return mem{procKB(t, ha.Pid(), "VmRSS"), procKB(t, hb.Pid(), "VmRSS"), procKB(t, ha.Pid(), "RssAnon"), procKB(t, hb.Pid(), "RssAnon")}
	}
	// The agents' memory is measured once the pressure has started (the
	// first retries take their one-time share: stacks, heap, the pages of
	// the window's messages), then after a second more of it.
	pressure(300 * time.Millisecond)
	m0, bytes0 := sample(), uplinkTo(t, ha, hb).BytesOut
	pressure(time.Second)
	m1, tried := sample(), uplinkTo(t, ha, hb).BytesOut-bytes0
	t.Logf("a second of pressure (%d MiB posted; %d MiB sent again and refused in the second): VmRSS %s %d → %d kB, %s %d → %d kB; RssAnon %d → %d kB, %d → %d kB",
		qps*wrs*msg>>20, tried>>20, ha.Name, m0.rssA, m1.rssA, hb.Name, m0.rssB, m1.rssB, m0.anonA, m1.anonA, m0.anonB, m1.anonB)
	if tried == 0 {
		t.Errorf("the senders sent nothing under pressure: they do not retry after RNR")
	}
	const limitKB = 6 << 10 // well under the 16 MiB posted
	for _, g := range []struct {
		host         string
		before, then int64
	}{{ha.Name, m0.rssA, m1.rssA}, {hb.Name, m0.rssB, m1.rssB}} {
		if g.then-g.before > limitKB {
			t.Errorf("%s's agent grew by %d kB in a second of pressure (VmRSS %d → %d kB), more than %d kB: it buffers what it cannot deliver",
				g.host, g.then-g.before, g.before, g.then, limitKB)
		}
	}

	t0 := time.Now()
	for _, s := range sides {
		batch := make([]vrdma.RecvWR, wrs)
		for k := range batch {
			batch[k] = vrdma.RecvWR{ID: uint64(k + 1), SGL: sgl(s.dst.SGE(k*msg, msg))}
		}
		postRecv(t, s.p.b.qp, batch...)
	}
	for i, s := range sides {
		for k, w := range waitWC(t, s.p.a.scq, wrs) {
			expectWC(t, w, s.p.a.qp, uint64(k+1), vrdma.WCSuccess, vrdma.WCSend)
		}
		for k, w := range waitWC(t, s.p.b.rcq, wrs) {
			expectRecv(t, w, s.p.b.qp, uint64(k+1), vrdma.WCRecv, msg, 0, false)
		}
		expectBytes(t, fmt.Sprintf("QP %d's messages", i), s.dst.Bytes(), s.src.Bytes())
		expectNoWC(t, s.p.b.rcq, quiet, "more receives than messages")
	}
	t.Logf("%d messages of %d KiB delivered %v after the receives were posted", qps*wrs, msg>>10, time.Since(t0).Round(time.Millisecond))
}
