// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Addresses, keys and QP numbers (docs/SECURITY.md, "Addresses, keys and
// QP numbers").

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestSecurityAddressTaken checks rule address-unique across hosts: a
// VM on hostA whose configured vrdma0.ipAddress a VM on hostB holds is
// refused at attach — on the port group or on none (an adapter that is
// never published) — and still refused once etcd is out of reach, from
// what hostA's cache knows. And the same-host decision fails closed: a
// VM that attached during the outage, whose address nobody could check,
// takes no connection from a VM of its own host.
func TestSecurityAddressTaken(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2})
	ctx := opCtx(t)
	a, b := c.Hosts[0], c.Hosts[1]
	const held = "10.66.0.5"
	b.Open(t, "sec-held", testenv.VMOptions{MemMB: 8, IPv4: []string{held}})
	peer := a.Open(t, "sec-peer", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.66.0.6"}})
	// Defined while etcd answers (a definition checks names in it).
	taken := testenv.VMOptions{MemMB: 8, IPv4: []string{held}}
	a.DefineVMX(t, "sec-pg", a.VMX(taken))
	a.DefineVMX(t, "sec-nopg", testenv.VMX(taken))
	a.DefineVMX(t, "sec-pg-out", a.VMX(taken))
	a.DefineVMX(t, "sec-nopg-out", testenv.VMX(taken))
	a.DefineVMX(t, "sec-late", a.VMX(testenv.VMOptions{MemMB: 8, IPv4: []string{"10.66.0.9"}}))

	wantTaken := func(name string) {
		t.Helper()
		// A context of its own: with etcd out of reach, each refused
		// attach also waits out the removal of the VM it did not publish.
		v, err := vrdma.Open(opCtx(t), name, vrdma.WithSocket(a.Socket))
		if err == nil {
			v.Close()
			t.Errorf("%s attached on %s with %s, which sec-held/vrdma0 on %s holds", name, a.Name, held, b.Name)
			return
		}
		var ve *vrdma.Error
		if !errors.As(err, &ve) || ve.Code != "already-exists" {
			t.Errorf("%s with a taken address: %v, want already-exists", name, err)
			return
		}
		for _, s := range []string{"rule address-unique", held, "sec-held/vrdma0", b.Name, "choose another address"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s with a taken address: %q does not say %q", name, err, s)
			}
		}
	}
	wantTaken("sec-pg")
	wantTaken("sec-nopg")

	c.StopEtcd()
	wantTaken("sec-pg-out")
	wantTaken("sec-nopg-out")

	// Lookups that etcd does not answer take their timeout (3 s) each.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	// A free address attaches during the outage (it is published once
	// etcd is back), but nobody checked it across the switch: a VM of
	// the same host may not connect to it, neither by address nor out of
	// band by GID.
	late, err := vrdma.Open(ctx, "sec-late", vrdma.WithSocket(a.Socket))
	if err != nil {
		t.Fatalf("sec-late, with a free address, during the outage: %v", err)
	}
	defer late.Close()
	lateSide := lcNewSide(t, ctx, late)
	l, err := late.Adapters()[0].Listen(ctx, 4000)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	go func() {
		if r, err := l.Accept(ctx); err == nil {
			r.Accept(ctx, lateSide.qp) // only without the rule: the connect below must not get here
		}
	}()
	side := lcNewSide(t, ctx, peer)
	err = side.qp.Connect(ctx, "10.66.0.9", 4000)
	if err == nil || !strings.Contains(err.Error(), "rule address-unique") || !strings.Contains(err.Error(), "not in the control plane's directory") {
		t.Errorf("connect by address to a VM whose address was not checked (etcd out of reach): %v, want a refusal by rule address-unique", err)
	}
	p, err := perf.Connect(ctx, peer.Adapters()[0], late.Adapters()[0], perf.PairConfig{MTU: 1024, Port: 4001})
	switch {
	case err == nil:
		t.Errorf("out-of-band connect to a VM whose address was not checked (etcd out of reach): path %+v, want a refusal", p.Path())
		p.Close(ctx)
	case !strings.Contains(err.Error(), "rule address-unique"):
		t.Errorf("out-of-band connect to a VM whose address was not checked: %v, want a refusal by rule address-unique", err)
	}
	// The refused QP is counted by its rule (vrdma_path_refusals_total).
	refused := uint64(0)
	for _, d := range lcAgentStatus(t, ctx, a.Socket).PathDecisions {
		if d.Object == "qp" && d.Path == "" && d.Reason == "address_unique" {
			refused += d.Count
		}
	}
	if refused == 0 {
		t.Errorf("%s counted no QP refused by rule address-unique", a.Name)
	}
}
