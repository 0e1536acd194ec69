// SPDX-License-Identifier: Apache-2.0

package member_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

const ttl = time.Second // the shortest lease etcd grants with the test timers

// TestControlPlaneMembershipLease: keepalive keeps a host up past many
// TTLs; a host whose agent dies is shown down once its lease expires; a
// host whose agent stops cleanly is shown down at once; a second agent
// with the same host ID is refused while the first lives and takes over
// once the first's lease is gone.
func TestControlPlaneMembershipLease(t *testing.T) {
	ctx := ctxT(t, 40*time.Second)
	srv := etcdtest.Start(t)
	observer := etcdtest.Open(t, srv.ClientURL())
	cache := newCache(t, observer, member.CacheConfig{})

	agentA := etcdtest.Open(t, srv.ClientURL()) // agent A's own connection
	m, err := member.Register(ctx, agentA, hostRec("host-a", 1, true), member.Options{TTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	waitFor(t, 5*time.Second, "host-a shown up", func() bool { return hostState(cache, "host-a") == records.HostUp })
	lease := m.Lease()

	// Keepalive: three TTLs later the host is still up on the same lease.
	time.Sleep(3 * ttl)
	if s := hostState(cache, "host-a"); s != records.HostUp || m.Lease() != lease {
		t.Fatalf("after 3 TTLs with keepalive: state %s, lease %x (was %x)", s, m.Lease(), lease)
	}
	hs, err := cache.Host(ctx, "host-a")
	if err != nil || hs.Alive == nil || hs.Alive.Lease != int64(lease) || hs.LeaseAge(time.Now()) < 3*ttl {
		t.Fatalf("Host = %+v, %v; want alive on lease %x for 3 TTLs or more", hs, err, lease)
	}

	// A second agent claiming host-a is refused while A lives.
	// Its record is not touched: the live agent follows its record.
	agentA2 := etcdtest.Open(t, srv.ClientURL())
	dup := hostRec("host-a", 2, true) // another PVRDMA address
	_, err = member.Register(ctx, agentA2, dup, member.Options{TTL: ttl, TakeoverWait: 300 * time.Millisecond, Logger: quiet})
	if !errors.Is(err, member.ErrHostIDInUse) || !strings.Contains(err.Error(), "0.1.0-test") {
		t.Fatalf("duplicate Register: %v; want ErrHostIDInUse naming the holder", err)
	}
	if hostState(cache, "host-a") != records.HostUp {
		t.Fatal("a refused duplicate took host-a down")
	}
	if rec, _, err := store.Get[records.Host](ctx, observer, records.HostKey("host-a")); err != nil || rec.PVRDMAAddress != hostRec("host-a", 1, true).PVRDMAAddress {
		t.Fatalf("host-a's record after a refused duplicate: %+v, %v; want its PVRDMA address unchanged", rec, err)
	}

	// Agent A dies (its connection goes, nothing is revoked): the host is
	// shown down when the lease expires.
	agentA.Close()
	took := waitFor(t, 10*time.Second, "host-a shown down after its agent died", func() bool { return hostState(cache, "host-a") == records.HostDown })
	t.Logf("host-a shown down %v after its agent died (TTL %v)", took, ttl)
	hs, _ = cache.Host(ctx, "host-a")
	if hs.Alive != nil || hs.Declared != records.HostUp || hs.Host.Name != "host-a" {
		t.Errorf("down host = %+v; want the record kept, declared up, no heartbeat", hs)
	}
	if d, err := cache.Decide(ctx, "x/vrdma0", "y/vrdma0"); err == nil {
		t.Errorf("Decide of unknown endpoints = %v", d)
	}

	// A restarted agent takes the host over.
	m2, err := member.Register(ctx, agentA2, hostRec("host-a", 1, true), member.Options{TTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "host-a up again", func() bool { return hostState(cache, "host-a") == records.HostUp })

	// A clean stop revokes the lease: the heartbeat is gone when Close
	// returns, without waiting for a TTL.
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	if r, err := observer.Client().Get(ctx, records.AliveKey("host-a")); err != nil || len(r.Kvs) != 0 {
		t.Errorf("heartbeat after a clean Close: %v, %v; want it revoked", r.Kvs, err)
	}
	waitFor(t, 5*time.Second, "host-a down after Close", func() bool { return hostState(cache, "host-a") == records.HostDown })
	if err := m.Close(); err != nil {
		t.Errorf("Close of a member whose client died: %v", err)
	}
}

// TestControlPlaneMembershipRegainsLease: a member whose lease is revoked
// behind its back (as when etcd could not hear from it for a TTL) claims
// its host again.
func TestControlPlaneMembershipRegainsLease(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	st := etcdtest.OpenEmbedded(t)
	cache := newCache(t, st, member.CacheConfig{})
	m, err := member.Register(ctx, st, hostRec("host-r", 1, false), member.Options{TTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	old := m.Lease()
	if _, err := st.Client().Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "host-r claimed again under a new lease", func() bool {
		l := m.Lease()
		return l != 0 && l != old && hostState(cache, "host-r") == records.HostUp
	})
}

// TestControlPlaneMembershipTwoAgents: two agents with different host IDs,
// each with its own etcd connection and cache — the first runs the
// embedded etcd, the second finds it through the endpoint file — see each
// other's hosts and VMs and decide paths between their VMs.
func TestControlPlaneMembershipTwoAgents(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	dir := t.TempDir()
	stA, err := store.Open(ctx, store.Config{DataDir: dir, UnsafeNoFsync: true, Embed: etcdtest.Config(""), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// Close the server after every client (cleanups run last-in first-out):
	// etcd's graceful stop waits for open watch streams to end.
	t.Cleanup(func() { stA.Close() })
	url, err := store.ReadEndpointFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	stB := etcdtest.Open(t, url)
	setupFabric(t, ctx, stA)

	type agent struct {
		id    string
		st    *store.Store
		m     *member.Member
		cache *member.Cache
	}
	var agents []*agent
	for i, a := range []struct {
		id   string
		st   *store.Store
		rdma bool
	}{{"host-a", stA, true}, {"host-b", stB, true}} {
		m, err := member.Register(ctx, a.st, hostRec(a.id, i, a.rdma), member.Options{TTL: 2 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		ag := &agent{id: a.id, st: a.st, m: m, cache: newCache(t, a.st, member.CacheConfig{})}
		agents = append(agents, ag)
		vm, ads := vmRec("vm-"+a.id, a.id, i, 2)
		if err := member.PublishVM(ctx, a.st, vm, ads); err != nil {
			t.Fatal(err)
		}
	}
	vm2, ads2 := vmRec("vm-a2", "host-a", 7, 1)
	if err := member.PublishVM(ctx, stA, vm2, ads2); err != nil {
		t.Fatal(err)
	}
	_, adsB := vmRec("vm-host-b", "host-b", 1, 2)

	for _, ag := range agents {
		other := "host-b"
		if ag.id == "host-b" {
			other = "host-a"
		}
		waitFor(t, 5*time.Second, ag.id+" sees "+other+" up", func() bool { return hostState(ag.cache, other) == records.HostUp })
		waitFor(t, 5*time.Second, ag.id+" sees every endpoint", func() bool { return ag.cache.Len()[records.KindEndpoint] == 2*5 })
		e, err := ag.cache.Resolve(ctx, "vm-host-b/vrdma1")
		if err != nil || e.Host != "host-b" || e.GID != adsB[1].GID {
			t.Errorf("%s: Resolve(vm-host-b/vrdma1) = %+v, %v", ag.id, e, err)
		}
		e, err = ag.cache.Resolve(ctx, adsB[0].GID.String())
		if err != nil || e.Name() != "vm-host-b/vrdma0" {
			t.Errorf("%s: Resolve(GID %s) = %+v, %v", ag.id, adsB[0].GID, e, err)
		}
		for _, c := range []struct {
			a, b string
			path pathsel.Path
		}{
			{"vm-host-a/vrdma0", "vm-host-b/vrdma0", pathsel.RDMA},
			{"vm-host-b/vrdma1", "vm-host-a/vrdma1", pathsel.RDMA},
			{"vm-host-a/vrdma0", "vm-a2/vrdma0", pathsel.Memcpy},
			{"vm-host-a/vrdma0", "vm-host-a/vrdma1", pathsel.Memcpy},
		} {
			d, err := ag.cache.Decide(ctx, c.a, c.b)
			if err != nil || d.Path != c.path {
				t.Errorf("%s: Decide(%s, %s) = %v, %v; want %s", ag.id, c.a, c.b, d, err, c.path)
			}
		}
	}

	// host-b drops its uplink: every cache turns rdma into tcp.
	if _, err := agents[1].m.UpdateHost(ctx, func(h *records.Host) error { h.Uplinks = nil; return nil }); err != nil {
		t.Fatal(err)
	}
	for _, ag := range agents {
		waitFor(t, 5*time.Second, ag.id+" sees host-b without uplink", func() bool {
			d, err := ag.cache.Decide(ctx, "vm-host-a/vrdma0", "vm-host-b/vrdma0")
			return err == nil && d.Path == pathsel.TCP && strings.Contains(d.Reason, "host host-b has no RDMA uplink on switch dvs1")
		})
	}

	// host-b's agent stops: host-a sees it down and gets no new
	// connection to its VMs.
	agents[1].m.Close()
	waitFor(t, 5*time.Second, "host-a sees host-b down", func() bool { return hostState(agents[0].cache, "host-b") == records.HostDown })
	if d, err := agents[0].cache.Decide(ctx, "vm-host-a/vrdma0", "vm-host-b/vrdma0"); !errors.Is(err, pathsel.ErrHostDown) {
		t.Errorf("Decide to a down host = %v, %v; want ErrHostDown", d, err)
	}

	// Bad targets are refused with a clear error.
	for _, bad := range []string{"vm-host-a/eth0", "not a gid", "vm x/vrdma0"} {
		if _, err := agents[0].cache.Resolve(ctx, bad); !errors.Is(err, member.ErrBadTarget) {
			t.Errorf("Resolve(%q) = %v; want ErrBadTarget", bad, err)
		}
	}
	if _, err := agents[0].cache.Resolve(ctx, "vm-none/vrdma0"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Resolve of an unknown VM = %v; want ErrNotFound", err)
	}
}

// TestControlPlaneMembershipPublish checks PublishVM and RemoveVM: the
// directory follows adapters that come and go and GIDs that change, a GID
// cannot be taken twice, references are checked.
func TestControlPlaneMembershipPublish(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	st := etcdtest.OpenEmbedded(t)
	setupFabric(t, ctx, st)
	if _, err := st.Create(ctx, records.HostKey("h1"), hostRec("h1", 1, false)); err != nil {
		t.Fatal(err)
	}
	cache := newCache(t, st, member.CacheConfig{})
	sync := func() {
		t.Helper()
		r, err := st.Client().Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.WaitRev(ctx, r.Header.Revision); err != nil {
			t.Fatal(err)
		}
	}

	vm, ads := vmRec("vm1", "h1", 1, 3)
	if err := member.PublishVM(ctx, st, vm, ads); err != nil {
		t.Fatal(err)
	}
	sync()
	if got, _ := cache.VM(ctx, "vm1"); strings.Join(got.Adapters, ",") != "vrdma0,vrdma1,vrdma2" {
		t.Fatalf("VM adapters = %v", got.Adapters)
	}

	// Drop vrdma1, change vrdma2's GID.
	oldGID := ads[2].GID
	ads[2].GID = records.GIDOf(ads[2].GID.Next())
	if err := member.PublishVM(ctx, st, vm, []records.Adapter{ads[0], ads[2]}); err != nil {
		t.Fatal(err)
	}
	sync()
	if _, err := cache.Resolve(ctx, "vm1/vrdma1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("removed adapter still resolves: %v", err)
	}
	if _, err := cache.Resolve(ctx, ads[1].GID.String()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("removed adapter's GID still resolves: %v", err)
	}
	if _, err := cache.Resolve(ctx, oldGID.String()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("old GID still resolves: %v", err)
	}
	if e, err := cache.Resolve(ctx, ads[2].GID.String()); err != nil || e.Name() != "vm1/vrdma2" {
		t.Errorf("new GID resolves to %+v, %v", e, err)
	}
	// HolderOf answers from the cache alone, as Resolve's hits do.
	if e, ok := cache.HolderOf(ads[2].GID); !ok || e.Name() != "vm1/vrdma2" || e.Host != "h1" {
		t.Errorf("HolderOf(new GID) = %+v, %v; want vm1/vrdma2 on h1", e, ok)
	}
	if e, ok := cache.HolderOf(oldGID); ok {
		t.Errorf("HolderOf(old GID) = %+v; want none", e)
	}

	// Another VM may not take vm1's GID.
	vm2, ads2 := vmRec("vm2", "h1", 2, 1)
	ads2[0].GID = ads[0].GID
	if err := member.PublishVM(ctx, st, vm2, ads2); !errors.Is(err, member.ErrGIDInUse) || !strings.Contains(err.Error(), "vm1/vrdma0") {
		t.Errorf("PublishVM with a taken GID: %v; want ErrGIDInUse naming vm1/vrdma0", err)
	}
	// References must exist.
	vm3, ads3 := vmRec("vm3", "no-such-host", 3, 1)
	if err := member.PublishVM(ctx, st, vm3, ads3); !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), "no-such-host") {
		t.Errorf("PublishVM on an unknown host: %v", err)
	}
	vm3.Host = "h1"
	ads3[0].PortGroup = "dvportgroup-999"
	if err := member.PublishVM(ctx, st, vm3, ads3); !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), "dvportgroup-999") {
		t.Errorf("PublishVM on an unknown port group: %v", err)
	}

	// Powered off and placed nowhere: no directory entries.
	vm.Power, vm.Host = records.PoweredOff, ""
	if err := member.PublishVM(ctx, st, vm, []records.Adapter{ads[0], ads[2]}); err != nil {
		t.Fatal(err)
	}
	sync()
	if _, err := cache.Resolve(ctx, "vm1/vrdma0"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a VM on no host still resolves: %v", err)
	}

	if err := member.RemoveVM(ctx, st, "vm1"); err != nil {
		t.Fatal(err)
	}
	if err := member.RemoveVM(ctx, st, "vm1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second RemoveVM: %v", err)
	}
	sync()
	if n := cache.Len(); n[records.KindVM] != 0 || n[records.KindAdapter] != 0 || n[records.KindEndpoint] != 0 {
		t.Errorf("after RemoveVM the cache holds %v", n)
	}
}

// TestControlPlaneMembershipConcurrentPublish races agents publishing VMs
// that share nothing but the host record: every VM lands whole.
func TestControlPlaneMembershipConcurrentPublish(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	srv := etcdtest.Start(t)
	a, b := etcdtest.Open(t, srv.ClientURL()), etcdtest.Open(t, srv.ClientURL())
	setupFabric(t, ctx, a)
	if _, err := a.Create(ctx, records.HostKey("h1"), hostRec("h1", 1, false)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w, st := range []*store.Store{a, b} {
		wg.Go(func() {
			for i := range 20 {
				seq := w*100 + i
				vm, ads := vmRec("vm"+strings.Repeat("x", w)+string(rune('a'+i)), "h1", seq, 2)
				if err := member.PublishVM(ctx, st, vm, ads); err != nil {
					t.Errorf("PublishVM: %v", err)
				}
			}
		})
	}
	wg.Wait()
	cache := newCache(t, a, member.CacheConfig{})
	if n := cache.Len(); n[records.KindVM] != 40 || n[records.KindAdapter] != 80 || n[records.KindEndpoint] != 160 {
		t.Errorf("cache holds %v; want 40 VMs, 80 adapters, 160 directory entries", n)
	}
}

// TestControlPlaneMembershipBadRecords: the cache reports bad records with
// their keys and skips them, in its first list and from its watch, and
// drops a cached entry whose record turns bad.
func TestControlPlaneMembershipBadRecords(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	st := etcdtest.OpenEmbedded(t)
	setupFabric(t, ctx, st)
	cli := st.Client()
	if _, err := cli.Put(ctx, records.HostKey("garbage"), "{not json"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	reported := map[string]error{}
	cache := newCache(t, st, member.CacheConfig{OnBadRecord: func(e *store.RecordError) {
		mu.Lock()
		reported[e.Key] = e
		mu.Unlock()
	}})
	seen := func(key string, want error) bool {
		mu.Lock()
		defer mu.Unlock()
		return errors.Is(reported[key], want)
	}
	if !seen(records.HostKey("garbage"), store.ErrGarbage) {
		t.Errorf("first list did not report the garbage host: %v", reported)
	}
	// Through the watch: another schema, a record under another's key, a
	// foreign kind, a missing field; and a stray key that is not ours.
	bad := map[string]struct {
		val string
		err error
	}{
		records.HostKey("future"):             {`{"schema":2,"kind":"host","id":"future"}`, store.ErrSchema},
		records.HostKey("impostor"):           {mustEncode(t, hostRec("someone-else", 3, false)), store.ErrForeign},
		records.VMKey("foreign"):              {mustEncode(t, testSwitch), store.ErrForeign},
		records.PortGroupKey("dvportgroup-1"): {`{"schema":1,"kind":"portgroup","key":"dvportgroup-1","name":"x","switch":"dvs1"}`, records.ErrInvalid},
	}
	for k, b := range bad {
		if _, err := cli.Put(ctx, k, b.val); err != nil {
			t.Fatal(err)
		}
	}
	r, err := cli.Put(ctx, records.Prefix+"stray/key", "whatever")
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.WaitRev(ctx, r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	for k, b := range bad {
		if !seen(k, b.err) {
			t.Errorf("watch did not report %s as %v: %v", k, b.err, reported[k])
		}
	}
	if _, ok := reported[records.Prefix+"stray/key"]; ok {
		t.Error("a stray key was reported as a bad record")
	}
	if n := len(cache.BadRecords()); n != len(bad)+1 {
		t.Errorf("BadRecords holds %d; want %d", n, len(bad)+1)
	}
	// A good port group turns bad: the cache drops it rather than serve a
	// stale copy; fixed again, it is back.
	if pg, err := cache.PortGroup(ctx, testPG.Key); err != nil || pg != testPG {
		t.Fatalf("PortGroup = %+v, %v", pg, err)
	}
	r, _ = cli.Put(ctx, records.PortGroupKey(testPG.Key), `{"schema":1,"kind":"portgroup"}`)
	cache.WaitRev(ctx, r.Header.Revision)
	if _, err := cache.PortGroup(ctx, testPG.Key); !errors.Is(err, store.ErrBadRecord) {
		t.Errorf("PortGroup of a record turned bad: %v; want ErrBadRecord", err)
	}
	r, _ = cli.Put(ctx, records.PortGroupKey(testPG.Key), mustEncode(t, testPG))
	cache.WaitRev(ctx, r.Header.Revision)
	if pg, err := cache.PortGroup(ctx, testPG.Key); err != nil || pg != testPG {
		t.Errorf("fixed PortGroup = %+v, %v", pg, err)
	}
	// Lookups still work for everything good.
	if sw, err := cache.Switch(ctx, "dvs1"); err != nil || !reflect.DeepEqual(sw, testSwitch) {
		t.Errorf("Switch = %+v, %v", sw, err)
	}
}

func mustEncode(t *testing.T, r records.Record) string {
	t.Helper()
	b, err := store.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestControlPlaneMembershipCacheMiss: a lookup of something the cache does
// not hold yet goes to etcd.
func TestControlPlaneMembershipCacheMiss(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	srv := etcdtest.Start(t)
	st := etcdtest.Open(t, srv.ClientURL())
	setupFabric(t, ctx, st)
	cache := newCache(t, st, member.CacheConfig{})
	cache.Close() // no watch: only misses can bring new records in
	if _, err := st.Create(ctx, records.HostKey("late"), hostRec("late", 9, true)); err != nil {
		t.Fatal(err)
	}
	hs, err := cache.Host(ctx, "late")
	if err != nil || hs.Host.ID != "late" || hs.Host.State != records.HostDown {
		t.Fatalf("Host(late) = %+v, %v; want it read from etcd, down (no lease)", hs, err)
	}
	if _, err := cache.Host(context.Background(), "never"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Host(never) = %v; want ErrNotFound", err)
	}
}

// TestControlPlaneMembershipNameInUse: a second agent may not register
// under the name of a live host with another host ID; once that host is
// down, it may.
func TestControlPlaneMembershipNameInUse(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	st := etcdtest.OpenEmbedded(t)
	first := hostRec("host-n1", 1, false)
	first.Name = "esx1"
	m, err := member.Register(ctx, st, first, member.Options{TTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	second := hostRec("host-n2", 2, false)
	second.Name = "esx1"
	_, err = member.Register(ctx, st, second, member.Options{TTL: ttl, Logger: quiet})
	if !errors.Is(err, member.ErrHostNameInUse) || !strings.Contains(err.Error(), "host-n1") || !strings.Contains(err.Error(), "--host") {
		t.Fatalf("register a second host named esx1: %v; want ErrHostNameInUse naming host-n1 and what to do", err)
	}
	// The first host restarting under its own ID keeps its name.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m, err = member.Register(ctx, st, first, member.Options{TTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatalf("the first host registers again: %v", err)
	}
	// Down, its name may be taken.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2, err := member.Register(ctx, st, second, member.Options{TTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatalf("register a host named esx1 while the first is down: %v", err)
	}
	m2.Close()
}

// TestControlPlaneMembershipCloseWithoutEtcd: an agent that stops while
// etcd is out of reach does not wait out its lease's TTL to revoke it: the
// lease expires on its own, and Close says so.
func TestControlPlaneMembershipCloseWithoutEtcd(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	srv := etcdtest.Start(t)
	st := etcdtest.Open(t, srv.ClientURL())
	const long = 10 * time.Second
	m, err := member.Register(ctx, st, hostRec("host-c", 1, false), member.Options{TTL: long, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close() // gone: nothing answers at its address
	t0 := time.Now()
	err = m.Close()
	took := time.Since(t0)
	t.Logf("Close with etcd gone: %v after %v", err, took.Round(time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "expires on its own") {
		t.Errorf("Close with etcd gone: %v; want an error saying the lease expires on its own", err)
	}
	if took >= long {
		t.Errorf("Close with etcd gone took %v, the lease's whole TTL", took.Round(time.Millisecond))
	}
}
