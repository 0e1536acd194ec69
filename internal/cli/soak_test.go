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

// TestSoakTCPLoss runs vrdmactl soak's tcp rounds under 5 % loss between
// the two hosts for 20 s: the ledger balances and nothing leaks. Under
// that loss the requester's host closes its connection and dials again
// when a response is late; the close's RST may be lost too, and the
// accepting host then kept the dead connection (a descriptor and a
// reader) until TCP keepalive gave up on it, minutes later — the leak
// this test found.
func TestSoakTCPLoss(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the wire faults are nftables rules on lo")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rep := runSoak(ctx, io.Discard, 20*time.Second, soakFilter{paths: []string{"tcp"}, faults: []string{"loss-5%"}})
	var b strings.Builder
	printSoak(&b, rep)
	if !rep.OK || rep.Faults["loss-5%"] == 0 || rep.ByStatus["SUCCESS"] == 0 {
		t.Errorf("soak under 5 %% loss on tcp:\n%s", b.String())
	}
	t.Logf("%s", b.String())
}
