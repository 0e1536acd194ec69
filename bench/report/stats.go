// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Samples are one figure's values, one per round (or one per run); an empty
// Samples is a figure that was not measured.
type Samples []float64

// Median is the middle value (the mean of the two middle ones for an even
// count); NaN when s is empty.
func (s Samples) Median() float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	v := append([]float64(nil), s...)
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// Min is the smallest value; NaN when s is empty.
func (s Samples) Min() float64 {
	m := math.NaN()
	for _, x := range s {
		if math.IsNaN(m) || x < m {
			m = x
		}
	}
	return m
}

// Max is the largest value; NaN when s is empty.
func (s Samples) Max() float64 {
	m := math.NaN()
	for _, x := range s {
		if math.IsNaN(m) || x > m {
			m = x
		}
	}
	return m
}

// String is the median with the range in brackets ("1,750 (1,632 – 1,902)"),
// the value alone when there is one, and "not measured" when there is none.
func (s Samples) String() string {
	switch {
	case len(s) == 0:
		return notMeasured
	case len(s) == 1 || s.Min() == s.Max():
		return num(s.Median())
	}
	return fmt.Sprintf("%s (%s – %s)", num(s.Median()), num(s.Min()), num(s.Max()))
}

// notMeasured is what a figure that has no value reads as.
const notMeasured = "not measured"

// MiB is 2^20 bytes: every MiB/s in the report is 2^20 bytes per second.
const MiB = 1 << 20

// GbpsToMiBps converts iperf3's Gbit/s (10^9 bits per second) to MiB/s.
func GbpsToMiBps(gbps float64) float64 { return gbps * 1e9 / 8 / MiB }

// nsPerOpToMiBps is the bandwidth of moving size bytes in ns nanoseconds, in
// MiB/s (Go's benchmark "MB/s" is 10^6 bytes per second, so it is not used).
func nsPerOpToMiBps(size int, ns float64) float64 { return float64(size) / (ns / 1e9) / MiB }

// num formats a figure with three significant digits or more, thousands
// separated: 58,850; 684; 40.2; 3.78; 0.276.
func num(x float64) string {
	switch a := math.Abs(x); {
	case math.IsNaN(x):
		return notMeasured
	case a >= 100:
		return thousands(strconv.FormatFloat(x, 'f', 0, 64))
	case a >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	case a == 0:
		return "0"
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// ratio formats a ratio: two decimals below 10, none from 10 up.
func ratio(x float64) string {
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return "—"
	case x >= 10:
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// thousands puts commas between groups of three digits of an integer string.
func thousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// sizeName is a message size as the report writes it: 8 B, 4 KiB, 64 MiB.
func sizeName(n int) string {
	switch {
	case n >= MiB && n%MiB == 0:
		return fmt.Sprintf("%d MiB", n/MiB)
	case n >= 1024 && n%1024 == 0:
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}

// sizeKey is a size as bench/peers.sh's keys write it: 8B, 4KiB, 64MiB.
func sizeKey(n int) string { return strings.ReplaceAll(sizeName(n), " ", "") }

// byRound pairs two figures measured in the same rounds and returns the
// ratios a/b of the rounds that have both, in round order.
func byRound(a, b map[int]float64) Samples {
	rounds := make([]int, 0, len(a))
	for r := range a {
		if _, ok := b[r]; ok {
			rounds = append(rounds, r)
		}
	}
	sort.Ints(rounds)
	var s Samples
	for _, r := range rounds {
		s = append(s, a[r]/b[r])
	}
	return s
}

// values returns the values of a round-keyed figure in round order.
func values(m map[int]float64) Samples {
	rounds := make([]int, 0, len(m))
	for r := range m {
		rounds = append(rounds, r)
	}
	sort.Ints(rounds)
	s := make(Samples, 0, len(rounds))
	for _, r := range rounds {
		s = append(s, m[r])
	}
	return s
}
