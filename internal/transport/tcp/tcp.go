// SPDX-License-Identifier: Apache-2.0

// Package tcp is the tcp path (docs/architecture.md): the RC protocol of package
// tcpwire over the agent's links to the other hosts of its switch
// (package hostlink). Its requester (requester.go) is the RC engine of
// package rc/requester over this path's frames, one call per work
// request on the link's connection; its responder (responder.go,
// landing.go) executes a peer's requests against the target QP through
// package device's shared responder, moving payloads between the socket
// and guest memory one system call at a time. Links, handshakes and
// connection management across hosts are package hostlink's.
package tcp

import (
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
)

// Bind returns the maker of the tcp path of a QP whose remote end is on
// peer host p, for a device.Route.
func Bind(p *hostlink.Peer) func(q device.Source) device.Path {
	return func(q device.Source) device.Path { return newTCPPath(q, p, abi.PathTCP) }
}

// BindTest returns the maker of the test path of a QP whose remote end is
// on this host, for a device.Route: the tcp path's requester and
// responder over the test link (hostlink.NewTestLink), p being its one
// peer, this host.
func BindTest(p *hostlink.Peer) func(q device.Source) device.Path {
	return func(q device.Source) device.Path { return newTCPPath(q, p, abi.PathTest) }
}
