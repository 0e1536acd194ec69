// SPDX-License-Identifier: Apache-2.0

package member_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// TestControlPlaneOutage takes the (single-member) etcd away from two
// agents and brings it back on the same data directory and address:
// cached lookups and path decisions keep working throughout; lookups of
// peers the cache does not hold fail at once with a clear error; both
// work again, and the watch resumes, when etcd returns; hosts keep their
// leases through a short outage.
func TestControlPlaneOutage(t *testing.T) {
	ctx := ctxT(t, 50*time.Second)
	cfg := etcdtest.Config(t.TempDir())
	srv, err := store.StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg = srv.Config() // the same directory and client URL for the restart
	t.Cleanup(func() { srv.Close() })
	// Clients reach etcd through a proxy: cutting it resets their
	// connections as the death of the etcd process would.
	proxy := etcdtest.NewProxy(t, cfg.ClientURL)
	stA := etcdtest.Open(t, proxy.URL())
	stB := etcdtest.Open(t, proxy.URL())
	setupFabric(t, ctx, stA)

	const lookupTimeout = 500 * time.Millisecond
	var caches []*member.Cache
	for i, st := range []*store.Store{stA, stB} {
		id := []string{"host-a", "host-b"}[i]
		m, err := member.Register(ctx, st, hostRec(id, i, true), member.Options{TTL: 5 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		vm, ads := vmRec("vm-"+id, id, i, 1)
		if err := member.PublishVM(ctx, st, vm, ads); err != nil {
			t.Fatal(err)
		}
		caches = append(caches, newCache(t, st, member.CacheConfig{LookupTimeout: lookupTimeout}))
	}
	for _, c := range caches {
		waitFor(t, 5*time.Second, "both hosts up and both VMs in the directory", func() bool {
			return hostState(c, "host-a") == records.HostUp && hostState(c, "host-b") == records.HostUp && c.Len()[records.KindEndpoint] == 4
		})
	}
	_, adsB := vmRec("vm-host-b", "host-b", 1, 1)

	// etcd goes away.
	proxy.Cut()
	srv.Kill()
	srv.Close()

	for i, c := range caches {
		// Cached peers: resolution and path decisions go on.
		e, err := c.Resolve(ctx, "vm-host-b/vrdma0")
		if err != nil || e.Host != "host-b" {
			t.Errorf("cache %d: cached Resolve during the outage = %+v, %v", i, e, err)
		}
		if e, err := c.Resolve(ctx, adsB[0].GID.String()); err != nil || e.Name() != "vm-host-b/vrdma0" {
			t.Errorf("cache %d: cached Resolve by GID during the outage = %+v, %v", i, e, err)
		}
		d, err := c.Decide(ctx, "vm-host-a/vrdma0", "vm-host-b/vrdma0")
		if err != nil || d.Path != pathsel.RDMA {
			t.Errorf("cache %d: cached Decide during the outage = %v, %v", i, d, err)
		}
		if hs, err := c.Host(ctx, "host-a"); err != nil || hs.Host.State != records.HostUp {
			t.Errorf("cache %d: cached Host during the outage = %+v, %v", i, hs, err)
		}

		// Unknown peers: a clear error, within the lookup timeout.
		start := time.Now()
		_, err = c.Resolve(ctx, "vm-new/vrdma0")
		took := time.Since(start)
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("cache %d: Resolve of an unknown peer during the outage = %v; want ErrUnavailable", i, err)
		}
		for _, s := range []string{"vm-new/vrdma0", "not in the cache", "control plane unreachable", proxy.URL()} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("cache %d: error %q does not say %q", i, err, s)
			}
		}
		if took > 10*lookupTimeout {
			t.Errorf("cache %d: the failing lookup took %v with a lookup timeout of %v", i, took, lookupTimeout)
		}
		if _, err := c.Decide(ctx, "vm-host-a/vrdma0", "vm-new/vrdma0"); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("cache %d: Decide with an unknown peer during the outage = %v; want ErrUnavailable", i, err)
		}
	}

	// etcd returns, on the same data directory and address.
	srv, err = store.StartEmbedded(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Heal()
	vm, ads := vmRec("vm-new", "host-b", 5, 1)
	retrying(t, ctx, func(ctx context.Context) error { return member.PublishVM(ctx, stB, vm, ads) })
	for i, c := range caches {
		waitFor(t, 10*time.Second, "the new VM resolves after etcd returned", func() bool {
			e, err := c.Resolve(ctx, "vm-new/vrdma0")
			return err == nil && e.GID == ads[0].GID
		})
		// The watch resumed: a later change arrives without a lookup.
		resp, err := stA.Client().Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := c.WaitRev(wctx, resp.Header.Revision); err != nil {
			t.Errorf("cache %d: watch did not resume: %v", i, err)
		}
		cancel()
		if d, err := c.Decide(ctx, "vm-host-a/vrdma0", "vm-new/vrdma0"); err != nil || d.Path != pathsel.RDMA {
			t.Errorf("cache %d: Decide after the outage = %v, %v", i, d, err)
		}
		for _, id := range []string{"host-a", "host-b"} {
			if s := hostState(c, id); s != records.HostUp {
				t.Errorf("cache %d: %s is %s after a short outage", i, id, s)
			}
		}
	}
}
