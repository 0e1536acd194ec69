// SPDX-License-Identifier: Apache-2.0

// Command report writes docs/BENCHMARKS.md from the raw results bench/run
// collected: the table of targets against the peers computed from the run's figures,
// vrdma beside its peers on each path, UCX over vrdma's rc_verbs beside
// UCX's tcp and posix, the rdma path beside the tcp path
// between two host agents, the bandwidth chart (drawn with gnuplot into
// benchmarks-bw.png), doorbell against async mode, scale, what bounds each
// missed target (bench/analysis/ID.md, and a profile when bench/run took
// one), the commands, and the peers' raw output.
//
//	go run ./bench/report -work DIR -out docs     # write docs/BENCHMARKS.md and the chart
//	go run ./bench/report -work DIR -misses       # list the missed targets: ID, vrdmactl perf arguments
//
// The work directory's layout is bench/run's: meta.json, lscpu.txt,
// packages.txt, commands.txt, errors.txt; go/rN/*.json and scale/*.json
// (vrdmactl perf --out_json_file); sweep/vrdma-PATH.json (vrdmactl perf -a)
// and sweep/ucx-SERIES.SIZE.txt (ucx_perftest -f -v); perftest/rN/
// PATH.PROGRAM.SIZE.txt (a perftest client's output); ucx/rN/
// PATH.TEST.SIZE.txt (ucx_perftest -f -v over vrdma's rc_verbs, the client's
// output); peers/rN.json and
// rN.txt (bench/peers.sh); copy/rN.txt (go test -bench BenchmarkCopy);
// paths/bench.txt (go test -bench 'Benchmark(TCP|RDMA)…' -v, every -count
// repetition); profile/ID.txt and ID.cmd (perf report). A missing part is
// reported as "not measured"; a file that is there but malformed is an
// error naming it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	work := flag.String("work", "", "bench/run's work directory (raw results)")
	out := flag.String("out", "docs", "where to write BENCHMARKS.md and "+ChartFile)
	analysis := flag.String("analysis", "bench/analysis", "the hand-kept analyses of the missed targets, ID.md")
	misses := flag.Bool("misses", false, "print the missed targets (ID, tab, vrdmactl perf arguments) and write nothing")
	flag.Parse()
	if *work == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: report -work DIR [-out DIR] [-analysis DIR] [-misses]")
		os.Exit(2)
	}
	if err := run(*work, *out, *analysis, *misses); err != nil {
		fmt.Fprintln(os.Stderr, "bench/report:", err)
		os.Exit(1)
	}
}

func run(work, out, analysis string, misses bool) error {
	d, err := Load(work)
	if err != nil {
		return err
	}
	outcomes := Evaluate(d)
	if misses {
		for _, o := range outcomes {
			if o.Status == Missed {
				fmt.Printf("%s\t%s\n", o.ID, o.ProfileArgs)
			}
		}
		return nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	chart := drawChart(d, work, out)
	doc := Render(d, outcomes, chart, analysis)
	file := filepath.Join(out, "BENCHMARKS.md")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "bench/report: wrote", file)
	return nil
}
