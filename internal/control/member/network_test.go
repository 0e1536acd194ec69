// SPDX-License-Identifier: Apache-2.0

package member_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// TestNetworkRegisterKeepsDeclarations: the network state an operator
// declared on an uplink survives its agent registering again with the
// same uplink and no declaration of its own; a new uplink starts with
// none, and an agent's own declaration wins.
func TestNetworkRegisterKeepsDeclarations(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	st := etcdtest.OpenEmbedded(t)
	plain := hostRec("host-d", 1, true)
	plain.Uplinks[0].Declared = records.NICState{}
	m, err := member.Register(ctx, st, plain, member.Options{TTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.UpdateHost(ctx, func(h *records.Host) error { h.Uplinks[0].Declared = lossless(); return nil }); err != nil {
		t.Fatal(err)
	}
	declared := func() records.NICState {
		t.Helper()
		h, _, err := store.Get[records.Host](ctx, st, records.HostKey("host-d"))
		if err != nil || len(h.Uplinks) != 1 {
			t.Fatalf("host-d: %+v, %v", h, err)
		}
		return h.Uplinks[0].Declared
	}
	again := func(h records.Host) {
		t.Helper()
		m.Close()
		if m, err = member.Register(ctx, st, h, member.Options{TTL: ttl, Logger: quiet}); err != nil {
			t.Fatal(err)
		}
	}
	again(plain)
	if d := declared(); d.PFC == nil || !d.PFC.Has(3) || d.Teamed == nil {
		t.Errorf("after registering again: declared %+v; want the operator's", d)
	}
	own := plain
	own.Uplinks = []records.Uplink{plain.Uplinks[0]}
	own.Uplinks[0].Declared = records.NICState{MTU: 1500}
	again(own)
	if d := declared(); d.MTU != 1500 || d.PFC != nil {
		t.Errorf("the agent's own declaration: %+v", d)
	}
	moved := plain
	moved.Uplinks = []records.Uplink{plain.Uplinks[0]}
	moved.Uplinks[0].Device = "eth9"
	again(moved)
	if d := declared(); !d.IsZero() {
		t.Errorf("another uplink kept a declaration: %+v", d)
	}
	m.Close()
}

// TestNetworkCacheDecisionFlips: a cache's decision between two hosts
// goes from rdma to tcp and back as one uplink's PFC declaration changes
// in the control plane.
func TestNetworkCacheDecisionFlips(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	st := etcdtest.OpenEmbedded(t)
	setupFabric(t, ctx, st)
	var ms []*member.Member
	for i, id := range []string{"host-a", "host-b"} {
		m, err := member.Register(ctx, st, hostRec(id, i, true), member.Options{TTL: ttl, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		ms = append(ms, m)
		vm, ads := vmRec("vm-"+id, id, i, 1)
		if err := member.PublishVM(ctx, st, vm, ads); err != nil {
			t.Fatal(err)
		}
	}
	cache := newCache(t, st, member.CacheConfig{})
	setPFC := func(p records.PrioritySet) {
		t.Helper()
		if _, err := ms[1].UpdateHost(ctx, func(h *records.Host) error { h.Uplinks[0].Declared.PFC = &p; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(path pathsel.Path, says string) {
		t.Helper()
		waitFor(t, 5*time.Second, "decision "+string(path)+": "+says, func() bool {
			d, err := cache.Decide(ctx, "vm-host-a/vrdma0", "vm-host-b/vrdma0")
			return err == nil && d.Path == path && strings.Contains(d.Reason, says)
		})
	}
	wait(pathsel.RDMA, "network checks passed")
	setPFC(0)
	wait(pathsel.TCP, "rdma rejected: roce-l2-lossless failed: PFC not enabled for priority 3 on uplink lo of host host-b")
	setPFC(records.PrioritiesOf(3))
	wait(pathsel.RDMA, "network checks passed")
}
