// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/perf"
)

type perfOptions struct {
	test        perf.Test
	size        int
	iters       int
	txDepth     int
	cqMod       int
	useEvent    bool
	all         bool
	duration    int
	local       bool
	path        string
	hostAddrs   string // --pvrdma-addresses
	async       bool
	outJSON     bool
	outJSONFile string
	atomic      string // -A
	gbits       bool   // --report_gbits
	vm          string // without --local: the VM this side is a workload of
	device      string // -d: its adapter
	port        int    // -p: the server's port
	qps         int    // -q: QP pairs (BW tests)
	mtu         int    // -m: path MTU, QPs connected out of band; 0: the CM's
	noPeak      bool   // -N: no BW peak
	output      string // --output: print only bandwidth, message_rate or latency
	bidir       bool   // -b: both directions at once (BW tests)
	inline      int    // -I: max_inline_data; -1: the default (perfInline for latency tests, 0 for BW)
	forever     bool   // --run_infinitely: a result line every -D seconds until interrupted
	// perftest's flags that mean nothing here, accepted so that its
	// command lines run: -x (GID index), -F (no CPU frequency warning),
	// -R (connect through rdma_cm, which vrdma perf does without -m)
	gidIndex      int
	cpuFreq, rdma bool
}

// maxInline is the QPs' max_inline_data: -I, else perfInline for the
// latency tests and none for the BW tests.
func (o *perfOptions) maxInline() int {
	switch {
	case o.inline >= 0:
		return o.inline
	case o.test.Latency():
		return perfInline
	}
	return 0
}

// perfForeverPeriod is --run_infinitely's period without -D (perftest's
// default duration).
const perfForeverPeriod = 5

// text reports whether o prints perftest's tables (not JSON, not one
// --output value).
func (o *perfOptions) text() bool { return !o.outJSON && o.output == "" }

// perfMaxAll is the largest size of -a (perftest's 2^23).
const perfMaxAll = 1 << 23

// The distributed switch and port group perf --path tcp creates in its
// first host's embedded control plane.
const (
	perfSwitch    = "perf-dvs"
	perfPortGroup = "dvportgroup-perf"
)

// perfInline is the max_inline_data of latency runs (perftest's default
// for RDMA WRITE latency); messages up to it are posted inline.
const perfInline = 220

func (a *app) perfCommand() *cobra.Command {
	var o perfOptions
	cmd := &cobra.Command{
		Use:   "perf TEST (--local [-a] [--path PATH [--pvrdma-addresses A,B]] [--async] | --vm NAME [-d vrdmaN] [-p PORT] [SERVER]) [-s SIZE] [-n ITERS] [-t TXDEPTH] [--out_json] [--out_json_file FILE]",
		Short: "Measure bandwidth or latency between two VMs, like perftest",
		Long: `perf runs perftest's tests between two VMs and prints perftest's report:
write_bw, read_bw and send_bw (RDMA WRITE / READ / SEND bandwidth, up to -t
work requests outstanding, one in -Q signaled; send_bw keeps the receiver's
queue stocked with receives) print BW peak and average in MiB/s (2^20 B/s)
and the message rate in Mpps; write_lat (RDMA WRITE ping-pong, each side
spinning on the last byte of its buffer) prints latency as RTT/2 in µs: min,
max, typical (median), average, standard deviation, 99% and 99.9%. atomic_bw is
the BW loop with 8-byte atomics (-A FETCH_AND_ADD, the default, or
CMP_AND_SWAP); send_lat ping-pongs SENDs (RTT/2, as perftest); read_lat and
atomic_lat post one READ or atomic at a time and report the whole round trip,
as perftest does. --report_gbits gives bandwidth in Gbit/s. -N leaves the BW
peak out; --output=bandwidth, message_rate or latency prints only that figure
(BW average; latency: the average), one line per size, as perftest does.
perftest's -x (GID index), -F (no CPU frequency warning) and -R (rdma_cm) are
accepted and mean nothing here: rdma_cm picks the GID from the address, no CPU
frequency is checked, and the QPs connect through rdma_cm unless -m is given. A run longer than two
seconds draws a progress bar on stderr when stderr is a terminal.

-b (write_bw, read_bw, atomic_bw) runs both directions at once and reports
their sum, as perftest's; between a server and a client the client's -b counts
(it asks the server to run the other direction), and both print the sum. -I N sets the QPs' max_inline_data (default
220 for the latency tests, 0 for BW): WRITEs and SENDs of up to N bytes are
posted inline. --run_infinitely (BW tests, --local) measures for -D seconds
(default 5) again and again, a result line each time, until interrupted.

-q N runs a BW test over N QP pairs sharing each side's CQ and buffer, -t
work requests outstanding on each; -n counts per QP and the figures are the
sum, as perftest's (between a server and a client, the client's -q counts:
it connects that many QPs through rdma_cm). -m MTU (--local) connects the
QPs out of band, as perftest without rdma_cm, with that path MTU, or the
ports' active MTU if smaller.

--local starts everything it needs and removes it afterwards: an agent process
with temporary state, two VMs sized to the message size (memory locked when
run as root), and a workload goroutine per VM.
With --path tcp it starts two agent processes instead, two hosts on loopback
addresses (127.0.0.2 and 127.0.0.3 by default, each on a free port; no root
needed; --pvrdma-addresses IP[:PORT],IP[:PORT] picks others): the first runs
its embedded control plane (etcd), the second joins it; both are on a
distributed switch and port group the run creates, with no RDMA uplink, and
each has one of the VMs, so the pair connects over the tcp path between them.
--local also reports what the agents spent: their CPU time (all threads,
from /proc) per work request the workloads posted, the thread wake-ups
(voluntary context switches) per work request in the agents (with the
part of the Go runtime's monitor thread, which wakes on its own clock)
and in the workloads' process, and the resident memory the QPs added, per
QP.

Without --local, perf runs as perftest does, in two processes, each the workload
of a VM of a running agent (--socket, --vm, -d): with no SERVER argument it is
the server, listening on its adapter's port (-p, default 18515) for one client;
with SERVER (the server adapter's IP address, GID or VM/vrdmaN) it is the client,
which connects through rdma_cm, carrying the test and its parameters, runs it,
and hands its figures to the server; both print the report (a latency server
prints none, as perftest's). -a and -D are --local's.

--path fails the run (exit 1) unless the pair gets that path (memcpy,
memcpy-direct, tcp, rdma); with tcp, also unless the hosts' uplink byte
counters moved during the run. --out_json prints the report as JSON instead of
text, --out_json_file writes it to a file: perftest's keys (MsgSize,
n_iterations, BW_peak, BW_average, MsgRate; t_min, t_max, t_typical, t_avg,
t_stdev, percentile_99, percentile_99.9) plus test, path and reason, and the
header as test_info (with tcp: the hosts and uplink_bytes, the bytes the
hosts sent each other during the run); with -a the per-size results are in
"results".`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 && (len(args) != 2 || o.local) {
				return usageErrorf("perf: name one test: write_bw, read_bw, send_bw, atomic_bw, write_lat, read_lat, send_lat or atomic_lat")
			}
			t, err := perf.ParseTest(args[0])
			if err != nil {
				return &exitError{code: exitUsage, err: fmt.Errorf("perf: %w", err)}
			}
			o.test = t
			return nil
		},
		ValidArgs: perfTestNames(),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch o.output {
			case "text", "json", "yaml":
				a.output, o.output = o.output, ""
			}
			o.outJSON = o.outJSON || a.json()
			if !o.local {
				if err := o.check(); err != nil {
					return err
				}
				if o.mtu != 0 {
					return usageErrorf("perf: -m is --local's: a server and its client connect through rdma_cm, which sets the path MTU")
				}
				server := ""
				if len(args) == 2 {
					server = args[1]
				}
				return a.perfRemote(cmd.Context(), o, server)
			}
			return a.perf(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.IntVarP(&o.size, "size", "s", 0, "message size in bytes (default 65536 for BW, 2 for latency)")
	f.IntVarP(&o.iters, "iters", "n", 0, "iterations (default 5000 for write_bw, 1000 otherwise)")
	f.IntVarP(&o.txDepth, "tx-depth", "t", 128, "outstanding work requests (BW tests)")
	f.IntVarP(&o.cqMod, "cq-mod", "Q", 0, "signal one work request in this many (0, the default: perftest's, 100, or 1 for messages over 8 KiB)")
	f.BoolVarP(&o.all, "all", "a", false, "run every size from 2 to 2^23 bytes")
	f.BoolVarP(&o.useEvent, "use_event", "e", false, "BW tests: sleep on the CQ's completion event when the window is full, instead of polling")
	f.IntVarP(&o.duration, "duration", "D", 0, "run BW tests for this many seconds instead of -n iterations (no BW peak)")
	f.BoolVar(&o.local, "local", false, "start an agent and two VMs for the run, and remove them after")
	f.StringVar(&o.path, "path", "", "fail unless the pair takes this path: memcpy, memcpy-direct, tcp or rdma")
	f.StringVar(&o.hostAddrs, "pvrdma-addresses", "", "with --path tcp: the two hosts' PVRDMA addresses, IP[:PORT],IP[:PORT] (default 127.0.0.2,127.0.0.3; no port: a free one)")
	f.BoolVar(&o.async, "async", false, "VMs in async mode (vrdma.asyncMode: the agent polls their queues)")
	f.BoolVar(&o.outJSON, "out_json", false, "print the report as JSON instead of text")
	f.StringVar(&o.outJSONFile, "out_json_file", "", "write the report as JSON to this file")
	f.StringVar(&o.vm, "vm", "", "without --local: the VM this side runs as a workload of, on the agent at --socket")
	f.StringVarP(&o.device, "ib-dev", "d", "vrdma0", "without --local: the VM's adapter")
	f.IntVarP(&o.port, "port", "p", perf.DefaultPort, "without --local: the server's rdma_cm port")
	f.BoolVar(&o.gbits, "report_gbits", false, "BW tests: report bandwidth in Gbit/s (10^9 bits per second) instead of MiB/s")
	f.StringVarP(&o.atomic, "atomic_type", "A", string(perf.FetchAndAdd), "atomic tests: FETCH_AND_ADD or CMP_AND_SWAP")
	f.IntVarP(&o.qps, "qp", "q", 1, "BW tests: QP pairs, each with -t work requests outstanding (figures are their sum)")
	f.IntVarP(&o.mtu, "mtu", "m", 0, "path MTU (256 … 4096): connect the QPs out of band with it (or the ports' active MTU if smaller) instead of through rdma_cm")
	f.BoolVarP(&o.noPeak, "noPeak", "N", false, "BW tests: leave the BW peak out")
	// perftest's --output names a figure, vrdmactl's -o a format: this
	// one flag, which shadows the global one, takes both.
	f.StringVarP(&o.output, "output", "o", "", "print only this figure, one line per size: bandwidth (BW average), message_rate or latency (the average), as perftest's --output; or the output format, text, json or yaml, as every vrdmactl command's -o")
	f.BoolVarP(&o.bidir, "bidirectional", "b", false, "write_bw, read_bw, atomic_bw: both directions at once, the figures their sum (the client's -b counts)")
	f.IntVarP(&o.inline, "inline_size", "I", -1, fmt.Sprintf("max_inline_data: WRITEs and SENDs up to this many bytes are posted inline (0..%d; default %d for latency tests, 0 for BW)", vrdma.MaxInline, perfInline))
	f.BoolVar(&o.forever, "run_infinitely", false, "BW tests: measure for -D seconds (default 5) again and again, a line each time, until interrupted (--local)")
	f.IntVarP(&o.gidIndex, "gid-index", "x", 0, "perftest's GID index: accepted, means nothing here (rdma_cm picks the GID from the address)")
	f.BoolVarP(&o.cpuFreq, "CPU-freq", "F", false, "perftest's: accepted, means nothing here (no CPU frequency is checked)")
	f.BoolVarP(&o.rdma, "rdma_cm", "R", false, "connect the QPs through rdma_cm: what perf does without -m")
	return cmd
}

func perfTestNames() []string {
	n := make([]string, len(perf.Tests))
	for i, t := range perf.Tests {
		n[i] = string(t)
	}
	return n
}

var knownPaths = []vrdma.PathKind{vrdma.PathMemcpy, vrdma.PathMemcpyDirect, vrdma.PathTCP, vrdma.PathRDMA}

func (o *perfOptions) check() error {
	if o.path != "" {
		ok := false
		for _, p := range knownPaths {
			ok = ok || string(p) == o.path
		}
		if !ok {
			return usageErrorf("perf: --path %q: want memcpy, memcpy-direct, tcp or rdma", o.path)
		}
	}
	if o.hostAddrs != "" {
		if o.path != string(vrdma.PathTCP) && o.path != string(vrdma.PathRDMA) {
			return usageErrorf("perf: --pvrdma-addresses is for --path tcp and --path rdma (two hosts on this machine)")
		}
		if _, err := o.hosts(); err != nil {
			return usageErrorf("perf: --pvrdma-addresses: %v", err)
		}
	}
	switch {
	case o.all && o.size != 0:
		return usageErrorf("perf: -a runs every size: drop -s")
	case o.size < 0 || o.size > 1<<30:
		return usageErrorf("perf: -s %d out of range 1..%d", o.size, 1<<30)
	case o.iters < 0:
		return usageErrorf("perf: -n %d must be positive", o.iters)
	case o.txDepth < 1 || o.txDepth > vrdma.MaxQPWR/2:
		return usageErrorf("perf: -t %d out of range 1..%d", o.txDepth, vrdma.MaxQPWR/2)
	case o.cqMod < 0:
		return usageErrorf("perf: -Q %d must be positive", o.cqMod)
	case o.duration < 0:
		return usageErrorf("perf: -D %d must be positive", o.duration)
	case o.duration > 0 && o.test.Latency():
		return usageErrorf("perf: -D is for BW tests; latency tests count iterations (-n)")
	case o.test.Atomic() && (o.size != 0 && o.size != 8 || o.all):
		return usageErrorf("perf: %s moves 8 bytes: drop -s and -a", o.test)
	case o.qps < 1 || o.qps > perf.MaxQPs:
		return usageErrorf("perf: -q %d out of range 1..%d", o.qps, perf.MaxQPs)
	case o.qps > 1 && o.test.Latency():
		return usageErrorf("perf: -q %d: %s runs on one QP; several QPs are for the BW tests, as perftest's", o.qps, o.test)
	case o.qps*(o.txDepth+1)+64 > vrdma.MaxCQE:
		return usageErrorf("perf: -q %d with -t %d: the QPs' work requests outstanding exceed a CQ's %d entries; lower -t", o.qps, o.txDepth, vrdma.MaxCQE)
	case o.mtu != 0 && (o.mtu < 256 || o.mtu > 4096 || o.mtu&(o.mtu-1) != 0):
		return usageErrorf("perf: -m %d: want 256, 512, 1024, 2048 or 4096", o.mtu)
	case o.mtu != 0 && o.rdma:
		return usageErrorf("perf: -R connects the QPs through rdma_cm, -m out of band with a path MTU: pick one")
	case o.gidIndex < 0:
		return usageErrorf("perf: -x %d: a GID index is 0 or more", o.gidIndex)
	case o.output != "" && o.output != "bandwidth" && o.output != "message_rate" && o.output != "latency":
		return usageErrorf("perf: --output=%s: want bandwidth, message_rate or latency (perftest's), or text, json or yaml", o.output)
	case o.output == "latency" && !o.test.Latency(), o.output != "" && o.output != "latency" && o.test.Latency():
		return usageErrorf("perf: --output=%s does not go with %s: latency for the _lat tests, bandwidth or message_rate for the _bw ones", o.output, o.test)
	case o.noPeak && o.test.Latency():
		return usageErrorf("perf: -N is for BW tests, which measure a peak")
	case o.bidir && o.test != perf.WriteBW && o.test != perf.ReadBW && o.test != perf.AtomicBW:
		return usageErrorf("perf: -b runs write_bw, read_bw and atomic_bw both ways; not %s", o.test)
	case o.inline > vrdma.MaxInline || o.inline < -1:
		return usageErrorf("perf: -I %d out of range 0..%d", o.inline, vrdma.MaxInline)
	case o.forever && (o.test.Latency() || o.all || o.outJSON || o.outJSONFile != ""):
		return usageErrorf("perf: --run_infinitely measures a BW test of one size again and again, a line each time: not with a latency test, -a or JSON")
	case o.forever && !o.local:
		return usageErrorf("perf: --run_infinitely is --local's (a server and its client run once)")
	}
	if _, err := perf.ParseAtomic(o.atomic); err != nil {
		return usageErrorf("perf: -A: %v", err)
	}
	return nil
}

// hosts returns the two hosts of --path tcp and --path rdma (with RDMA
// uplinks on their addresses).
func (o *perfOptions) hosts() ([]localHostSpec, error) {
	rdma := o.path == string(vrdma.PathRDMA)
	specs := []localHostSpec{{Name: "host1", RDMA: rdma}, {Name: "host2", RDMA: rdma}}
	if o.hostAddrs == "" {
		for i := range specs {
			specs[i].Addr = netip.AddrPortFrom(defaultLocalHostAddrs[i], 0)
		}
		return specs, nil
	}
	parts := strings.Split(o.hostAddrs, ",")
	if len(parts) != 2 {
		return nil, fmt.Errorf("%q: want two addresses, IP[:PORT],IP[:PORT]", o.hostAddrs)
	}
	for i, p := range parts {
		ap, err := parseHostAddr(strings.TrimSpace(p))
		if err != nil {
			return nil, err
		}
		specs[i].Addr = ap
	}
	if specs[0].Addr == specs[1].Addr && specs[0].Addr.Port() != 0 {
		return nil, fmt.Errorf("%q: the two hosts need different addresses", o.hostAddrs)
	}
	return specs, nil
}

// cqModFor is the CQ moderation of a run of size bytes: -Q, or else
// perftest's default for that size.
func (o *perfOptions) cqModFor(size int) int {
	if o.cqMod > 0 {
		return o.cqMod
	}
	return perf.DefaultCQModFor(size, o.useEvent, o.all)
}

func (o *perfOptions) sizes() []int {
	if o.all {
		var s []int
		for n := 2; n <= perfMaxAll; n *= 2 {
			s = append(s, n)
		}
		return s
	}
	if o.size > 0 {
		return []int{o.size}
	}
	return []int{o.test.DefaultSize()}
}

// perfInfo is the report's header: perftest's test_info, plus the path.
type perfInfo struct {
	Test           string `json:"test"`
	Title          string `json:"title"`
	Device         string `json:"Device"`
	NumberOfQPs    int    `json:"Number_of_qps"`
	TransportType  string `json:"Transport_type"`
	ConnectionType string `json:"Connection_type"`
	UsingSRQ       string `json:"Using_SRQ"`
	TXDepth        int    `json:"TX_depth"`
	CQModeration   int    `json:"CQ_Moderation"`
	UseEvent       bool   `json:"use_event"`
	Bidirectional  bool   `json:"bidirectional,omitempty"` // -b: the figures are both directions' sum
	BWUnit         string `json:"BW_unit,omitempty"`       // BW tests: MiB/sec, or Gb/sec with --report_gbits
	Mtu            int    `json:"Mtu"`
	LinkType       string `json:"Link_type"`
	GIDIndex       int    `json:"GID_index"`
	MaxInlineData  int    `json:"Max_inline_data"`
	RdmaCMQPs      string `json:"rdma_cm_QPs"`
	DataExMethod   string `json:"Data_ex_method"`
	Transport      string `json:"Transport"`
	Path           string `json:"path"`
	Reason         string `json:"reason"`
	AsyncMode      bool   `json:"async_mode"`
	MemoryLocked   bool   `json:"memory_locked,omitempty"`
	GuestMemoryMiB int    `json:"guest_memory_mib,omitempty"` // --local only: the VMs it starts
	// --local: the agents' resident memory the pair's QPs added, per QP
	// (each side's QPs count; the CQs, MRs and PDs are in it too).
	AgentRSSKiBPerQP *float64 `json:"agent_rss_kib_per_qp,omitempty"`
	// The mean time to connect one QP pair (rdma_cm, or out of band with
	// -m), the pairs connected one after another.
	ConnectUsPerQP float64  `json:"connect_us_per_qp"`
	Local          string   `json:"local_address"`
	Remote         string   `json:"remote_address"`
	Hosts          []string `json:"hosts,omitempty"`        // --path tcp: "NAME ADDRESS:PORT (VM)", the dialing side first
	UplinkBytes    uint64   `json:"uplink_bytes,omitempty"` // --path tcp: bytes the hosts sent each other during the run
	Notes          []string `json:"notes,omitempty"`
}

// perfBW and perfLat are one size's result, with perftest's keys.
type perfBW struct {
	MsgSize   int      `json:"MsgSize"`
	Iters     int      `json:"n_iterations"`
	BWPeak    float64  `json:"BW_peak"`
	BWAverage float64  `json:"BW_average"`
	MsgRate   float64  `json:"MsgRate"`
	AgentCPU  *float64 `json:"agent_cpu_us_per_op,omitempty"`
	perfWakeups
}

type perfLat struct {
	MsgSize  int      `json:"MsgSize"`
	Iters    int      `json:"n_iterations"`
	TMin     float64  `json:"t_min"`
	TMax     float64  `json:"t_max"`
	TTypical float64  `json:"t_typical"`
	TAvg     float64  `json:"t_avg"`
	TStdev   float64  `json:"t_stdev"`
	P99      float64  `json:"percentile_99"`
	P999     float64  `json:"percentile_99.9"`
	AgentCPU *float64 `json:"agent_cpu_us_per_op,omitempty"`
	perfWakeups
}

// perfWakeups is how many threads slept and were woken per work request
// (voluntary context switches, procWakeups): in the agents, the part of
// their Go runtime monitor threads among them, and in the process of the
// workloads (this one). nil: not measured.
type perfWakeups struct {
	Agents        *float64 `json:"agent_wakeups_per_op,omitempty"`
	AgentsMonitor *float64 `json:"agent_monitor_wakeups_per_op,omitempty"`
	Workloads     *float64 `json:"workload_wakeups_per_op,omitempty"`
}

// perfResult is one size's figures and, with --local, the agents' CPU
// time per work request (nil: not measured).
type perfResult struct {
	perf.Result
	agentCPU *float64
	wakeups  perfWakeups
}

func resultJSON(r perfResult) any {
	cpu := r.agentCPU
	if cpu != nil {
		c := float64(int64(*cpu*1000+0.5)) / 1000
		cpu = &c
	}
	if r.Test.Latency() {
		return perfLat{MsgSize: r.MsgSize, Iters: r.Iters, TMin: round2(r.TMin), TMax: round2(r.TMax), TTypical: round2(r.TTypical),
			TAvg: round2(r.TAvg), TStdev: round2(r.TStdev), P99: round2(r.P99), P999: round2(r.P999), AgentCPU: cpu, perfWakeups: r.wakeups}
	}
	return perfBW{MsgSize: r.MsgSize, Iters: r.Iters, BWPeak: round2(r.BWPeak), BWAverage: round2(r.BWAvg), MsgRate: float64(int64(r.MsgRate*1e6+0.5)) / 1e6, AgentCPU: cpu, perfWakeups: r.wakeups}
}

// workRequests is the number of work requests the workloads posted in a
// run of r with qps QP pairs: a BW test's iterations on every QP, two per
// ping-pong iteration of write_lat and send_lat, one per iteration of
// read_lat and atomic_lat.
func workRequests(r perf.Result, qps int) int {
	switch {
	case !r.Test.Latency():
		return r.Iters * qps
	case r.Test.FullRoundTrip():
		return r.Iters
	}
	return 2 * r.Iters
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// perfJSON is the JSON report: for one size, the result's keys sit at the
// top level next to test, path and reason; with -a they are in Results.
func perfJSON(info perfInfo, results []perfResult, all bool) ([]byte, error) {
	m := map[string]any{"test": info.Test, "path": info.Path, "reason": info.Reason, "test_info": info}
	if all {
		rs := make([]any, len(results))
		for i, r := range results {
			rs[i] = resultJSON(r)
		}
		m["results"] = rs
	} else if len(results) == 1 {
		b, err := json.Marshal(resultJSON(results[0]))
		if err != nil {
			return nil, err
		}
		var flat map[string]any
		if err := json.Unmarshal(b, &flat); err != nil {
			return nil, err
		}
		for k, v := range flat {
			m[k] = v
		}
	}
	return json.MarshalIndent(m, "", "  ")
}

func (a *app) perf(ctx context.Context, o perfOptions) (err error) {
	if err := o.check(); err != nil {
		return err
	}
	sizes := o.sizes()
	maxSize := sizes[len(sizes)-1]
	buf := maxSize
	if o.test == perf.WriteLat {
		buf = 2 * maxSize
	}
	buf = max(buf, 4096)
	memMB := (buf+(1<<20)-1)>>20 + 1
	inline := o.maxInline()

	tcp := o.path == string(vrdma.PathTCP) || o.path == string(vrdma.PathRDMA) // two hosts
	specs := []*localVM{
		{Name: "vm1", MemMB: memMB, Locked: os.Geteuid() == 0, Async: o.async},
		{Name: "vm2", MemMB: memMB, Locked: os.Geteuid() == 0, Async: o.async},
	}
	if o.path == string(vrdma.PathMemcpyDirect) {
		// Both VMs allow each other the memcpy-direct path.
		specs[0].DirectPeers, specs[1].DirectPeers = []string{"vm2"}, []string{"vm1"}
	}
	var hosts []*localHost // with --path tcp: vm1's, vm2's
	var sockets []string   // the agent sockets of vm1 and vm2
	var agents []int       // the agent processes' IDs
	if tcp {
		hs, err := o.hosts()
		if err != nil {
			return usageErrorf("perf: --pvrdma-addresses: %v", err)
		}
		f, err := startLocalFabric(ctx, perfSwitch, perfPortGroup, hs)
		if err != nil {
			return fmt.Errorf("perf: %w", err)
		}
		defer func() {
			if cerr := f.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("perf: %w", cerr)
			}
		}()
		hosts = f.Hosts
		for i, s := range specs {
			s.Switch, s.PortGroup = f.Switch, f.PortGroup
			sockets = append(sockets, hosts[i].Socket)
			agents = append(agents, hosts[i].PID())
		}
	} else {
		ag, err := startLocalAgent(ctx, "--no-control-plane") // perf measures paths, not the inventory
		if err != nil {
			return fmt.Errorf("perf: %w", err)
		}
		defer func() {
			if cerr := ag.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("perf: %w", cerr)
			}
		}()
		sockets = []string{ag.Socket, ag.Socket}
		agents = []int{ag.PID()}
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var vms []*vrdma.VM
	defer func() {
		for _, v := range vms {
			v.Close()
		}
	}()
	var notes []string
	if tcp {
		for i, s := range specs {
			v, n, err := openLocalVMs(sctx, sockets[i], "vrdmactl perf", []*localVM{s})
			vms, notes = append(vms, v...), append(notes, n...)
			if err != nil {
				return fmt.Errorf("perf: host %s: %w", hosts[i].Name, err)
			}
		}
	} else {
		var err error
		if vms, notes, err = openLocalVMs(sctx, sockets[0], "vrdmactl perf", specs); err != nil {
			return fmt.Errorf("perf: %w", err)
		}
	}
	rssBefore, rssErr := procRSS(agents...)
	p, err := perf.Connect(sctx, vms[0].Adapters()[0], vms[1].Adapters()[0],
		perf.PairConfig{BufSize: buf, TxDepth: o.txDepth, MaxInline: inline, QPs: o.qps, MTU: uint32(o.mtu)})
	if err != nil {
		return fmt.Errorf("perf: connect %s/vrdma0 → %s/vrdma0: %w", vms[0].Name(), vms[1].Name(), err)
	}
	defer p.Close(context.WithoutCancel(ctx))
	path := p.Path()
	if o.path != "" {
		if string(path.Path) != o.path {
			return fmt.Errorf("perf: the requested path is %q, but the pair %s → %s got %q (%s)",
				o.path, p.A.Name(), p.B.Name(), path.Path, path.Reason)
		}
		if bp := p.B.QP.Path(); string(bp.Path) != o.path {
			return fmt.Errorf("perf: the requested path is %q, and %s's QP reports it, but %s's reports %q (%s)",
				o.path, p.A.Name(), p.B.Name(), bp.Path, bp.Reason)
		}
	}
	var uplinkBefore uint64
	if tcp {
		if uplinkBefore, err = uplinkBytes(sctx, hosts...); err != nil {
			return fmt.Errorf("perf: the hosts' uplink counters: %w", err)
		}
	}

	info := perfInfo{Test: string(o.test), Title: o.test.Title(perf.Atomic(o.atomic)), Device: p.A.Adapter.Name(), NumberOfQPs: o.qps,
		TransportType: "IB", ConnectionType: "RC", UsingSRQ: "OFF", TXDepth: o.txDepth, CQModeration: min(o.cqModFor(sizes[0]), o.txDepth), UseEvent: o.useEvent,
		Mtu: 1024, LinkType: "Ethernet", MaxInlineData: inline, RdmaCMQPs: "ON", DataExMethod: "rdma_cm",
		Transport: string(path.Path), Path: string(path.Path), Reason: path.Reason, AsyncMode: o.async, Bidirectional: o.bidir,
		MemoryLocked: specs[0].Locked && specs[1].Locked, GuestMemoryMiB: memMB, Notes: notes}
	if o.mtu != 0 {
		info.RdmaCMQPs, info.DataExMethod = "OFF", "Ethernet" // perftest's words for an out-of-band exchange
	}
	info.ConnectUsPerQP = round2(float64(p.ConnectTime) / 1e3 / float64(o.qps))
	if rssAfter, err := procRSS(agents...); err == nil && rssErr == nil {
		perQP := (float64(rssAfter) - float64(rssBefore)) / float64(2*o.qps)
		info.AgentRSSKiBPerQP = &perQP
	}
	for i, h := range hosts {
		info.Hosts = append(info.Hosts, fmt.Sprintf("%s (%s)", h.label(), specs[i].Name))
	}
	if o.test.Latency() {
		info.TXDepth = 1
	} else {
		info.BWUnit = "MiB/sec"
		if o.gbits {
			info.BWUnit = "Gb/sec"
		}
	}
	if qi, err := p.A.QP.Query(sctx); err == nil {
		info.Mtu = int(qi.Attr.PathMTU)
		info.Local = addressLine(p.A, qi.Attr.SQPSN)
	}
	if qi, err := p.B.QP.Query(sctx); err == nil {
		info.Remote = addressLine(p.B, qi.Attr.SQPSN)
	}
	cancel()

	defer shareOneCore()()
	text := o.text()
	if text {
		printPerfHeader(a.stdout, info, o)
	}
	var results []perfResult
	for i := 0; i < len(sizes); i++ {
		size := sizes[i]
		c := perf.Config{Test: o.test, Size: size, Iters: o.iters, TxDepth: o.txDepth, CQMod: o.cqModFor(size), UseEvent: o.useEvent,
			Duration: time.Duration(o.duration) * time.Second, Atomic: perf.Atomic(o.atomic), Bidirectional: o.bidir}
		if o.forever {
			// perftest's --run_infinitely: the same size again, a line
			// per period, until interrupted (ctx, on SIGINT).
			i--
			if c.Duration <= 0 {
				c.Duration = perfForeverPeriod * time.Second
			}
			if ctx.Err() != nil {
				fmt.Fprintln(a.stdout, perfRule)
				return nil
			}
		}
		rctx, cancel := context.WithTimeout(ctx, runTimeout(c))
		stop := func() {}
		if isTerminal(a.stderr) && !o.forever {
			c.Progress = new(atomic.Int64)
			iters := c.Iters
			if iters <= 0 {
				iters = o.test.DefaultIters()
			}
			stop = startProgress(a.stderr, fmt.Sprintf("%s %d", o.test, size), c.Progress, iters, c.Duration)
		}
		cpuBefore, cpuErr := procCPU(agents...)
		wakeBefore, wakeErr := procWakeups(agents...)
		ownBefore, ownErr := procWakeups(os.Getpid())
		r, err := p.Run(rctx, c)
		stop()
		cancel()
		if err != nil {
			if text {
				fmt.Fprintln(a.stdout, perfRule)
			}
			if o.forever && ctx.Err() != nil {
				return nil // interrupted: the end of a run without end
			}
			return fmt.Errorf("perf: %s of %d bytes: %w", o.test, size, err)
		}
		pr := perfResult{Result: r}
		if cpuAfter, err := procCPU(agents...); err == nil && cpuErr == nil && workRequests(r, o.qps) > 0 {
			us := float64(cpuAfter-cpuBefore) / 1e3 / float64(workRequests(r, o.qps))
			pr.agentCPU = &us
		}
		wakeAfter, err1 := procWakeups(agents...)
		ownAfter, err2 := procWakeups(os.Getpid())
		if n := float64(workRequests(r, o.qps)); n > 0 && errors.Join(wakeErr, ownErr, err1, err2) == nil {
			ag, mon := round3(float64(wakeAfter.Total-wakeBefore.Total)/n), round3(float64(wakeAfter.Monitor-wakeBefore.Monitor)/n)
			wl := round3(float64(ownAfter.Total-ownBefore.Total) / n)
			pr.wakeups = perfWakeups{Agents: &ag, AgentsMonitor: &mon, Workloads: &wl}
		}
		pr.Result = o.shape(pr.Result)
		if !o.forever { // a run without end keeps none
			results = append(results, pr)
		}
		if text {
			printPerfResult(a.stdout, pr.Result)
		} else if !o.outJSON {
			printPerfOutput(a.stdout, o.output, pr.Result)
		}
	}
	if text {
		fmt.Fprintln(a.stdout, perfRule)
		printAgentCost(a.stdout, info, results)
	}
	if tcp {
		// The QPs say tcp; the uplinks' byte counters show their traffic
		// crossed it, not a silent shortcut.
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		after, err := uplinkBytes(uctx, hosts...)
		cancel()
		if err != nil {
			return fmt.Errorf("perf: the hosts' uplink counters: %w", err)
		}
		if after <= uplinkBefore {
			return fmt.Errorf("perf: the pair reports the %s path, but the hosts' uplink byte counters did not move (%d before, %d after): its traffic did not cross it", path.Path, uplinkBefore, after)
		}
		info.UplinkBytes = after - uplinkBefore
	}
	if o.outJSON || o.outJSONFile != "" {
		b, err := perfJSON(info, results, o.all)
		if err != nil {
			return err
		}
		return a.writeReport(o, append(b, '\n'))
	}
	return nil
}

// perfDocument is perf's JSON report (perfJSON) as the tests' schema
// check sees it (jsonPrinted).
type perfDocument struct{ json.RawMessage }

// writeReport writes the JSON report b to stdout (--out_json; as YAML
// with -o yaml) and to --out_json_file.
func (a *app) writeReport(o perfOptions, b []byte) error {
	if jsonPrinted != nil && o.outJSON {
		jsonPrinted(a.command, perfDocument{json.RawMessage(b)})
	}
	switch {
	case o.outJSON && a.output == "yaml":
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		a.stdout.Write(append([]byte("---\n"), y...))
	case o.outJSON:
		a.stdout.Write(b)
	}
	if o.outJSONFile != "" {
		if err := os.WriteFile(o.outJSONFile, b, 0o644); err != nil {
			return fmt.Errorf("perf: --out_json_file: %w", err)
		}
	}
	return nil
}

// runTimeout bounds one size's run generously: a run that takes longer
// is stuck, not slow.
func runTimeout(c perf.Config) time.Duration {
	if c.Duration > 0 {
		return c.Duration + time.Minute
	}
	iters := c.Iters
	if iters == 0 {
		iters = c.Test.DefaultIters()
	}
	// 100 MiB/s and 1 ms per iteration are far below any path's speed.
	return time.Minute + time.Duration(iters)*(time.Millisecond+time.Duration(c.Size)*10*time.Nanosecond)
}

func addressLine(s *perf.Side, psn uint32) string {
	return fmt.Sprintf("LID 0000 QPN 0x%04x PSN 0x%06x RKey 0x%06x VAddr 0x%014x", s.QP.QPN(), psn, s.MR.RKey(), s.MR.Addr())
}

const perfRule = "---------------------------------------------------------------------------------------"

func printPerfHeader(w io.Writer, info perfInfo, o perfOptions) {
	fmt.Fprintln(w, perfRule)
	fmt.Fprintf(w, "%*s\n", 20+len(info.Title), info.Title)
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : %s\n", info.Device)
	fmt.Fprintf(w, " Number of qps   : %d\t\tTransport type : IB\n", info.NumberOfQPs)
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : OFF\n")
	fmt.Fprintf(w, " TX depth        : %d\n", info.TXDepth)
	if o.test == perf.ReadBW || o.test == perf.AtomicBW || o.test == perf.ReadLat || o.test == perf.AtomicLat {
		fmt.Fprintf(w, " Outstand reads  : %d\n", abi.MaxRdAtom)
	}
	if !o.test.Latency() {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", info.CQModeration)
		if info.UseEvent {
			fmt.Fprintf(w, " Completion      : events (--use_event)\n")
		}
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", info.Mtu)
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	fmt.Fprintf(w, " GID index       : 0\n")
	fmt.Fprintf(w, " Max inline data : %d[B]\n", info.MaxInlineData)
	fmt.Fprintf(w, " rdma_cm QPs\t : %s\n", info.RdmaCMQPs)
	fmt.Fprintf(w, " Data ex. method : %s\n", info.DataExMethod)
	fmt.Fprintf(w, " Transport       : %s\n", info.Transport)
	fmt.Fprintf(w, " Path reason     : %s\n", info.Reason)
	mode := "doorbell"
	if info.AsyncMode {
		mode = "async (the agent polls the queues)"
	}
	fmt.Fprintf(w, " Agent mode      : %s\n", mode)
	if info.GuestMemoryMiB > 0 { // --local sizes the VMs it starts; a running agent's VMs are its own
		lock := "unlocked"
		if info.MemoryLocked {
			lock = "reserved and locked"
		}
		fmt.Fprintf(w, " Guest memory    : %d MiB per VM, %s\n", info.GuestMemoryMiB, lock)
	}
	if len(info.Hosts) > 0 {
		fmt.Fprintf(w, " Hosts           : %s\n", strings.Join(info.Hosts, " → "))
	}
	for _, n := range info.Notes {
		fmt.Fprintf(w, " Note            : %s\n", n)
	}
	fmt.Fprintln(w, perfRule)
	if info.Local != "" {
		fmt.Fprintf(w, " local address: %s\n", info.Local)
	}
	if info.Remote != "" {
		fmt.Fprintf(w, " remote address: %s\n", info.Remote)
	}
	fmt.Fprintln(w, perfRule)
	if o.test.Latency() {
		fmt.Fprintln(w, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
		return
	}
	if o.duration > 0 || o.noPeak {
		fmt.Fprintln(w, " WARNING: BW peak won't be measured in this run.")
	}
	unit := "MiB/sec"
	if o.gbits {
		unit = "Gb/sec"
	}
	fmt.Fprintf(w, " #bytes     #iterations    BW peak[%[1]s]    BW average[%[1]s]   MsgRate[Mpps]\n", unit)
}

// printAgentCost prints, below the table, what the agents spent: CPU time
// per work request of each size, and memory per QP.
func printAgentCost(w io.Writer, info perfInfo, results []perfResult) {
	var cpu, wake []string
	for _, r := range results {
		if r.agentCPU != nil {
			cpu = append(cpu, fmt.Sprintf("%.3f", *r.agentCPU))
		}
		if w := r.wakeups; w.Agents != nil {
			wake = append(wake, fmt.Sprintf("%.2f (runtime monitor %.2f) + %.2f", *w.Agents, *w.AgentsMonitor, *w.Workloads))
		}
	}
	if len(cpu) == 0 && info.AgentRSSKiBPerQP == nil {
		return
	}
	if len(cpu) > 0 {
		fmt.Fprintf(w, " Agent CPU       : %s µs per work request\n", strings.Join(cpu, ", "))
	}
	if len(wake) > 0 {
		fmt.Fprintf(w, " Wake-ups        : %s per work request (agents + workloads)\n", strings.Join(wake, ", "))
	}
	if info.AgentRSSKiBPerQP != nil {
		fmt.Fprintf(w, " Agent memory    : %.1f KiB per QP\n", *info.AgentRSSKiBPerQP)
	}
	fmt.Fprintf(w, " Connect         : %.1f µs per QP pair (%s, one after another)\n", info.ConnectUsPerQP, info.DataExMethod)
	fmt.Fprintln(w, perfRule)
}

// shape returns r as o asks to report it: in Gbit/s (--report_gbits),
// without its peak (-N).
func (o *perfOptions) shape(r perf.Result) perf.Result {
	if o.gbits {
		r.BWPeak, r.BWAvg = gbits(r.BWPeak), gbits(r.BWAvg)
	}
	if o.noPeak {
		r.BWPeak, r.PeakSeen = 0, false
	}
	return r
}

// printPerfOutput prints the one figure of r that --output asks for.
func printPerfOutput(w io.Writer, output string, r perf.Result) {
	switch output {
	case "bandwidth":
		fmt.Fprintf(w, "%.2f\n", r.BWAvg)
	case "message_rate":
		fmt.Fprintf(w, "%.6f\n", r.MsgRate)
	case "latency":
		fmt.Fprintf(w, "%.2f\n", r.TAvg)
	}
}

// gbits converts MiB/s to perftest's --report_gbits unit, Gbit/s.
func gbits(mibs float64) float64 { return mibs * (1 << 20) * 8 / 1e9 }

func printPerfResult(w io.Writer, r perf.Result) {
	if r.Test.Latency() {
		fmt.Fprintf(w, " %-7d %-10d %-7.2f        %-7.2f      %-7.2f          %-7.2f        %-7.2f          %-7.2f                %-7.2f\n",
			r.MsgSize, r.Iters, r.TMin, r.TMax, r.TTypical, r.TAvg, r.TStdev, r.P99, r.P999)
		return
	}
	fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t     %-7.6f\n", r.MsgSize, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
}
