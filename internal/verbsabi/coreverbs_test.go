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
