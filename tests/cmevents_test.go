// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/testenv"
)

// cmPair is a dialing and a listening VM, with an event channel each.
type cmPair struct {
	a, b       *vrdma.VM
	cha, chb   *vrdma.EventChannel
	addrB      string // b's vrdma0 address
	sameHost   bool
	closeDialr func() // ends a's session
}

func openChannel(t *testing.T, ctx context.Context, v *vrdma.VM) *vrdma.EventChannel {
	t.Helper()
	ch, err := v.OpenEventChannel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close(context.Background()) })
	return ch
}

// nextEvent returns the channel's next event, which must be of type want.
func nextEvent(t *testing.T, ctx context.Context, ch *vrdma.EventChannel, want vrdma.CMEventType) *vrdma.CMEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	e, err := ch.Next(ctx)
	if err != nil {
		t.Fatalf("waiting for %s: %v", want, err)
	}
	if e.Type != want {
		t.Fatalf("event %s (status %d: %s), want %s", e.Type, e.Status, e.Message, want)
	}
	return e
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i)
	}
	return b
}

// TestCMEventsMemcpy runs the event channel cases between two VMs of one
// host (the memcpy path).
func TestCMEventsMemcpy(t *testing.T) {
	env := testenv.Start(t)
	ctx := opCtx(t)
	a := env.Open(t, "cma", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.8.0.1"}})
	b := env.Open(t, "cmb", testenv.VMOptions{MemMB: 8, IPv4: []string{"10.8.0.2"}})
	p := &cmPair{a: a, b: b, cha: openChannel(t, ctx, a), chb: openChannel(t, ctx, b), addrB: "10.8.0.2", sameHost: true}
	cmEventCases(t, ctx, p)
}

// TestCMEventsTCP runs the event channel cases between VMs of two hosts
// (the tcp path), with addresses assigned from the port group's subnet.
func TestCMEventsTCP(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Subnet: "10.78.0.0/24"})
	ctx := opCtx(t)
	a := c.Hosts[0].Open(t, "cmta", testenv.VMOptions{MemMB: 8})
	b := c.Hosts[1].Open(t, "cmtb", testenv.VMOptions{MemMB: 8})
	p := &cmPair{a: a, b: b, cha: openChannel(t, ctx, a), chb: openChannel(t, ctx, b), addrB: b.Adapters()[0].IPv4().String()}
	cmEventCases(t, ctx, p)
}

func cmEventCases(t *testing.T, ctx context.Context, p *cmPair) {
	sa, sb := lcNewSide(t, ctx, p.a), lcNewSide(t, ctx, p.b)
	l, err := p.chb.Listen(ctx, "", 5000) // every adapter: 0.0.0.0
	if err != nil {
		t.Fatal(err)
	}

	t.Run("resolve", func(t *testing.T) {
		c, err := p.cha.Resolve(ctx, p.addrB, "")
		if err != nil {
			t.Fatal(err)
		}
		e := nextEvent(t, ctx, p.cha, vrdma.CMAddrResolved)
		if e.Cookie != c || e.Adapter != "vrdma0" || e.RemoteVM != p.b.Name() || e.RemoteGID != p.b.Adapters()[0].GID() {
			t.Fatalf("ADDR_RESOLVED %+v, want cookie %d, adapter vrdma0, remote %s with its GID", e, c, p.b.Name())
		}
		if _, err := p.cha.Resolve(ctx, "10.254.254.254", ""); err != nil {
			t.Fatal(err)
		}
		e = nextEvent(t, ctx, p.cha, vrdma.CMAddrError)
		if e.Status != -int(syscall.EHOSTUNREACH) || !strings.Contains(e.Message, "10.254.254.254") {
			t.Fatalf("ADDR_ERROR for an address nobody has: status %d, %q; want -EHOSTUNREACH naming the address", e.Status, e.Message)
		}
	})

	t.Run("private data, established, disconnect", func(t *testing.T) {
		req, rep := pattern(vrdma.MaxPrivateDataConnect, 1), pattern(vrdma.MaxPrivateDataAccept, 100)
		c, err := p.cha.Connect(ctx, sa.qp, p.addrB, 5000, req, 0)
		if err != nil {
			t.Fatal(err)
		}
		e := nextEvent(t, ctx, p.chb, vrdma.CMConnectRequest)
		if !bytes.Equal(e.PrivateData, req) || e.Cookie != l.Cookie || e.RemoteVM != p.a.Name() || e.RemoteQPN != sa.qp.QPN() || e.Port != 5000 {
			t.Fatalf("CONNECT_REQUEST %+v: want the dialer's 56 bytes of private data, the listen's cookie and the dialer", e)
		}
		if err := e.Accept(ctx, sb.qp, rep); err != nil {
			t.Fatal(err)
		}
		eb := nextEvent(t, ctx, p.chb, vrdma.CMEstablished)
		if eb.QP != sb.qp || eb.RemoteQPN != sa.qp.QPN() {
			t.Fatalf("acceptor's ESTABLISHED %+v: want its QP, facing 0x%x", eb, sa.qp.QPN())
		}
		ea := nextEvent(t, ctx, p.cha, vrdma.CMEstablished)
		if ea.Cookie != c || ea.QP != sa.qp || !bytes.Equal(ea.PrivateData, rep) || ea.RemoteQPN != sb.qp.QPN() {
			t.Fatalf("dialer's ESTABLISHED %+v: want cookie %d, its QP and the acceptor's 196 bytes of private data", ea, c)
		}
		if err := lcRoundTrip(ctx, sa, sb, 1); err != nil {
			t.Fatal(err)
		}
		if err := sa.qp.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
		for _, x := range []struct {
			ch *vrdma.EventChannel
			qp *vrdma.QP
		}{{p.cha, sa.qp}, {p.chb, sb.qp}} {
			if e := nextEvent(t, ctx, x.ch, vrdma.CMDisconnected); e.QP != x.qp {
				t.Fatalf("DISCONNECTED for QP %v, want %v", e.QP, x.qp)
			}
			nextEvent(t, ctx, x.ch, vrdma.CMTimewaitExit)
		}
		if qi, err := sa.qp.Query(ctx); err != nil || qi.Attr.State != vrdma.QPSErr {
			t.Fatalf("dialer's QP after disconnect: %+v, %v; want ERR", qi.Attr.State, err)
		}
		if err := sb.qp.Disconnect(ctx); err != nil { // after DISCONNECTED: no new event
			t.Fatalf("disconnect of the side that was disconnected: %v", err)
		}
		if err := sb.qp.Disconnect(ctx); err == nil {
			t.Fatal("a second disconnect succeeded; want bad-state (not connected)")
		}
	})

	t.Run("consumer reject", func(t *testing.T) {
		q := sa.newQP(t, ctx)
		c, err := p.cha.Connect(ctx, q, p.addrB, 5000, []byte("hello"), 0)
		if err != nil {
			t.Fatal(err)
		}
		e := nextEvent(t, ctx, p.chb, vrdma.CMConnectRequest)
		rej := pattern(vrdma.MaxPrivateDataReject, 7)
		if err := e.Reject(ctx, rej); err != nil {
			t.Fatal(err)
		}
		r := nextEvent(t, ctx, p.cha, vrdma.CMRejected)
		if r.Cookie != c || r.Status != vrdma.RejectConsumer || !bytes.Equal(r.PrivateData, rej) {
			t.Fatalf("REJECTED %+v: want cookie %d, reason 28 (consumer) and the 148 bytes of private data", r, c)
		}
	})

	t.Run("no listener", func(t *testing.T) {
		q := sa.newQP(t, ctx)
		if _, err := p.cha.Connect(ctx, q, p.addrB, 5999, nil, 0); err != nil {
			t.Fatal(err)
		}
		r := nextEvent(t, ctx, p.cha, vrdma.CMRejected)
		if r.Status != vrdma.RejectNoListener || !strings.Contains(r.Message, "5999") {
			t.Fatalf("REJECTED %+v: want reason 8 (invalid service ID) naming port 5999", r)
		}
	})

	t.Run("oversized private data", func(t *testing.T) {
		q := sa.newQP(t, ctx)
		_, err := p.cha.Connect(ctx, q, p.addrB, 5000, make([]byte, vrdma.MaxPrivateDataConnect+1), 0)
		wantInvalid(t, "connect with 57 bytes", err)
		if _, err := p.cha.Connect(ctx, q, p.addrB, 5000, nil, 0); err != nil {
			t.Fatal(err)
		}
		e := nextEvent(t, ctx, p.chb, vrdma.CMConnectRequest)
		wantInvalid(t, "accept with 197 bytes", e.Accept(ctx, sb.newQP(t, ctx), make([]byte, vrdma.MaxPrivateDataAccept+1)))
		wantInvalid(t, "reject with 149 bytes", e.Reject(ctx, make([]byte, vrdma.MaxPrivateDataReject+1)))
		if err := e.Reject(ctx, nil); err != nil {
			t.Fatal(err)
		}
		nextEvent(t, ctx, p.cha, vrdma.CMRejected)
	})

	t.Run("timeout, then the listener serves on", func(t *testing.T) {
		q := sa.newQP(t, ctx)
		if _, err := p.cha.Connect(ctx, q, p.addrB, 5000, nil, 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		stale := nextEvent(t, ctx, p.chb, vrdma.CMConnectRequest) // nobody answers it
		r := nextEvent(t, ctx, p.cha, vrdma.CMUnreachable)
		if r.Status != -int(syscall.ETIMEDOUT) {
			t.Fatalf("UNREACHABLE status %d (%s), want -ETIMEDOUT", r.Status, r.Message)
		}
		if err := stale.Accept(ctx, sb.newQP(t, ctx), nil); err == nil {
			t.Fatal("accepted a request whose dialer timed out")
		}
		// The listener is not hung: the next dialer connects.
		q2, qb := sa.newQP(t, ctx), sb.newQP(t, ctx)
		if _, err := p.cha.Connect(ctx, q2, p.addrB, 5000, nil, 0); err != nil {
			t.Fatal(err)
		}
		if err := nextEvent(t, ctx, p.chb, vrdma.CMConnectRequest).Accept(ctx, qb, nil); err != nil {
			t.Fatal(err)
		}
		nextEvent(t, ctx, p.chb, vrdma.CMEstablished)
		nextEvent(t, ctx, p.cha, vrdma.CMEstablished)
		// The dialer's workload goes away: the acceptor gets DISCONNECTED.
		if err := p.a.Close(); err != nil {
			t.Fatal(err)
		}
		if e := nextEvent(t, ctx, p.chb, vrdma.CMDisconnected); e.QP != qb {
			t.Fatalf("DISCONNECTED for %v, want the acceptor's QP", e.QP)
		}
		nextEvent(t, ctx, p.chb, vrdma.CMTimewaitExit)
	})
}

func wantInvalid(t *testing.T, what string, err error) {
	t.Helper()
	var ve *vrdma.Error
	if !errors.As(err, &ve) || ve.Code != "invalid-argument" || ve.Field != "private_data" {
		t.Fatalf("%s: %v, want invalid-argument (field private_data)", what, err)
	}
}
