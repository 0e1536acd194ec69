// SPDX-License-Identifier: Apache-2.0

package netcheck

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/control/records"
)

func TestNetworkSocketOptions(t *testing.T) {
	for _, tc := range []struct {
		dscp, prio int
		want       SocketOptions
	}{
		{26, 3, SocketOptions{TOS: 0x68, Priority: 3}},
		{0, 0, SocketOptions{TOS: 0, Priority: 0}},
		{63, 7, SocketOptions{TOS: 0xfc, Priority: 7}},
		{46, 5, SocketOptions{TOS: 0xb8, Priority: 5}},
	} {
		pg := pgWith(func(p *records.PortGroup) { p.DSCP, p.PFCPriority = tc.dscp, tc.prio })
		if got := SocketOptionsOf(pg); got != tc.want {
			t.Errorf("DSCP %d, priority %d: %+v, want %+v", tc.dscp, tc.prio, got, tc.want)
		}
	}

	// In the documented order, a UDP socket keeps both; the other way
	// round, IP_TOS overwrites the priority.
	o := SocketOptionsOf(pg80)
	set := func(first, second func(fd int) error) (tos, prio int) {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rc, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var serr error
		rc.Control(func(fd uintptr) {
			if serr = first(int(fd)); serr == nil {
				serr = second(int(fd))
			}
			if serr == nil {
				tos, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS)
			}
			if serr == nil {
				prio, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PRIORITY)
			}
		})
		if serr != nil {
			t.Fatal(serr)
		}
		return tos, prio
	}
	setTOS := func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, o.TOS) }
	setPrio := func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PRIORITY, o.Priority) }
	if tos, prio := set(setTOS, setPrio); tos != 0x68 || prio != 3 {
		t.Errorf("IP_TOS then SO_PRIORITY: TOS %#x, priority %d; want 0x68, 3", tos, prio)
	}
	if tos, prio := set(setPrio, setTOS); prio == o.Priority {
		t.Logf("SO_PRIORITY then IP_TOS: TOS %#x, priority %d (this kernel keeps the priority)", tos, prio)
	}
}
