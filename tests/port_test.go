// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"context"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestPortConnectDisconnect drives vrdmactl vm disconnect and connect
// (Agent.ConnectAdapter), vSphere's "Connected" box, against the agent: a
// disconnected adapter's port is PORT_DOWN for every process of its VM
// and the peer's stays PORT_ACTIVE; saying it twice changes nothing; an
// adapter or a VM that is not there is refused; an adapter attached with
// ethernetN.startConnected = FALSE starts down. The data path behind a
// down port is conformance case port-down, on every path.
func TestPortConnectDisconnect(t *testing.T) {
	env := testenv.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a1 := env.Open(t, "vmA", testenv.VMOptions{})
	a2, err := vrdma.Open(ctx, "vmA", vrdma.WithSocket(env.Socket)) // a second process of vmA
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	b := env.Open(t, "vmB", testenv.VMOptions{})
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(env.Socket))
	if err != nil {
		t.Fatal(err)
	}
	defer ag.Close()

	port := func(v *vrdma.VM) string {
		t.Helper()
		p, err := v.Adapters()[0].QueryPort(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p.State
	}
	set := func(vm string, connected, wantChanged bool, wantTold int) {
		t.Helper()
		r, err := ag.ConnectAdapter(ctx, vm, "vrdma0", connected)
		if err != nil {
			t.Fatal(err)
		}
		if r.Changed != wantChanged || r.Connected != connected || r.Workloads != wantTold || r.VM != vm || r.Adapter != "vrdma0" {
			t.Fatalf("connect %s %v: %+v, want changed %v and %d workloads told", vm, connected, r, wantChanged, wantTold)
		}
	}
	for _, v := range []*vrdma.VM{a1, a2, b} {
		if st := port(v); st != "PORT_ACTIVE" {
			t.Fatalf("port before any disconnect: %s", st)
		}
	}
	set("vmA", false, true, 2)
	set("vmA", false, false, 0)
	for _, v := range []*vrdma.VM{a1, a2} {
		if st := port(v); st != "PORT_DOWN" {
			t.Fatalf("a disconnected adapter's port is %s, want PORT_DOWN", st)
		}
	}
	if st := port(b); st != "PORT_ACTIVE" {
		t.Fatalf("another VM's port is %s, want PORT_ACTIVE", st)
	}
	set("vmA", true, true, 2)
	if st := port(a2); st != "PORT_ACTIVE" {
		t.Fatalf("a connected adapter's port is %s, want PORT_ACTIVE", st)
	}

	for _, c := range []struct{ vm, adapter string }{{"vmA", "vrdma3"}, {"nosuch", "vrdma0"}, {"vmA", "eth0"}} {
		if _, err := ag.ConnectAdapter(ctx, c.vm, c.adapter, false); err == nil {
			t.Errorf("disconnected %s of VM %s", c.adapter, c.vm)
		}
	}

	c := env.Open(t, "vmC", testenv.VMOptions{Disconnected: true})
	if st := port(c); st != "PORT_DOWN" {
		t.Fatalf("an adapter with ethernet0.startConnected = FALSE: %s, want PORT_DOWN", st)
	}
	set("vmC", true, true, 1)
}
