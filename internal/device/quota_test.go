// SPDX-License-Identifier: Apache-2.0

package device

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// uidOwner is a workload of uid.
type uidOwner struct {
	harnessOwner
	uid uint32
}

func (o uidOwner) UID() uint32 { return o.uid }

// TestVMWideCaps: the caps of a VM hold for all its workloads together,
// the per-uid ones for all of a uid's, and what an object or a workload
// held comes back when it goes.
func TestVMWideCaps(t *testing.T) {
	lim := DefaultLimits
	lim.MaxCQ, lim.MaxCQEPerVM, lim.MaxMR = 3, 1024, 2
	led := quota.New(quota.Limits{RegisteredMemoryPerUser: 1 << 20, RingMemoryPerUser: 1 << 30}, 500)
	d := New(Config{Host: "h", HostID: "quota-host", Limits: lim, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Quota: led})
	cfg, err := vmconfig.Parse([]byte("memSize = \"4\"\nethernet0.present = \"TRUE\"\nethernet0.virtualDev = \"vrdma\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	attach := func() *Context {
		v, err := d.Attach(uidOwner{uid: 1000}, "vm", cfg, false, func() error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		v.SetReady()
		return v
	}
	limited := func(err error, what string) {
		t.Helper()
		if !errors.Is(err, abi.ErrLimit) || !strings.Contains(err.Error(), what) {
			t.Fatalf("want a refusal naming %s, got %v", what, err)
		}
	}
	v1, v2 := attach(), attach()
	if _, err := v1.CreateCQ(&abi.CreateCQ{Adapter: "vrdma0", CQE: 512}); err != nil {
		t.Fatal(err)
	}
	if _, err := v2.CreateCQ(&abi.CreateCQ{Adapter: "vrdma0", CQE: 512}); err != nil {
		t.Fatal(err)
	}
	_, err = v2.CreateCQ(&abi.CreateCQ{Adapter: "vrdma0", CQE: 1})
	limited(err, "limit cqe-per-vm")
	ring := led.Used(1000, quota.RingMemory)
	if ring == 0 {
		t.Fatal("the CQs' rings are not charged to their uid")
	}
	pd, err := v1.AllocPD("vrdma0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v1.RegMR(&abi.RegMR{PD: pd, Addr: 0, Length: 1 << 20, Access: abi.AccessLocalWrite}); err != nil {
		t.Fatal(err)
	}
	_, err = v1.RegMR(&abi.RegMR{PD: pd, Addr: 0, Length: 4096, Access: abi.AccessLocalWrite})
	limited(err, "limit registered-memory-per-user")

	// v1 goes: its CQ, its region and its ring come back.
	v1.Teardown()
	d.Remove(v1)
	if got := led.Used(1000, quota.RegisteredMemory); got != 0 {
		t.Errorf("registered memory of uid 1000 after its workload went: %d", got)
	}
	if got := led.Used(1000, quota.RingMemory); got >= ring {
		t.Errorf("ring memory of uid 1000 after a workload went: %d, was %d", got, ring)
	}
	if _, err := v2.CreateCQ(&abi.CreateCQ{Adapter: "vrdma0", CQE: 512}); err != nil {
		t.Fatalf("a CQ once the other workload's went: %v", err)
	}
	v2.Teardown()
	d.Remove(v2)
	if got := led.Used(1000, quota.RingMemory); got != 0 {
		t.Errorf("ring memory of uid 1000 after every workload went: %d", got)
	}
}
