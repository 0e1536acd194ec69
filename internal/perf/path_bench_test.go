// SPDX-License-Identifier: Apache-2.0

package perf_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// The benchmarks of the paths between hosts, tcp and rdma: two vrdmad
// processes, each a host, on loopback addresses ("loopback") and, as
// root, in two network namespaces joined by veth pairs through a bridge
// ("veth"), MTU 9000 (RoCE MTU 4096). Compare with the peers on the same
// path (bench/peers.sh: UCX over TCP, sockperf, iperf3). The rdma
// benchmarks also run RoCE v1 across the veths ("veth-v1": Ethernet
// frames through AF_PACKET, no segmentation offload) beside RoCE v2.

func tcpBenchmark(b *testing.B, c perf.Config) { pathBenchmark(b, vrdma.PathTCP, c, nil) }

func rdmaBenchmark(b *testing.B, c perf.Config) { pathBenchmark(b, vrdma.PathRDMA, c, nil) }

// pathBenchmark runs c on path between two vrdmad processes, started
// with the more flags args.
func pathBenchmark(b *testing.B, path vrdma.PathKind, c perf.Config, args []string) {
	type mode struct {
		name  string
		netns testenv.NetnsMode
		roce  records.RoCEVersion
	}
	modes := []mode{{"loopback", testenv.NetnsOff, ""}, {"veth", testenv.NetnsOn, ""}}
	if path == vrdma.PathRDMA {
		modes = append(modes, mode{"veth-v1", testenv.NetnsOn, records.RoCEv1})
	}
	for _, mode := range modes {
		b.Run(mode.name, func(b *testing.B) {
			need := c.Size
			if c.Test.Latency() {
				need *= 2
			}
			cl := testenv.StartCluster(b, testenv.ClusterOptions{Hosts: 2, Netns: mode.netns, LogLevel: "warn", MTU: 9000, RDMA: path == vrdma.PathRDMA, RoCEVersion: mode.roce,
				ExtraArgs: func(*testenv.Host) []string { return args }})
			o := testenv.VMOptions{MemMB: need>>20 + 2}
			v1 := cl.Hosts[0].Open(b, "bench1", o)
			v2 := cl.Hosts[1].Open(b, "bench2", o)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{BufSize: need, MaxInline: 220})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close(context.Background())
			if got := p.Path().Path; got != path {
				b.Fatalf("path %q, want %s", got, path)
			}
			runBenchmark(b, p, c)
		})
	}
}

func BenchmarkTCPWriteBW(b *testing.B) {
	for _, sz := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", sz>>10), func(b *testing.B) { tcpBenchmark(b, perf.Config{Test: perf.WriteBW, Size: sz}) })
	}
}

// BenchmarkTCPLanesWriteBW is 64 KiB and 1 MiB write_bw on the tcp path
// with the agents' requests on 1, 2 and 4 connections (--tcp-lanes), every
// message striped (--tcp-stripe-min 16384: 64 KiB in up to four 16 KiB
// stripes): what striping a message over lanes gives on this machine.
func BenchmarkTCPLanesWriteBW(b *testing.B) {
	for _, sz := range []int{64 << 10, 1 << 20} {
		for _, lanes := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("%dKiB/lanes-%d", sz>>10, lanes), func(b *testing.B) {
				pathBenchmark(b, vrdma.PathTCP, perf.Config{Test: perf.WriteBW, Size: sz}, []string{"--tcp-lanes", fmt.Sprint(lanes), "--tcp-stripe-min", "16384"})
			})
		}
	}
}

func BenchmarkTCPReadBW(b *testing.B) {
	for _, sz := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", sz>>10), func(b *testing.B) { tcpBenchmark(b, perf.Config{Test: perf.ReadBW, Size: sz}) })
	}
}

func BenchmarkTCPWriteLat(b *testing.B) {
	b.Run("8B", func(b *testing.B) { tcpBenchmark(b, perf.Config{Test: perf.WriteLat, Size: 8}) })
}

func BenchmarkTCPSendRate(b *testing.B) {
	b.Run("8B", func(b *testing.B) { tcpBenchmark(b, perf.Config{Test: perf.SendBW, Size: 8}) })
}

func BenchmarkRDMAWriteBW(b *testing.B) {
	for _, sz := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", sz>>10), func(b *testing.B) { rdmaBenchmark(b, perf.Config{Test: perf.WriteBW, Size: sz}) })
	}
}

func BenchmarkRDMAReadBW(b *testing.B) {
	for _, sz := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", sz>>10), func(b *testing.B) { rdmaBenchmark(b, perf.Config{Test: perf.ReadBW, Size: sz}) })
	}
}

func BenchmarkRDMAWriteLat(b *testing.B) {
	b.Run("8B", func(b *testing.B) { rdmaBenchmark(b, perf.Config{Test: perf.WriteLat, Size: 8}) })
}

func BenchmarkRDMASendRate(b *testing.B) {
	b.Run("8B", func(b *testing.B) { rdmaBenchmark(b, perf.Config{Test: perf.SendBW, Size: 8}) })
}
