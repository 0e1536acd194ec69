// SPDX-License-Identifier: Apache-2.0

// Package vmconfig is the typed view of a VM that the host agent works
// from, read from the VM's VMX configuration (package vmx).
//
// It reads the PVRDMA keys of a vSphere VMX file and the two vrdma keys: memory size and reservation, guest OS, virtual hardware version,
// latency sensitivity, async mode, and the PVRDMA adapters. An adapter is
// ethernetN with ethernetN.virtualDev = "vrdma" (in any case) and
// ethernetN.present not false; vrdma calls it "vrdmaN", and
// vrdmaN.nativeEndpointSupport enables native endpoints on it;
// ethernetN.startConnected = FALSE attaches it with its port down;
// vrdmaN.ipAddress (and vrdmaN.ip6Address) give it its addresses.
//
// Every value is treated as hostile. Booleans are TRUE or FALSE in any case
// (also 1/0 and yes/no); numbers are plain decimal with range checks. A value
// that breaks these rules is an *Error that names the key, the line and what
// to write instead. Parse and FromFile report every problem they find, up to
// [MaxErrors], joined with errors.Join; use errors.As to get the first
// *Error.
//
// Parse checks the values, not the policy: whether this VM may power on
// (hardware version 13+, memory locked, a distributed port group, ...) is for
// the rules built on top of Config.
package vmconfig

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/vmx"
)

// Limits on the values Parse accepts.
const (
	// MaxAdapters is the most PVRDMA adapters a VM may have (vSphere 7.0.2
	// and later).
	MaxAdapters = 10
	// MaxAdapterIndex is the largest N accepted in ethernetN for a PVRDMA
	// adapter: a sanity bound far above real files, whose indexes have gaps
	// but stay small.
	MaxAdapterIndex = 9999
	// MinMemSizeMB is the smallest memSize accepted.
	MinMemSizeMB = 1
	// MaxMemSizeMB is the largest memSize and sched.mem.min accepted (1 TiB).
	MaxMemSizeMB = 1048576
	// MaxHWVersion is the largest virtualHW.version accepted: a sanity
	// bound well above today's versions (21 is ESXi 8.0 U2).
	MaxHWVersion = 255
	// MaxDirectPeers is the most VM names vrdma.directPeers takes.
	MaxDirectPeers = 64
	// MaxErrors is the most problems Parse reports at once.
	MaxErrors = 20
)

// Config is the host agent's view of one VM.
type Config struct {
	MemSizeMB int  // memSize (required, 1..1048576 MB)
	MemMinMB  int  // sched.mem.min (0 if absent)
	MemPin    bool // sched.mem.pin == TRUE
	AsyncMode bool // vrdma.asyncMode == TRUE
	// GroupAttach is vrdma.groupAttach == TRUE: the owner lets processes
	// whose primary group is the VM's owner gid attach, not only its uid.
	GroupAttach        bool
	GuestOS            string // guestOS
	HWVersion          int    // virtualHW.version (0 if absent)
	LatencySensitivity string // sched.cpu.latencySensitivity
	// DirectPeers is vrdma.directPeers: the names of the VMs of the same
	// host that may map this VM's registered memory (the memcpy-direct
	// path, docs/wire-local.md §4.21); nil if unset. Both VMs of a pair
	// must name each other.
	DirectPeers []string
	Adapters    []Adapter // in ascending Index order; nil if none
}

// Adapter is one PVRDMA adapter of a VM.
type Adapter struct {
	Index          int              // N of ethernetN; the adapter's name is "vrdmaN"
	MAC            net.HardwareAddr // ethernetN.address or ethernetN.generatedAddress if present, else nil
	SwitchID       string           // ethernetN.dvs.switchId
	PortGroupID    string           // ethernetN.dvs.portgroupId
	NativeEndpoint bool             // vrdmaN.nativeEndpointSupport == TRUE
	// StartConnected is ethernetN.startConnected (default TRUE), vSphere's
	// "Connect At Power On": whether the adapter's port is up when a
	// workload attaches the VM. vrdmactl vm connect and disconnect change
	// it while the VM runs.
	StartConnected bool
	// IPv4 is the adapter's IPv4 address on its port group
	// (vrdmaN.ipAddress); invalid (the zero Addr) when not set, and the
	// control plane may assign one from the port group's subnet. The
	// adapter's RoCE v2 GID is its IPv4-mapped form.
	IPv4 netip.Addr
	// IPv6 is the adapter's optional IPv6 address (vrdmaN.ip6Address).
	IPv6 netip.Addr
}

// Name returns the adapter's name, "vrdma" followed by its Index: "vrdma3".
func (a Adapter) Name() string {
	return "vrdma" + strconv.Itoa(a.Index)
}

// MemoryLocked reports whether all guest memory is reserved and locked:
// sched.mem.pin is TRUE and sched.mem.min is at least memSize.
func (c *Config) MemoryLocked() bool {
	return c.MemPin && c.MemMinMB >= c.MemSizeMB
}

// Error is one problem with a VM's configuration.
type Error struct {
	Key   string // the key at fault (its case may differ from the file's)
	Value string // the key's value (decoded), if Line > 0
	Line  int    // 1-based line of the key, 0 if the key is missing
	Msg   string // what is wrong and what to do
}

// Error returns `key = "value" (line N): Msg`, or "key: Msg" for a missing
// key. Unprintable bytes of the value are shown as Go escapes and a long
// value is shortened.
func (e *Error) Error() string {
	if e.Line <= 0 {
		return e.Key + ": " + e.Msg
	}
	return fmt.Sprintf("%s = %s (line %d): %s", e.Key, quoteValue(e.Value), e.Line, e.Msg)
}

// quoteValue quotes a hostile value for an error message.
func quoteValue(v string) string {
	const max = 64
	if len(v) > max {
		return strconv.Quote(v[:max]) + "..."
	}
	return strconv.Quote(v)
}

// Parse parses a .vmx file and returns its Config. A syntax error is a
// *vmx.ParseError; problems with the values are *Error values (see the
// package documentation).
func Parse(data []byte) (*Config, error) {
	f, err := vmx.Parse(data)
	if err != nil {
		return nil, err
	}
	return FromFile(f)
}

// FromFile returns the Config of a parsed .vmx file.
func FromFile(f *vmx.File) (*Config, error) {
	if f == nil {
		return nil, errors.New("vmconfig: no VMX file (nil *vmx.File)")
	}
	r := reader{f: f}
	c := &Config{}

	c.MemSizeMB = r.number(numSpec{key: "memSize", min: MinMemSizeMB, max: MaxMemSizeMB, required: true,
		what: "the guest memory in MB", example: "4096"})
	c.MemMinMB = r.number(numSpec{key: "sched.mem.min", min: 0, max: MaxMemSizeMB,
		what: "the memory reservation in MB (the same as memSize to reserve all guest memory)", example: "4096"})
	c.MemPin = r.boolean("sched.mem.pin", false)
	c.AsyncMode = r.boolean("vrdma.asyncMode", false)
	c.GroupAttach = r.boolean("vrdma.groupAttach", false)
	c.GuestOS, _ = f.Get("guestOS")
	c.HWVersion = r.number(numSpec{key: "virtualHW.version", min: 1, max: MaxHWVersion,
		what: "the virtual hardware version", example: "20"})
	c.LatencySensitivity, _ = f.Get("sched.cpu.latencySensitivity")
	c.Adapters = r.adapters()
	c.DirectPeers = r.names("vrdma.directPeers", MaxDirectPeers)

	if len(r.errs) > 0 {
		return nil, r.err()
	}
	return c, nil
}

// reader reads typed values from a vmx.File and collects the problems.
type reader struct {
	f       *vmx.File
	errs    []error
	dropped int // problems beyond MaxErrors
}

// fail records a problem with key, which is set in the file.
func (r *reader) fail(key, format string, args ...any) {
	if len(r.errs) >= MaxErrors {
		r.dropped++
		return
	}
	v, _ := r.f.Get(key)
	r.errs = append(r.errs, &Error{Key: key, Value: v, Line: r.f.Line(key), Msg: fmt.Sprintf(format, args...)})
}

// err returns the collected problems as one error.
func (r *reader) err() error {
	errs := r.errs
	if r.dropped > 0 {
		errs = append(errs, fmt.Errorf("and %d more problems", r.dropped))
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// numSpec describes a numeric key.
type numSpec struct {
	key      string
	min, max int
	required bool
	what     string // what the number is, e.g. "the guest memory in MB"
	example  string // a good value
}

// number returns the value of a numeric key, or 0 if it is absent or bad.
func (r *reader) number(s numSpec) int {
	v, ok := r.f.Get(s.key)
	if !ok {
		if s.required {
			r.errs = append(r.errs, &Error{Key: s.key, Msg: fmt.Sprintf("missing; set %s to %s, e.g. %s = %q",
				s.key, s.what, s.key, s.example)})
		}
		return 0
	}
	fix := fmt.Sprintf("set %s to %s, e.g. %s = %q", s.key, s.what, s.key, s.example)
	n, problem := ParseDecimal(v)
	switch {
	case problem != "":
		r.fail(s.key, "%s; %s", problem, fix)
		return 0
	case n < s.min || n > s.max:
		r.fail(s.key, "out of range: %s must be from %d to %d (%s), e.g. %s = %q",
			s.key, s.min, s.max, s.what, s.key, s.example)
		return 0
	}
	return n
}

// ParseDecimal parses a VMX number: a non-negative decimal of at most 18
// digits, without a leading zero. On failure it returns what is wrong with
// v. Package rules reads numbers the same way.
func ParseDecimal(v string) (int, string) {
	if v == "" {
		return 0, "empty"
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, "not a number"
		}
	}
	if len(v) > 1 && v[0] == '0' {
		return 0, "a number with a leading zero (some readers take it as octal)"
	}
	if len(v) > 18 {
		return 0, "a number far too large"
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, "not a number"
	}
	return n, ""
}

// ParseBool parses a VMX boolean: TRUE or FALSE in any case, also 1/0 and
// yes/no.
func ParseBool(v string) (value, ok bool) {
	switch strings.ToLower(v) {
	case "true", "1", "yes":
		return true, true
	case "false", "0", "no":
		return false, true
	}
	return false, false
}

// boolean returns the value of a boolean key, or def if it is absent or bad.
func (r *reader) boolean(key string, def bool) bool {
	v, ok := r.f.Get(key)
	if !ok {
		return def
	}
	b, ok := ParseBool(v)
	if !ok {
		r.fail(key, "not a boolean; use %s = \"TRUE\" or %s = \"FALSE\" (1/0 and yes/no are accepted too, in any case)",
			key, key)
		return def
	}
	return b
}

// IndexedKey returns N if key is prefix + N + suffix (prefix and suffix
// in lower case; key compared without regard to ASCII case) with N plain
// decimal digits: "ethernetN.virtualDev", "vrdmaN.nativeEndpointSupport".
// canonical is false if N has a leading zero or is larger than
// MaxAdapterIndex. Package rules reads keys the same way.
func IndexedKey(key, prefix, suffix string) (n int, canonical, ok bool) {
	k := strings.ToLower(key)
	if !strings.HasPrefix(k, prefix) || !strings.HasSuffix(k, suffix) || len(k) <= len(prefix)+len(suffix) {
		return 0, false, false
	}
	digits := k[len(prefix) : len(k)-len(suffix)]
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false, false
		}
	}
	n, problem := ParseDecimal(digits)
	if problem != "" || n > MaxAdapterIndex {
		return 0, false, true
	}
	return n, true, true
}

// adapters returns the PVRDMA adapters of the VM.
func (r *reader) adapters() []Adapter {
	var found []Adapter
	var keys []string // the virtualDev key of each adapter in found
	for _, key := range r.f.Keys() {
		n, canonical, ok := IndexedKey(key, "ethernet", ".virtualdev")
		if !ok {
			continue
		}
		dev, _ := r.f.Get(key)
		if !strings.EqualFold(dev, "vrdma") {
			continue
		}
		if !canonical {
			r.fail(key, "not a valid adapter key: the adapter number must be written without leading zeros "+
				"and be at most %d, as in ethernet1.virtualDev", MaxAdapterIndex)
			continue
		}
		if !r.boolean(fmt.Sprintf("ethernet%d.present", n), true) {
			continue
		}
		found = append(found, Adapter{Index: n})
		keys = append(keys, key)
	}
	// Keys are distinct in any case and canonical numbers are distinct, so
	// no two adapters share an Index.
	order := make([]int, len(found))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return found[a].Index - found[b].Index })

	if len(found) > MaxAdapters {
		var names []string
		for i, j := range order {
			if i == MaxAdapters+1 {
				names = append(names, "...")
				break
			}
			names = append(names, fmt.Sprintf("ethernet%d", found[j].Index))
		}
		extra := keys[order[MaxAdapters]]
		r.fail(extra, "this is PVRDMA adapter %d of %d (%s); a VM may have at most %d PVRDMA adapters "+
			"(vSphere 7.0.2 and later): remove adapters, or set ethernetN.present = \"FALSE\" on the ones not used",
			MaxAdapters+1, len(found), strings.Join(names, ", "), MaxAdapters)
		return nil
	}

	var adapters []Adapter
	for _, j := range order {
		a := found[j]
		eth := fmt.Sprintf("ethernet%d.", a.Index)
		a.MAC = r.mac(eth+"address", eth+"generatedAddress")
		a.SwitchID, _ = r.f.Get(eth + "dvs.switchId")
		a.PortGroupID, _ = r.f.Get(eth + "dvs.portgroupId")
		a.NativeEndpoint = r.boolean(fmt.Sprintf("vrdma%d.nativeEndpointSupport", a.Index), false)
		a.StartConnected = r.boolean(eth+"startConnected", true)
		a.IPv4 = r.ip(fmt.Sprintf("vrdma%d.ipAddress", a.Index), true)
		a.IPv6 = r.ip(fmt.Sprintf("vrdma%d.ip6Address", a.Index), false)
		adapters = append(adapters, a)
	}
	return adapters
}

// ip returns the unicast address in key (IPv4 when v4, else IPv6), or
// the zero Addr when key is absent or empty.
func (r *reader) ip(key string, v4 bool) netip.Addr {
	v, ok := r.f.Get(key)
	if !ok || v == "" {
		return netip.Addr{}
	}
	example, kind := "10.0.0.11", "IPv4"
	if !v4 {
		example, kind = "fd00::11", "IPv6"
	}
	fix := fmt.Sprintf("write the adapter's %s address, e.g. %s = %q, or remove the key to have the control plane assign one from the port group's subnet", kind, key, example)
	a, err := netip.ParseAddr(v)
	switch {
	case err != nil || a.Zone() != "" || a.Is4() != v4 || a.Is4In6():
		r.fail(key, "not an %s address; %s", kind, fix)
		return netip.Addr{}
	case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		r.fail(key, "%s is not a unicast address an adapter can have; %s", a, fix)
		return netip.Addr{}
	}
	return a
}

// mac returns the MAC address in the first of keys that is set and not
// empty, or nil.
func (r *reader) mac(keys ...string) net.HardwareAddr {
	for _, key := range keys {
		v, ok := r.f.Get(key)
		if !ok || v == "" {
			continue
		}
		fix := fmt.Sprintf("write a unicast MAC address as six hex bytes, e.g. %s = \"00:50:56:01:02:03\"", key)
		if len(v) > 64 { // longer than any MAC address ParseMAC knows
			r.fail(key, "not a MAC address; %s", fix)
			return nil
		}
		hw, err := net.ParseMAC(v)
		switch {
		case err != nil || len(hw) != 6:
			r.fail(key, "not a MAC address; %s", fix)
			return nil
		case hw[0]&1 != 0:
			r.fail(key, "a multicast or broadcast address, which an adapter cannot have; %s", fix)
			return nil
		case string(hw) == "\x00\x00\x00\x00\x00\x00":
			r.fail(key, "the all-zero address, which an adapter cannot have; %s", fix)
			return nil
		}
		return hw
	}
	return nil
}

// NewVMX returns the VMX of a new VM with no adapter: memMB of guest
// memory, virtual hardware hw, guest OS guestOS. Values out of range are
// an error that names the VMX setting (memSize, virtualHW.version,
// guestOS) and what it accepts.
func NewVMX(name string, memMB, hw int, guestOS string) (string, error) {
	if memMB < MinMemSizeMB || memMB > MaxMemSizeMB {
		return "", fmt.Errorf("memory %d MB (memSize): want %d..%d MB", memMB, MinMemSizeMB, MaxMemSizeMB)
	}
	if hw < 1 || hw > MaxHWVersion {
		return "", fmt.Errorf("virtual hardware %d (virtualHW.version): want 1..%d (13 or later for PVRDMA)", hw, MaxHWVersion)
	}
	if guestOS == "" || strings.ContainsAny(guestOS, "\"|\n\\") {
		return "", fmt.Errorf("guest OS %q (guestOS): want a guestOS ID such as ubuntu-64", guestOS)
	}
	return fmt.Sprintf(".encoding = \"UTF-8\"\nconfig.version = \"8\"\nvirtualHW.version = \"%d\"\ndisplayName = %q\nguestOS = %q\nmemSize = \"%d\"\n",
		hw, name, guestOS, memMB), nil
}

// names reads key as VM names separated by spaces or commas, at most max
// of them, each a valid VM name (1-64 letters, digits, '_', '-', '.', not
// starting with '-' or '.'); duplicates count once. Unset or empty: nil.
func (r *reader) names(key string, max int) []string {
	v, ok := r.f.Get(key)
	if !ok {
		return nil
	}
	fields := strings.FieldsFunc(v, func(c rune) bool { return c == ' ' || c == ',' || c == '\t' })
	if len(fields) > max {
		r.fail(key, "names %d VMs, at most %d are allowed: list only the VMs that may map this VM's memory", len(fields), max)
		return nil
	}
	var out []string
	for _, n := range fields {
		if err := abi.ValidName(key, n); err != nil {
			r.fail(key, "%q is not a VM name (1 to 64 letters, digits, '_', '-', '.', not starting with '-' or '.'): separate the names with spaces or commas", n)
			return nil
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// AllowsDirect reports whether the VM lists peer in vrdma.directPeers.
func (c *Config) AllowsDirect(peer string) bool { return slices.Contains(c.DirectPeers, peer) }

// DirectVerdict says whether two VMs of one host, a and b with configs ca
// and cb, allow each other the memcpy-direct path (vrdma.directPeers on
// both sides), and if not, why; apply is false when neither sets the key
// (then there is nothing to report). The sessions' capability is the
// agent's to check on top.
func DirectVerdict(a, b string, ca, cb *Config) (ok, apply bool, why string) {
	if len(ca.DirectPeers) == 0 && len(cb.DirectPeers) == 0 {
		return false, false, ""
	}
	switch {
	case a == b:
		return false, true, fmt.Sprintf("both ends are VM %q: memcpy-direct is between two VMs", a)
	case !ca.AllowsDirect(b):
		return false, true, fmt.Sprintf("VM %q does not list %q in vrdma.directPeers", a, b)
	case !cb.AllowsDirect(a):
		return false, true, fmt.Sprintf("VM %q does not list %q in vrdma.directPeers", b, a)
	}
	return true, true, fmt.Sprintf("memcpy-direct: VMs %s and %s, both on this host, list each other in vrdma.directPeers", a, b)
}
