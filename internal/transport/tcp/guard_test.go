// SPDX-License-Identifier: Apache-2.0

package tcp_test

import (
	"context"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/tcpwire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/testlink"
	"github.com/vrdma/vrdma/internal/transport/tcp"
)

// TestSecurityPanicReleasesTarget: a responder that panics while it holds
// its target's memory (made to, by the test's hook, on the first WRITE to
// one QP) lets go of it on its way out: the connection is closed and the
// agent lives (TestSecurityPanicClosesOneConnection), and the target VM's
// deregistration, which waits for every holder of its memory, returns
// instead of waiting forever; the WRITE, retried, completes.
func TestSecurityPanicReleasesTarget(t *testing.T) {
	var target atomic.Uint32 // the QPN whose first WRITE panics; 0 before it is known
	var fired atomic.Bool
	restore := tcp.SetHeldHook(func(h *tcpwire.Header) {
		if q := target.Load(); q != 0 && h.Type == tcpwire.Write && h.DstQPN == q && fired.CompareAndSwap(false, true) {
			panic("test: a responder bug while it holds its target")
		}
	})
	t.Cleanup(restore) // after the agent's own cleanup: it runs last
	env := testenv.StartWith(t, testenv.Options{TestLink: &testlink.Faults{},
		AllowErrors: regexp.MustCompile(`^tcp path: a goroutine serving a peer host's input panicked`)})
	one, two := env.NewPair(t, "one"), env.NewPair(t, "two")
	one.Write(t, 4096, 1)

	target.Store(two.B.Endpoint().QPN)
	two.Write(t, 8192, 3)
	if !fired.Load() {
		t.Fatal("the hook never saw the WRITE it was to panic on")
	}
	one.Write(t, 4096, 4)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := two.Dst.Dereg(ctx); err != nil {
		t.Fatalf("deregistering the target of the request whose responder panicked: %v (its memory is still held)", err)
	}
	if n := len(env.ErrorsWith("goroutine serving a peer host's input panicked")); n != 1 {
		t.Fatalf("%d panics logged, want 1", n)
	}
}
