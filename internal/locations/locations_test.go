// SPDX-License-Identifier: Apache-2.0

package locations

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestClientSocket checks how a client that is not root finds the agent:
// its own agent's socket when one is there, else the system's when one is
// there, else its own path (for the error message), and always the socket
// VRDMA_SOCKET chose.
func TestClientSocket(t *testing.T) {
	dir := t.TempDir()
	own, system := filepath.Join(dir, "own.sock"), filepath.Join(dir, "system.sock")
	listen := func(p string) {
		ln, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
	}
	check := func(chosen bool, want string) {
		t.Helper()
		if got := clientSocket(own, system, chosen); got != want {
			t.Errorf("clientSocket(chosen %v) = %s, want %s", chosen, got, want)
		}
	}
	check(false, own) // no agent at all
	listen(system)
	check(false, system)
	check(true, own)
	// A plain file is no socket: it does not hide the system's.
	if err := os.WriteFile(own, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	check(false, system)
	os.Remove(own)
	listen(own)
	check(false, own)

	t.Setenv("VRDMA_SOCKET", own)
	if Socket() != own || AgentSocket() != own {
		t.Errorf("with VRDMA_SOCKET=%s: Socket %s, AgentSocket %s", own, Socket(), AgentSocket())
	}
}
