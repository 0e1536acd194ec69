// SPDX-License-Identifier: Apache-2.0

package memcpy

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
)

// dgramPath delivers an address handle's datagrams to a QP of this host:
// the sending QP's goroutine copies the message from its guest memory
// straight into the receive buffer at the destination (the device's
// DeliverDatagram, under the destination VM's memory lock for reading).
type dgramPath struct{ sink device.DatagramSink }

// Datagrams returns the memcpy path of datagrams to QPs of this host,
// for an address handle (device.UDRouter's RouteAH).
func Datagrams(sink device.DatagramSink) device.DatagramPath { return dgramPath{sink} }

// Kind is memcpy.
func (p dgramPath) Kind() abi.PathKind { return abi.PathMemcpy }

// SendDatagram delivers d at once, or the device drops it.
func (p dgramPath) SendDatagram(d *device.Datagram) {
	p.sink.DeliverDatagram(d, device.Via{Path: abi.PathMemcpy})
}
