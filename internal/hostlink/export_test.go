// SPDX-License-Identifier: Apache-2.0

package hostlink

import "github.com/vrdma/vrdma/internal/tcpwire"

// SetFrameHook makes every connection's request reader call f with each
// frame's header (and the peer's host ID) before handling the frame, and
// its response reader with each response's once it has taken its call,
// until restore is called; f may panic.
func SetFrameHook(f func(peer string, h *tcpwire.Header)) (restore func()) {
	testHookFrame = func(c *Conn, h *tcpwire.Header) { f(c.l.peerID, h) }
	return func() { testHookFrame = nil }
}
