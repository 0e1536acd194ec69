// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Host reconfiguration under a running agent (vrdmactl host configure):
// a change of a host's PVRDMA address or pvrdma firewall rule in the
// control plane, as vrdmactl host configure writes it, takes effect on
// that host's agent at once, and QPs across hosts follow.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/testenv"
)

// configureHost changes host h's record as vrdmactl host configure does.
func configureHost(t *testing.T, c *testenv.Cluster, h *testenv.Host, change func(*records.Host)) {
	t.Helper()
	_, _, err := store.Update(t.Context(), c.Store(), records.HostKey(h.ID()), func(old *records.Host) (*records.Host, error) {
		if old == nil {
			return nil, fmt.Errorf("host %s: %w", h.ID(), store.ErrNotFound)
		}
		n := *old
		change(&n)
		return &n, n.Validate()
	})
	if err != nil {
		t.Fatalf("configure %s: %v", h.Name, err)
	}
}

// pvrdmaStatus returns h's agent's view of its end of the tcp path.
func pvrdmaStatus(t *testing.T, h *testenv.Host) mgmt.PVRDMAStatus {
	t.Helper()
	st := agentStatus(t, h)
	if st.PVRDMA == nil {
		t.Fatalf("%s: status has no PVRDMA section", h.Name)
	}
	return *st.PVRDMA
}

// waitPVRDMA waits until h's agent reports a PVRDMA status that ok
// accepts, and returns it.
func waitPVRDMA(t *testing.T, h *testenv.Host, what string, ok func(mgmt.PVRDMAStatus) bool) mgmt.PVRDMAStatus {
	t.Helper()
	t0 := time.Now()
	for {
		s := pvrdmaStatus(t, h)
		if ok(s) {
			t.Logf("%s: %s after %v: %+v", h.Name, what, time.Since(t0).Round(time.Millisecond), s)
			return s
		}
		if time.Since(t0) > waitTimeout {
			t.Fatalf("%s: not %s within %v: %+v", h.Name, what, waitTimeout, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expectRefusedConnect dials addr from h and expects ECONNREFUSED: nothing
// listens there.
func expectRefusedConnect(t *testing.T, h *testenv.Host, addr netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	c, err := h.Dial(ctx, "tcp", addr.String())
	if err == nil {
		c.Close()
		t.Fatalf("%s: %s still accepts connections", h.Name, addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%s: connect to %s: %v, want connection refused", h.Name, addr, err)
	}
}

// TestTCPHostReconfigure changes host B's PVRDMA address and firewall rule
// while a pair between A and B is connected:
//
//   - a new address: B's agent listens there and no more on the old one;
//     the pair's next WRs reconnect to it, both ways, and A's uplink shows
//     the new address and a new dial;
//   - the firewall rule off: B drops its connections; a WR of the pair
//     fails with RETRY_EXC_ERR (A is refused by rule host-rdma-configured),
//     and a new pair is refused naming the rule;
//   - the rule on again: a new pair works;
//   - no address: B's agent stops listening.
func TestTCPHostReconfigure(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2})
	t.Logf("hosts in network namespaces: %v %s", c.Netns, c.NoNetnsReason)
	ha, hb := c.Hosts[0], c.Hosts[1]
	vma := ha.Open(t, "rc1", testenv.VMOptions{MemMB: 16})
	vmb := hb.Open(t, "rc2", testenv.VMOptions{MemMB: 16})
	prm := rcWith(12, 3)
	p := newFaultPair(t, vma, vmb, prm, prm)
	faultTraffic(t, p, 1)
	oldAddr := hb.PVRDMAAddress
	if s := pvrdmaStatus(t, hb); s.Address != oldAddr.String() || s.Listening != oldAddr.String() || !s.Firewall {
		t.Fatalf("%s's PVRDMA status %+v, want address and listener %s, firewall on", hb.Name, s, oldAddr)
	}
	before := uplinkTo(t, ha, hb)

	// A new address: the next free port of B's IP address.
	var newAddr netip.AddrPort
	for port := oldAddr.Port() + 1; ; port++ {
		newAddr = netip.AddrPortFrom(oldAddr.Addr(), port)
		configureHost(t, c, hb, func(h *records.Host) { h.PVRDMAAddress = newAddr })
		s := waitPVRDMA(t, hb, "on the new address", func(s mgmt.PVRDMAStatus) bool {
			return s.Address == newAddr.String() && (s.Listening != "" || s.Error != "")
		})
		if s.Listening == newAddr.String() {
			break
		}
		if !strings.Contains(s.Error, "address already in use") || port > oldAddr.Port()+20 {
			t.Fatalf("%s does not listen on its new PVRDMA address %s: %s", hb.Name, newAddr, s.Error)
		}
	}
	expectRefusedConnect(t, ha, oldAddr)
	faultTraffic(t, p, 2)
	faultTraffic(t, p.reverse(), 3)
	after := uplinkTo(t, ha, hb)
	if after.Address != newAddr.String() || after.Dials <= before.Dials || after.State != "up" {
		t.Errorf("%s's uplink to %s after the address change: %+v; want up at %s with a new dial (%d before)",
			ha.Name, hb.Name, after, newAddr, before.Dials)
	}

	// The firewall rule off: B drops everything and A is refused.
	configureHost(t, c, hb, func(h *records.Host) { h.FirewallPVRDMA = false })
	waitPVRDMA(t, hb, "firewall off", func(s mgmt.PVRDMAStatus) bool { return !s.Firewall })
	for t0 := time.Now(); uplinkTo(t, hb, ha).Conns != 0; time.Sleep(10 * time.Millisecond) {
		if time.Since(t0) > waitTimeout {
			t.Fatalf("%s keeps connections with %s with its firewall rule off: %+v", hb.Name, ha.Name, uplinkTo(t, hb, ha))
		}
	}
	t0 := time.Now()
	postSend(t, p.a.qp, vrdma.SendWR{ID: 40, Opcode: vrdma.OpRDMAWrite, Flags: vrdma.SendSignaled,
		SGL: sgl(p.ma.SGE(0, 64)), RemoteAddr: off(p.mb, 0), RKey: p.mb.RKey()})
	expectFailedWithin(t, p.a, 40, prm, t0, "WRITE to a host whose pvrdma firewall rule is off")
	if u := uplinkTo(t, ha, hb); !strings.Contains(u.LastError, "host-rdma-configured") {
		t.Errorf("%s's uplink to %s: last error %q, want rule host-rdma-configured named", ha.Name, hb.Name, u.LastError)
	}
	a2 := newEnd(t, vma, qpConfig{})
	b2 := newEnd(t, vmb, qpConfig{})
	err := modifyToRTS(opCtx(t), a2.qp, a2.ad, b2.qp.Endpoint(), defaultRC)
	if err == nil || !strings.Contains(err.Error(), "host-rdma-configured") {
		t.Fatalf("connect to a host whose pvrdma firewall rule is off: %v; want a refusal naming rule host-rdma-configured", err)
	}

	// On again: a new pair works.
	configureHost(t, c, hb, func(h *records.Host) { h.FirewallPVRDMA = true })
	waitPVRDMA(t, hb, "firewall on", func(s mgmt.PVRDMAStatus) bool { return s.Firewall })
	p3 := newFaultPair(t, vma, vmb, defaultRC, defaultRC)
	faultTraffic(t, p3, 4)
	faultTraffic(t, p3.reverse(), 5)

	// An address not on the host: the agent says why it does not listen,
	// and listens once the address is there (it tries every 5 s). The
	// namespace's own interface is needed for that (root).
	if c.Netns {
		ip := testenv.ClusterSubnet.Addr().As4()
		ip[3] = 200 // no host holds it
		spare := netip.AddrPortFrom(netip.AddrFrom4(ip), 4791)
		configureHost(t, c, hb, func(h *records.Host) { h.PVRDMAAddress = spare })
		s := waitPVRDMA(t, hb, "failing on an address it does not hold", func(s mgmt.PVRDMAStatus) bool { return s.Error != "" })
		if s.Address != spare.String() || s.Listening != "" || !strings.Contains(s.Error, spare.String()) {
			t.Errorf("%s's PVRDMA status on an address it does not hold: %+v", hb.Name, s)
		}
		if out, err := hb.Exec("ip", "addr", "add", spare.Addr().String()+"/24", "dev", hb.Link); err != nil {
			t.Fatalf("%s: ip addr add: %v\n%s", hb.Name, err, out)
		}
		waitPVRDMA(t, hb, "listening once it holds the address", func(s mgmt.PVRDMAStatus) bool { return s.Listening == spare.String() })
		faultTraffic(t, p3, 6)
		faultTraffic(t, p3.reverse(), 7)
		newAddr = spare
	}

	// No address: no listener.
	configureHost(t, c, hb, func(h *records.Host) { h.PVRDMAAddress = netip.AddrPort{} })
	waitPVRDMA(t, hb, "without a PVRDMA address", func(s mgmt.PVRDMAStatus) bool { return s.Address == "" && s.Listening == "" })
	expectRefusedConnect(t, ha, newAddr)
}
