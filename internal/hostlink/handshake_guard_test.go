// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// TestSecurityPanicInHandshake: an accepted connection whose handshake
// panics (made to, by the test's frame hook, on its first frame) is
// closed, counted in HandshakePanics and gives its handshake slot back;
// the agent lives.
func TestSecurityPanicInHandshake(t *testing.T) {
	restore := SetFrameHook(func(_ string, h *tcpwire.Header) {
		if h.Type == tcpwire.Hello {
			panic("test: a handshake bug reached by a HELLO")
		}
	})
	defer restore()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	nc, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	u := &Links{log: slog.New(slog.DiscardHandler), links: map[string]*Peer{}}
	var b [tcpwire.HeaderLen]byte
	(&tcpwire.Header{Version: handshakeVersion, Type: tcpwire.Hello}).Put(b[:])
	if _, err := client.Write(b[:]); err != nil {
		t.Fatal(err)
	}
	from := netip.MustParseAddr("127.0.0.1")
	u.adm.mu.Lock()
	u.adm.slots, u.adm.total = map[netip.Addr]int{from: 1}, 1 // the slot the accept loop takes
	u.adm.mu.Unlock()
	c, err := u.handshake(nc, from, false)
	if c != nil || err == nil {
		t.Fatalf("a handshake that panicked returned %v, %v; want an error", c, err)
	}
	if n := u.hsPanics.Load(); n != 1 {
		t.Errorf("%d handshake panics counted, want 1", n)
	}
	u.adm.mu.Lock()
	if n, ns := u.adm.total, len(u.adm.slots); n != 0 || ns != 0 {
		t.Errorf("%d handshake slots held (%d sources) after the handshake ended, want 0", n, ns)
	}
	u.adm.mu.Unlock()
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := client.Read(b[:]); err == nil {
		t.Errorf("the connection whose handshake panicked is still open (read %d bytes)", n)
	}
}
