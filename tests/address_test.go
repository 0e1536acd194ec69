// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestCMAddressConfigured checks adapter addresses from the VMX
// (vrdmaN.ipAddress): the adapter reports the address, its GID is the
// IPv4-mapped form, a peer connects to it by the address and moves data,
// and a second VM of the host with the same address is refused at attach.
func TestCMAddressConfigured(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	v1 := env.Open(t, "addr1", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.9.0.1"}})
	v2 := env.Open(t, "addr2", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.9.0.2"}})
	ad2 := v2.Adapters()[0]
	if got, want := ad2.IPv4(), netip.MustParseAddr("10.9.0.2"); got != want {
		t.Fatalf("addr2/vrdma0: IPv4 %v, want %v", got, want)
	}
	if got, want := netip.AddrFrom16(ad2.GID()), netip.MustParseAddr("::ffff:10.9.0.2"); got != want {
		t.Fatalf("addr2/vrdma0: GID %v, want the IPv4-mapped %v", got, want)
	}
	a, b := lcNewSide(t, ctx, v1), lcNewSide(t, ctx, v2)
	connectByAddress(t, ctx, a, b, "10.9.0.2", 4000)
	if err := lcRoundTrip(ctx, a, b, 1); err != nil {
		t.Fatalf("send over a connection made by IP address: %v", err)
	}

	// The same address on another VM of the host.
	env.Define(t, "addr3", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.9.0.2"}})
	v3, err := vrdma.Open(ctx, "addr3", vrdma.WithSocket(env.Socket))
	if err == nil {
		v3.Close()
		t.Fatal("addr3 attached with addr2's IPv4 address 10.9.0.2")
	}
	var ve *vrdma.Error
	if !errors.As(err, &ve) || ve.Code != "already-exists" || !strings.Contains(err.Error(), "addr2/vrdma0") {
		t.Fatalf("addr3 with a taken address: %v, want already-exists naming addr2/vrdma0", err)
	}

	// An address no adapter has.
	q := b.newQP(t, ctx)
	err = q.Connect(ctx, "10.9.0.99", 4000)
	if err == nil || !strings.Contains(err.Error(), "10.9.0.99") {
		t.Fatalf("connect to 10.9.0.99, which no adapter has: %v, want an error naming it", err)
	}
}

// TestCMAddressAssigned checks addresses the control plane assigns from
// the port group's subnet: every adapter gets a distinct address of the
// subnet, peers on other hosts connect to it by that address, and a VM
// whose VMX asks for an address another host's adapter holds is refused.
func TestCMAddressAssigned(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Subnet: "10.77.0.0/24"})
	ctx := opCtx(t)
	pr := netip.MustParsePrefix("10.77.0.0/24")
	va := c.Hosts[0].Open(t, "assign-a", testenv.VMOptions{MemMB: 8, Adapters: 2})
	vb := c.Hosts[1].Open(t, "assign-b", testenv.VMOptions{MemMB: 8})
	seen := map[netip.Addr]string{}
	for _, v := range []*vrdma.VM{va, vb} {
		for _, ad := range v.Adapters() {
			ip := ad.IPv4()
			name := v.Name() + "/" + ad.Name()
			if !pr.Contains(ip) || ip == pr.Addr() || ip == netip.MustParseAddr("10.77.0.255") {
				t.Fatalf("%s: address %v, want a host address of %v", name, ip, pr)
			}
			if o, dup := seen[ip]; dup {
				t.Fatalf("%s and %s both have %v", o, name, ip)
			}
			seen[ip] = name
			if netip.AddrFrom16(ad.GID()) != netip.AddrFrom16(ip.As16()) {
				t.Fatalf("%s: GID %v is not the IPv4-mapped %v", name, netip.AddrFrom16(ad.GID()), ip)
			}
		}
	}
	a, b := lcNewSide(t, ctx, va), lcNewSide(t, ctx, vb)
	connectByAddress(t, ctx, a, b, vb.Adapters()[0].IPv4().String(), 4001)
	if err := lcRoundTrip(ctx, a, b, 1); err != nil {
		t.Fatalf("send across hosts over a connection made by IP address: %v", err)
	}

	taken := vb.Adapters()[0].IPv4().String()
	h := c.Hosts[0]
	h.DefineVMX(t, "assign-c", h.VMX(testenv.VMOptions{MemMB: 8, IPv4: []string{taken}}))
	vc, err := vrdma.Open(ctx, "assign-c", vrdma.WithSocket(h.Socket))
	if err == nil {
		vc.Close()
		t.Fatalf("assign-c attached with assign-b's address %s", taken)
	}
	if !strings.Contains(err.Error(), "assign-b/vrdma0") {
		t.Fatalf("assign-c with a taken address: %v, want an error naming assign-b/vrdma0", err)
	}
}

// connectByAddress connects a.qp to b.qp: b listens on port and accepts,
// a dials b's adapter by its IP address addr.
func connectByAddress(t *testing.T, ctx context.Context, a, b *lcSide, addr string, port uint16) {
	t.Helper()
	l, err := b.vm.Adapters()[0].Listen(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	acc := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err == nil {
			err = r.Accept(ctx, b.qp)
		}
		acc <- err
	}()
	if err := a.qp.Connect(ctx, addr, port); err != nil {
		t.Fatalf("connect to %s port %d: %v", addr, port, err)
	}
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
}
