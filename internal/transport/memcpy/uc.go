// SPDX-License-Identifier: Apache-2.0

package memcpy

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// sendUC delivers w of a UC QP once (device/uc.go): whatever the
// responder did with it — executed it, or dropped it (no receive posted,
// a bad rkey, a peer not ready or gone) — the work request completes
// with success, as a UC send completes once it has left; nothing is
// retried.
func (m *path) sendUC(w *abi.SendWQE, segs [][]byte, total uint64) (abi.WCStatus, uint32) {
	r := m.deliver(w, segs, total)
	if r.Out == device.OutDone && r.Status == abi.WCSuccess {
		m.q.NoteSent(total)
	}
	return abi.WCSuccess, uint32(total)
}
