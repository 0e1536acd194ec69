// SPDX-License-Identifier: Apache-2.0

package verbsabi

import (
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/testenv"
)

// TestVerbsABICoreVerbs runs guest/ibverbs/tests/coreverbs_check.c:
// solicited-only CQ events, ibv_resize_cq and ibv_rereg_mr through the
// drop-in, with their refusals and errnos.
func TestVerbsABICoreVerbs(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, _ := runC(t, lib, env.Socket, "vm1", "coreverbs_check")
	if n := strings.Count(out, "ok "); n < 21 {
		t.Errorf("only %d checks ran", n)
	}
}

// TestVerbsABICQOverrun runs guest/ibverbs/tests/cqoverrun_check.c: a CQ
// made by ibv_create_cq or ibv_create_cq_ex overruns when a completion
// finds it full, as a device's does (IBV_EVENT_CQ_ERR, its QPs to ERR, the
// sender's next SEND an error), and one made with
// IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN holds the completion back instead.
func TestVerbsABICQOverrun(t *testing.T) {
	lib := Build(t)
	env := testenv.Start(t)
	env.Define(t, "vm1", testenv.VMOptions{MemMB: 8})
	out, _ := runC(t, lib, env.Socket, "vm1", "cqoverrun_check")
	if n := strings.Count(out, "ok "); n != 7 {
		t.Errorf("%d checks passed, want 7", n)
	}
}
