// SPDX-License-Identifier: Apache-2.0

package vrdma_test

// Robustness against peers (docs/SECURITY.md,
// "Robustness against peers and packets"): what a member host that floods
// an agent with frames costs it.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/tcpwire"
	"github.com/vrdma/vrdma/internal/testenv"
)

// metricsPort is where TestSecurity… agents serve their metrics, on their
// own loopback addresses.
const metricsPort = 9464

// goroutinesOf reads the go_goroutines gauge of the agent whose metrics
// are at addr.
func goroutinesOf(t *testing.T, addr string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape the agent's metrics at %s: %v", addr, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("go_goroutines %q: %v", v, err)
			}
			return int(n)
		}
	}
	t.Fatalf("the agent's metrics at %s have no go_goroutines", addr)
	return 0
}

// TestSecurityCMDiscFlood: a member host that floods an agent with CM_DISC
// frames, each naming an adapter the control plane does not know (so that
// each costs a lookup in etcd), costs the agent a bounded number of
// goroutines: the agent serves a few per connection at once and reads the
// connection on only as they end. Every frame is still served (none is
// dropped), the connection keeps carrying requests, and a real pair
// between the two hosts keeps working.
func TestSecurityCMDiscFlood(t *testing.T) {
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff,
		ExtraArgs: func(h *testenv.Host) []string {
			return []string{"--metrics-listen", netip.AddrPortFrom(h.Addr(), metricsPort).String()}
		}})
	ha, hb := c.Hosts[0], c.Hosts[1]
	env := &tcpEnv{c: c, prefix: "fl"}
	s := &suite{env: env, how: connCM}
	vms := env.OpenVMs(t, 2)
	va, vb := vms[0], vms[1]
	hostileTraffic(t, s, va, vb) // creates the switch's secret
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sec, _, err := store.Get[records.SwitchSecret](ctx, c.Store(), records.SwitchSecretKey(c.Switch.Name))
	if err != nil {
		t.Fatal(err)
	}
	metrics := netip.AddrPortFrom(hb.Addr(), metricsPort).String()
	base := goroutinesOf(t, metrics)

	const frames, bound = 20000, 64
	p := rawJoin(t, rawHostIdentity(t, ha, sec.Key), hb)
	p.nc.SetDeadline(time.Now().Add(2 * time.Minute)) // the agent reads the flood only as fast as it serves it
	done := make(chan error, 1)
	go func() {
		var err error
		for i := range frames {
			gid := netip.AddrFrom16([16]byte{0xfe, 0x80, 14: byte(i >> 8), 15: byte(i)})
			b := fmt.Appendf(nil, `{"qpn":%d,"from_qpn":%d,"from_gid":%q}`, 0x100+i%1000, 0x200+i%1000, gid)
			if err = p.write(rawFrame(tcpwire.Header{Type: tcpwire.CMDisc}, b)); err != nil {
				break
			}
		}
		done <- err
	}()
	most := base
	for sending := true; sending; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("sending the flood: %v", err)
			}
			sending = false
		case <-time.After(20 * time.Millisecond):
		}
		most = max(most, goroutinesOf(t, metrics))
	}
	if most > base+bound {
		t.Errorf("the agent ran %d goroutines during a flood of %d CM_DISC frames on one connection, %d before it: more than %d more", most, frames, base, bound)
	}
	// The connection still carries requests, after every frame before the
	// probe was read.
	start := time.Now()
	rawProbe(t, p, 1)
	hostileTraffic(t, s, va, vb)
	t.Logf("the probe behind the flood answered after %v", time.Since(start))
	t.Logf("goroutines: %d before the flood, at most %d during it", base, most)
}
