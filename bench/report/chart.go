// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ChartFile is the chart's file name, next to the document.
const ChartFile = "benchmarks-bw.png"

// series is one line of the chart: a sweep series, its legend and colour.
type series struct{ Name, Title, Color string }

func chartSeries() []series {
	return []series{
		{"vrdma-memcpy", "vrdma memcpy", "#7b2cbf"}, {"vrdma-tcp", "vrdma tcp", "#1b7f3b"},
		{"vrdma-rdma", "vrdma rdma", "#1f5fbf"},
		{"ucx-shm", "UCX shm ucp_put_bw", "#e07b00"}, {"ucx-tcp", "UCX tcp tag_bw", "#b0182a"},
	}
}

// chartSizes are the chart's message sizes: 4 B .. 8 MiB, powers of two.
func chartSizes() []int {
	var s []int
	for n := 4; n <= 8*MiB; n *= 2 {
		s = append(s, n)
	}
	return s
}

// writeChartData writes the sweep as a gnuplot data file (one line per size,
// a column per series, "?" where a figure is missing) and the script that
// draws it into png; it returns the script's path, or "" when the sweep
// has no figure at all.
func writeChartData(d *Data, dir, png string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var dat strings.Builder
	dat.WriteString("# size")
	for _, s := range chartSeries() {
		dat.WriteString("\t" + s.Name)
	}
	dat.WriteString("\n")
	points := 0
	for _, size := range chartSizes() {
		fmt.Fprintf(&dat, "%d", size)
		for _, s := range chartSeries() {
			v, ok := d.Sweep[s.Name][size]
			if !ok || math.IsNaN(v) || v <= 0 {
				dat.WriteString("\t?")
				continue
			}
			points++
			fmt.Fprintf(&dat, "\t%g", v)
		}
		dat.WriteString("\n")
	}
	if points == 0 {
		return "", nil
	}
	datFile := filepath.Join(dir, "bw.dat")
	if err := os.WriteFile(datFile, []byte(dat.String()), 0o644); err != nil {
		return "", err
	}
	var plots []string
	for i, s := range chartSeries() {
		style := fmt.Sprintf("lw 2 lc rgb %q", s.Color)
		if strings.HasPrefix(s.Name, "ucx") {
			style += " dt 2"
		}
		plots = append(plots, fmt.Sprintf("%q using 1:%d with linespoints %s pt 7 ps 0.6 title %q", datFile, i+2, style, s.Title))
	}
	gp := fmt.Sprintf(`set terminal pngcairo noenhanced size 960,600 font "sans,10"
set output %q
set title "Bandwidth against message size, vrdma (solid) beside UCX (dashed); MiB/s = 2^20 B/s"
set logscale x 2
set logscale y 10
set xrange [3:11000000]
set xtics ("4 B" 4, "32 B" 32, "256 B" 256, "2 KiB" 2048, "16 KiB" 16384, "128 KiB" 131072, "1 MiB" 1048576, "8 MiB" 8388608)
set format y "%%g"
set xlabel "message size"
set ylabel "MiB/s"
set grid
set key top left
set datafile missing "?"
plot %s
`, png, strings.Join(plots, ", \\\n     "))
	gpFile := filepath.Join(dir, "bw.gp")
	return gpFile, os.WriteFile(gpFile, []byte(gp), 0o644)
}

// drawChart writes the chart's data and script into work/chart and runs
// gnuplot to draw out/benchmarks-bw.png. When it cannot, Chart.Why says why
// and what to install.
func drawChart(d *Data, work, out string) Chart {
	png := filepath.Join(out, ChartFile)
	gp, err := writeChartData(d, filepath.Join(work, "chart"), png)
	switch {
	case err != nil:
		return Chart{Why: fmt.Sprintf("its data could not be written (%v).", err)}
	case gp == "":
		return Chart{Why: "the run has no sweep figures (`vrdmactl perf -a`, `ucx_perftest`)."}
	}
	if _, err := exec.LookPath("gnuplot"); err != nil {
		fmt.Fprintln(os.Stderr, "bench/report: gnuplot not found: the chart is not drawn; install gnuplot-nox (apt-get install gnuplot-nox) and run again")
		return Chart{Why: "gnuplot was not installed (`apt-get install gnuplot-nox`)."}
	}
	if b, err := exec.Command("gnuplot", gp).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/report: gnuplot %s: %v\n%s", gp, err, b)
		return Chart{Why: fmt.Sprintf("gnuplot failed (%v).", err)}
	}
	return Chart{File: ChartFile}
}
