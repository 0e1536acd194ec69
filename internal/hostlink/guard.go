// SPDX-License-Identifier: Apache-2.0

package hostlink

// Panic containment. Every goroutine that serves another host's input —
// a connection's reader (serveRequests, readResponses), a CM frame's
// goroutine (cm.go) and an accepted connection's handshake (links.go) —
// defers one of the guards below. A panic there is a bug reached by
// remote input; it must cost the connection that carried the input, not
// the agent: the guard logs the panic with its stack, counts it (the
// peer's UplinkStatus.Panics, or PVRDMAStatus.HandshakePanics before the
// peer is known) and closes the connection. The requesters whose calls
// it failed retry on a new connection, as after any lost connection.
// What the panicking handler held it must let go of on its way out, in a
// deferred call: the tcp path's responder does (its unwind releases the
// target's memory and the connection's write side).

import (
	"fmt"
	"net"
	"runtime"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// testHookFrame, if set, is called by a connection's request reader with
// each frame's header before the frame is handled, by its response
// reader with each response's once it has taken the response's call, and
// by an accepted connection's handshake with its first frame's. Only
// tests set it (export_test.go), to make a reader panic.
var testHookFrame func(c *Conn, h *tcpwire.Header)

// stack returns the calling goroutine's stack, up to 8 KiB, for the log.
func stack() string {
	buf := make([]byte, 8192)
	return string(buf[:runtime.Stack(buf, false)])
}

// guard, deferred by a goroutine that serves c's input (role names it),
// turns a panic into c's close: logged with its stack, counted against
// the peer.
func (c *Conn) guard(role string) {
	r := recover()
	if r == nil {
		return
	}
	c.l.panics.Add(1)
	c.l.u.log.Error("tcp path: a goroutine serving a peer host's input panicked (a bug); its connection is closed, the agent goes on",
		"peer", c.l.peerID, "goroutine", role, "panic", r, "stack", stack())
	c.Close(fmt.Errorf("internal error: the %s panicked: %v", role, r))
}

// guardHandshake, deferred by the goroutine that runs an accepted
// connection's handshake (the peer not known yet), turns a panic into
// nc's close: logged with its stack, counted in the links'
// HandshakePanics.
func (u *Links) guardHandshake(nc net.Conn) {
	r := recover()
	if r == nil {
		return
	}
	u.hsPanics.Add(1)
	u.log.Error("tcp path: the handshake of an accepted connection panicked (a bug); the connection is closed, the agent goes on",
		"from", nc.RemoteAddr().String(), "panic", r, "stack", stack())
	nc.Close()
}
