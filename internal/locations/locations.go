// Package locations holds the default file locations shared by the agent,
// the client library and the CLI: the agent's Unix socket and its state
// directory.
package locations

import (
	"fmt"
	"os"
	"path/filepath"
)

// Socket returns the agent's default socket path: $VRDMA_SOCKET if set;
// /run/vrdma/vrdmad.sock for root; $XDG_RUNTIME_DIR/vrdma/vrdmad.sock or
// /tmp/vrdma-UID/vrdmad.sock otherwise.
func Socket() string {
	if s := os.Getenv("VRDMA_SOCKET"); s != "" {
		return s
	}
	if os.Geteuid() == 0 {
		return "/run/vrdma/vrdmad.sock"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "vrdma", "vrdmad.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("vrdma-%d", os.Getuid()), "vrdmad.sock")
}

// StateDir returns the agent's default state directory: $VRDMA_STATE_DIR
// when set, else /var/lib/vrdma for root, $XDG_STATE_HOME/vrdma or
// ~/.local/state/vrdma otherwise.
func StateDir() string {
	if d := os.Getenv("VRDMA_STATE_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/vrdma"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "vrdma")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "vrdma")
}
