// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
)

// connPair returns a connection over a real loopback socket
// whose far end discards what it gets.
func connPair(t *testing.T) *Conn {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	nc, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	u := &Links{log: slog.New(slog.DiscardHandler), links: map[string]*Peer{}}
	l := &Peer{u: u, peerID: "peer", in: map[*Conn]struct{}{}}
	c := newConn(l, nc, true, 1)
	t.Cleanup(func() { c.Close(nil) })
	return c
}

// TestWithdrawAfterClose: a call the connection already failed (it closed
// between the register and the write of a batch) is withdrawn with its
// signal consumed, so that the call's next attempt, on a new connection,
// is not completed by the stale signal and the previous response.
func TestWithdrawAfterClose(t *testing.T) {
	c := connPair(t)
	k := NewCall(nil)
	if !c.Register(k) {
		t.Fatal("register on an open connection failed")
	}
	c.Close(errors.New("test: the connection is lost"))
	c.Recall(k)
	if n := len(k.Done); n != 0 {
		t.Fatalf("%d stale signal(s) left on the call after it was withdrawn from a closed connection", n)
	}

	c2 := connPair(t)
	if !c2.Register(k) {
		t.Fatal("register on a new connection failed")
	}
	select {
	case <-k.Done:
		t.Fatal("the call is signalled on its new connection before any response")
	default:
	}
	if !c2.Withdraw(k) {
		t.Fatal("withdraw of a call still waiting for its response failed")
	}
}

// TestWaiting: a registered call waits until it is withdrawn or its
// connection takes it (here: closes and fails it); a requester's timeout
// relies on that to tell a response still to come from one arriving.
func TestWaiting(t *testing.T) {
	c := connPair(t)
	k, k2 := NewCall(nil), NewCall(nil)
	if !c.Register(k) || !c.Register(k2) {
		t.Fatal("register on an open connection failed")
	}
	if !c.Waiting(k) || !c.Waiting(k2) {
		t.Fatal("a registered call does not wait")
	}
	c.Withdraw(k)
	if c.Waiting(k) {
		t.Fatal("a withdrawn call still waits")
	}
	c.Close(errors.New("test: the connection is lost"))
	if c.Waiting(k2) {
		t.Fatal("a call its closed connection failed still waits")
	}
	<-k2.Done
}
