// SPDX-License-Identifier: Apache-2.0

// Package pathsel decides how two PVRDMA adapters talk: the one pure,
// deterministic, symmetric function of docs/network.md ("Path selection"),
// following PVRDMA's rules on vSphere:
//
//   - VMs on different distributed switches cannot connect.
//   - VMs on port groups with different VLANs cannot connect (isolation).
//   - A host that is down (or in maintenance) gets no new connection.
//   - Same host: memcpy between the two VMs' memory, even when the host
//     has an RDMA uplink.
//   - Different hosts that both have a usable RDMA uplink on the switch:
//     rdma, over the physical (or software RoCEv2) uplinks.
//   - Different hosts where at least one lacks one: tcp, slower.
//
// Traffic between hosts also needs each host's tagged PVRDMA address
// (Net.PVRDMAVmknic) and its pvrdma firewall ruleset; an RDMA uplink
// counts only under the switch's uplink policy (PVRDMA does no NIC
// teaming) and if it can carry the port group's RoCE version.
//
// And rdma needs a network fit for RoCE (docs/network.md): the checks of package
// netcheck for the port groups and the two uplinks (netcheck.Pair) must
// pass. The switch's network policy says how strictly: "strict" (the
// default) rejects rdma for tcp when a check fails or its state is
// unknown, naming the check, what failed and, for an unknown, what to
// declare; "warn" keeps rdma and carries the failures as warnings; "off"
// runs no check. The checks read the records only: an uplink's state is
// what its host's kernel reported (records.Uplink.Observed) or, where it
// could not, what the operator declared.
//
// Select names the chosen path, why, and every candidate it rejected with
// why — the answer to "why is my QP on tcp?". Its result depends only on
// its arguments, and Select(sw, a, b) equals Select(sw, b, a) in every
// field, errors included: the two ends are put in a canonical order first.
package pathsel

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/netcheck"
)

// Path is a way to move a connected QP's bytes: the program's one path
// vocabulary, abi.PathKind.
type Path = abi.PathKind

// The paths Select chooses between, in the order it considers them.
const (
	Memcpy = abi.PathMemcpy
	RDMA   = abi.PathRDMA
	TCP    = abi.PathTCP
)

// Candidates lists every path Select considers, in order.
var Candidates = [...]Path{Memcpy, RDMA, TCP}

// Rejection is a candidate path that was not chosen, and why.
type Rejection = abi.PathRejection

// Decision is the outcome of Select: the path, the reason, and every other
// candidate with why it was rejected (in Candidates order).
type Decision struct {
	Path     Path        `json:"path"` // "" when Select fails
	Reason   string      `json:"reason"`
	Rejected []Rejection `json:"rejected"`
	// Warnings are the network checks that did not pass on an rdma path
	// that the switch's network policy "warn" kept; Reason says them too.
	Warnings []string `json:"warnings,omitempty"`
}

// String returns "rdma: <reason>".
func (d Decision) String() string {
	if d.Path == "" {
		return "no path"
	}
	return string(d.Path) + ": " + d.Reason
}

// End is one end of a connection: an adapter, its VM's host, and its port
// group.
type End struct {
	// Name names the end in messages, e.g. "vm1/vrdma0".
	Name string
	// Host is the record of the host the VM runs on, with its effective
	// state: package member reports records.HostDown for a host whose
	// lease has expired.
	Host records.Host
	// PortGroup is the adapter's port group.
	PortGroup records.PortGroup
}

// Errors of Select; each comes wrapped with the details (errors.Is).
var (
	// ErrInput: the arguments are inconsistent (missing host ID, a switch
	// that is not the port groups' own).
	ErrInput = errors.New("bad path-selection input")
	// ErrDifferentSwitch: the two ends are on different distributed
	// switches.
	ErrDifferentSwitch = errors.New("not on the same distributed switch")
	// ErrVLANIsolation: the two ends are on port groups with different
	// VLANs.
	ErrVLANIsolation = errors.New("VLAN isolation")
	// ErrHostDown: a host is down or in maintenance.
	ErrHostDown = errors.New("host not up")
	// ErrNotOnSwitch: a host is not on the ends' switch.
	ErrNotOnSwitch = errors.New("host not on the switch")
	// ErrNoPath: different hosts, and neither rdma nor tcp can join them.
	ErrNoPath = errors.New("no path")
)

// Select decides the path between ends a and b on switch sw, the switch of
// their port groups. On error the Decision has no Path; its Rejected still
// says why each candidate was rejected when Select got that far (ErrNoPath).
func Select(sw records.Switch, a, b End) (Decision, error) {
	// Canonical order: the result must not depend on which end dials.
	if less(b, a) {
		a, b = b, a
	}
	if a.Host.ID == "" || b.Host.ID == "" {
		return Decision{}, fmt.Errorf("%w: %s", ErrInput, "an end has no host ID")
	}
	if a.PortGroup.Switch != b.PortGroup.Switch {
		return Decision{}, fmt.Errorf("%w: %s is on switch %s (port group %s) and %s on switch %s (port group %s): they must be on the same distributed switch",
			ErrDifferentSwitch, a.Name, a.PortGroup.Switch, a.PortGroup.Key, b.Name, b.PortGroup.Switch, b.PortGroup.Key)
	}
	if sw.Name != a.PortGroup.Switch {
		return Decision{}, fmt.Errorf("%w: given switch %s, but the port groups are on %s", ErrInput, sw.Name, a.PortGroup.Switch)
	}
	if a.PortGroup.VLAN != b.PortGroup.VLAN {
		return Decision{}, fmt.Errorf("%w: %s is on port group %s (VLAN %d) and %s on port group %s (VLAN %d): different VLANs are isolated",
			ErrVLANIsolation, a.Name, a.PortGroup.Key, a.PortGroup.VLAN, b.Name, b.PortGroup.Key, b.PortGroup.VLAN)
	}
	var down []string
	for _, h := range hosts(a, b) {
		if h.State != records.HostUp {
			down = append(down, fmt.Sprintf("host %s is %s", h.Label(), stateWord(h.State)))
		}
	}
	if len(down) > 0 {
		return Decision{}, fmt.Errorf("%w: %s: it gets no new connections", ErrHostDown, strings.Join(down, " and "))
	}
	var off []string
	for _, h := range hosts(a, b) {
		if h.Switch != sw.Name {
			where := "on no distributed switch"
			if h.Switch != "" {
				where = "on switch " + h.Switch
			}
			off = append(off, fmt.Sprintf("host %s is %s", h.Label(), where))
		}
	}
	if len(off) > 0 {
		return Decision{}, fmt.Errorf("%w: %s, not on %s, the switch of %s and %s", ErrNotOnSwitch, strings.Join(off, " and "), sw.Name, a.Name, b.Name)
	}

	if a.Host.ID == b.Host.ID {
		why := "same host: memcpy"
		return Decision{
			Path:     Memcpy,
			Reason:   fmt.Sprintf("same host %s: memcpy between the two VMs' memory", a.Host.Label()),
			Rejected: []Rejection{{Path: RDMA, Why: why}, {Path: TCP, Why: why}},
		}, nil
	}

	memcpyWhy := fmt.Sprintf("different hosts %s and %s", a.Host.Label(), b.Host.Label())
	var links []string
	for _, h := range hosts(a, b) {
		if ok, why := h.CanCarryInterHost(); !ok {
			links = append(links, why)
		}
	}
	if len(links) > 0 {
		why := strings.Join(links, "; ")
		d := Decision{Rejected: []Rejection{{Path: Memcpy, Why: memcpyWhy}, {Path: RDMA, Why: why}, {Path: TCP, Why: why}}}
		return d, fmt.Errorf("%w between %s and %s: %s", ErrNoPath, a.Name, b.Name, why)
	}

	ua, whyA := usableUplink(sw, a.Host, a.PortGroup.RoCEVersion)
	ub, whyB := usableUplink(sw, b.Host, b.PortGroup.RoCEVersion)
	var noRDMA []string
	for _, w := range []string{whyA, whyB} {
		if w != "" {
			noRDMA = append(noRDMA, w)
		}
	}
	if len(noRDMA) == 0 && a.PortGroup.RoCEVersion != b.PortGroup.RoCEVersion {
		noRDMA = append(noRDMA, fmt.Sprintf("port group %s is RoCE %s and %s is RoCE %s",
			a.PortGroup.Key, a.PortGroup.RoCEVersion, b.PortGroup.Key, b.PortGroup.RoCEVersion))
	}
	var network string
	var warnings []string
	if len(noRDMA) == 0 {
		switch failing := networkChecks(sw, a, ua, b, ub); {
		case sw.NetworkPolicy.Effective() == records.NetworkOff:
			network = fmt.Sprintf("network checks off on switch %s", sw.Name)
		case len(failing) == 0:
			network = "network checks passed"
		case sw.NetworkPolicy.Effective() == records.NetworkWarn:
			warnings = failing
			network = fmt.Sprintf("network policy warn on switch %s: %s", sw.Name, strings.Join(failing, "; "))
		default:
			noRDMA = append(noRDMA, "rdma rejected: "+strings.Join(failing, "; "))
		}
	}
	if len(noRDMA) == 0 {
		return Decision{
			Path: RDMA,
			Reason: fmt.Sprintf("hosts %s and %s both have an RDMA uplink on switch %s (%s %s, %s %s), RoCE %s, %s",
				a.Host.Label(), b.Host.Label(), sw.Name, ua.Kind, ua.Address, ub.Kind, ub.Address, a.PortGroup.RoCEVersion, network),
			Rejected: []Rejection{{Path: Memcpy, Why: memcpyWhy}, {Path: TCP, Why: "rdma available"}},
			Warnings: warnings,
		}, nil
	}
	rdmaWhy := strings.Join(noRDMA, "; ")
	return Decision{
		Path: TCP,
		Reason: fmt.Sprintf("%s: TCP between %s and %s",
			rdmaWhy, a.Host.PVRDMAAddress, b.Host.PVRDMAAddress),
		Rejected: []Rejection{{Path: Memcpy, Why: memcpyWhy}, {Path: RDMA, Why: rdmaWhy}},
	}, nil
}

// networkChecks runs the network checks of an rdma path between a over
// uplink ua and b over ub (netcheck.Pair), for a's port group and, if it
// is another one, b's (each end sends with its own port group's priority),
// unless the switch's network policy is off. It returns the checks that
// did not pass, once each, in order.
func networkChecks(sw records.Switch, a End, ua records.Uplink, b End, ub records.Uplink) []string {
	if sw.NetworkPolicy.Effective() == records.NetworkOff {
		return nil
	}
	pgs := []records.PortGroup{a.PortGroup}
	if b.PortGroup.Key != a.PortGroup.Key {
		pgs = append(pgs, b.PortGroup)
	}
	var out []string
	for _, pg := range pgs {
		for _, r := range netcheck.Failing(netcheck.Pair(sw, pg, netcheck.End{Host: a.Host, Uplink: ua}, netcheck.End{Host: b.Host, Uplink: ub})) {
			if s := r.String(); !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// usableUplink returns the RDMA uplink host h uses on switch sw for RoCE
// version v, or why it has none.
func usableUplink(sw records.Switch, h records.Host, v records.RoCEVersion) (records.Uplink, string) {
	if len(h.Uplinks) == 0 {
		return records.Uplink{}, fmt.Sprintf("host %s has no RDMA uplink on switch %s", h.Label(), sw.Name)
	}
	if len(h.Uplinks) > 1 && sw.UplinkPolicy != records.UplinkFailover {
		return records.Uplink{}, fmt.Sprintf("host %s has %d RDMA uplinks on switch %s, whose uplink policy is %q: PVRDMA does not support teaming (one uplink, or policy \"failover\")",
			h.Label(), len(h.Uplinks), sw.Name, sw.UplinkPolicy)
	}
	u := h.Uplinks[0] // the only one, or the active one in failover order
	if !u.Carries(v) {
		why := fmt.Sprintf("host %s's RDMA uplink on switch %s is %s, which cannot carry RoCE %s", h.Label(), sw.Name, u.Kind, v)
		if u.Kind == records.UplinkSoftRoCEv2 {
			why += " (its agent publishes no MAC: RoCE v1 frames need root and an Ethernet interface, not loopback)"
		}
		return records.Uplink{}, why
	}
	return u, ""
}

// hosts returns the distinct hosts of a and b.
func hosts(a, b End) []records.Host {
	if a.Host.ID == b.Host.ID {
		return []records.Host{a.Host}
	}
	return []records.Host{a.Host, b.Host}
}

func stateWord(s records.HostState) string {
	if s == "" {
		return "in no known state"
	}
	return string(s)
}

// less orders ends canonically: by host ID, then name, then port group.
func less(a, b End) bool {
	return cmp.Or(
		cmp.Compare(a.Host.ID, b.Host.ID),
		cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.PortGroup.Key, b.PortGroup.Key),
	) < 0
}
