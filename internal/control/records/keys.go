// SPDX-License-Identifier: Apache-2.0

package records

import (
	"fmt"
	"net/netip"
	"strings"
)

// Prefix is the root of every control-plane key. See package control for
// the layout below it.
const Prefix = "/vrdma/v1/"

// Key prefixes of each kind (each ends in '/').
const (
	SwitchPrefix       = Prefix + "switches/"
	PortGroupPrefix    = Prefix + "portgroups/"
	HostPrefix         = Prefix + "hosts/"
	AlivePrefix        = Prefix + "alive/"
	VMPrefix           = Prefix + "vms/"
	AdapterPrefix      = Prefix + "adapters/"
	EndpointPrefix     = Prefix + "endpoints/"
	EndpointGIDPrefix  = EndpointPrefix + "gid/"
	EndpointNamePrefix = EndpointPrefix + "name/"
	// McastPrefix holds the multicast memberships agents publish under
	// their host's lease (McastMemberKey): keys without a value, which
	// ParseKey does not know (the cache leaves them alone).
	McastPrefix = Prefix + "mcast/"
)

// McastGroupPrefix is the prefix of the memberships of multicast group
// gid on port group pg.
func McastGroupPrefix(pg string, gid netip.Addr) string {
	return McastPrefix + pg + "/" + GIDOf(gid).String() + "/"
}

// McastMemberKey is the key of adapter vm/adapter of host, on port group
// pg, as a member of multicast group gid; seq tells apart the processes
// of one VM that hold the adapter.
func McastMemberKey(pg string, gid netip.Addr, host, vm, adapter string, seq uint64) string {
	return fmt.Sprintf("%s%s/%s/%s/%d", McastGroupPrefix(pg, gid), host, vm, adapter, seq)
}

// SwitchKey returns the key of switch name.
func SwitchKey(name string) string { return SwitchPrefix + name }

// PortGroupKey returns the key of the port group whose key is pgKey.
func PortGroupKey(pgKey string) string { return PortGroupPrefix + pgKey }

// HostKey returns the key of host id's record.
func HostKey(id string) string { return HostPrefix + id }

// AliveKey returns the key of host id's heartbeat.
func AliveKey(id string) string { return AlivePrefix + id }

// VMKey returns the key of VM name.
func VMKey(name string) string { return VMPrefix + name }

// AdapterKey returns the key of adapter "vrdmaN" of VM vm.
func AdapterKey(vm, adapter string) string { return AdapterPrefix + vm + "/" + adapter }

// AdapterKeyPrefix returns the prefix of every adapter key of VM vm.
func AdapterKeyPrefix(vm string) string { return AdapterPrefix + vm + "/" }

// EndpointGIDKey returns the directory key of GID gid.
func EndpointGIDKey(gid netip.Addr) string { return EndpointGIDPrefix + GIDOf(gid).String() }

// EndpointNameKey returns the directory key of "vm/adapter".
func EndpointNameKey(vm, adapter string) string { return EndpointNamePrefix + vm + "/" + adapter }

// KeyOf returns the key a record is stored under. An Endpoint has two keys;
// KeyOf returns the one by name (see EndpointGIDKey for the other).
func KeyOf(r Record) string {
	switch r := r.(type) {
	case Switch:
		return SwitchKey(r.Name)
	case PortGroup:
		return PortGroupKey(r.Key)
	case Host:
		return HostKey(r.ID)
	case Alive:
		return AliveKey(r.HostID)
	case VM:
		return VMKey(r.Name)
	case Adapter:
		return AdapterKey(r.VM, r.Name())
	case Endpoint:
		return EndpointNameKey(r.VM, r.Adapter)
	}
	panic(fmt.Sprintf("records.KeyOf: unknown record type %T", r))
}

// Ref is what a key names: the kind of record and its ID within the kind.
// The ID is the name ("dvs1"), the host ID, "vm/vrdmaN" for adapters and
// name entries, or the GID's text for GID entries.
type Ref struct {
	Kind  Kind
	ID    string
	ByGID bool // an endpoint entry stored under its GID
}

// ParseKey returns what key names, or an error that says why it is not a
// control-plane key this build knows. The ID's characters are checked, so
// a key that parses can be printed and used again.
func ParseKey(key string) (Ref, error) {
	rest, ok := strings.CutPrefix(key, Prefix)
	if !ok {
		return Ref{}, fmt.Errorf("key %q is not under %s", key, Prefix)
	}
	kind, id, _ := strings.Cut(rest, "/")
	bad := func(why string) (Ref, error) { return Ref{}, fmt.Errorf("key %q: %s", key, why) }
	one := func(k Kind) (Ref, error) {
		if err := CheckName(id); err != nil {
			return bad(err.Error())
		}
		return Ref{Kind: k, ID: id}, nil
	}
	two := func(k Kind, id string) (Ref, error) {
		vm, ad, ok := strings.Cut(id, "/")
		if !ok {
			return bad("want <vm>/<vrdmaN>")
		}
		if err := CheckName(vm); err != nil {
			return bad(err.Error())
		}
		if _, err := ParseAdapterName(ad); err != nil {
			return bad(err.Error())
		}
		return Ref{Kind: k, ID: id}, nil
	}
	switch kind {
	case "switches":
		return one(KindSwitch)
	case "portgroups":
		return one(KindPortGroup)
	case "hosts":
		return one(KindHost)
	case "alive":
		return one(KindAlive)
	case "vms":
		return one(KindVM)
	case "adapters":
		return two(KindAdapter, id)
	case "endpoints":
		sub, id2, _ := strings.Cut(id, "/")
		switch sub {
		case "name":
			return two(KindEndpoint, id2)
		case "gid":
			g, err := ParseGID(id2)
			if err != nil || g.String() != id2 {
				return bad("want a GID in canonical 16-byte form")
			}
			return Ref{Kind: KindEndpoint, ID: id2, ByGID: true}, nil
		}
	}
	return bad("unknown kind of key")
}
