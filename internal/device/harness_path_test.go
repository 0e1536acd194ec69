// SPDX-License-Identifier: Apache-2.0

package device_test

import (
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/transport/memcpy"
)

// The ring harness's QPs move their work requests over the memcpy path,
// which imports this package and so is handed in from here.
func init() { device.SetHarnessPath(memcpy.Bind) }
