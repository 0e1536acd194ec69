// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// The memcpy-direct path beyond the conformance suite
// (TestConformance/memcpy-direct): the opt-in and its explanation, that
// the library really does the work itself, and revocation (wire-local.md
// §4.21) against a peer in another process — deregistration while it
// writes, its death, and a peer that ignores the agent and is fenced.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/libdiag"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestDirectInProcess checks that a pair that allows each other gets
// memcpy-direct and that its WRITEs, READs and atomics never reach the
// agent's QP (its counters stay at zero for them), while a SEND whose
// receiver never polls does (its send channel retracts it after relay_ns
// and relays it, wire-local.md §4.22); and that
// a pair where one side does not list the other gets memcpy, the rule
// named.
func TestDirectInProcess(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	s := &suite{env: &directEnv{memcpyEnv{env: env, prefix: "dip"}}, how: connOOB}
	a, b := s.pair(t, pairConfig{})
	if p := a.qp.Path(); p.Path != vrdma.PathMemcpyDirect || !strings.Contains(p.Reason, "directPeers") {
		t.Fatalf("path %+v, want memcpy-direct naming vrdma.directPeers", p)
	}
	src, dst := a.mr(t, 8192, vrdma.AccessAll), b.mr(t, 8192, vrdma.AccessAll)
	fill(src.Bytes(), 5)
	postSend(t, a.qp,
		vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 4096)), RemoteAddr: dst.Addr(), RKey: dst.RKey()},
		vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(4096, 4096)), RemoteAddr: dst.Addr(), RKey: dst.RKey()},
		vrdma.SendWR{ID: 3, Opcode: vrdma.OpAtomicFetchAdd, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(8184, 8)), RemoteAddr: dst.Addr() + 4096, RKey: dst.RKey(), CompareAdd: 7})
	for i, w := range waitWC(t, a.scq, 3) {
		if w.WRID != uint64(i+1) || w.Status != vrdma.WCSuccess {
			t.Fatalf("completion %d: %+v", i, w)
		}
	}
	expectBytes(t, "written", dst.Bytes()[:4096], src.Bytes()[:4096])
	expectBytes(t, "read back", src.Bytes()[4096:8184], dst.Bytes()[:4088])
	if got := binary.LittleEndian.Uint64(dst.Bytes()[4096:]); got != 7 {
		t.Fatalf("FETCH_ADD left %d, want 7", got)
	}
	c := s.qpCounters(t, a)
	if c.Ops["RDMA_WRITE"] != 0 || c.Ops["RDMA_READ"] != 0 || c.Ops["FETCH_ADD"] != 0 {
		t.Fatalf("the agent executed direct WRs itself: counters %v", c.Ops)
	}
	if c.RdAtomicPeak != 1 {
		t.Fatalf("rd_atomic_peak %d after direct READs and atomics, want 1", c.RdAtomicPeak)
	}
	postRecv(t, b.qp, vrdma.RecvWR{ID: 9, SGL: sgl(dst.SGE(0, 64))})
	postSend(t, a.qp, vrdma.SendWR{ID: 4, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled, SGL: sgl(src.SGE(0, 64))})
	if w := waitWC(t, a.scq, 1)[0]; w.Status != vrdma.WCSuccess {
		t.Fatalf("a SEND its receiver does not take: %+v", w)
	}
	if c := s.qpCounters(t, a); c.Ops["SEND"] != 1 {
		t.Fatalf("the relayed SEND is not in the agent's counters: %v", c.Ops)
	}

	// One side opts in, the other does not.
	one := env.Open(t, "dip-one", testenv.VMOptions{MemMB: 16, DirectPeers: []string{"dip-two"}})
	two := env.Open(t, "dip-two", testenv.VMOptions{MemMB: 16})
	e1, e2 := newEnd(t, one, qpConfig{}), newEnd(t, two, qpConfig{})
	if err := e1.qp.ConnectTo(ctx, e2.qp.Endpoint()); err != nil {
		t.Fatal(err)
	}
	p := e1.qp.Path()
	if p.Path != vrdma.PathMemcpy || len(p.Rejected) == 0 || p.Rejected[len(p.Rejected)-1].Path != vrdma.PathMemcpyDirect ||
		!strings.Contains(p.Rejected[len(p.Rejected)-1].Why, `"dip-two" does not list "dip-one"`) {
		t.Fatalf("one-sided opt-in: path %+v, want memcpy with memcpy-direct rejected because dip-two does not list dip-one", p)
	}
}

// directChild is a peer workload process for the revocation tests.
type directChild struct {
	*lcChild
	pid int
}

// startDirectPeer defines VM peer (listing owner when optIn), runs a
// writer workload process on it that connects to owner's listener on port
// and writes 8 bytes at a time into [addr, addr+n) of region rkey in a
// loop, and accepts its connection with a's QP. ignore makes the workload
// ignore revocation notices.
func startDirectPeer(t *testing.T, env *testenv.Env, a *lcSide, owner, peer string, optIn, ignore bool, port int, m *vrdma.MR) *directChild {
	t.Helper()
	ctx := opCtx(t)
	var peers []string
	if optIn {
		peers = []string{owner}
	}
	env.Define(t, peer, testenv.VMOptions{MemMB: 16, DirectPeers: peers})
	l, err := a.vm.Adapters()[0].Listen(ctx, uint16(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	acc := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err == nil {
			err = r.Accept(ctx, a.qp)
		}
		acc <- err
	}()
	extra := []string{"VRDMA_TEST_SOCKET=" + env.Socket, "VRDMA_TEST_VM=" + peer, "VRDMA_TEST_REMOTE=" + owner + "/vrdma0",
		"VRDMA_TEST_PORT=" + strconv.Itoa(port), fmt.Sprintf("VRDMA_TEST_TARGET=%d:%d:%d", m.RKey(), m.Addr(), len(m.Bytes()))}
	if ignore {
		extra = append(extra, "VRDMA_TEST_IGNORE_REVOKE=1")
	}
	c := &directChild{lcChild: lcStartChild(t, "direct-writer", extra...)}
	c.pid = c.cmd.Process.Pid
	c.expect(t, "ready")
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
	return c
}

// mapsOwner reports whether process pid maps VM owner's guest memory.
func mapsOwner(t *testing.T, pid int, owner string) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatalf("maps of process %d: %v", pid, err)
	}
	return strings.Contains(string(b), "/memfd:vrdma-guest-"+owner+" ")
}

// TestDirectNeverMappedWithoutOptIn checks, in the peer process's
// /proc/PID/maps, that a VM whose VMX does not list the peer is never
// mapped there, though the peer lists it and writes into it; and, as the
// control, that an opted-in owner is.
func TestDirectNeverMappedWithoutOptIn(t *testing.T) {
	env := testenv.Start(t)
	for _, optIn := range []bool{false, true} {
		t.Run(fmt.Sprintf("owner-opts-in=%v", optIn), func(t *testing.T) {
			ctx := opCtx(t)
			owner, peer := "dnm-own"+strconv.FormatBool(optIn)[:1], "dnm-peer"+strconv.FormatBool(optIn)[:1]
			var peers []string
			if optIn {
				peers = []string{peer}
			}
			a := lcNewSide(t, ctx, env.Open(t, owner, testenv.VMOptions{MemMB: 16, DirectPeers: peers}))
			c := startDirectPeer(t, env, a, owner, peer, true, false, 40+len(peers), a.mr)
			path := c.expect(t, "path")
			c.expect(t, "writing")
			want := "path memcpy "
			if optIn {
				want = "path memcpy-direct "
			}
			if !strings.HasPrefix(path+" ", want) {
				t.Fatalf("the peer's QP: %q, want %q", path, want)
			}
			if !optIn && !strings.Contains(path, `does not list`) {
				t.Fatalf("the peer's QP: %q does not name the rule that refused memcpy-direct", path)
			}
			if got := mapsOwner(t, c.pid, owner); got != optIn {
				t.Fatalf("the peer process maps %s's guest memory: %v, want %v", owner, got, optIn)
			}
		})
	}
}

// TestDirectRevokeDereg deregisters the region a peer process writes into
// directly, in a loop: once Dereg returns the peer maps none of the
// owner's memory, no write lands any more, and the peer's next write fails
// (REM_ACCESS_ERR: relayed, the key is gone), without a crash.
func TestDirectRevokeDereg(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	a := lcNewSide(t, ctx, env.Open(t, "drd-own", testenv.VMOptions{MemMB: 16, DirectPeers: []string{"drd-peer"}}))
	c := startDirectPeer(t, env, a, "drd-own", "drd-peer", true, false, 50, a.mr)
	c.expect(t, "path memcpy-direct")
	c.expect(t, "writing")
	if !mapsOwner(t, c.pid, "drd-own") {
		t.Fatal("the peer does not map the owner's region while it writes directly")
	}
	if err := a.mr.Dereg(ctx); err != nil {
		t.Fatal(err)
	}
	if mapsOwner(t, c.pid, "drd-own") {
		t.Fatal("the peer still maps the owner's memory after Dereg returned")
	}
	snap := append([]byte(nil), a.mr.Bytes()...)
	line := c.expect(t, "error")
	if !strings.Contains(line, "REM_ACCESS_ERR") {
		t.Fatalf("the peer's write after the deregistration: %q, want REM_ACCESS_ERR", line)
	}
	expectBytes(t, "the region after Dereg returned", a.mr.Bytes(), snap)
	if err := c.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the cooperating peer is gone: %v", err)
	}
}

// TestDirectPeerKilled kills a peer process while it writes directly: the
// owner's deregistration then returns, and the agent serves on.
func TestDirectPeerKilled(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	a := lcNewSide(t, ctx, env.Open(t, "dpk-own", testenv.VMOptions{MemMB: 16, DirectPeers: []string{"dpk-peer"}}))
	c := startDirectPeer(t, env, a, "dpk-own", "dpk-peer", true, false, 60, a.mr)
	c.expect(t, "writing")
	c.kill()
	if err := a.mr.Dereg(ctx); err != nil {
		t.Fatal(err)
	}
	waitState(t, a.qp, vrdma.QPSErr)
	b := lcNewSide(t, ctx, env.Open(t, "dpk-new", testenv.VMOptions{MemMB: 16}))
	cc := lcNewSide(t, ctx, env.Open(t, "dpk-new2", testenv.VMOptions{MemMB: 16}))
	lcConnectCM(t, ctx, b, cc, 61)
	if err := lcRoundTrip(ctx, b, cc, 1); err != nil {
		t.Fatal(err)
	}
}

// TestDirectFenceIgnoringPeer deregisters a region whose peer process
// ignores revocation notices: by the time Dereg returns the agent has
// fenced it — the process killed (a zombie or gone), its session ended.
func TestDirectFenceIgnoringPeer(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	a := lcNewSide(t, ctx, env.Open(t, "dfi-own", testenv.VMOptions{MemMB: 16, DirectPeers: []string{"dfi-peer"}}))
	c := startDirectPeer(t, env, a, "dfi-own", "dfi-peer", true, true, 70, a.mr)
	c.expect(t, "writing")
	if err := a.mr.Dereg(ctx); err != nil {
		t.Fatal(err)
	}
	if st := procState(c.pid); st != "Z" && st != "" {
		t.Fatalf("the ignoring peer (pid %d) is in state %q after Dereg returned, want killed", c.pid, st)
	}
	select {
	case <-c.exited:
	case <-time.After(waitTimeout):
		t.Fatal("the fenced peer did not exit")
	}
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the fenced peer ended with %v, want SIGKILL", c.cmd.ProcessState)
	}
	waitState(t, a.qp, vrdma.QPSErr)
}

// procState returns the state letter of process pid, "" if it is gone.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// directWriterWorkload is the peer of the revocation tests: it attaches
// $VRDMA_TEST_VM, connects through the CM to $VRDMA_TEST_REMOTE port
// $VRDMA_TEST_PORT, prints "path PATH REASON", "ready QPN", then writes 8
// bytes at a time, signaled, into the region $VRDMA_TEST_TARGET
// (rkey:addr:length), printing "writing" after its first 100 and
// "error STATUS" at the first failure, then waits for its standard input
// to close. With $VRDMA_TEST_IGNORE_REVOKE it ignores revocations.
func directWriterWorkload() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "direct-writer:", err)
		return 1
	}
	if os.Getenv("VRDMA_TEST_IGNORE_REVOKE") != "" {
		libdiag.IgnoreRevocations.Store(true)
	}
	var rkey uint32
	var addr, n uint64
	if _, err := fmt.Sscanf(os.Getenv("VRDMA_TEST_TARGET"), "%d:%d:%d", &rkey, &addr, &n); err != nil || n < 8 {
		return fail(fmt.Errorf("VRDMA_TEST_TARGET %q: %v", os.Getenv("VRDMA_TEST_TARGET"), err))
	}
	v, pd, cq, qp, err := connectWorkload(ctx)
	if err != nil {
		return fail(err)
	}
	buf, err := v.Alloc(8)
	if err != nil {
		return fail(err)
	}
	mr, err := pd.RegMR(ctx, buf, vrdma.AccessLocalWrite)
	if err != nil {
		return fail(err)
	}
	p := qp.Path()
	why := p.Reason
	for _, r := range p.Rejected {
		why += "; rejected " + string(r.Path) + ": " + r.Why
	}
	fmt.Println("ready", qp.QPN())
	fmt.Println("path", p.Path, why)
	wc := make([]vrdma.WorkCompletion, 1)
	for i := uint64(0); ; i++ {
		binary.LittleEndian.PutUint64(buf, i+1)
		err := qp.PostSend([]vrdma.SendWR{{ID: i, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: []vrdma.SGE{mr.SGE(0, 8)},
			RemoteAddr: addr + i%(n/8)*8, RKey: rkey}})
		if err != nil {
			fmt.Println("error post:", err)
			break
		}
		got := 0
		for got == 0 && ctx.Err() == nil {
			if got, err = cq.Poll(wc); err != nil {
				return fail(err)
			}
		}
		if got == 0 {
			return fail(ctx.Err())
		}
		if wc[0].Status != vrdma.WCSuccess {
			fmt.Println("error", wc[0].Status)
			break
		}
		if i == 100 {
			fmt.Println("writing")
		}
	}
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestDirectChunks: a direct WRITE and READ longer than one in-use hold
// (4 MiB, direct.go's directChunk) over SGEs whose edges fall inside the
// chunks land every byte in order, without the agent (its counters stay
// at zero for them).
func TestDirectChunks(t *testing.T) {
	// three chunks, the last a short one; SGE edges off the chunk edges
	directLongCopy(t, "dch", 9<<20+4096+3, 3<<20+17, 4<<20+1, "in chunks")
}

// TestDirectPieces writes and reads back a message of under 8 MiB, which
// the library copies in 512 KiB pieces (direct.go, directPiece) inside one
// in-use hold, with SGE edges off the pieces' edges: every byte lands once
// and in order, and the agent executes neither WR.
func TestDirectPieces(t *testing.T) {
	directLongCopy(t, "dpc", 1<<20+4096+3, 300<<10+17, 700<<10+1, "in pieces")
}

// directLongCopy writes n bytes from three SGEs cut at cut1 and cut2 into
// a peer's region on a memcpy-direct pair, and reads them back over two
// SGEs cut at cut2: both complete with n bytes, every byte lands in
// order, and the agent's counters show it executed neither WR.
func directLongCopy(t *testing.T, prefix string, n, cut1, cut2 int, how string) {
	env := testenv.Start(t)
	s := &suite{env: &directEnv{memcpyEnv{env: env, prefix: prefix}}, how: connOOB}
	a, b := s.pair(t, pairConfig{})
	src, dst, back := a.mr(t, n, vrdma.AccessAll), b.mr(t, n, vrdma.AccessAll), a.mr(t, n, vrdma.AccessAll)
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(i*7 + i>>13)
	}
	postSend(t, a.qp,
		vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, RemoteAddr: dst.Addr(), RKey: dst.RKey(),
			SGL: sgl(src.SGE(0, cut1), src.SGE(cut1, cut2-cut1), src.SGE(cut2, n-cut2))},
		vrdma.SendWR{ID: 2, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, RemoteAddr: dst.Addr(), RKey: dst.RKey(),
			SGL: sgl(back.SGE(0, cut2), back.SGE(cut2, n-cut2))})
	for i, w := range waitWC(t, a.scq, 2) {
		if w.WRID != uint64(i+1) || w.Status != vrdma.WCSuccess || w.ByteLen != uint32(n) {
			t.Fatalf("completion %d: %+v, want success of %d bytes", i, w, n)
		}
	}
	expectBytes(t, "written "+how, dst.Bytes(), src.Bytes())
	expectBytes(t, "read back "+how, back.Bytes(), src.Bytes())
	if c := s.qpCounters(t, a); c.Ops["RDMA_WRITE"] != 0 || c.Ops["RDMA_READ"] != 0 {
		t.Fatalf("the agent executed the long WRs itself: counters %v", c.Ops)
	}
}

// TestDirectCachesFollowChanges: the library keeps a QP's last local
// region and last grant at hand (direct.go, QP.lastLocal and
// QP.lastGrant); neither outlives a change. A READ into a region that was
// reregistered without LOCAL_WRITE after a direct READ into it is not
// done directly (the agent completes it with LOC_PROT_ERR, the region keeps
// its bytes); a WRITE to a target region deregistered after a direct WRITE
// into it is not either (REM_ACCESS_ERR, the bytes unchanged).
func TestDirectCachesFollowChanges(t *testing.T) {
	env := testenv.Start(t)
	s := &suite{env: &directEnv{memcpyEnv{env: env, prefix: "dcc"}}, how: connOOB}
	ctx := opCtx(t)
	// run posts wr on a's QP and checks its completion's status.
	run := func(a *end, wr vrdma.SendWR, want vrdma.WCStatus, what string) {
		t.Helper()
		postSend(t, a.qp, wr)
		if w := waitWC(t, a.scq, 1)[0]; w.WRID != wr.ID || w.Status != want {
			t.Fatalf("%s: %+v, want %v", what, w, want)
		}
	}

	a, b := s.pair(t, pairConfig{})
	local, remote := a.mr(t, 4096, vrdma.AccessAll), b.mr(t, 4096, vrdma.AccessAll)
	fill(remote.Bytes(), 1)
	read := vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMARead, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 64)), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	run(a, read, vrdma.WCSuccess, "READ before the rereg")
	expectBytes(t, "read before the rereg", local.Bytes()[:64], remote.Bytes()[:64])
	if err := local.Rereg(ctx, vrdma.ReregAccess, nil, nil, vrdma.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	kept := append([]byte(nil), local.Bytes()[:64]...)
	fill(remote.Bytes(), 2)
	read.ID = 2
	run(a, read, vrdma.WCLocProtErr, "READ into the region without LOCAL_WRITE")
	expectBytes(t, "the region without LOCAL_WRITE", local.Bytes()[:64], kept)

	a, b = s.pair(t, pairConfig{})
	local, remote = a.mr(t, 4096, vrdma.AccessAll), b.mr(t, 4096, vrdma.AccessAll)
	fill(local.Bytes(), 3)
	write := vrdma.SendWR{ID: 1, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled, SGL: sgl(local.SGE(0, 64)), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	run(a, write, vrdma.WCSuccess, "WRITE before the dereg")
	expectBytes(t, "written before the dereg", remote.Bytes()[:64], local.Bytes()[:64])
	if err := remote.Dereg(ctx); err != nil {
		t.Fatal(err)
	}
	kept = append(kept[:0], remote.Bytes()[:64]...)
	fill(local.Bytes(), 4)
	write.ID = 2
	run(a, write, vrdma.WCRemAccessErr, "WRITE to the deregistered region")
	expectBytes(t, "the deregistered region", remote.Bytes()[:64], kept)
}
