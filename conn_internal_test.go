// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/sys"
)

// TestFaultSendAfterAgentDied: a call sent after the agent died, before
// the connection's reader has seen the agent's end close, returns
// ErrAgentGone, as every call after the agent's death must
// (docs/RELIABILITY.md). It returned "send … broken pipe": the fault
// harness's kill-agent case met it (TestFault/memcpy/kill-agent, a
// QP.Modify right after the kill).
func TestFaultSendAfterAgentDied(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "library end")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fds[1]) // the agent's end: the agent died
	// The connection as the library holds it, its reader not run: the
	// window between the agent's death and the reader's seeing it.
	c := &conn{pc: sys.NewPacketConn(nc.(*net.UnixConn)), pending: map[uint32]chan reply{}, done: make(chan struct{})}
	defer c.pc.Close()
	if _, _, err := c.start(abi.OpQueryQP, &abi.Handle{Handle: 1}); !errors.Is(err, ErrAgentGone) {
		t.Fatalf("a call after the agent died: %v, want ErrAgentGone", err)
	}
	if len(c.pending) != 0 {
		t.Errorf("%d calls left pending", len(c.pending))
	}
}
