// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestDeleteSwitchAndPortGroup checks switch delete and portgroup delete:
// each is refused while something is on what it would remove — a running
// VM's adapter or a managed VM's configuration on a port group; port
// groups, then a host, on a switch — naming it, and succeeds once it is
// gone, the switch's secret with it; deleting what is not there is an
// error.
func TestDeleteSwitchAndPortGroup(t *testing.T) {
	isolate(t)
	ep := etcdtest.Start(t).ClientURL()
	st := etcdtest.Open(t, ep)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fabric(t, ep) // dvs1: dvportgroup-10, dvportgroup-20
	on := []string{"--etcd-endpoints", ep}
	fail := func(want string, args ...string) {
		t.Helper()
		out, errs, code := run(t, "", append(on, args...)...)
		if code == 0 || !strings.Contains(errs, want) {
			t.Fatalf("vrdmactl %s: exit %d, want an error saying %q\n%s%s", strings.Join(args, " "), code, want, out, errs)
		}
	}
	put := func(key string, r records.Record) {
		t.Helper()
		if _, err := st.Create(ctx, key, r); err != nil {
			t.Fatal(err)
		}
	}
	put(records.AdapterKey("run1", "vrdma0"), records.Adapter{VM: "run1", Index: 0, MAC: "00:50:56:00:00:01",
		GID: netip.MustParseAddr("fe80::250:56ff:fe00:1"), PortGroup: "dvportgroup-20"})
	put(records.VMKey("man1"), records.VM{Name: "man1", VMX: testenv.VMXOn(testenv.VMOptions{}, "dvs1", "dvportgroup-10"),
		Power: records.PoweredOff, Managed: true})
	put(records.HostKey("h1"), records.Host{ID: "h1", Name: "esx1", Switch: "dvs1", AgentVersion: "test", State: records.HostUp})
	put(records.SwitchSecretKey("dvs1"), records.SwitchSecret{Switch: "dvs1", Key: make([]byte, records.SwitchSecretLen)})

	fail("adapters run1/vrdma0 are on it", "portgroup", "delete", "dvportgroup-20")
	fail("adapters man1/vrdma0 are on it", "portgroup", "delete", "dvportgroup-10")
	fail("port groups dvportgroup-10, dvportgroup-20 are on it", "switch", "delete", "dvs1")
	fail("not found", "portgroup", "delete", "dvportgroup-99")
	fail("not found", "switch", "delete", "dvs9")

	del := func(key string) {
		t.Helper()
		if _, err := store.Txn(ctx, st, func(tx *store.Tx) error { return tx.Delete(key) }); err != nil {
			t.Fatal(err)
		}
	}
	del(records.AdapterKey("run1", "vrdma0"))
	del(records.VMKey("man1"))
	for _, pg := range []string{"dvportgroup-10", "dvportgroup-20"} {
		if out := runOK(t, append(on, "portgroup", "delete", pg)...); !strings.Contains(out, "port group "+pg+" deleted") {
			t.Fatalf("portgroup delete %s: %s", pg, out)
		}
	}
	fail("port group dvportgroup-10: not found", "portgroup", "show", "dvportgroup-10")
	fail("hosts esx1 have joined it", "switch", "delete", "dvs1")
	del(records.HostKey("h1"))
	runOK(t, append(on, "switch", "delete", "dvs1")...)
	fail("not found", "switch", "show", "dvs1")
	if _, _, err := store.Get[records.SwitchSecret](ctx, st, records.SwitchSecretKey("dvs1")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the switch's secret after the delete: %v, want it gone", err)
	}
}
