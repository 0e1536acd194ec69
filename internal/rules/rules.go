// SPDX-License-Identifier: Apache-2.0

// Package rules checks a VM's VMX configuration against the PVRDMA
// prerequisites (VMware's, and vrdma's own: docs/vmx-rules.md): the rules that
// refuse a power-on in vrdma and that `vrdmactl vmx check` applies to real
// vSphere .vmx files against a target ESXi version.
//
// Every rule has a stable ID (the contract documented in docs/vmx-rules.md;
// scripts and suppressions may rely on it), a severity (error or warning)
// and messages that say what to change. [Check] runs them all and returns
// the [Finding] values; [Rules] lists them.
//
// The VM rules that are prerequisites of a PVRDMA adapter (hardware
// version, guest OS, memory reservation, port group, adapter count, ESXi
// version) apply only to a VM that has one: a VM without a PVRDMA adapter
// gets a single pvrdma-adapter warning instead. The rules of a feature
// (native endpoints, async mode) apply when the feature is turned on. The
// host rules apply only when a host is given, since a .vmx file checked
// alone says nothing about the host it will run on.
//
// Check reads values leniently and never fails: a value the rules need
// that is not of its type (memSize = "lots") is a bad-value finding, and
// the rules that need it skip it. Keys no rule reads are kept and ignored.
// Check never panics and is safe for concurrent use on distinct Files.
package rules

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vrdma/vrdma/internal/vmconfig"
	"github.com/vrdma/vrdma/internal/vmx"
)

// Severities of a Finding.
const (
	// SeverityError is a finding that prevents the VM from powering on
	// with PVRDMA; `vrdmactl vmx check` exits 1 on one.
	SeverityError = "error"
	// SeverityWarning is a finding worth fixing that does not prevent a
	// power-on.
	SeverityWarning = "warning"
)

// Rule IDs. They are a stable contract (docs/vmx-rules.md): a rule may
// change its messages, never its ID.
const (
	RuleESXiVersion             = "esxi-version"              // PVRDMA needs ESXi 6.5+
	RuleHWVersion               = "hw-version"                // virtualHW.version >= 13
	RuleHWVersionSupported      = "hw-version-supported"      // the target ESXi runs virtualHW.version
	RuleGuestOS                 = "guest-os"                  // a 64-bit Linux guestOS
	RuleMemoryReservation       = "memory-reservation"        // sched.mem.pin and sched.mem.min >= memSize
	RuleDistributedPortgroup    = "distributed-portgroup"     // ethernetN.dvs.switchId and .dvs.portgroupId
	RuleAdapterLimit            = "adapter-limit"             // <= 10 PVRDMA adapters from 7.0.2, 1 before
	RuleNativeEndpointHW        = "native-endpoint-hw"        // native endpoints need virtualHW.version >= 18
	RuleNativeEndpointVersion   = "native-endpoint-version"   // native endpoints need ESXi 7.0 U1+
	RuleNativeEndpointIndex     = "native-endpoint-index"     // vrdmaX names a PVRDMA adapter ethernetX
	RuleAsyncModeVersion        = "async-mode-version"        // vrdma.asyncMode needs ESXi 8.0+
	RuleAsyncLatencySensitivity = "async-latency-sensitivity" // latency sensitivity high with async mode
	RuleHostRDMAConfigured      = "host-rdma-configured"      // host: tagged PVRDMA address, pvrdma firewall rule
	RuleHostOnSwitch            = "host-on-switch"            // host: on the adapters' distributed switch
	RuleHostNativeEndpoint      = "host-native-endpoint"      // host: an RDMA uplink with PVRDMA namespaces on
	RulePVRDMAAdapter           = "pvrdma-adapter"            // the VM has a PVRDMA adapter
	RuleDuplicateKey            = "duplicate-key"             // no key set twice
	RuleBadValue                = "bad-value"                 // numbers and booleans well formed
)

// Limits the rules enforce.
const (
	// MinHWVersion is the oldest virtual hardware version with PVRDMA.
	MinHWVersion = 13
	// MinNativeEndpointHWVersion is the oldest virtual hardware version
	// with native endpoints.
	MinNativeEndpointHWVersion = 18
	// MaxAdapters is the most PVRDMA adapters per VM from ESXi 7.0 U2 on.
	MaxAdapters = 10
	// MaxAdaptersBefore702 is the most PVRDMA adapters per VM before ESXi
	// 7.0 U2 (the 6.5-era KB 328676: "only one PVRDMA device").
	MaxAdaptersBefore702 = 1
	// maxMemSizeMB bounds memSize and sched.mem.min (1 TiB), as package
	// vmconfig does.
	maxMemSizeMB = 1048576
	// maxHWVersion bounds virtualHW.version, as package vmconfig does.
	maxHWVersion = 255
)

// Rule describes one rule, for documentation and `vrdmactl vmx rules`.
type Rule struct {
	ID          string `json:"id"`          // the stable ID, e.g. "hw-version"
	Severity    string `json:"severity"`    // SeverityError or SeverityWarning
	Description string `json:"description"` // one line: what the rule checks
	Host        bool   `json:"host"`        // a host rule: it runs only when a host is given
}

// rules is the list Rules returns, in the order Check runs them.
var rules = []Rule{
	{ID: RuleESXiVersion, Severity: SeverityError, Description: "PVRDMA needs ESXi 6.5 or later"},
	{ID: RuleHWVersion, Severity: SeverityError, Description: "PVRDMA needs virtual hardware version 13 or later (virtualHW.version)"},
	{ID: RuleHWVersionSupported, Severity: SeverityError, Description: "the target ESXi runs the VM's virtual hardware version"},
	{ID: RuleGuestOS, Severity: SeverityError, Description: "PVRDMA needs a 64-bit Linux guest (guestOS)"},
	{ID: RuleMemoryReservation, Severity: SeverityError, Description: "all guest memory reserved and locked: sched.mem.pin = \"TRUE\" and sched.mem.min at least memSize"},
	{ID: RuleDistributedPortgroup, Severity: SeverityError, Description: "each PVRDMA adapter is on a distributed port group (ethernetN.dvs.switchId and ethernetN.dvs.portgroupId)"},
	{ID: RuleAdapterLimit, Severity: SeverityError, Description: "at most 10 PVRDMA adapters per VM from ESXi 7.0 U2 on, 1 before"},
	{ID: RuleNativeEndpointHW, Severity: SeverityError, Description: "native endpoints need virtual hardware version 18 or later"},
	{ID: RuleNativeEndpointVersion, Severity: SeverityError, Description: "native endpoints need ESXi 7.0 U1 or later"},
	{ID: RuleNativeEndpointIndex, Severity: SeverityError, Description: "vrdmaX.nativeEndpointSupport names a PVRDMA adapter ethernetX"},
	{ID: RuleAsyncModeVersion, Severity: SeverityError, Description: "async mode (vrdma.asyncMode) needs ESXi 8.0 or later"},
	{ID: RuleAsyncLatencySensitivity, Severity: SeverityWarning, Description: "sched.cpu.latencySensitivity = \"high\" is recommended with async mode"},
	{ID: RuleHostRDMAConfigured, Severity: SeverityError, Description: "the host has a tagged PVRDMA address and its pvrdma firewall rule on", Host: true},
	{ID: RuleHostOnSwitch, Severity: SeverityError, Description: "the host is on a distributed switch, the one of the VM's PVRDMA adapters", Host: true},
	{ID: RuleHostNativeEndpoint, Severity: SeverityError, Description: "native endpoints need a host with an RDMA uplink and PVRDMA namespaces on", Host: true},
	{ID: RulePVRDMAAdapter, Severity: SeverityWarning, Description: "the VM has a PVRDMA adapter (otherwise the PVRDMA prerequisites are not checked)"},
	{ID: RuleDuplicateKey, Severity: SeverityWarning, Description: "no key is set twice (the last setting wins)"},
	{ID: RuleBadValue, Severity: SeverityError, Description: "the values the rules read are well formed (numbers, booleans)"},
}

// Rules returns every rule, in the order Check runs them. The caller may
// modify the returned slice.
func Rules() []Rule { return slices.Clone(rules) }

// severityOf returns the severity of rule id.
func severityOf(id string) string {
	for _, r := range rules {
		if r.ID == id {
			return r.Severity
		}
	}
	panic("rules: unknown rule " + id)
}

// ruleOrder returns the position of rule id in rules.
func ruleOrder(id string) int {
	return slices.IndexFunc(rules, func(r Rule) bool { return r.ID == id })
}

// Host is what the host rules need to know about the host a VM runs on.
// The fields mirror records.Host of the control plane.
type Host struct {
	Name string // for messages
	// PVRDMAAddress is the host's tagged PVRDMA address (ESXi's
	// Net.PVRDMAVmknic); the zero value means none is tagged.
	PVRDMAAddress netip.AddrPort
	// FirewallPVRDMA is whether the host's "pvrdma" firewall rule is on.
	FirewallPVRDMA bool
	// Switch is the distributed switch the host is on ("" = none).
	Switch string
	// Namespaces is whether PVRDMA namespaces are on for the host's RDMA
	// uplink (vrdmactl host configure --pvrdma-namespaces), as native
	// endpoints need.
	Namespaces bool
	// RDMAUplink is whether the host has an RDMA uplink on its switch.
	RDMAUplink bool
}

// Target is what a VM is checked against.
type Target struct {
	// ESXi is the ESXi version the VM is to run on; the zero Version means
	// Default (vrdma's own level, 8.0).
	ESXi Version
	// Host is the host the VM is to run on; nil skips the host rules.
	Host *Host
	// Standalone says that the VM is to run at an agent without a
	// control plane: a host with no host record, so with no RDMA uplink
	// and no PVRDMA namespaces, which native endpoints need (the one
	// host rule that runs without Host).
	Standalone bool
}

// Finding is one problem that a rule found.
type Finding struct {
	Rule     string `json:"rule"`     // the rule's stable ID, e.g. "hw-version"
	Severity string `json:"severity"` // SeverityError or SeverityWarning
	// Key is the VMX key to change, as spelled in the file when it is set
	// ("" for a host finding).
	Key string `json:"key"`
	// Line is the 1-based line of Key in the file (the setting that counts;
	// for duplicate-key, the repeated setting); 0 when Key is not set (it is
	// to be added) or for a host finding.
	Line    int    `json:"line"`
	Message string `json:"message"` // what is wrong and what to change
}

// String returns "line N: severity [rule] message", without the "line N: "
// when Line is 0.
func (f Finding) String() string {
	s := f.Severity + " [" + f.Rule + "] " + f.Message
	if f.Line > 0 {
		s = "line " + strconv.Itoa(f.Line) + ": " + s
	}
	return s
}

// HasError reports whether one of findings is an error.
func HasError(findings []Finding) bool {
	return slices.ContainsFunc(findings, func(f Finding) bool { return f.Severity == SeverityError })
}

// adapter is a PVRDMA adapter as the rules see it.
type adapter struct {
	index  int
	devKey string // its ethernetN.virtualDev key, as spelled in the file
}

// checker holds the state of one Check.
type checker struct {
	f    *vmx.File
	esxi Version
	host *Host
	// standalone: the VM runs at an agent without a control plane
	// (Target.Standalone)
	standalone bool
	findings   []Finding
	adapters   []adapter         // present PVRDMA adapters, by index
	badKeys    map[string]bool   // keys with a bad-value finding, in lower case
	spell      map[string]string // lower-case key -> its spelling on the line that counts
}

// Check runs every rule on the VMX file f against target t and returns the
// findings, sorted by line (findings on no line last), then in rule order.
// It returns nil when there is nothing to report. A nil f has no findings.
func Check(f *vmx.File, t Target) []Finding {
	if f == nil {
		return nil
	}
	c := &checker{f: f, esxi: t.ESXi, host: t.Host, standalone: t.Standalone, badKeys: make(map[string]bool)}
	if c.esxi.IsZero() {
		c.esxi = Default
	}
	c.findAdapters()
	hw, hwOK := c.number("virtualHW.version", 1, maxHWVersion, "the virtual hardware version", "20")

	if len(c.adapters) > 0 {
		c.esxiVersion()
		c.hwVersion(hw, hwOK)
	}
	c.hwVersionSupported(hw, hwOK)
	if len(c.adapters) > 0 {
		c.guestOS()
		c.memoryReservation()
		c.distributedPortgroup()
		c.adapterLimit()
	}
	c.nativeEndpoints(hw, hwOK)
	c.asyncMode()
	if c.host != nil && len(c.adapters) > 0 {
		c.hostRDMAConfigured()
		c.hostOnSwitch()
	}
	if len(c.adapters) == 0 {
		c.add(RulePVRDMAAdapter, "", "the VM has no PVRDMA adapter (ethernetN.virtualDev = \"vrdma\" with ethernetN.present = \"TRUE\"), "+
			"so the PVRDMA prerequisites were not checked: if the VM is to use PVRDMA, add a PVRDMA adapter, with the VM powered off")
	}
	c.duplicates()

	slices.SortStableFunc(c.findings, func(a, b Finding) int {
		if (a.Line == 0) != (b.Line == 0) {
			if a.Line == 0 {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(ruleOrder(a.Rule), ruleOrder(b.Rule)))
	})
	return c.findings
}

// add records a finding of rule about key (spelled as in the file if it is
// set there).
func (c *checker) add(rule, key, format string, args ...any) {
	line := 0
	if key != "" {
		line = c.f.Line(key)
		if line > 0 {
			key = c.spelling(key)
		}
	}
	c.findings = append(c.findings, Finding{Rule: rule, Severity: severityOf(rule), Key: key, Line: line,
		Message: fmt.Sprintf(format, args...)})
}

// spelling returns key as the file spells it on the line that counts (the
// last one).
func (c *checker) spelling(key string) string {
	if c.spell == nil {
		c.spell = make(map[string]string)
		for _, k := range c.f.Keys() {
			c.spell[strings.ToLower(k)] = k
		}
		for _, d := range c.f.Duplicates() { // in line order: the last one stays
			c.spell[strings.ToLower(d.Key)] = d.Key
		}
	}
	if k, ok := c.spell[strings.ToLower(key)]; ok {
		return k
	}
	return key
}

// get returns the value of key and whether it is set.
func (c *checker) get(key string) (string, bool) { return c.f.Get(key) }

// quoteValue quotes a value from the file for a message: hostile values are
// escaped and long ones shortened.
func quoteValue(v string) string {
	const max = 64
	if len(v) > max {
		return strconv.Quote(v[:max]) + "..."
	}
	return strconv.Quote(v)
}

// badValue records a bad-value finding for key, once.
func (c *checker) badValue(key, format string, args ...any) {
	if c.badKeys[strings.ToLower(key)] {
		return
	}
	c.badKeys[strings.ToLower(key)] = true
	v, _ := c.get(key)
	c.add(RuleBadValue, key, "%s = %s: %s", key, quoteValue(v), fmt.Sprintf(format, args...))
}

// number returns the value of a numeric key and true, or false if it is
// not set or bad (a bad value is a bad-value finding).
func (c *checker) number(key string, lo, hi int, what, example string) (int, bool) {
	v, ok := c.get(key)
	if !ok {
		return 0, false
	}
	n, problem := vmconfig.ParseDecimal(v)
	switch {
	case problem != "":
		c.badValue(key, "%s; set %s to %s, e.g. %s = %q", problem, key, what, key, example)
		return 0, false
	case n < lo || n > hi:
		c.badValue(key, "out of range; set %s to %s, from %d to %d, e.g. %s = %q", key, what, lo, hi, key, example)
		return 0, false
	}
	return n, true
}

// boolean returns the value of a boolean key, def if it is not set, and
// false for ok if it is bad (a bad-value finding).
func (c *checker) boolean(key string, def bool) (value, ok bool) {
	v, set := c.get(key)
	if !set {
		return def, true
	}
	b, good := vmconfig.ParseBool(v)
	if !good {
		c.badValue(key, "not a boolean; write %s = \"TRUE\" or %s = \"FALSE\"", key, key)
		return def, false
	}
	return b, true
}

// ethernetState is what the file says about ethernetN.
type ethernetState struct {
	dev     string // ethernetN.virtualDev
	devSet  bool
	present bool // ethernetN.present, true when not set or bad (as package vmconfig reads it)
}

// ethernet returns what the file says about ethernetN.
func (c *checker) ethernet(n int) ethernetState {
	var s ethernetState
	s.dev, s.devSet = c.get(fmt.Sprintf("ethernet%d.virtualDev", n))
	s.present, _ = c.boolean(fmt.Sprintf("ethernet%d.present", n), true)
	return s
}

// findAdapters finds the present PVRDMA adapters: ethernetN with
// ethernetN.virtualDev = "vrdma" (any case) and ethernetN.present not
// false. Keys with a non-canonical N (ethernet01) are unknown keys, as they
// are to VMware.
func (c *checker) findAdapters() {
	for _, key := range c.f.Keys() {
		n, canonical, ok := vmconfig.IndexedKey(key, "ethernet", ".virtualdev")
		if !ok || !canonical {
			continue
		}
		if s := c.ethernet(n); strings.EqualFold(s.dev, "vrdma") && s.present {
			c.adapters = append(c.adapters, adapter{index: n, devKey: key})
		}
	}
	slices.SortFunc(c.adapters, func(a, b adapter) int { return cmp.Compare(a.index, b.index) })
}

// adapterNames returns "ethernet1, ethernet3", cut after max names.
func adapterNames(as []adapter, max int) string {
	var names []string
	for i, a := range as {
		if i == max {
			names = append(names, "...")
			break
		}
		names = append(names, "ethernet"+strconv.Itoa(a.index))
	}
	return strings.Join(names, ", ")
}

// esxiName returns "ESXi 7.0 U2 (7.0.2)", or "ESXi 8.0".
func esxiName(v Version) string {
	if v.Update == 0 {
		return "ESXi " + v.String()
	}
	return fmt.Sprintf("ESXi %s (%d.%d.%d)", v, v.Major, v.Minor, v.Update)
}

// esxiVersion: PVRDMA needs ESXi 6.5 or later.
func (c *checker) esxiVersion() {
	if c.esxi.AtLeast(minPVRDMA) {
		return
	}
	a := c.adapters[0]
	c.add(RuleESXiVersion, a.devKey, "PVRDMA adapters (here %s) need ESXi 6.5 or later, and the target is %s: "+
		"target ESXi 6.5 or later (upgrade the host), or remove the PVRDMA adapters",
		adapterNames(c.adapters, 4), esxiName(c.esxi))
}

// hwVersion: PVRDMA needs virtual hardware 13 or later.
func (c *checker) hwVersion(hw int, ok bool) {
	const key = "virtualHW.version"
	switch {
	case ok && hw >= MinHWVersion:
	case ok:
		c.add(RuleHWVersion, key, "virtualHW.version is %d, and PVRDMA needs virtual hardware version %d or later: "+
			"upgrade the VM's compatibility with the VM powered off (set virtualHW.version = \"%d\" or later; "+
			"ESXi 6.5 or later runs it)", hw, MinHWVersion, MinHWVersion)
	default:
		if _, set := c.get(key); set {
			return // a bad-value finding already
		}
		c.add(RuleHWVersion, key, "virtualHW.version is not set, and PVRDMA needs virtual hardware version %d or later: "+
			"set virtualHW.version = \"%d\" or later", MinHWVersion, MinHWVersion)
	}
}

// hwVersionSupported: the target ESXi runs the VM's hardware version.
func (c *checker) hwVersionSupported(hw int, ok bool) {
	if !ok {
		return
	}
	max, known := MaxHWVersion(c.esxi)
	if !known || hw <= max {
		return
	}
	fix := "or target a newer ESXi"
	if first, found := firstESXiFor(hw); found {
		fix = fmt.Sprintf("or target %s or later", esxiName(first))
	}
	c.add(RuleHWVersionSupported, "virtualHW.version", "virtualHW.version is %d, and %s runs virtual hardware up to version %d: "+
		"set virtualHW.version = \"%d\" or lower (a VM's compatibility cannot be downgraded in place: "+
		"re-create it at that version), %s", hw, esxiName(c.esxi), max, max, fix)
}

// guestOS: PVRDMA needs a 64-bit Linux guest.
func (c *checker) guestOS() {
	const key = "guestOS"
	const examples = `e.g. "ubuntu-64", "rhel9-64", "debian12-64" or "other5xlinux-64"`
	id, set := c.get(key)
	if !set || strings.TrimSpace(id) == "" {
		c.add(RuleGuestOS, key, "guestOS is not set, and PVRDMA needs a 64-bit Linux guest: set guestOS to the "+
			"guest's 64-bit Linux ID, %s", examples)
		return
	}
	q := quoteValue(id)
	switch classifyGuest(id) {
	case guestLinux64:
	case guestLinux32:
		c.add(RuleGuestOS, key, "guestOS %s is a 32-bit Linux guest, and PVRDMA needs a 64-bit Linux guest: "+
			"install a 64-bit Linux and set guestOS = %q", q, guest64Suggestion(id))
	case guestArmLinux:
		c.add(RuleGuestOS, key, "guestOS %s is an Arm guest, and ESXi on Arm has no PVRDMA: "+
			"run the VM on an x86 host with a 64-bit x86 Linux guest ID, %s", q, examples)
	case guestOther:
		c.add(RuleGuestOS, key, "guestOS %s is not a Linux guest, and PVRDMA needs a 64-bit Linux guest "+
			"(with the vmw_pvrdma driver, Linux 4.6 or later): use a 64-bit Linux guest, %s", q, examples)
	default:
		c.add(RuleGuestOS, key, "guestOS %s is not a 64-bit Linux guest ID that vrdma knows, and PVRDMA needs a "+
			"64-bit Linux guest: set guestOS to the guest's 64-bit Linux ID, %s", q, examples)
	}
}

// memoryReservation: all guest memory reserved and locked.
func (c *checker) memoryReservation() {
	const how = "(vSphere Client: Edit Settings > Memory > \"Reserve all guest memory (All locked)\")"
	size, sizeOK := c.number("memSize", 1, maxMemSizeMB, "the guest memory in MB", "4096")
	resv, resvOK := c.number("sched.mem.min", 0, maxMemSizeMB,
		"the memory reservation in MB (the same as memSize to reserve all guest memory)", "4096")
	pin, pinOK := c.boolean("sched.mem.pin", false)

	_, sizeSet := c.get("memSize")
	_, minSet := c.get("sched.mem.min")
	switch {
	case !sizeSet:
		c.add(RuleMemoryReservation, "memSize", "memSize is not set, so no reservation can cover all guest memory: "+
			"set memSize to the guest memory in MB and sched.mem.min to the same value")
	case !sizeOK:
		// a bad-value finding already
	case !minSet:
		c.add(RuleMemoryReservation, "sched.mem.min", "sched.mem.min is not set, and PVRDMA needs all guest memory "+
			"reserved: set sched.mem.min = \"%d\" (memSize) %s", size, how)
	case resvOK && resv < size:
		c.add(RuleMemoryReservation, "sched.mem.min", "sched.mem.min is %d MB and memSize %d MB, and PVRDMA needs "+
			"all guest memory reserved: set sched.mem.min = \"%d\" %s", resv, size, size, how)
	}
	if pinOK && !pin {
		what := "is not set"
		if v, set := c.get("sched.mem.pin"); set {
			what = "is " + quoteValue(v)
		}
		c.add(RuleMemoryReservation, "sched.mem.pin", "sched.mem.pin %s, and PVRDMA needs all guest memory locked: "+
			"set sched.mem.pin = \"TRUE\" %s", what, how)
	}
}

// distributedPortgroup: each PVRDMA adapter is on a distributed port group.
func (c *checker) distributedPortgroup() {
	for _, a := range c.adapters {
		eth := "ethernet" + strconv.Itoa(a.index)
		sw, _ := c.get(eth + ".dvs.switchId")
		pg, _ := c.get(eth + ".dvs.portgroupId")
		if strings.TrimSpace(sw) != "" && strings.TrimSpace(pg) != "" {
			continue
		}
		var missing []string
		key := eth + ".dvs.portgroupId"
		if strings.TrimSpace(sw) == "" {
			missing = append(missing, eth+".dvs.switchId")
			if strings.TrimSpace(pg) != "" {
				key = eth + ".dvs.switchId"
			}
		}
		if strings.TrimSpace(pg) == "" {
			missing = append(missing, eth+".dvs.portgroupId")
		}
		where := ""
		if name, ok := c.get(eth + ".networkName"); ok && name != "" {
			where = fmt.Sprintf(" It is on the standard port group %s (%s.networkName).", quoteValue(name), eth)
		}
		c.add(RuleDistributedPortgroup, key, "PVRDMA adapter %s is not on a distributed port group: %s not set.%s "+
			"Connect the adapter to a distributed port group of the vSphere Distributed Switch "+
			"(in the file: %s.dvs.switchId = the switch's UUID and %s.dvs.portgroupId = the port group's key, e.g. \"dvportgroup-80\")",
			eth, strings.Join(missing, " and "), where, eth, eth)
	}
}

// adapterLimit: at most 10 PVRDMA adapters from ESXi 7.0 U2 on, 1 before.
func (c *checker) adapterLimit() {
	limit := MaxAdapters
	if !c.esxi.AtLeast(minMultiAdapter) {
		limit = MaxAdaptersBefore702
	}
	n := len(c.adapters)
	if n <= limit {
		return
	}
	extra := c.adapters[limit]
	if limit == MaxAdaptersBefore702 {
		c.add(RuleAdapterLimit, extra.devKey, "the VM has %d PVRDMA adapters (%s), and %s allows only %d per VM "+
			"(%d from ESXi 7.0 U2 on): remove all but one, or target ESXi 7.0 U2 (7.0.2) or later",
			n, adapterNames(c.adapters, 12), esxiName(c.esxi), limit, MaxAdapters)
		return
	}
	c.add(RuleAdapterLimit, extra.devKey, "the VM has %d PVRDMA adapters (%s), and a VM may have at most %d: "+
		"remove %d of them, or set ethernetN.present = \"FALSE\" on the ones not used",
		n, adapterNames(c.adapters, 12), limit, n-limit)
}

// nativeEndpoints: vrdmaX.nativeEndpointSupport needs hardware 18, ESXi
// 7.0 U1 and an adapter ethernetX.
func (c *checker) nativeEndpoints(hw int, hwOK bool) {
	const suffix = ".nativeendpointsupport"
	for _, key := range c.f.Keys() {
		lower := strings.ToLower(key)
		if !strings.HasPrefix(lower, "vrdma") || !strings.HasSuffix(lower, suffix) {
			continue
		}
		if on, ok := c.boolean(key, false); !ok || !on {
			continue
		}
		c.nativeEndpointIndex(key)
		if !hwOK || hw < MinNativeEndpointHWVersion {
			what := "not set"
			if hwOK {
				what = strconv.Itoa(hw)
			}
			if _, set := c.get("virtualHW.version"); !set || hwOK {
				c.add(RuleNativeEndpointHW, key, "%s turns on native endpoints, which need virtual hardware version %d "+
					"or later, and virtualHW.version is %s: upgrade the VM's compatibility with the VM powered off "+
					"(virtualHW.version = \"%d\" or later, which needs ESXi 7.0 U1 or later), or set %s = \"FALSE\"",
					key, MinNativeEndpointHWVersion, what, MinNativeEndpointHWVersion, key)
			}
		}
		if !c.esxi.AtLeast(minNativeEndpoint) {
			c.add(RuleNativeEndpointVersion, key, "%s turns on native endpoints, which need ESXi 7.0 U1 (7.0.1) or later, "+
				"and the target is %s: target ESXi 7.0 U1 (7.0.1) or later, or set %s = \"FALSE\"",
				key, esxiName(c.esxi), key)
		}
		c.nativeEndpointHost(key)
	}
}

// nativeEndpointHost: native endpoints need the VM's host to have an
// RDMA uplink with PVRDMA namespaces on, since the adapter's identifiers
// are to be real on that uplink's fabric.
func (c *checker) nativeEndpointHost(key string) {
	switch {
	case c.standalone:
		c.add(RuleHostNativeEndpoint, key, "%s turns on native endpoints, and the VM is to power on at an agent without a "+
			"control plane, whose host has no RDMA uplink and no PVRDMA namespaces: run the VM on a host of the control "+
			"plane with an RDMA uplink (vrdmactl vm create, then vm power-on --host HOST) and turn namespaces on there "+
			"(vrdmactl host configure HOST --pvrdma-namespaces on), or set %s = \"FALSE\"", key, key)
	case c.host == nil:
	case !c.host.RDMAUplink:
		c.add(RuleHostNativeEndpoint, key, "%s turns on native endpoints, and %s has no RDMA uplink, which native endpoints "+
			"are reached through: place the VM on a host with one (vrdmad --rdma-uplink KIND/ADDRESS), or set %s = \"FALSE\"",
			key, c.hostName(), key)
	case !c.host.Namespaces:
		c.add(RuleHostNativeEndpoint, key, "%s turns on native endpoints, and PVRDMA namespaces are off on %s: turn them on "+
			"with vrdmactl host configure %s --pvrdma-namespaces on, or set %s = \"FALSE\"",
			key, c.hostName(), c.hostArg(), key)
	}
}

// nativeEndpointIndex: vrdmaX.nativeEndpointSupport must name a PVRDMA
// adapter ethernetX.
func (c *checker) nativeEndpointIndex(key string) {
	have := "the VM has no PVRDMA adapter"
	if len(c.adapters) > 0 {
		var keys []string
		for _, a := range c.adapters {
			keys = append(keys, fmt.Sprintf("ethernet%d (vrdma%d.nativeEndpointSupport)", a.index, a.index))
		}
		have = "the VM's PVRDMA adapters are " + strings.Join(keys, ", ")
	}
	const rule = "vrdmaX is the PVRDMA adapter ethernetX, whose number is the network adapter's number minus 1 " +
		"(\"Network adapter 2\" is ethernet1, so vrdma1)"
	n, canonical, ok := vmconfig.IndexedKey(key, "vrdma", ".nativeendpointsupport")
	if !ok || !canonical {
		c.add(RuleNativeEndpointIndex, key, "%s names no adapter: %s; write vrdmaX.nativeEndpointSupport with X the "+
			"adapter's number, without leading zeros; %s", key, rule, have)
		return
	}
	if slices.ContainsFunc(c.adapters, func(a adapter) bool { return a.index == n }) {
		return
	}
	eth := fmt.Sprintf("ethernet%d", n)
	s := c.ethernet(n)
	var why string
	switch {
	case !s.devSet:
		why = eth + " does not exist"
	case !strings.EqualFold(s.dev, "vrdma"):
		why = fmt.Sprintf("%s is a %s adapter, not PVRDMA (%s.virtualDev = %s)", eth, quoteValue(s.dev), eth, quoteValue(s.dev))
	default:
		why = fmt.Sprintf("%s is not present (%s.present)", eth, eth)
	}
	c.add(RuleNativeEndpointIndex, key, "%s names %s, and %s: %s; %s", key, eth, why, rule, have)
}

// asyncMode: vrdma.asyncMode needs ESXi 8.0, and latency sensitivity
// "high" is recommended with it.
func (c *checker) asyncMode() {
	const key = "vrdma.asyncMode"
	if on, ok := c.boolean(key, false); !ok || !on {
		return
	}
	if !c.esxi.AtLeast(minAsyncMode) {
		c.add(RuleAsyncModeVersion, key, "vrdma.asyncMode turns on async mode, which needs ESXi 8.0 or later, "+
			"and the target is %s: target ESXi 8.0 or later, or set vrdma.asyncMode = \"FALSE\"",
			esxiName(c.esxi))
	}
	const lkey = "sched.cpu.latencySensitivity"
	ls, set := c.get(lkey)
	if strings.EqualFold(strings.TrimSpace(ls), "high") {
		return
	}
	what := "not set (normal)"
	if set {
		what = quoteValue(ls)
	}
	c.add(RuleAsyncLatencySensitivity, lkey, "async mode busy-polls the VM's rings on the host's CPUs, and "+
		"sched.cpu.latencySensitivity is %s: set sched.cpu.latencySensitivity = \"high\" "+
		"(vSphere Client: Edit Settings > VM Options > Advanced > Latency Sensitivity), as recommended with async mode", what)
}

// hostName returns the host's name for messages.
func (c *checker) hostName() string {
	if c.host.Name == "" {
		return "the host"
	}
	return "host " + strconv.Quote(c.host.Name)
}

// hostArg returns the host's name as a vrdmactl argument.
func (c *checker) hostArg() string {
	if c.host.Name == "" {
		return "HOST"
	}
	return c.host.Name
}

// hostRDMAConfigured: a tagged PVRDMA address and the pvrdma firewall rule.
func (c *checker) hostRDMAConfigured() {
	addr := c.host.PVRDMAAddress
	if !addr.Addr().IsValid() || addr.Addr().IsUnspecified() || addr.Port() == 0 {
		c.add(RuleHostRDMAConfigured, "", "%s has no tagged PVRDMA address (ESXi: Net.PVRDMAVmknic), so its VMs "+
			"cannot reach PVRDMA peers on other hosts: tag one with vrdmactl host configure %s --pvrdma-address ADDRESS:PORT",
			c.hostName(), c.hostArg())
	}
	if !c.host.FirewallPVRDMA {
		c.add(RuleHostRDMAConfigured, "", "the \"pvrdma\" firewall rule of %s is off, so no PVRDMA traffic passes "+
			"between hosts: turn it on with vrdmactl host configure %s --firewall-pvrdma on", c.hostName(), c.hostArg())
	}
}

// looksLikeUUID reports whether s is 32 hex digits once spaces and dashes
// are removed: the vSphere form of a switch ID, which cannot be compared
// with a switch name.
func looksLikeUUID(s string) bool {
	n := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ' ' || c == '-':
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
			n++
		default:
			return false
		}
	}
	return n == 32
}

// hostOnSwitch: the host is on a distributed switch, the one the VM's
// adapters name when they name it (a vSphere switch UUID cannot be
// compared with the host's switch name and is not).
func (c *checker) hostOnSwitch() {
	if c.host.Switch == "" {
		c.add(RuleHostOnSwitch, "", "%s is on no distributed switch, and PVRDMA adapters connect to a distributed "+
			"port group: add the host to the switch of the VM's port groups (start its vrdmad with --switch NAME), "+
			"or place the VM on a host of that switch", c.hostName())
		return
	}
	for _, a := range c.adapters {
		key := fmt.Sprintf("ethernet%d.dvs.switchId", a.index)
		sw, _ := c.get(key)
		sw = strings.TrimSpace(sw)
		if sw == "" || sw == c.host.Switch || looksLikeUUID(sw) {
			continue
		}
		c.add(RuleHostOnSwitch, key, "PVRDMA adapter ethernet%d is on switch %s, and %s is on switch %s: "+
			"place the VM on a host of switch %s, or connect the adapter to a port group of switch %s",
			a.index, quoteValue(sw), c.hostName(), strconv.Quote(c.host.Switch), quoteValue(sw), strconv.Quote(c.host.Switch))
	}
}

// duplicates reports every key set more than once.
func (c *checker) duplicates() {
	for _, d := range c.f.Duplicates() {
		v, _ := c.get(d.Key)
		c.findings = append(c.findings, Finding{Rule: RuleDuplicateKey, Severity: severityOf(RuleDuplicateKey),
			Key: d.Key, Line: d.Line,
			Message: fmt.Sprintf("%s is set on line %d and again on line %d; the last setting wins (%s = %s on line %d): "+
				"delete the settings that do not count", d.Key, d.Previous, d.Line, d.Key, quoteValue(v), c.f.Line(d.Key))})
	}
}
