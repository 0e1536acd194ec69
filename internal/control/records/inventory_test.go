// SPDX-License-Identifier: Apache-2.0

package records

import (
	"strings"
	"testing"
)

func TestCheckPath(t *testing.T) {
	for _, ok := range []string{"prod", "prod/web", "a/b/c/d/e/f/g/h", "rack-1.row_2"} {
		if err := CheckPath(ok); err != nil {
			t.Errorf("CheckPath(%q) = %v", ok, err)
		}
	}
	for _, tc := range []struct{ path, says string }{
		{"", "missing"},
		{"/prod", "missing"},
		{"prod/", "missing"},
		{"prod//web", "missing"},
		{"a/b/c/d/e/f/g/h/i", "9 levels, more than 8"},
		{"prod/we b", "' ' at offset 2"},
		{"-x", "start with a letter"},
	} {
		err := CheckPath(tc.path)
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("CheckPath(%q) = %v; want it to say %q", tc.path, err, tc.says)
		}
	}
}

func TestInventoryValidation(t *testing.T) {
	vm := VM{Name: "vm1", Power: PoweredOff, Managed: true, Inventory: Inventory{Datacenter: "dc1", Folder: "prod/web", ResourcePool: "gold"}}
	if err := vm.Validate(); err != nil {
		t.Errorf("VM with a datacenter, folder and pool: %v", err)
	}
	for _, tc := range []struct {
		inv   Inventory
		field string
	}{
		{Inventory{Datacenter: "dc/1"}, "datacenter"},
		{Inventory{Folder: "a//b"}, "folder"},
		{Inventory{ResourcePool: "gold/"}, "resourcePool"},
		{Inventory{Cluster: "c1"}, "cluster"}, // a VM's cluster is its host's
	} {
		v := vm
		v.Inventory = tc.inv
		err := v.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("VM with %+v: %v; want a %s error", tc.inv, err, tc.field)
		}
	}
	h := Host{ID: "h1", Name: "h1", AgentVersion: "1", State: HostUp, Inventory: Inventory{Datacenter: "dc1", Cluster: "c1", Folder: "rack1"}}
	if err := h.Validate(); err != nil {
		t.Errorf("host with a datacenter, cluster and folder: %v", err)
	}
	h.ResourcePool, h.Cluster = "gold", "c 1"
	err := h.Validate()
	if err == nil || !strings.Contains(err.Error(), "resourcePool: a host has no resource pool") || !strings.Contains(err.Error(), "cluster:") {
		t.Errorf("host with a resource pool and a bad cluster: %v", err)
	}
}

func TestOwner(t *testing.T) {
	o := Owner{UID: 1000, GID: 100}
	for _, tc := range []struct {
		uid, gid       uint32
		group          bool // the owner granted its group
		attach, change bool
	}{
		{1000, 1000, false, true, true},  // the owner
		{0, 0, false, true, true},        // root
		{1001, 100, false, false, false}, // its group, not granted: neither
		{1001, 100, true, true, false},   // its group, granted: attaches, does not change
		{1001, 1001, true, false, false},
		{65534, 65534, true, false, false},
	} {
		if got := o.MayAttach(tc.uid, tc.gid, tc.group); got != tc.attach {
			t.Errorf("MayAttach(%d, %d, group %v) = %v", tc.uid, tc.gid, tc.group, got)
		}
		if got := o.MayChange(tc.uid); got != tc.change {
			t.Errorf("MayChange(%d) = %v", tc.uid, got)
		}
	}
}
