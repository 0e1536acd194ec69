// SPDX-License-Identifier: Apache-2.0

package member_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// A managed VM's record belongs to the inventory: publishing and
// removing it (its workload attaching and detaching) touch only its
// adapters; DeleteVM deletes it.
func TestControlPlaneManagedVM(t *testing.T) {
	ctx, st := twoHosts(t)
	managed, ads := vmRec("vm1", "h1", 1, 2)
	managed.Managed, managed.Owner = true, records.Owner{UID: 42, GID: 43}
	managed.Inventory = records.Inventory{Datacenter: "dc1", Folder: "prod"}
	if _, err := st.Create(ctx, records.VMKey("vm1"), managed); err != nil {
		t.Fatal(err)
	}
	// The agent publishes what it knows: another VMX and owner, no placement.
	pub := managed
	pub.Managed, pub.VMX, pub.Owner, pub.Inventory = false, "", records.Owner{UID: 7}, records.Inventory{}
	if err := member.PublishVM(ctx, st, pub, ads); err != nil {
		t.Fatal(err)
	}
	got, _, err := store.Get[records.VM](ctx, st, records.VMKey("vm1"))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Managed || got.VMX != managed.VMX || got.Owner != managed.Owner || got.Inventory != managed.Inventory || len(got.Adapters) != 2 {
		t.Errorf("after publish: %+v", got)
	}
	if _, _, err := store.Get[records.Endpoint](ctx, st, records.EndpointNameKey("vm1", "vrdma0")); err != nil {
		t.Errorf("directory entry after publish: %v", err)
	}
	// Another host may not publish it.
	other := pub
	other.Host = "h2"
	if err := member.PublishVM(ctx, st, other, ads); !errors.Is(err, member.ErrPlacement) {
		t.Errorf("publish from h2: %v, want ErrPlacement", err)
	}
	// Nor may its own host while it is powered off (a power-off that
	// raced the attach).
	if _, _, err := store.Update(ctx, st, records.VMKey("vm1"), func(old *records.VM) (*records.VM, error) {
		n := *old
		n.Power = records.PoweredOff
		return &n, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := member.PublishVM(ctx, st, pub, ads); !errors.Is(err, member.ErrPlacement) || !strings.Contains(err.Error(), "poweredOff") {
		t.Errorf("publish of a powered-off managed VM: %v, want ErrPlacement", err)
	}
	// Detach: the record stays, without adapters or directory entries.
	if err := member.RemoveVM(ctx, st, "vm1"); err != nil {
		t.Fatal(err)
	}
	got, _, err = store.Get[records.VM](ctx, st, records.VMKey("vm1"))
	if err != nil || !got.Managed || len(got.Adapters) != 0 || got.VMX != managed.VMX {
		t.Errorf("after remove: %+v, %v", got, err)
	}
	for _, k := range []string{records.AdapterKey("vm1", "vrdma0"), records.EndpointNameKey("vm1", "vrdma1"), records.EndpointGIDKey(ads[0].GID)} {
		if r, _ := st.Client().Get(ctx, k); len(r.Kvs) != 0 {
			t.Errorf("%s is left after remove", k)
		}
	}
	// DeleteVM asks first, then deletes.
	refuse := errors.New("no")
	if err := member.DeleteVM(ctx, st, "vm1", func(records.VM) error { return refuse }); !errors.Is(err, refuse) {
		t.Errorf("DeleteVM with a refusing check: %v", err)
	}
	if err := member.DeleteVM(ctx, st, "vm1", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Get[records.VM](ctx, st, records.VMKey("vm1")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after DeleteVM: %v", err)
	}
	if err := member.DeleteVM(ctx, st, "vm1", nil); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeleteVM of no VM: %v", err)
	}
}

// Register keeps what an administrator configured and the agent does not
// say: inventory, PVRDMA address, firewall rule, PVRDMA namespaces.
func TestControlPlaneRegisterKeepsConfiguration(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	st := etcdtest.OpenEmbedded(t)
	h := hostRec("h1", 1, false)
	h.PVRDMAAddress, h.FirewallPVRDMA = netip.AddrPort{}, false
	configured := h
	configured.PVRDMAAddress = netip.MustParseAddrPort("192.0.2.1:4791")
	configured.FirewallPVRDMA = true
	configured.PVRDMANamespaces = true
	configured.Inventory = records.Inventory{Datacenter: "dc1", Cluster: "c1"}
	if _, err := st.Create(ctx, records.HostKey("h1"), configured); err != nil {
		t.Fatal(err)
	}
	m, err := member.Register(ctx, st, h, member.Options{TTL: 2 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got, _, err := store.Get[records.Host](ctx, st, records.HostKey("h1"))
	if err != nil {
		t.Fatal(err)
	}
	if got.PVRDMAAddress != configured.PVRDMAAddress || !got.FirewallPVRDMA || !got.PVRDMANamespaces || got.Inventory != configured.Inventory {
		t.Errorf("after Register: %+v", got)
	}
}

// A VM that is not managed may not take the name of one that another host,
// up, has published; once that host is down it may. A host removes only
// the VM it published.
func TestControlPlanePublishNameTaken(t *testing.T) {
	ctx, st := twoHosts(t)
	if _, err := st.Create(ctx, records.AliveKey("h1"), records.Alive{HostID: "h1", Lease: 1, TTL: 10, AgentVersion: "test"}); err != nil {
		t.Fatal(err)
	}
	vm, ads := vmRec("vm2", "h1", 2, 1)
	if err := member.PublishVM(ctx, st, vm, ads); err != nil {
		t.Fatal(err)
	}
	other := vm
	other.Host = "h2"
	if err := member.PublishVM(ctx, st, other, ads); !errors.Is(err, member.ErrPlacement) || !strings.Contains(err.Error(), "h1") {
		t.Fatalf("publish vm2 from h2 while h1 runs it: %v, want ErrPlacement naming h1", err)
	}
	r, err := st.Client().Delete(ctx, records.AliveKey("h1"))
	if err != nil || r.Deleted != 1 {
		t.Fatal(err)
	}
	if err := member.PublishVM(ctx, st, other, ads); err != nil {
		t.Fatalf("publish vm2 from h2 once h1 is down: %v", err)
	}
	if err := member.RemoveVMOf(ctx, st, "vm2", "h1"); !errors.Is(err, member.ErrPlacement) {
		t.Errorf("h1 removes vm2, which h2 has now: %v, want ErrPlacement", err)
	}
	if got, _, err := store.Get[records.VM](ctx, st, records.VMKey("vm2")); err != nil || got.Host != "h2" || len(got.Adapters) != 1 {
		t.Errorf("vm2 after h1's removal was refused: %+v, %v", got, err)
	}
	if err := member.RemoveVMOf(ctx, st, "vm2", "h2"); err != nil {
		t.Errorf("h2 removes its vm2: %v", err)
	}
}

// twoHosts opens a control plane with the test fabric and hosts h1 and h2.
func twoHosts(t *testing.T) (context.Context, *store.Store) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	st := etcdtest.OpenEmbedded(t)
	setupFabric(t, ctx, st)
	for _, h := range []string{"h1", "h2"} {
		if _, err := st.Create(ctx, records.HostKey(h), hostRec(h, 1, false)); err != nil {
			t.Fatal(err)
		}
	}
	return ctx, st
}
