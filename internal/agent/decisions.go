// SPDX-License-Identifier: Apache-2.0

package agent

// Path decision counters (mgmt.PathDecisionCount): every path the agent
// decides, for a QP moving to RTR (Route) and for an address handle
// (RouteAH), counted by the path chosen or, when it chose none, by the
// rule or cause that refused; and the targets of connects it refused
// before any QP moved (resolveConnect, object "connect"). Refusals carry
// their reason (refusal) from where they are decided to where they are
// counted; the workload sees the *abi.Error inside.

import (
	"errors"
	"sort"
	"strings"
	"sync"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/device"
)

// Reasons of a refusal that no rule of path selection names.
const (
	reasonAddressUnique    = "address_unique"     // rule address-unique: the adapter's address is another's too, or not checked yet
	reasonSameHost         = "same_host_decision" // rule same-host-decision: two adapters of this host whose path cannot be decided
	reasonNotAttached      = "not_attached"       // the remote adapter is published on this host but not attached
	reasonPathUnavailable  = "path_unavailable"   // path selection chose a path this agent does not run (yet)
	reasonNoControlPlane   = "no_control_plane"   // the remote adapter is not on this host, and this agent runs standalone
	reasonControlPlaneDown = "unavailable"        // the control plane did not answer
)

// policyReasons are path selection's refusals (its errors) and their
// reasons.
var policyReasons = []struct {
	err    error
	reason string
}{
	{pathsel.ErrDifferentSwitch, "different_switch"},
	{pathsel.ErrVLANIsolation, "vlan_isolation"},
	{pathsel.ErrHostDown, "host_down"},
	{pathsel.ErrNotOnSwitch, "not_on_switch"},
	{pathsel.ErrNoPath, "no_path"},
}

// policyReason is the reason of err, a refusal by path selection; ""
// when err is none (a failed lookup, say).
func policyReason(err error) string {
	for _, p := range policyReasons {
		if errors.Is(err, p.err) {
			return p.reason
		}
	}
	return ""
}

// refusal is an error of a path decision with its reason for the
// counters. It wraps the *abi.Error the workload gets (errors.As finds
// it).
type refusal struct {
	reason string
	err    *abi.Error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// refusedBy returns e as a refusal for reason.
func refusedBy(reason string, e *abi.Error) error { return &refusal{reason, e} }

// reasonOf is the reason of err, a failed decision: its refusal's, else
// its error code's (snake_case), else "error".
func reasonOf(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.reason
	}
	var ae *abi.Error
	if errors.As(err, &ae) {
		return strings.ReplaceAll(ae.Code, "-", "_")
	}
	return "error"
}

// decisionKey is one counter: an object's path or refusal reason.
type decisionKey struct{ object, path, reason string }

// decisions counts an agent's path decisions.
type decisions struct {
	mu sync.Mutex
	// +checklocks:mu
	n map[decisionKey]uint64
}

// count counts a decision for object ("qp", "ah", "connect"): path when err is nil,
// else a refusal for err's reason.
func (d *decisions) count(object string, path abi.PathKind, err error) {
	k := decisionKey{object: object, path: string(path)}
	if err != nil {
		k = decisionKey{object: object, reason: reasonOf(err)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[decisionKey]uint64{}
	}
	d.n[k]++
}

// status returns the counters, in a stable order.
func (d *decisions) status() []mgmt.PathDecisionCount {
	d.mu.Lock()
	out := make([]mgmt.PathDecisionCount, 0, len(d.n))
	for k, n := range d.n {
		out = append(out, mgmt.PathDecisionCount{Object: k.object, Path: k.path, Reason: k.reason, Count: n})
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Object != b.Object {
			return a.Object < b.Object
		}
		if a.Path != b.Path {
			return a.Path > b.Path // chosen paths before refusals
		}
		return a.Reason < b.Reason
	})
	return out
}

// Route decides the path of q to the remote end (dgid, dqpn): the device
// calls it when q moves from INIT to RTR (route.go). The decision is
// counted.
func (a *Agent) Route(q *device.QP, dgid abi.GID, dqpn uint32) (device.Route, error) {
	r, err := a.route(q, dgid, dqpn)
	a.decisions.count("qp", r.Info.Path, err)
	return r, err
}

// RouteAH decides how datagrams from adapter from reach the adapter with
// GID dgid: the path a connection between them would take (ud.go). The
// decision is counted.
func (a *Agent) RouteAH(from *device.Adapter, dgid abi.GID) (device.DatagramPath, abi.PathInfo, error) {
	p, info, err := a.routeAH(from, dgid)
	a.decisions.count("ah", info.Path, err)
	return p, info, err
}
