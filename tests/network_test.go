// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestNetworkObservedByAgent checks that an agent publishes what its
// kernel reports of its RDMA uplink's NIC in the host record
// (records.Uplink.Observed), which path selection on every host reads:
// the MTU of the interface that holds the uplink's address, and, for a
// NIC without DCB (a veth, or loopback without root), PFC unknown with the
// kernel's answer; and that a running agent publishes a change (the MTU
// set on its interface) within its --nic-poll.
func TestNetworkObservedByAgent(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 1, RDMA: true, MTU: 9000,
		ExtraArgs: func(*testenv.Host) []string { return []string{"--nic-poll", "100ms"} }})
	h := c.Hosts[0]
	observed := func() records.NICState {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rec, _, err := store.Get[records.Host](ctx, c.Store(), records.HostKey(h.ID()))
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Uplinks) != 1 {
			t.Fatalf("host record has %d uplinks, want 1: %+v", len(rec.Uplinks), rec.Uplinks)
		}
		return rec.Uplinks[0].Observed
	}
	want := 65536 // loopback
	if c.Netns {
		want = 9000 // the host's veth
	}
	o := observed()
	if o.MTU != want {
		t.Errorf("observed MTU %d, want %d: %+v", o.MTU, want, o)
	}
	if o.PFC != nil || o.Unknown[records.FieldPFC] == "" {
		t.Errorf("observed PFC %v (why unknown: %q), want unknown with the kernel's answer: a veth or loopback has no DCB", o.PFC, o.Unknown[records.FieldPFC])
	}
	if !c.Netns {
		return
	}
	if out, err := exec.Command("ip", "-n", h.Netns, "link", "set", "eth0", "mtu", "4000").CombinedOutput(); err != nil {
		t.Fatalf("ip link set mtu: %v: %s", err, out)
	}
	for deadline := time.Now().Add(10 * time.Second); observed().MTU != 4000; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not publish its uplink's new MTU 4000: observed %+v", observed())
		}
	}
}
