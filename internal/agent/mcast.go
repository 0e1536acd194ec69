// SPDX-License-Identifier: Apache-2.0

package agent

// UD multicast across the fabric (docs/verbs-compat.md, "Multicast").
// The device keeps which of this host's QPs are attached to which group
// (internal/device/mcast.go) and delivers a group's datagrams to them. An
// address handle to a group takes the agent's group path: each datagram
// is delivered on this host by memcpy (to the members its source may
// reach: nothing crosses port groups), and carried to every other host
// that has members of the group on the sender's port group — over the
// tcp path as a datagram frame to QPN 0xFFFFFF, as it carries unicast
// ones.
//
// Which hosts have members the agents learn through the control plane:
// an adapter with QPs attached to a group is published under
// /vrdma/v1/mcast/<port group>/<group GID>/<host>/<vm>/<vrdmaN>, with the
// host's lease (so it goes with a host that dies), when its first QP
// attaches and removed when its last detaches or is destroyed. A group
// path reads the members of its port group when its address handle is
// made and again at most every mcastRefresh while it sends, in the
// background. A host that receives a group's datagram delivers it to its
// members that the source may reach, by the rules of unicast datagrams.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/netcheck"
	"github.com/vrdma/vrdma/internal/transport/memcpy"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/tcp"
)

// mcastRefresh is how old a group path's list of member hosts may get
// before it reads it again.
const mcastRefresh = time.Second

// mcastOp is attach-mcast (attach) or detach-mcast: the device attaches
// or detaches the QP, and the adapter's groups are published anew.
func (a *Agent) mcastOp(v *device.Context, r *abi.Mcast, attach bool) error {
	q, err := v.QPByHandle(r.QP)
	if err != nil {
		return err
	}
	op := a.dev.DetachMcast
	if attach {
		op = a.dev.AttachMcast
	}
	if err := op(q, r.GID); err != nil {
		return err
	}
	a.syncMcast(q.Adapter())
	return nil
}

// mcastKey is a published membership: an adapter's (of one process of a
// VM) in a group.
type mcastKey struct {
	ad  *device.Adapter
	gid abi.GID
}

// mcastPublished are the memberships this agent published, and the
// groups its RoCE engines receive.
type mcastPublished struct {
	mu sync.Mutex
	// keys are the etcd keys of the memberships published.
	// +checklocks:mu
	keys map[mcastKey]string
	// seq numbers the keys, which two processes of a VM must not share.
	// +checklocks:mu
	seq uint64
	// joined are the groups the engines joined.
	// +checklocks:mu
	joined map[abi.GID]bool
}

// syncMcast publishes adapter ad's groups as the device has them now:
// new ones put, left ones deleted. Without a control plane there is
// nothing to publish.
func (a *Agent) syncMcast(ad *device.Adapter) {
	a.mcPub.mu.Lock()
	defer a.mcPub.mu.Unlock()
	a.syncEnginesLocked()
	c := a.ctl
	if c == nil {
		return
	}
	vm := ad.Context().Name()
	want := map[abi.GID]bool{}
	for _, g := range a.dev.McastGroups(ad) {
		want[g] = true
	}
	if a.mcPub.keys == nil {
		a.mcPub.keys = map[mcastKey]string{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
	defer cancel()
	for k, key := range a.mcPub.keys {
		if k.ad == ad && !want[k.gid] {
			if _, err := c.st.Client().Delete(ctx, key); err != nil {
				c.log.Warn("multicast membership not removed from the control plane", "key", key, "err", err)
				continue
			}
			delete(a.mcPub.keys, k)
		}
	}
	for g := range want {
		k := mcastKey{ad, g}
		if _, ok := a.mcPub.keys[k]; ok {
			continue
		}
		rec, err := c.cache.Adapter(ctx, vm, ad.Name())
		if err != nil {
			c.log.Warn("multicast membership not published: the adapter's port group is unknown", "vm", vm, "adapter", ad.Name(), "err", err)
			return
		}
		a.mcPub.seq++
		key := records.McastMemberKey(rec.PortGroup, netip.AddrFrom16(g), a.hostID, vm, ad.Name(), a.mcPub.seq)
		if _, err := c.st.Client().Put(ctx, key, "", clientv3.WithLease(c.member.Lease())); err != nil {
			c.log.Warn("multicast membership not published: other hosts' datagrams to the group will not reach it", "key", key, "err", err)
			continue
		}
		a.mcPub.keys[k] = key
	}
}

// syncEnginesLocked has the RoCE engines receive the groups this host's
// QPs are attached to, and no others.
//
// +checklocks:a.mcPub.mu
func (a *Agent) syncEnginesLocked() {
	var engines []*rdma.Engine
	for _, e := range []*rdma.Engine{a.rdma, a.rdma1} {
		if e != nil {
			engines = append(engines, e)
		}
	}
	if len(engines) == 0 {
		return
	}
	if a.mcPub.joined == nil {
		a.mcPub.joined = map[abi.GID]bool{}
	}
	want := map[abi.GID]bool{}
	for _, g := range a.dev.McastAll() {
		want[g] = true
		if a.mcPub.joined[g] {
			continue
		}
		for _, e := range engines {
			if err := e.JoinGroup(g); err != nil {
				a.log.Warn("multicast group not received on the rdma path", "group", g, "err", err)
			}
		}
		a.mcPub.joined[g] = true
	}
	for g := range a.mcPub.joined {
		if !want[g] {
			for _, e := range engines {
				e.LeaveGroup(g)
			}
			delete(a.mcPub.joined, g)
		}
	}
}

// groupPath carries an address handle's datagrams to a multicast group:
// memcpy to this host's members, and to each other host with members.
type groupPath struct {
	a    *Agent
	from *device.Adapter
	gid  abi.GID
	pg   string // the sender's port group; "" without a control plane

	mu sync.Mutex
	// remote are the paths to the other hosts with members (one for all
	// on the rdma path).
	// +checklocks:mu
	remote []device.DatagramPath
	// +checklocks:mu
	fetched time.Time
	// busy: a refresh is under way.
	// +checklocks:mu
	busy bool
}

// routeGroup is RouteAH for a multicast GID.
func (a *Agent) routeGroup(from *device.Adapter, gid abi.GID) (device.DatagramPath, abi.PathInfo, error) {
	p := &groupPath{a: a, from: from, gid: gid}
	info := abi.PathInfo{Path: abi.PathMemcpy, Reason: fmt.Sprintf("multicast group %s: its members on host %s by memcpy", gid, a.cfg.Host)}
	if c := a.ctl; c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
		rec, err := c.cache.Adapter(ctx, from.Context().Name(), from.Name())
		cancel()
		if err != nil {
			return nil, abi.PathInfo{}, refusedBy(reasonControlPlaneDown, abi.Errorf(abi.CodeUnavailable, "dgid", "multicast group %s: the sending adapter's port group is unknown: %v", gid, err))
		}
		p.pg = rec.PortGroup
		p.refresh()
		info.Reason += fmt.Sprintf(", and to the other hosts with members on port group %s", p.pg)
	}
	return p, info, nil
}

// Kind is memcpy: the path of the copies this host delivers.
func (p *groupPath) Kind() abi.PathKind { return abi.PathMemcpy }

// SendDatagram delivers d to this host's members and sends it to every
// other host with members.
func (p *groupPath) SendDatagram(d *device.Datagram) {
	memcpy.Datagrams(p.a.dev).SendDatagram(d)
	if p.pg == "" {
		return
	}
	p.mu.Lock()
	remote := p.remote
	stale := !p.busy && time.Since(p.fetched) > mcastRefresh
	if stale {
		p.busy = true
	}
	p.mu.Unlock()
	if stale {
		go p.refresh()
	}
	for _, r := range remote {
		r.SendDatagram(d)
	}
}

// refresh reads the group's member hosts on the port group and makes the
// path to each.
func (p *groupPath) refresh() {
	a, c := p.a, p.a.ctl
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
	defer cancel()
	prefix := records.McastGroupPrefix(p.pg, netip.AddrFrom16(p.gid))
	resp, err := c.st.Client().Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	var remote []device.DatagramPath
	if err == nil {
		seen := map[string]bool{a.hostID: true}
		rdmaSent := false // one packet to the group reaches every host on the rdma path
		for _, kv := range resp.Kvs {
			f := strings.Split(strings.TrimPrefix(string(kv.Key), prefix), "/")
			if len(f) != 4 || seen[f[0]] {
				continue
			}
			path := p.hostPath(f[1] + "/" + f[2])
			if path == nil || path.Kind() == abi.PathRDMA && rdmaSent {
				continue
			}
			seen[f[0]] = true
			rdmaSent = rdmaSent || path.Kind() == abi.PathRDMA
			remote = append(remote, path)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.remote = remote
	}
	p.fetched, p.busy = time.Now(), false
}

// hostPath is the path of the group's datagrams to the host of member
// adapter target ("vm/vrdmaN"): the one unicast datagrams from the sender
// to it take; nil when there is none.
func (p *groupPath) hostPath(target string) device.DatagramPath {
	a, c := p.a, p.a.ctl
	end, d, err := c.lookupRemote(p.from, target, "dgid")
	if err != nil {
		return nil
	}
	switch {
	case d.Path == pathsel.TCP && a.up != nil:
		peer := a.up.Peer(end.Host.Host.ID)
		go peer.Conn(c.cfg.LookupTimeout)
		return tcp.Datagrams(peer)
	case d.Path == pathsel.RDMA:
		return a.rdmaGroup(end.PortGroup, p.gid)
	}
	return nil
}

// rdmaGroup is the rdma path of datagrams to group gid on port group pg
// (RoCE v1 or v2, as pg says): one packet to the group's address, which
// reaches every host with members that the network brings it to; nil
// when this agent has no such engine, or the group cannot travel on it.
func (a *Agent) rdmaGroup(pg records.PortGroup, gid abi.GID) device.DatagramPath {
	so := netcheck.SocketOptionsOf(pg)
	e, m := a.rdma, rdma.Marks{TOS: uint8(so.TOS), Priority: uint8(so.Priority)}
	if pg.RoCEVersion == records.RoCEv1 {
		e, m.VLAN = a.rdma1, uint16(pg.VLAN)
	}
	if e == nil {
		return nil
	}
	path, ok := e.GroupDatagrams(gid, m)
	if !ok {
		return nil
	}
	return path
}
