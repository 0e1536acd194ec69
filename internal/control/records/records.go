// SPDX-License-Identifier: Apache-2.0

// Package records defines the typed records of vrdma's control plane — the
// distributed switch, its port groups, hosts with their RDMA uplinks, VMs,
// their adapters and the endpoint directory — with their validation and
// their keys in etcd. network.go holds the RoCE network model under a
// switch: its network policy and routers, the port groups' RoCE MTU, and
// each uplink's lossless-Ethernet state, declared and observed.
//
// The package is pure: it knows nothing of etcd. Package store encodes a
// record as a JSON object that carries the schema version and the kind
// ({"schema":1,"kind":"host",...}) and checks both, and Validate, when it
// reads one back.
//
// Every Validate reports every problem it finds, joined with errors.Join;
// each problem is a *FieldError that names the record, the field and what
// is allowed, and matches ErrInvalid with errors.Is.
//
// Records are plain values: safe to copy, not safe to mutate while another
// goroutine reads them (the cache hands out copies; slices inside a record
// it hands out must be treated as read-only).
package records

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Schema is the version of the record encoding this build reads and writes.
// A record with another schema version is reported and skipped.
const Schema = 1

// Kind names a type of record. It is stored in every record, next to the
// schema version, so a value under the wrong key is recognised as foreign.
type Kind string

// The kinds of record.
const (
	KindSwitch    Kind = "switch"
	KindPortGroup Kind = "portgroup"
	KindHost      Kind = "host"
	KindAlive     Kind = "alive"
	KindVM        Kind = "vm"
	KindAdapter   Kind = "adapter"
	KindEndpoint  Kind = "endpoint"
)

// Record is implemented by every record type (on the value, not the
// pointer).
type Record interface {
	// Kind returns the record's kind; it is the same for every value of a
	// type.
	Kind() Kind
	// Validate reports every problem of the record, joined; nil if none.
	Validate() error
}

// Limits on record values.
const (
	// MaxNameLen is the longest name (switch, port-group key and name, host
	// ID and name, VM) accepted.
	MaxNameLen = 64
	// MaxAdapters is the most PVRDMA adapters a VM may have (vSphere 7.0.2
	// and later).
	MaxAdapters = 10
	// MaxAdapterIndex is the largest N in an adapter name "vrdmaN". It
	// matches the sanity bound of package vmconfig: N is ethernetN's
	// number, so names may have gaps.
	MaxAdapterIndex = 9999
	// MaxVLAN is the largest VLAN ID; 0 means untagged.
	MaxVLAN = 4094
	// MaxPFCPriority is the largest PFC priority (802.1Q PCP).
	MaxPFCPriority = 7
	// MaxDSCP is the largest DSCP value.
	MaxDSCP = 63
	// MinMTU and MaxMTU bound a switch's MTU: IPv6's minimum, and the
	// largest MTU of a vSphere distributed switch.
	MinMTU, MaxMTU = 1280, 9000
	// MaxVMXBytes bounds a VM's VMX text, well under etcd's default request
	// limit of 1.5 MiB.
	MaxVMXBytes = 256 << 10
	// MaxUplinks is the most RDMA uplinks a host record may list.
	MaxUplinks = 16
	// MaxCapabilities is the most capabilities an uplink may list.
	MaxCapabilities = 16
)

// ErrInvalid is matched (errors.Is) by every validation error.
var ErrInvalid = errors.New("invalid record")

// FieldError is one problem of one record: which record, which field, and
// what is wrong with it, said so that the reader knows what to write.
type FieldError struct {
	Kind    Kind   // kind of the record
	Name    string // the record's name or ID, as given ("" if it is the name that is missing)
	Field   string // JSON name of the field
	Problem string // what is wrong and what is allowed
}

// Error returns "kind \"name\": field: problem".
func (e *FieldError) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("%s: %s: %s", e.Kind, e.Field, e.Problem)
	}
	return fmt.Sprintf("%s %q: %s: %s", e.Kind, e.Name, e.Field, e.Problem)
}

// Is reports whether target is ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// checker collects the problems of one record.
type checker struct {
	kind Kind
	name string
	errs []error
}

func (c *checker) add(field, format string, args ...any) {
	c.errs = append(c.errs, &FieldError{Kind: c.kind, Name: c.name, Field: field, Problem: fmt.Sprintf(format, args...)})
}

func (c *checker) name_(field, v string) {
	if err := CheckName(v); err != nil {
		c.add(field, "%v", err)
	}
}

func (c *checker) optName(field, v string) {
	if v != "" {
		c.name_(field, v)
	}
}

func (c *checker) rangeInt(field string, v, lo, hi int) {
	if v < lo || v > hi {
		c.add(field, "%d is out of range %d–%d", v, lo, hi)
	}
}

func (c *checker) err() error { return errors.Join(c.errs...) }

// CheckName reports whether s is a valid name: 1 to MaxNameLen characters
// of ASCII letters, digits, '.', '_' and '-', the first a letter or digit.
// The error says what is wrong and what is allowed.
func CheckName(s string) error {
	if s == "" {
		return errors.New("missing (a name is 1–64 letters, digits, '.', '_' or '-')")
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("%.16q… is %d characters, more than %d", s, len(s), MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		switch {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		case (b == '.' || b == '_' || b == '-') && i > 0:
		case i == 0 && (b == '.' || b == '_' || b == '-'):
			return fmt.Errorf("%q starts with %q (start with a letter or digit)", s, b)
		default:
			return fmt.Errorf("%q has %q at offset %d (use letters, digits, '.', '_' or '-')", s, b, i)
		}
	}
	return nil
}

// AdapterName returns the name of the adapter with index i: "vrdma3".
func AdapterName(i int) string { return "vrdma" + strconv.Itoa(i) }

// ParseAdapterName returns the index of an adapter name "vrdmaN", N in
// 0..MaxAdapterIndex written without leading zeros.
func ParseAdapterName(s string) (int, error) {
	d, ok := strings.CutPrefix(s, "vrdma")
	if !ok || d == "" || len(d) > 4 || (len(d) > 1 && d[0] == '0') {
		return 0, fmt.Errorf("adapter name %q is not vrdmaN (N = 0–%d, no leading zeros)", s, MaxAdapterIndex)
	}
	n := 0
	for _, c := range []byte(d) { // digits only: Atoi would take a sign
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("adapter name %q is not vrdmaN (N = 0–%d, no leading zeros)", s, MaxAdapterIndex)
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}

// ParseGID parses a GID: an IPv6 address, or an IPv4 address, which is
// turned into its IPv4-mapped form (::ffff:a.b.c.d) as RoCEv2 does.
func ParseGID(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("GID %q is not an IPv6 or IPv4 address", s)
	}
	return GIDOf(a), nil
}

// GIDOf returns a in the 16-byte form GIDs take: IPv4 addresses become
// IPv4-mapped IPv6 addresses. The zero Addr stays zero.
func GIDOf(a netip.Addr) netip.Addr {
	if !a.IsValid() {
		return a
	}
	return netip.AddrFrom16(a.As16())
}

func checkGID(c *checker, field string, g netip.Addr, required bool) {
	switch {
	case !g.IsValid():
		if required {
			c.add(field, "missing (a GID in IPv6 form, or ::ffff:a.b.c.d)")
		}
	case !g.Is6() || g.Zone() != "":
		c.add(field, "%s is not in 16-byte GID form (write IPv4 as ::ffff:%s)", g, g)
	case g.IsUnspecified():
		c.add(field, ":: is not a GID")
	}
}

// ---- Switch ---------------------------------------------------------------

// UplinkPolicy is how a switch uses its hosts' RDMA uplinks.
type UplinkPolicy string

// Uplink policies. PVRDMA does not support NIC teaming: the HCA must be the
// only uplink of the distributed switch (VMware's PVRDMA requirements).
const (
	// UplinkSingle: each host's RDMA uplink must be its only one on the
	// switch. A host listing several has no usable RDMA uplink (teaming is
	// not supported).
	UplinkSingle UplinkPolicy = "single"
	// UplinkFailover: explicit failover order; a host's first RDMA uplink
	// is active and the others are standby. Never teamed.
	UplinkFailover UplinkPolicy = "failover"
)

// Switch is a distributed switch: the set of hosts and port groups between
// which VMs can talk PVRDMA.
type Switch struct {
	Name         string       `json:"name"`
	UUID         string       `json:"uuid"`         // vDS UUID: 32 hex digits, spaces and dashes ignored ("50 1d … 9e 1d" or RFC 4122 form)
	MTU          int          `json:"mtu"`          // MinMTU..MaxMTU
	UplinkPolicy UplinkPolicy `json:"uplinkPolicy"` // "single" or "failover"
	// NetworkPolicy is how path selection obeys the RoCE network checks
	// (package netcheck): "strict" (also the empty default), "warn" or
	// "off".
	NetworkPolicy NetworkPolicy `json:"networkPolicy,omitempty"`
	// Routers are the layer-3 hops between the switch's hosts.
	Routers []Router `json:"routers,omitempty"`
}

// Kind returns KindSwitch.
func (Switch) Kind() Kind { return KindSwitch }

// Validate checks the switch's fields.
func (s Switch) Validate() error {
	c := checker{kind: KindSwitch, name: s.Name}
	c.name_("name", s.Name)
	if err := checkUUID(s.UUID); err != nil {
		c.add("uuid", "%v", err)
	}
	c.rangeInt("mtu", s.MTU, MinMTU, MaxMTU)
	switch s.UplinkPolicy {
	case UplinkSingle, UplinkFailover:
	case "":
		c.add("uplinkPolicy", `missing ("single" or "failover")`)
	default:
		c.add("uplinkPolicy", `%q is not "single" or "failover"`, s.UplinkPolicy)
	}
	c.network(s)
	return c.err()
}

// SameUUID reports whether a and b are the same vDS UUID, however they
// are written: hex digits compared without case, spaces and dashes
// ignored. Two strings that are not UUIDs are never the same.
func SameUUID(a, b string) bool {
	if checkUUID(a) != nil || checkUUID(b) != nil {
		return false
	}
	digits := func(s string) string {
		return strings.ToLower(strings.NewReplacer(" ", "", "-", "").Replace(s))
	}
	return digits(a) == digits(b)
}

func checkUUID(u string) error {
	if u == "" {
		return errors.New(`missing (32 hex digits, e.g. "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d")`)
	}
	n := 0
	for i := 0; i < len(u); i++ {
		switch b := u[i]; {
		case b == ' ' || b == '-':
		case '0' <= b && b <= '9', 'a' <= b && b <= 'f', 'A' <= b && b <= 'F':
			n++
		default:
			return fmt.Errorf("%q has %q: only hex digits, spaces and dashes", u, b)
		}
	}
	if n != 32 {
		return fmt.Errorf("%q has %d hex digits, not 32", u, n)
	}
	return nil
}

// ---- PortGroup ------------------------------------------------------------

// RoCEVersion is the RoCE protocol of a port group: v1 needs a lossless
// layer 2, v2 (UDP/4791) lossless layers 2 and 3.
type RoCEVersion string

// RoCE versions.
const (
	RoCEv1 RoCEVersion = "v1"
	RoCEv2 RoCEVersion = "v2"
)

// PortGroup is a distributed port group of a switch: the VLAN its adapters
// live in and the lossless-Ethernet settings of the RoCE traffic.
type PortGroup struct {
	Name        string      `json:"name"`        // display name
	Key         string      `json:"key"`         // stable key, e.g. "dvportgroup-80"; the record's ID
	Switch      string      `json:"switch"`      // the switch's name
	VLAN        int         `json:"vlan"`        // 0 (untagged) .. 4094
	PFCPriority int         `json:"pfcPriority"` // 0..7, the 802.1Q PCP that PFC keeps lossless
	DSCP        int         `json:"dscp"`        // 0..63, carried by RoCEv2 packets
	RoCEVersion RoCEVersion `json:"roceVersion"` // "v1" or "v2"
	// RoCEMTU is the RoCE MTU of the port group's QPs, one of RoCEMTUs;
	// 0 means the largest the switch's MTU carries.
	RoCEMTU int `json:"roceMtu,omitempty"`
	// Subnet is the IPv4 subnet of the port group's adapters, such as
	// "10.1.0.0/24"; an adapter without a vrdmaN.ipAddress gets an address
	// from it when it attaches. Empty: adapters have only the addresses
	// their VMs configure.
	Subnet string `json:"subnet,omitempty"`
}

// SubnetPrefix returns the port group's subnet, or false when it has none
// (or it does not parse: Validate refuses that).
func (p PortGroup) SubnetPrefix() (netip.Prefix, bool) {
	if p.Subnet == "" {
		return netip.Prefix{}, false
	}
	pr, err := netip.ParsePrefix(p.Subnet)
	if err != nil || !pr.Addr().Is4() {
		return netip.Prefix{}, false
	}
	return pr.Masked(), true
}

// Kind returns KindPortGroup.
func (PortGroup) Kind() Kind { return KindPortGroup }

// Validate checks the port group's fields.
func (p PortGroup) Validate() error {
	c := checker{kind: KindPortGroup, name: p.Key}
	c.name_("key", p.Key)
	c.name_("name", p.Name)
	c.name_("switch", p.Switch)
	c.rangeInt("vlan", p.VLAN, 0, MaxVLAN)
	c.rangeInt("pfcPriority", p.PFCPriority, 0, MaxPFCPriority)
	c.rangeInt("dscp", p.DSCP, 0, MaxDSCP)
	switch p.RoCEVersion {
	case RoCEv1, RoCEv2:
	case "":
		c.add("roceVersion", `missing ("v1" or "v2")`)
	default:
		c.add("roceVersion", `%q is not "v1" or "v2"`, p.RoCEVersion)
	}
	if p.RoCEMTU != 0 && !slices.Contains(RoCEMTUs[:], p.RoCEMTU) {
		c.add("roceMtu", "%d is not a RoCE MTU (256, 512, 1024, 2048 or 4096; 0 for the largest the switch carries)", p.RoCEMTU)
	}
	if p.Subnet != "" {
		pr, err := netip.ParsePrefix(p.Subnet)
		switch {
		case err != nil || !pr.Addr().Is4():
			c.add("subnet", "%q is not an IPv4 subnet such as 10.1.0.0/24", p.Subnet)
		case pr.Bits() > 30 || pr.Bits() < 8:
			c.add("subnet", "%q: the prefix length must be 8..30, so that the subnet has addresses to assign", p.Subnet)
		}
	}
	return c.err()
}

// ---- Host -----------------------------------------------------------------

// HostState is a host's state. The record holds what the agent (or an
// administrator) declares; package member reports HostDown for a host whose
// lease has expired, whatever the record says.
type HostState string

// Host states.
const (
	HostUp          HostState = "up"          // accepts new connections
	HostMaintenance HostState = "maintenance" // keeps its QPs, accepts no new connections
	HostDown        HostState = "down"        // no live agent (lease expired or revoked)
)

// UplinkKind is the kind of an RDMA uplink.
type UplinkKind string

// Uplink kinds.
const (
	UplinkSoftRoCEv2 UplinkKind = "rocev2-soft" // the agent's software RoCE engine on a NIC: RoCE v2, and v1 where its MAC is published (Uplink.Carries)
	UplinkHCA        UplinkKind = "hca"         // a hardware HCA through libibverbs; RoCE v1 and v2
)

// Supports reports whether an uplink of kind k can carry RoCE version v.
func (k UplinkKind) Supports(v RoCEVersion) bool {
	switch k {
	case UplinkHCA:
		return v == RoCEv1 || v == RoCEv2
	case UplinkSoftRoCEv2:
		return v == RoCEv2
	}
	return false
}

// Carries reports whether uplink u can carry RoCE version v. A software
// uplink carries RoCE v1 as well when its agent can send Ethernet frames
// on its interface (root, an Ethernet interface, not loopback), which the
// agent says by publishing the interface's MAC.
func (u Uplink) Carries(v RoCEVersion) bool {
	if u.Kind == UplinkSoftRoCEv2 && v == RoCEv1 {
		return u.MAC != ""
	}
	return u.Kind.Supports(v)
}

// Uplink capabilities.
const (
	// CapNamespaces: the uplink gives each VM its own namespace of QPNs
	// and keys, as native endpoints need.
	CapNamespaces = "namespaces"
)

// Uplink is one physical RDMA uplink of a host on its switch.
type Uplink struct {
	Kind    UplinkKind `json:"kind"`
	Device  string     `json:"device,omitempty"` // NIC or HCA name, e.g. "eth1", "mlx5_0"
	Address netip.Addr `json:"address"`          // the uplink's IP address
	GID     netip.Addr `json:"gid"`              // its GID (16-byte form)
	// MAC is the uplink interface's Ethernet address, as its agent
	// publishes it for RoCE v1, whose frames are addressed by MAC
	// ("aa:bb:cc:dd:ee:ff"); empty when the uplink carries no RoCE v1
	// (Carries).
	MAC          string   `json:"mac,omitempty"`
	Capabilities []string `json:"capabilities,omitempty"`
	// Declared is the NIC's lossless-Ethernet state as the operator
	// declares it (vrdmactl host uplink declare): it counts where the
	// kernel cannot report the state (loopback, veth, virtio NICs).
	Declared NICState `json:"declared,omitzero"`
	// Observed is the NIC's state as the kernel of the uplink's host
	// reports it; it wins over Declared field by field.
	Observed NICState `json:"observed,omitzero"`
}

// Host is one host and its agent: where its PVRDMA traffic goes and what
// RDMA uplinks it has on its switch.
type Host struct {
	ID   string `json:"id"`   // stable host ID (the agent's host-id file); the record's ID
	Name string `json:"name"` // host name, for people
	// PVRDMAAddress is the tagged address that carries inter-host PVRDMA
	// traffic (TCP path, connection setup): ESXi's Net.PVRDMAVmknic. The
	// zero value means no address is tagged: the host takes part in
	// same-host traffic only.
	PVRDMAAddress netip.AddrPort `json:"pvrdmaAddress"`
	PVRDMAVmknic  string         `json:"pvrdmaVmknic,omitempty"` // the interface holding PVRDMAAddress, e.g. "vmk1"
	// FirewallPVRDMA says whether the host's firewall ruleset "pvrdma"
	// is enabled; without it no inter-host PVRDMA traffic passes.
	FirewallPVRDMA bool `json:"firewallPvrdma"`
	// PVRDMANamespaces says whether PVRDMA namespaces are on for the
	// host's RDMA uplink: each VM's adapters get identifiers (QPNs, keys,
	// GID) real on the uplink's fabric, which native endpoints need. Set
	// by an administrator (vrdmactl host configure --pvrdma-namespaces),
	// kept when the agent registers again.
	PVRDMANamespaces bool      `json:"pvrdmaNamespaces,omitempty"`
	Uplinks          []Uplink  `json:"uplinks,omitempty"` // RDMA uplinks on Switch
	Switch           string    `json:"switch"`            // the distributed switch the host is on ("" = none)
	AgentVersion     string    `json:"agentVersion"`
	State            HostState `json:"state"`
	// HostKey is the public half of the agent's ed25519 host key (package
	// hostkey), 64 lowercase hex digits: the key the host signs its tcp
	// handshakes with. Written by the agent at every registration; ""
	// for an agent that has none yet (it cannot join a tcp handshake).
	HostKey string `json:"hostKey,omitempty"`
	// Where the host sits in the inventory (see Inventory); set by an
	// administrator (vrdmactl host configure), kept when the agent
	// registers again.
	Inventory
}

// Inventory places a host or a VM in the inventory tree, as vSphere does:
// a datacenter holds clusters and folders; a cluster holds hosts and
// resource pools; a VM sits in a VM folder of its datacenter and a
// resource pool of its host's cluster. Every field is optional ("" =
// not placed). A host uses Datacenter, Cluster and Folder (its host
// folder); a VM uses Datacenter, Folder (its VM folder) and ResourcePool,
// and its cluster is its host's.
type Inventory struct {
	Datacenter   string `json:"datacenter,omitempty"`   // a name
	Cluster      string `json:"cluster,omitempty"`      // a name; hosts only
	Folder       string `json:"folder,omitempty"`       // a path of names: "prod/web"
	ResourcePool string `json:"resourcePool,omitempty"` // a path of names, under the cluster's root pool; VMs only
}

// MaxPathDepth is the most names a folder or resource-pool path may have.
const MaxPathDepth = 8

// CheckPath reports whether s is a valid folder or resource-pool path:
// 1 to MaxPathDepth names (see CheckName) separated by '/'.
func CheckPath(s string) error {
	parts := strings.Split(s, "/")
	if len(parts) > MaxPathDepth {
		return fmt.Errorf("%.32q… has %d levels, more than %d", s, len(parts), MaxPathDepth)
	}
	for _, p := range parts {
		if err := CheckName(p); err != nil {
			return fmt.Errorf("path %q: %v (a path is names separated by '/', e.g. \"prod/web\")", s, err)
		}
	}
	return nil
}

func (c *checker) inventory(inv Inventory, host bool) {
	c.optName("datacenter", inv.Datacenter)
	if inv.Folder != "" {
		if err := CheckPath(inv.Folder); err != nil {
			c.add("folder", "%v", err)
		}
	}
	if host {
		c.optName("cluster", inv.Cluster)
		if inv.ResourcePool != "" {
			c.add("resourcePool", "a host has no resource pool (its VMs do)")
		}
		return
	}
	if inv.Cluster != "" {
		c.add("cluster", "a VM's cluster is its host's: place the VM on a host of cluster %q", inv.Cluster)
	}
	if inv.ResourcePool != "" {
		if err := CheckPath(inv.ResourcePool); err != nil {
			c.add("resourcePool", "%v", err)
		}
	}
}

// Kind returns KindHost.
func (Host) Kind() Kind { return KindHost }

// hostKeyRE is the form of Host.HostKey.
var hostKeyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Validate checks the host's fields.
func (h Host) Validate() error {
	c := checker{kind: KindHost, name: h.ID}
	c.name_("id", h.ID)
	c.name_("name", h.Name)
	c.optName("switch", h.Switch)
	if h.PVRDMAAddress != (netip.AddrPort{}) {
		if !h.PVRDMAAddress.Addr().IsValid() || h.PVRDMAAddress.Port() == 0 || h.PVRDMAAddress.Addr().IsUnspecified() {
			c.add("pvrdmaAddress", "%s is not address:port with a port", h.PVRDMAAddress)
		}
	}
	if h.PVRDMAVmknic != "" {
		c.name_("pvrdmaVmknic", h.PVRDMAVmknic)
	}
	c.inventory(h.Inventory, true)
	if h.AgentVersion == "" || len(h.AgentVersion) > MaxNameLen {
		c.add("agentVersion", "missing or longer than %d", MaxNameLen)
	}
	if h.HostKey != "" && !hostKeyRE.MatchString(h.HostKey) {
		c.add("hostKey", "%.80q is not an ed25519 public key in 64 lowercase hex digits", h.HostKey)
	}
	switch h.State {
	case HostUp, HostMaintenance, HostDown:
	case "":
		c.add("state", `missing ("up", "maintenance" or "down")`)
	default:
		c.add("state", `%q is not "up", "maintenance" or "down"`, h.State)
	}
	if len(h.Uplinks) > MaxUplinks {
		c.add("uplinks", "%d uplinks, more than %d", len(h.Uplinks), MaxUplinks)
	}
	if len(h.Uplinks) > 0 && h.Switch == "" {
		c.add("uplinks", "RDMA uplinks but no switch: an uplink belongs to the host's switch")
	}
	for i, u := range h.Uplinks {
		f := fmt.Sprintf("uplinks[%d]", i)
		switch u.Kind {
		case UplinkSoftRoCEv2, UplinkHCA:
		default:
			c.add(f+".kind", `%q is not "rocev2-soft" or "hca"`, u.Kind)
		}
		if u.Device != "" {
			c.name_(f+".device", u.Device)
		}
		if !u.Address.IsValid() || u.Address.IsUnspecified() {
			c.add(f+".address", "missing (the uplink's IP address)")
		}
		checkGID(&c, f+".gid", u.GID, true)
		if u.MAC != "" {
			if m, err := net.ParseMAC(u.MAC); err != nil || len(m) != 6 {
				c.add(f+".mac", "%q is not an Ethernet MAC (aa:bb:cc:dd:ee:ff)", u.MAC)
			}
		}
		if len(u.Capabilities) > MaxCapabilities {
			c.add(f+".capabilities", "%d capabilities, more than %d", len(u.Capabilities), MaxCapabilities)
		}
		for _, cp := range u.Capabilities {
			c.optName(f+".capabilities", cp)
		}
		c.nicState(f+".declared", u.Declared, false)
		c.nicState(f+".observed", u.Observed, true)
	}
	return c.err()
}

// CanCarryInterHost reports whether the host is configured for traffic
// with other hosts: a PVRDMA address is tagged and the pvrdma firewall
// ruleset is enabled. If not, why says what is missing.
func (h Host) CanCarryInterHost() (ok bool, why string) {
	switch {
	case !h.PVRDMAAddress.IsValid():
		return false, fmt.Sprintf("host %s has no PVRDMA address (Net.PVRDMAVmknic is not set; rule host-rdma-configured: vrdmactl host configure %s --pvrdma-address ADDR:PORT)", h.label(), h.Name)
	case !h.FirewallPVRDMA:
		return false, fmt.Sprintf("host %s has the pvrdma firewall ruleset disabled (rule host-rdma-configured: vrdmactl host configure %s --firewall-pvrdma on)", h.label(), h.Name)
	}
	return true, ""
}

func (h Host) label() string {
	if h.Name != "" && h.Name != h.ID {
		return h.Name + " (" + h.ID + ")"
	}
	return h.ID
}

// Label returns the host's name and ID for messages: "esx1 (4f2c…)".
func (h Host) Label() string { return h.label() }

// ---- Alive ----------------------------------------------------------------

// Alive is a host's heartbeat: the record exists while the host's lease
// lives, so its presence is the host's liveness. The agent writes it under
// its lease; etcd deletes it when the lease expires or is revoked.
type Alive struct {
	HostID       string `json:"hostId"`
	Lease        int64  `json:"lease"`       // the etcd lease ID
	TTL          int64  `json:"ttl"`         // the lease's TTL in seconds
	SinceUnixMs  int64  `json:"sinceUnixMs"` // when this lease was registered
	AgentVersion string `json:"agentVersion"`
}

// Kind returns KindAlive.
func (Alive) Kind() Kind { return KindAlive }

// Validate checks the heartbeat's fields.
func (a Alive) Validate() error {
	c := checker{kind: KindAlive, name: a.HostID}
	c.name_("hostId", a.HostID)
	if a.Lease == 0 {
		c.add("lease", "missing")
	}
	if a.TTL <= 0 {
		c.add("ttl", "missing")
	}
	return c.err()
}

// ---- VM -------------------------------------------------------------------

// PowerState is a VM's power state, as vSphere names it.
type PowerState string

// Power states.
const (
	PoweredOn  PowerState = "poweredOn"
	PoweredOff PowerState = "poweredOff"
	Suspended  PowerState = "suspended"
)

// Owner is who may attach to a VM: the uid and gid of its workload. A
// process attaches if it runs as UID or as root, or with primary group
// GID when the owner granted its group (the VMX's vrdma.groupAttach);
// only UID and root may change the VM.
type Owner struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// MayAttach reports whether a process running as uid with primary group
// gid may attach to a VM owned by o; group says the owner granted its
// group. Root may.
func (o Owner) MayAttach(uid, gid uint32, group bool) bool {
	return uid == 0 || uid == o.UID || (group && gid == o.GID)
}

// MayChange reports whether a process running as uid may change a VM
// owned by o. Only its owner and root may.
func (o Owner) MayChange(uid uint32) bool { return uid == 0 || uid == o.UID }

// VM is a VM: its VMX configuration, its owner, the host it runs on and
// the names of its adapters.
//
// A VM comes in one of two kinds. A VM defined on its host's agent
// (vrdmactl vm define) keeps its VMX and power state in that agent's
// state directory; its record here is published while a workload is
// attached and removed when it detaches. A managed VM (vrdmactl vm
// create) lives here: the record is its configuration and power state,
// it outlives its workloads, and any host's agent runs it once it is
// powered on there.
type VM struct {
	Name     string     `json:"name"`
	VMX      string     `json:"vmx"` // the VMX text, as kept by the agent
	Owner    Owner      `json:"owner"`
	Host     string     `json:"host"` // host ID; required unless powered off (a managed VM keeps the host it is registered on)
	Power    PowerState `json:"power"`
	Adapters []string   `json:"adapters,omitempty"` // "vrdmaN" names, ascending, at most MaxAdapters
	// Managed says the record is the VM's configuration (see above).
	Managed bool `json:"managed,omitempty"`
	// PinAllowed says an administrator (root or the agent's user)
	// defined, created or edited the VM with its guest memory reserved
	// and locked: it may pin although its owner is not allowed to
	// (docs/SECURITY.md, "Tenants and quotas").
	PinAllowed bool `json:"pinAllowed,omitempty"`
	// Where the VM sits in the inventory: datacenter, VM folder and
	// resource pool (its cluster is its host's).
	Inventory
}

// Kind returns KindVM.
func (VM) Kind() Kind { return KindVM }

// Validate checks the VM's fields.
func (v VM) Validate() error {
	c := checker{kind: KindVM, name: v.Name}
	c.name_("name", v.Name)
	if len(v.VMX) > MaxVMXBytes {
		c.add("vmx", "%d bytes, more than %d", len(v.VMX), MaxVMXBytes)
	}
	switch v.Power {
	case PoweredOn, Suspended:
		c.name_("host", v.Host)
	case PoweredOff:
		c.optName("host", v.Host)
	case "":
		c.add("power", `missing ("poweredOn", "poweredOff" or "suspended")`)
	default:
		c.add("power", `%q is not "poweredOn", "poweredOff" or "suspended"`, v.Power)
	}
	c.inventory(v.Inventory, false)
	if len(v.Adapters) > MaxAdapters {
		c.add("adapters", "%d adapters, more than %d", len(v.Adapters), MaxAdapters)
	}
	last := -1
	for _, a := range v.Adapters {
		n, err := ParseAdapterName(a)
		if err != nil {
			c.add("adapters", "%v", err)
			continue
		}
		if n <= last {
			c.add("adapters", "%s is out of order or repeated (list adapters in ascending order)", a)
		}
		last = n
	}
	return c.err()
}

// ---- Adapter --------------------------------------------------------------

// Adapter is one PVRDMA adapter of a VM: "vrdmaN" is the VM's ethernetN.
type Adapter struct {
	VM             string     `json:"vm"`
	Index          int        `json:"index"`     // N of vrdmaN
	MAC            string     `json:"mac"`       // 6-byte MAC, lower case, colon separated
	GID            netip.Addr `json:"gid"`       // the adapter's GID (16-byte form)
	PortGroup      string     `json:"portGroup"` // the port group's key
	NativeEndpoint bool       `json:"nativeEndpoint,omitempty"`
}

// Kind returns KindAdapter.
func (Adapter) Kind() Kind { return KindAdapter }

// Name returns the adapter's name, "vrdmaN".
func (a Adapter) Name() string { return AdapterName(a.Index) }

// Validate checks the adapter's fields.
func (a Adapter) Validate() error {
	c := checker{kind: KindAdapter, name: a.VM + "/" + a.Name()}
	c.name_("vm", a.VM)
	c.rangeInt("index", a.Index, 0, MaxAdapterIndex)
	if err := checkMAC(a.MAC); err != nil {
		c.add("mac", "%v", err)
	}
	checkGID(&c, "gid", a.GID, true)
	c.name_("portGroup", a.PortGroup)
	return c.err()
}

// CanonicalMAC returns s as a 6-byte MAC in lower case with colons.
func CanonicalMAC(s string) (string, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("%q is not a 6-byte MAC such as 00:50:56:aa:bb:cc", s)
	}
	return hw.String(), nil
}

func checkMAC(s string) error {
	if s == "" {
		return errors.New("missing (a MAC such as 00:50:56:aa:bb:cc)")
	}
	m, err := CanonicalMAC(s)
	if err != nil {
		return err
	}
	if m != s {
		return fmt.Errorf("%q is not in canonical form %q", s, m)
	}
	return nil
}

// ---- Endpoint -------------------------------------------------------------

// Endpoint is an entry of the endpoint directory: where an adapter lives.
// The same entry is stored under the adapter's GID and under its name
// "vm/vrdmaN", so either resolves in one read.
type Endpoint struct {
	GID       netip.Addr `json:"gid"`
	Host      string     `json:"host"` // host ID the VM runs on
	VM        string     `json:"vm"`
	Adapter   string     `json:"adapter"`   // "vrdmaN"
	PortGroup string     `json:"portGroup"` // port group key
}

// Kind returns KindEndpoint.
func (Endpoint) Kind() Kind { return KindEndpoint }

// Name returns the endpoint's name, "vm/vrdmaN".
func (e Endpoint) Name() string { return e.VM + "/" + e.Adapter }

// Validate checks the entry's fields.
func (e Endpoint) Validate() error {
	c := checker{kind: KindEndpoint, name: e.Name()}
	checkGID(&c, "gid", e.GID, true)
	c.name_("host", e.Host)
	c.name_("vm", e.VM)
	if _, err := ParseAdapterName(e.Adapter); err != nil {
		c.add("adapter", "%v", err)
	}
	c.name_("portGroup", e.PortGroup)
	return c.err()
}

// EndpointOf returns the directory entry of adapter a of a VM running on
// host.
func EndpointOf(a Adapter, host string) Endpoint {
	return Endpoint{GID: a.GID, Host: host, VM: a.VM, Adapter: a.Name(), PortGroup: a.PortGroup}
}
