// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// The memcpy-direct ops (wire-local.md §4.21).
func init() {
	handlers[abi.OpDirectOpen] = on(func(s *session, v *device.Context, _ *abi.Empty) (any, []int, error) {
		return nil, nil, errDirectOff
	})
	handlers[abi.OpDirectMap] = on(func(s *session, v *device.Context, _ *abi.DirectMap) (any, []int, error) {
		return nil, nil, errDirectOff
	})
	handlers[abi.OpCQNotify] = on(func(s *session, v *device.Context, _ *abi.Handle) (any, []int, error) {
		return nil, nil, errDirectOff
	})
}

var errDirectOff = abi.Errorf(abi.CodeUnavailable, "", "this agent does not serve the memcpy-direct path (capability memcpy-direct)")
