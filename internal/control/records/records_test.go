// SPDX-License-Identifier: Apache-2.0

package records

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestCheckName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
		says string
	}{
		{"vm1", true, ""},
		{"a", true, ""},
		{"dvportgroup-80", true, ""},
		{"esx-01.lab_a", true, ""},
		{strings.Repeat("x", 64), true, ""},
		{"", false, "missing"},
		{strings.Repeat("x", 65), false, "65 characters, more than 64"},
		{"-vm", false, "start with a letter or digit"},
		{".hidden", false, "start with a letter or digit"},
		{"vm/1", false, `'/' at offset 2`},
		{"vm 1", false, `' ' at offset 2`},
		{"vm\x00", false, `'\x00' at offset 2`},
		{"vmé", false, "offset 2"},
	}
	for _, tt := range tests {
		err := CheckName(tt.name)
		if (err == nil) != tt.ok {
			t.Errorf("CheckName(%q) = %v; want ok=%v", tt.name, err, tt.ok)
			continue
		}
		if err != nil && !strings.Contains(err.Error(), tt.says) {
			t.Errorf("CheckName(%q) = %q; want it to say %q", tt.name, err, tt.says)
		}
	}
}

func TestAdapterName(t *testing.T) {
	for _, ok := range []string{"vrdma0", "vrdma9", "vrdma10", "vrdma9999"} {
		n, err := ParseAdapterName(ok)
		if err != nil || AdapterName(n) != ok {
			t.Errorf("ParseAdapterName(%q) = %d, %v", ok, n, err)
		}
	}
	for _, bad := range []string{"", "vrdma", "vrdma01", "vrdma-1", "vrdma-0", "vrdma+1", "vrdma10000", "eth0", "vrdma1x", "VRDMA1"} {
		if _, err := ParseAdapterName(bad); err == nil {
			t.Errorf("ParseAdapterName(%q) accepted", bad)
		}
	}
}

func TestParseGID(t *testing.T) {
	g, err := ParseGID("10.1.2.3")
	if err != nil || g.String() != "::ffff:10.1.2.3" || !g.Is6() {
		t.Errorf("ParseGID(10.1.2.3) = %v, %v; want ::ffff:10.1.2.3", g, err)
	}
	g, err = ParseGID("fe80::1")
	if err != nil || g.String() != "fe80::1" {
		t.Errorf("ParseGID(fe80::1) = %v, %v", g, err)
	}
	for _, bad := range []string{"", "vm1", "fe80::1%eth0", "1.2.3"} {
		if _, err := ParseGID(bad); err == nil {
			t.Errorf("ParseGID(%q) accepted", bad)
		}
	}
}

func validHost() Host {
	a := netip.MustParseAddr("192.0.2.1")
	return Host{
		ID: "0123456789abcdef0123456789abcdef", Name: "esx1",
		PVRDMAAddress:  netip.MustParseAddrPort("198.51.100.1:4792"),
		PVRDMAVmknic:   "vmk1",
		FirewallPVRDMA: true,
		Uplinks:        []Uplink{{Kind: UplinkHCA, Device: "mlx5_0", Address: a, GID: GIDOf(a), Capabilities: []string{CapNamespaces}}},
		Switch:         "dvs1", AgentVersion: "0.1.0", State: HostUp,
	}
}

func TestValidate(t *testing.T) {
	gid := netip.MustParseAddr("::ffff:10.0.0.1")
	tests := []struct {
		name string
		r    Record
		says []string // each must appear; none means valid
	}{
		{"switch ok", Switch{Name: "dvs1", UUID: "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d", MTU: 9000, UplinkPolicy: UplinkSingle}, nil},
		{"switch rfc uuid", Switch{Name: "dvs1", UUID: "501d0b8e-8d95-4e2b-b25c-2f3aa61a9e1d", MTU: 1500, UplinkPolicy: UplinkFailover}, nil},
		{"switch bad", Switch{Name: "dvs 1", UUID: "xyz", MTU: 100, UplinkPolicy: "lacp"},
			[]string{`switch "dvs 1": name:`, "uuid:", `"xyz" has 'x'`, "mtu: 100 is out of range 1280–9000", `uplinkPolicy: "lacp" is not "single" or "failover"`}},
		{"switch missing fields", Switch{}, []string{"switch: name: missing", "uuid: missing", "mtu: 0 is out of range", "uplinkPolicy: missing"}},
		{"switch short uuid", Switch{Name: "s", UUID: "50 1d", MTU: 1500, UplinkPolicy: UplinkSingle}, []string{"4 hex digits, not 32"}},
		{"portgroup ok", PortGroup{Name: "RoCE", Key: "dvportgroup-80", Switch: "dvs1", VLAN: 4094, PFCPriority: 7, DSCP: 63, RoCEVersion: RoCEv2}, nil},
		{"portgroup ranges", PortGroup{Name: "RoCE", Key: "dvportgroup-80", Switch: "dvs1", VLAN: 4095, PFCPriority: 8, DSCP: 64, RoCEVersion: "v3"},
			[]string{"vlan: 4095 is out of range 0–4094", "pfcPriority: 8 is out of range 0–7", "dscp: 64 is out of range 0–63", `roceVersion: "v3" is not "v1" or "v2"`}},
		{"portgroup negative", PortGroup{Name: "RoCE", Key: "pg", Switch: "dvs1", VLAN: -1, PFCPriority: -1, DSCP: -1, RoCEVersion: RoCEv1},
			[]string{"vlan: -1", "pfcPriority: -1", "dscp: -1"}},
		{"host ok", validHost(), nil},
		{"host without address or uplinks", func() Host { h := validHost(); h.PVRDMAAddress = netip.AddrPort{}; h.Uplinks = nil; return h }(), nil},
		{"host bad", func() Host {
			h := validHost()
			h.PVRDMAAddress = netip.MustParseAddrPort("198.51.100.1:0")
			h.State = "sleeping"
			h.AgentVersion = ""
			h.Uplinks = append(h.Uplinks, Uplink{Kind: "ib", GID: netip.MustParseAddr("10.0.0.1")})
			return h
		}(), []string{"pvrdmaAddress: 198.51.100.1:0 is not address:port", `state: "sleeping"`, "agentVersion: missing",
			`uplinks[1].kind: "ib"`, "uplinks[1].address: missing", "uplinks[1].gid: 10.0.0.1 is not in 16-byte GID form"}},
		{"host uplinks without switch", func() Host { h := validHost(); h.Switch = ""; return h }(), []string{"RDMA uplinks but no switch"}},
		{"alive missing", Alive{HostID: "h1"}, []string{"lease: missing", "ttl: missing"}},
		{"vm ok", VM{Name: "vm1", Host: "h1", Power: PoweredOn, Adapters: []string{"vrdma0", "vrdma3"}}, nil},
		{"vm off without host", VM{Name: "vm1", Power: PoweredOff}, nil},
		{"vm on without host", VM{Name: "vm1", Power: PoweredOn}, []string{"host: missing"}},
		{"vm adapters", VM{Name: "vm1", Host: "h1", Power: PoweredOn, Adapters: []string{"vrdma3", "vrdma1", "eth0"}},
			[]string{"vrdma1 is out of order", `"eth0" is not vrdmaN`}},
		{"vm too many adapters", VM{Name: "vm1", Host: "h1", Power: PoweredOn, Adapters: []string{"vrdma0", "vrdma1", "vrdma2", "vrdma3", "vrdma4", "vrdma5", "vrdma6", "vrdma7", "vrdma8", "vrdma9", "vrdma10"}},
			[]string{"11 adapters, more than 10"}},
		{"vm bad power", VM{Name: "vm1", Power: "on"}, []string{`power: "on"`}},
		{"adapter ok", Adapter{VM: "vm1", Index: 1, MAC: "00:50:56:aa:bb:cc", GID: gid, PortGroup: "dvportgroup-80"}, nil},
		{"adapter bad", Adapter{VM: "vm1", Index: 10000, MAC: "00:50:56:AA:BB:CC", GID: netip.MustParseAddr("::"), PortGroup: ""},
			[]string{"index: 10000 is out of range", "mac:", "not in canonical form", "gid: :: is not a GID", "portGroup: missing"}},
		{"adapter missing", Adapter{}, []string{"vm: missing", "mac: missing", "gid: missing", "portGroup: missing"}},
		{"endpoint ok", Endpoint{GID: gid, Host: "h1", VM: "vm1", Adapter: "vrdma0", PortGroup: "pg"}, nil},
		{"endpoint bad", Endpoint{GID: gid, VM: "vm1", Adapter: "eth0"}, []string{"host: missing", `"eth0" is not vrdmaN`, "portGroup: missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.r.Validate()
			if len(tt.says) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %+v", tt.r)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not match ErrInvalid", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Kind != tt.r.Kind() {
				t.Errorf("error %v is not a *FieldError of kind %s", err, tt.r.Kind())
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

func TestParseKey(t *testing.T) {
	gid := netip.MustParseAddr("::ffff:10.0.0.1")
	ok := []struct {
		key string
		ref Ref
	}{
		{SwitchKey("dvs1"), Ref{Kind: KindSwitch, ID: "dvs1"}},
		{PortGroupKey("dvportgroup-80"), Ref{Kind: KindPortGroup, ID: "dvportgroup-80"}},
		{HostKey("h1"), Ref{Kind: KindHost, ID: "h1"}},
		{AliveKey("h1"), Ref{Kind: KindAlive, ID: "h1"}},
		{VMKey("vm1"), Ref{Kind: KindVM, ID: "vm1"}},
		{AdapterKey("vm1", "vrdma2"), Ref{Kind: KindAdapter, ID: "vm1/vrdma2"}},
		{EndpointNameKey("vm1", "vrdma2"), Ref{Kind: KindEndpoint, ID: "vm1/vrdma2"}},
		{EndpointGIDKey(gid), Ref{Kind: KindEndpoint, ID: "::ffff:10.0.0.1", ByGID: true}},
		{EndpointGIDKey(netip.MustParseAddr("10.0.0.1")), Ref{Kind: KindEndpoint, ID: "::ffff:10.0.0.1", ByGID: true}},
	}
	for _, tt := range ok {
		got, err := ParseKey(tt.key)
		if err != nil || got != tt.ref {
			t.Errorf("ParseKey(%q) = %+v, %v; want %+v", tt.key, got, err, tt.ref)
		}
	}
	for _, bad := range []string{"", "/vrdma/v2/hosts/h1", "/vrdma/v1/", "/vrdma/v1/hosts/", "/vrdma/v1/hosts/a/b", "/vrdma/v1/things/x",
		"/vrdma/v1/adapters/vm1", "/vrdma/v1/adapters/vm1/eth0", "/vrdma/v1/endpoints/gid/10.0.0.1", "/vrdma/v1/endpoints/gid/zz",
		"/vrdma/v1/endpoints/other/x"} {
		if r, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) = %+v; want an error", bad, r)
		}
	}
	if KeyOf(validHost()) != HostKey(validHost().ID) {
		t.Errorf("KeyOf(host) = %s", KeyOf(validHost()))
	}
}

func TestUplinkKindSupports(t *testing.T) {
	if UplinkSoftRoCEv2.Supports(RoCEv1) || !UplinkSoftRoCEv2.Supports(RoCEv2) {
		t.Error("rocev2-soft must carry RoCE v2 only")
	}
	if !UplinkHCA.Supports(RoCEv1) || !UplinkHCA.Supports(RoCEv2) {
		t.Error("hca must carry RoCE v1 and v2")
	}
	soft, hca := Uplink{Kind: UplinkSoftRoCEv2}, Uplink{Kind: UplinkHCA}
	if soft.Carries(RoCEv1) || !soft.Carries(RoCEv2) || !hca.Carries(RoCEv1) || !hca.Carries(RoCEv2) {
		t.Error("Carries: a software uplink without a MAC carries RoCE v2 only, an HCA both")
	}
	soft.MAC = "02:00:00:00:00:01"
	if !soft.Carries(RoCEv1) || !soft.Carries(RoCEv2) {
		t.Error("Carries: a software uplink with its MAC published carries RoCE v1 and v2")
	}
}

func TestUplinkMAC(t *testing.T) {
	for mac, ok := range map[string]bool{"": true, "02:00:00:00:00:01": true, "nope": false, "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01": false} {
		h := validHost()
		h.Uplinks[0].MAC = mac
		if err := h.Validate(); (err == nil) != ok {
			t.Errorf("MAC %q: %v", mac, err)
		}
	}
}
