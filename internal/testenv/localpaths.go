// SPDX-License-Identifier: Apache-2.0

package testenv

// The paths a test puts QPs between two VMs of one in-process agent on
// (Options.TestLink, Options.RDMALoop), given to the agent as its local
// paths (agent.WithLocalPaths): production configuration has no such
// field.

import (
	"fmt"
	"slices"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/testlink"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/tcp"
)

// localPaths are an agent's test link and rdma loop; each nil without.
// With both, the rdma loop carries the QPs.
type localPaths struct {
	host  string
	link  *hostlink.Links // the test link (hostlink.NewTestLink)
	self  *hostlink.Peer  // the test link's one peer: this host
	rdma  *rdma.Engine    // the RoCEv2 engine sending to itself
	marks rdma.Marks      // what the rdma loop's packets carry
	only  []string        // Options.TestLinkVMs
}

// localPaths returns the maker of o's local paths, counting the test
// link's frames in stats; nil if o asks for none.
func (o Options) localPaths(stats *testlink.Stats) func(agent.PathEnv) (agent.LocalPaths, error) {
	if o.TestLink == nil && !o.RDMALoop.IsValid() {
		return nil
	}
	return func(env agent.PathEnv) (agent.LocalPaths, error) {
		p := &localPaths{host: env.Host, marks: rdma.Marks{TOS: o.RDMALoopDSCP << 2, Priority: o.RDMALoopPrio}, only: o.TestLinkVMs}
		if o.TestLink != nil {
			l, err := hostlink.NewTestLink(env.Links, *o.TestLink, env.Clock, stats)
			if err != nil {
				return nil, err
			}
			p.link, p.self = l, l.Peer(env.Links.HostID)
		}
		if o.RDMALoop.IsValid() {
			c, err := rdma.ListenUDP(o.RDMALoop)
			if err != nil {
				p.Close()
				return nil, err
			}
			if o.RDMALoopConn != nil {
				c = o.RDMALoopConn(c)
			}
			p.rdma = rdma.Start(rdma.Config{Device: env.Device, Conn: c, Log: env.Log})
		}
		return p, nil
	}
}

// Route puts q on the rdma loop, or else on the test link (with
// Options.TestLinkVMs, only if q's VM is one of them).
func (p *localPaths) Route(q *device.QP, peer *device.Adapter) (device.Route, bool) {
	if p.only != nil && !slices.Contains(p.only, q.Context().Name()) {
		return device.Route{}, false
	}
	if p.rdma != nil {
		return device.Route{New: p.rdma.Bind(p.rdma.LocalAddr(), p.marks), Info: abi.PathInfo{Path: abi.PathRDMA,
			Reason:   fmt.Sprintf("rdma: both VMs (%s, %s) on host %s, through the agent's RoCEv2 engine on %s (tests only)", q.Context().Name(), peer.Context().Name(), p.host, p.rdma.LocalAddr()),
			Rejected: []abi.PathRejection{{Path: abi.PathMemcpy, Why: "the agent runs with an rdma loop (tests only)"}}}}, true
	}
	if p.link != nil {
		return device.Route{New: tcp.BindTest(p.self), Info: abi.PathInfo{Path: abi.PathTest,
			Reason:   fmt.Sprintf("test: both VMs (%s, %s) on host %s, over the agent's test link", q.Context().Name(), peer.Context().Name(), p.host),
			Rejected: []abi.PathRejection{{Path: abi.PathMemcpy, Why: "the agent runs with a test link (tests only)"}}}}, true
	}
	return device.Route{}, false
}

var _ agent.LocalDatagramPaths = (*localPaths)(nil)

// RouteAH puts the datagrams of an address handle from adapter from on
// the rdma loop, or else on the test link, as Route does QPs.
func (p *localPaths) RouteAH(from, peer *device.Adapter) (device.DatagramPath, abi.PathInfo, bool) {
	if p.only != nil && !slices.Contains(p.only, from.Context().Name()) {
		return nil, abi.PathInfo{}, false
	}
	if p.rdma != nil {
		return p.rdma.Datagrams(p.rdma.LocalAddr(), p.marks), abi.PathInfo{Path: abi.PathRDMA,
			Reason: fmt.Sprintf("rdma: both VMs (%s, %s) on host %s, through the agent's RoCEv2 engine on %s (tests only)", from.Context().Name(), peer.Context().Name(), p.host, p.rdma.LocalAddr())}, true
	}
	if p.link != nil {
		return tcp.Datagrams(p.self), abi.PathInfo{Path: abi.PathTest,
			Reason: fmt.Sprintf("test: both VMs (%s, %s) on host %s, over the agent's test link", from.Context().Name(), peer.Context().Name(), p.host)}, true
	}
	return nil, abi.PathInfo{}, false
}

// Carries reports whether via is the rdma loop (its own address) or the
// test link (this host).
func (p *localPaths) Carries(via device.Via) bool {
	switch via.Path {
	case abi.PathRDMA:
		return p.rdma != nil && via.Addr == p.rdma.LocalAddr().Addr().Unmap()
	case abi.PathTCP:
		return p.link != nil && via.Host == p.self.ID()
	}
	return false
}

// Status reports the test link as an uplink and the rdma loop's engine.
func (p *localPaths) Status(st *mgmt.Status) {
	if p.link != nil {
		st.Uplinks = append(st.Uplinks, p.link.Status()...)
	}
	if p.rdma != nil {
		st.RDMA = append(st.RDMA, p.rdma.Status())
	}
}

// Close stops the test link and the rdma loop.
func (p *localPaths) Close() {
	if p.link != nil {
		p.link.Close()
	}
	if p.rdma != nil {
		p.rdma.Close()
	}
}
