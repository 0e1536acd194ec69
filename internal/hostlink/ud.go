// SPDX-License-Identifier: Apache-2.0

package hostlink

import (
	"errors"
	"time"

	"github.com/vrdma/vrdma/internal/tcpwire"
)

// datagramBackoff is how long after a failed dial datagrams to the peer
// are dropped at once, rather than each waiting for a dial of its own:
// a UD QP that sends to a host that is down is not slowed to one
// datagram per lookup timeout.
const datagramBackoff = time.Second

// errPeerDown is the datagram's drop within datagramBackoff.
var errPeerDown = errors.New("tcp path: the peer host was unreachable a moment ago: datagram dropped")

// datagram reads datagram frame h's payload and hands it to the
// configuration's OnDatagram, from the connection's request reader. A
// datagram is never answered.
func (c *Conn) datagram(h *tcpwire.Header) error {
	if c.dgram == nil {
		c.dgram = make([]byte, tcpwire.DatagramPrefix+tcpwire.MaxDatagram)
	}
	b := c.dgram[:h.PayloadLen] // Decode bounded it
	if err := c.ReadFull(b); err != nil {
		return err
	}
	if f := c.l.u.cfg.OnDatagram; f != nil {
		f(c.l.peerID, h, b)
	}
	return nil
}

// SendDatagram writes a datagram frame (header h, payload segments) on
// the link's connection for requests, dialing it if there is none (within
// the lookup timeout; at once dropping it instead within datagramBackoff
// of a failed dial). A datagram that cannot be written is dropped, as UD
// may drop it: the error says why.
func (l *Peer) SendDatagram(h *tcpwire.Header, payload [][]byte) error {
	if l.out.Load() == nil {
		if t := l.dgramFail.Load(); t != 0 && nanotime()-t < int64(datagramBackoff) {
			return errPeerDown
		}
	}
	c, err := l.Conn(l.u.cfg.LookupTimeout)
	if err != nil {
		l.dgramFail.Store(nanotime())
		return err
	}
	l.dgramFail.Store(0)
	return c.WriteFrame(h, payload)
}
