// SPDX-License-Identifier: Apache-2.0

package tcp

import "github.com/vrdma/vrdma/internal/tcpwire"

// SetHeldHook makes every responder call f with a request's header while
// it holds the request's target, until restore is called; f may panic.
func SetHeldHook(f func(h *tcpwire.Header)) (restore func()) {
	testHookHeld = f
	return func() { testHookHeld = nil }
}
