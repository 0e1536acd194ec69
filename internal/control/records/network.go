// SPDX-License-Identifier: Apache-2.0

package records

// The RoCE network model (docs/network.md): what a switch's path selection needs
// to know of the Ethernet and IP network under it. RoCE v1 needs a
// lossless layer 2, RoCE v2 lossless layers 2 and 3: PFC on the RoCE
// priority (or global pause) on every uplink, the port group in a VLAN
// with PFC on, routers that map the priority to DSCP and keep DSCP (or
// copy PCP), no teamed RoCE NIC, and an MTU that fits. Package netcheck
// turns this model into named checks; package pathsel obeys them.
//
// Everything here is a declaration or an observation, never a command: a
// port group's settings and a router's behaviour are what the operator
// says they are; an uplink's NIC state is what the kernel reports
// (Uplink.Observed) or, where it cannot, what the operator declares
// (Uplink.Declared).

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Limits on the network model.
const (
	// MaxRouters is the most routers a switch may declare.
	MaxRouters = 64
	// MaxRouterSubnets is the most subnets one router may join.
	MaxRouterSubnets = 16
	// MinNICMTU and MaxNICMTU bound a NIC's MTU: IPv4's minimum, and the
	// loopback interface's 64 KiB.
	MinNICMTU, MaxNICMTU = 68, 65536
	// MaxRouterMTU is the largest router MTU accepted.
	MaxRouterMTU = 65535
	// MaxUnknownWhy bounds each explanation in NICState.Unknown.
	MaxUnknownWhy = 512
)

// RoCEMTUs are the RoCE (InfiniBand) MTUs a port group may ask for.
var RoCEMTUs = [...]int{256, 512, 1024, 2048, 4096}

// ---- NetworkPolicy ---------------------------------------------------------

// NetworkPolicy is how a switch's path selection obeys the RoCE network
// checks (package netcheck).
type NetworkPolicy string

// Network policies.
const (
	// NetworkStrict: rdma between two hosts only when every check of the
	// pair passes; a check whose state is unknown counts as failed. The
	// default (an empty policy means strict).
	NetworkStrict NetworkPolicy = "strict"
	// NetworkWarn: rdma even when a check fails; the decision's reason
	// carries the failures as warnings.
	NetworkWarn NetworkPolicy = "warn"
	// NetworkOff: no checks.
	NetworkOff NetworkPolicy = "off"
)

// Effective returns p, or NetworkStrict for the empty policy.
func (p NetworkPolicy) Effective() NetworkPolicy {
	if p == "" {
		return NetworkStrict
	}
	return p
}

// ParseNetworkPolicy parses "strict", "warn" or "off".
func ParseNetworkPolicy(s string) (NetworkPolicy, error) {
	switch p := NetworkPolicy(s); p {
	case NetworkStrict, NetworkWarn, NetworkOff:
		return p, nil
	}
	return "", fmt.Errorf("network policy %q is not \"strict\", \"warn\" or \"off\"", s)
}

// ---- PrioritySet -----------------------------------------------------------

// PrioritySet is a set of 802.1Q priorities (PCP 0–7): bit i is priority
// i, as the kernel's struct ieee_pfc holds PFC's enabled priorities
// (pfc_en). In JSON it is a list of priorities, [3] or [3, 4]; [] is the
// empty set.
type PrioritySet uint8

// PrioritiesOf returns the set of priorities ps (each 0–7).
func PrioritiesOf(ps ...int) PrioritySet {
	var s PrioritySet
	for _, p := range ps {
		if p >= 0 && p <= MaxPFCPriority {
			s |= 1 << p
		}
	}
	return s
}

// Has reports whether priority p is in the set.
func (s PrioritySet) Has(p int) bool { return p >= 0 && p <= MaxPFCPriority && s&(1<<p) != 0 }

// List returns the priorities in the set, in ascending order.
func (s PrioritySet) List() []int {
	out := []int{}
	for p := range MaxPFCPriority + 1 {
		if s.Has(p) {
			out = append(out, p)
		}
	}
	return out
}

// String returns the priorities separated by commas, "3,4", or "none".
func (s PrioritySet) String() string {
	if s == 0 {
		return "none"
	}
	var b []string
	for _, p := range s.List() {
		b = append(b, strconv.Itoa(p))
	}
	return strings.Join(b, ",")
}

// ParsePrioritySet parses what String returns: "3", "3,4" or "none".
func ParsePrioritySet(s string) (PrioritySet, error) {
	if s == "none" {
		return 0, nil
	}
	var set PrioritySet
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || p < 0 || p > MaxPFCPriority {
			return 0, fmt.Errorf("priorities %q: %q is not a priority 0–7 (write e.g. 3 or 3,4, or none)", s, f)
		}
		set |= 1 << p
	}
	return set, nil
}

// MarshalJSON writes the set as a list of priorities.
func (s PrioritySet) MarshalJSON() ([]byte, error) { return json.Marshal(s.List()) }

// UnmarshalJSON reads a list of priorities, each 0–7.
func (s *PrioritySet) UnmarshalJSON(b []byte) error {
	var ps []int
	if err := json.Unmarshal(b, &ps); err != nil {
		return fmt.Errorf("priorities: want a list of priorities 0–7, such as [3]: %v", err)
	}
	var set PrioritySet
	for _, p := range ps {
		if p < 0 || p > MaxPFCPriority {
			return fmt.Errorf("priorities: %d is not a priority 0–7", p)
		}
		set |= 1 << p
	}
	*s = set
	return nil
}

// ---- Pause, Trust ------------------------------------------------------------

// Pause is a NIC's 802.3x global pause: whether it honours pause frames
// it receives (RX) and sends them when its buffers fill (TX). Global pause
// makes the whole link lossless, every priority at once.
type Pause struct {
	RX bool `json:"rx"`
	TX bool `json:"tx"`
}

// String returns "rx,tx", "rx", "tx" or "off".
func (p Pause) String() string {
	switch {
	case p.RX && p.TX:
		return "rx,tx"
	case p.RX:
		return "rx"
	case p.TX:
		return "tx"
	}
	return "off"
}

// ParsePause parses what String returns ("tx,rx" too).
func ParsePause(s string) (Pause, error) {
	var p Pause
	if s == "off" {
		return p, nil
	}
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "rx":
			p.RX = true
		case "tx":
			p.TX = true
		default:
			return Pause{}, fmt.Errorf("pause %q: want rx,tx, rx, tx or off", s)
		}
	}
	return p, nil
}

// Trust is which header a NIC takes a received packet's priority from.
type Trust string

// Trust modes.
const (
	TrustPCP  Trust = "pcp"  // the 802.1Q PCP of tagged frames (the default of DCB NICs)
	TrustDSCP Trust = "dscp" // the IP header's DSCP, through the NIC's DSCP → priority map
)

// ParseTrust parses "pcp" or "dscp".
func ParseTrust(s string) (Trust, error) {
	switch t := Trust(s); t {
	case TrustPCP, TrustDSCP:
		return t, nil
	}
	return "", fmt.Errorf("trust %q is not \"pcp\" or \"dscp\"", s)
}

// ---- NICState ----------------------------------------------------------------

// The fields of NICState, as NICState.Unknown names them.
const (
	FieldPFC        = "pfc"
	FieldPause      = "pause"
	FieldTrust      = "trust"
	FieldMTU        = "mtu"
	FieldTeamed     = "teamed"
	FieldSoleUplink = "soleUplink"
)

var nicFields = []string{FieldPFC, FieldPause, FieldTrust, FieldMTU, FieldTeamed, FieldSoleUplink}

// NICState is the lossless-Ethernet state of an uplink's NIC. Every field
// is optional: nil, "" or 0 means not known (not reported, or not
// declared).
type NICState struct {
	// PFC is the set of priorities with priority flow control (802.1Qbb)
	// on, what `dcb pfc show` calls prio-pfc.
	PFC *PrioritySet `json:"pfc,omitempty"`
	// Pause is the NIC's 802.3x global pause.
	Pause *Pause `json:"pause,omitempty"`
	// Trust is which header selects a received packet's priority.
	Trust Trust `json:"trust,omitempty"`
	// MTU is the NIC's MTU (MinNICMTU..MaxNICMTU).
	MTU int `json:"mtu,omitempty"`
	// Teamed says whether the NIC is teamed: a member (or the master) of
	// a bond or team.
	Teamed *bool `json:"teamed,omitempty"`
	// Team names the bond or team the NIC is in, when Teamed.
	Team string `json:"team,omitempty"`
	// SoleUplink says whether the NIC is the host's only uplink on the
	// switch, RDMA or not (PVRDMA needs the HCA to be the switch's only
	// uplink). Only an operator can say; the kernel does not know the
	// switch.
	SoleUplink *bool `json:"soleUplink,omitempty"`
	// Unknown is, in observed state only, why the kernel reported no
	// value for a field: its answer, by field name (FieldPFC, ...).
	Unknown map[string]string `json:"unknown,omitempty"`
}

// IsZero reports whether s says nothing.
func (s NICState) IsZero() bool {
	return s.PFC == nil && s.Pause == nil && s.Trust == "" && s.MTU == 0 && s.Teamed == nil && s.Team == "" &&
		s.SoleUplink == nil && len(s.Unknown) == 0
}

func (c *checker) nicState(field string, s NICState, observed bool) {
	if s.MTU != 0 {
		c.rangeInt(field+".mtu", s.MTU, MinNICMTU, MaxNICMTU)
	}
	switch s.Trust {
	case "", TrustPCP, TrustDSCP:
	default:
		c.add(field+".trust", `%q is not "pcp" or "dscp"`, s.Trust)
	}
	if s.Team != "" {
		c.name_(field+".team", s.Team)
		if s.Teamed == nil || !*s.Teamed {
			c.add(field+".team", "%q names a team, but teamed is not true", s.Team)
		}
	}
	if len(s.Unknown) > 0 && !observed {
		c.add(field+".unknown", "only observed state says why a field is unknown")
	}
	for k, v := range s.Unknown {
		if !slices.Contains(nicFields, k) {
			c.add(field+".unknown", "%.32q is not a field (%s)", k, strings.Join(nicFields, ", "))
		}
		if len(v) > MaxUnknownWhy {
			c.add(field+".unknown."+k, "%d characters, more than %d", len(v), MaxUnknownWhy)
		}
	}
}

// ---- Router ------------------------------------------------------------------

// DSCPMapping is one entry of a router's priority ↔ DSCP map: it puts
// packets with DSCP into Priority (and, on tagged egress, marks them with
// it), and marks packets of Priority with DSCP.
type DSCPMapping struct {
	Priority int `json:"priority"` // 0..7
	DSCP     int `json:"dscp"`     // 0..63
}

// String returns "PRIORITY:DSCP".
func (m DSCPMapping) String() string { return fmt.Sprintf("%d:%d", m.Priority, m.DSCP) }

// ParseDSCPMapping parses "PRIORITY:DSCP", e.g. "3:26".
func ParseDSCPMapping(s string) (DSCPMapping, error) {
	p, d, ok := strings.Cut(s, ":")
	pi, err1 := strconv.Atoi(p)
	di, err2 := strconv.Atoi(d)
	if !ok || err1 != nil || err2 != nil || pi < 0 || pi > MaxPFCPriority || di < 0 || di > MaxDSCP {
		return DSCPMapping{}, fmt.Errorf("DSCP mapping %q: want PRIORITY:DSCP, priority 0–7 and DSCP 0–63, e.g. 3:26", s)
	}
	return DSCPMapping{Priority: pi, DSCP: di}, nil
}

// Router is a layer-3 hop the operator declares between hosts of a
// switch: it joins Subnets, and the uplinks whose addresses lie in
// different subnets reach each other through routers. What a router does
// with RoCE v2's priority is what its declaration says; what it does not
// declare it does not do.
type Router struct {
	Name string `json:"name"`
	// Subnets are the subnets the router joins (at least two), e.g.
	// "10.0.1.0/24".
	Subnets []netip.Prefix `json:"subnets"`
	// DSCPMap is the router's priority ↔ DSCP map.
	DSCPMap []DSCPMapping `json:"dscpMap,omitempty"`
	// DSCPPreserved says the router forwards packets with their DSCP
	// unchanged.
	DSCPPreserved bool `json:"dscpPreserved,omitempty"`
	// PCPCopied says the router copies the 802.1Q PCP of tagged packets
	// to the packets it forwards.
	PCPCopied bool `json:"pcpCopied,omitempty"`
	// MTU is the router's MTU on the path; 0 means the switch's.
	MTU int `json:"mtu,omitempty"`
}

// Maps reports whether the router maps priority p to DSCP d.
func (r Router) Maps(p, d int) bool {
	return slices.Contains(r.DSCPMap, DSCPMapping{Priority: p, DSCP: d})
}

func (c *checker) router(field string, r Router) {
	c.name_(field+".name", r.Name)
	switch {
	case len(r.Subnets) < 2:
		c.add(field+".subnets", "%d subnets: a router joins at least two (e.g. [\"10.0.1.0/24\", \"10.0.2.0/24\"])", len(r.Subnets))
	case len(r.Subnets) > MaxRouterSubnets:
		c.add(field+".subnets", "%d subnets, more than %d", len(r.Subnets), MaxRouterSubnets)
	}
	for i, p := range r.Subnets {
		f := fmt.Sprintf("%s.subnets[%d]", field, i)
		switch {
		case !p.IsValid():
			c.add(f, "missing (a subnet such as 10.0.1.0/24)")
		case p.Addr().Zone() != "" || p.Addr().Is4In6():
			c.add(f, "%s: write IPv4 subnets as a.b.c.d/n and IPv6 ones without a zone", p)
		case p != p.Masked():
			c.add(f, "%s has host bits set: write %s", p, p.Masked())
		case slices.Contains(r.Subnets[:i], p):
			c.add(f, "%s is listed twice", p)
		}
	}
	if len(r.DSCPMap) > MaxDSCP+1 {
		c.add(field+".dscpMap", "%d entries, more than %d", len(r.DSCPMap), MaxDSCP+1)
	}
	for i, m := range r.DSCPMap {
		f := fmt.Sprintf("%s.dscpMap[%d]", field, i)
		c.rangeInt(f+".priority", m.Priority, 0, MaxPFCPriority)
		c.rangeInt(f+".dscp", m.DSCP, 0, MaxDSCP)
		if slices.ContainsFunc(r.DSCPMap[:i], func(o DSCPMapping) bool { return o.DSCP == m.DSCP }) {
			c.add(f+".dscp", "DSCP %d is mapped twice (a DSCP maps to one priority)", m.DSCP)
		}
	}
	if r.MTU != 0 {
		c.rangeInt(field+".mtu", r.MTU, MinMTU, MaxRouterMTU)
	}
}

func (c *checker) network(s Switch) {
	switch s.NetworkPolicy {
	case "", NetworkStrict, NetworkWarn, NetworkOff:
	default:
		c.add("networkPolicy", `%q is not "strict", "warn" or "off"`, s.NetworkPolicy)
	}
	if len(s.Routers) > MaxRouters {
		c.add("routers", "%d routers, more than %d", len(s.Routers), MaxRouters)
	}
	for i, r := range s.Routers {
		c.router(fmt.Sprintf("routers[%d]", i), r)
		if slices.ContainsFunc(s.Routers[:i], func(o Router) bool { return o.Name == r.Name }) {
			c.add(fmt.Sprintf("routers[%d].name", i), "router %q is declared twice", r.Name)
		}
	}
}

// RouterIndex returns the index of router name in s.Routers, or -1.
func (s Switch) RouterIndex(name string) int {
	return slices.IndexFunc(s.Routers, func(r Router) bool { return r.Name == name })
}

// ---- Uplinks -------------------------------------------------------------------

// Name returns how messages name the uplink: its device, or its address
// when it has none.
func (u Uplink) Name() string {
	if u.Device != "" {
		return u.Device
	}
	return u.Address.String()
}

// SameUplink reports whether a and b are the same uplink of a host: the
// same device, or, when either has none, the same address.
func SameUplink(a, b Uplink) bool {
	if a.Device != "" && b.Device != "" {
		return a.Device == b.Device
	}
	return a.Address.IsValid() && a.Address == b.Address
}

// ErrNoSuchUplink: a host has no uplink of that name.
var ErrNoSuchUplink = errors.New("no such uplink")

// UplinkIndex returns the index in h.Uplinks of the uplink named ref (its
// device, or its address), or an error that lists the host's uplinks.
func (h Host) UplinkIndex(ref string) (int, error) {
	var at []int
	for i, u := range h.Uplinks {
		if u.Device == ref || u.Address.String() == ref {
			at = append(at, i)
		}
	}
	switch len(at) {
	case 1:
		return at[0], nil
	case 0:
		var names []string
		for _, u := range h.Uplinks {
			names = append(names, u.Name())
		}
		if len(names) == 0 {
			return -1, fmt.Errorf("%w: host %s has no RDMA uplink (its agent's --rdma-uplink adds one)", ErrNoSuchUplink, h.label())
		}
		return -1, fmt.Errorf("%w: host %s has no uplink %q (its uplinks: %s)", ErrNoSuchUplink, h.label(), ref, strings.Join(names, ", "))
	}
	return -1, fmt.Errorf("host %s has %d uplinks named %q: name one by its address", h.label(), len(at), ref)
}
