// SPDX-License-Identifier: Apache-2.0

package cm

import (
	"errors"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
)

// TestFailure holds a failed connect's event to rdma_cm's: REJECTED with
// the IBTA reason and the REJ's private data, UNREACHABLE with
// -EHOSTUNREACH, -ETIMEDOUT or -EINVAL (docs/wire-local.md §4.12).
func TestFailure(t *testing.T) {
	for _, c := range []struct {
		err    error
		event  int
		status int
	}{
		{Refused(abi.RejectConsumer, []byte{1}, "no"), abi.CMEventRejected, int(abi.RejectConsumer)},
		{abi.Errorf(abi.CodeRefused, "remote", "policy"), abi.CMEventUnreachable, statusUnreachable},
		{abi.Errorf(abi.CodeNotFound, "remote", "nobody"), abi.CMEventUnreachable, statusUnreachable},
		{abi.Errorf(abi.CodeUnavailable, "", "timed out"), abi.CMEventUnreachable, statusTimedOut},
		{abi.Errorf(abi.CodeInvalid, "remote", "bad"), abi.CMEventUnreachable, statusInvalid},
		{errors.New("plain"), abi.CMEventUnreachable, statusUnreachable},
	} {
		ev := failure(c.err)
		if ev.Event != c.event || ev.Status != c.status {
			t.Errorf("failure(%v) = %v status %d, want %v status %d", c.err, ev.Event, ev.Status, c.event, c.status)
		}
	}
	if ev := failure(Refused(abi.RejectConsumer, []byte{1}, "no")); len(ev.PrivateData) != 1 {
		t.Errorf("REJECTED lost the REJ's private data: %v", ev.PrivateData)
	}
}
