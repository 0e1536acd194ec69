// SPDX-License-Identifier: Apache-2.0

// Package netcheck checks a RoCE network against what RoCE requires
// (docs/network.md, "The checks"): RoCE v1 needs a lossless
// layer 2, RoCE v2 lossless layers 2 and 3; lossless layer 2 comes from
// PFC on the 802.1Q priority of a VLAN, or from global pause; routers map
// the priority to DSCP and keep DSCP unchanged (or copy PCP on tagged
// packets); RoCE NICs are not teamed; and the path's MTU must carry the
// RoCE MTU.
//
// Each requirement is a named check with a stable ID (the Check*
// constants), and every check of one subject gives a Result: pass, fail or
// unknown, a detail that names what was looked at, and a fix. Unknown
// means the state that decides the check is neither reported by the
// kernel (records.Uplink.Observed) nor declared by the operator
// (records.Uplink.Declared); its fix says what to declare.
//
// The package is pure: it reads records (package records) and returns
// results, with no I/O. Package pathsel calls Pair for the two ends of a
// prospective rdma path; vrdmactl network check calls Check for a whole
// network, read from the control plane (with the local host's NIC state
// from package nicstate) or from a file (package netfile). Nothing here
// imports pathsel.
package netcheck

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vrdma/vrdma/internal/control/records"
)

// Status is a check's outcome.
type Status string

// Outcomes.
const (
	Pass    Status = "pass"
	Fail    Status = "fail"
	Unknown Status = "unknown" // the deciding state is neither reported nor declared
)

// The checks, by stable ID.
const (
	// CheckL2Lossless: PFC on the RoCE priority, or global pause (rx and
	// tx), on every uplink on the path.
	CheckL2Lossless = "roce-l2-lossless"
	// CheckVLANPFC: the port group is in a VLAN, and PFC is on for its
	// priority on the uplinks (and a RoCE v1 uplink trusts PCP: v1 frames
	// carry no DSCP).
	CheckVLANPFC = "roce-vlan-pfc"
	// CheckL3Lossless: across routers, RoCE v2 only, and at every hop the
	// priority maps to the port group's DSCP and DSCP is preserved, or
	// PCP is copied from tagged packets.
	CheckL3Lossless = "roce-l3-lossless"
	// CheckNoTeaming: the RDMA uplink is not teamed (bond or team), and
	// is the host's only uplink on the switch.
	CheckNoTeaming = "roce-no-teaming"
	// CheckMTU: the path's MTU carries the port group's RoCE MTU.
	CheckMTU = "roce-mtu"
)

// Checks lists every check, in the order Pair runs them on one path.
var Checks = [...]string{CheckL2Lossless, CheckVLANPFC, CheckNoTeaming, CheckL3Lossless, CheckMTU}

// RoCEOverhead is what Linux subtracts from a NIC's MTU to get the
// largest RoCE MTU it carries (iboe_get_mtu, include/rdma/ib_addr.h): GRH
// 40, UDP 8, BTH 12, XRC 4, AtomicETH 28 and ICRC 4 bytes.
const RoCEOverhead = 96

// MaxRoCEMTU returns the largest RoCE MTU (records.RoCEMTUs) a network MTU
// of mtu carries, 0 if none: MTU 1500 carries 1024, 9000 carries 4096.
func MaxRoCEMTU(mtu int) int {
	for _, m := range slices.Backward(records.RoCEMTUs[:]) {
		if m+RoCEOverhead <= mtu {
			return m
		}
	}
	return 0
}

// Result is the outcome of one check of one subject.
type Result struct {
	Check     string `json:"check"`               // a Check* ID
	Status    Status `json:"status"`              // pass, fail or unknown
	Switch    string `json:"switch"`              // the switch checked
	PortGroup string `json:"portGroup,omitempty"` // the port group checked, if the check depends on one
	// Subject is what was checked, for people: "uplink eth1 of host
	// esx2", "hosts esx1 and esx2".
	Subject string `json:"subject"`
	// Hosts are the names of the hosts checked (one, or the two of a
	// path), for programs.
	Hosts  []string `json:"hosts"`
	Detail string   `json:"detail"`        // what was found, and where it comes from
	Fix    string   `json:"fix,omitempty"` // what to change or declare; "" when the check passes
}

// String returns "roce-l2-lossless failed: DETAIL", and for an unknown
// result "roce-mtu unknown: DETAIL: FIX", which says what to declare.
func (r Result) String() string {
	switch r.Status {
	case Pass:
		return r.Check + " passed: " + r.Detail
	case Fail:
		return r.Check + " failed: " + r.Detail
	}
	if r.Fix == "" {
		return r.Check + " " + string(r.Status) + ": " + r.Detail
	}
	return r.Check + " " + string(r.Status) + ": " + r.Detail + ": " + r.Fix
}

// Failing returns the results that did not pass (failed or unknown), in
// order.
func Failing(rs []Result) []Result {
	var out []Result
	for _, r := range rs {
		if r.Status != Pass {
			out = append(out, r)
		}
	}
	return out
}

// End is one host of a path with the RDMA uplink it uses on the switch.
type End struct {
	Host   records.Host
	Uplink records.Uplink
}

// hostRef names h as vrdmactl takes it: its name, or its ID.
func hostRef(h records.Host) string {
	if h.Name != "" {
		return h.Name
	}
	return h.ID
}

func (e End) label() string {
	return fmt.Sprintf("uplink %s of host %s", e.Uplink.Name(), hostRef(e.Host))
}

// declare returns the vrdmactl command that declares flags for e's uplink.
func (e End) declare(flags string) string {
	return fmt.Sprintf("vrdmactl host uplink declare %s %s %s", hostRef(e.Host), e.Uplink.Name(), flags)
}

// Pair runs every check of an rdma path between ends a and b for port
// group pg on switch sw: Uplink on each end, then Path.
func Pair(sw records.Switch, pg records.PortGroup, a, b End) []Result {
	out := Uplink(sw, pg, a)
	out = append(out, Uplink(sw, pg, b)...)
	return append(out, Path(sw, pg, a, b)...)
}

// Uplink runs the checks of one end's uplink for port group pg on switch
// sw: roce-l2-lossless, roce-vlan-pfc and roce-no-teaming.
func Uplink(sw records.Switch, pg records.PortGroup, e End) []Result {
	v := viewOf(e.Uplink)
	return []Result{l2Lossless(sw, pg, e, v), vlanPFC(sw, pg, e, v), noTeaming(sw, e, v)}
}

// Path runs the checks of what lies between ends a and b for port group
// pg on switch sw: roce-l3-lossless and roce-mtu.
func Path(sw records.Switch, pg records.PortGroup, a, b End) []Result {
	return []Result{l3Lossless(sw, pg, a, b), pathMTU(sw, pg, a, b)}
}

// ---- the state an uplink is checked against ----------------------------------

// known is one field of an uplink's effective NIC state: the kernel's
// report if any, else the operator's declaration.
type known[T any] struct {
	v   T
	src string // "reported by the kernel", "declared"; "" when unknown
	why string // when unknown: the kernel's answer, if it gave one
}

func (k known[T]) ok() bool { return k.src != "" }

const (
	srcKernel   = "reported by the kernel"
	srcDeclared = "declared"
)

func pick[T any](obs, decl *T, why string) known[T] {
	switch {
	case obs != nil:
		return known[T]{v: *obs, src: srcKernel}
	case decl != nil:
		return known[T]{v: *decl, src: srcDeclared}
	}
	var zero T
	return known[T]{v: zero, why: why}
}

func nonZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// view is an uplink's effective NIC state.
type view struct {
	pfc    known[records.PrioritySet]
	pause  known[records.Pause]
	trust  known[records.Trust]
	mtu    known[int]
	teamed known[bool]
	team   string
	sole   known[bool]
}

func viewOf(u records.Uplink) view {
	o, d := u.Observed, u.Declared
	v := view{
		pfc:    pick(o.PFC, d.PFC, o.Unknown[records.FieldPFC]),
		pause:  pick(o.Pause, d.Pause, o.Unknown[records.FieldPause]),
		trust:  pick(nonZero(o.Trust), nonZero(d.Trust), o.Unknown[records.FieldTrust]),
		mtu:    pick(nonZero(o.MTU), nonZero(d.MTU), o.Unknown[records.FieldMTU]),
		teamed: pick(o.Teamed, d.Teamed, o.Unknown[records.FieldTeamed]),
		sole:   pick(o.SoleUplink, d.SoleUplink, ""),
	}
	v.team = d.Team
	if v.teamed.src == srcKernel {
		v.team = o.Team
	}
	return v
}

// unknownWhy says why field (e.g. "PFC") of e's uplink is unknown.
func unknownWhy[T any](e End, field string, k known[T]) string {
	if k.why != "" {
		return fmt.Sprintf("the kernel cannot report the %s of %s (%s), and none is declared", field, e.label(), k.why)
	}
	return fmt.Sprintf("the %s of %s is neither reported by its host's kernel nor declared", field, e.label())
}

func result(check string, sw records.Switch, pg string, e End, st Status, detail, fix string) Result {
	return Result{Check: check, Status: st, Switch: sw.Name, PortGroup: pg, Subject: e.label(), Hosts: []string{hostRef(e.Host)}, Detail: detail, Fix: fix}
}

// ---- roce-l2-lossless ----------------------------------------------------------

func l2Lossless(sw records.Switch, pg records.PortGroup, e End, v view) Result {
	prio := pg.PFCPriority
	res := func(st Status, detail, fix string) Result {
		return result(CheckL2Lossless, sw, pg.Key, e, st, detail, fix)
	}
	if v.pfc.ok() && v.pfc.v.Has(prio) {
		return res(Pass, fmt.Sprintf("PFC on priority %d on %s (%s)", prio, e.label(), v.pfc.src), "")
	}
	if v.pause.ok() && v.pause.v.RX && v.pause.v.TX {
		return res(Pass, fmt.Sprintf("global pause rx and tx on %s (%s)", e.label(), v.pause.src), "")
	}
	enable := fmt.Sprintf("enable PFC on priority %d (dcb pfc set dev %s prio-pfc %d:on) or global pause (ethtool -A %s rx on tx on) on %s",
		prio, e.Uplink.Name(), prio, e.Uplink.Name(), e.label())
	var pfc, pause string
	var fix []string
	if v.pfc.ok() {
		pfc = fmt.Sprintf("PFC not enabled for priority %d on %s (PFC priorities %s, %s)", prio, e.label(), v.pfc.v, v.pfc.src)
	} else {
		pfc = unknownWhy(e, "PFC", v.pfc)
		fix = append(fix, "--pfc PRIORITIES")
	}
	if v.pause.ok() {
		pause = fmt.Sprintf("global pause is %s (%s)", pauseWord(v.pause.v), v.pause.src)
	} else {
		pause = unknownWhy(e, "global pause", v.pause)
		fix = append(fix, "--pause rx,tx|off")
	}
	if len(fix) == 0 {
		return res(Fail, pfc+", and "+pause, enable)
	}
	return res(Unknown, pfc+"; "+pause, "declare what the NIC does: "+e.declare(strings.Join(fix, " ")))
}

func pauseWord(p records.Pause) string {
	switch p.String() {
	case "rx":
		return "rx only"
	case "tx":
		return "tx only"
	}
	return p.String()
}

// ---- roce-vlan-pfc ----------------------------------------------------------------

func vlanPFC(sw records.Switch, pg records.PortGroup, e End, v view) Result {
	prio := pg.PFCPriority
	res := func(st Status, detail, fix string) Result {
		return result(CheckVLANPFC, sw, pg.Key, e, st, detail, fix)
	}
	if pg.VLAN == 0 {
		return res(Fail, fmt.Sprintf("port group %s is untagged (VLAN 0): PFC acts on the priority (PCP) of 802.1Q-tagged frames, and RoCE runs in a VLAN with PFC on", pg.Key),
			fmt.Sprintf("put port group %s in a VLAN: vrdmactl portgroup set %s --vlan N", pg.Key, pg.Key))
	}
	if pg.RoCEVersion == records.RoCEv1 && v.trust.ok() && v.trust.v == records.TrustDSCP {
		return res(Fail, fmt.Sprintf("%s trusts DSCP (%s), but RoCE v1 frames have no IP header: they would lose priority %d", e.label(), v.trust.src, prio),
			fmt.Sprintf("trust PCP on %s (dcb apptrust set dev %s order pcp), then declare it: %s", e.label(), e.Uplink.Name(), e.declare("--trust pcp")))
	}
	switch {
	case !v.pfc.ok():
		return res(Unknown, unknownWhy(e, "PFC", v.pfc), "declare the PFC priorities: "+e.declare(fmt.Sprintf("--pfc %d", prio)))
	case !v.pfc.v.Has(prio):
		return res(Fail, fmt.Sprintf("PFC not enabled for priority %d on %s, in VLAN %d of port group %s (PFC priorities %s, %s)", prio, e.label(), pg.VLAN, pg.Key, v.pfc.v, v.pfc.src),
			fmt.Sprintf("enable PFC on priority %d on %s (dcb pfc set dev %s prio-pfc %d:on)", prio, e.label(), e.Uplink.Name(), prio))
	}
	detail := fmt.Sprintf("VLAN %d of port group %s has PFC on priority %d on %s (%s)", pg.VLAN, pg.Key, prio, e.label(), v.pfc.src)
	if v.trust.ok() && v.trust.v == records.TrustDSCP {
		detail += fmt.Sprintf("; the NIC trusts DSCP: it must map DSCP %d to priority %d (dcb app)", pg.DSCP, prio)
	}
	return res(Pass, detail, "")
}

// ---- roce-no-teaming --------------------------------------------------------------

func noTeaming(sw records.Switch, e End, v view) Result {
	res := func(st Status, detail, fix string) Result {
		return result(CheckNoTeaming, sw, "", e, st, detail, fix)
	}
	if n := len(e.Host.Uplinks); n > 1 && sw.UplinkPolicy != records.UplinkFailover {
		return res(Fail, fmt.Sprintf("host %s has %d RDMA uplinks on switch %s, whose uplink policy is %q: PVRDMA does not support teaming", hostRef(e.Host), n, sw.Name, sw.UplinkPolicy),
			fmt.Sprintf("give host %s one RDMA uplink on switch %s, or an explicit failover order (uplink policy \"failover\")", hostRef(e.Host), sw.Name))
	}
	if v.teamed.ok() && v.teamed.v {
		team := ""
		if v.team != "" {
			team = " in " + v.team
		}
		return res(Fail, fmt.Sprintf("%s is teamed%s (%s): PVRDMA does not support NIC teaming", e.label(), team, v.teamed.src),
			fmt.Sprintf("take %s out of its bond or team, and give RoCE a NIC of its own", e.Uplink.Name()))
	}
	if v.sole.ok() && !v.sole.v {
		return res(Fail, fmt.Sprintf("%s is not host %s's only uplink on switch %s (%s): the RDMA uplink must be the switch's only uplink", e.label(), hostRef(e.Host), sw.Name, v.sole.src),
			fmt.Sprintf("remove host %s's other uplinks from switch %s", hostRef(e.Host), sw.Name))
	}
	if !v.teamed.ok() {
		return res(Unknown, unknownWhy(e, "team membership", v.teamed), "declare it: "+e.declare("--teamed no"))
	}
	return res(Pass, fmt.Sprintf("%s is not teamed (%s)", e.label(), v.teamed.src), "")
}

// ---- roce-l3-lossless --------------------------------------------------------------

func pathResult(check string, sw records.Switch, pg records.PortGroup, a, b End, st Status, detail, fix string) Result {
	return Result{Check: check, Status: st, Switch: sw.Name, PortGroup: pg.Key,
		Subject: fmt.Sprintf("hosts %s and %s", hostRef(a.Host), hostRef(b.Host)), Hosts: []string{hostRef(a.Host), hostRef(b.Host)},
		Detail: detail, Fix: fix}
}

func l3Lossless(sw records.Switch, pg records.PortGroup, a, b End) Result {
	res := func(st Status, detail, fix string) Result {
		return pathResult(CheckL3Lossless, sw, pg, a, b, st, detail, fix)
	}
	r := routeOf(sw.Routers, a.Uplink.Address, b.Uplink.Address)
	switch {
	case r.unknown != "":
		return res(Unknown, fmt.Sprintf("%s and %s: %s", a.label(), b.label(), r.unknown),
			fmt.Sprintf("declare the routers between them and the subnets they join: vrdmactl switch router set %s NAME --subnet A --subnet B", sw.Name))
	case len(r.hops) == 0:
		where := "no router is declared between them"
		if r.a.IsValid() {
			where = "both in subnet " + r.a.String()
		}
		return res(Pass, fmt.Sprintf("%s and %s are on one layer-2 segment (%s): no layer-3 hop", a.label(), b.label(), where), "")
	case pg.RoCEVersion != records.RoCEv2:
		return res(Fail, fmt.Sprintf("RoCE %s is not routable, and %s (subnet %s) and %s (subnet %s) are joined by %s", pg.RoCEVersion, a.label(), r.a, b.label(), r.b, routerNames(r.hops)),
			fmt.Sprintf("put both uplinks on one layer-2 segment, or make port group %s RoCE v2 (vrdmactl portgroup set %s --roce-version v2)", pg.Key, pg.Key))
	}
	var bad []string
	first := ""
	for _, h := range r.hops {
		okDSCP := h.DSCPPreserved && h.Maps(pg.PFCPriority, pg.DSCP)
		okPCP := h.PCPCopied && pg.VLAN != 0
		if okDSCP || okPCP {
			continue
		}
		var why []string
		if !h.Maps(pg.PFCPriority, pg.DSCP) {
			why = append(why, fmt.Sprintf("does not map priority %d to DSCP %d%s", pg.PFCPriority, pg.DSCP, mapText(h)))
		}
		if !h.DSCPPreserved {
			why = append(why, "does not preserve DSCP")
		}
		switch {
		case !h.PCPCopied:
			why = append(why, "does not copy PCP")
		case pg.VLAN == 0:
			why = append(why, fmt.Sprintf("copies PCP, but port group %s is untagged", pg.Key))
		}
		bad = append(bad, fmt.Sprintf("router %s %s", h.Name, strings.Join(why, ", ")))
		first = cmp.Or(first, h.Name)
	}
	if len(bad) > 0 {
		return res(Fail, fmt.Sprintf("between %s and %s, %s", a.label(), b.label(), strings.Join(bad, "; ")),
			fmt.Sprintf("configure each of these routers to map priority %d to DSCP %d and leave DSCP unchanged (or to copy the PCP of tagged packets), then declare it: vrdmactl switch router set %s %s --dscp-map %d:%d --dscp-preserved on",
				pg.PFCPriority, pg.DSCP, sw.Name, first, pg.PFCPriority, pg.DSCP))
	}
	return res(Pass, fmt.Sprintf("%s between %s and %s keep priority %d lossless (DSCP %d preserved, or PCP copied)", routerNames(r.hops), a.label(), b.label(), pg.PFCPriority, pg.DSCP), "")
}

func mapText(r records.Router) string {
	if len(r.DSCPMap) == 0 {
		return " (it maps none)"
	}
	var m []string
	for _, e := range r.DSCPMap {
		m = append(m, e.String())
	}
	return " (its map: " + strings.Join(m, ", ") + ")"
}

func routerNames(rs []records.Router) string {
	var n []string
	for _, r := range rs {
		n = append(n, r.Name)
	}
	if len(n) == 1 {
		return "router " + n[0]
	}
	return "routers " + strings.Join(n, ", ")
}

// route is the layer-3 path between two uplink addresses.
type route struct {
	a, b    netip.Prefix     // the declared subnets of the two addresses (invalid: in none)
	hops    []records.Router // the routers on every shortest path, by name
	unknown string           // why the path is not known
}

// routeOf finds the routers between addresses a and b: each address is in
// the most specific subnet any router declares (or in none); addresses in
// the same subnet, or both in none, have no hop between them; otherwise
// the hops are every router on a shortest chain of routers joining the
// two subnets (traffic may take any of them).
func routeOf(routers []records.Router, a, b netip.Addr) route {
	a, b = a.Unmap(), b.Unmap()
	var r route
	r.a, r.b = subnetOf(routers, a), subnetOf(routers, b)
	switch {
	case r.a == r.b:
		return r
	case !r.a.IsValid() || !r.b.IsValid():
		lost, other, in := a, b, r.b
		if r.a.IsValid() {
			lost, other, in = b, a, r.a
		}
		r.unknown = fmt.Sprintf("%s is in no subnet of a declared router, while %s is in %s", lost, other, in)
		return r
	}
	// Breadth-first over subnets, from each end.
	da, db := distances(routers, r.a), distances(routers, r.b)
	d, ok := da[r.b]
	if !ok {
		r.unknown = fmt.Sprintf("no chain of declared routers joins subnets %s and %s", r.a, r.b)
		return r
	}
	for _, rt := range routers {
		if slices.ContainsFunc(r.hops, func(o records.Router) bool { return o.Name == rt.Name }) {
			continue
		}
	edges:
		for _, u := range rt.Subnets {
			for _, v := range rt.Subnets {
				du, okU := da[u]
				dv, okV := db[v]
				if u != v && okU && okV && du+1+dv == d {
					r.hops = append(r.hops, rt)
					break edges
				}
			}
		}
	}
	slices.SortFunc(r.hops, func(x, y records.Router) int { return strings.Compare(x.Name, y.Name) })
	return r
}

// subnetOf returns the most specific router subnet holding a.
func subnetOf(routers []records.Router, a netip.Addr) netip.Prefix {
	var best netip.Prefix
	for _, rt := range routers {
		for _, p := range rt.Subnets {
			if p.Contains(a) && (!best.IsValid() || p.Bits() > best.Bits()) {
				best = p
			}
		}
	}
	return best
}

// distances returns how many routers separate each reachable subnet from
// from.
func distances(routers []records.Router, from netip.Prefix) map[netip.Prefix]int {
	dist := map[netip.Prefix]int{from: 0}
	for frontier := []netip.Prefix{from}; len(frontier) > 0; {
		var next []netip.Prefix
		for _, s := range frontier {
			for _, rt := range routers {
				if !slices.Contains(rt.Subnets, s) {
					continue
				}
				for _, o := range rt.Subnets {
					if _, seen := dist[o]; !seen {
						dist[o] = dist[s] + 1
						next = append(next, o)
					}
				}
			}
		}
		frontier = next
	}
	return dist
}

// ---- roce-mtu ------------------------------------------------------------------------

func pathMTU(sw records.Switch, pg records.PortGroup, a, b End) Result {
	res := func(st Status, detail, fix string) Result { return pathResult(CheckMTU, sw, pg, a, b, st, detail, fix) }
	want, wantWhy := pg.RoCEMTU, "port group "+pg.Key+"'s RoCE MTU"
	if want == 0 {
		want, wantWhy = MaxRoCEMTU(sw.MTU), fmt.Sprintf("the RoCE MTU of switch %s's MTU %d", sw.Name, sw.MTU)
	}
	// The smallest MTU on the path, where it is, and whence it is known.
	mtu, at, src := sw.MTU, "switch "+sw.Name, ""
	for _, e := range []End{a, b} {
		v := viewOf(e.Uplink)
		if v.mtu.ok() && v.mtu.v < mtu {
			mtu, at, src = v.mtu.v, e.label(), ", "+v.mtu.src
		}
	}
	for _, h := range routeOf(sw.Routers, a.Uplink.Address, b.Uplink.Address).hops {
		if h.MTU != 0 && h.MTU < mtu {
			mtu, at, src = h.MTU, "router "+h.Name, ", declared"
		}
	}
	got := MaxRoCEMTU(mtu)
	if got >= want && want > 0 {
		return res(Pass, fmt.Sprintf("path MTU %d (%s%s) carries RoCE MTU %d, %s", mtu, at, src, want, wantWhy), "")
	}
	return res(Fail, fmt.Sprintf("path MTU %d (%s%s) carries RoCE MTU %s at most, less than %d, %s", mtu, at, src, roceMTUText(got), want, wantWhy),
		fmt.Sprintf("raise the MTU at %s to at least %d, or lower port group %s's RoCE MTU (vrdmactl portgroup set %s --roce-mtu %s)",
			at, want+RoCEOverhead, pg.Key, pg.Key, roceMTUText(got)))
}

func roceMTUText(m int) string {
	if m == 0 {
		return "none"
	}
	return strconv.Itoa(m)
}
