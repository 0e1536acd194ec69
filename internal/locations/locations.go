// SPDX-License-Identifier: Apache-2.0

// Package locations holds the default file locations shared by the agent,
// the client library and the CLI: the agent's Unix socket and its state
// directory.
package locations

import (
	"fmt"
	"os"
	"path/filepath"
)

// SystemSocket is the socket of the agent the system runs (as root, under
// systemd: contrib/vrdmad.service).
const SystemSocket = "/run/vrdma/vrdmad.sock"

// AgentSocket returns the socket an agent serves by default:
// $VRDMA_SOCKET if set; SystemSocket for root;
// $XDG_RUNTIME_DIR/vrdma/vrdmad.sock or /tmp/vrdma-UID/vrdmad.sock
// otherwise (the user's own agent).
func AgentSocket() string {
	if s := os.Getenv("VRDMA_SOCKET"); s != "" {
		return s
	}
	if os.Geteuid() == 0 {
		return SystemSocket
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "vrdma", "vrdmad.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("vrdma-%d", os.Getuid()), "vrdmad.sock")
}

// Socket returns the socket a client (a workload, vrdmactl) finds the
// agent at by default: AgentSocket, unless that is the user's own socket
// and none exists there while SystemSocket does, so that a user without
// an agent of their own uses the system's. The C library
// (guest/ibverbs/session.c) looks the socket up the same way.
func Socket() string {
	return clientSocket(AgentSocket(), SystemSocket, os.Getenv("VRDMA_SOCKET") != "")
}

// clientSocket returns own, the socket a client would use by default,
// unless it was not chosen (by VRDMA_SOCKET) and no socket exists there
// while one exists at system.
func clientSocket(own, system string, chosen bool) string {
	if own == system || chosen || isSocket(own) || !isSocket(system) {
		return own
	}
	return system
}

func isSocket(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&os.ModeSocket != 0
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
