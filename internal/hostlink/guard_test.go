// SPDX-License-Identifier: Apache-2.0

package hostlink_test

import (
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/tcpwire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/testlink"
)

// uplink returns the agent's one uplink (its test link) from its status.
func uplink(t *testing.T, env *testenv.Env) vrdma.UplinkStatus {
	t.Helper()
	st := env.Status(t)
	if len(st.Uplinks) != 1 {
		t.Fatalf("status shows %d uplinks, want the test link only: %+v", len(st.Uplinks), st.Uplinks)
	}
	return st.Uplinks[0]
}

// TestSecurityPanicClosesOneConnection: a handler of a peer's request
// that panics (made to, by the test's frame hook, on the first WRITE to
// one QP) costs the connection that carried the request, not the agent:
// the panic is logged with its stack and counted in the uplink's status,
// exactly one connection is replaced (one more dial), the request is
// retried on the new connection and completes, and the agent's other
// QPs, which shared the connection, keep working.
func TestSecurityPanicClosesOneConnection(t *testing.T) {
	var target atomic.Uint32 // the QPN whose first WRITE panics; 0 before it is known
	var fired atomic.Bool
	restore := hostlink.SetFrameHook(func(_ string, h *tcpwire.Header) {
		if q := target.Load(); q != 0 && h.Type == tcpwire.Write && h.DstQPN == q && fired.CompareAndSwap(false, true) {
			panic("test: a handler bug reached by a peer's request")
		}
	})
	t.Cleanup(restore) // after the agent's own cleanup: it runs last
	env := testenv.StartWith(t, testenv.Options{TestLink: &testlink.Faults{},
		AllowErrors: regexp.MustCompile(`^tcp path: a goroutine serving a peer host's input panicked`)})
	one, two := env.NewPair(t, "one"), env.NewPair(t, "two")
	one.Write(t, 4096, 1)
	two.Write(t, 4096, 2)
	before := uplink(t, env)
	if before.Panics != 0 {
		t.Fatalf("%d panics counted before any was injected", before.Panics)
	}

	target.Store(two.B.Endpoint().QPN)
	two.Write(t, 8192, 3) // panics once in the responder's reader, then retried on a new connection
	if !fired.Load() {
		t.Fatal("the hook never saw the WRITE it was to panic on")
	}
	for i := range 20 {
		one.Write(t, 1000+i, byte(10+i))
		two.Write(t, 2000+i, byte(40+i))
	}

	after := uplink(t, env)
	if after.Panics != 1 {
		t.Errorf("the uplink counts %d panics, want 1", after.Panics)
	}
	if d := after.Dials - before.Dials; d != 1 {
		t.Errorf("%d connections opened after the panic, want exactly 1 (only the connection that carried the request was closed)", d)
	}
	logged := env.ErrorsWith("panicked")
	if len(logged) != 1 || !strings.Contains(logged[0], "test: a handler bug") || !strings.Contains(logged[0], "goroutine=request reader") ||
		!strings.Contains(logged[0], "guard_test.go") {
		t.Errorf("want one logged panic naming the request reader, with the panic's value and its stack; logged:\n%s", strings.Join(logged, "\n"))
	}
}

// TestSecurityPanicInResponseReader: a response reader that panics while
// it holds a READ's response (made to, by the test's frame hook, on the
// first READ response) closes its connection and fails the READ's call,
// which the close cannot find any more: the READ is retried on a new
// connection and completes, instead of its QP waiting forever.
func TestSecurityPanicInResponseReader(t *testing.T) {
	var armed, fired atomic.Bool
	restore := hostlink.SetFrameHook(func(_ string, h *tcpwire.Header) {
		if armed.Load() && h.Type == tcpwire.ReadResp && fired.CompareAndSwap(false, true) {
			panic("test: a bug in reading a READ's response")
		}
	})
	t.Cleanup(restore) // after the agent's own cleanup: it runs last
	env := testenv.StartWith(t, testenv.Options{TestLink: &testlink.Faults{},
		AllowErrors: regexp.MustCompile(`^tcp path: a goroutine serving a peer host's input panicked`)})
	one := env.NewPair(t, "one")
	one.Read(t, 4096, 1)
	armed.Store(true)
	one.Read(t, 8192, 2)
	if !fired.Load() {
		t.Fatal("the hook never saw the READ response it was to panic on")
	}
	one.Read(t, 100, 3)
	one.Write(t, 100, 4)
	if n := uplink(t, env).Panics; n != 1 {
		t.Errorf("the uplink counts %d panics, want 1", n)
	}
	if l := env.ErrorsWith("panicked"); len(l) != 1 || !strings.Contains(l[0], "goroutine=response reader") {
		t.Errorf("want one logged panic of the response reader; logged:\n%s", strings.Join(l, "\n"))
	}
}
