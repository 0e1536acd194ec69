// SPDX-License-Identifier: Apache-2.0

// Package nicstate reads a NIC's lossless-Ethernet state from the Linux
// kernel, as vrdmactl network check and the checks of package netcheck
// need it (docs/network.md, "What the kernel reports"):
//
//   - PFC and the DCB app and trust tables through DCB netlink
//     (RTM_GETDCB, DCB_CMD_IEEE_GET): what `dcb pfc show` and `dcb
//     apptrust show` report;
//   - 802.3x global pause through ethtool netlink (ETHTOOL_MSG_PAUSE_GET);
//   - the MTU, and bond or team membership, through rtnetlink
//     (RTM_GETLINK: IFLA_MTU, IFLA_MASTER, IFLA_LINKINFO).
//
// The kernel sits behind Kernel, a seam of three requests that each return
// the reply's bytes: Netlink asks the real kernel (mdlayher/netlink and
// mdlayher/genetlink), tests give a fake. Read decodes the replies into a
// records.NICState. What the kernel cannot report is not an error: a veth,
// virtio or loopback NIC has no DCB support and answers EOPNOTSUPP, and the
// field stays unknown with the kernel's answer in State.Unknown, so the
// check that needs it says so and how to declare the state instead. Only a
// device that does not exist (ENODEV) or a kernel that cannot be asked at
// all is an error.
//
// A VLAN device's DCB and pause state are its lower device's, which Read
// asks instead (PFC is per physical port).
package nicstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/control/records"
)

// Kernel is what Read asks the kernel: one request each, answered with the
// reply's payload. An error is the kernel's answer (a syscall.Errno,
// possibly wrapped) or a failure to ask.
type Kernel interface {
	// Link returns the RTM_NEWLINK reply to RTM_GETLINK for the interface
	// named name or, when name is "", for the one with index: its struct
	// ifinfomsg, then its attributes.
	Link(name string, index int32) ([]byte, error)
	// DCB returns the reply to RTM_GETDCB DCB_CMD_IEEE_GET for interface
	// ifname: the attributes after its struct dcbmsg.
	DCB(ifname string) ([]byte, error)
	// Pause returns the attributes of the ETHTOOL_MSG_PAUSE_GET reply for
	// interface ifname.
	Pause(ifname string) ([]byte, error)
}

// ErrNoDevice: the kernel has no interface of that name (ENODEV).
var ErrNoDevice = errors.New("no such network interface")

// State is what the kernel reports of one NIC.
type State struct {
	// Device is the interface asked about.
	Device string `json:"device"`
	// Kind is its link kind ("veth", "vlan", "bond", ...); "" for a
	// physical NIC.
	Kind string `json:"kind,omitempty"`
	// DCBDevice is where DCB and pause were read: Device, or the lower
	// device of a VLAN.
	DCBDevice string `json:"dcbDevice"`
	// NICState holds the fields the kernel reported; Unknown says why
	// each of the others is unknown. SoleUplink is never known here.
	records.NICState
}

// Read asks k for the state of interface ifname.
func Read(k Kernel, ifname string) (State, error) {
	st := State{Device: ifname, DCBDevice: ifname}
	st.Unknown = map[string]string{}
	b, err := k.Link(ifname, 0)
	if err != nil {
		return st, linkErr(ifname, err)
	}
	l, err := ParseLink(b)
	if err != nil {
		return st, fmt.Errorf("RTM_GETLINK %s: %w", ifname, err)
	}
	st.Kind = l.Kind
	if l.MTU > 0 {
		st.MTU = int(l.MTU)
	} else {
		st.Unknown[records.FieldMTU] = "RTM_GETLINK reply has no IFLA_MTU"
	}
	port := l // the device whose teaming counts: a VLAN's lower device
	if l.Kind == "vlan" && l.Link != 0 {
		b, err := k.Link("", l.Link)
		if err == nil {
			port, err = ParseLink(b)
		}
		if err != nil {
			return st, fmt.Errorf("VLAN %s: its lower device (index %d): %w", ifname, l.Link, linkErr("", err))
		}
		st.DCBDevice = port.Name
	}
	readTeam(k, &st, port)
	readDCB(k, &st)
	readPause(k, &st)
	if len(st.Unknown) == 0 {
		st.Unknown = nil
	}
	return st, nil
}

func linkErr(name string, err error) error {
	if errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("%w: %s (RTM_GETLINK: %s)", ErrNoDevice, name, answer(err))
	}
	return fmt.Errorf("RTM_GETLINK %s: %w", name, err)
}

// answer formats the kernel's answer: "operation not supported
// (EOPNOTSUPP)".
func answer(err error) string {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err.Error()
	}
	n := unix.ErrnoName(errno)
	if errno == unix.EOPNOTSUPP {
		n = "EOPNOTSUPP" // the name dcbnl and ethtool use; ErrnoName says ENOTSUP, its twin
	}
	if n == "" {
		return errno.Error()
	}
	return fmt.Sprintf("%v (%s)", errno, n)
}

// failed says why request for dev failed: the kernel's answer, and
// unsupported's meaning when the device cannot answer it.
func failed(request, dev string, err error, unsupportedMeans string) string {
	why := fmt.Sprintf("%s for %s: %s", request, dev, answer(err))
	if unsupported(err) {
		why += ": " + unsupportedMeans
	}
	return why
}

// unsupported reports whether err says the device cannot answer the
// request: EOPNOTSUPP (no such driver op), or EINVAL, which older kernels
// gave devices without DCB ops.
func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)
}

func readTeam(k Kernel, st *State, port Link) {
	no, yes := false, true
	switch {
	case isTeam(port.Kind):
		st.Teamed, st.Team = &yes, port.Name
	case port.Master == 0:
		st.Teamed = &no
	default:
		b, err := k.Link("", port.Master)
		var m Link
		if err == nil {
			m, err = ParseLink(b)
		}
		switch {
		case err != nil:
			st.Unknown[records.FieldTeamed] = fmt.Sprintf("%s has a master (index %d) that RTM_GETLINK cannot read: %s", port.Name, port.Master, answer(err))
		case isTeam(port.SlaveKind) || isTeam(m.Kind):
			st.Teamed, st.Team = &yes, m.Name
		default:
			st.Teamed = &no // a bridge port, a VRF member: not teaming
		}
	}
}

func isTeam(kind string) bool { return kind == "bond" || kind == "team" }

func readDCB(k Kernel, st *State) {
	dev := st.DCBDevice
	b, err := k.DCB(dev)
	var d DCB
	if err == nil {
		d, err = ParseDCB(b)
	}
	if err != nil {
		why := failed("RTM_GETDCB DCB_CMD_IEEE_GET", dev, err, "the driver has no DCB support")
		st.Unknown[records.FieldPFC], st.Unknown[records.FieldTrust] = why, why
		return
	}
	if d.HasPFC {
		pfc := records.PrioritySet(d.PFCEnabled)
		st.PFC = &pfc
	} else {
		st.Unknown[records.FieldPFC] = fmt.Sprintf("the DCB_CMD_IEEE_GET reply for %s has no PFC attribute: its driver does not report PFC", dev)
	}
	if t, ok := d.Trust(); ok {
		st.Trust = t
	} else {
		st.Unknown[records.FieldTrust] = fmt.Sprintf("%s trusts DCB selector %d first, neither PCP nor DSCP", dev, d.TrustOrder[0])
	}
}

func readPause(k Kernel, st *State) {
	dev := st.DCBDevice
	b, err := k.Pause(dev)
	var p records.Pause
	if err == nil {
		p, err = ParsePause(b)
	}
	if err != nil {
		st.Unknown[records.FieldPause] = failed("ETHTOOL_MSG_PAUSE_GET", dev, err, "the driver does not report pause")
		return
	}
	st.Pause = &p
}

// ---- rtnetlink link replies ------------------------------------------------

// ifinfomsgLen is the size of struct ifinfomsg, before a link's attributes.
const ifinfomsgLen = 16

// Link is what an RTM_NEWLINK message says of an interface.
type Link struct {
	Index     int32
	Name      string // IFLA_IFNAME
	MTU       uint32 // IFLA_MTU; 0 if absent
	Link      int32  // IFLA_LINK: a VLAN's lower device; 0 if none
	Master    int32  // IFLA_MASTER: the bond, team or bridge it is enslaved to; 0 if none
	Kind      string // IFLA_INFO_KIND: its own kind ("veth", "vlan", "bond"); "" for a plain NIC
	SlaveKind string // IFLA_INFO_SLAVE_KIND: its master's kind ("bond", "team", "bridge")
}

// ParseLink decodes an RTM_NEWLINK payload: struct ifinfomsg, then
// attributes. Unknown attributes are skipped.
func ParseLink(b []byte) (Link, error) {
	var l Link
	if len(b) < ifinfomsgLen {
		return Link{}, fmt.Errorf("link message of %d bytes, shorter than struct ifinfomsg (%d)", len(b), ifinfomsgLen)
	}
	l.Index = int32(binary.NativeEndian.Uint32(b[4:8]))
	ad, err := netlink.NewAttributeDecoder(b[ifinfomsgLen:])
	if err != nil {
		return Link{}, fmt.Errorf("link attributes: %w", err)
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.IFLA_IFNAME:
			l.Name = ad.String()
		case unix.IFLA_MTU:
			l.MTU = ad.Uint32()
		case unix.IFLA_LINK:
			l.Link = int32(ad.Uint32())
		case unix.IFLA_MASTER:
			l.Master = int32(ad.Uint32())
		case unix.IFLA_LINKINFO:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					switch nad.Type() {
					case unix.IFLA_INFO_KIND:
						l.Kind = nad.String()
					case unix.IFLA_INFO_SLAVE_KIND:
						l.SlaveKind = nad.String()
					}
				}
				return nad.Err()
			})
		}
	}
	if err := ad.Err(); err != nil {
		return Link{}, fmt.Errorf("link attributes: %w", err)
	}
	return l, nil
}

// ---- DCB netlink replies ---------------------------------------------------

// DCB netlink numbers (include/uapi/linux/dcbnl.h); x/sys/unix has none
// of them but RTM_GETDCB.
const (
	dcbCmdIEEEGet = 21 // DCB_CMD_IEEE_GET

	dcbAttrIfname = 1  // DCB_ATTR_IFNAME
	dcbAttrIEEE   = 13 // DCB_ATTR_IEEE, a nest
	dcbAttrDCBX   = 14 // DCB_ATTR_DCBX, u8

	dcbAttrIEEEPFC        = 2  // DCB_ATTR_IEEE_PFC: struct ieee_pfc
	dcbAttrIEEEAppTable   = 3  // DCB_ATTR_IEEE_APP_TABLE, a nest of DCB_ATTR_IEEE_APP
	dcbAttrDCBAppTrustTab = 11 // DCB_ATTR_DCB_APP_TRUST_TABLE, a nest of selectors in precedence order

	dcbAttrIEEEApp = 1 // DCB_ATTR_IEEE_APP: struct dcb_app (IEEE selectors)
	dcbAttrDCBApp  = 2 // DCB_ATTR_DCB_APP: struct dcb_app (the PCP selector 255)

	ieeePFCLen = 136 // sizeof(struct ieee_pfc)
	dcbAppLen  = 4   // sizeof(struct dcb_app)

	selectorDSCP = 5   // IEEE_8021QAZ_APP_SEL_DSCP
	selectorPCP  = 255 // DCB_APP_SEL_PCP
)

// DCB is what a DCB_CMD_IEEE_GET reply says of a NIC.
type DCB struct {
	// HasPFC says the reply held struct ieee_pfc; PFCCap and PFCEnabled
	// are its pfc_cap (how many traffic classes may have PFC) and pfc_en
	// (bit i: priority i has PFC on).
	HasPFC     bool
	PFCCap     uint8
	PFCEnabled uint8
	// DSCPApps counts the DSCP entries (selector 5) of the app table: a
	// DSCP → priority map. mlx5 fills it when it trusts DSCP.
	DSCPApps int
	// TrustOrder is the app trust table: selectors in precedence order
	// (5 DSCP, 255 PCP); nil when the driver has none.
	TrustOrder []uint8
	// DCBX is the DCBX mode flags (DCB_ATTR_DCBX), if HasDCBX.
	DCBX    uint8
	HasDCBX bool
}

// Trust returns the header the NIC takes a packet's priority from: the
// first of the trust table, else DSCP when the app table maps DSCPs, else
// PCP, DCB's default. ok is false when the trust table puts another
// selector first.
func (d DCB) Trust() (t records.Trust, ok bool) {
	switch {
	case len(d.TrustOrder) > 0 && d.TrustOrder[0] == selectorDSCP:
		return records.TrustDSCP, true
	case len(d.TrustOrder) > 0 && d.TrustOrder[0] == selectorPCP:
		return records.TrustPCP, true
	case len(d.TrustOrder) > 0:
		return "", false
	case d.DSCPApps > 0:
		return records.TrustDSCP, true
	}
	return records.TrustPCP, true
}

// ParseDCB decodes the attributes of a DCB_CMD_IEEE_GET reply (after its
// struct dcbmsg). Nests come without NLA_F_NESTED and structs in native
// byte order; longer structs are accepted, unknown attributes skipped.
func ParseDCB(b []byte) (DCB, error) {
	var d DCB
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return DCB{}, fmt.Errorf("DCB attributes: %w", err)
	}
	for ad.Next() {
		switch ad.Type() {
		case dcbAttrDCBX:
			d.DCBX, d.HasDCBX = ad.Uint8(), true
		case dcbAttrIEEE:
			ad.Nested(func(nad *netlink.AttributeDecoder) error { return d.parseIEEE(nad) })
		}
	}
	if err := ad.Err(); err != nil {
		return DCB{}, fmt.Errorf("DCB attributes: %w", err)
	}
	return d, nil
}

func (d *DCB) parseIEEE(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		switch ad.Type() {
		case dcbAttrIEEEPFC:
			p := ad.Bytes()
			if len(p) < ieeePFCLen {
				return fmt.Errorf("struct ieee_pfc of %d bytes, want %d", len(p), ieeePFCLen)
			}
			d.HasPFC, d.PFCCap, d.PFCEnabled = true, p[0], p[1]
		case dcbAttrIEEEAppTable:
			ad.Nested(func(t *netlink.AttributeDecoder) error {
				for t.Next() {
					a := t.Bytes()
					if len(a) < dcbAppLen {
						return fmt.Errorf("struct dcb_app of %d bytes, want %d", len(a), dcbAppLen)
					}
					if t.Type() == dcbAttrIEEEApp && a[0] == selectorDSCP {
						d.DSCPApps++
					}
				}
				return t.Err()
			})
		case dcbAttrDCBAppTrustTab:
			d.TrustOrder = []uint8{}
			ad.Nested(func(t *netlink.AttributeDecoder) error {
				for t.Next() {
					if t.Type() == dcbAttrIEEEApp || t.Type() == dcbAttrDCBApp {
						d.TrustOrder = append(d.TrustOrder, t.Uint8())
					}
				}
				return t.Err()
			})
		}
	}
	return ad.Err()
}

// ---- ethtool netlink replies -------------------------------------------------

// ParsePause decodes the attributes of an ETHTOOL_MSG_PAUSE_GET reply.
// Both ETHTOOL_A_PAUSE_RX and _TX must be there.
func ParsePause(b []byte) (records.Pause, error) {
	var p records.Pause
	var rx, tx bool
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return records.Pause{}, fmt.Errorf("pause attributes: %w", err)
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.ETHTOOL_A_PAUSE_RX:
			p.RX, rx = ad.Uint8() != 0, true
		case unix.ETHTOOL_A_PAUSE_TX:
			p.TX, tx = ad.Uint8() != 0, true
		}
	}
	if err := ad.Err(); err != nil {
		return records.Pause{}, fmt.Errorf("pause attributes: %w", err)
	}
	if !rx || !tx {
		return records.Pause{}, errors.New("the reply lacks ETHTOOL_A_PAUSE_RX or _TX")
	}
	return p, nil
}
