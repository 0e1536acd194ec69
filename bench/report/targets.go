// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Metric selects one figure of a vrdmactl perf or perftest result.
type Metric int

// The figures the report compares.
const (
	BW      Metric = iota // BW_average, MiB/s
	Rate                  // MsgRate, Mpps
	Lat                   // t_typical, µs
	CPU                   // agent_cpu_us_per_op, µs per work request
	Wake                  // thread wake-ups per work request: the agents' but their runtime monitors', and the workloads'
	Monitor               // agent_monitor_wakeups_per_op: the agents' Go runtime monitor threads' wake-ups per work request
)

// Unit is the metric's unit as the tables write it.
func (m Metric) Unit() string {
	return [...]string{"MiB/s", "Mpps", "µs", "µs per op", "per op", "per op"}[m]
}

func (r Result) get(m Metric) float64 {
	return [...]float64{r.BWAverage, r.MsgRate, r.TTypical, r.AgentCPU, r.Wakeups, r.Monitor}[m]
}

func (r DropResult) get(m Metric) float64 {
	return [...]float64{r.BWAverage, r.MsgRate, r.TTypical, math.NaN(), math.NaN(), math.NaN()}[m]
}

// key is the Key of a doorbell-mode figure over one QP pair.
func key(path, test string, size int) Key { return Key{Path: path, Test: test, Size: size, QPs: 1} }

// async is k in async mode.
func (k Key) async() Key { k.Async = true; return k }

// goRounds is a vrdmactl perf figure by round.
func (d *Data) goRounds(k Key, m Metric) map[int]float64 {
	out := map[int]float64{}
	for _, r := range d.Go {
		if v := r.get(m); r.Key == k && !math.IsNaN(v) {
			out[r.Round] = v
		}
	}
	return out
}

// goSamples is a vrdmactl perf figure's values, in round order.
func (d *Data) goSamples(k Key, m Metric) Samples { return values(d.goRounds(k, m)) }

// peerRounds is a bench/peers.sh figure by round.
func (d *Data) peerRounds(figure string) map[int]float64 {
	out := map[int]float64{}
	for _, p := range d.Peers {
		if v, ok := p.Figures[figure]; ok {
			out[p.Round] = v
		}
	}
	return out
}

// placement is the vCPU placement (bench/peers.sh's probe) of the rounds that
// measured a peer figure: "far", or "near, far" when the rounds differ.
func (d *Data) placement(figure string) string {
	id := figure
	for _, suf := range []string{"_MiBps", "_median_us", "_avg_us", "_p99_us", "_Gbps"} {
		id = strings.TrimSuffix(id, suf)
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range d.Peers {
		if pl := p.Placement[id]; pl != "" && pl != "unknown" && !seen[pl] {
			seen[pl] = true
			out = append(out, pl)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// copyRounds is a copy() figure (BenchmarkCopy or BenchmarkCopyMemfd) by round.
func (d *Data) copyRounds(bench string, size int) map[int]float64 {
	out := map[int]float64{}
	for _, c := range d.Copy {
		if c.Bench == bench && c.Size == size {
			out[c.Round] = c.MiBps
		}
	}
	return out
}

// dropRounds is a figure of the drop-in comparison by round: perftest's
// (lib LibC) or the Go library's between the same VMs (LibGo).
func (d *Data) dropRounds(lib, path, program string, size int, m Metric) map[int]float64 {
	out := map[int]float64{}
	for _, r := range d.Drop {
		if v := r.get(m); r.Lib == lib && r.Path == path && r.Program == program && r.Size == size && !math.IsNaN(v) {
			out[r.Round] = v
		}
	}
	return out
}

// dropSamples is a perftest figure on the drop-in, in round order.
func (d *Data) dropSamples(path, program string, size int, m Metric) Samples {
	return values(d.dropRounds(LibC, path, program, size, m))
}

// benchSamples is a go test -bench figure: benchmark name's metric in unit,
// one value per -count repetition, in the order they ran.
func (d *Data) benchSamples(name, unit string) Samples {
	var s Samples
	for _, b := range d.HostBench {
		if v, ok := b.Metrics[unit]; ok && b.Name == name {
			s = append(s, v)
		}
	}
	return s
}

// peerRef names a peer's figure: a key of bench/peers.sh's JSON and, for
// sizes peers.sh does not measure, a point of the sweep.
type peerRef struct {
	Label string // "UCX shm `ucp_put_bw`"
	Key   string // bench/peers.sh figure key
	Sweep string // sweep series (ucx-shm, ucx-tcp); "" for none
	Size  int
}

// peer returns the peer figure by round, and its label: bench/peers.sh's
// figure if any round has it, else the sweep's single point (round 0).
func (d *Data) peer(p peerRef) (map[int]float64, string) {
	if r := d.peerRounds(p.Key); len(r) > 0 {
		if pl := d.placement(p.Key); pl != "" && strings.Contains(p.Label, "shm") {
			return r, p.Label + " (" + pl + ")"
		}
		return r, p.Label
	}
	if v, ok := d.Sweep[p.Sweep][p.Size]; ok && p.Sweep != "" {
		return map[int]float64{0: v}, p.Label + " (sweep, one run)"
	}
	return nil, p.Label
}

// Status is a target's verdict on one run's figures.
type Status int

// The verdicts.
const (
	NotMeasured Status = iota
	Met
	Missed
)

// String is the verdict as the target table writes it.
func (s Status) String() string { return [...]string{notMeasured, "met", "missed"}[s] }

// Target is one row of the table of targets against the peers.
type Target struct {
	ID     string // names bench/analysis/ID.md and the profile
	Figure string // the row's figure; also the heading of its section under the misses
	Eval   func(d *Data) Outcome
}

// Outcome is a target evaluated on one run: the cells of its row.
type Outcome struct {
	Target
	Vrdma, Peer, Ratio, Goal string
	Status                   Status
	Detail                   string // which part missed, for a target of two parts
	ProfileArgs              string // vrdmactl perf's arguments (before --local) for one more run of the figure
}

// compare evaluates vrdma's figure v against the peer's p: the ratio of the
// medians, with the range of the per-round ratios in brackets, meets goal
// when it is at least goal (atLeast) or at most goal.
func compare(v, p map[int]float64, goal float64, atLeast bool) (string, Status) {
	if len(v) == 0 || len(p) == 0 {
		return "—", NotMeasured
	}
	r := values(v).Median() / values(p).Median()
	cell := ratio(r)
	if pr := byRound(v, p); len(pr) > 1 {
		cell += fmt.Sprintf(" (%s – %s)", ratio(pr.Min()), ratio(pr.Max()))
	}
	if (atLeast && r >= goal) || (!atLeast && r <= goal) {
		return cell, Met
	}
	return cell, Missed
}

// both combines the verdicts of a target of two parts: missed if either
// missed, met if both met.
func both(a, b Status) Status {
	switch {
	case a == Missed || b == Missed:
		return Missed
	case a == Met && b == Met:
		return Met
	}
	return NotMeasured
}

// single is a target of one ratio: vrdma's rounds v against the peer's p
// (labelled label), in unit, met when the ratio is at least (atLeast) or
// at most goal; args is the vrdmactl perf run --profile repeats.
func single(v, p map[int]float64, label, unit string, goal float64, atLeast bool, args string) Outcome {
	sign := "≤"
	if atLeast {
		sign = "≥"
	}
	o := Outcome{Vrdma: values(v).String() + " " + unit, Peer: label + " " + values(p).String() + " " + unit,
		Goal: fmt.Sprintf("%s %s", sign, strconv.FormatFloat(goal, 'f', 1, 64)), ProfileArgs: args}
	o.Ratio, o.Status = compare(v, p, goal, atLeast)
	return o
}

// Targets are the rows of the table of targets against the peers, in the
// table's order: the paths' bandwidth and latency against UCX, sockperf and
// copy(), then the latency targets (async mode against doorbell mode, the
// rdma path, memcpy-direct against UCX's shared memory).
var Targets = []Target{
	{ID: "tcp-bw-1mib", Figure: "tcp path, 1 MiB write bandwidth", Eval: func(d *Data) Outcome {
		p, label := d.peer(peerRef{"UCX tcp `tag_bw`", "ucx_tcp_tag_bw_1MiB_MiBps", "ucx-tcp", MiB})
		return single(d.goRounds(key("tcp", "write_bw", MiB), BW), p, label, "MiB/s", 1, true, "write_bw --path tcp -s 1048576 -D 5")
	}},
	{ID: "tcp-lat-8b", Figure: "tcp path, 8 B write latency (RTT/2, typical)", Eval: func(d *Data) Outcome {
		va := d.goRounds(key("tcp", "write_lat", 8).async(), Lat)
		vd := d.goRounds(key("tcp", "write_lat", 8), Lat)
		pu, lu := d.peer(peerRef{"UCX tcp `tag_lat`", "ucx_tcp_tag_lat_8B_median_us", "", 8})
		ps, ls := d.peer(peerRef{"sockperf TCP 14 B", "sockperf_tcp_pp_14B_median_us", "", 14})
		ra, sa := compare(va, pu, 1.5, false)
		rd, sd := compare(vd, ps, 1.5, false)
		o := Outcome{
			Vrdma: fmt.Sprintf("async %s; doorbell %s µs", values(va), values(vd)),
			Peer:  fmt.Sprintf("%s %s; %s %s µs", lu, values(pu), ls, values(ps)),
			Ratio: ra + " / " + rd, Goal: "≤ 1.5× UCX in async mode; ≤ 1.5× sockperf in doorbell mode",
			Status: both(sa, sd), Detail: fmt.Sprintf("async %s, doorbell %s", sa, sd),
			ProfileArgs: "write_lat --path tcp -s 8 -n 30000",
		}
		if sa == Missed {
			o.ProfileArgs += " --async"
		}
		return o
	}},
	{ID: "memcpy-bw-4kib", Figure: "memcpy, 4 KiB write bandwidth", Eval: func(d *Data) Outcome {
		p, label := d.peer(peerRef{"UCX shm `ucp_put_bw`", "ucx_shm_put_bw_4KiB_MiBps", "ucx-shm", 4096})
		return single(d.goRounds(key("memcpy", "write_bw", 4096), BW), p, label, "MiB/s", 1, true, "write_bw --path memcpy -s 4096 -D 5")
	}},
	{ID: "memcpy-async-lat-8b", Figure: "memcpy async, 8 B write latency", Eval: func(d *Data) Outcome {
		p, label := d.peer(peerRef{"UCX shm `ucp_put_lat`", "ucx_shm_put_lat_8B_median_us", "", 8})
		o := single(d.goRounds(key("memcpy", "write_lat", 8).async(), Lat), p, label, "µs", 5, false, "write_lat --path memcpy -s 8 -n 300000 --async")
		o.Goal = "≤ 5"
		return o
	}},
	{ID: "memcpy-doorbell-lat-8b", Figure: "memcpy doorbell, 8 B write latency", Eval: func(d *Data) Outcome {
		p, label := d.peer(peerRef{"sockperf UDP 14 B", "sockperf_udp_pp_14B_median_us", "", 14})
		return single(d.goRounds(key("memcpy", "write_lat", 8), Lat), p, label, "µs", 1, false, "write_lat --path memcpy -s 8 -n 100000")
	}},
	{ID: "memcpy-bw-64mib", Figure: "memcpy, 1 MiB / 64 MiB write bandwidth", Eval: func(d *Data) Outcome {
		v64, v1 := d.goRounds(key("memcpy", "write_bw", 64*MiB), BW), d.goRounds(key("memcpy", "write_bw", MiB), BW)
		c64, c1 := d.copyRounds("BenchmarkCopy", 64*MiB), d.copyRounds("BenchmarkCopy", MiB)
		r1, _ := compare(v1, c1, 0, true)
		o := Outcome{
			Vrdma:       fmt.Sprintf("64 MiB: %s; 1 MiB: %s MiB/s", values(v64), values(v1)),
			Peer:        fmt.Sprintf("`copy()` 64 MiB: %s; 1 MiB: %s MiB/s", values(c64), values(c1)),
			Goal:        "≥ 0.95× `copy()` at 64 MiB in every round",
			ProfileArgs: "write_bw --path memcpy -s 67108864 -D 5",
		}
		// Every round that measured vrdma at 64 MiB must have copy() beside it.
		per := byRound(v64, c64)
		switch {
		case len(v64) == 0 || len(per) == 0 || len(per) < len(v64):
			o.Status = NotMeasured
			o.Ratio = "64 MiB: —; 1 MiB: " + r1
		default:
			o.Ratio = fmt.Sprintf("64 MiB: %s per round; 1 MiB: %s", rangeOf(per), r1)
			o.Status = Met
			if per.Min() < 0.95 {
				o.Status = Missed
			}
		}
		return o
	}},
}

// parts is a target of several ratios, each compared on its own: met when
// every part is met, missed when any is, its cells joined with "; ".
type part struct {
	name    string
	v, p    map[int]float64
	goal    float64
	atLeast bool
}

func parts(ps []part, unit, peer, goal, args string) Outcome {
	o := Outcome{Goal: goal, ProfileArgs: args, Peer: peer}
	var vr, ra, det []string
	st := Met
	for _, pt := range ps {
		cell, s := compare(pt.v, pt.p, pt.goal, pt.atLeast)
		vr = append(vr, fmt.Sprintf("%s %s", pt.name, values(pt.v)))
		ra = append(ra, pt.name+" "+cell)
		det = append(det, pt.name+" "+s.String())
		switch {
		case s == Missed:
			st = Missed
		case s == NotMeasured && st == Met:
			st = NotMeasured
		}
	}
	o.Vrdma = strings.Join(vr, "; ") + " " + unit
	o.Ratio = strings.Join(ra, "; ")
	o.Detail = strings.Join(det, ", ")
	o.Status = st
	return o
}

// latencyTargets are issue 36's rows: async mode never slower than doorbell
// mode, the rdma path's latency, and the memcpy-direct path against UCX's
// shared memory transport.
var latencyTargets = []Target{
	{ID: "async-lat-8b", Figure: "async against doorbell mode, 8 B write latency", Eval: func(d *Data) Outcome {
		var ps []part
		for _, p := range Paths {
			ps = append(ps, part{p, d.goRounds(key(p, "write_lat", 8).async(), Lat), d.goRounds(key(p, "write_lat", 8), Lat), 1, false})
		}
		return parts(ps, "µs", "the same path in doorbell mode", "≤ 1.0 on every path", "write_lat --path tcp -s 8 -n 30000 --async")
	}},
	{ID: "rdma-lat-8b", Figure: "rdma path, 8 B write latency", Eval: func(d *Data) Outcome {
		v := d.goRounds(key("rdma", "write_lat", 8), Lat)
		p, label := d.peer(peerRef{"sockperf UDP 14 B", "sockperf_udp_pp_14B_median_us", "", 14})
		o := parts([]part{{"/ tcp", v, d.goRounds(key("tcp", "write_lat", 8), Lat), 1, false}, {"/ sockperf", v, p, 1.5, false}},
			"µs", "the tcp path; "+label, "≤ 1.0× the tcp path; ≤ 1.5× sockperf UDP", "write_lat --path rdma -s 8 -n 30000")
		o.Vrdma = values(v).String() + " µs"
		return o
	}},
	{ID: "direct-lat-8b", Figure: "memcpy-direct, 8 B write and send latency", Eval: func(d *Data) Outcome {
		pw, lw := d.peer(peerRef{"UCX shm `ucp_put_lat`", "ucx_shm_put_lat_8B_median_us", "", 8})
		pt, lt := d.peer(peerRef{"UCX shm `tag_lat`", "ucx_shm_tag_lat_8B_median_us", "", 8})
		return parts([]part{
			{"write", d.goRounds(key("memcpy-direct", "write_lat", 8), Lat), pw, 1.5, false},
			{"send", d.goRounds(key("memcpy-direct", "send_lat", 8), Lat), pt, 1.5, false},
		}, "µs", fmt.Sprintf("%s %s; %s %s µs", lw, values(pw), lt, values(pt)), "≤ 1.5× UCX", "write_lat --path memcpy-direct -s 8 -n 300000")
	}},
	{ID: "direct-bw", Figure: "memcpy-direct, 4 KiB, 1 MiB and 64 MiB write bandwidth", Eval: func(d *Data) Outcome {
		var ps []part
		var peer []string
		for _, s := range []int{4096, MiB, 64 * MiB} {
			p, _ := d.peer(peerRef{"UCX shm `ucp_put_bw`", "ucx_shm_put_bw_" + sizeKey(s) + "_MiBps", "ucx-shm", s})
			ps = append(ps, part{sizeName(s), d.goRounds(key("memcpy-direct", "write_bw", s), BW), p, 1, true})
			peer = append(peer, sizeName(s)+" "+values(p).String())
		}
		_, label := d.peer(peerRef{"UCX shm `ucp_put_bw`", "ucx_shm_put_bw_4KiB_MiBps", "ucx-shm", 4096})
		return parts(ps, "MiB/s", label+": "+strings.Join(peer, "; ")+" MiB/s", "≥ 1.0× UCX at each size", "write_bw --path memcpy-direct -s 1048576 -D 5")
	}},
}

func init() { Targets = append(Targets, latencyTargets...) }

// rangeOf writes ratios as "min – max", or the one value.
func rangeOf(s Samples) string {
	if len(s) == 1 || s.Min() == s.Max() {
		return ratio(s.Min())
	}
	return ratio(s.Min()) + " – " + ratio(s.Max())
}

// Evaluate evaluates every target on d.
func Evaluate(d *Data) []Outcome {
	out := make([]Outcome, len(Targets))
	for i, t := range Targets {
		out[i] = t.Eval(d)
		out[i].Target = t
	}
	return out
}
