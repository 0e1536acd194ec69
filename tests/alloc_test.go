// SPDX-License-Identifier: Apache-2.0

//go:build !race

// The race detector allocates on its own account; this test counts
// allocations, so it runs without it.

package vrdma_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestHotPathAllocs checks that the data path of the library allocates
// nothing: PostSend, PostRecv and Poll, with SGE lists and inline data.
func TestHotPathAllocs(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v1 := env.Open(t, "vm1", testenv.VMOptions{})
	v2 := env.Open(t, "vm2", testenv.VMOptions{})
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{BufSize: 8192, MaxInline: 64})
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(200, allocRound(t, p, 64))
	if allocs != 0 {
		t.Fatalf("PostRecv+PostSend+Poll allocate %.1f times per round; the data path must not allocate", allocs)
	}
}

// TestHotPathAllocsTCP checks that the tcp path allocates nothing per work
// request, on either agent: two agents in this process, on loopback
// addresses, with a pair between them doing RDMA WRITEs and SENDs.
func TestHotPathAllocsTCP(t *testing.T) {
	hotPathAllocsBetweenHosts(t, vrdma.PathTCP, []string{"127.0.0.2", "127.0.0.3"}, false)
}

// TestHotPathAllocsTCPLanes is TestHotPathAllocsTCP with the agents'
// requests on 4 lanes and the WRITE (4 KiB) striped over them.
func TestHotPathAllocsTCPLanes(t *testing.T) {
	hotPathAllocsBetweenHosts(t, vrdma.PathTCP, []string{"127.0.78.2", "127.0.78.3"}, true)
}

// TestHotPathAllocsRDMA is TestHotPathAllocsTCP over the rdma path: both
// hosts with a software RoCEv2 uplink (UDP 4791 on their own loopback
// addresses, which no other test uses), declared lossless.
func TestHotPathAllocsRDMA(t *testing.T) {
	hotPathAllocsBetweenHosts(t, vrdma.PathRDMA, []string{"127.0.77.2", "127.0.77.3"}, false)
}

// hotPathAllocsBetweenHosts runs allocRound between VMs of two agents of
// this process on addrs, over path (tcp or rdma), and fails if the
// transport's or the device's code allocates per round. With lanes the
// agents carry their requests on 4 lanes and the round's WRITE is striped.
func hotPathAllocsBetweenHosts(t *testing.T, path vrdma.PathKind, addrs []string, lanes bool) {
	ep := etcdtest.Start(t).ClientURL()
	st := etcdtest.Open(t, ep)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sw := records.Switch{Name: "dvs1", UUID: "50 1a 2b 3c 4d 5e 6f 70-81 92 a3 b4 c5 d6 e7 f8", MTU: 9000, UplinkPolicy: records.UplinkSingle}
	if _, err := st.Create(ctx, records.SwitchKey(sw.Name), sw); err != nil {
		t.Fatal(err)
	}
	// RoCE in a VLAN with PFC on its priority: what the rdma path's
	// network checks ask for.
	pg := records.PortGroup{Name: "dvportgroup-10", Key: "dvportgroup-10", Switch: "dvs1", VLAN: 10, PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}
	if _, err := st.Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
		t.Fatal(err)
	}
	var envs []*testenv.Env
	writeLen := 64
	if lanes {
		writeLen = 4096
	}
	for _, ip := range addrs {
		ln, err := net.Listen("tcp", ip+":0") // a free port on that address
		if err != nil {
			t.Skipf("loopback address %s: %v", ip, err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		cfg := agent.ControlConfig{Endpoints: []string{ep}, Switch: "dvs1",
			FirewallPVRDMA: true, PVRDMAAddress: netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port))}
		if lanes {
			cfg.Lanes, cfg.StripeMin = 4, 512
		}
		if path == vrdma.PathRDMA {
			u, err := agent.ParseUplink("rocev2-soft/" + ip)
			if err != nil {
				t.Fatal(err)
			}
			pfc, teamed := records.PrioritiesOf(pg.PFCPriority), false
			u.Declared = records.NICState{PFC: &pfc, Pause: &records.Pause{}, Teamed: &teamed}
			cfg.Uplinks = []records.Uplink{u}
		}
		envs = append(envs, testenv.StartControl(t, "alloc-"+ip, cfg))
	}
	vmx := testenv.VMXOn(testenv.VMOptions{}, sw.UUID, pg.Key)
	v1 := envs[0].OpenVMX(t, "alloc1", vmx)
	v2 := envs[1].OpenVMX(t, "alloc2", vmx)
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{BufSize: 8192, MaxInline: 64})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Path().Path; got != path {
		t.Fatalf("path %q (%s), want %s", got, p.Path().Reason, path)
	}
	round := allocRound(t, p, writeLen)
	round() // A's connection to B opened
	if lanes {
		// Lanes join a connection after it opened.
		t0 := time.Now()
		for uplinkMax(t, func(u mgmt.UplinkStatus) uint64 { return uint64(u.Lanes) }, envs...) < 4 {
			if time.Since(t0) > waitTimeout {
				t.Fatal("A's connection to B has not 4 lanes")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for range 50 { // buffers and maps grown
		round()
	}
	if striped := uplinkSum(t, func(u mgmt.UplinkStatus) uint64 { return u.StripedBatches }, envs...); lanes && striped < 50 {
		t.Fatalf("%d batches striped over lanes in 50 rounds, want a WRITE striped each round", striped)
	}
	// The embedded etcd and its clients in this process allocate on their
	// own (leases, heartbeats), so a process-wide count says nothing: count
	// the allocations whose stacks pass through the data path's packages,
	// from the memory profile at its finest rate.
	old := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = old }()
	// The steady state is measured: on a loaded machine a response may
	// come later than the QP's timeout, and the tcp requester then gives
	// the connection up and dials again, allocating on that recovery path.
	// A measurement during which either agent dialed is taken again.
	for attempt := 1; ; attempt++ {
		dials := uplinkDials(t, envs...)
		before := dataPathAllocs()
		for range 200 {
			round()
		}
		n, where := dataPathAllocsSince(before)
		if d := uplinkDials(t, envs...); d != dials {
			if attempt == 3 {
				t.Fatalf("the agents dialed each other again during each of 3 measurements (%d dials, then %d): the link never held", dials, d)
			}
			t.Logf("the agents dialed each other again during the measurement (%d dials, then %d): a response came later than the QP's timeout; measuring again", dials, d)
			continue
		}
		// Refills of the runtime's own caches are left out (inDataPath).
		// An allocation per request would show 400 times; the margin is
		// for runtime internals not listed there.
		if n > 10 {
			t.Fatalf("200 rounds of WRITE + SEND over the %s path allocated %d times in the data path; the data path must not allocate:\n%s", path, n, where)
		}
		t.Logf("200 rounds over the %s path: %d allocations in the data path's packages", path, n)
		return
	}
}

// uplinkDials returns how many connections the agents of envs have opened
// to other hosts.
func uplinkDials(t *testing.T, envs ...*testenv.Env) uint64 {
	t.Helper()
	return uplinkSum(t, func(u mgmt.UplinkStatus) uint64 { return u.Dials }, envs...)
}

// uplinkMax is the largest f over the uplinks of envs' agents.
func uplinkMax(t *testing.T, f func(u mgmt.UplinkStatus) uint64, envs ...*testenv.Env) uint64 {
	t.Helper()
	var m uint64
	for _, e := range envs {
		m = max(m, uplinkSum(t, f, e))
	}
	return m
}

// uplinkSum is the sum of f over the uplinks of envs' agents.
func uplinkSum(t *testing.T, f func(u mgmt.UplinkStatus) uint64, envs ...*testenv.Env) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n uint64
	for _, e := range envs {
		a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(e.Socket))
		if err != nil {
			t.Fatal(err)
		}
		st, err := a.Status(ctx)
		a.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range st.Uplinks {
			n += f(u)
		}
	}
	return n
}

// allocRound returns one round of the allocation tests on pair p: a
// receive posted at B, an RDMA WRITE of writeLen bytes (at most 4096)
// with an SGE list and a signaled inline SEND posted at A, and both
// completions polled.
func allocRound(t *testing.T, p *perf.Pair, writeLen int) func() {
	a, b := p.A, p.B
	sends := []vrdma.SendWR{
		{ID: 1, Opcode: vrdma.OpRDMAWrite, SGL: []vrdma.SGE{a.MR.SGE(0, writeLen)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()},
		{ID: 2, Opcode: vrdma.OpSend, Flags: vrdma.SendSignaled | vrdma.SendInline, SGL: []vrdma.SGE{a.MR.SGE(64, 32)}},
	}
	recvs := []vrdma.RecvWR{{ID: 3, SGL: []vrdma.SGE{b.MR.SGE(4096, 64)}}}
	wc := make([]vrdma.WorkCompletion, 8)
	waitOne := func(cq *vrdma.CQ) {
		for {
			n, err := cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				if wc[0].Status != vrdma.WCSuccess {
					t.Fatalf("completion %+v", wc[0])
				}
				return
			}
			runtime.Gosched() // the agents run in this process
		}
	}
	return func() {
		if err := b.QP.PostRecv(recvs); err != nil {
			t.Fatal(err)
		}
		if err := a.QP.PostSend(sends); err != nil {
			t.Fatal(err)
		}
		waitOne(a.CQ)
		waitOne(b.CQ)
	}
}

// dataPathPkgs are the packages of the agent's data path, the transports
// and the device they drive: an allocation whose stack passes through one
// of them, while a pair moves data and no connection is being made, is a
// data-path allocation. (Packages rather than functions: a list of
// functions goes stale, unnoticed, when one is renamed or moved.)
var dataPathPkgs = []string{"github.com/vrdma/vrdma/internal/transport/", "github.com/vrdma/vrdma/internal/device.",
	"github.com/vrdma/vrdma/internal/hostlink."}

// dataPathAllocs returns the allocation counts of the memory profile's
// data-path stacks, by stack.
func dataPathAllocs() map[[32]uintptr]int64 {
	runtime.GC()
	runtime.GC() // the profile is published a cycle late
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	out := map[[32]uintptr]int64{}
	for _, r := range recs {
		if inDataPath(r.Stack()) {
			out[r.Stack0] += r.AllocObjects
		}
	}
	return out
}

// dataPathAllocsSince returns how many data-path allocations happened
// since before, and where.
func dataPathAllocsSince(before map[[32]uintptr]int64) (int64, string) {
	var n int64
	var where strings.Builder
	for stk, c := range dataPathAllocs() {
		if d := c - before[stk]; d > 0 {
			n += d
			fmt.Fprintf(&where, "%d at:\n", d)
			frames := runtime.CallersFrames(stk[:])
			for {
				f, more := frames.Next()
				if f.Function != "" {
					fmt.Fprintf(&where, "\t%s (%s:%d)\n", f.Function, f.File, f.Line)
				}
				if !more {
					break
				}
			}
		}
	}
	return n, where.String()
}

// runtimeCaches are the runtime functions that refill the runtime's own
// caches: select's sudog cache (emptied by every GC, so refilled after
// each one, however many requests pass) and the type-assertion and
// type-switch caches (built once per call site). An allocation they make
// is the runtime's, not the data path's.
var runtimeCaches = []string{"runtime.acquireSudog", "runtime.buildTypeAssertCache", "runtime.buildInterfaceSwitchCache"}

// inDataPath reports whether the allocation with stack stk was made on
// behalf of a data-path function, not to refill a runtime cache.
func inDataPath(stk []uintptr) bool {
	frames := runtime.CallersFrames(stk)
	allocator := true // still in the allocator's own frames
	for {
		f, more := frames.Next()
		if allocator {
			switch f.Function {
			case "runtime.mallocgc", "runtime.newobject", "runtime.makeslice", "runtime.growslice":
				continue
			}
			allocator = false
			for _, fn := range runtimeCaches {
				if f.Function == fn {
					return false
				}
			}
		}
		for _, pkg := range dataPathPkgs {
			if strings.HasPrefix(f.Function, pkg) {
				return true
			}
		}
		if !more {
			return false
		}
	}
}
