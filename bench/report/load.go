// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Data is everything one bench/run collected in its work directory. A part
// that is missing is empty, and the report says "not measured" for it.
type Data struct {
	Meta     Meta
	Machine  Machine
	Packages map[string]string // Debian package -> version
	Go       []Result          // vrdmactl perf, go/rN/*.json
	Scale    []Result          // vrdmactl perf -q N, scale/*.json
	Sweep    map[string]map[int]float64
	Drop     []DropResult // perftest on the drop-in, perftest/rN/*.txt, and the Go library beside it, perftest/rN/golib/*.txt
	Peers    []PeersRound // bench/peers.sh --json, peers/rN.json
	UCX      []UCXResult  // ucx_perftest on UCP over vrdma's rc_verbs, ucx/rN/*.txt
	Copy     []CopyResult // BenchmarkCopy*, copy/rN.txt
	// The tcp and rdma paths between two host agents: go test -bench
	// 'Benchmark(TCP|RDMA)…' ./internal/perf, paths/bench.txt, and the
	// benchmarks of it that failed or were skipped.
	HostBench []GoBench
	HostNotes []BenchNote
	Profiles  map[string]Profile
	Commands  []string // commands.txt, in order
	Errors    []string // errors.txt: measurements that failed
	Raw       []RawFile
}

// Meta is meta.json, written by bench/run at the end of the run.
type Meta struct {
	Date       string `json:"date"`
	Command    string `json:"command"`
	Commit     string `json:"commit"`
	DirtyFiles int    `json:"dirty_files"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
	Rounds     int    `json:"rounds"`
	Quick      bool   `json:"quick"`
	Profile    bool   `json:"profile"`
	ElapsedS   int    `json:"elapsed_s"`
	LoadBefore string `json:"loadavg_before"`
	LoadAfter  string `json:"loadavg_after"`
}

// Machine is what lscpu.txt says about the CPUs.
type Machine struct {
	Model string   // lscpu's "Model name"
	CPUs  string   // lscpu's "CPU(s)"
	Lines []string // lscpu's whole output, for the appendix
}

// Key names a vrdmactl perf figure: a test on a path at a message size, in
// doorbell or async mode, over QPs QP pairs.
type Key struct {
	Path  string
	Test  string
	Size  int
	Async bool
	QPs   int
}

// Result is one size's figures of one vrdmactl perf run, with perftest's
// keys; a figure the run did not report is NaN.
type Result struct {
	Key
	Round     int
	File      string
	Iters     int
	TXDepth   int
	BWAverage float64 // MiB/s
	MsgRate   float64 // Mpps
	TTypical  float64 // µs
	AgentCPU  float64 // the agents' CPU time per work request, µs
	Wakeups   float64 // thread wake-ups per work request: the agents' (but their runtime monitors') and the workloads'
	Monitor   float64 // the agents' Go runtime monitor threads' wake-ups per work request
	RSSPerQP  float64 // the agents' resident memory per QP, KiB
	ConnectUs float64 // the mean time to connect one QP pair, µs
}

// DropResult is one perftest run on the drop-in libibverbs, or the Go
// library's run of the same test between the same two VMs.
type DropResult struct {
	Lib           string // LibC (perftest) or LibGo (vrdmactl perf as server and client)
	Path, Program string // ib_write_bw, ib_write_lat, ib_send_bw
	Size          int
	Round         int
	BWAverage     float64 // MiB/s (perftest's MB/sec is 2^20 bytes per second)
	MsgRate       float64 // Mpps
	TTypical      float64 // µs
}

// The libraries a DropResult ran on.
const (
	LibC  = "C"  // unmodified perftest on the drop-in libibverbs
	LibGo = "Go" // vrdmactl perf, the Go library, in two processes as perftest
)

// UCXResult is one ucx_perftest run on UCP over vrdma's rc_verbs between
// two VMs of a path (UCX_TLS=rc_verbs,ud_verbs:aux, through vrdmactl exec).
type UCXResult struct {
	Path, Test string // tag_lat, tag_bw, ucp_put_bw
	Size       int
	Round      int
	Lat        float64 // the median latency, one way, µs (UCX's 50.0_percentile_lat); NaN for a bandwidth test
	BW         float64 // the whole run's bandwidth, MiB/s (UCX's overall_bw)
}

// PeersRound is one bench/peers.sh --json run.
type PeersRound struct {
	Round     int
	Figures   map[string]float64 // the figures that are not null
	Placement map[string]string  // test id -> vCPU placement (near, far, mixed)
	Errors    []string
}

// CopyResult is one copy() benchmark: BenchmarkCopy (Go heap) or
// BenchmarkCopyMemfd, at one size.
type CopyResult struct {
	Bench string
	Size  int
	Round int
	MiBps float64
}

// GoBench is one result line of `go test -bench`: a benchmark, the
// iterations it ran (b.N) and its figures by unit.
type GoBench struct {
	Name    string // without the -GOMAXPROCS suffix: BenchmarkRDMAWriteBW/64KiB/veth
	Iters   int
	Metrics map[string]float64 // unit -> value: "ns/op", "MB/s", "MiB/s", "µs-typical", "Mpps", ...
}

// BenchNote is a benchmark of `go test -bench` that failed or was skipped,
// with what it logged to say why.
type BenchNote struct {
	Name   string // without the -GOMAXPROCS suffix
	Status string // "FAIL" or "SKIP"
	Why    string // its first log line other than its clusters' start; "" if none
}

// Profile is a system-wide perf profile taken during one more run of a
// missed target's figure.
type Profile struct {
	Command string
	Top     []string // perf report's first lines, one symbol each
}

// RawFile is a raw output for the appendix.
type RawFile struct {
	Title, Text string
}

// Load reads the work directory dir. Missing files and directories are not
// errors (their figures are "not measured"); a file that is there but cannot
// be parsed is, and the error names it.
func Load(dir string) (*Data, error) {
	d := &Data{Sweep: map[string]map[int]float64{}, Profiles: map[string]Profile{}, Packages: map[string]string{}}
	if err := readJSON(filepath.Join(dir, "meta.json"), &d.Meta); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	d.Machine = readLscpu(filepath.Join(dir, "lscpu.txt"))
	for _, line := range readLines(filepath.Join(dir, "packages.txt")) {
		if name, ver, ok := strings.Cut(line, "\t"); ok {
			d.Packages[name] = ver
		}
	}
	d.Commands = readLines(filepath.Join(dir, "commands.txt"))
	d.Errors = readLines(filepath.Join(dir, "errors.txt"))

	for _, f := range glob(dir, "go", "r*", "*.json") {
		rs, err := loadPerf(f, roundOf(filepath.Base(filepath.Dir(f))))
		if err != nil {
			return nil, err
		}
		d.Go = append(d.Go, rs...)
	}
	for _, f := range glob(dir, "scale", "*.json") {
		rs, err := loadPerf(f, 1)
		if err != nil {
			return nil, err
		}
		d.Scale = append(d.Scale, rs...)
	}
	for _, f := range glob(dir, "sweep", "vrdma-*.json") {
		rs, err := loadPerf(f, 1)
		if err != nil {
			return nil, err
		}
		series := strings.TrimSuffix(filepath.Base(f), ".json")
		for _, r := range rs {
			d.sweepPoint(series, r.Size, r.BWAverage)
		}
	}
	for _, f := range glob(dir, "sweep", "ucx-*.txt") {
		// ucx-shm.4096.txt: series, size
		parts := strings.Split(strings.TrimSuffix(filepath.Base(f), ".txt"), ".")
		size, err := strconv.Atoi(parts[len(parts)-1])
		if len(parts) != 2 || err != nil {
			continue
		}
		bw, err := loadUCX(f)
		if err != nil {
			return nil, err
		}
		d.sweepPoint(parts[0], size, bw)
	}
	for _, f := range glob(dir, "perftest", "r*", "*.txt") {
		r, err := loadPerftest(f, roundOf(filepath.Base(filepath.Dir(f))))
		if err != nil {
			return nil, err
		}
		r.Lib = LibC
		d.Drop = append(d.Drop, r)
	}
	for _, f := range glob(dir, "perftest", "r*", "golib", "*.txt") {
		r, err := loadPerftest(f, roundOf(filepath.Base(filepath.Dir(filepath.Dir(f)))))
		if err != nil {
			return nil, err
		}
		r.Lib = LibGo
		d.Drop = append(d.Drop, r)
	}
	for _, f := range glob(dir, "ucx", "r*", "*.txt") {
		r, err := loadUCXRun(f, roundOf(filepath.Base(filepath.Dir(f))))
		if err != nil {
			return nil, err
		}
		d.UCX = append(d.UCX, r)
	}
	for _, f := range glob(dir, "peers", "r*.json") {
		p, err := loadPeers(f, roundOf(filepath.Base(f)))
		if err != nil {
			return nil, err
		}
		d.Peers = append(d.Peers, p)
	}
	for _, f := range glob(dir, "peers", "r*.txt") {
		if b, err := os.ReadFile(f); err == nil {
			d.Raw = append(d.Raw, RawFile{fmt.Sprintf("bench/peers.sh, round %d", roundOf(filepath.Base(f))), string(b)})
		}
	}
	for _, f := range glob(dir, "copy", "r*.txt") {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		cs, err := parseCopy(string(b), roundOf(filepath.Base(f)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		d.Copy = append(d.Copy, cs...)
		d.Raw = append(d.Raw, RawFile{fmt.Sprintf("copy(), round %d", roundOf(filepath.Base(f))), string(b)})
	}
	if f := filepath.Join(dir, "paths", "bench.txt"); exists(f) {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if d.HostBench, d.HostNotes, err = parseGoBench(string(b)); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	for _, f := range glob(dir, "profile", "*.txt") {
		id := strings.TrimSuffix(filepath.Base(f), ".txt")
		if id == "misses" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		cmd, _ := os.ReadFile(filepath.Join(dir, "profile", id+".cmd"))
		d.Profiles[id] = Profile{Command: strings.TrimSpace(string(cmd)), Top: perfTop(string(b), 15)}
	}
	return d, nil
}

func (d *Data) sweepPoint(series string, size int, mibps float64) {
	if math.IsNaN(mibps) {
		return
	}
	if d.Sweep[series] == nil {
		d.Sweep[series] = map[int]float64{}
	}
	d.Sweep[series][size] = mibps
}

// glob lists the files matching the pattern under dir, sorted; none when
// the directory is missing.
func glob(dir string, elem ...string) []string {
	m, _ := filepath.Glob(filepath.Join(append([]string{dir}, elem...)...))
	sort.Strings(m)
	return m
}

var roundRE = regexp.MustCompile(`^r([0-9]+)(\.[a-z]+)?$`)

// roundOf is the round number of a name "r3" or "r3.json"; 0 when there is none.
func roundOf(name string) int {
	m := roundRE.FindStringSubmatch(name)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// exists says whether file is there (as far as Stat can tell).
func exists(file string) bool { _, err := os.Stat(file); return err == nil }

// readJSON decodes file into v; a decoding error names the file.
func readJSON(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: malformed JSON: %w", file, err)
	}
	return nil
}

// readLines returns the file's non-empty lines; none when it is missing.
func readLines(file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimRight(l, " \r\t"); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func readLscpu(file string) Machine {
	var m Machine
	m.Lines = readLines(file)
	for _, l := range m.Lines {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "Model name":
			m.Model = strings.TrimSpace(v)
		case "CPU(s)":
			m.CPUs = strings.TrimSpace(v)
		}
	}
	return m
}

// perfFigures is one size's keys in vrdmactl perf's JSON report.
type perfFigures struct {
	MsgSize   int      `json:"MsgSize"`
	Iters     int      `json:"n_iterations"`
	BWAverage *float64 `json:"BW_average"`
	MsgRate   *float64 `json:"MsgRate"`
	TTypical  *float64 `json:"t_typical"`
	AgentCPU  *float64 `json:"agent_cpu_us_per_op"`
	Agents    *float64 `json:"agent_wakeups_per_op"`
	Monitor   *float64 `json:"agent_monitor_wakeups_per_op"`
	Workloads *float64 `json:"workload_wakeups_per_op"`
}

// perfReport is vrdmactl perf's JSON report (--out_json_file): the figures at
// the top level for one size, under "results" with -a.
type perfReport struct {
	Test string `json:"test"`
	Path string `json:"path"`
	perfFigures
	Results  []perfFigures `json:"results"`
	TestInfo struct {
		QPs       int      `json:"Number_of_qps"`
		TXDepth   int      `json:"TX_depth"`
		Async     bool     `json:"async_mode"`
		RSSPerQP  *float64 `json:"agent_rss_kib_per_qp"`
		ConnectUs *float64 `json:"connect_us_per_qp"`
	} `json:"test_info"`
}

// loadPerf reads one vrdmactl perf JSON report: one Result per size.
func loadPerf(file string, round int) ([]Result, error) {
	var p perfReport
	if err := readJSON(file, &p); err != nil {
		return nil, err
	}
	if p.Test == "" || p.Path == "" {
		return nil, fmt.Errorf("%s: not a vrdmactl perf report (no test or path)", file)
	}
	figs := p.Results
	if len(figs) == 0 {
		figs = []perfFigures{p.perfFigures}
	}
	qps := max(p.TestInfo.QPs, 1)
	var out []Result
	for _, f := range figs {
		if f.MsgSize <= 0 {
			return nil, fmt.Errorf("%s: no MsgSize", file)
		}
		out = append(out, Result{
			Key:   Key{Path: p.Path, Test: p.Test, Size: f.MsgSize, Async: p.TestInfo.Async, QPs: qps},
			Round: round, File: file, Iters: f.Iters, TXDepth: p.TestInfo.TXDepth,
			BWAverage: val(f.BWAverage), MsgRate: val(f.MsgRate), TTypical: val(f.TTypical),
			AgentCPU: val(f.AgentCPU), Wakeups: val(f.Agents) - val(f.Monitor) + val(f.Workloads), Monitor: val(f.Monitor),
			RSSPerQP: val(p.TestInfo.RSSPerQP), ConnectUs: val(p.TestInfo.ConnectUs),
		})
	}
	return out, nil
}

// val is *p, or NaN for an absent (nil) figure.
func val(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// loadUCX reads ucx_perftest's -f -v output: a CSV header line that starts
// with "iterations", then the final line; the bandwidth is the
// "overall_bw" column (the whole run), in MiB/s (UCX's MB/s is 2^20 B/s).
func loadUCX(file string) (float64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	col := -1
	bw := math.NaN()
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Split(l, ",")
		if f[0] == "iterations" {
			for i, name := range f {
				if strings.TrimSpace(name) == "overall_bw" {
					col = i
				}
			}
			continue
		}
		if _, err := strconv.Atoi(strings.TrimSpace(f[0])); col >= 0 && err == nil && len(f) > col {
			if v, err := strconv.ParseFloat(strings.TrimSpace(f[col]), 64); err == nil {
				bw = v
			}
		}
	}
	if math.IsNaN(bw) {
		return 0, fmt.Errorf("%s: no overall_bw figure in ucx_perftest's output", file)
	}
	return bw, nil
}

// loadUCXRun reads a ucx_perftest client's -f -v output saved as
// PATH.TEST.SIZE.txt: the CSV header line that starts with "iterations",
// then the result line (UCX's log lines between them are skipped). The
// latency is the median column (50.0_percentile_lat, or typical_lat in
// other UCX versions), the bandwidth overall_bw.
func loadUCXRun(file string, round int) (UCXResult, error) {
	name := strings.Split(strings.TrimSuffix(filepath.Base(file), ".txt"), ".")
	if len(name) != 3 || !isInt(name[2]) {
		return UCXResult{}, fmt.Errorf("%s: not named PATH.TEST.SIZE.txt", file)
	}
	r := UCXResult{Path: name[0], Test: name[1], Round: round, Lat: math.NaN(), BW: math.NaN()}
	r.Size, _ = strconv.Atoi(name[2])
	b, err := os.ReadFile(file)
	if err != nil {
		return r, err
	}
	lat, bw := -1, -1
	found := false
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Split(strings.TrimSpace(l), ",")
		if f[0] == "iterations" {
			for i, c := range f {
				switch c = strings.TrimSpace(c); {
				case strings.HasSuffix(c, "percentile_lat") || c == "typical_lat":
					lat = i
				case c == "overall_bw":
					bw = i
				}
			}
			continue
		}
		if !isInt(f[0]) || lat < 0 || bw < 0 || len(f) <= max(lat, bw) {
			continue
		}
		lv, err1 := strconv.ParseFloat(strings.TrimSpace(f[lat]), 64)
		bv, err2 := strconv.ParseFloat(strings.TrimSpace(f[bw]), 64)
		if err1 != nil || err2 != nil {
			return r, fmt.Errorf("%s: malformed ucx_perftest result line %q", file, l)
		}
		r.Lat, r.BW, found = lv, bv, true
	}
	if !found {
		return r, fmt.Errorf("%s: no ucx_perftest result line (-f -v)", file)
	}
	if !strings.HasSuffix(r.Test, "_lat") {
		r.Lat = math.NaN()
	}
	return r, nil
}

// loadPerftest reads a perftest client's output saved as
// PATH.PROGRAM.SIZE.txt (or vrdmactl perf's, which prints perftest's
// report): its last result line, whose columns are perftest's
// (bandwidth: #bytes #iterations BW_peak BW_average MsgRate; latency:
// #bytes #iterations t_min t_max t_typical ...).
func loadPerftest(file string, round int) (DropResult, error) {
	name := strings.Split(strings.TrimSuffix(filepath.Base(file), ".txt"), ".")
	if len(name) != 3 {
		return DropResult{}, fmt.Errorf("%s: not named PATH.PROGRAM.SIZE.txt", file)
	}
	r := DropResult{Path: name[0], Program: name[1], Round: round, BWAverage: math.NaN(), MsgRate: math.NaN(), TTypical: math.NaN()}
	b, err := os.ReadFile(file)
	if err != nil {
		return r, err
	}
	lat := false
	var last []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "#bytes") {
			lat = strings.Contains(l, "t_typical")
		}
		f := strings.Fields(l)
		if len(f) >= 5 && isInt(f[0]) && isInt(f[1]) {
			last = f
		}
	}
	if last == nil {
		return r, fmt.Errorf("%s: no perftest result line", file)
	}
	col := func(i int) float64 {
		if i >= len(last) {
			return math.NaN()
		}
		v, err := strconv.ParseFloat(last[i], 64)
		if err != nil {
			return math.NaN()
		}
		return v
	}
	r.Size = int(col(0))
	if lat {
		r.TTypical = col(4)
	} else {
		r.BWAverage, r.MsgRate = col(3), col(4)
	}
	return r, nil
}

func isInt(s string) bool { _, err := strconv.Atoi(s); return err == nil }

// peersReport is the part of bench/peers.sh's JSON the report reads.
type peersReport struct {
	Schema  string              `json:"schema"`
	Figures map[string]*float64 `json:"figures"`
	Quality map[string]struct {
		Placement string `json:"vcpu_placement"`
	} `json:"quality"`
	Errors []string `json:"errors"`
}

func loadPeers(file string, round int) (PeersRound, error) {
	var p peersReport
	if err := readJSON(file, &p); err != nil {
		return PeersRound{}, err
	}
	if !strings.HasPrefix(p.Schema, "vrdma-peers/") {
		return PeersRound{}, fmt.Errorf("%s: not a bench/peers.sh report (schema %q)", file, p.Schema)
	}
	r := PeersRound{Round: round, Figures: map[string]float64{}, Placement: map[string]string{}, Errors: p.Errors}
	for k, v := range p.Figures {
		if v != nil {
			r.Figures[k] = *v
		}
	}
	for k, q := range p.Quality {
		r.Placement[k] = q.Placement
	}
	return r, nil
}

var copyRE = regexp.MustCompile(`^(BenchmarkCopy(?:Memfd)?)/([0-9]+)(B|KiB|MiB)(?:-[0-9]+)?\s+([0-9]+)\s+([0-9.]+) ns/op`)

// parseCopy reads `go test -bench 'BenchmarkCopy(Memfd)?$'` output. The
// bandwidth is computed from the size in the benchmark's name and ns/op, in
// MiB/s: Go's own "MB/s" column is 10^6 bytes per second.
func parseCopy(text string, round int) ([]CopyResult, error) {
	var out []CopyResult
	for _, l := range strings.Split(text, "\n") {
		m := copyRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		switch m[3] {
		case "KiB":
			n <<= 10
		case "MiB":
			n <<= 20
		}
		ns, err := strconv.ParseFloat(m[5], 64)
		if err != nil || ns <= 0 {
			return nil, fmt.Errorf("bad ns/op in %q", l)
		}
		out = append(out, CopyResult{Bench: m[1], Size: n, Round: round, MiBps: nsPerOpToMiBps(n, ns)})
	}
	return out, nil
}

var (
	benchLogRE     = regexp.MustCompile(`^\s+\S+\.go:[0-9]+: (.*)$`)
	benchStatusRE  = regexp.MustCompile(`--- (FAIL|SKIP): (Benchmark\S*)`)
	benchProcsRE   = regexp.MustCompile(`-[0-9]+$`)
	clusterStartRE = regexp.MustCompile(`^cluster \S+: [0-9]+ hosts? in `)
)

// parseGoBench reads the output of `go test -bench`, with -v or without:
// its result lines (name, iterations, then value and unit pairs), one per
// benchmark and -count repetition, in order; and the benchmarks that
// failed or were skipped, each once, with the first thing they logged
// other than their clusters' start (-v prints a benchmark's log before its
// "--- FAIL" or "--- SKIP" line, the default after it; the default does not
// print skips). A parent that failed because a sub-benchmark did is left
// out. Output with neither a result nor a failure is an error.
func parseGoBench(text string) ([]GoBench, []BenchNote, error) {
	var (
		out   []GoBench
		notes []BenchNote
		logs  []string // the log lines since the last line that is not one
		open  = -1     // the note whose reason may follow, without -v
	)
	seen := map[string]bool{}
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimRight(l, " \t\r")
		if m := benchLogRE.FindStringSubmatch(l); m != nil {
			if clusterStartRE.MatchString(m[1]) {
				continue
			}
			logs = append(logs, m[1])
			if open >= 0 && notes[open].Why == "" {
				notes[open].Why = m[1]
			}
			continue
		}
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			continue // a log message's continuation lines
		}
		if m := benchStatusRE.FindStringSubmatch(l); m != nil {
			name := benchProcsRE.ReplaceAllString(m[2], "")
			open = -1
			if k := m[1] + " " + name; !seen[k] {
				seen[k] = true
				why := ""
				if len(logs) > 0 {
					why = logs[0]
				}
				notes = append(notes, BenchNote{Name: name, Status: m[1], Why: why})
				open = len(notes) - 1
			}
			logs = nil
			continue
		}
		logs, open = nil, -1
		f := strings.Fields(l)
		if !strings.HasPrefix(l, "Benchmark") || len(f) < 2 || !isInt(f[1]) {
			continue // a benchmark's name alone (-v), goos:, PASS, FAIL, ...
		}
		if len(f) < 4 || len(f)%2 != 0 {
			return nil, nil, fmt.Errorf("malformed benchmark result %q", l)
		}
		r := GoBench{Name: benchProcsRE.ReplaceAllString(f[0], ""), Metrics: map[string]float64{}}
		r.Iters, _ = strconv.Atoi(f[1])
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, nil, fmt.Errorf("malformed benchmark result %q: %q is not a number", l, f[i])
			}
			r.Metrics[f[i+1]] = v
		}
		out = append(out, r)
	}
	// A parent fails with its sub-benchmark: keep the sub-benchmark.
	var kept []BenchNote
	for _, n := range notes {
		parent := false
		for _, o := range notes {
			parent = parent || strings.HasPrefix(o.Name, n.Name+"/")
		}
		if !parent {
			kept = append(kept, n)
		}
	}
	if len(out) == 0 && len(kept) == 0 {
		return nil, nil, errors.New("no benchmark result, failure or skip in go test's output")
	}
	return out, kept, nil
}

// perfTop keeps the first n sample lines of `perf report --stdio` (comments
// and blank lines dropped, trailing spaces trimmed).
func perfTop(text string, n int) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimRight(l, " \t\r")
		if strings.TrimSpace(l) == "" || strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if out = append(out, l); len(out) == n {
			break
		}
	}
	return out
}
