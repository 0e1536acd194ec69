// SPDX-License-Identifier: Apache-2.0

package nicstate

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/control/records"
)

// ---- replies as the kernel builds them -------------------------------------

func encodeLink(l Link) []byte {
	b := make([]byte, ifinfomsgLen)
	binary.NativeEndian.PutUint32(b[4:8], uint32(l.Index))
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.IFLA_IFNAME, l.Name)
	if l.MTU != 0 {
		ae.Uint32(unix.IFLA_MTU, l.MTU)
	}
	if l.Link != 0 {
		ae.Uint32(unix.IFLA_LINK, uint32(l.Link))
	}
	if l.Master != 0 {
		ae.Uint32(unix.IFLA_MASTER, uint32(l.Master))
	}
	ae.Uint8(0x7ff, 1) // an attribute this package does not know
	if l.Kind != "" || l.SlaveKind != "" {
		ae.Nested(unix.IFLA_LINKINFO, func(n *netlink.AttributeEncoder) error {
			if l.Kind != "" {
				n.String(unix.IFLA_INFO_KIND, l.Kind)
			}
			if l.SlaveKind != "" {
				n.String(unix.IFLA_INFO_SLAVE_KIND, l.SlaveKind)
			}
			return nil
		})
	}
	attrs, err := ae.Encode()
	if err != nil {
		panic(err)
	}
	return append(b, attrs...)
}

// dcbReply is what a DCB_CMD_IEEE_GET reply holds.
type dcbReply struct {
	noPFC  bool
	pfcEn  uint8
	pfcLen int        // length of struct ieee_pfc; 0: 136
	apps   [][2]uint8 // (attribute type, selector)
	trust  []uint8    // nil: no trust table
	dcbx   bool
}

// encodeDCB builds the attributes after struct dcbmsg. Like the kernel
// (nla_nest_start_noflag), it does not set NLA_F_NESTED.
func encodeDCB(r dcbReply) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.String(dcbAttrIfname, "eth1")
	ae.Do(dcbAttrIEEE, func() ([]byte, error) {
		n := netlink.NewAttributeEncoder()
		n.Bytes(1, make([]byte, 59)) // DCB_ATTR_IEEE_ETS, skipped
		if !r.noPFC {
			size := ieeePFCLen
			if r.pfcLen != 0 {
				size = r.pfcLen
			}
			pfc := make([]byte, size)
			if len(pfc) > 1 {
				pfc[0], pfc[1] = 8, r.pfcEn
			}
			n.Bytes(dcbAttrIEEEPFC, pfc)
		}
		n.Do(dcbAttrIEEEAppTable, func() ([]byte, error) {
			t := netlink.NewAttributeEncoder()
			for i, a := range r.apps {
				t.Bytes(uint16(a[0]), []byte{a[1], 3, byte(i), 0})
			}
			return t.Encode()
		})
		if r.trust != nil {
			n.Do(dcbAttrDCBAppTrustTab, func() ([]byte, error) {
				t := netlink.NewAttributeEncoder()
				for _, s := range r.trust {
					typ := uint16(dcbAttrIEEEApp)
					if s == selectorPCP {
						typ = dcbAttrDCBApp
					}
					t.Uint8(typ, s)
				}
				return t.Encode()
			})
		}
		return n.Encode()
	})
	if r.dcbx {
		ae.Uint8(dcbAttrDCBX, 0x08|0x01)
	}
	b, err := ae.Encode()
	if err != nil {
		panic(err)
	}
	return b
}

func encodePause(rx, tx bool, both bool) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.Nested(unix.ETHTOOL_A_PAUSE_HEADER, func(n *netlink.AttributeEncoder) error {
		n.Uint32(unix.ETHTOOL_A_HEADER_DEV_INDEX, 2)
		n.String(unix.ETHTOOL_A_HEADER_DEV_NAME, "eth1")
		return nil
	})
	ae.Uint8(unix.ETHTOOL_A_PAUSE_AUTONEG, 1)
	b2u := func(b bool) uint8 {
		if b {
			return 1
		}
		return 0
	}
	ae.Uint8(unix.ETHTOOL_A_PAUSE_RX, b2u(rx))
	if both {
		ae.Uint8(unix.ETHTOOL_A_PAUSE_TX, b2u(tx))
	}
	b, err := ae.Encode()
	if err != nil {
		panic(err)
	}
	return b
}

// ---- a fake kernel ------------------------------------------------------------

type reply struct {
	b   []byte
	err error
}

// fakeKernel answers from tables; an interface missing from a table gets
// ENODEV, wrapped as mdlayher/netlink wraps the kernel's errors.
type fakeKernel struct {
	links []Link
	dcb   map[string]reply
	pause map[string]reply
}

var _ Kernel = (*fakeKernel)(nil)

func opErr(errno unix.Errno) error { return &netlink.OpError{Op: "receive", Err: errno} }

func (f *fakeKernel) Link(name string, index int32) ([]byte, error) {
	for _, l := range f.links {
		if (name != "" && l.Name == name) || (name == "" && l.Index == index) {
			return encodeLink(l), nil
		}
	}
	return nil, opErr(unix.ENODEV)
}

func (f *fakeKernel) DCB(ifname string) ([]byte, error) {
	r, ok := f.dcb[ifname]
	if !ok {
		return nil, opErr(unix.EOPNOTSUPP)
	}
	return r.b, r.err
}

func (f *fakeKernel) Pause(ifname string) ([]byte, error) {
	r, ok := f.pause[ifname]
	if !ok {
		return nil, opErr(unix.EOPNOTSUPP)
	}
	return r.b, r.err
}

// ---- tests -------------------------------------------------------------------------

func TestNetworkNICStateFake(t *testing.T) {
	eth1 := Link{Index: 2, Name: "eth1", MTU: 9000}
	k := &fakeKernel{
		links: []Link{
			eth1,
			{Index: 3, Name: "eth2", MTU: 1500},
			{Index: 4, Name: "eth3", MTU: 1500, Master: 10, SlaveKind: "bond"},
			{Index: 5, Name: "eth4", MTU: 1500, Master: 11, SlaveKind: "team"},
			{Index: 6, Name: "veth0", MTU: 1500, Kind: "veth", Master: 12, SlaveKind: "bridge"},
			{Index: 7, Name: "eth1.100", MTU: 9000, Kind: "vlan", Link: 2},
			{Index: 8, Name: "bond0.100", MTU: 9000, Kind: "vlan", Link: 10},
			{Index: 9, Name: "eth5", MTU: 1500, Master: 99},
			{Index: 13, Name: "eth6", MTU: 1500},
			{Index: 14, Name: "eth7", MTU: 1500},
			{Index: 15, Name: "eth8"},
			{Index: 10, Name: "bond0", MTU: 9000, Kind: "bond"},
			{Index: 11, Name: "team0", MTU: 1500, Kind: "team"},
			{Index: 12, Name: "br0", MTU: 1500, Kind: "bridge"},
		},
		dcb: map[string]reply{
			"eth1": {b: encodeDCB(dcbReply{pfcEn: 1 << 3, trust: []uint8{selectorDSCP, selectorPCP}, dcbx: true})},
			"eth2": {b: encodeDCB(dcbReply{pfcEn: 1<<3 | 1<<4, apps: [][2]uint8{{dcbAttrIEEEApp, selectorDSCP}, {dcbAttrIEEEApp, selectorDSCP}}})},
			"eth3": {b: encodeDCB(dcbReply{pfcEn: 0, apps: [][2]uint8{{dcbAttrIEEEApp, 1}, {dcbAttrDCBApp, selectorPCP}}})},
			"eth4": {b: encodeDCB(dcbReply{noPFC: true, trust: []uint8{1}})},
			"eth5": {err: opErr(unix.EINVAL)},
			"eth6": {b: encodeDCB(dcbReply{pfcLen: 100})},
			"eth7": {err: errors.New("netlink receive: i/o timeout")},
		},
		pause: map[string]reply{
			"eth1":  {b: encodePause(true, true, true)},
			"eth2":  {b: encodePause(false, false, true)},
			"eth3":  {b: encodePause(true, false, true)},
			"eth4":  {b: encodePause(true, true, false)},
			"eth6":  {err: errors.New("the kernel has no \"ethtool\" generic netlink family (ethtool netlink needs Linux 5.6)")},
			"bond0": {b: encodePause(true, true, true)},
		},
	}
	type check func(t *testing.T, st State)
	pfc := func(want records.PrioritySet) check {
		return func(t *testing.T, st State) {
			if st.PFC == nil || *st.PFC != want {
				t.Errorf("PFC %v, want %v (unknown: %q)", st.PFC, want, st.Unknown[records.FieldPFC])
			}
		}
	}
	pause := func(want string) check {
		return func(t *testing.T, st State) {
			if st.Pause == nil || st.Pause.String() != want {
				t.Errorf("pause %v, want %s (unknown: %q)", st.Pause, want, st.Unknown[records.FieldPause])
			}
		}
	}
	trust := func(want records.Trust) check {
		return func(t *testing.T, st State) {
			if st.Trust != want {
				t.Errorf("trust %q, want %q (unknown: %q)", st.Trust, want, st.Unknown[records.FieldTrust])
			}
		}
	}
	teamed := func(want bool, team string) check {
		return func(t *testing.T, st State) {
			if st.Teamed == nil || *st.Teamed != want || st.Team != team {
				t.Errorf("teamed %v in %q, want %v in %q (unknown: %q)", st.Teamed, st.Team, want, team, st.Unknown[records.FieldTeamed])
			}
		}
	}
	mtu := func(want int) check {
		return func(t *testing.T, st State) {
			if st.MTU != want {
				t.Errorf("MTU %d, want %d", st.MTU, want)
			}
		}
	}
	unknown := func(field string, says ...string) check {
		return func(t *testing.T, st State) {
			why, ok := st.Unknown[field]
			if !ok {
				t.Errorf("%s is not unknown: %+v", field, st.NICState)
			}
			for _, s := range says {
				if !strings.Contains(why, s) {
					t.Errorf("unknown %s: %q does not say %q", field, why, s)
				}
			}
		}
	}
	dcbDev := func(want string) check {
		return func(t *testing.T, st State) {
			if st.DCBDevice != want {
				t.Errorf("DCB read on %q, want %q", st.DCBDevice, want)
			}
		}
	}
	for _, tc := range []struct {
		dev    string
		checks []check
	}{
		{"eth1", []check{pfc(records.PrioritiesOf(3)), pause("rx,tx"), trust(records.TrustDSCP), teamed(false, ""), mtu(9000), dcbDev("eth1")}},
		{"eth2", []check{pfc(records.PrioritiesOf(3, 4)), pause("off"), trust(records.TrustDSCP), mtu(1500)}}, // mlx5: DSCP apps mean DSCP trust
		{"eth3", []check{pfc(0), pause("rx"), trust(records.TrustPCP), teamed(true, "bond0")}},                // a bond slave
		{"eth4", []check{unknown(records.FieldPFC, "no PFC attribute"), unknown(records.FieldTrust, "selector 1"), // no ieee_getpfc, trusts ethertype
			unknown(records.FieldPause, "lacks ETHTOOL_A_PAUSE_RX or _TX"), teamed(true, "team0")}}, // a team port
		{"veth0", []check{teamed(false, ""), mtu(1500), // a bridge port is not teamed
			unknown(records.FieldPFC, "RTM_GETDCB DCB_CMD_IEEE_GET for veth0: operation not supported (EOPNOTSUPP): the driver has no DCB support"),
			unknown(records.FieldTrust, "EOPNOTSUPP"),
			unknown(records.FieldPause, "ETHTOOL_MSG_PAUSE_GET for veth0: operation not supported (EOPNOTSUPP): the driver does not report pause")}},
		{"eth1.100", []check{dcbDev("eth1"), pfc(records.PrioritiesOf(3)), pause("rx,tx"), teamed(false, ""), mtu(9000)}}, // a VLAN: its lower device's DCB
		{"bond0.100", []check{dcbDev("bond0"), teamed(true, "bond0"), unknown(records.FieldPFC, "for bond0"), pause("rx,tx")}},
		{"bond0", []check{teamed(true, "bond0")}},
		{"eth5", []check{unknown(records.FieldPFC, "invalid argument (EINVAL): the driver has no DCB support"), unknown(records.FieldTeamed, "master (index 99)", "ENODEV")}},
		{"eth6", []check{unknown(records.FieldPFC, "struct ieee_pfc of 100 bytes, want 136"), unknown(records.FieldPause, "ethtool netlink needs Linux 5.6")}},
		{"eth7", []check{unknown(records.FieldPFC, "i/o timeout")}},
		{"eth8", []check{unknown(records.FieldMTU, "no IFLA_MTU")}},
	} {
		t.Run(tc.dev, func(t *testing.T) {
			st, err := Read(k, tc.dev)
			if err != nil {
				t.Fatal(err)
			}
			if st.Device != tc.dev {
				t.Errorf("device %q", st.Device)
			}
			for _, c := range tc.checks {
				c(t, st)
			}
			// What Read returns is a valid observed state.
			h := records.Host{ID: "h", Name: "h", Switch: "dvs1", AgentVersion: "t", State: records.HostUp,
				Uplinks: []records.Uplink{{Kind: records.UplinkHCA, Device: "eth1", Address: pfxAddr, GID: records.GIDOf(pfxAddr), Observed: st.NICState}}}
			if err := h.Validate(); err != nil {
				t.Errorf("observed state does not validate: %v", err)
			}
		})
	}
	if _, err := Read(k, "nope"); !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "no such device (ENODEV)") {
		t.Errorf("Read(nope): %v", err)
	}
	k.links = append(k.links, Link{Index: 20, Name: "vlan9", Kind: "vlan", Link: 77})
	if _, err := Read(k, "vlan9"); !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "lower device (index 77)") {
		t.Errorf("Read(vlan9) with its lower device gone: %v", err)
	}
}

func TestNetworkNICStateParse(t *testing.T) {
	d, err := ParseDCB(encodeDCB(dcbReply{pfcEn: 0x88, trust: []uint8{selectorPCP}, dcbx: true}))
	if err != nil || !d.HasPFC || d.PFCEnabled != 0x88 || d.PFCCap != 8 || !d.HasDCBX || d.DCBX != 0x09 || len(d.TrustOrder) != 1 {
		t.Errorf("ParseDCB = %+v, %v", d, err)
	}
	if tr, ok := d.Trust(); !ok || tr != records.TrustPCP {
		t.Errorf("Trust = %v, %v", tr, ok)
	}
	// The nest may come with NLA_F_NESTED set too.
	ae := netlink.NewAttributeEncoder()
	ae.Nested(dcbAttrIEEE, func(n *netlink.AttributeEncoder) error { n.Bytes(dcbAttrIEEEPFC, make([]byte, 200)); return nil })
	b, _ := ae.Encode()
	if d, err := ParseDCB(b); err != nil || !d.HasPFC {
		t.Errorf("NLA_F_NESTED: %+v, %v", d, err)
	}
	for _, bad := range [][]byte{{1, 2, 3}, encodeDCB(dcbReply{pfcLen: 2}), encodeDCB(dcbReply{apps: [][2]uint8{{1, 5}}})[:30]} {
		if d, err := ParseDCB(bad); err == nil {
			t.Errorf("ParseDCB(%x) = %+v", bad, d)
		}
	}
	for _, bad := range [][]byte{nil, make([]byte, 15), append(make([]byte, 16), 9, 0, 1)} {
		if _, err := ParseLink(bad); err == nil {
			t.Errorf("ParseLink(%x) accepted", bad)
		}
	}
	if p, err := ParsePause(encodePause(false, true, true)); err != nil || p != (records.Pause{TX: true}) {
		t.Errorf("ParsePause = %v, %v", p, err)
	}
	if answer(opErr(unix.EPERM)) != "operation not permitted (EPERM)" || answer(errors.New("x")) != "x" {
		t.Errorf("answer: %q", answer(opErr(unix.EPERM)))
	}
}

var pfxAddr = netip.MustParseAddr("192.0.2.1")

func FuzzParseLink(f *testing.F) {
	f.Add(encodeLink(Link{Index: 7, Name: "eth1.100", MTU: 9000, Kind: "vlan", Link: 2}))
	f.Add(encodeLink(Link{Index: 4, Name: "eth3", Master: 10, SlaveKind: "bond"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := ParseLink(b)
		if err != nil && l != (Link{}) {
			t.Fatalf("error %v with a result %+v", err, l)
		}
	})
}

func FuzzParseDCB(f *testing.F) {
	f.Add(encodeDCB(dcbReply{pfcEn: 8, trust: []uint8{selectorDSCP, selectorPCP}, dcbx: true}))
	f.Add(encodeDCB(dcbReply{apps: [][2]uint8{{dcbAttrIEEEApp, selectorDSCP}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDCB(b)
		if err != nil && (d.HasPFC || d.TrustOrder != nil) {
			t.Fatalf("error %v with a result %+v", err, d)
		}
		if err == nil {
			d.Trust() // must not panic
		}
	})
}

func FuzzParsePause(f *testing.F) {
	f.Add(encodePause(true, true, true))
	f.Add(encodePause(true, false, false))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePause(b)
		if err != nil && p != (records.Pause{}) {
			t.Fatalf("error %v with a result %+v", err, p)
		}
	})
}
