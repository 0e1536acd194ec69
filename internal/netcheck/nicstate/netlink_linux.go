// SPDX-License-Identifier: Apache-2.0

package nicstate

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Netlink is the Kernel of one network namespace: an rtnetlink socket for
// RTM_GETLINK and RTM_GETDCB, and a generic netlink socket for ethtool's
// ETHTOOL_MSG_PAUSE_GET. GET requests need no privilege. It is not safe
// for concurrent use; Close it when done.
type Netlink struct {
	rt      *netlink.Conn
	gen     *genetlink.Conn
	ethtool uint16 // the ethtool family's ID; 0 if the kernel has none
	noEth   error  // why there is no ethtool family
}

var _ Kernel = (*Netlink)(nil)

// Dial opens the kernel's netlink sockets in the network namespace of the
// file descriptor netns (e.g. an open /run/netns/NAME; entering it needs
// CAP_SYS_ADMIN), or in the caller's when netns is 0.
func Dial(netns int) (*Netlink, error) {
	cfg := &netlink.Config{NetNS: netns}
	rt, err := netlink.Dial(unix.NETLINK_ROUTE, cfg)
	if err != nil {
		return nil, fmt.Errorf("open an rtnetlink socket: %w", err)
	}
	n := &Netlink{rt: rt}
	gen, err := genetlink.Dial(cfg)
	if err != nil {
		n.noEth = fmt.Errorf("open a generic netlink socket: %w", err)
		return n, nil
	}
	n.gen = gen
	fam, err := gen.GetFamily(unix.ETHTOOL_GENL_NAME)
	if err != nil {
		n.noEth = fmt.Errorf("the kernel has no %q generic netlink family (ethtool netlink needs Linux 5.6): %w", unix.ETHTOOL_GENL_NAME, err)
		return n, nil
	}
	n.ethtool = fam.ID
	return n, nil
}

// Close closes the sockets.
func (n *Netlink) Close() error {
	err := n.rt.Close()
	if n.gen != nil {
		err = errors.Join(err, n.gen.Close())
	}
	return err
}

// Link implements Kernel with RTM_GETLINK: by IFLA_IFNAME, or by the
// ifinfomsg's index.
func (n *Netlink) Link(name string, index int32) ([]byte, error) {
	req := make([]byte, ifinfomsgLen)
	binary.NativeEndian.PutUint32(req[4:8], uint32(index))
	if name != "" {
		ae := netlink.NewAttributeEncoder()
		ae.String(unix.IFLA_IFNAME, name)
		attrs, err := ae.Encode()
		if err != nil {
			return nil, err
		}
		req = append(req, attrs...)
	}
	return n.one(unix.RTM_GETLINK, unix.RTM_NEWLINK, req)
}

// DCB implements Kernel with RTM_GETDCB DCB_CMD_IEEE_GET, as `dcb pfc
// show` sends it. The ifindex is not accepted, only the name.
func (n *Netlink) DCB(ifname string) ([]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(dcbAttrIfname, ifname) // NUL-terminated, as DCB_ATTR_IFNAME wants
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	// struct dcbmsg: dcb_family, cmd, 2 bytes of padding.
	b, err := n.one(unix.RTM_GETDCB, unix.RTM_GETDCB, append([]byte{unix.AF_UNSPEC, dcbCmdIEEEGet, 0, 0}, attrs...))
	if err != nil {
		return nil, err
	}
	if len(b) < 4 {
		return nil, fmt.Errorf("DCB reply of %d bytes, shorter than struct dcbmsg", len(b))
	}
	return b[4:], nil
}

// one sends a GET request and returns its one reply's payload. No ACK is
// asked for: on a non-dump GET the kernel would send it after the reply,
// and the stale ACK would fail the next request on the socket; errors
// come back without it.
func (n *Netlink) one(typ, reply netlink.HeaderType, data []byte) ([]byte, error) {
	msgs, err := n.rt.Execute(netlink.Message{Header: netlink.Header{Type: typ, Flags: netlink.Request}, Data: data})
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if m.Header.Type == reply {
			return m.Data, nil
		}
	}
	return nil, fmt.Errorf("no reply of type %d among %d messages", reply, len(msgs))
}

// Pause implements Kernel with ETHTOOL_MSG_PAUSE_GET, the device named in
// the request header.
func (n *Netlink) Pause(ifname string) ([]byte, error) {
	if n.ethtool == 0 {
		return nil, n.noEth
	}
	ae := netlink.NewAttributeEncoder()
	ae.Nested(unix.ETHTOOL_A_PAUSE_HEADER, func(h *netlink.AttributeEncoder) error {
		h.String(unix.ETHTOOL_A_HEADER_DEV_NAME, ifname)
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	msgs, err := n.gen.Execute(genetlink.Message{
		Header: genetlink.Header{Command: unix.ETHTOOL_MSG_PAUSE_GET, Version: unix.ETHTOOL_GENL_VERSION},
		Data:   b,
	}, n.ethtool, netlink.Request)
	if err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, errors.New("no ETHTOOL_MSG_PAUSE_GET reply")
	}
	return msgs[0].Data, nil
}
