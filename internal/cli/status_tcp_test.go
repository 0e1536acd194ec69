// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestStatusUplinks checks that status shows a host's tcp uplink to the
// other host, with counters that moved, in text and JSON.
func TestStatusUplinks(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff})
	v1 := c.Hosts[0].Open(t, "su1", testenv.VMOptions{MemMB: 4})
	v2 := c.Hosts[1].Open(t, "su2", testenv.VMOptions{MemMB: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{BufSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	if got := p.Path().Path; got != vrdma.PathTCP {
		t.Fatalf("path %q, want tcp", got)
	}
	if _, err := p.Run(ctx, perf.Config{Test: perf.WriteBW, Size: 65536, Iters: 200}); err != nil {
		t.Fatal(err)
	}
	out := runOK(t, "--socket", c.Hosts[0].Socket, "status")
	line := regexp.MustCompile(`(?m)^` + c.Hosts[1].Name + `\s+` + regexp.QuoteMeta(c.Hosts[1].PVRDMAAddress.String()) + `\s+up\s+(\d+)\s+(\d+)\s+(\d+)`).FindStringSubmatch(out)
	if line == nil || !strings.Contains(out, "UPLINK (tcp) TO") {
		t.Fatalf("status of %s shows no uplink to %s at %s:\n%s", c.Hosts[0].Name, c.Hosts[1].Name, c.Hosts[1].PVRDMAAddress, out)
	}
	a := c.Hosts[0].PVRDMAAddress.String()
	if want := "PVRDMA address " + a + ", listening on " + a + ", firewall rule pvrdma on"; !strings.Contains(out, want) {
		t.Errorf("status of %s does not say %q:\n%s", c.Hosts[0].Name, want, out)
	}
	if n, _ := strconv.ParseUint(line[2], 10, 64); n < 200*65536 {
		t.Errorf("uplink bytes out %d, want at least the 200 × 64 KiB written", n)
	}
	var rep statusReport
	runJSON(t, &rep, "--socket", c.Hosts[0].Socket, "-o", "json", "status")
	if len(rep.Uplinks) != 1 || rep.Uplinks[0].PeerHost != c.Hosts[1].Name || rep.Uplinks[0].BytesOut < 200*65536 || rep.Uplinks[0].Dials == 0 {
		t.Errorf("status -o json uplinks: %+v", rep.Uplinks)
	}
	if p := rep.PVRDMA; p == nil || p.Address != a || p.Listening != a || !p.Firewall {
		t.Errorf("status -o json pvrdma: %+v, want address and listener %s, firewall on", p, a)
	}
}
