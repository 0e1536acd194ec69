// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
)

// TestSecurityAdmissionAtAccept drives admission at accept against a real
// etcd: a member's address is admitted up to 4 handshakes at once and 64
// in all; an address of a host on another switch, of this host, or of no
// host is refused after one fresh read of the host records, and at once
// while that read is fresh; a host the cache has not seen yet but etcd
// has is admitted by that read; with etcd out of reach, the cache's
// members are still admitted and unknown addresses refused (fail closed).
func TestSecurityAdmissionAtAccept(t *testing.T) {
	e := etcdtest.Start(t)
	st := etcdtest.Open(t, e.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addHost := func(n int, sw string, addr string) string {
		t.Helper()
		h := records.Host{ID: fmt.Sprintf("%032x", n), Name: fmt.Sprintf("h%d", n), Switch: sw, AgentVersion: "test",
			State: records.HostUp, PVRDMAAddress: netip.AddrPortFrom(netip.MustParseAddr(addr), 4791), FirewallPVRDMA: true}
		if _, err := st.Create(ctx, records.HostKey(h.ID), h); err != nil {
			t.Fatal(err)
		}
		return h.ID
	}
	self := addHost(1, "dvs1", "127.0.3.1")
	addHost(2, "dvs1", "127.0.3.2")
	addHost(3, "dvs2", "127.0.3.3") // another switch
	for i := range 16 {             // 16 more members, for the 64 slots in all
		addHost(100+i, "dvs1", fmt.Sprintf("127.0.4.%d", i+1))
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cache := member.NewCache(st, member.CacheConfig{LookupTimeout: time.Second, Logger: quiet})
	defer cache.Close()
	<-cache.Synced()
	u := &Links{cfg: Config{HostID: self, Store: st, Cache: cache, Switch: "dvs1", LookupTimeout: time.Second}, log: quiet}
	a := netip.MustParseAddr

	// check admits a connection from from, with its fresh read when
	// admit asks for one, and checks the verdict; a connection admitted
	// keeps its slot.
	check := func(from netip.Addr, want int) {
		t.Helper()
		got := u.admit(from)
		if got == admitWait {
			if u.refreshMember(from) {
				got = admitOK
			} else {
				u.release(from)
				got = refuseMember
			}
		}
		if got != want {
			t.Fatalf("a connection from %s: verdict %d, want %d", from, got, want)
		}
	}

	// Per source, then in all: at the defaults, and at limits of
	// --max-handshakes 10 --max-handshakes-per-source 2.
	for _, lim := range [][2]int{{DefaultHandshakes, DefaultHandshakesPerSource}, {10, 2}} {
		u.cfg.Handshakes, u.cfg.HandshakesPerSource = lim[0], lim[1]
		for range lim[1] {
			check(a("127.0.3.2"), admitOK)
		}
		check(a("127.0.3.2"), refuseSource)
		sources := (lim[0] + lim[1] - 1) / lim[1] // 16 at the defaults, 5
		for i := range sources - 1 {
			for range min(lim[1], lim[0]-lim[1]*(i+1)) {
				check(a(fmt.Sprintf("127.0.4.%d", i+1)), admitOK)
			}
		}
		check(a("127.0.4.16"), refuseTotal)
		u.adm.mu.Lock()
		slots, total := maps.Clone(u.adm.slots), u.adm.total
		u.adm.mu.Unlock()
		if len(slots) != sources || total != lim[0] {
			t.Fatalf("limits %d/%d: %d sources hold %d slots, want %d holding %d", lim[0], lim[1], len(slots), total, sources, lim[0])
		}
		for from, n := range slots {
			for range n {
				u.release(from)
			}
		}
		u.adm.mu.Lock()
		if u.adm.total != 0 || len(u.adm.slots) != 0 {
			t.Fatalf("%d slots (%d sources) held once every one was released", u.adm.total, len(u.adm.slots))
		}
		u.adm.mu.Unlock()
	}

	// Not members: after one fresh read, and at once while it is fresh.
	check(a("127.0.3.3"), refuseMember) // another switch: the fresh read
	for _, s := range []string{"127.0.3.1", "127.0.3.3", "127.0.9.9"} {
		if got := u.admit(a(s)); got != refuseMember {
			t.Errorf("a connection from %s (this host, another switch, no host) right after a fresh read: verdict %d, want refused", s, got)
		}
	}

	// A host etcd has and the cache has not (its watch stopped): the next
	// fresh read admits it.
	cache.Close()
	addHost(4, "dvs1", "127.0.3.4")
	u.adm.mu.Lock()
	u.adm.lastRead = time.Now()
	u.adm.mu.Unlock()
	check(a("127.0.3.4"), refuseMember) // within a second of the last read
	time.Sleep(memberRefreshEvery)
	check(a("127.0.3.4"), admitOK)
	u.release(a("127.0.3.4"))

	// etcd out of reach: the cache's members still get in, unknown
	// addresses do not.
	st2 := etcdtest.Open(t, e.ClientURL())
	u.cfg.Store = st2
	st2.Close()
	time.Sleep(memberRefreshEvery)
	check(a("127.0.3.5"), refuseMember)
	check(a("127.0.3.2"), admitOK)
	u.release(a("127.0.3.2"))
	if n := u.adm.refused[refuseMember].Load(); n != 0 {
		t.Errorf("%d refusals counted by admit: only refuseAtAccept counts", n)
	}
}
