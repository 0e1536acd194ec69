// SPDX-License-Identifier: Apache-2.0

package agent

// Options of New beyond Config: what tests inject into an agent (package
// testenv's test link and rdma loop), which no production configuration
// carries.

import (
	"log/slog"

	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
)

// Option changes how New makes an agent, beyond its Config.
type Option func(*options)

// options are the Options given to New.
type options struct {
	localPaths func(PathEnv) (LocalPaths, error)
}

// WithLocalPaths makes QPs between two VMs of this host take the paths
// that mk's LocalPaths routes them on, instead of memcpy: package
// testenv's test link and rdma loop. New calls mk once, after the device
// and connection management exist.
func WithLocalPaths(mk func(PathEnv) (LocalPaths, error)) Option {
	return func(o *options) { o.localPaths = mk }
}

// PathEnv is what the agent hands a LocalPaths maker (WithLocalPaths).
type PathEnv struct {
	Device *device.Device
	// Links is the configuration of the links to other hosts: the tcp
	// path's responder, connection management and the rdma_cm event
	// hooks; its control-plane half is zero.
	Links hostlink.Config
	Clock clock.Clock // the agent's clock (Config.Clock, or the real one)
	Log   *slog.Logger
	Host  string // the host's name
}

// LocalPaths routes QPs between two VMs of this host (WithLocalPaths).
// The agent calls Route from the device's Router, Status for its status
// report, and Close once, when it stops, after its sessions ended.
type LocalPaths interface {
	// Route returns the route of q to peer, an adapter of this host; ok
	// false leaves q to the agent's own choice.
	Route(q *device.QP, peer *device.Adapter) (r device.Route, ok bool)
	// Status adds the paths' links and engines to the host's status.
	Status(st *mgmt.Status)
	// Close stops the paths.
	Close()
}
