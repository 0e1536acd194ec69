// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestSoakTCPWireFaults runs vrdmactl soak's tcp rounds under 5 % loss,
// 1 % reordering and 1 % delay between the two hosts for 20 s: each fault
// strikes frames, the ledger balances and nothing leaks. Under
// that loss the requester's host closes its connection and dials again
// when a segment is lost twice; the close's RST may be lost too, and the
// accepting host then kept the dead connection (a descriptor and a
// reader) until TCP keepalive gave up on it, minutes later — the leak
// this test found.
func TestSoakTCPWireFaults(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the wire faults are nftables rules and a relay on lo")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	faults := []string{"loss-5%", "reorder-1%", "delay-1%"}
	rep := runSoak(ctx, io.Discard, 20*time.Second, soakFilter{paths: []string{"tcp"}, faults: faults})
	var b strings.Builder
	printSoak(&b, rep)
	if !rep.OK || rep.ByStatus["SUCCESS"] == 0 {
		t.Errorf("soak under wire faults on tcp:\n%s", b.String())
	}
	for _, f := range faults {
		if rep.Faults[f] == 0 || rep.Struck[f] == 0 {
			t.Errorf("fault %s: injected in %d rounds, struck %d frames; want both above 0", f, rep.Faults[f], rep.Struck[f])
		}
	}
	t.Logf("%s", b.String())
}
