// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestVerbsABIODP runs guest/ibverbs/tests/odp_check.c: on-demand regions
// (only the pages that hold data brought into guest memory at
// registration, the rest at first touch by the device or a prefetch),
// ibv_advise_mr and its refusals, and odp_caps in ibv_query_device_ex.
func TestVerbsABIODP(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 16})
	out, _ := runC(t, lib, env.Socket, "vm1", "odp_check")
	if n := strings.Count(out, "ok "); n < 20 {
		t.Errorf("only %d checks ran", n)
	}
}
