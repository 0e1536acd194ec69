// SPDX-License-Identifier: Apache-2.0

package perf_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/nativepeer"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// The benchmarks of a native endpoint: a VM adapter with native endpoints
// (vrdma0.nativeEndpointSupport) on a vrdmad host, and the plain RoCEv2
// peer of vrdmactl native-peer --address --bench (the engine on its own,
// no agent, no control plane) as the passive side, the VM measuring, as
// native-peer's active side does. "loopback": the host and the peer on
// loopback addresses; "veth" (root): the peer in a network namespace of
// its own on the hosts' bridge, MTU 9000. Compare with the rdma path
// between two VMs of two hosts in the same modes (path_bench_test.go).

func nativeBenchmark(b *testing.B, c perf.Config) {
	type mode struct {
		name  string
		netns testenv.NetnsMode
		peer  netip.Addr
	}
	for _, mode := range []mode{{"loopback", testenv.NetnsOff, netip.MustParseAddr("127.0.77.1")}, {"veth", testenv.NetnsOn, netip.MustParseAddr("10.199.1.210")}} {
		b.Run(mode.name, func(b *testing.B) {
			cl := testenv.StartCluster(b, testenv.ClusterOptions{Hosts: 1, Netns: mode.netns, LogLevel: "warn", MTU: 9000, RDMA: true})
			h := cl.Hosts[0]
			ctl := testenv.Binary(b, "vrdmactl")
			if out, err := exec.Command(ctl, "--etcd-endpoints", cl.Endpoint(), "host", "configure", h.Name, "--pvrdma-namespaces", "on").CombinedOutput(); err != nil {
				b.Fatalf("host configure --pvrdma-namespaces on: %v\n%s", err, out)
			}
			ns := ""
			if mode.netns == testenv.NetnsOn {
				ns = cl.PeerNetns(b, "nb", mode.peer)
			}
			h.DefineVMX(b, "nbench", h.VMX(testenv.VMOptions{MemMB: 2*c.Size>>20 + 2})+"vrdma0.nativeEndpointSupport = \"TRUE\"\n")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			vm, err := vrdma.Open(ctx, "nbench", vrdma.WithSocket(h.Socket))
			if err != nil {
				b.Fatal(err)
			}
			defer vm.Close()
			port := 18600
			run := func(c perf.Config) perf.Result {
				port++
				args := []string{ctl, "native-peer", "--address", mode.peer.String(), "--bench", string(c.Test), "-p", strconv.Itoa(port), "--timeout", "5m"}
				if ns != "" {
					args = append([]string{"ip", "netns", "exec", ns}, args...)
				}
				peer := exec.Command(args[0], args[1:]...)
				var out testenv.SyncBuffer
				peer.Stdout, peer.Stderr = &out, &out
				if err := peer.Start(); err != nil {
					b.Fatal(err)
				}
				defer func() {
					if err := peer.Wait(); err != nil {
						b.Fatalf("the native peer: %v\n%s", err, out.String())
					}
				}()
				var cn net.Conn
				for { // until the peer listens
					if cn, err = h.Dial(ctx, "tcp", net.JoinHostPort(mode.peer.String(), strconv.Itoa(port))); err == nil || ctx.Err() != nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if err != nil {
					peer.Process.Kill()
					b.Fatalf("connect to the native peer: %v\n%s", err, out.String())
				}
				defer cn.Close()
				r, err := nativepeer.BenchSide{Adapter: vm.Adapters()[0], GID: records.GIDOf(h.Addr())}.Active(ctx, c, cn)
				if err != nil {
					peer.Process.Kill()
					b.Fatalf("%v\nthe native peer:\n%s", err, out.String())
				}
				if r.Path.Path != vrdma.PathRDMA {
					b.Fatalf("path %q, want rdma", r.Path.Path)
				}
				return r
			}
			w := c
			w.Iters = max(200, min(5000, (256<<20)/max(c.Size, 1)))
			run(w)
			c.Iters = max(b.N, 100)
			b.ResetTimer()
			reportResult(b, c, run(c))
		})
	}
}

func BenchmarkNativeWriteBW(b *testing.B) {
	for _, sz := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", sz>>10), func(b *testing.B) { nativeBenchmark(b, perf.Config{Test: perf.WriteBW, Size: sz}) })
	}
}

func BenchmarkNativeReadBW(b *testing.B) {
	for _, sz := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", sz>>10), func(b *testing.B) { nativeBenchmark(b, perf.Config{Test: perf.ReadBW, Size: sz}) })
	}
}

func BenchmarkNativeWriteLat(b *testing.B) {
	b.Run("8B", func(b *testing.B) { nativeBenchmark(b, perf.Config{Test: perf.WriteLat, Size: 8}) })
}

func BenchmarkNativeSendRate(b *testing.B) {
	b.Run("8B", func(b *testing.B) { nativeBenchmark(b, perf.Config{Test: perf.SendBW, Size: 8}) })
}
