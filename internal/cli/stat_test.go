// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestStat runs known traffic between two VMs and checks what vrdmactl
// stat prints of it, as text and as JSON, for all QPs and one VM's; and
// that an unknown VM is an error.
func TestStat(t *testing.T) {
	env := testenv.Start(t)
	a, b := env.Open(t, "s1", testenv.VMOptions{}), env.Open(t, "s2", testenv.VMOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, a.Adapters()[0], b.Adapters()[0], perf.PairConfig{BufSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if _, err := p.Run(ctx, perf.Config{Test: perf.WriteBW, Size: 1024, Iters: 250}); err != nil {
		t.Fatal(err)
	}
	out := runOK(t, "--socket", env.Socket, "stat")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// The pair's two QPs took memcpy; its one connect was dialed and
	// accepted on this host.
	if len(lines) != 7 || !strings.HasPrefix(lines[0], "link s1/vrdma0 rdma_write 250 ") || !strings.HasPrefix(lines[1], "link s2/vrdma0 ") ||
		!strings.HasPrefix(lines[2], "link s1/vrdma0 qp ") || !strings.Contains(lines[2], " path memcpy") ||
		!strings.Contains(lines[2], " rdma_write 250 ") || !strings.Contains(lines[2], " send_bytes 256000 ") || !strings.HasPrefix(lines[3], "link s2/vrdma0 qp ") ||
		lines[4] != "paths qp memcpy 2" || lines[5] != "cm dial established 1 rejected 0 unreachable 0 timeout 0 error 0" ||
		lines[6] != "cm accept accepted 1 rejected 0 no_listener 0 abandoned 0 failed 0" {
		t.Fatalf("stat:\n%s", out)
	}
	var rep statReport
	runJSON(t, &rep, "--socket", env.Socket, "stat", "s2", "-o", "json")
	if len(rep.QPs) != 1 || rep.QPs[0].VM != "s2" || rep.QPs[0].Counters.Ops["RDMA_WRITE"] != 0 || len(rep.Adapters) != 1 {
		t.Fatalf("stat s2 -o json: %+v", rep)
	}
	if len(rep.PathDecisions) != 1 || rep.PathDecisions[0] != (vrdma.PathDecisionCount{Object: "qp", Path: "memcpy", Count: 2}) || len(rep.Connects) != 10 {
		t.Fatalf("stat s2 -o json: decisions %+v, connects %+v", rep.PathDecisions, rep.Connects)
	}
	// The adapter keeps its destroyed QPs' counts.
	p.Close(context.Background())
	runJSON(t, &rep, "--socket", env.Socket, "stat", "s1/vrdma0", "-o", "json")
	if len(rep.QPs) != 0 || len(rep.Adapters) != 1 || rep.Adapters[0].Counters.Ops["RDMA_WRITE"] != 250 || rep.Adapters[0].Counters.SendBytes != 256000 {
		t.Fatalf("stat s1/vrdma0 after the pair closed: %+v", rep)
	}
	if _, errs, code := run(t, "", "--socket", env.Socket, "stat", "nosuchvm"); code != exitFailure || !strings.Contains(errs, `no VM "nosuchvm"`) {
		t.Fatalf("stat nosuchvm: exit %d, %s", code, errs)
	}
}

// TestStatusRejected checks that status prints, with a QP's path and
// reason, the candidates path selection rejected and why.
func TestStatusRejected(t *testing.T) {
	env := testenv.StartWith(t, testenv.Options{RDMALoop: netip.MustParseAddrPort("127.0.33.22:4791")})
	a, b := env.Open(t, "j1", testenv.VMOptions{}), env.Open(t, "j2", testenv.VMOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, a.Adapters()[0], b.Adapters()[0], perf.PairConfig{BufSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	out := runOK(t, "--socket", env.Socket, "status")
	if !strings.Contains(out, "rdma: both VMs (j1, j2) on host") || !strings.Contains(out, "; rejected: memcpy: the agent runs with an rdma loop (tests only)") {
		t.Fatalf("status does not show the rejected candidates:\n%s", out)
	}
}

// TestStatWatch runs stat -w for longer than a management call's 15 s
// bound, with its output not a terminal: it prints every interval until
// --count, each snapshot after a "# TIME" line, with no terminal codes.
func TestStatWatch(t *testing.T) {
	env := testenv.Start(t)
	env.Open(t, "w1", testenv.VMOptions{})
	t0 := time.Now()
	out := runOK(t, "--socket", env.Socket, "stat", "-w", "--interval", "1s", "--count", "17")
	took := time.Since(t0)
	if took < 16*time.Second || strings.Count(out, "# ") != 17 || strings.Contains(out, "\033") {
		t.Fatalf("stat -w --count 17 took %v and printed %d snapshots (terminal codes: %v):\n%s",
			took, strings.Count(out, "# "), strings.Contains(out, "\033"), out)
	}
	for _, l := range strings.Split(out, "\n") {
		if ts, ok := strings.CutPrefix(l, "# "); ok {
			if _, err := time.Parse(time.RFC3339, ts); err != nil {
				t.Fatalf("snapshot header %q: %v", l, err)
			}
		}
	}
	if _, errs, code := run(t, "", "--socket", env.Socket, "stat", "-w", "--count", "-1"); code != exitUsage || !strings.Contains(errs, "--count") {
		t.Fatalf("stat -w --count -1: exit %d, %s", code, errs)
	}
}

// TestOutputYAML checks -o yaml: the JSON document's fields under the same
// names, as YAML.
func TestOutputYAML(t *testing.T) {
	env := testenv.Start(t)
	env.Open(t, "y1", testenv.VMOptions{})
	var j map[string]any
	runJSON(t, &j, "--socket", env.Socket, "-o", "json", "status")
	y := runOK(t, "--socket", env.Socket, "-o", "yaml", "status")
	var fromYAML map[string]any
	if err := yaml.Unmarshal([]byte(y), &fromYAML); err != nil || !strings.HasPrefix(y, "---\n") {
		t.Fatalf("status -o yaml is not a YAML document: %v\n%s", err, y)
	}
	if len(fromYAML) != len(j) || fromYAML["vms"] == nil {
		t.Fatalf("status -o yaml has fields %v, -o json %v", keys(fromYAML), keys(j))
	}
	isolate(t)
	y = runOK(t, "perf", "write_bw", "--local", "-s", "64", "-n", "100", "-o", "yaml")
	if err := yaml.Unmarshal([]byte(y), &fromYAML); err != nil || fromYAML["BW_average"] == nil {
		t.Fatalf("perf -o yaml: %v\n%s", err, y)
	}
	if _, errs, code := run(t, "", "-o", "xml", "version"); code != exitUsage || !strings.Contains(errs, "text, json or yaml") {
		t.Fatalf("-o xml: exit %d, %s", code, errs)
	}
}

// keys returns m's keys, for messages.
func keys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
