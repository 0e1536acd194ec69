// SPDX-License-Identifier: Apache-2.0

package member_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// The inventory the benchmarks register (1,000 hosts and 10,000 VMs with
// adapters). Smaller for a quick run:
//
//	go test -run X -bench ControlPlane -benchtime 1x ./internal/control/member -bench-hosts 100 -bench-vms 1000
var (
	benchHosts   = flag.Int("bench-hosts", 1000, "hosts registered by the control-plane benchmarks")
	benchVMs     = flag.Int("bench-vms", 10000, "VMs (one adapter each) registered by the control-plane benchmarks")
	benchWriters = flag.Int("bench-writers", 16, "concurrent writers registering the inventory")
)

// inventory registers benchHosts hosts — each with its record and a
// heartbeat (one shared lease stands in for a lease per host) — and
// benchVMs VMs with one adapter each, round-robin over the hosts, through
// PublishVM (VM, adapter and two directory entries per transaction). Every
// fourth host has no RDMA uplink, so decisions are a mix of rdma and tcp.
// It returns the revision of the last write.
func inventory(tb testing.TB, ctx context.Context, st *store.Store) int64 {
	setupFabric(tb, ctx, st)
	lease, err := st.Client().Grant(ctx, 3600)
	if err != nil {
		tb.Fatal(err)
	}
	parallel(tb, *benchHosts, func(i int) error {
		id := fmt.Sprintf("host-%04d", i)
		if _, err := st.Create(ctx, records.HostKey(id), hostRec(id, i, i%4 != 3)); err != nil {
			return err
		}
		val, err := store.Encode(records.Alive{HostID: id, Lease: int64(lease.ID), TTL: 3600, SinceUnixMs: time.Now().UnixMilli(), AgentVersion: "bench"})
		if err != nil {
			return err
		}
		_, err = st.Client().Put(ctx, records.AliveKey(id), string(val), clientv3.WithLease(lease.ID))
		return err
	})
	parallel(tb, *benchVMs, func(i int) error {
		vm, ads := vmRec(fmt.Sprintf("vm-%05d", i), fmt.Sprintf("host-%04d", i%*benchHosts), i, 1)
		return member.PublishVM(ctx, st, vm, ads)
	})
	resp, err := st.Client().Get(ctx, "x")
	if err != nil {
		tb.Fatal(err)
	}
	return resp.Header.Revision
}

// parallel runs fn(0..n-1) on benchWriters goroutines.
func parallel(tb testing.TB, n int, fn func(i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range *benchWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		tb.Fatal(first)
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkControlPlaneRegister registers the inventory into a fresh
// embedded store (one iteration takes seconds: run with -benchtime 1x) and
// reports:
//
//   - register-s: wall time to register every host and VM;
//   - vm-txn/s: VM registrations (one transaction each) per second;
//   - watch-lag-ms: from the last write to a cache that watched the whole
//     registration reflecting it;
//   - list-ms: a new cache's first list of the whole inventory;
//   - cache-MB and cache-B/VM: heap held by that cache (HeapAlloc after
//     GC, with the cache against without it);
//   - db-MB: etcd's database size.
func BenchmarkControlPlaneRegister(b *testing.B) {
	var register, lag, list time.Duration
	var cacheBytes, dbBytes float64
	for range b.N {
		b.StopTimer()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		st := etcdtest.OpenEmbedded(b)
		watcher := member.NewCache(st, member.CacheConfig{Logger: quiet})
		<-watcher.Synced()
		b.StartTimer()

		start := time.Now()
		rev := inventory(b, ctx, st)
		written := time.Now()
		register += written.Sub(start)
		if err := watcher.WaitRev(ctx, rev); err != nil {
			b.Fatal(err)
		}
		lag += time.Since(written)
		b.StopTimer()
		if n := watcher.Len(); n[records.KindVM] != *benchVMs || n[records.KindHost] != *benchHosts {
			b.Fatalf("watching cache holds %v", n)
		}
		watcher.Close()

		before := heapAlloc()
		t0 := time.Now()
		c := member.NewCache(st, member.CacheConfig{Logger: quiet})
		<-c.Synced()
		list += time.Since(t0)
		after := heapAlloc()
		if n := c.Len(); n[records.KindVM] != *benchVMs {
			b.Fatalf("listed cache holds %v", n)
		}
		cacheBytes += float64(after) - float64(before)
		runtime.KeepAlive(c)
		c.Close()
		if s, err := st.Client().Status(ctx, st.Endpoints()[0]); err == nil {
			dbBytes += float64(s.DbSize)
		}
		st.Close()
		cancel()
	}
	n := float64(b.N)
	b.ReportMetric(register.Seconds()/n, "register-s")
	b.ReportMetric(float64(*benchVMs)*n/register.Seconds(), "vm-txn/s")
	b.ReportMetric(lag.Seconds()*1000/n, "watch-lag-ms")
	b.ReportMetric(list.Seconds()*1000/n, "list-ms")
	b.ReportMetric(cacheBytes/n/(1<<20), "cache-MB")
	b.ReportMetric(cacheBytes/n/float64(*benchVMs), "cache-B/VM")
	b.ReportMetric(dbBytes/n/(1<<20), "db-MB")
}

// fixture is one registered inventory with a synced cache, shared by the
// lookup benchmarks.
var fixture struct {
	once  sync.Once
	dir   string
	st    *store.Store
	cache *member.Cache
}

func loadFixture(b *testing.B) *member.Cache {
	fixture.once.Do(func() {
		ctx := context.Background()
		dir, err := os.MkdirTemp("", "vrdma-bench-")
		if err != nil {
			b.Fatal(err)
		}
		fixture.dir = dir
		st, err := store.Open(ctx, store.Config{DataDir: dir, UnsafeNoFsync: true, Embed: etcdtest.Config(""), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		fixture.st = st
		rev := inventory(b, ctx, st)
		fixture.cache = member.NewCache(st, member.CacheConfig{Logger: quiet})
		if err := fixture.cache.WaitRev(ctx, rev); err != nil {
			b.Fatal(err)
		}
	})
	if fixture.cache == nil {
		b.Fatal("no fixture")
	}
	return fixture.cache
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if fixture.cache != nil {
		fixture.cache.Close()
		fixture.st.Close()
	}
	if fixture.dir != "" {
		os.RemoveAll(fixture.dir)
	}
	if leaked := etcdtest.LeakedGoroutines(); code == 0 && len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", strings.Join(leaked, "\n\n"))
		code = 1
	}
	os.Exit(code)
}

// BenchmarkControlPlaneDecideCached measures a path decision between two
// adapters the cache holds (resolve both names, their hosts with liveness,
// port groups and switch, then pathsel.Select), in a cache holding the
// whole inventory.
func BenchmarkControlPlaneDecideCached(b *testing.B) {
	c := loadFixture(b)
	ctx := context.Background()
	_, adsB := vmRec("vm-00002", "host-0002", 2, 1)
	cases := []struct {
		name, a, b string
		path       pathsel.Path
	}{
		{"rdma", "vm-00000/vrdma0", "vm-00001/vrdma0", pathsel.RDMA},
		{"tcp", "vm-00000/vrdma0", "vm-00003/vrdma0", pathsel.TCP},
		{"memcpy", "vm-00000/vrdma0", fmt.Sprintf("vm-%05d/vrdma0", *benchHosts), pathsel.Memcpy},
		{"rdma-by-gid", "vm-00000/vrdma0", adsB[0].GID.String(), pathsel.RDMA},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			d, err := c.Decide(ctx, tc.a, tc.b)
			if err != nil || d.Path != tc.path {
				b.Fatalf("Decide = %v, %v; want %s", d, err, tc.path)
			}
			b.ReportAllocs()
			for b.Loop() {
				c.Decide(ctx, tc.a, tc.b)
			}
		})
	}
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Decide(ctx, "vm-00000/vrdma0", "vm-00001/vrdma0")
			}
		})
	})
}

// BenchmarkControlPlaneResolveCached measures resolving "vm/vrdmaN" and a
// GID from the cache.
func BenchmarkControlPlaneResolveCached(b *testing.B) {
	c := loadFixture(b)
	ctx := context.Background()
	_, ads := vmRec("vm-00042", "", 42, 1)
	for _, target := range []string{"vm-00042/vrdma0", ads[0].GID.String()} {
		b.Run(target, func(b *testing.B) {
			if e, err := c.Resolve(ctx, target); err != nil || e.VM != "vm-00042" {
				b.Fatalf("Resolve = %+v, %v", e, err)
			}
			b.ReportAllocs()
			for b.Loop() {
				c.Resolve(ctx, target)
			}
		})
	}
}
