// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fixture testdata/run is a trimmed work directory of a real
// `bench/run --quick --profile` (one round); its paths/bench.txt is the real
// output of the full run's four `go test -bench 'Benchmark(TCP|RDMA)…' -v`
// commands, as root, with -count 1. Its ucx/r1 is the real output of
// bench/run's ucx_perftest step over vrdma's rc_verbs run alone on the memcpy
// path with small counts (tag_lat 8 B -n 200, ucp_put_bw 64 KiB -n 100).
const fixture = "testdata/run"

func loadFixture(t *testing.T) *Data {
	t.Helper()
	d, err := Load(fixture)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

func TestSamples(t *testing.T) {
	for _, c := range []struct {
		s             Samples
		med, min, max float64
		str           string
	}{
		{Samples{3, 1, 2}, 2, 1, 3, "2.00 (1.00 – 3.00)"},
		{Samples{4, 1, 3, 2}, 2.5, 1, 4, "2.50 (1.00 – 4.00)"},
		{Samples{1632, 1902, 1750}, 1750, 1632, 1902, "1,750 (1,632 – 1,902)"},
		{Samples{0.276}, 0.276, 0.276, 0.276, "0.276"},
		{Samples{40.2, 40.2}, 40.2, 40.2, 40.2, "40.2"},
	} {
		if got := c.s.Median(); !near(got, c.med) {
			t.Errorf("%v.Median() = %v, want %v", c.s, got, c.med)
		}
		if c.s.Min() != c.min || c.s.Max() != c.max {
			t.Errorf("%v: min, max = %v, %v, want %v, %v", c.s, c.s.Min(), c.s.Max(), c.min, c.max)
		}
		if got := c.s.String(); got != c.str {
			t.Errorf("%v.String() = %q, want %q", c.s, got, c.str)
		}
	}
	var none Samples
	if !math.IsNaN(none.Median()) || none.String() != notMeasured {
		t.Errorf("empty Samples: median %v, %q", none.Median(), none.String())
	}
}

func TestUnits(t *testing.T) {
	// iperf3's Gbit/s is 10^9 bit/s: 22.18 Gbit/s is 2,644 MiB/s, not 2,773 (10^6) or 2,840.
	if got := GbpsToMiBps(22.18); !near(got, 22.18e9/8/1048576) || math.Round(got) != 2644 {
		t.Errorf("GbpsToMiBps(22.18) = %v", got)
	}
	// 64 MiB in 4,072,832 ns is 15,714 MiB/s; Go's "MB/s" (10^6) says 16,477.
	if got := nsPerOpToMiBps(64<<20, 4072832); math.Round(got) != 15714 {
		t.Errorf("nsPerOpToMiBps(64 MiB, 4072832 ns) = %v, want 15714", got)
	}
	for n, want := range map[int]string{8: "8 B", 4096: "4 KiB", 1 << 20: "1 MiB", 64 << 20: "64 MiB", 1536: "1536 B"} {
		if got := sizeName(n); got != want {
			t.Errorf("sizeName(%d) = %q, want %q", n, got, want)
		}
	}
	if got := sizeKey(4096); got != "4KiB" {
		t.Errorf("sizeKey(4096) = %q", got)
	}
	for x, want := range map[float64]string{58850: "58,850", 684: "684", 40.23: "40.2", 3.781: "3.78", 0.2761: "0.276", 1234567: "1,234,567"} {
		if got := num(x); got != want {
			t.Errorf("num(%v) = %q, want %q", x, got, want)
		}
	}
}

func TestLoadFixture(t *testing.T) {
	d := loadFixture(t)
	if d.Meta.Rounds != 1 || !d.Meta.Quick || d.Machine.Model != "AMD EPYC" || d.Machine.CPUs != "2" {
		t.Errorf("meta %+v, machine %+v", d.Meta, d.Machine)
	}
	// vrdmactl perf's JSON: perftest's keys, the mode from test_info.
	lat := d.goSamples(key("memcpy", "write_lat", 8).async(), Lat)
	if len(lat) != 1 || lat[0] != 11.75 {
		t.Errorf("memcpy async write_lat 8 B = %v, want [11.75]", lat)
	}
	if cpu := d.goSamples(key("tcp", "write_bw", MiB), CPU); len(cpu) != 1 || cpu[0] != 413.175 {
		t.Errorf("tcp write_bw 1 MiB agent CPU = %v", cpu)
	}
	// copy(): MiB/s from ns/op, both benchmarks.
	if c := d.copyRounds("BenchmarkCopy", 64*MiB); math.Round(c[1]) != 15714 {
		t.Errorf("copy() 64 MiB = %v, want 15714 MiB/s", c)
	}
	if c := d.copyRounds("BenchmarkCopyMemfd", 4096); math.Round(c[1]) != 110502 {
		t.Errorf("copy() memfd 4 KiB = %v", c)
	}
	// perftest's result lines.
	if s := d.dropSamples("memcpy", "ib_write_lat", 8, Lat); len(s) != 1 || s[0] != 7.17 {
		t.Errorf("perftest ib_write_lat = %v, want [7.17]", s)
	}
	if s := d.dropSamples("memcpy", "ib_write_bw", 65536, BW); len(s) != 1 || s[0] != 20438.72 {
		t.Errorf("perftest ib_write_bw 64 KiB = %v", s)
	}
	if s := d.dropSamples("tcp", "ib_send_bw", 8, Rate); len(s) != 1 || s[0] != 0.140174 {
		t.Errorf("perftest ib_send_bw 8 B rate = %v", s)
	}
	// vrdmactl perf's report between the same VMs, kept apart from perftest's.
	if g := d.dropRounds(LibGo, "memcpy", "ib_write_lat", 8, Lat); len(g) != 1 || g[1] != 21.81 {
		t.Errorf("Go library write_lat 8 B beside perftest = %v, want round 1: 21.81", g)
	}
	if g := d.dropRounds(LibGo, "tcp", "ib_send_bw", 8, Rate); len(g) != 0 {
		t.Errorf("Go library send_bw over tcp = %v, want none (no such file)", g)
	}
	// ucx_perftest over vrdma's rc_verbs: the median latency and overall_bw
	// columns by name, UCX's log lines between the header and the result skipped.
	if l := d.ucxRounds("memcpy", "tag_lat", 8, Lat); len(l) != 1 || l[1] != 53.235 {
		t.Errorf("UCX rc_verbs tag_lat 8 B over memcpy = %v, want round 1: 53.235", l)
	}
	if b := d.ucxRounds("memcpy", "ucp_put_bw", 65536, BW); len(b) != 1 || b[1] != 13016.09 {
		t.Errorf("UCX rc_verbs ucp_put_bw 64 KiB over memcpy = %v, want round 1: 13016.09", b)
	}
	if l := d.ucxRounds("memcpy", "ucp_put_bw", 65536, Lat); len(l) != 0 {
		t.Errorf("a bandwidth test has a latency: %v", l)
	}
	// bench/peers.sh, with its placement; the sweep (vrdmactl perf -a, ucx_perftest).
	if p := d.peerRounds("ucx_tcp_tag_bw_1MiB_MiBps"); p[1] != 4831.92 {
		t.Errorf("peers tag_bw = %v", p)
	}
	if pl := d.placement("ucx_shm_put_bw_4KiB_MiBps"); pl != "far" {
		t.Errorf("placement = %q", pl)
	}
	if v := d.Sweep["ucx-shm"][4096]; v != 61837.24 {
		t.Errorf("UCX shm sweep 4 KiB = %v", v)
	}
	if v := d.Sweep["vrdma-memcpy"][4]; v != 3.84 {
		t.Errorf("vrdma memcpy sweep 4 B = %v", v)
	}
	// scale: test_info's per-QP keys.
	if r := scaleResult(d, "memcpy", "write_bw", 16); r == nil || r.TXDepth != 128 || r.RSSPerQP != 129.75 || r.ConnectUs <= 0 {
		t.Errorf("scale memcpy write_bw -q 16 = %+v", r)
	}
	if p := d.Profiles["tcp-bw-1mib"]; len(p.Top) != 15 || !strings.Contains(p.Top[0], "pvm_irq_enable") || !strings.HasPrefix(p.Command, "perf record") {
		t.Errorf("profile = %+v", p)
	}
	if len(d.Errors) != 1 {
		t.Errorf("errors = %q", d.Errors)
	}
	// go test -bench of the paths between host agents: 12 tcp and 18 rdma benchmarks.
	if len(d.HostBench) != 30 || len(d.HostNotes) != 0 {
		t.Errorf("%d benchmark results, notes %+v; want 30 and none", len(d.HostBench), d.HostNotes)
	}
	if s := d.benchSamples("BenchmarkRDMAWriteBW/64KiB/veth-v1", "MiB/s"); len(s) != 1 || s[0] != 1415 {
		t.Errorf("RDMA write_bw 64 KiB veth-v1 = %v, want [1415]", s)
	}
	if s := d.benchSamples("BenchmarkTCPWriteLat/8B/loopback", "µs-typical"); len(s) != 1 || s[0] != 56.49 {
		t.Errorf("TCP write_lat 8 B loopback = %v, want [56.49]", s)
	}
}

// hostOutput is the output of three commands, `go test -run '^$' -v
// -bench B -benchtime Nx -count C ./internal/perf`, with B
// 'BenchmarkRDMAWriteBW$/^64KiB$' and 'BenchmarkTCPWriteBW$/^64KiB$' (C 3)
// then 'BenchmarkRDMAWriteLat$' (C 1), as a user who is not root gets it:
// the veth benchmarks skipped; and a failure.
const hostOutput = `goos: linux
goarch: amd64
pkg: github.com/vrdma/vrdma/internal/perf
cpu: Oxide Virtual Turin-like Processor
BenchmarkRDMAWriteBW
BenchmarkRDMAWriteBW/64KiB
BenchmarkRDMAWriteBW/64KiB/loopback
    path_bench_test.go:43: cluster 31022-0b1c2d: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 2.301s, etcd and fabric 171ms, network 0s, agents 80ms; total 2.552s
    path_bench_test.go:43: cluster 31022-5e6f70: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 0s, etcd and fabric 208ms, network 0s, agents 80ms; total 288ms
BenchmarkRDMAWriteBW/64KiB/loopback-2        	    3000	     23975 ns/op	2733.54 MB/s	      2686 MiB/s
    path_bench_test.go:43: cluster 31022-81a2b3: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 0s, etcd and fabric 162ms, network 0s, agents 75ms; total 237ms
    path_bench_test.go:43: cluster 31022-c4d5e6: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 0s, etcd and fabric 170ms, network 0s, agents 77ms; total 247ms
BenchmarkRDMAWriteBW/64KiB/loopback-2        	    3000	     26114 ns/op	2509.62 MB/s	      2466 MiB/s
    path_bench_test.go:43: cluster 31022-f708a9: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 0s, etcd and fabric 158ms, network 0s, agents 71ms; total 229ms
    path_bench_test.go:43: cluster 31022-bacbdc: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 0s, etcd and fabric 305ms, network 0s, agents 70ms; total 375ms
BenchmarkRDMAWriteBW/64KiB/loopback-2        	    3000	     24410 ns/op	2684.85 MB/s	      2611 MiB/s
BenchmarkRDMAWriteBW/64KiB/veth
    path_bench_test.go:43: StartCluster with NetnsOn: network namespaces need root (euid 1000): run the test as root (CI does)
--- SKIP: BenchmarkRDMAWriteBW/64KiB/veth
BenchmarkRDMAWriteBW/64KiB/veth-v1
    path_bench_test.go:43: StartCluster with NetnsOn: network namespaces need root (euid 1000): run the test as root (CI does)
--- SKIP: BenchmarkRDMAWriteBW/64KiB/veth-v1
PASS
goos: linux
goarch: amd64
pkg: github.com/vrdma/vrdma/internal/perf
cpu: Oxide Virtual Turin-like Processor
BenchmarkTCPWriteBW
BenchmarkTCPWriteBW/64KiB
BenchmarkTCPWriteBW/64KiB/loopback
    path_bench_test.go:43: cluster 31047-a1b2c3: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 2.277s, etcd and fabric 170ms, network 0s, agents 79ms; total 2.527s
    path_bench_test.go:43: cluster 31047-d4e5f6: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 0s, etcd and fabric 206ms, network 0s, agents 85ms; total 291ms
BenchmarkTCPWriteBW/64KiB/loopback-2         	    3000	     23752 ns/op	2759.19 MB/s	      2718 MiB/s
BenchmarkTCPWriteBW/64KiB/loopback-2         	    3000	     24770 ns/op	2645.79 MB/s	      2590 MiB/s
BenchmarkTCPWriteBW/64KiB/loopback-2         	    3000	     22991 ns/op	2850.46 MB/s	      2803 MiB/s
BenchmarkTCPWriteBW/64KiB/veth
    path_bench_test.go:43: StartCluster with NetnsOn: network namespaces need root (euid 1000): run the test as root (CI does)
--- SKIP: BenchmarkTCPWriteBW/64KiB/veth
PASS
goos: linux
goarch: amd64
pkg: github.com/vrdma/vrdma/internal/perf
cpu: Oxide Virtual Turin-like Processor
BenchmarkRDMAWriteLat
BenchmarkRDMAWriteLat/8B
BenchmarkRDMAWriteLat/8B/loopback
    path_bench_test.go:43: cluster 31065-0a1b2c: 2 hosts in loopback addresses (network namespaces need root (euid 1000): run the test as root (CI does)); vrdmad binary 2.290s, etcd and fabric 160ms, network 0s, agents 71ms; total 2.521s
    path_bench_test.go:51: connect bench1/vrdma0 → bench2/vrdma0: context deadline exceeded
    cluster.go:408: hostB logged 1 errors (a bug; set ClusterOptions.AllowAgentErrors if the test expects them):
        time=2025-06-02T10:11:12.131Z level=ERROR msg="rdma: uplink: read" err="connection refused"
--- FAIL: BenchmarkRDMAWriteLat/8B/loopback
BenchmarkRDMAWriteLat/8B/veth
    path_bench_test.go:43: StartCluster with NetnsOn: network namespaces need root (euid 1000): run the test as root (CI does)
--- SKIP: BenchmarkRDMAWriteLat/8B/veth
BenchmarkRDMAWriteLat/8B/veth-v1
    path_bench_test.go:43: StartCluster with NetnsOn: network namespaces need root (euid 1000): run the test as root (CI does)
--- SKIP: BenchmarkRDMAWriteLat/8B/veth-v1
--- FAIL: BenchmarkRDMAWriteLat/8B
--- FAIL: BenchmarkRDMAWriteLat
FAIL
`

func TestParseGoBench(t *testing.T) {
	rs, notes, err := parseGoBench(hostOutput)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 6 {
		t.Fatalf("%d results, want 6: %+v", len(rs), rs)
	}
	if r := rs[1]; r.Name != "BenchmarkRDMAWriteBW/64KiB/loopback" || r.Iters != 3000 ||
		r.Metrics["MiB/s"] != 2466 || r.Metrics["ns/op"] != 26114 || r.Metrics["MB/s"] != 2509.62 {
		t.Errorf("second result = %+v", r)
	}
	// The skips and the failure, each with its reason (not the clusters'
	// start, not the agent's log after it); not the parents that failed with it.
	const root = "StartCluster with NetnsOn: network namespaces need root (euid 1000): run the test as root (CI does)"
	want := []BenchNote{
		{"BenchmarkRDMAWriteBW/64KiB/veth", "SKIP", root},
		{"BenchmarkRDMAWriteBW/64KiB/veth-v1", "SKIP", root},
		{"BenchmarkTCPWriteBW/64KiB/veth", "SKIP", root},
		{"BenchmarkRDMAWriteLat/8B/loopback", "FAIL", "connect bench1/vrdma0 → bench2/vrdma0: context deadline exceeded"},
		{"BenchmarkRDMAWriteLat/8B/veth", "SKIP", root},
		{"BenchmarkRDMAWriteLat/8B/veth-v1", "SKIP", root},
	}
	if len(notes) != len(want) {
		t.Fatalf("notes %+v, want %+v", notes, want)
	}
	for i := range want {
		if notes[i] != want[i] {
			t.Errorf("note %d = %+v, want %+v", i, notes[i], want[i])
		}
	}
	// Without -v, a failure's log follows it, on the line of its name.
	_, notes, err = parseGoBench("BenchmarkTCPWriteLat/8B/veth-2          \t--- FAIL: BenchmarkTCPWriteLat/8B/veth-2\n" +
		"    path_bench_test.go:43: cluster 4242-0a0b0c: 2 hosts in network namespaces vrdma-4242-0a0b0c-*; total 301ms\n" +
		"    path_bench_test.go:55: path \"memcpy\", want tcp\n" +
		"--- FAIL: BenchmarkTCPWriteLat/8B\n--- FAIL: BenchmarkTCPWriteLat\nFAIL\n")
	if err != nil || len(notes) != 1 || notes[0] != (BenchNote{"BenchmarkTCPWriteLat/8B/veth", "FAIL", `path "memcpy", want tcp`}) {
		t.Errorf("without -v: %+v, %v", notes, err)
	}
	for _, bad := range []string{
		"go: cannot find main module\n",
		"BenchmarkTCPWriteBW/64KiB/loopback-2 \t 3000\t 23752 ns/op\t fast MiB/s\n",
		"BenchmarkTCPWriteBW/64KiB/loopback-2 \t 3000\t 23752 ns/op\t 2718\n",
	} {
		if _, _, err := parseGoBench(bad); err == nil {
			t.Errorf("parseGoBench(%q): no error", bad)
		}
	}
}

func TestRenderHosts(t *testing.T) {
	d := &Data{Errors: []string{"vrdmactl perf write_bw --path tcp --local: exit status 1",
		"paths between host agents: go test -bench '^Benchmark(TCP|RDMA)WriteLat$': exit status 1: failed: BenchmarkRDMAWriteLat/8B/loopback"}}
	var err error
	if d.HostBench, d.HostNotes, err = parseGoBench(hostOutput); err != nil {
		t.Fatal(err)
	}
	native, _, err := parseGoBench("BenchmarkNativeWriteBW/64KiB/loopback-2 \t 3000\t 50000 ns/op\t 1305.6 MiB/s\n")
	if err != nil || len(native) != 1 {
		t.Fatalf("the native benchmark's line: %+v, %v", native, err)
	}
	d.HostBench = append(d.HostBench, native...)
	w := &writer{}
	renderHosts(w, d)
	doc := w.String()
	for _, want := range []string{
		"## The rdma path beside the tcp path, between two host agents\n",
		"| figure | tcp loopback | rdma loopback | rdma / tcp | tcp veth | rdma veth | rdma / tcp | rdma veth-v1 |\n",
		// medians 2,611 / 2,718 = 0.96
		"| `write_bw` 64 KiB, MiB/s | 2,718 (2,590 – 2,803) | 2,611 (2,466 – 2,686) | 0.96 | not measured | not measured | — | not measured |\n",
		"| `send_bw` 8 B, Mpps | not measured | not measured | — | not measured | not measured | — | not measured |\n",
		"| figure | native loopback | rdma loopback | native / rdma | native veth | rdma veth | native / rdma |\n",
		// medians 1,306 / 2,611 = 0.50
		"| `write_bw` 64 KiB, MiB/s | 1,306 | 2,611 (2,466 – 2,686) | 0.50 | not measured | not measured | — |\n",
		"| `write_lat` 8 B, typical, µs | not measured | not measured | — |",
		"- `BenchmarkTCPWriteBW/64KiB/veth` skipped: StartCluster with NetnsOn: network namespaces need root (euid 1000)",
		"- `BenchmarkRDMAWriteLat/8B/loopback` failed: connect bench1/vrdma0 → bench2/vrdma0: context deadline exceeded\n",
		"- paths between host agents: go test -bench '^Benchmark(TCP\\|RDMA)WriteLat$': exit status 1: failed: BenchmarkRDMAWriteLat/8B/loopback\n", // | escaped
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the section lacks %q:\n%s", want, doc)
		}
	}
	if strings.Contains(doc, "vrdmactl perf write_bw") {
		t.Error("the section lists a failure of another step")
	}
	if n := strings.Count(doc, "\n| `"); n != 2*len(hostRows) { // the table of the paths, the native one's
		t.Errorf("%d rows, want %d", n, 2*len(hostRows))
	}
}

func TestTargetsFixture(t *testing.T) {
	want := map[string]Status{
		"tcp-bw-1mib":            Missed,
		"tcp-lat-8b":             Missed,
		"memcpy-bw-4kib":         Missed,
		"memcpy-async-lat-8b":    Missed,
		"memcpy-doorbell-lat-8b": Met, // 5.66 µs against sockperf UDP 13.7
		"memcpy-bw-64mib":        Missed,
		"async-lat-8b":           Missed, // memcpy 2.08, tcp 1.78
		"rdma-lat-8b":            Missed, // 2.64× sockperf UDP
		"direct-lat-8b":          NotMeasured,
		"direct-bw":              NotMeasured,
	}
	out := Evaluate(loadFixture(t))
	if len(out) != len(want) {
		t.Fatalf("%d targets, want %d", len(out), len(want))
	}
	for _, o := range out {
		if o.Status != want[o.ID] {
			t.Errorf("%s: %v, want %v (%s against %s, ratio %s)", o.ID, o.Status, want[o.ID], o.Vrdma, o.Peer, o.Ratio)
		}
	}
	if o := out[3]; o.Ratio != "44" || o.Goal != "≤ 5" {
		t.Errorf("memcpy async ratio %q goal %q, want 44 and ≤ 5", o.Ratio, o.Goal)
	}
}

// twoRounds is a run of two rounds with the figures of the memcpy 64 MiB
// target: vrdma and copy() at 64 MiB.
func twoRounds(v1, c1, v2, c2 float64) *Data {
	d := &Data{}
	for i, f := range []struct{ v, c float64 }{{v1, c1}, {v2, c2}} {
		r := Result{Key: key("memcpy", "write_bw", 64*MiB), Round: i + 1, BWAverage: f.v, AgentCPU: math.NaN()}
		d.Go = append(d.Go, r)
		d.Copy = append(d.Copy, CopyResult{Bench: "BenchmarkCopy", Size: 64 * MiB, Round: i + 1, MiBps: f.c})
	}
	return d
}

func TestTargetEveryRound(t *testing.T) {
	target := Targets[5]
	if o := target.Eval(twoRounds(20000, 21000, 19500, 20000)); o.Status != Met {
		t.Errorf("0.952 and 0.975: %v (%s), want met", o.Status, o.Ratio)
	}
	// The medians would pass (19,400 / 20,000 = 0.97); round 2 alone does not.
	if o := target.Eval(twoRounds(20300, 20000, 18500, 20000)); o.Status != Missed || !strings.Contains(o.Ratio, "0.93 – 1.01") {
		t.Errorf("1.015 and 0.925: %v (%s), want missed", o.Status, o.Ratio)
	}
	d := twoRounds(20000, 20000, 20000, 20000)
	d.Copy = d.Copy[:1] // round 2 has no copy() beside it
	if o := target.Eval(d); o.Status != NotMeasured {
		t.Errorf("a round without copy(): %v, want not measured", o.Status)
	}
}

func TestTargetMetAndMissed(t *testing.T) {
	d := &Data{
		Go: []Result{
			{Key: key("tcp", "write_bw", MiB), Round: 1, BWAverage: 5000},
			{Key: key("tcp", "write_bw", MiB), Round: 2, BWAverage: 4000},
			{Key: key("tcp", "write_lat", 8).async(), Round: 1, TTypical: 10},
			{Key: key("tcp", "write_lat", 8), Round: 1, TTypical: 20},
		},
		Peers: []PeersRound{
			{Round: 1, Figures: map[string]float64{"ucx_tcp_tag_bw_1MiB_MiBps": 4200, "ucx_tcp_tag_lat_8B_median_us": 8, "sockperf_tcp_pp_14B_median_us": 12}},
			{Round: 2, Figures: map[string]float64{"ucx_tcp_tag_bw_1MiB_MiBps": 4400}},
		},
	}
	bw := Targets[0].Eval(d)
	// medians 4,500 / 4,300 = 1.05; per round 5000/4200 = 1.19 and 4000/4400 = 0.91.
	if bw.Status != Met || bw.Ratio != "1.05 (0.91 – 1.19)" {
		t.Errorf("tcp bandwidth: %v %q, want met 1.05 (0.91 – 1.19)", bw.Status, bw.Ratio)
	}
	lat := Targets[1].Eval(d)
	// async 10 / 8 = 1.25 ≤ 1.5: met; doorbell 20 / 12 = 1.67 > 1.5: missed.
	if lat.Status != Missed || lat.Detail != "async met, doorbell missed" || lat.Ratio != "1.25 / 1.67" {
		t.Errorf("tcp latency: %v %q %q", lat.Status, lat.Detail, lat.Ratio)
	}
	if strings.Contains(lat.ProfileArgs, "--async") {
		t.Errorf("the doorbell part missed, the profile is of async mode: %q", lat.ProfileArgs)
	}
}

// TestRenderUCX: the UCX section over two rounds, with a failed run and a
// failed peer: each test's table has every path, vrdma's median and range,
// the peers' figures of the same rounds and the ratios of the medians with
// the per-round ranges; what failed is listed, and nothing else.
func TestRenderUCX(t *testing.T) {
	nan := math.NaN()
	d := &Data{
		Machine:  Machine{Model: "AMD EPYC", CPUs: "2"},
		Packages: map[string]string{"ucx-utils": "1.13.1-1"},
		UCX: []UCXResult{
			{Path: "memcpy", Test: "tag_lat", Size: 8, Round: 1, Lat: 10, BW: 0.7},
			{Path: "memcpy", Test: "tag_lat", Size: 8, Round: 2, Lat: 12, BW: 0.6},
			{Path: "tcp", Test: "tag_bw", Size: MiB, Round: 1, Lat: nan, BW: 1000},
			{Path: "tcp", Test: "tag_bw", Size: MiB, Round: 2, Lat: nan, BW: 3000},
		},
		Peers: []PeersRound{
			{Round: 1, Figures: map[string]float64{"ucx_tcp_tag_lat_8B_median_us": 20, "ucx_shm_tag_lat_8B_median_us": 0.5,
				"ucx_tcp_tag_bw_1MiB_MiBps": 2000}, Placement: map[string]string{"ucx_shm_tag_lat_8B": "near"}},
			{Round: 2, Figures: map[string]float64{"ucx_tcp_tag_lat_8B_median_us": 30, "ucx_shm_tag_lat_8B_median_us": 0.5,
				"ucx_tcp_tag_bw_1MiB_MiBps": 2000}, Placement: map[string]string{"ucx_shm_tag_lat_8B": "far"},
				Errors: []string{"ucx_shm_tag_bw_1MiB: ucx_perftest client timed out after 12s (box busy?)", "iperf3_tcp: unparsable iperf3 JSON"}},
		},
		Errors: []string{
			"ucx_perftest over vrdma rc_verbs: ucp_put_bw -s 65536 over rdma: no result (UCX  ERROR a | b)",
			"perftest, round 1: the VMs did not start: quickstart",
		},
	}
	w := &writer{}
	renderUCX(w, d)
	doc := w.String()
	for _, want := range []string{
		"## UCX over vrdma's rc_verbs beside UCX's tcp and posix\n",
		"Machine: AMD EPYC, 2 vCPUs, `ucx-utils` 1.13.1-1.\n",
		"### `tag_lat` 8 B, median latency, one way, µs\n\n" +
			"| path | vrdma `rc_verbs` | UCX tcp | vrdma / UCX tcp | UCX posix (far, near) | vrdma / UCX posix |\n" +
			"|---|---|---|---|---|---|\n" +
			// 11 / 25 = 0.44, per round 10/20 = 0.5 and 12/30 = 0.4; 11 / 0.5 = 22, per round 20 and 24
			"| memcpy | 11.0 (10.0 – 12.0) | 25.0 (20.0 – 30.0) | 0.44 (0.40 – 0.50) | 0.5 | 22 (20 – 24) |\n" +
			"| memcpy-direct | not measured | 25.0 (20.0 – 30.0) | — | 0.5 | — |\n" +
			"| tcp | not measured | 25.0 (20.0 – 30.0) | — | 0.5 | — |\n" +
			"| rdma | not measured | 25.0 (20.0 – 30.0) | — | 0.5 | — |\n",
		// 2,000 / 2,000 = 1.00, per round 0.5 and 1.5; posix not measured
		"| tcp | 2,000 (1,000 – 3,000) | 2,000 | 1.00 (0.50 – 1.50) | not measured | — |\n",
		"### `ucp_put_bw` 1 MiB, bandwidth, MiB/s\n",
		"- ucx_perftest over vrdma rc_verbs: ucp_put_bw -s 65536 over rdma: no result (UCX  ERROR a \\| b)\n", // | escaped
		"- bench/peers.sh, round 2: ucx_shm_tag_bw_1MiB: ucx_perftest client timed out after 12s (box busy?)\n",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the section lacks %q:\n%s", want, doc)
		}
	}
	for _, other := range []string{"perftest, round 1", "iperf3"} {
		if strings.Contains(doc, other) {
			t.Errorf("the section lists a failure of another step (%q)", other)
		}
	}
	if n := strings.Count(doc, "\n### "); n != len(ucxTests) {
		t.Errorf("%d tables, want %d", n, len(ucxTests))
	}
	if n := strings.Count(doc, "\n| memcpy | "); n != len(ucxTests) {
		t.Errorf("%d memcpy rows, want one per table (%d)", n, len(ucxTests))
	}
}

func TestRenderFixture(t *testing.T) {
	d := loadFixture(t)
	outcomes := Evaluate(d)
	doc := Render(d, outcomes, Chart{File: ChartFile}, "../analysis")
	for _, want := range []string{
		"# Benchmarks",
		"bench/run --quick --profile",
		"AMD EPYC, 2 vCPUs",
		"## Targets: vrdma against its peers",
		"| tcp path, 1 MiB write bandwidth | 2,681 MiB/s | UCX tcp `tag_bw` 4,832 MiB/s | 0.55 | ≥ 1.0 | **[missed](#tcp-path-1-mib-write-bandwidth)** |",
		"| memcpy doorbell, 8 B write latency | 5.66 µs | sockperf UDP 14 B 13.7 µs | 0.41 | ≤ 1.0 | met |",
		"| memcpy async, 8 B write latency | 11.8 µs | UCX shm `ucp_put_lat` (far) 0.265 µs | 44 | ≤ 5 |",
		"![Bandwidth against message size", "](benchmarks-bw.png)",
		"### tcp path, 1 MiB write bandwidth",
		"](PERF-LOG.md#the-tcp-path", // the analysis file, links made relative to docs
		"19.49%  vrdmad           [kernel.kallsyms]                    [k] pvm_irq_enable",
		"iperf3, one stream, 22.2 Gbit/s = 2,644 MiB/s",
		"| 16 | 128 | 9,493 |",
		"| 1,024 | — | not measured |", // a failed scale run is a row, with its reason
		"- 1,024 QP pairs, `write_bw`: vrdmactl: perf: connect vm1/vrdma0 → vm2/vrdma0: vrdma: CreateQP: VM \"vm1\" has 512 QPs",
		"### bench/peers.sh, round 1",
		// the paths between host agents, -count 1: 2,686 / 2,718 = 0.99, 2,531 / 1,358 = 1.86
		"| `write_bw` 64 KiB, MiB/s | 2,718 | 2,686 | 0.99 | 1,358 | 2,531 | 1.86 | 1,415 |",
		"| `write_lat` 8 B, typical, µs | 56.5 | 34.9 | 0.62 | 82.8 | 35.0 | 0.42 | 35.8 |",
		"| `send_bw` 8 B, Mpps | 0.224 | 0.334 | 1.49 | 0.208 | 0.299 | 1.44 | 0.127 |",
		"The rdma path's targets against the tcp path, from the same rounds",
		"| 1 MiB write bandwidth ≥ 2 GB/s | 3,100 MiB/s = 3.25 GB/s | | | met |",
		"| 1 MiB write bandwidth ≥ the tcp path's | 3,100 MiB/s | 2,681 MiB/s | 1.16 | met |",
		"| 8 B write latency ≤ the tcp path's | 36.2 µs | 49.7 µs | 0.73 | met |",
		// the drop-in's: perftest against the Go library between the same VMs
		"## The C drop-in beside the Go library",
		"| memcpy | `ib_write_bw` 64 KiB, MiB/s | 20,439 | 20,715 | 0.99 | ≥ 0.9 | met |",
		"| memcpy | `ib_write_lat` 8 B, µs | 7.17 | 21.8 | 0.33 | ≤ 1.1 | met |",
		"| tcp | `ib_send_bw` 8 B, Mpps | 0.14 | not measured | — | ≥ 0.9 | not measured |",
		"| rdma | `ib_write_bw` 1 MiB, MiB/s | not measured | not measured | — | — | — (no target on this path) |",
		// UCX over vrdma's rc_verbs beside UCX's tcp and posix
		"## UCX over vrdma's rc_verbs beside UCX's tcp and posix",
		"Machine: AMD EPYC, 2 vCPUs, `ucx-utils` 1.13.1-1.",
		"### `tag_lat` 8 B, median latency, one way, µs\n",
		"| memcpy | 53.2 | 7.55 | 7.05 | 0.511 | 104 |", // 53.235 / 7.55, 53.235 / 0.511
		"### `ucp_put_bw` 64 KiB, bandwidth, MiB/s\n",
		"| path | vrdma `rc_verbs` | UCX tcp | vrdma / UCX tcp | UCX posix (far) | vrdma / UCX posix |",
		"| memcpy | 13,016 | not measured | — | 76,085 | 0.17 |", // no UCX tcp 64 KiB in the fixture
		"| rdma | not measured | not measured | — | 76,085 | — |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the document lacks %q", want)
		}
	}
	for _, o := range outcomes {
		if !strings.Contains(doc, "| "+o.Figure+" | ") {
			t.Errorf("no target row for %q", o.Figure)
		}
		if o.Status == Missed && !strings.Contains(doc, "### "+o.Figure+"\n") {
			t.Errorf("no section for the miss %q", o.Figure)
		}
	}
	// The sections in the document's order.
	last := -1
	for _, h := range []string{"## Targets: vrdma against its peers", "## The memcpy path", "## The tcp path", "## The rdma path\n",
		"## The C drop-in beside the Go library", "## UCX over vrdma's rc_verbs beside UCX's tcp and posix",
		"## The rdma path beside the tcp path, between two host agents", "## Bandwidth against message size", "## Doorbell and async modes", "## Scale", "## What bounds the misses",
		"## Commands", "## Appendix", "### lscpu"} {
		i := strings.Index(doc, h)
		if i < last {
			t.Errorf("%q out of order", h)
		}
		last = i
	}
	// A chart that was not drawn is said so, and not embedded.
	doc = Render(d, outcomes, Chart{Why: "gnuplot was not installed (`apt-get install gnuplot-nox`)."}, "../analysis")
	if strings.Contains(doc, "](benchmarks-bw.png)") || !strings.Contains(doc, "The chart was not drawn: gnuplot was not installed") {
		t.Error("a chart that was not drawn is embedded, or its absence not explained")
	}
}

func TestMissingInputs(t *testing.T) {
	dir := t.TempDir()
	d, err := Load(dir)
	if err != nil {
		t.Fatalf("an empty work directory: %v", err)
	}
	outcomes := Evaluate(d)
	for _, o := range outcomes {
		if o.Status != NotMeasured {
			t.Errorf("%s: %v with no figures", o.ID, o.Status)
		}
	}
	doc := Render(d, outcomes, drawChart(d, dir, dir), "../analysis")
	for _, want := range []string{
		"| memcpy, 4 KiB write bandwidth | not measured MiB/s | UCX shm `ucp_put_bw` not measured MiB/s | — | ≥ 1.0 | not measured |",
		"The chart was not drawn: the run has no sweep figures",
		"Not measured yet:", // scale
		"No target was missed in this run.",
		"| `write_bw` 1 MiB, MiB/s | not measured | not measured | — | not measured | not measured | — | not measured |",
		"Machine: unknown, unknown vCPUs.",
		"| rdma | not measured | not measured | — | not measured | — |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the document lacks %q", want)
		}
	}
	// One missing figure in a fixture of a whole run: not measured, the rest intact.
	work := copyFixture(t)
	if err := os.Remove(filepath.Join(work, "go", "r1", "memcpy.write_lat.8.async.json")); err != nil {
		t.Fatal(err)
	}
	if d, err = Load(work); err != nil {
		t.Fatal(err)
	}
	if o := Evaluate(d)[3]; o.Status != NotMeasured || o.Ratio != "—" {
		t.Errorf("memcpy async latency without its figure: %v %q", o.Status, o.Ratio)
	}
}

func TestMalformedInput(t *testing.T) {
	for _, c := range []struct{ file, text string }{
		{filepath.Join("go", "r1", "memcpy.write_bw.4096.json"), `{"test": "write_bw", "path": "memcpy", "MsgSize": 4096, `},
		{filepath.Join("go", "r1", "memcpy.write_bw.4096.json"), `{"hello": "world"}`},
		{filepath.Join("peers", "r1.json"), `{"schema": "vrdma-peers/1", "figures": {"x": "fast"}}`},
		{filepath.Join("peers", "r1.json"), `[1, 2, 3]`},
		{"meta.json", `{"rounds": "three"}`},
		{filepath.Join("sweep", "ucx-shm.4096.txt"), "ucx_perftest: connection refused\n"},
		{filepath.Join("perftest", "r1", "memcpy.ib_write_lat.8.txt"), "Couldn't connect to localhost:18515\n"},
		{filepath.Join("ucx", "r1", "memcpy.tag_lat.8.txt"), "[1796572059.742146] [vm:20138:0] UCX  ERROR no such device\n"},
		{filepath.Join("ucx", "r1", "memcpy.tag_lat.8.txt"), "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw\n200,fast,1,1,1,1\n"},
		{filepath.Join("paths", "bench.txt"), "go: updates to go.mod needed\n"},
		{filepath.Join("paths", "bench.txt"), "BenchmarkTCPSendRate/8B/loopback-2 \t 50000\t 5262 ns/op\t 1.52 MB/s\t 0.2238\n"},
	} {
		work := copyFixture(t)
		file := filepath.Join(work, c.file)
		if err := os.WriteFile(file, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(work)
		if err == nil || !strings.Contains(err.Error(), file) {
			t.Errorf("%s holding %q: error %v, want one naming the file", c.file, c.text, err)
		}
	}
}

func TestChartData(t *testing.T) {
	d := loadFixture(t)
	dir := t.TempDir()
	gp, err := writeChartData(d, dir, filepath.Join(dir, ChartFile))
	if err != nil || gp == "" {
		t.Fatalf("writeChartData: %q, %v", gp, err)
	}
	dat, err := os.ReadFile(filepath.Join(dir, "bw.dat"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(dat)), "\n")
	if len(lines) != 1+22 { // header, 4 B .. 8 MiB
		t.Fatalf("%d lines in bw.dat, want 23", len(lines))
	}
	// 4 KiB: vrdma memcpy and UCX shm measured, the rest missing.
	if want := "4096\t3412.96\t?\t?\t61837.24\t?"; lines[11] != want {
		t.Errorf("bw.dat's 4 KiB line = %q, want %q", lines[11], want)
	}
	script, _ := os.ReadFile(gp)
	for _, want := range []string{"pngcairo", "set logscale x 2", "set logscale y 10", `title "UCX tcp tag_bw"`} {
		if !strings.Contains(string(script), want) {
			t.Errorf("the gnuplot script lacks %q", want)
		}
	}
}

func TestHelpers(t *testing.T) {
	for in, want := range map[string]string{
		"tcp path, 1 MiB write bandwidth":              "tcp-path-1-mib-write-bandwidth",
		"tcp path, 8 B write latency (RTT/2, typical)": "tcp-path-8-b-write-latency-rtt2-typical",
		"memcpy, 1 MiB / 64 MiB write bandwidth":       "memcpy-1-mib--64-mib-write-bandwidth",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
	if got := analysisText("# Title\n\nSee [x](../../docs/PERF-LOG.md#a).\n"); got != "\nSee [x](PERF-LOG.md#a).\n" {
		t.Errorf("analysisText = %q", got)
	}
	if got := perfTop("# c\n#\n\n  1.00%  a  b  [.] f   \n  0.50%  a  b  [.] g\n  0.25%  a  b  [.] h\n", 2); len(got) != 2 || got[0] != "  1.00%  a  b  [.] f" {
		t.Errorf("perfTop = %q", got)
	}
	for name, want := range map[string]int{"r1": 1, "r12.json": 12, "r3.txt": 3, "x": 0} {
		if got := roundOf(name); got != want {
			t.Errorf("roundOf(%q) = %d, want %d", name, got, want)
		}
	}
}

// copyFixture copies the fixture work directory into a temporary one.
func copyFixture(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.Walk(fixture, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(fixture, p)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestRun(t *testing.T) {
	work, out := copyFixture(t), t.TempDir()
	if err := run(work, out, "../analysis", false); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "BENCHMARKS.md"))
	if err != nil || !strings.Contains(string(b), "## Targets: vrdma against its peers") {
		t.Errorf("BENCHMARKS.md: %v", err)
	}
}

// TestLatencyTargets: issue 36's rows, each part compared on its own: one
// path whose async mode is slower fails the async row; the rdma row needs
// both the tcp path and sockperf; the memcpy-direct rows stay not measured
// without their figures and are judged once they are there.
func TestLatencyTargets(t *testing.T) {
	by := map[string]Target{}
	for _, tg := range Targets {
		by[tg.ID] = tg
	}
	lat := func(path string, async bool, v float64) Result {
		k := key(path, "write_lat", 8)
		if async {
			k = k.async()
		}
		return Result{Key: k, Round: 1, TTypical: v, AgentCPU: math.NaN()}
	}
	d := &Data{
		Go: []Result{lat("memcpy", false, 6), lat("memcpy", true, 5), lat("tcp", false, 50), lat("tcp", true, 40),
			lat("rdma", false, 30), lat("rdma", true, 31)},
		Peers: []PeersRound{{Round: 1, Figures: map[string]float64{"sockperf_udp_pp_14B_median_us": 12,
			"ucx_shm_put_lat_8B_median_us": 0.2, "ucx_shm_tag_lat_8B_median_us": 0.3}}},
	}
	if o := by["async-lat-8b"].Eval(d); o.Status != Missed || !strings.Contains(o.Detail, "rdma missed") || !strings.Contains(o.Detail, "tcp met") {
		t.Errorf("async: %v %q, want missed on rdma alone", o.Status, o.Detail)
	}
	// 30 / 50 = 0.6 ≤ 1 met; 30 / 12 = 2.5 > 1.5 missed.
	if o := by["rdma-lat-8b"].Eval(d); o.Status != Missed || o.Detail != "/ tcp met, / sockperf missed" {
		t.Errorf("rdma: %v %q", o.Status, o.Detail)
	}
	if o := by["direct-lat-8b"].Eval(d); o.Status != NotMeasured {
		t.Errorf("direct latency without its figures: %v", o.Status)
	}
	d.Go = append(d.Go, lat("memcpy-direct", false, 0.25),
		Result{Key: key("memcpy-direct", "send_lat", 8), Round: 1, TTypical: 0.4, AgentCPU: math.NaN()})
	// 0.25 / 0.2 = 1.25 and 0.4 / 0.3 = 1.33, both ≤ 1.5.
	if o := by["direct-lat-8b"].Eval(d); o.Status != Met {
		t.Errorf("direct latency: %v %q %q", o.Status, o.Detail, o.Ratio)
	}
	for i, s := range []int{4096, MiB, 64 * MiB} {
		d.Go = append(d.Go, Result{Key: key("memcpy-direct", "write_bw", s), Round: 1, BWAverage: float64(1000 * (i + 1)), AgentCPU: math.NaN()})
		d.Peers[0].Figures["ucx_shm_put_bw_"+sizeKey(s)+"_MiBps"] = 1500
	}
	// 1,000 / 1,500 misses at 4 KiB; 2,000 and 3,000 meet.
	if o := by["direct-bw"].Eval(d); o.Status != Missed || !strings.HasPrefix(o.Detail, "4 KiB missed, 1 MiB met") {
		t.Errorf("direct bandwidth: %v %q", o.Status, o.Detail)
	}
}
