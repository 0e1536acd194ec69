package hostlink

import (
	"github.com/vrdma/vrdma/internal/tcpwire"
)

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
// the lookup timeout). A datagram that cannot be written is dropped, as
// UD may drop it: the error says why.
func (l *Peer) SendDatagram(h *tcpwire.Header, payload [][]byte) error {
	c, err := l.Conn(l.u.cfg.LookupTimeout)
	if err != nil {
		return err
	}
	return c.WriteFrame(h, payload)
}
