// SPDX-License-Identifier: Apache-2.0

package vmconfig

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/vmx"
)

// example is a vSphere VMX snippet of a VM with a PVRDMA adapter, with
// the vrdma keys and MAC addresses added.
const example = `.encoding = "UTF-8"
config.version = "8"
virtualHW.version = "20"
guestOS = "ubuntu-64"
memSize = "8192"
sched.mem.min = "8192"
sched.mem.minSize = "8192"
sched.mem.pin = "TRUE"
sched.cpu.latencySensitivity = "normal"
vrdma.asyncMode = "TRUE"
ethernet0.present = "TRUE"
ethernet0.virtualDev = "vmxnet3"
ethernet0.addressType = "vpx"
ethernet0.generatedAddress = "00:50:56:aa:bb:00"
ethernet0.dvs.switchId = "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d"
ethernet0.dvs.portgroupId = "dvportgroup-75"
ethernet1.present = "TRUE"
ethernet1.virtualDev = "vrdma"
ethernet1.addressType = "vpx"
ethernet1.generatedAddress = "00:50:56:aa:bb:01"
ethernet1.dvs.switchId = "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d"
ethernet1.dvs.portgroupId = "dvportgroup-80"
ethernet1.dvs.portId = "12"
vrdma1.nativeEndpointSupport = "TRUE"
`

func mac(s string) net.HardwareAddr {
	hw, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return hw
}

func TestExample(t *testing.T) {
	c, err := Parse([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		MemSizeMB:          8192,
		MemMinMB:           8192,
		MemPin:             true,
		AsyncMode:          true,
		GuestOS:            "ubuntu-64",
		HWVersion:          20,
		LatencySensitivity: "normal",
		Adapters: []Adapter{{
			Index:          1,
			MAC:            mac("00:50:56:aa:bb:01"),
			SwitchID:       "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d",
			PortGroupID:    "dvportgroup-80",
			NativeEndpoint: true,
			StartConnected: true,
		}},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Parse(example) =\n%+v\nwant\n%+v", c, want)
	}
	if !c.MemoryLocked() {
		t.Error("MemoryLocked() = false")
	}
	if got := c.Adapters[0].Name(); got != "vrdma1" {
		t.Errorf("Name() = %q", got)
	}

	f, err := vmx.Parse([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := FromFile(f)
	if err != nil || !reflect.DeepEqual(c, c2) {
		t.Errorf("FromFile = %+v, %v; want the same as Parse", c2, err)
	}
}

func TestMinimal(t *testing.T) {
	c, err := Parse([]byte(`memSize = "1"`))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{MemSizeMB: 1}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got %+v; want %+v", c, want)
	}
	if c.MemoryLocked() {
		t.Error("MemoryLocked() = true without sched.mem.pin")
	}
}

// adapterLines returns .vmx lines for PVRDMA adapters with the given indexes.
func adapterLines(indexes ...int) string {
	var b strings.Builder
	for _, n := range indexes {
		fmt.Fprintf(&b, "ethernet%d.present = \"TRUE\"\nethernet%d.virtualDev = \"vrdma\"\n", n, n)
	}
	return b.String()
}

func indexes(c *Config) []int {
	var out []int
	for _, a := range c.Adapters {
		out = append(out, a.Index)
	}
	return out
}

func TestAdapters(t *testing.T) {
	tests := []struct {
		name string
		vmx  string
		want []int
	}{
		{"none", "", nil},
		{"only vmxnet3", "ethernet0.virtualDev = \"vmxnet3\"\nethernet0.present = \"TRUE\"\n", nil},
		{"one", adapterLines(0), []int{0}},
		{"ten", adapterLines(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"gaps and high numbers", adapterLines(12, 3, 10, 0), []int{0, 3, 10, 12}},
		{"highest index", adapterLines(MaxAdapterIndex), []int{MaxAdapterIndex}},
		{"present absent means present", "ethernet4.virtualDev = \"vrdma\"\n", []int{4}},
		{"present FALSE", adapterLines(1) + "ethernet2.present = \"FALSE\"\nethernet2.virtualDev = \"vrdma\"\n", []int{1}},
		{"present false lower case", "ethernet2.present = \"false\"\nethernet2.virtualDev = \"vrdma\"\n", nil},
		{"present 0", "ethernet2.present = \"0\"\nethernet2.virtualDev = \"vrdma\"\n", nil},
		{"present no", "ethernet2.present = \"No\"\nethernet2.virtualDev = \"vrdma\"\n", nil},
		{"eleven with one not present", adapterLines(0, 1, 2, 3, 4, 5, 6, 7, 8, 9) +
			"ethernet10.present = \"FALSE\"\nethernet10.virtualDev = \"vrdma\"\n", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"value case", "ethernet0.virtualDev = \"VRDMA\"\nethernet1.virtualDev = \"vRdma\"\n", []int{0, 1}},
		{"key case", "ETHERNET5.VIRTUALDEV = \"vrdma\"\nEthernet5.Present = \"FALSE\"\n", nil},
		{"duplicate last wins", "ethernet0.virtualDev = \"vrdma\"\nethernet0.virtualDev = \"vmxnet3\"\n" +
			"ethernet1.virtualDev = \"vmxnet3\"\nethernet1.virtualDev = \"vrdma\"\n", []int{1}},
		{"other devices", "ethernet0.virtualDev = \"e1000e\"\nethernet1.virtualDev = \"vrdma2\"\n" +
			"ethernet2.virtualDev = \"\"\nethernet3.virtualDev = \" vrdma\"\n", nil},
		{"not adapter keys", "ethernet.virtualDev = \"vrdma\"\nethernetX.virtualDev = \"vrdma\"\n" +
			"ethernet1.virtualDev.x = \"vrdma\"\nethernet-1.virtualDev = \"vrdma\"\nvrdma0.virtualDev = \"vrdma\"\n", nil},
		{"leading zero non-vrdma ignored", "ethernet01.virtualDev = \"vmxnet3\"\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte("memSize = \"1024\"\n" + tt.vmx))
			if err != nil {
				t.Fatal(err)
			}
			if got := indexes(c); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("adapters %v; want %v", got, tt.want)
			}
			for _, a := range c.Adapters {
				if a.Name() != fmt.Sprintf("vrdma%d", a.Index) {
					t.Errorf("Name() = %q for index %d", a.Name(), a.Index)
				}
			}
		})
	}
}

func TestAdapterFields(t *testing.T) {
	in := `memSize = "1024"
ethernet3.virtualDev = "vrdma"
ethernet3.address = "00:50:56:00:00:03"
ethernet3.generatedAddress = "00:50:56:aa:aa:03"
ethernet3.dvs.switchId = "sw"
ETHERNET3.DVS.PORTGROUPID = "pg"
VRDMA3.nativeEndpointSupport = "yes"
ethernet5.virtualDev = "vrdma"
ethernet5.address = ""
ethernet5.generatedAddress = "00-50-56-AA-AA-05"
vrdma5.nativeEndpointSupport = "FALSE"
ethernet5.startConnected = "false"
ethernet7.virtualDev = "vrdma"
ethernet7.startConnected = "TRUE"
vrdma8.nativeEndpointSupport = "not read: no adapter 8"
`
	c, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Adapter{
		{Index: 3, MAC: mac("00:50:56:00:00:03"), SwitchID: "sw", PortGroupID: "pg", NativeEndpoint: true, StartConnected: true},
		{Index: 5, MAC: mac("00:50:56:aa:aa:05")},
		{Index: 7, StartConnected: true},
	}
	if !reflect.DeepEqual(c.Adapters, want) {
		t.Errorf("Adapters =\n%+v\nwant\n%+v", c.Adapters, want)
	}
}

func TestMemoryLocked(t *testing.T) {
	tests := []struct {
		vmx  string
		want bool
	}{
		{`memSize = "4096"` + "\n" + `sched.mem.min = "4096"` + "\n" + `sched.mem.pin = "TRUE"`, true},
		{`memSize = "4096"` + "\n" + `sched.mem.min = "8192"` + "\n" + `sched.mem.pin = "true"`, true},
		{`memSize = "4096"` + "\n" + `sched.mem.min = "4095"` + "\n" + `sched.mem.pin = "TRUE"`, false},
		{`memSize = "4096"` + "\n" + `sched.mem.min = "4096"` + "\n" + `sched.mem.pin = "FALSE"`, false},
		{`memSize = "4096"` + "\n" + `sched.mem.min = "4096"`, false},
		{`memSize = "4096"` + "\n" + `sched.mem.pin = "TRUE"`, false},
	}
	for _, tt := range tests {
		c, err := Parse([]byte(tt.vmx))
		if err != nil {
			t.Fatalf("%q: %v", tt.vmx, err)
		}
		if got := c.MemoryLocked(); got != tt.want {
			t.Errorf("%q: MemoryLocked() = %v; want %v", tt.vmx, got, tt.want)
		}
	}
}

func TestValues(t *testing.T) {
	tests := []struct {
		vmx  string
		want Config
	}{
		{"memSize = \"1048576\"", Config{MemSizeMB: MaxMemSizeMB}},
		{"memSize = \"0\"\nmemSize = \"1\"", Config{MemSizeMB: 1}},
		{"memSize = 1\nsched.mem.min = \"0\"", Config{MemSizeMB: 1}},
		{"memSize = 1\nsched.mem.min = \"1048576\"", Config{MemSizeMB: 1, MemMinMB: MaxMemSizeMB}},
		{"memSize = 1\nvirtualHW.version = \"1\"", Config{MemSizeMB: 1, HWVersion: 1}},
		{"memSize = 1\nvirtualHW.version = \"255\"", Config{MemSizeMB: 1, HWVersion: 255}},
		{"memSize = 1\nVRDMA.ASYNCMODE = \"yes\"", Config{MemSizeMB: 1, AsyncMode: true}},
		{"memSize = 1\nvrdma.asyncMode = \"1\"", Config{MemSizeMB: 1, AsyncMode: true}},
		{"memSize = 1\nvrdma.asyncMode = \"fAlSe\"", Config{MemSizeMB: 1}},
		{"memSize = 1\nvrdma.directPeers = \"vmB, vm_c  vmB\tvm-d.1\"", Config{MemSizeMB: 1, DirectPeers: []string{"vmB", "vm_c", "vm-d.1"}}},
		{"memSize = 1\nvrdma.directPeers = \"\"", Config{MemSizeMB: 1}},
		{"memSize = 1\nguestOS = \"rhel9-64\"\nsched.cpu.latencySensitivity = \"high\"",
			Config{MemSizeMB: 1, GuestOS: "rhel9-64", LatencySensitivity: "high"}},
	}
	for _, tt := range tests {
		c, err := Parse([]byte(tt.vmx))
		if err != nil {
			t.Errorf("%q: %v", tt.vmx, err)
			continue
		}
		if !reflect.DeepEqual(*c, tt.want) {
			t.Errorf("%q: got %+v; want %+v", tt.vmx, *c, tt.want)
		}
	}
}

func TestErrors(t *testing.T) {
	const mem = "memSize = \"1024\"\n"
	tests := []struct {
		name string
		vmx  string
		key  string
		line int
		text string // the whole Error() text, or a part of it if it ends in "..."
	}{
		{"memSize missing", "guestOS = \"ubuntu-64\"\n", "memSize", 0,
			`memSize: missing; set memSize to the guest memory in MB, e.g. memSize = "4096"`},
		{"memSize not a number", "a = 1\nb = 2\nc = 3\nmemSize = \"abc\"\n", "memSize", 4,
			`memSize = "abc" (line 4): not a number; set memSize to the guest memory in MB, e.g. memSize = "4096"`},
		{"memSize zero", "memSize = \"0\"\n", "memSize", 1,
			`memSize = "0" (line 1): out of range: memSize must be from 1 to 1048576 (the guest memory in MB), e.g. memSize = "4096"`},
		{"memSize too large", "memSize = \"1048577\"\n", "memSize", 1, "... out of range: memSize must be from 1 to 1048576..."},
		{"memSize huge", "memSize = \"99999999999999999999999\"\n", "memSize", 1, "... a number far too large; ..."},
		{"memSize negative", "memSize = \"-1\"\n", "memSize", 1, "... not a number; ..."},
		{"memSize plus", "memSize = \"+1\"\n", "memSize", 1, "... not a number; ..."},
		{"memSize hex", "memSize = \"0x100\"\n", "memSize", 1, "... not a number; ..."},
		{"memSize leading zero", "memSize = \"0100\"\n", "memSize", 1, "... leading zero..."},
		{"memSize space", "memSize = \" 100\"\n", "memSize", 1, "... not a number; ..."},
		{"memSize empty", "memSize = \"\"\n", "memSize", 1, `memSize = "" (line 1): empty; set memSize...`},
		{"memSize unit", "memSize = \"4G\"\n", "memSize", 1, "... not a number; ..."},
		{"memSize unicode digit", "memSize = \"٣\"\n", "memSize", 1, "... not a number; ..."},
		{"sched.mem.min bad", mem + "sched.mem.min = \"x\"\n", "sched.mem.min", 2,
			`sched.mem.min = "x" (line 2): not a number; set sched.mem.min to the memory reservation in MB...`},
		{"sched.mem.min too large", mem + "sched.mem.min = \"2000000\"\n", "sched.mem.min", 2,
			"... must be from 0 to 1048576 ..."},
		{"hw version zero", mem + "virtualHW.version = \"0\"\n", "virtualHW.version", 2,
			"... must be from 1 to 255 (the virtual hardware version), e.g. virtualHW.version = \"20\""},
		{"hw version 256", mem + "virtualHW.version = \"256\"\n", "virtualHW.version", 2, "... out of range..."},
		{"bad pin", mem + "\nsched.mem.pin = \"maybe\"\n", "sched.mem.pin", 3,
			`sched.mem.pin = "maybe" (line 3): not a boolean; use sched.mem.pin = "TRUE" or sched.mem.pin = "FALSE" (1/0 and yes/no are accepted too, in any case)`},
		{"bad pin on", mem + "sched.mem.pin = \"on\"\n", "sched.mem.pin", 2, "... not a boolean..."},
		{"bad pin empty", mem + "sched.mem.pin = \"\"\n", "sched.mem.pin", 2, "... not a boolean..."},
		{"bad directPeers name", mem + "vrdma.directPeers = \"vmB -x\"\n", "vrdma.directPeers", 2, `... "-x" is not a VM name...`},
		{"bad directPeers char", mem + "vrdma.directPeers = \"vm/B\"\n", "vrdma.directPeers", 2, `... "vm/B" is not a VM name...`},
		{"too many directPeers", mem + "vrdma.directPeers = \"" + strings.Repeat("v ", MaxDirectPeers+1) + "\"\n", "vrdma.directPeers", 2, "... at most 64 are allowed..."},
		{"bad asyncMode", mem + "vrdma.asyncMode = \"TRUE \"\n", "vrdma.asyncMode", 2, `vrdma.asyncMode = "TRUE " (line 2): not a boolean...`},
		{"bad present", mem + "ethernet3.virtualDev = \"vrdma\"\nethernet3.present = \"yes please\"\n", "ethernet3.present", 3, "... not a boolean..."},
		{"bad nativeEndpointSupport", mem + "ethernet3.virtualDev = \"vrdma\"\nvrdma3.nativeEndpointSupport = \"2\"\n",
			"vrdma3.nativeEndpointSupport", 3, "... not a boolean..."},
		{"bad MAC", mem + "ethernet1.virtualDev = \"vrdma\"\nethernet1.address = \"00:50:56:zz:00:01\"\n", "ethernet1.address", 3,
			`ethernet1.address = "00:50:56:zz:00:01" (line 3): not a MAC address; write a unicast MAC address as six hex bytes, e.g. ethernet1.address = "00:50:56:01:02:03"`},
		{"EUI-64 MAC", mem + "ethernet1.virtualDev = \"vrdma\"\nethernet1.generatedAddress = \"00:50:56:ff:fe:00:00:01\"\n",
			"ethernet1.generatedAddress", 3, "... not a MAC address..."},
		{"multicast MAC", mem + "ethernet1.virtualDev = \"vrdma\"\nethernet1.generatedAddress = \"01:00:5e:00:00:01\"\n",
			"ethernet1.generatedAddress", 3, "... multicast or broadcast..."},
		{"broadcast MAC", mem + "ethernet1.virtualDev = \"vrdma\"\nethernet1.address = \"ff:ff:ff:ff:ff:ff\"\n",
			"ethernet1.address", 3, "... multicast or broadcast..."},
		{"zero MAC", mem + "ethernet1.virtualDev = \"vrdma\"\nethernet1.address = \"00:00:00:00:00:00\"\n",
			"ethernet1.address", 3, "... all-zero..."},
		{"long MAC", mem + "ethernet1.virtualDev = \"vrdma\"\nethernet1.address = \"" + strings.Repeat("00:", 100) + "00\"\n",
			"ethernet1.address", 3, "... not a MAC address..."},
		{"leading zero index", mem + "ethernet01.virtualDev = \"vrdma\"\n", "ethernet01.virtualDev", 2,
			`ethernet01.virtualDev = "vrdma" (line 2): not a valid adapter key: the adapter number must be written without leading zeros and be at most 9999, as in ethernet1.virtualDev`},
		{"index too large", mem + "ethernet10000.virtualDev = \"vrdma\"\n", "ethernet10000.virtualDev", 2, "... not a valid adapter key..."},
		{"index overflow", mem + "ethernet99999999999999999999999.virtualDev = \"vrdma\"\n",
			"ethernet99999999999999999999999.virtualDev", 2, "... not a valid adapter key..."},
		{"eleven adapters", mem + adapterLines(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10), "ethernet10.virtualDev", 23,
			`ethernet10.virtualDev = "vrdma" (line 23): this is PVRDMA adapter 11 of 11 (ethernet0, ethernet1, ethernet2, ethernet3, ethernet4, ethernet5, ethernet6, ethernet7, ethernet8, ethernet9, ethernet10); a VM may have at most 10 PVRDMA adapters (vSphere 7.0.2 and later): remove adapters, or set ethernetN.present = "FALSE" on the ones not used`},
		{"eleven adapters out of order", mem + adapterLines(20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 30), "ethernet20.virtualDev", 3,
			"ethernet20.virtualDev = \"vrdma\" (line 3): this is PVRDMA adapter 11 of 12 (ethernet0, ethernet1, ethernet2, " +
				"ethernet3, ethernet4, ethernet5, ethernet6, ethernet7, ethernet8, ethernet9, ethernet20, ...); a VM may have..."},
		{"hostile value shown escaped", "memSize = \"|1B[2J|0A\"\n", "memSize", 1, `memSize = "\x1b[2J\n" (line 1): not a number...`},
		{"long value shortened", "memSize = \"" + strings.Repeat("9", 100) + "\"\n", "memSize", 1,
			`memSize = "` + strings.Repeat("9", 64) + `"... (line 1): a number far too large...`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.vmx))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c)
			}
			if c != nil {
				t.Error("Parse returned a Config with its error")
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not a *Error: %v", err, err)
			}
			if e.Key != tt.key || e.Line != tt.line {
				t.Errorf("Key, Line = %q, %d; want %q, %d (%v)", e.Key, e.Line, tt.key, tt.line, err)
			}
			checkText(t, err.Error(), tt.text)
		})
	}
}

// checkText checks an error text against want: the whole text, or, if want
// has "..." at either end, a prefix, suffix or substring.
func checkText(t *testing.T, got, want string) {
	t.Helper()
	pre, suf := strings.HasPrefix(want, "..."), strings.HasSuffix(want, "...")
	w := strings.TrimSuffix(strings.TrimPrefix(want, "..."), "...")
	var ok bool
	switch {
	case pre && suf:
		ok = strings.Contains(got, w)
	case pre:
		ok = strings.HasSuffix(got, w)
	case suf:
		ok = strings.HasPrefix(got, w)
	default:
		ok = got == w
	}
	if !ok {
		t.Errorf("error text\n%s\nwant\n%s", got, want)
	}
}

func TestSyntaxError(t *testing.T) {
	_, err := Parse([]byte("memSize = \"1024\"\nmemSize 4096\n"))
	var pe *vmx.ParseError
	if !errors.As(err, &pe) || pe.Line != 2 {
		t.Fatalf("err = %v; want a *vmx.ParseError on line 2", err)
	}
	if _, err := FromFile(nil); err == nil {
		t.Fatal("FromFile(nil) succeeded")
	}
}

func TestManyErrors(t *testing.T) {
	in := "memSize = \"x\"\nsched.mem.pin = \"x\"\nvrdma.asyncMode = \"x\"\n"
	_, err := Parse([]byte(in))
	if err == nil {
		t.Fatal("no error")
	}
	got := err.Error()
	for _, k := range []string{"memSize", "sched.mem.pin", "vrdma.asyncMode"} {
		if !strings.Contains(got, k+` = "x"`) {
			t.Errorf("error does not report %s:\n%s", k, got)
		}
	}
	var e *Error
	if !errors.As(err, &e) || e.Key != "memSize" {
		t.Errorf("first *Error = %+v; want memSize", e)
	}

	// Past MaxErrors problems, the rest are counted.
	var b strings.Builder
	b.WriteString("memSize = \"1\"\n")
	for i := range 50 {
		fmt.Fprintf(&b, "ethernet%d.virtualDev = \"vrdma\"\nethernet%d.present = \"bad\"\n", i, i)
	}
	_, err = Parse([]byte(b.String()))
	if err == nil {
		t.Fatal("no error")
	}
	if n := strings.Count(err.Error(), "not a boolean"); n != MaxErrors {
		t.Errorf("%d problems shown; want %d", n, MaxErrors)
	}
	// 50 bad booleans and the adapter limit: 51 problems.
	if !strings.HasSuffix(err.Error(), "\nand 31 more problems") {
		t.Errorf("error does not end with the count of the others:\n%s", err)
	}
}

// TestAdapterAddresses checks vrdmaN.ipAddress and vrdmaN.ip6Address:
// unicast addresses of their family are read, anything else is refused
// with the key.
func TestAdapterAddresses(t *testing.T) {
	base := "memSize = \"4\"\nethernet1.virtualDev = \"vrdma\"\nethernet1.present = \"TRUE\"\n"
	c, err := Parse([]byte(base + "vrdma1.ipAddress = \"10.1.0.7\"\nvrdma1.ip6Address = \"fd00::7\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a := c.Adapters[0]; a.IPv4.String() != "10.1.0.7" || a.IPv6.String() != "fd00::7" {
		t.Fatalf("addresses %v and %v, want 10.1.0.7 and fd00::7", a.IPv4, a.IPv6)
	}
	if c, err := Parse([]byte(base)); err != nil || c.Adapters[0].IPv4.IsValid() {
		t.Fatalf("no ipAddress key: %v, %v; want no address", err, c.Adapters[0].IPv4)
	}
	for _, bad := range []string{"vrdma1.ipAddress = \"10.1.0\"", "vrdma1.ipAddress = \"fd00::1\"", "vrdma1.ipAddress = \"0.0.0.0\"",
		"vrdma1.ipAddress = \"127.0.0.1\"", "vrdma1.ipAddress = \"224.0.0.1\"", "vrdma1.ipAddress = \"255.255.255.255\"",
		"vrdma1.ip6Address = \"10.1.0.7\"", "vrdma1.ip6Address = \"::ffff:10.1.0.7\"", "vrdma1.ip6Address = \"fe80::1%eth0\""} {
		_, err := Parse([]byte(base + bad + "\n"))
		key, _, _ := strings.Cut(bad, " ")
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming %s", bad, err, key)
		}
	}
}

// TestNewVMX checks that a new VM's VMX parses back to what was asked,
// and that values out of range or a guest OS that would break the file
// are refused, naming the setting.
func TestNewVMX(t *testing.T) {
	text, err := NewVMX("web", 2048, 20, "ubuntu-64")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte(text))
	if err != nil || c.MemSizeMB != 2048 || c.HWVersion != 20 || len(c.Adapters) != 0 {
		t.Fatalf("NewVMX parses to %+v, %v:\n%s", c, err, text)
	}
	for _, bad := range []struct {
		mem, hw int
		guest   string
		want    string
	}{
		{0, 20, "ubuntu-64", "memSize"}, {MaxMemSizeMB + 1, 20, "ubuntu-64", "memSize"},
		{1024, 0, "ubuntu-64", "virtualHW.version"}, {1024, MaxHWVersion + 1, "ubuntu-64", "virtualHW.version"},
		{1024, 20, "", "guestOS"}, {1024, 20, "x\"\nsched.mem.pin = \"TRUE", "guestOS"},
	} {
		if _, err := NewVMX("web", bad.mem, bad.hw, bad.guest); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("NewVMX(%d, %d, %q) = %v, want an error naming %s", bad.mem, bad.hw, bad.guest, err, bad.want)
		}
	}
}

func TestDirectVerdict(t *testing.T) {
	a := &Config{DirectPeers: []string{"b"}}
	b := &Config{DirectPeers: []string{"a"}}
	none := &Config{}
	for _, tc := range []struct {
		na, nb    string
		ca, cb    *Config
		ok, apply bool
		why       string
	}{
		{"a", "b", a, b, true, true, "list each other"},
		{"a", "b", a, none, false, true, `VM "b" does not list "a"`},
		{"a", "c", a, none, false, true, `VM "a" does not list "c"`},
		{"a", "b", none, none, false, false, ""},
		{"a", "a", a, a, false, true, "between two VMs"},
	} {
		ok, apply, why := DirectVerdict(tc.na, tc.nb, tc.ca, tc.cb)
		if ok != tc.ok || apply != tc.apply || !strings.Contains(why, tc.why) {
			t.Errorf("DirectVerdict(%s, %s) = %v, %v, %q; want %v, %v, containing %q", tc.na, tc.nb, ok, apply, why, tc.ok, tc.apply, tc.why)
		}
	}
}
