// SPDX-License-Identifier: Apache-2.0

package member_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// leaderIndex asks every running member for its status and returns the
// index of the one that says it leads.
func leaderIndex(t *testing.T, ctx context.Context, cl *etcdtest.Cluster, cli *clientv3.Client) int {
	t.Helper()
	var idx int
	waitFor(t, 15*time.Second, "a leader", func() bool {
		for i, ep := range cl.Endpoints() {
			if cl.Member(i) == nil {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := cli.Status(sctx, ep)
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				idx = i
				return true
			}
		}
		return false
	})
	return idx
}

// retrying runs fn until it succeeds, each attempt bounded to 2 s, as a
// client does while its cluster elects a leader.
func retrying(t *testing.T, ctx context.Context, fn func(ctx context.Context) error) {
	t.Helper()
	var err error
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = fn(actx)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("still failing: %v", err)
}

// publishRetrying publishes a VM until it succeeds. PublishVM is
// idempotent, so an attempt whose outcome was lost with the leader is
// simply made again.
func publishRetrying(t *testing.T, ctx context.Context, st *store.Store, vm records.VM, ads []records.Adapter) {
	t.Helper()
	retrying(t, ctx, func(ctx context.Context) error { return member.PublishVM(ctx, st, vm, ads) })
}

// TestControlPlaneFailover runs a three-member etcd cluster (three
// embedded members on 127.0.0.1, each with its own data directory and
// ports), stops its leader in the middle of a stream of writes, and
// checks that writes through a client that knows every endpoint go on
// after the re-election, that an agent's cache and lease survive, that
// nothing written before or after is lost, and that a cache whose only
// member was down while history was compacted lists again and converges.
func TestControlPlaneFailover(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	cl := etcdtest.StartCluster(t, 3)
	eps := cl.Endpoints()
	writer := etcdtest.Open(t, eps...)
	setupFabric(t, ctx, writer)

	agent := etcdtest.Open(t, eps...)
	m, err := member.Register(ctx, agent, hostRec("host-a", 1, true), member.Options{TTL: 5 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cache := newCache(t, agent, member.CacheConfig{})

	const before, after = 30, 30
	vm := func(i int) (records.VM, []records.Adapter) { return vmRec(fmt.Sprintf("vm%03d", i), "host-a", i, 1) }
	for i := range before {
		v, a := vm(i)
		publishRetrying(t, ctx, writer, v, a)
	}

	leader := leaderIndex(t, ctx, cl, writer.Client())
	t.Logf("killing leader m%d", leader)
	stopped := time.Now()
	cl.Kill(leader)
	t.Logf("kill took %v", time.Since(stopped))
	var firstWrite time.Duration
	for i := before; i < before+after; i++ {
		v, a := vm(i)
		publishRetrying(t, ctx, writer, v, a)
		if i == before {
			firstWrite = time.Since(stopped)
		}
	}
	t.Logf("first write after the leader died took %v; %d writes done in %v", firstWrite, after, time.Since(stopped))
	newLeader := leaderIndex(t, ctx, cl, writer.Client())
	if newLeader == leader {
		t.Fatalf("m%d still leads after it was stopped", leader)
	}

	// The agent's cache converges on everything, through its watch.
	resp, err := writer.Client().Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	if err := cache.WaitRev(wctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	cancel()
	if n := cache.Len(); n[records.KindVM] != before+after || n[records.KindEndpoint] != 2*(before+after) {
		t.Errorf("cache holds %v; want %d VMs and %d directory entries", n, before+after, 2*(before+after))
	}
	if s := hostState(cache, "host-a"); s != records.HostUp {
		t.Errorf("host-a is %s after the failover; its lease should have survived", s)
	}

	// Nothing is lost: a fresh client reads every record back, whole.
	fresh := etcdtest.Open(t, eps...)
	vms, _, bad, err := store.List[records.VM](ctx, fresh, records.VMPrefix)
	if err != nil || len(bad) != 0 {
		t.Fatal(err, bad)
	}
	if len(vms) != before+after {
		t.Fatalf("%d VMs in the store; want %d", len(vms), before+after)
	}
	for i, it := range vms {
		want, ads := vm(i)
		want.Adapters = []string{"vrdma0"}
		if it.Value.Name != want.Name || it.Value.VMX != want.VMX || it.Value.Adapters[0] != want.Adapters[0] {
			t.Errorf("VM %d reads back as %+v", i, it.Value)
		}
		e, _, err := store.Get[records.Endpoint](ctx, fresh, records.EndpointGIDKey(ads[0].GID))
		if err != nil || e.Name() != want.Name+"/vrdma0" {
			t.Errorf("directory entry of %s: %+v, %v", want.Name, e, err)
		}
	}

	// The old leader comes back and catches up.
	cl.Restart(leader)
	only := etcdtest.Open(t, eps[leader])
	waitFor(t, 15*time.Second, "restarted member has every VM", func() bool {
		r, err := only.Client().Get(ctx, records.VMPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())
		return err == nil && r.Count == before+after
	})

	// A cache that reaches the cluster through one member only. That
	// member stops; meanwhile VMs come and go and history is compacted;
	// when the member returns, the cache's watch finds its revision
	// compacted, lists again and converges — deletions included.
	follower := (newLeader + 1) % 3
	if follower == leader {
		follower = (follower + 1) % 3
	}
	narrow := etcdtest.Open(t, eps[follower])
	c2 := newCache(t, narrow, member.CacheConfig{})
	cl.Kill(follower)
	// A write in flight on a connection that was just reset fails with
	// ErrUnavailable and an unknown outcome: try again. (A RemoveVM that
	// did apply reports ErrNotFound the second time.)
	for i := range 10 {
		v, _ := vm(i)
		retrying(t, ctx, func(ctx context.Context) error {
			err := member.RemoveVM(ctx, writer, v.Name)
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		})
	}
	v, a := vm(1000)
	publishRetrying(t, ctx, writer, v, a)
	var compactRev int64
	retrying(t, ctx, func(ctx context.Context) error {
		resp, err := writer.Client().Get(ctx, "x")
		if err != nil {
			return err
		}
		compactRev = resp.Header.Revision
		_, err = writer.Client().Compact(ctx, compactRev)
		return err
	})
	cl.Restart(follower)
	wctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c2.WaitRev(wctx, compactRev); err != nil {
		t.Fatal(err)
	}
	if n := c2.Len(); n[records.KindVM] != before+after-10+1 {
		t.Errorf("re-listed cache holds %d VMs; want %d", n[records.KindVM], before+after-10+1)
	}
	if _, err := c2.VM(ctx, "vm000"); err == nil {
		t.Error("re-listed cache still holds a deleted VM")
	}
	if _, err := c2.Resolve(ctx, "vm1000/vrdma0"); err != nil {
		t.Errorf("re-listed cache misses a new VM: %v", err)
	}
}
