// SPDX-License-Identifier: Apache-2.0

package member_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func ctxT(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

var testSwitch = records.Switch{Name: "dvs1", UUID: "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d", MTU: 9000, UplinkPolicy: records.UplinkSingle}

var testPG = records.PortGroup{Name: "RoCE", Key: "dvportgroup-80", Switch: "dvs1", VLAN: 100, PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}

// setupFabric creates the switch and port group.
func setupFabric(tb testing.TB, ctx context.Context, st *store.Store) {
	tb.Helper()
	if _, err := st.Create(ctx, records.SwitchKey(testSwitch.Name), testSwitch); err != nil {
		tb.Fatal(err)
	}
	if _, err := st.Create(ctx, records.PortGroupKey(testPG.Key), testPG); err != nil {
		tb.Fatal(err)
	}
}

// hostRec returns host n's record: on dvs1, with a PVRDMA address on
// 127.0.0.(n+1), and a software RoCEv2 uplink on lo if rdma, which its
// operator declares lossless (lossless) so that the network checks pass.
func hostRec(id string, n int, rdma bool) records.Host {
	addr := netip.AddrFrom4([4]byte{127, 0, byte(n >> 8), byte(n + 1)})
	h := records.Host{
		ID: id, Name: id,
		PVRDMAAddress:  netip.AddrPortFrom(addr, 4792),
		FirewallPVRDMA: true,
		Switch:         "dvs1",
		AgentVersion:   "0.1.0-test",
		State:          records.HostUp,
	}
	if rdma {
		h.Uplinks = []records.Uplink{{Kind: records.UplinkSoftRoCEv2, Device: "lo", Address: addr, GID: records.GIDOf(addr), Declared: lossless()}}
	}
	return h
}

// lossless is the declaration of an uplink that passes every network
// check of testPG: PFC on priority 3, no global pause, not teamed.
func lossless() records.NICState {
	pfc, teamed := records.PrioritiesOf(testPG.PFCPriority), false
	return records.NICState{PFC: &pfc, Pause: &records.Pause{}, Teamed: &teamed}
}

// vmRec returns VM name on host with n adapters on testPG, GIDs derived
// from seq.
func vmRec(name, host string, seq, n int) (records.VM, []records.Adapter) {
	vm := records.VM{
		Name:  name,
		VMX:   fmt.Sprintf("memSize = \"64\"\nsched.mem.pin = \"TRUE\"\nvirtualHW.version = \"20\"\nguestOS = \"ubuntu-64\"\ndisplayName = \"%s\"\n", name),
		Owner: records.Owner{UID: 1000, GID: 1000},
		Host:  host,
		Power: records.PoweredOn,
	}
	var ads []records.Adapter
	for i := range n {
		k := seq*records.MaxAdapters + i
		ads = append(ads, records.Adapter{
			VM: name, Index: i,
			MAC:       fmt.Sprintf("00:50:56:%02x:%02x:%02x", byte(k>>16), byte(k>>8), byte(k)),
			GID:       netip.AddrFrom16([16]byte{0xfe, 0x80, 10: 0xff, 11: 0xfe, 12: byte(k >> 24), 13: byte(k >> 16), 14: byte(k >> 8), 15: byte(k)}),
			PortGroup: testPG.Key,
		})
	}
	return vm, ads
}

func newCache(tb testing.TB, st *store.Store, cfg member.CacheConfig) *member.Cache {
	tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	c := member.NewCache(st, cfg)
	tb.Cleanup(c.Close)
	select {
	case <-c.Synced():
	case <-time.After(20 * time.Second):
		tb.Fatal("cache did not sync")
	}
	return c
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(tb testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			tb.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func hostState(c *member.Cache, id string) records.HostState {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	h, err := c.Host(ctx, id)
	if err != nil {
		return ""
	}
	return h.Host.State
}
