// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

func TestPerfJSON(t *testing.T) {
	tmp := isolate(t)
	for _, tc := range []struct {
		args  []string
		keys  []string
		cqMod float64 // perftest's CQ moderation for the run; 0: not checked
	}{
		{[]string{"perf", "write_bw", "--local", "--path", "memcpy", "-s", "4096", "-n", "300", "--out_json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}, 100},
		// Above 8 KiB perftest signals every request unless -Q is given.
		{[]string{"perf", "read_bw", "--local", "--path", "memcpy", "-s", "65536", "-n", "100", "-t", "16", "-o", "json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}, 1},
		{[]string{"perf", "write_bw", "--local", "--path", "memcpy", "-s", "65536", "-n", "100", "-Q", "10", "-o", "json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}, 10},
		{[]string{"perf", "write_lat", "--local", "--path", "memcpy", "-s", "8", "-n", "200", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}, 0},
		{[]string{"perf", "send_bw", "--local", "--path", "memcpy", "-s", "4096", "-n", "200", "--out_json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}, 0},
		{[]string{"perf", "atomic_bw", "--local", "--path", "memcpy", "-s", "8", "-n", "300", "--out_json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}, 0},
		{[]string{"perf", "read_lat", "--local", "--path", "memcpy", "-s", "64", "-n", "200", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}, 0},
		{[]string{"perf", "send_lat", "--local", "--path", "memcpy", "-s", "8", "-n", "200", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}, 0},
		{[]string{"perf", "atomic_lat", "--local", "--path", "memcpy", "-s", "8", "-n", "200", "-A", "CMP_AND_SWAP", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}, 0},
	} {
		var m map[string]any
		runJSON(t, &m, tc.args...)
		for _, k := range append(tc.keys, "MsgSize", "n_iterations") {
			if v, ok := m[k].(float64); !ok || v <= 0 {
				t.Errorf("%v: key %q = %v, want a positive number", tc.args, k, m[k])
			}
		}
		test := tc.args[1]
		if m["test"] != test || m["path"] != "memcpy" || !strings.HasPrefix(m["reason"].(string), "memcpy: ") {
			t.Errorf("%v: test %v path %v reason %v", tc.args, m["test"], m["path"], m["reason"])
		}
		if info, ok := m["test_info"].(map[string]any); !ok || info["Transport"] != "memcpy" || info["Connection_type"] != "RC" ||
			tc.cqMod != 0 && info["CQ_Moderation"] != tc.cqMod {
			t.Errorf("%v: test_info %v", tc.args, m["test_info"])
		}
		if n := m["n_iterations"].(float64); n != float64(atoi(t, tc.args[8])) {
			t.Errorf("%v: %v iterations", tc.args, n)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("perf left %v in TMPDIR", left)
	}
}

func atoi(t *testing.T, s string) int {
	var n int
	if err := json.Unmarshal([]byte(s), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPerfText(t *testing.T) {
	isolate(t)
	out := runOK(t, "perf", "write_bw", "--local", "--path", "memcpy", "-s", "65536", "-n", "200")
	for _, want := range []string{"RDMA_Write BW Test", " Transport       : memcpy", " Path reason     : memcpy: ",
		"#bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]", " 65536      200 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out = runOK(t, "perf", "write_lat", "--local", "-s", "2", "-n", "100", "--async")
	for _, want := range []string{"RDMA_Write Latency Test", "t_typical[usec]", "99.9% percentile[usec]", " 2       100 ", "async"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestPerfAtomicText checks the atomic tests' titles (-A names the
// operation) and what they refuse: another size than 8, -a, an unknown
// operation.
func TestPerfAtomicText(t *testing.T) {
	isolate(t)
	out := runOK(t, "perf", "atomic_bw", "--local", "-n", "100", "-A", "CMP_AND_SWAP")
	for _, want := range []string{"Atomic CMP_AND_SWAP BW Test", "Outstand reads", " 8          100 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out = runOK(t, "perf", "atomic_lat", "--local", "-n", "100")
	for _, want := range []string{"Atomic FETCH_AND_ADD Latency Test", "t_typical[usec]", " 8       100 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, args := range [][]string{{"atomic_bw", "-s", "16"}, {"atomic_lat", "-a"}, {"atomic_bw", "-A", "SWAP"}} {
		_, errs, code := run(t, "", append([]string{"perf", "--local"}, args...)...)
		if code != exitUsage || !strings.Contains(errs, "perf: ") {
			t.Errorf("perf %v: exit %d, %q; want a usage error", args, code, errs)
		}
	}
}

func TestPerfAllSizesToFile(t *testing.T) {
	isolate(t)
	file := filepath.Join(t.TempDir(), "report.json")
	out := runOK(t, "perf", "write_bw", "--local", "-a", "-n", "20", "--out_json_file", file)
	if !strings.Contains(out, " 8388608    20 ") {
		t.Errorf("text output lacks the 2^23 line:\n%s", out)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Path    string `json:"path"`
		Results []struct {
			MsgSize   int     `json:"MsgSize"`
			BWAverage float64 `json:"BW_average"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Path != "memcpy" || len(rep.Results) != 23 || rep.Results[0].MsgSize != 2 || rep.Results[22].MsgSize != 1<<23 {
		t.Fatalf("report %s", b)
	}
}

// --path memcpy-direct: perf defines its two VMs with the opt-in
// (vrdma.directPeers naming each other), and both QPs report the path, or
// perf fails naming the path it got.
func TestPerfDirectPath(t *testing.T) {
	tmp := isolate(t)
	out, errs, code := run(t, "", "perf", "write_lat", "--local", "--path", "memcpy-direct", "-s", "8", "-n", "200", "--out_json")
	if code != 0 {
		t.Fatalf("--path memcpy-direct: exit %d; stderr %q", code, errs)
	}
	var rep struct {
		Path     string  `json:"path"`
		TTypical float64 `json:"t_typical"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep.Path != "memcpy-direct" || rep.TTypical <= 0 {
		t.Fatalf("report %s", out)
	}
	// send_lat: the SENDs go through the send channel (wire-local.md
	// §4.22), so the agent's goroutines are not woken for them, as they
	// are about once a message on the relayed path.
	out, errs, code = run(t, "", "perf", "send_lat", "--local", "--path", "memcpy-direct", "-s", "8", "-n", "2000", "--out_json")
	if code != 0 {
		t.Fatalf("send_lat --path memcpy-direct: exit %d; stderr %q", code, errs)
	}
	var send struct {
		Path     string  `json:"path"`
		TTypical float64 `json:"t_typical"`
		Wakeups  float64 `json:"agent_wakeups_per_op"`
	}
	if err := json.Unmarshal([]byte(out), &send); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if send.Path != "memcpy-direct" || send.TTypical <= 0 || send.Wakeups >= 0.5 {
		t.Fatalf("send_lat report %s: want memcpy-direct with the agent woken for less than one message in two", out)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("perf left %v in TMPDIR", left)
	}
}

// --path tcp: two agents, each a host on its own loopback address, one VM
// on each; the QPs report tcp and the uplinks carried the run.
func TestPerfTCP(t *testing.T) {
	tmp := isolate(t)
	for _, tc := range []struct {
		args []string
		keys []string
	}{
		{[]string{"perf", "write_bw", "--local", "--path", "tcp", "-s", "65536", "-n", "200", "--out_json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}},
		{[]string{"perf", "read_bw", "--local", "--path", "tcp", "-s", "65536", "-n", "100", "-t", "16", "--out_json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}},
		{[]string{"perf", "send_bw", "--local", "--path", "tcp", "-s", "4096", "-n", "200", "--async", "-o", "json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}},
		{[]string{"perf", "write_lat", "--local", "--path", "tcp", "-s", "8", "-n", "200", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}},
		{[]string{"perf", "atomic_bw", "--local", "--path", "tcp", "-s", "8", "-n", "200", "--out_json"},
			[]string{"BW_peak", "BW_average", "MsgRate"}},
		{[]string{"perf", "read_lat", "--local", "--path", "tcp", "-s", "8", "-n", "100", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}},
		{[]string{"perf", "send_lat", "--local", "--path", "tcp", "-s", "8", "-n", "100", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}},
		{[]string{"perf", "atomic_lat", "--local", "--path", "tcp", "-s", "8", "-n", "100", "--out_json"},
			[]string{"t_min", "t_max", "t_typical", "t_avg", "t_stdev", "percentile_99", "percentile_99.9"}},
	} {
		var m map[string]any
		runJSON(t, &m, tc.args...)
		for _, k := range append(tc.keys, "MsgSize", "n_iterations") {
			if v, ok := m[k].(float64); !ok || v <= 0 {
				t.Errorf("%v: key %q = %v, want a positive number", tc.args, k, m[k])
			}
		}
		if n := m["n_iterations"].(float64); n != float64(atoi(t, tc.args[8])) {
			t.Errorf("%v: %v iterations", tc.args, n)
		}
		reason, _ := m["reason"].(string)
		if m["test"] != tc.args[1] || m["path"] != "tcp" || !strings.HasPrefix(reason, "tcp: ") || !strings.Contains(reason, "no RDMA uplink") {
			t.Errorf("%v: test %v path %v reason %v", tc.args, m["test"], m["path"], m["reason"])
		}
		info, ok := m["test_info"].(map[string]any)
		if !ok || info["Transport"] != "tcp" || info["path"] != "tcp" || info["Connection_type"] != "RC" {
			t.Fatalf("%v: test_info %v", tc.args, m["test_info"])
		}
		if ub, ok := info["uplink_bytes"].(float64); !ok || ub <= 0 {
			t.Errorf("%v: uplink_bytes %v: want a positive number", tc.args, info["uplink_bytes"])
		}
		hosts, _ := info["hosts"].([]any)
		if len(hosts) != 2 {
			t.Fatalf("%v: hosts %v", tc.args, info["hosts"])
		}
		for i, h := range hosts {
			hs, _ := h.(string)
			addr := fmt.Sprintf("127.0.0.%d:", 2+i)
			if !strings.HasPrefix(hs, fmt.Sprintf("host%d %s", i+1, addr)) || !strings.HasSuffix(hs, fmt.Sprintf("(vm%d)", i+1)) {
				t.Errorf("%v: host %d %q", tc.args, i, hs)
			}
			// The reason names both hosts' PVRDMA addresses.
			if ap, _, _ := strings.Cut(strings.TrimPrefix(hs, fmt.Sprintf("host%d ", i+1)), " "); !strings.Contains(reason, ap) {
				t.Errorf("%v: reason %q does not name %s", tc.args, reason, ap)
			}
		}
		if async := slices.Contains(tc.args, "--async"); info["async_mode"] != async {
			t.Errorf("%v: async_mode %v", tc.args, info["async_mode"])
		}
	}
	out := runOK(t, "perf", "write_bw", "--local", "--path", "tcp", "-s", "65536", "-n", "100")
	for _, want := range []string{"RDMA_Write BW Test", " Transport       : tcp", " Path reason     : tcp: ", " Hosts           : host1 127.0.0.2:",
		" → host2 127.0.0.3:", "#bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]", " 65536      100 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("perf left %v in TMPDIR", left)
	}
}

// TestPerfRDMA runs perf over the rdma path: two hosts on loopback
// addresses, each with a software RoCEv2 uplink (UDP 4791) declared
// lossless, no root needed.
func TestPerfRDMA(t *testing.T) {
	tmp := isolate(t)
	out := runOK(t, "perf", "write_bw", "--local", "--path", "rdma", "-s", "65536", "-n", "50")
	for _, want := range []string{"RDMA_Write BW Test", " Transport       : rdma", " Path reason     : rdma: ", "both have an RDMA uplink",
		" Hosts           : host1 127.0.0.2:", " 65536      50 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The eight tests over the rdma path, small counts: correctness only.
	for _, test := range []string{"write_bw", "read_bw", "send_bw", "atomic_bw", "write_lat", "read_lat", "send_lat", "atomic_lat"} {
		fig := "BW_average"
		if strings.HasSuffix(test, "_lat") {
			fig = "t_typical"
		}
		var m map[string]any
		runJSON(t, &m, "perf", test, "--local", "--path", "rdma", "-s", "8", "-n", "100", "--out_json")
		info, _ := m["test_info"].(map[string]any)
		if v, _ := m[fig].(float64); v <= 0 || m["test"] != test || m["path"] != "rdma" || m["n_iterations"] != 100.0 {
			t.Errorf("%s over rdma: %s %v, test %v, path %v, n_iterations %v", test, fig, m[fig], m["test"], m["path"], m["n_iterations"])
		}
		if ub, _ := info["uplink_bytes"].(float64); ub <= 0 {
			t.Errorf("%s over rdma: uplink_bytes %v: the uplinks' counters did not move", test, info["uplink_bytes"])
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("perf left %v in TMPDIR", left)
	}
}

// --pvrdma-addresses picks the hosts' addresses; an address that is not
// this machine's fails the run (exit 1) and leaves nothing behind.
func TestPerfTCPAddresses(t *testing.T) {
	tmp := isolate(t)
	var m map[string]any
	runJSON(t, &m, "perf", "write_lat", "--local", "--path", "tcp", "--pvrdma-addresses", "127.0.0.4,127.0.0.5", "-n", "50", "--out_json")
	info, _ := m["test_info"].(map[string]any)
	if hosts, _ := info["hosts"].([]any); m["path"] != "tcp" || len(hosts) != 2 ||
		!strings.HasPrefix(hosts[0].(string), "host1 127.0.0.4:") || !strings.HasPrefix(hosts[1].(string), "host2 127.0.0.5:") {
		t.Errorf("path %v, hosts %v", m["path"], info["hosts"])
	}

	out, errs, code := run(t, "", "perf", "write_bw", "--local", "--path", "tcp", "--pvrdma-addresses", "127.0.0.2,192.0.2.1", "-n", "10")
	if code != exitFailure || !strings.Contains(errs, "host host2") || !strings.Contains(errs, "cannot listen on 192.0.2.1") {
		t.Errorf("a host address not on this machine: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("perf left %v in TMPDIR", left)
	}

	for _, args := range [][]string{
		{"--path", "memcpy", "--pvrdma-addresses", "127.0.0.2,127.0.0.3"},
		{"--pvrdma-addresses", "127.0.0.2,127.0.0.3"},
		{"--path", "tcp", "--pvrdma-addresses", "127.0.0.2"},
		{"--path", "tcp", "--pvrdma-addresses", "127.0.0.2,localhost"},
		{"--path", "tcp", "--pvrdma-addresses", "127.0.0.2:4791,127.0.0.2:4791"},
	} {
		args = append([]string{"perf", "write_bw", "--local"}, args...)
		_, errs, code := run(t, "", args...)
		if code != exitUsage || !strings.Contains(errs, "--pvrdma-addresses") {
			t.Errorf("vrdmactl %s: exit %d, stderr %q; want exit 2 and a message", strings.Join(args, " "), code, errs)
		}
	}
}

// TestPerfReportGbits checks --report_gbits: the header's unit and the
// JSON's, and an average that is the MiB/s figure of the same run
// converted (the run is the same one: -D is off, so both print it).
func TestPerfReportGbits(t *testing.T) {
	isolate(t)
	out := runOK(t, "perf", "write_bw", "--local", "-s", "65536", "-n", "300", "--report_gbits")
	if !strings.Contains(out, "BW peak[Gb/sec]    BW average[Gb/sec]") {
		t.Errorf("header without Gb/sec:\n%s", out)
	}
	var m map[string]any
	runJSON(t, &m, "perf", "write_bw", "--local", "-s", "65536", "-n", "300", "--report_gbits", "--out_json")
	info, _ := m["test_info"].(map[string]any)
	if info["BW_unit"] != "Gb/sec" {
		t.Errorf("BW_unit %v, want Gb/sec", info["BW_unit"])
	}
	// 65536-byte writes at more than 10 MiB/s, in Gbit/s: above 0.08 and
	// far below what MiB/s would read.
	if v, _ := m["BW_average"].(float64); v < 0.08 || v > 2000 {
		t.Errorf("BW_average %v Gb/sec is not a Gbit/s figure", v)
	}
}

// TestPerfProgress draws the progress bar of a run half done into a
// buffer and stops it: the bar, its percentage, then a cleared line.
func TestPerfProgress(t *testing.T) {
	old := progressAfter
	progressAfter = 0
	defer func() { progressAfter = old }()
	var buf testenv.SyncBuffer
	var done atomic.Int64
	done.Store(50)
	stop := startProgress(&buf, "write_bw 65536", &done, 100, 0)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), " 50%") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	out := buf.String()
	if !strings.Contains(out, "write_bw 65536 [====================                    ]  50%") {
		t.Errorf("progress output %q lacks the half bar", out)
	}
	if !strings.HasSuffix(out, "\r"+strings.Repeat(" ", 72)+"\r") {
		t.Errorf("progress output %q does not end clearing its line", out)
	}
	if isTerminal(&buf) {
		t.Error("a buffer is not a terminal")
	}
}

// TestPerfServerClient runs perf as perftest does, server and client in
// two invocations against an agent, for every test: the client connects
// by the server adapter's IP address, both report the test, size and
// iterations the client asked for (a latency server prints no result), and
// a BW server's figures are the client's. A client with no server (its VM
// gone, so its address nobody's) and one without --vm fail with a message.
func TestPerfServerClient(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vmS", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.66.0.1"}})
	env.Define(t, "vmC", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.66.0.2"}})
	type run1 struct {
		test string
		qps  int
	}
	var runs []run1
	for _, test := range []string{"write_bw", "read_bw", "send_bw", "atomic_bw", "write_lat", "read_lat", "send_lat", "atomic_lat"} {
		runs = append(runs, run1{test, 1})
	}
	runs = append(runs, run1{"send_bw", 4}, run1{"write_bw", 3}) // -q: the client's QPs, each connected to one of the server's
	for i, r1 := range runs {
		test := r1.test
		port := fmt.Sprint(19100 + i)
		size := "4096"
		if strings.HasPrefix(test, "atomic") {
			size = "8"
		}
		type res struct {
			m    map[string]any
			errs string
			code int
		}
		srvc := make(chan res, 1)
		go func() {
			out, errs, code := run(t, "", "--socket", env.Socket, "perf", test, "--vm", "vmS", "-p", port, "--out_json")
			var m map[string]any
			json.Unmarshal([]byte(out), &m)
			srvc <- res{m, errs, code}
		}()
		var cli map[string]any
		var cerrs string
		for try := 0; try < 50; try++ {
			out, errs, code := run(t, "", "--socket", env.Socket, "perf", test, "--vm", "vmC", "-p", port, "-s", size, "-n", "200", "-q", fmt.Sprint(r1.qps), "--out_json", "10.66.0.1")
			if code == 0 {
				json.Unmarshal([]byte(out), &cli)
				break
			}
			cerrs = errs // the server may not listen yet
			time.Sleep(50 * time.Millisecond)
		}
		srv := <-srvc
		if cli == nil || srv.code != 0 {
			t.Fatalf("%s: client %q; server exit %d, %q", test, cerrs, srv.code, srv.errs)
		}
		if cli["test"] != test || cli["MsgSize"] != float64(atoi(t, size)) || cli["n_iterations"] != 200.0 || cli["path"] != "memcpy" {
			t.Errorf("%s: client report %v", test, cli)
		}
		for side, m := range map[string]map[string]any{"client": cli, "server": srv.m} {
			if info, _ := m["test_info"].(map[string]any); len(m) != 0 && info["Number_of_qps"] != float64(r1.qps) {
				t.Errorf("%s -q %d: the %s's Number_of_qps is %v", test, r1.qps, side, info["Number_of_qps"])
			}
		}
		fig := "BW_average"
		if strings.Contains(test, "lat") {
			fig = "t_typical"
		}
		if v, _ := cli[fig].(float64); v <= 0 {
			t.Errorf("%s: client %s = %v", test, fig, cli[fig])
		}
		switch {
		case strings.Contains(test, "lat") && len(srv.m) != 0:
			t.Errorf("%s: a latency server printed a report: %v", test, srv.m)
		case !strings.Contains(test, "lat") && (srv.m["test"] != test || srv.m["BW_average"] != cli["BW_average"] || srv.m["MsgSize"] != cli["MsgSize"]):
			t.Errorf("%s: server report %v, want the client's figures %v", test, srv.m, cli)
		}
	}
	if _, errs, code := run(t, "", "--socket", env.Socket, "perf", "write_bw", "--vm", "vmC", "-p", "19199", "-n", "10", "10.66.0.1"); code == 0 || !regexp.MustCompile(`connect to 10.66.0.1 port 19199: (REJECTED|UNREACHABLE)`).MatchString(errs) {
		t.Errorf("a client with no server: exit %d, %q", code, errs)
	}
	if _, errs, code := run(t, "", "--socket", env.Socket, "perf", "write_bw", "-n", "10", "10.66.0.1"); code != exitUsage || !strings.Contains(errs, "--vm NAME") {
		t.Errorf("a client without --vm: exit %d, %q", code, errs)
	}
}

// TestPerfServerClientBidir runs write_bw, read_bw and atomic_bw with -b
// between a server in vmS and a client in vmC: both report the same
// figures, marked bidirectional, and both directions ran: while the run
// goes on, the QPs of each VM complete the test's operations (the agent's
// per-QP counters, sampled; a server without -b completes none).
func TestPerfServerClientBidir(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vmS", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.67.0.1"}})
	env.Define(t, "vmC", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.67.0.2"}})
	// sample returns the most operations each VM's QPs had completed at
	// once, sampled until done is closed.
	sample := func(done chan struct{}) chan map[string]uint64 {
		out := make(chan map[string]uint64, 1)
		go func() {
			most := map[string]uint64{}
			ag, err := vrdma.DialAgent(t.Context(), vrdma.WithSocket(env.Socket))
			if err != nil {
				t.Error(err)
				out <- most
				return
			}
			defer ag.Close()
			for {
				select {
				case <-done:
					out <- most
					return
				default:
				}
				st, err := ag.Status(t.Context())
				if err != nil {
					continue
				}
				for _, v := range st.VMs {
					var n uint64
					for _, q := range v.QPs {
						for _, c := range q.Counters.Ops {
							n += c
						}
					}
					most[v.Name] = max(most[v.Name], n)
				}
			}
		}()
		return out
	}
	const iters = 200000
	for i, test := range []string{"write_bw", "read_bw", "atomic_bw"} {
		port := fmt.Sprint(19300 + i)
		size := "64"
		if test == "atomic_bw" {
			size = "8"
		}
		srvc := make(chan [2]string, 1)
		go func() {
			out, errs, code := run(t, "", "--socket", env.Socket, "perf", test, "--vm", "vmS", "-p", port, "--out_json")
			srvc <- [2]string{out, fmt.Sprintf("exit %d: %s", code, errs)}
		}()
		done := make(chan struct{})
		most := sample(done)
		var cliOut, cerrs string
		for try := 0; try < 50; try++ {
			out, errs, code := run(t, "", "--socket", env.Socket, "perf", test, "--vm", "vmC", "-p", port, "-s", size, "-n", fmt.Sprint(iters), "-b", "--out_json", "10.67.0.1")
			if code == 0 {
				cliOut = out
				break
			}
			cerrs = errs // the server may not listen yet
			time.Sleep(50 * time.Millisecond)
		}
		close(done)
		srv := <-srvc
		var cli, sm map[string]any
		if json.Unmarshal([]byte(cliOut), &cli) != nil || json.Unmarshal([]byte(srv[0]), &sm) != nil {
			t.Fatalf("%s -b: client %q %q; server %q %s", test, cliOut, cerrs, srv[0], srv[1])
		}
		for side, m := range map[string]map[string]any{"client": cli, "server": sm} {
			info, _ := m["test_info"].(map[string]any)
			if m["test"] != test || info["bidirectional"] != true || !(m["BW_average"].(float64) > 0) || m["n_iterations"] != float64(iters) {
				t.Errorf("%s -b: the %s's report %v", test, side, m)
			}
		}
		if sm["BW_average"] != cli["BW_average"] || sm["MsgRate"] != cli["MsgRate"] {
			t.Errorf("%s -b: the server reports BW %v, rate %v; the client %v, %v: want the same sum", test, sm["BW_average"], sm["MsgRate"], cli["BW_average"], cli["MsgRate"])
		}
		m := <-most
		for _, vm := range []string{"vmS", "vmC"} {
			if m[vm] < 1000 {
				t.Errorf("%s -b: %s's QPs were seen with %d operations completed, want its direction's (%d)", test, vm, m[vm], iters)
			}
		}
		t.Logf("%s -b: %.2f MiB/s, %.3f Mpps both ways; operations seen completed: %v", test, cli["BW_average"], cli["MsgRate"], m)
	}
	// send_bw has no other direction: the client refuses before it
	// connects (and a server refuses such a Hello: TestHelloRoundTrip).
	if _, errs, code := run(t, "", "--socket", env.Socket, "perf", "send_bw", "--vm", "vmC", "-p", "19399", "-b", "10.67.0.1"); code != exitUsage || !strings.Contains(errs, "-b runs write_bw") {
		t.Errorf("send_bw -b: exit %d, %q", code, errs)
	}
}

// TestPerfServerClientHostAddress runs perf's server in vmS and its client
// in vmC by the host's address 127.0.0.1 instead of the adapter's, as
// perftest's client would on a host with Linux's software RoCE: the
// server holds its port of the host's addresses, and the client's three
// QPs reach it; a second server in another VM on that port fails while the
// first holds it; a client by the name localhost reaches it too.
func TestPerfServerClientHostAddress(t *testing.T) {
	isolate(t)
	env := testenv.Start(t)
	env.Define(t, "vmS", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.66.0.1"}})
	env.Define(t, "vmC", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.66.0.2"}})
	env.Define(t, "vmT", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.66.0.3"}})
	const port = "19177"
	srvc := make(chan string, 1)
	go func() {
		_, errs, code := run(t, "", "--socket", env.Socket, "perf", "write_bw", "--vm", "vmS", "-p", port, "--out_json")
		srvc <- fmt.Sprintf("exit %d: %s", code, errs)
	}()
	var out, errs string
	code := -1
	for try := 0; try < 50 && code != 0; try++ {
		if try > 0 {
			time.Sleep(50 * time.Millisecond) // the server may not listen yet
		}
		out, errs, code = run(t, "", "--socket", env.Socket, "perf", "write_bw", "--vm", "vmC", "-p", port, "-n", "100", "-q", "3", "--out_json", "127.0.0.1")
	}
	if code != 0 {
		t.Fatalf("client by 127.0.0.1: exit %d: %s", code, errs)
	}
	var cli map[string]any
	json.Unmarshal([]byte(out), &cli)
	if v, _ := cli["BW_average"].(float64); v <= 0 || cli["path"] != "memcpy" {
		t.Errorf("client report %v", cli)
	}
	if s := <-srvc; !strings.HasPrefix(s, "exit 0") {
		t.Errorf("server: %s", s)
	}

	// vmS holds the port again while vmT's server tries it.
	hold := make(chan string, 1)
	go func() {
		_, errs, code := run(t, "", "--socket", env.Socket, "perf", "write_bw", "--vm", "vmS", "-p", port, "--out_json")
		hold <- fmt.Sprintf("exit %d: %s", code, errs)
	}()
	var terrs string
	for try := 0; try < 50; try++ {
		time.Sleep(50 * time.Millisecond)
		var tcode int
		if _, terrs, tcode = run(t, "", "--socket", env.Socket, "perf", "write_bw", "--vm", "vmT", "-p", port, "--out_json"); tcode != 0 && strings.Contains(terrs, "held by VM vmS") {
			break
		}
	}
	if !strings.Contains(terrs, "held by VM vmS") {
		t.Errorf("a second server in vmT on port %s: %q, want a refusal naming vmS", port, terrs)
	}
	// End vmS's server with a client by a name of the host's address
	// (looked up by the client, as getaddrinfo would).
	code = -1
	for try := 0; try < 50 && code != 0; try++ {
		if try > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		_, errs, code = run(t, "", "--socket", env.Socket, "perf", "write_bw", "--vm", "vmC", "-p", port, "-n", "10", "localhost")
	}
	if code != 0 {
		t.Errorf("client by the name localhost: exit %d: %s", code, errs)
	}
	if s := <-hold; !strings.HasPrefix(s, "exit 0") {
		t.Errorf("server: %s", s)
	}
}

// TestPerfQPsAndMTU checks -q (several QP pairs, BW tests), -m (path MTU,
// QPs connected out of band) and what --local measures of the agents:
// CPU time per work request and memory per QP.
func TestPerfQPsAndMTU(t *testing.T) {
	isolate(t)
	var m map[string]any
	runJSON(t, &m, "perf", "send_bw", "--local", "--path", "memcpy", "-q", "4", "-t", "16", "-s", "64", "-n", "300", "--out_json")
	info := m["test_info"].(map[string]any)
	if info["Number_of_qps"] != 4.0 || m["n_iterations"] != 300.0 {
		t.Errorf("-q 4: Number_of_qps %v, n_iterations %v; want 4 and 300 (per QP, as perftest)", info["Number_of_qps"], m["n_iterations"])
	}
	if c, ok := info["connect_us_per_qp"].(float64); !ok || c <= 0 {
		t.Errorf("connect_us_per_qp = %v, want a positive number", info["connect_us_per_qp"])
	}
	if cpu, ok := m["agent_cpu_us_per_op"].(float64); !ok || cpu <= 0 {
		t.Errorf("agent_cpu_us_per_op = %v, want a positive number", m["agent_cpu_us_per_op"])
	}
	if rss, ok := info["agent_rss_kib_per_qp"].(float64); !ok {
		t.Errorf("agent_rss_kib_per_qp = %v, want a number", info["agent_rss_kib_per_qp"])
	} else if rss <= 0 {
		t.Logf("agent_rss_kib_per_qp = %v: the agent's RSS did not grow (pages reused)", rss)
	}

	runJSON(t, &m, "perf", "read_lat", "--local", "-m", "512", "-s", "2048", "-n", "100", "--out_json")
	info = m["test_info"].(map[string]any)
	if info["Mtu"] != 512.0 || info["Data_ex_method"] != "Ethernet" || info["rdma_cm_QPs"] != "OFF" {
		t.Errorf("-m 512: Mtu %v, Data_ex_method %v, rdma_cm_QPs %v; want 512, Ethernet, OFF", info["Mtu"], info["Data_ex_method"], info["rdma_cm_QPs"])
	}

	out := runOK(t, "perf", "write_bw", "--local", "-q", "2", "-s", "4096", "-n", "100")
	for _, want := range []string{" Number of qps   : 2\t", " 4096       100 ", " Agent CPU       : ", " µs per work request", " Agent memory    : ", " Connect         : "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	for _, args := range [][]string{{"write_lat", "--local", "-q", "2"}, {"write_bw", "--local", "-q", "0"}, {"write_bw", "--local", "-m", "1000"},
		{"write_bw", "--local", "-q", "1024", "-t", "128"}, {"write_bw", "--vm", "vm1", "-m", "512"}} {
		_, errs, code := run(t, "", append([]string{"perf"}, args...)...)
		if code != exitUsage || !strings.Contains(errs, "perf: ") {
			t.Errorf("perf %v: exit %d, %q; want a usage error", args, code, errs)
		}
	}
}

// TestPerfPerftestFlags checks perftest's flags that users bring along:
// -x, -F and -R are accepted (and -R refuses -m), -N leaves the peak out,
// and --output prints one figure per size, which must be the JSON
// report's.
func TestPerfPerftestFlags(t *testing.T) {
	isolate(t)
	out := runOK(t, "perf", "write_bw", "--local", "-s", "4096", "-n", "300", "-x", "0", "-F", "-R", "-N")
	if !strings.Contains(out, "WARNING: BW peak won't be measured in this run.") || !strings.Contains(out, " 4096       300              0.00 ") {
		t.Errorf("write_bw -x 0 -F -R -N: no peak warning or a peak measured:\n%s", out)
	}
	for _, tc := range []struct {
		test, output string
	}{{"write_bw", "bandwidth"}, {"write_bw", "message_rate"}, {"write_lat", "latency"}} {
		out := strings.TrimSpace(runOK(t, "perf", tc.test, "--local", "-s", "64", "-n", "300", "--output="+tc.output))
		v, err := strconv.ParseFloat(out, 64)
		if err != nil || v <= 0 || strings.Contains(out, "\n") {
			t.Errorf("%s --output=%s printed %q, want one positive figure", tc.test, tc.output, out)
		}
	}
	for _, args := range [][]string{
		{"write_bw", "--local", "-R", "-m", "1024"},
		{"write_bw", "--local", "--output=latency"},
		{"write_lat", "--local", "--output=bandwidth"},
		{"write_bw", "--local", "--output=everything"},
		{"write_lat", "--local", "-N"},
		{"write_bw", "--local", "-x", "-1"},
	} {
		if _, errs, code := run(t, "", append([]string{"perf"}, args...)...); code != exitUsage {
			t.Errorf("perf %s: exit %d, want a usage error: %s", strings.Join(args, " "), code, errs)
		}
	}
}

// TestPerfBidirInlineForever: -b runs both ways and says so, -I sets the
// QPs' max_inline_data, the combinations perftest refuses are refused, and
// --run_infinitely prints a line per -D period until SIGINT, then exits 0.
func TestPerfBidirInlineForever(t *testing.T) {
	isolate(t)
	var m map[string]any
	runJSON(t, &m, "perf", "write_bw", "--local", "-b", "-s", "4096", "-n", "300", "-I", "64", "--out_json")
	info, _ := m["test_info"].(map[string]any)
	if info["bidirectional"] != true || info["Max_inline_data"] != 64.0 || !(m["BW_average"].(float64) > 0) {
		t.Errorf("write_bw -b -I 64: test_info %v, BW_average %v", info, m["BW_average"])
	}
	for _, args := range [][]string{
		{"write_lat", "--local", "-b"},
		{"send_bw", "--local", "-b"},
		{"write_bw", "--local", "-I", "4096"},
		{"write_lat", "--local", "--run_infinitely"},
		{"write_bw", "--local", "--run_infinitely", "--out_json"},
		{"write_bw", "--local", "--run_infinitely", "-a"},
	} {
		if _, errs, code := run(t, "", append([]string{"perf"}, args...)...); code != exitUsage {
			t.Errorf("perf %s: exit %d, want a usage error: %s", strings.Join(args, " "), code, errs)
		}
	}

	cmd := exec.Command(testenv.Binary(t, "vrdmactl"), "perf", "write_bw", "--local", "--run_infinitely", "-D", "1", "-s", "4096")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	lines := 0
	for lines < 3 && sc.Scan() {
		if strings.HasPrefix(sc.Text(), " 4096 ") {
			lines++
		}
	}
	if lines < 3 {
		t.Fatalf("--run_infinitely printed %d result lines before it ended:\n%s", lines, stderr.String())
	}
	cmd.Process.Signal(os.Interrupt)
	var rest []string
	for sc.Scan() {
		rest = append(rest, sc.Text())
	}
	if err := cmd.Wait(); err != nil || len(rest) == 0 || rest[len(rest)-1] != perfRule {
		t.Errorf("--run_infinitely after SIGINT: %v, last lines %q\n%s", err, rest, stderr.String())
	}
}
