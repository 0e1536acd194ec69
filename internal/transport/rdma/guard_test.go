// SPDX-License-Identifier: Apache-2.0

package rdma_test

import (
	"net/netip"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/transport/rdma"
)

// engineStatus returns the in-process agent's one RDMA engine's status.
func engineStatus(t *testing.T, env *testenv.Env) vrdma.RDMAStatus {
	t.Helper()
	st := env.Status(t)
	if len(st.RDMA) != 1 {
		t.Fatalf("status shows %d RDMA engines, want the loop's only: %+v", len(st.RDMA), st.RDMA)
	}
	return st.RDMA[0]
}

// TestSecurityPanicDropsOnePacket: serving a packet that panics (made to,
// by the test's packet hook, on the first WRITE request to one QP) costs
// that packet, not the engine's reader nor the agent: the panic is logged
// with its stack and counted, the requester sends the packet again after
// its timeout and the WRITE completes, and the other QPs the reader
// serves keep working.
func TestSecurityPanicDropsOnePacket(t *testing.T) {
	var target atomic.Uint32 // the QPN whose first WRITE panics; 0 before it is known
	var fired atomic.Bool
	restore := rdma.SetPacketHook(func(pkt *rocewire.Packet) {
		if q := target.Load(); q != 0 && pkt.BTH.Opcode() == rocewire.RDMAWriteOnly && pkt.BTH.DestQP() == q && fired.CompareAndSwap(false, true) {
			panic("test: a responder bug reached by a packet")
		}
	})
	t.Cleanup(restore) // after the agent's own cleanup: it runs last
	env := testenv.StartWith(t, testenv.Options{RDMALoop: netip.MustParseAddrPort("127.0.33.9:4791"),
		AllowErrors: regexp.MustCompile(`^rdma uplink: serving a packet panicked`)})
	one, two := env.NewPair(t, "one"), env.NewPair(t, "two")
	one.Write(t, 256, 1)
	two.Write(t, 256, 2)
	if n := engineStatus(t, env).Panics; n != 0 {
		t.Fatalf("%d panics counted before any was injected", n)
	}

	target.Store(two.B.Endpoint().QPN)
	two.Write(t, 512, 3) // its packet panics once, then is sent again
	if !fired.Load() {
		t.Fatal("the hook never saw the WRITE it was to panic on")
	}
	for i := range 20 {
		one.Write(t, 100+i, byte(10+i))
		two.Write(t, 200+i, byte(40+i))
	}
	if n := engineStatus(t, env).Panics; n != 1 {
		t.Errorf("the engine counts %d panics, want 1", n)
	}
	logged := env.ErrorsWith("panicked")
	if len(logged) != 1 || !strings.Contains(logged[0], "test: a responder bug") || !strings.Contains(logged[0], "guard_test.go") {
		t.Errorf("want one logged panic with the panic's value and its stack; logged:\n%s", strings.Join(logged, "\n"))
	}
}
