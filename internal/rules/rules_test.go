// SPDX-License-Identifier: Apache-2.0

package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/vmx"
)

// goodVM is a VM that passes every rule against the default target: one
// PVRDMA adapter, ethernet1, behind a vmxnet3 ethernet0.
const goodVM = `virtualHW.version = "20"
guestOS = "ubuntu-64"
memSize = "8192"
sched.mem.min = "8192"
sched.mem.pin = "TRUE"
ethernet0.present = "TRUE"
ethernet0.virtualDev = "vmxnet3"
ethernet0.networkName = "VM Network"
ethernet1.present = "TRUE"
ethernet1.virtualDev = "vrdma"
ethernet1.dvs.switchId = "dvs1"
ethernet1.dvs.portgroupId = "dvportgroup-80"
`

// mkVM returns goodVM changed by edits: "key=value" sets key (appending it
// if new), "-key" deletes it, and "+N" adds a PVRDMA adapter ethernetN on
// dvs1.
func mkVM(t *testing.T, edits ...string) *vmx.File {
	t.Helper()
	f, err := vmx.Parse([]byte(goodVM))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edits {
		switch {
		case strings.HasPrefix(e, "-"):
			f.Delete(e[1:])
		case strings.HasPrefix(e, "+"):
			n := e[1:]
			for _, kv := range [][2]string{{"present", "TRUE"}, {"virtualDev", "vrdma"}, {"dvs.switchId", "dvs1"},
				{"dvs.portgroupId", "dvportgroup-80"}} {
				if err := f.Set("ethernet"+n+"."+kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
		default:
			k, v, ok := strings.Cut(e, "=")
			if !ok {
				t.Fatalf("bad edit %q", e)
			}
			if err := f.Set(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

// adapters returns edits that add PVRDMA adapters ethernetN for each n.
func adapters(ns ...int) []string {
	var out []string
	for _, n := range ns {
		out = append(out, fmt.Sprintf("+%d", n))
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func mustVersion(t *testing.T, s string) Version {
	t.Helper()
	if s == "" {
		return Version{}
	}
	v, err := ParseVersion(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ruleIDs returns the rule IDs of fs, sorted.
func ruleIDs(fs []Finding) []string {
	var ids []string
	for _, f := range fs {
		ids = append(ids, f.Rule)
	}
	slices.Sort(ids)
	return ids
}

var (
	goodHost   = &Host{Name: "esx1", PVRDMAAddress: netip.MustParseAddrPort("10.0.0.1:4791"), FirewallPVRDMA: true, Switch: "dvs1"}
	noAddrHost = &Host{Name: "esx1", FirewallPVRDMA: true, Switch: "dvs1"}
	fwOffHost  = &Host{Name: "esx1", PVRDMAAddress: netip.MustParseAddrPort("10.0.0.1:4791"), Switch: "dvs1"}
	bareHost   = &Host{Name: "esx1"}
	noSwHost   = &Host{Name: "esx1", PVRDMAAddress: netip.MustParseAddrPort("10.0.0.1:4791"), FirewallPVRDMA: true}
	dvs2Host   = &Host{Name: "esx2", PVRDMAAddress: netip.MustParseAddrPort("10.0.0.2:4791"), FirewallPVRDMA: true, Switch: "dvs2"}
	unspecHost = &Host{Name: "esx1", PVRDMAAddress: netip.MustParseAddrPort("0.0.0.0:4791"), FirewallPVRDMA: true, Switch: "dvs1"}
	noPortHost = &Host{PVRDMAAddress: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), 0), FirewallPVRDMA: true, Switch: "dvs1"}
)

// ruleCase is one table test: goodVM with edits, checked against esxi
// and host, must give exactly the findings want (rule IDs, in any order).
// If key is set, the first finding must be about that key on that line.
// When esxi is given and the edits do not set virtualHW.version, the VM
// has the newest hardware version that ESXi runs (at most 20), so that
// hw-version-supported stays quiet.
type ruleCase struct {
	name  string
	edits []string
	esxi  string
	host  *Host
	want  []string
	key   string // the first finding's Key, if not ""
	line  int    // the first finding's Line, if key is set
	msg   string // a substring of the first finding's Message, if not ""
}

func runCases(t *testing.T, cases []ruleCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			esxi := mustVersion(t, tc.esxi)
			edits := tc.edits
			if hw, ok := MaxHWVersion(esxi); ok && tc.esxi != "" && !slices.ContainsFunc(edits, func(e string) bool {
				return strings.Contains(strings.ToLower(e), "virtualhw.version")
			}) {
				edits = append([]string{fmt.Sprintf("virtualHW.version=%d", min(hw, 20))}, edits...)
			}
			f := mkVM(t, edits...)
			got := Check(f, Target{ESXi: esxi, Host: tc.host})
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(ruleIDs(got), want) {
				t.Fatalf("findings %q; want %q\n%s\nVMX:\n%s", ruleIDs(got), want, findingsText(got), f.Bytes())
			}
			checkFindings(t, f, got)
			if len(got) == 0 {
				return
			}
			if tc.key != "" && (got[0].Key != tc.key || got[0].Line != tc.line) {
				t.Errorf("first finding is about %q on line %d; want %q on line %d\n%s", got[0].Key, got[0].Line, tc.key, tc.line, findingsText(got))
			}
			if tc.msg != "" && !strings.Contains(got[0].Message, tc.msg) {
				t.Errorf("message %q does not say %q", got[0].Message, tc.msg)
			}
		})
	}
}

func findingsText(fs []Finding) string {
	var b strings.Builder
	for _, f := range fs {
		fmt.Fprintf(&b, "  %s (key %q)\n", f, f.Key)
	}
	return b.String()
}

// checkFindings checks what holds for every finding: a known rule with
// its severity, a message without fmt mistakes, a Line that is Key's line,
// and the sort order.
func checkFindings(t *testing.T, f *vmx.File, fs []Finding) {
	t.Helper()
	for i, fd := range fs {
		r := slices.IndexFunc(rules, func(r Rule) bool { return r.ID == fd.Rule })
		if r < 0 {
			t.Errorf("finding %d has unknown rule %q", i, fd.Rule)
			continue
		}
		if fd.Severity != rules[r].Severity {
			t.Errorf("finding %d: severity %q; rule %s has %q", i, fd.Severity, fd.Rule, rules[r].Severity)
		}
		if fd.Message == "" || strings.Contains(fd.Message, "%!") {
			t.Errorf("finding %d: bad message %q", i, fd.Message)
		}
		switch {
		case rules[r].Host && fd.Key == "":
			if fd.Line != 0 {
				t.Errorf("host finding %d has line %d", i, fd.Line)
			}
		case fd.Key == "" && fd.Rule != RulePVRDMAAdapter:
			t.Errorf("finding %d (%s) names no key", i, fd.Rule)
		case fd.Key != "" && fd.Rule != RuleDuplicateKey && fd.Line != f.Line(fd.Key):
			t.Errorf("finding %d: line %d, but %s is on line %d", i, fd.Line, fd.Key, f.Line(fd.Key))
		}
		if i > 0 {
			p := fs[i-1]
			if p.Line == 0 && fd.Line != 0 || p.Line != 0 && fd.Line != 0 && p.Line > fd.Line {
				t.Errorf("findings %d and %d are out of order (lines %d, %d)", i-1, i, p.Line, fd.Line)
			}
		}
	}
}

func TestRuleGoodVM(t *testing.T) {
	f := mkVM(t)
	for _, target := range []Target{{}, {ESXi: Default}, {ESXi: Version{7, 0, 0}}, {ESXi: Version{6, 5, 0}, Host: goodHost}} {
		if target.ESXi.AtLeast(Version{6, 5, 0}) && target.ESXi.Compare(Version{7, 0, 0}) <= 0 {
			f = mkVM(t, "virtualHW.version=13")
		}
		if fs := Check(f, target); fs != nil {
			t.Errorf("Check against %+v: %s", target, findingsText(fs))
		}
	}
	if fs := Check(nil, Target{}); fs != nil {
		t.Errorf("Check(nil) = %v", fs)
	}
}

func TestRuleHWVersion(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "12", edits: []string{"virtualHW.version=12"}, want: []string{RuleHWVersion}, key: "virtualHW.version", line: 1, msg: "version 13 or later"},
		{name: "13", edits: []string{"virtualHW.version=13"}},
		{name: "missing", edits: []string{"-virtualHW.version"}, want: []string{RuleHWVersion}, key: "virtualHW.version", line: 0},
		{name: "not a number", edits: []string{"virtualHW.version=vmx-20"}, want: []string{RuleBadValue}, key: "virtualHW.version", line: 1},
		{name: "leading zero", edits: []string{"virtualHW.version=013"}, want: []string{RuleBadValue}},
		{name: "zero", edits: []string{"virtualHW.version=0"}, want: []string{RuleBadValue}},
		{name: "huge", edits: []string{"virtualHW.version=256"}, want: []string{RuleBadValue}},
		{name: "no adapter", edits: []string{"virtualHW.version=4", "-ethernet1.virtualDev"}, want: []string{RulePVRDMAAdapter}},
	})
}

func TestRuleHWVersionSupported(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "20 on 8.0", esxi: "8.0"},
		{name: "21 on 8.0", edits: []string{"virtualHW.version=21"}, esxi: "8.0", want: []string{RuleHWVersionSupported},
			key: "virtualHW.version", line: 1, msg: "ESXi 8.0 U2 (8.0.2) or later"},
		{name: "21 on default", edits: []string{"virtualHW.version=21"}, want: []string{RuleHWVersionSupported}, msg: "up to version 20"},
		{name: "21 on 8.0.1", edits: []string{"virtualHW.version=21"}, esxi: "8.0.1", want: []string{RuleHWVersionSupported}},
		{name: "21 on 8.0 U2", edits: []string{"virtualHW.version=21"}, esxi: "8.0 U2"},
		{name: "21 on 8.0 U3", edits: []string{"virtualHW.version=21"}, esxi: "8.0U3"},
		{name: "22 on 9.0 (unknown line)", edits: []string{"virtualHW.version=22"}, esxi: "9.0"},
		{name: "22 on 8.0 U3", edits: []string{"virtualHW.version=22"}, esxi: "8.0.3", want: []string{RuleHWVersionSupported}, msg: "or target a newer ESXi"},
		{name: "17 on 7.0", edits: []string{"virtualHW.version=17"}, esxi: "7.0"},
		{name: "18 on 7.0", edits: []string{"virtualHW.version=18"}, esxi: "7.0", want: []string{RuleHWVersionSupported}},
		{name: "18 on 7.0.1", edits: []string{"virtualHW.version=18"}, esxi: "7.0.1"},
		{name: "19 on 7.0.1", edits: []string{"virtualHW.version=19"}, esxi: "7.0.1", want: []string{RuleHWVersionSupported}},
		{name: "19 on 7.0.2", edits: []string{"virtualHW.version=19"}, esxi: "7.0.2"},
		{name: "13 on 6.5", edits: []string{"virtualHW.version=13"}, esxi: "6.5"},
		{name: "14 on 6.5", edits: []string{"virtualHW.version=14"}, esxi: "6.5", want: []string{RuleHWVersionSupported}},
		{name: "15 on 6.7", edits: []string{"virtualHW.version=15"}, esxi: "6.7", want: []string{RuleHWVersionSupported}},
		{name: "15 on 6.7 U2", edits: []string{"virtualHW.version=15"}, esxi: "6.7 Update 2"},
		{name: "without an adapter too", edits: []string{"virtualHW.version=21", "-ethernet1.virtualDev"},
			want: []string{RuleHWVersionSupported, RulePVRDMAAdapter}},
	})
}

func TestRuleESXiVersion(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "6.0", edits: []string{"virtualHW.version=11"}, esxi: "6.0", want: []string{RuleESXiVersion, RuleHWVersion},
			key: "virtualHW.version", line: 1},
		{name: "6.0 with hardware 13", edits: []string{"virtualHW.version=13"}, esxi: "6.0",
			want: []string{RuleESXiVersion, RuleHWVersionSupported}},
		{name: "5.5", edits: []string{"virtualHW.version=10"}, esxi: "5.5", want: []string{RuleESXiVersion, RuleHWVersion}},
		{name: "6.5", edits: []string{"virtualHW.version=13"}, esxi: "6.5"},
		{name: "6.0 without an adapter", edits: []string{"virtualHW.version=11", "-ethernet1.virtualDev"}, esxi: "6.0",
			want: []string{RulePVRDMAAdapter}},
	})
	f := mkVM(t, "virtualHW.version=13")
	fs := Check(f, Target{ESXi: Version{6, 0, 0}})
	i := slices.IndexFunc(fs, func(f Finding) bool { return f.Rule == RuleESXiVersion })
	if i < 0 || fs[i].Key != "ethernet1.virtualDev" || fs[i].Line != 10 ||
		!strings.Contains(fs[i].Message, "ESXi 6.5 or later") || !strings.Contains(fs[i].Message, "ESXi 6.0") {
		t.Errorf("esxi-version finding:\n%s", findingsText(fs))
	}
}

func TestRuleGuestOS(t *testing.T) {
	var cases []ruleCase
	for _, id := range []string{"ubuntu-64", "UBUNTU-64", "rhel9-64", "rhel10-64", "debian12-64", "other6xlinux-64", "other5xlinux-64",
		"rockylinux-64", "almalinux-64", "vmware-photon-64", "oraclelinux9-64", "sles15-64", "centos8-64", "amazonlinux2-64",
		"otherlinux-64", "CRXPod1-64", "linuxmint-64", " ubuntu-64 "} {
		cases = append(cases, ruleCase{name: id, edits: []string{"guestOS=" + id}})
	}
	for _, tc := range []struct{ id, msg string }{
		{"ubuntu", `set guestOS = "ubuntu-64"`},
		{"rhel7", `"rhel7-64"`},
		{"otherlinux", `"otherlinux-64"`},
		{"other3xlinux", "32-bit Linux"},
		{"redhat", `"otherlinux-64"`},
		{"windows9-64", "not a Linux guest"},
		{"windows2019srv-64", "not a Linux guest"},
		{"winXPPro-64", "not a Linux guest"},
		{"freeBSD-64", "not a Linux guest"},
		{"darwin21-64", "not a Linux guest"},
		{"solaris11-64", "not a Linux guest"},
		{"vmkernel7", "not a Linux guest"},
		{"other-64", "not a Linux guest"},
		{"arm-ubuntu-64", "Arm"},
		{"arm-other5xlinux-64", "Arm"},
		{"ubunto-64", "that vrdma knows"},
		{"", "not set"},
		{"   ", "not set"},
	} {
		cases = append(cases, ruleCase{name: "bad " + tc.id, edits: []string{"guestOS=" + tc.id}, want: []string{RuleGuestOS},
			key: "guestOS", line: 2, msg: tc.msg})
	}
	cases = append(cases,
		ruleCase{name: "missing", edits: []string{"-guestOS"}, want: []string{RuleGuestOS}, key: "guestOS", line: 0},
		ruleCase{name: "windows without an adapter", edits: []string{"guestOS=windows9-64", "-ethernet1.virtualDev"},
			want: []string{RulePVRDMAAdapter}},
	)
	runCases(t, cases)
}

func TestRuleMemoryReservation(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "min = memSize", edits: []string{"sched.mem.min=8192"}},
		{name: "min just below memSize", edits: []string{"sched.mem.min=8191"}, want: []string{RuleMemoryReservation},
			key: "sched.mem.min", line: 4, msg: `set sched.mem.min = "8192"`},
		{name: "min above memSize", edits: []string{"sched.mem.min=8193"}},
		{name: "min 0", edits: []string{"sched.mem.min=0"}, want: []string{RuleMemoryReservation}},
		{name: "min missing", edits: []string{"-sched.mem.min"}, want: []string{RuleMemoryReservation}, key: "sched.mem.min", line: 0,
			msg: `set sched.mem.min = "8192"`},
		{name: "pin FALSE", edits: []string{"sched.mem.pin=FALSE"}, want: []string{RuleMemoryReservation}, key: "sched.mem.pin", line: 5,
			msg: `set sched.mem.pin = "TRUE"`},
		{name: "pin missing", edits: []string{"-sched.mem.pin"}, want: []string{RuleMemoryReservation}, key: "sched.mem.pin", line: 0},
		{name: "pin lower case", edits: []string{"sched.mem.pin=true"}},
		{name: "pin 1", edits: []string{"sched.mem.pin=1"}},
		{name: "pin not a boolean", edits: []string{"sched.mem.pin=locked"}, want: []string{RuleBadValue}, key: "sched.mem.pin", line: 5},
		{name: "both wrong", edits: []string{"sched.mem.min=4096", "sched.mem.pin=FALSE"},
			want: []string{RuleMemoryReservation, RuleMemoryReservation}, key: "sched.mem.min", line: 4},
		{name: "memSize missing", edits: []string{"-memSize"}, want: []string{RuleMemoryReservation}, key: "memSize", line: 0},
		{name: "memSize with a unit", edits: []string{"memSize=8G"}, want: []string{RuleBadValue}, key: "memSize", line: 3},
		{name: "memSize 0", edits: []string{"memSize=0"}, want: []string{RuleBadValue}},
		{name: "memSize too large", edits: []string{"memSize=1048577", "sched.mem.min=1048577"}, want: []string{RuleBadValue, RuleBadValue}},
		{name: "min negative", edits: []string{"sched.mem.min=-1"}, want: []string{RuleBadValue}},
		{name: "large memory reserved", edits: []string{"memSize=1048576", "sched.mem.min=1048576"}},
	})
}

func TestRuleDistributedPortgroup(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "switch missing", edits: []string{"-ethernet1.dvs.switchId"}, want: []string{RuleDistributedPortgroup},
			key: "ethernet1.dvs.switchId", line: 0},
		{name: "port group missing", edits: []string{"-ethernet1.dvs.portgroupId"}, want: []string{RuleDistributedPortgroup},
			key: "ethernet1.dvs.portgroupId", line: 0},
		{name: "both missing", edits: []string{"-ethernet1.dvs.switchId", "-ethernet1.dvs.portgroupId"}, want: []string{RuleDistributedPortgroup},
			msg: "ethernet1.dvs.switchId and ethernet1.dvs.portgroupId not set"},
		{name: "empty port group", edits: []string{"ethernet1.dvs.portgroupId="}, want: []string{RuleDistributedPortgroup},
			key: "ethernet1.dvs.portgroupId", line: 12},
		{name: "standard port group", edits: []string{"-ethernet1.dvs.switchId", "-ethernet1.dvs.portgroupId", "ethernet1.networkName=VM Network"},
			want: []string{RuleDistributedPortgroup}, msg: `standard port group "VM Network"`},
		{name: "vmxnet3 on a standard port group is fine", edits: []string{"ethernet0.networkName=VM Network"}},
		{name: "each adapter", edits: append(adapters(3), "-ethernet1.dvs.portgroupId", "-ethernet3.dvs.switchId"),
			want: []string{RuleDistributedPortgroup, RuleDistributedPortgroup}},
	})
}

func TestRuleAdapterLimit(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "10 on 8.0", edits: adapters(seq(2, 10)...)},
		{name: "11 on 8.0", edits: adapters(seq(2, 11)...), want: []string{RuleAdapterLimit}, msg: "at most 10"},
		{name: "ethernet0 to ethernet10", edits: append(adapters(seq(2, 10)...), "ethernet0.virtualDev=vrdma", "ethernet0.dvs.switchId=dvs1",
			"ethernet0.dvs.portgroupId=pg"), want: []string{RuleAdapterLimit}, key: "ethernet10.virtualDev", line: 46},
		{name: "gaps and large indexes count", edits: adapters(2, 4, 6, 8, 10, 12, 14, 16, 18, 20), want: []string{RuleAdapterLimit}},
		{name: "11 with one not present", edits: append(adapters(seq(2, 11)...), "ethernet5.present=FALSE")},
		{name: "non-canonical keys are unknown", edits: append(adapters(seq(2, 10)...), "ethernet011.virtualDev=vrdma")},
		{name: "2 on 7.0.1", edits: adapters(2), esxi: "7.0.1", want: []string{RuleAdapterLimit}, key: "ethernet2.virtualDev", line: 14,
			msg: "allows only 1"},
		{name: "2 on 7.0 Update 1", edits: adapters(2), esxi: "7.0 Update 1", want: []string{RuleAdapterLimit}},
		{name: "2 on 7.0.2", edits: adapters(2), esxi: "7.0.2"},
		{name: "2 on 7.0U2", edits: adapters(2), esxi: "7.0U2"},
		{name: "1 on 7.0.1", esxi: "7.0.1"},
		{name: "2 on 6.5", edits: append(adapters(2), "virtualHW.version=13"), esxi: "6.5", want: []string{RuleAdapterLimit}},
		{name: "11 on 7.0.2", edits: append(adapters(seq(2, 11)...), "virtualHW.version=19"), esxi: "7.0.2", want: []string{RuleAdapterLimit}},
		{name: "vrdma in any case", edits: append(adapters(seq(2, 10)...), "ethernet11.virtualDev=VRDMA", "ethernet11.dvs.switchId=s",
			"ethernet11.dvs.portgroupId=p"), want: []string{RuleAdapterLimit}},
	})
}

func TestRuleNativeEndpoints(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "on hw 18", edits: []string{"virtualHW.version=18", "vrdma1.nativeEndpointSupport=TRUE"}},
		{name: "on hw 17", edits: []string{"virtualHW.version=17", "vrdma1.nativeEndpointSupport=TRUE"}, want: []string{RuleNativeEndpointHW},
			key: "vrdma1.nativeEndpointSupport", line: 13, msg: "version 18 or later"},
		{name: "off on hw 17", edits: []string{"virtualHW.version=17", "vrdma1.nativeEndpointSupport=FALSE"}},
		{name: "hw missing", edits: []string{"-virtualHW.version", "vrdma1.nativeEndpointSupport=TRUE"},
			want: []string{RuleHWVersion, RuleNativeEndpointHW}},
		{name: "hw bad", edits: []string{"virtualHW.version=x", "vrdma1.nativeEndpointSupport=TRUE"}, want: []string{RuleBadValue}},
		{name: "on 7.0.1", edits: []string{"virtualHW.version=18", "vrdma1.nativeEndpointSupport=TRUE"}, esxi: "7.0.1"},
		{name: "on 7.0 U1", edits: []string{"virtualHW.version=18", "vrdma1.nativeEndpointSupport=TRUE"}, esxi: "7.0 U1"},
		{name: "on 7.0", edits: []string{"virtualHW.version=17", "vrdma1.nativeEndpointSupport=TRUE"}, esxi: "7.0",
			want: []string{RuleNativeEndpointHW, RuleNativeEndpointVersion}},
		{name: "on 6.7 U2", edits: []string{"virtualHW.version=15", "vrdma1.nativeEndpointSupport=TRUE"}, esxi: "6.7U2",
			want: []string{RuleNativeEndpointHW, RuleNativeEndpointVersion}},
		{name: "not a boolean", edits: []string{"vrdma1.nativeEndpointSupport=enabled"}, want: []string{RuleBadValue}},
		{name: "index off by one", edits: []string{"vrdma2.nativeEndpointSupport=TRUE"}, want: []string{RuleNativeEndpointIndex},
			key: "vrdma2.nativeEndpointSupport", line: 13, msg: "ethernet2 does not exist"},
		{name: "index of a vmxnet3", edits: []string{"vrdma0.nativeEndpointSupport=TRUE"}, want: []string{RuleNativeEndpointIndex},
			msg: `ethernet0 is a "vmxnet3" adapter`},
		{name: "index of an adapter not present", edits: append(adapters(2), "ethernet2.present=FALSE", "vrdma2.nativeEndpointSupport=TRUE"),
			want: []string{RuleNativeEndpointIndex}, msg: "ethernet2 is not present"},
		{name: "index with a leading zero", edits: []string{"vrdma01.nativeEndpointSupport=TRUE"}, want: []string{RuleNativeEndpointIndex},
			msg: "names no adapter"},
		{name: "no index", edits: []string{"vrdma.nativeEndpointSupport=TRUE"}, want: []string{RuleNativeEndpointIndex}},
		{name: "index off but FALSE", edits: []string{"vrdma5.nativeEndpointSupport=FALSE"}},
		{name: "ethernet10", edits: append(adapters(10), "vrdma10.nativeEndpointSupport=TRUE")},
		{name: "key case", edits: []string{"VRDMA1.NATIVEENDPOINTSUPPORT=true"}},
		{name: "no adapter at all", edits: []string{"-ethernet1.virtualDev", "vrdma1.nativeEndpointSupport=TRUE"},
			want: []string{RuleNativeEndpointIndex, RulePVRDMAAdapter}, msg: "the VM has no PVRDMA adapter"},
	})
}

func TestRuleAsyncMode(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "on 8.0 high", edits: []string{"vrdma.asyncMode=TRUE", "sched.cpu.latencySensitivity=high"}},
		{name: "on 8.0 HIGH", edits: []string{"vrdma.asyncMode=TRUE", "sched.cpu.latencySensitivity=HIGH"}, esxi: "8.0"},
		{name: "on 7.0.3", edits: []string{"virtualHW.version=19", "vrdma.asyncMode=TRUE", "sched.cpu.latencySensitivity=high"}, esxi: "7.0.3",
			want: []string{RuleAsyncModeVersion}, key: "vrdma.asyncMode", line: 13, msg: "ESXi 8.0 or later"},
		{name: "off on 7.0", edits: []string{"virtualHW.version=17", "vrdma.asyncMode=FALSE"}, esxi: "7.0"},
		{name: "latency normal", edits: []string{"vrdma.asyncMode=TRUE", "sched.cpu.latencySensitivity=normal"},
			want: []string{RuleAsyncLatencySensitivity}, key: "sched.cpu.latencySensitivity", line: 14, msg: `"normal"`},
		{name: "latency missing", edits: []string{"vrdma.asyncMode=TRUE"}, want: []string{RuleAsyncLatencySensitivity},
			key: "sched.cpu.latencySensitivity", line: 0},
		{name: "both", edits: []string{"virtualHW.version=19", "vrdma.asyncMode=yes"}, esxi: "7.0.2",
			want: []string{RuleAsyncModeVersion, RuleAsyncLatencySensitivity}},
		{name: "not a boolean", edits: []string{"vrdma.asyncMode=on"}, want: []string{RuleBadValue}},
	})
}

func TestRuleHostRules(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "good host", host: goodHost},
		{name: "no host, no host rules", host: nil},
		{name: "no address", host: noAddrHost, want: []string{RuleHostRDMAConfigured}, msg: "no tagged PVRDMA address"},
		{name: "unspecified address", host: unspecHost, want: []string{RuleHostRDMAConfigured}},
		{name: "no port", host: noPortHost, want: []string{RuleHostRDMAConfigured}, msg: "the host has no tagged"},
		{name: "firewall off", host: fwOffHost, want: []string{RuleHostRDMAConfigured}, msg: `"pvrdma" firewall rule of host "esx1" is off`},
		{name: "bare host", host: bareHost, want: []string{RuleHostRDMAConfigured, RuleHostRDMAConfigured, RuleHostOnSwitch}},
		{name: "no switch", host: noSwHost, want: []string{RuleHostOnSwitch}, msg: "on no distributed switch"},
		{name: "other switch", host: dvs2Host, want: []string{RuleHostOnSwitch}, key: "ethernet1.dvs.switchId", line: 11,
			msg: `is on switch "dvs1", and host "esx2" is on switch "dvs2"`},
		{name: "vSphere switch UUID is not compared", host: dvs2Host,
			edits: []string{"ethernet1.dvs.switchId=50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d"}},
		{name: "no adapter, no host rules", host: bareHost, edits: []string{"-ethernet1.virtualDev"}, want: []string{RulePVRDMAAdapter}},
	})
}

func TestRulePVRDMAAdapterAndDuplicates(t *testing.T) {
	runCases(t, []ruleCase{
		{name: "no adapter", edits: []string{"ethernet1.virtualDev=vmxnet3"}, want: []string{RulePVRDMAAdapter}, key: "", msg: "no PVRDMA adapter"},
		{name: "adapter not present", edits: []string{"ethernet1.present=FALSE"}, want: []string{RulePVRDMAAdapter}},
		{name: "present not a boolean", edits: []string{"ethernet1.present=maybe"}, want: []string{RuleBadValue}, key: "ethernet1.present", line: 9},
		{name: "no adapter, bad everything else", edits: []string{"-ethernet1.virtualDev", "guestOS=windows9-64", "-memSize", "sched.mem.pin=FALSE"},
			want: []string{RulePVRDMAAdapter}},
	})
	f, err := vmx.Parse([]byte(goodVM + "memSize = \"4096\"\nMEMSIZE = \"8192\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	fs := Check(f, Target{})
	if got := ruleIDs(fs); !slices.Equal(got, []string{RuleDuplicateKey, RuleDuplicateKey}) {
		t.Fatalf("findings %q\n%s", got, findingsText(fs))
	}
	if fs[0].Key != "memSize" || fs[0].Line != 13 || fs[1].Key != "MEMSIZE" || fs[1].Line != 14 ||
		!strings.Contains(fs[0].Message, "set on line 3 and again on line 13") || !strings.Contains(fs[1].Message, `"8192" on line 14`) {
		t.Errorf("duplicate findings:\n%s", findingsText(fs))
	}
	// The finding about a key names it as spelled on the line that counts.
	f, err = vmx.Parse([]byte(strings.Replace(goodVM, `sched.mem.min = "8192"`, `sched.mem.min = "8192"`+"\nSCHED.MEM.MIN = \"100\"", 1)))
	if err != nil {
		t.Fatal(err)
	}
	fs = Check(f, Target{})
	if i := slices.IndexFunc(fs, func(f Finding) bool { return f.Rule == RuleMemoryReservation }); i < 0 || fs[i].Key != "SCHED.MEM.MIN" || fs[i].Line != 5 {
		t.Errorf("findings:\n%s", findingsText(fs))
	}
}

// TestRulesList checks Rules against the rule IDs vrdma documents
// (docs/vmx-rules.md) and the constants.
func TestRuleList(t *testing.T) {
	documented := []string{"esxi-version", "hw-version", "guest-os", "memory-reservation", "distributed-portgroup", "adapter-limit",
		"native-endpoint-hw", "native-endpoint-version", "native-endpoint-index", "async-mode-version", "async-latency-sensitivity",
		"hw-version-supported", "host-rdma-configured", "host-on-switch"}
	rs := Rules()
	seen := map[string]bool{}
	for _, r := range rs {
		if seen[r.ID] {
			t.Errorf("rule %s listed twice", r.ID)
		}
		seen[r.ID] = true
		if r.Severity != SeverityError && r.Severity != SeverityWarning {
			t.Errorf("rule %s: severity %q", r.ID, r.Severity)
		}
		if r.Description == "" || strings.Contains(r.Description, "\n") {
			t.Errorf("rule %s: description %q", r.ID, r.Description)
		}
		if r.Host != strings.HasPrefix(r.ID, "host-") {
			t.Errorf("rule %s: Host = %v", r.ID, r.Host)
		}
	}
	for _, id := range documented {
		if !seen[id] {
			t.Errorf("rule %s is missing", id)
		}
	}
	if r := rs[slices.IndexFunc(rs, func(r Rule) bool { return r.ID == RuleAsyncLatencySensitivity })]; r.Severity != SeverityWarning {
		t.Errorf("async-latency-sensitivity is %s; it is a warning", r.Severity)
	}
	rs[0].ID = "changed"
	if Rules()[0].ID == "changed" {
		t.Errorf("Rules returns the package's slice")
	}
}

func TestRuleFindingString(t *testing.T) {
	f := Finding{Rule: "hw-version", Severity: SeverityError, Key: "virtualHW.version", Line: 3, Message: "fix it"}
	if got, want := f.String(), "line 3: error [hw-version] fix it"; got != want {
		t.Errorf("String() = %q; want %q", got, want)
	}
	f.Line = 0
	if got, want := f.String(), "error [hw-version] fix it"; got != want {
		t.Errorf("String() = %q; want %q", got, want)
	}
	if HasError(nil) || HasError([]Finding{{Severity: SeverityWarning}}) || !HasError([]Finding{{Severity: SeverityWarning}, f}) {
		t.Errorf("HasError is wrong")
	}
}

// TestRuleHostFromAnyField checks that an empty host name still gives a usable
// command in the messages.
func TestRuleHostFromAnyField(t *testing.T) {
	fs := Check(mkVM(t), Target{Host: &Host{}})
	for _, f := range fs {
		if !strings.Contains(f.Message, "the host") && !strings.Contains(f.Message, "HOST") {
			t.Errorf("message without a host name: %q", f.Message)
		}
	}
}
