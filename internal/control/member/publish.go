// SPDX-License-Identifier: Apache-2.0

package member

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// ErrGIDInUse: a GID already belongs to another adapter.
var ErrGIDInUse = errors.New("GID in use")

// PublishVM writes vm and its adapters in one transaction: the VM record
// (vm.Adapters is set from adapters), one record per adapter, and, when
// the VM is on a host, the directory entries of every adapter under its
// GID and under "vm/vrdmaN". Adapters the VM had before and has no more
// are removed with their entries. The VM's host and every port group must
// exist; a GID must not belong to another adapter (ErrGIDInUse). A
// concurrent change to any record involved makes the transaction run again
// (store.Txn).
//
// A managed VM's record (records.VM.Managed) belongs to the inventory:
// publishing it keeps the stored VMX, owner, power state and inventory
// placement, and sets only the adapters; it must be placed on vm.Host
// and powered on (ErrPlacement otherwise). A VM that is not managed cannot
// take the name of one that is, nor of one that another host that is up
// published.
func PublishVM(ctx context.Context, st *store.Store, vm records.VM, adapters []records.Adapter) error {
	adapters = slices.Clone(adapters)
	slices.SortFunc(adapters, func(a, b records.Adapter) int { return a.Index - b.Index })
	vm.Adapters = nil
	for _, a := range adapters {
		if a.VM != vm.Name {
			return fmt.Errorf("publish VM %s: adapter %s/%s belongs to another VM", vm.Name, a.VM, a.Name())
		}
		vm.Adapters = append(vm.Adapters, a.Name())
	}
	if err := vm.Validate(); err != nil {
		return fmt.Errorf("publish VM %s: %w", vm.Name, err)
	}
	for _, a := range adapters {
		if err := a.Validate(); err != nil {
			return fmt.Errorf("publish VM %s: %w", vm.Name, err)
		}
	}
	_, err := store.Txn(ctx, st, func(tx *store.Tx) error {
		keys := []string{records.VMKey(vm.Name)}
		if vm.Host != "" {
			keys = append(keys, records.HostKey(vm.Host))
		}
		for _, a := range adapters {
			keys = append(keys, records.AdapterKey(vm.Name, a.Name()), records.PortGroupKey(a.PortGroup),
				records.EndpointGIDKey(a.GID), records.EndpointNameKey(vm.Name, a.Name()))
		}
		if err := tx.Prefetch(keys...); err != nil {
			return err
		}
		if vm.Host != "" {
			if ok, err := tx.Exists(records.HostKey(vm.Host)); err != nil {
				return err
			} else if !ok {
				return fmt.Errorf("publish VM %s: host %s: %w", vm.Name, vm.Host, store.ErrNotFound)
			}
		}
		old, err := store.TxGet[records.VM](tx, records.VMKey(vm.Name))
		if err != nil && !errors.Is(err, store.ErrBadRecord) {
			return err // a bad old record is overwritten
		}
		rec := vm
		switch {
		case old != nil && old.Managed:
			if old.Host != vm.Host {
				return fmt.Errorf("publish VM %s: %w: the inventory places it on host %s, not %s", vm.Name, ErrPlacement, orNone(old.Host), vm.Host)
			}
			if old.Power != records.PoweredOn {
				return fmt.Errorf("publish VM %s: %w: it is %s", vm.Name, ErrPlacement, old.Power)
			}
			rec = *old
			rec.Adapters = vm.Adapters
		case old != nil && old.Host != "" && old.Host != vm.Host:
			// A VM of that name, defined on another host, runs there
			// while that host is up: this one may not take its name.
			if up, err := tx.Exists(records.AliveKey(old.Host)); err != nil {
				return err
			} else if up {
				return fmt.Errorf("publish VM %s: %w: a VM of that name runs on host %s; VM names are global: define this one under another name", vm.Name, ErrPlacement, old.Host)
			}
		}
		if old != nil {
			for _, name := range old.Adapters {
				if !slices.Contains(vm.Adapters, name) {
					if err := removeAdapter(tx, vm.Name, name); err != nil {
						return err
					}
				}
			}
		}
		if err := tx.Put(records.VMKey(vm.Name), rec); err != nil {
			return err
		}
		for _, a := range adapters {
			if ok, err := tx.Exists(records.PortGroupKey(a.PortGroup)); err != nil {
				return err
			} else if !ok {
				return fmt.Errorf("publish VM %s: adapter %s: port group %s: %w", vm.Name, a.Name(), a.PortGroup, store.ErrNotFound)
			}
			oldA, err := store.TxGet[records.Adapter](tx, records.AdapterKey(vm.Name, a.Name()))
			if err != nil && !errors.Is(err, store.ErrBadRecord) {
				return err
			}
			if oldA != nil && oldA.GID != a.GID {
				if err := tx.Delete(records.EndpointGIDKey(oldA.GID)); err != nil {
					return err
				}
			}
			cur, err := store.TxGet[records.Endpoint](tx, records.EndpointGIDKey(a.GID))
			if err != nil && !errors.Is(err, store.ErrBadRecord) {
				return err
			}
			if cur != nil && (cur.VM != vm.Name || cur.Adapter != a.Name()) {
				return fmt.Errorf("publish VM %s: adapter %s: %w: %s belongs to %s", vm.Name, a.Name(), ErrGIDInUse, a.GID, cur.Name())
			}
			if err := tx.Put(records.AdapterKey(vm.Name, a.Name()), a); err != nil {
				return err
			}
			if vm.Host == "" {
				if err := tx.Delete(records.EndpointGIDKey(a.GID)); err != nil {
					return err
				}
				if err := tx.Delete(records.EndpointNameKey(vm.Name, a.Name())); err != nil {
					return err
				}
				continue
			}
			e := records.EndpointOf(a, vm.Host)
			if err := tx.Put(records.EndpointGIDKey(a.GID), e); err != nil {
				return err
			}
			if err := tx.Put(records.EndpointNameKey(vm.Name, a.Name()), e); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

// removeAdapter deletes adapter name of VM vm and its directory entries.
func removeAdapter(tx *store.Tx, vm, name string) error {
	key := records.AdapterKey(vm, name)
	a, err := store.TxGet[records.Adapter](tx, key)
	if err != nil && !errors.Is(err, store.ErrBadRecord) {
		return err
	}
	if a != nil {
		if e, err := store.TxGet[records.Endpoint](tx, records.EndpointGIDKey(a.GID)); err == nil && e != nil && e.VM == vm && e.Adapter == name {
			if err := tx.Delete(records.EndpointGIDKey(a.GID)); err != nil {
				return err
			}
		}
	}
	if err := tx.Delete(records.EndpointNameKey(vm, name)); err != nil {
		return err
	}
	return tx.Delete(key)
}

// ErrPlacement: a managed VM is published by a host it is not placed on.
var ErrPlacement = errors.New("VM placed on another host")

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// RemoveVM takes VM name off its host when its workload detaches: it
// deletes the VM's adapters and their directory entries and, unless the VM
// is managed, the VM record, in one transaction. A managed VM's record
// stays, with no adapters. ErrNotFound if there is no such VM.
func RemoveVM(ctx context.Context, st *store.Store, name string) error {
	return removeVM(ctx, st, name, false, nil)
}

// RemoveVMOf is RemoveVM for the VM as host published it: if the record
// places the VM on another host now, it fails with ErrPlacement and
// removes nothing. The check is in the transaction, so a VM that another
// host publishes meanwhile is left alone.
func RemoveVMOf(ctx context.Context, st *store.Store, name, host string) error {
	return removeVM(ctx, st, name, false, func(vm records.VM) error {
		if vm.Host != host {
			return fmt.Errorf("remove VM %s: %w: host %s has it now, not %s", name, ErrPlacement, orNone(vm.Host), host)
		}
		return nil
	})
}

// DeleteVM deletes VM name, managed or not, with its adapters and their
// directory entries, in one transaction. check, if not nil, sees the
// record first (inside the transaction) and may refuse with an error.
// ErrNotFound if there is no such VM.
func DeleteVM(ctx context.Context, st *store.Store, name string, check func(records.VM) error) error {
	return removeVM(ctx, st, name, true, check)
}

func removeVM(ctx context.Context, st *store.Store, name string, all bool, check func(records.VM) error) error {
	_, err := store.Txn(ctx, st, func(tx *store.Tx) error {
		vm, err := store.TxGet[records.VM](tx, records.VMKey(name))
		if err != nil {
			return err
		}
		if vm == nil {
			return fmt.Errorf("VM %s: %w", name, store.ErrNotFound)
		}
		if check != nil {
			if err := check(*vm); err != nil {
				return err
			}
		}
		for _, a := range vm.Adapters {
			if err := removeAdapter(tx, name, a); err != nil {
				return err
			}
		}
		if vm.Managed && !all {
			kept := *vm
			kept.Adapters = nil
			return tx.Put(records.VMKey(name), kept)
		}
		return tx.Delete(records.VMKey(name))
	})
	return err
}
