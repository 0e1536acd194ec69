// SPDX-License-Identifier: Apache-2.0

package console

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/netcheck"
)

// HostPage is GET /api/hosts/{id}: the host's record (tagged PVRDMA
// address, pvrdma firewall rule, PVRDMA namespaces, uplinks) and, when
// the console reads the host's agent, what the agent reports of its
// PVRDMA listener and uplinks.
type HostPage struct {
	Host           HostNode `json:"host"`
	Switch         string   `json:"switch"`
	PVRDMAAddress  string   `json:"pvrdma_address"`
	PVRDMAVmknic   string   `json:"pvrdma_vmknic,omitempty"`
	FirewallPVRDMA bool     `json:"firewall_pvrdma"`
	// PVRDMANamespaces are on for the host's RDMA uplink (native
	// endpoints need them); Maintenance keeps new VMs off it.
	PVRDMANamespaces bool   `json:"pvrdma_namespaces"`
	Maintenance      bool   `json:"maintenance"`
	AgentVersion     string `json:"agent_version"`
	// Uplinks are its RDMA uplinks with the lossless-Ethernet state
	// their operator declared and their host observed.
	Uplinks []UplinkState `json:"uplinks"`
	// Local says it is the local agent's host; Agent that the console
	// reads its agent (the local one or another given to it).
	Local       bool                 `json:"local"`
	Agent       bool                 `json:"agent"`
	PVRDMA      *vrdma.PVRDMAStatus  `json:"pvrdma,omitempty"`
	TCPUplinks  []vrdma.UplinkStatus `json:"tcp_uplinks"`
	RDMAUplinks []vrdma.RDMAStatus   `json:"rdma_uplinks"`
}

func (s *server) host(ctx context.Context, r *http.Request) (any, error) {
	if s.cfg.Cache == nil {
		return nil, &httpError{http.StatusNotFound, "no control plane, so no host records: " + s.cfg.ControlErr}
	}
	// The cached hosts only: no key is made of the request's text.
	id := r.PathValue("id")
	hosts := s.cfg.Cache.Hosts()
	i := slices.IndexFunc(hosts, func(h member.HostStatus) bool { return h.Host.ID == id })
	if i < 0 {
		return nil, &httpError{http.StatusNotFound, "host " + id + ": not in the control plane"}
	}
	return s.hostPage(ctx, hosts[i]), nil
}

// UplinkState is one RDMA uplink of a host's page: its name (device or
// address, as host uplink declare takes it) and its NIC state, declared
// and observed, for people.
type UplinkState struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Address  string `json:"address"`
	Declared string `json:"declared"`
	Observed string `json:"observed"`
}

// hostPage is h's page, with what its agent reports when the console
// reads it.
func (s *server) hostPage(ctx context.Context, h member.HostStatus) HostPage {
	p := HostPage{Host: hostNode(h, time.Now()), Switch: h.Host.Switch, PVRDMAVmknic: h.Host.PVRDMAVmknic, FirewallPVRDMA: h.Host.FirewallPVRDMA,
		PVRDMANamespaces: h.Host.PVRDMANamespaces, Maintenance: h.Host.State == records.HostMaintenance,
		AgentVersion: h.Host.AgentVersion, TCPUplinks: []vrdma.UplinkStatus{}, RDMAUplinks: []vrdma.RDMAStatus{}}
	if h.Host.PVRDMAAddress.IsValid() {
		p.PVRDMAAddress = h.Host.PVRDMAAddress.String()
	}
	p.Uplinks = []UplinkState{}
	for _, u := range h.Host.Uplinks {
		p.Uplinks = append(p.Uplinks, UplinkState{Name: u.Name(), Kind: string(u.Kind), Address: u.Address.String(), Declared: admin.NICText(u.Declared), Observed: admin.NICText(u.Observed)})
	}
	for i, st := range s.statuses(ctx) {
		if st.err == nil && st.HostID == h.Host.ID {
			p.Local, p.Agent, p.PVRDMA = i == 0, true, st.PVRDMA
			p.TCPUplinks = append(p.TCPUplinks, st.Uplinks...)
			p.RDMAUplinks = append(p.RDMAUplinks, st.RDMA...)
			break
		}
	}
	return p
}

// agentStatus is one agent's status, or why it could not be read.
type agentStatus struct {
	vrdma.Status
	socket string
	err    error
}

// statuses reads the status of the local agent (first) and of every
// other agent the console was given, each with its own deadline.
func (s *server) statuses(ctx context.Context) []agentStatus {
	out := make([]agentStatus, 0, 1+len(s.cfg.Agents))
	for i, sock := range append([]string{s.cfg.Socket}, s.cfg.Agents...) {
		a := agentStatus{socket: sock}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ag, err := vrdma.DialAgent(cctx, vrdma.WithSocket(sock))
		if err == nil {
			a.Status, err = ag.Status(cctx)
			ag.Close()
		}
		cancel()
		if err != nil && i > 0 {
			err = fmt.Errorf("the agent at %s (--agent): %w", sock, err)
		}
		a.err = err
		out = append(out, a)
	}
	return out
}

// Live is GET /api/live: the running VMs of the agents the console
// reads (the local one and --agent's) with their adapters' counters and
// their QPs' paths, and the map of hosts with the paths between them,
// for the live view, which polls it and charts the counters' growth.
type Live struct {
	Host string    `json:"host"` // the local agent's host
	Time time.Time `json:"time"`
	VMs  []LiveVM  `json:"vms"`
	// Hosts are the map's nodes: the control plane's hosts and the
	// agents read; Edges the paths between them that QPs take.
	Hosts []LiveHost `json:"hosts"`
	Edges []LiveEdge `json:"edges"`
	// Errors say which agents could not be read, and why.
	Errors []string `json:"errors"`
}

// LiveVM is one attached VM of the live view.
type LiveVM struct {
	Name     string                 `json:"name"`
	Host     string                 `json:"host"` // the host it runs on
	Adapters []mgmt.AdapterCounters `json:"adapters"`
	QPs      []vrdma.QPStatus       `json:"qps"`
	Hidden   bool                   `json:"hidden,omitempty"` // another user's VM: no QPs or counters
}

// LiveHost is a host on the map.
type LiveHost struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	State string `json:"state,omitempty"`
	// Agent says the console reads its agent (its VMs are in the view).
	Agent bool `json:"agent"`
	// SameHostQPs counts its QPs whose peer is on the host (memcpy).
	SameHostQPs int `json:"same_host_qps"`
}

// LiveEdge is the path QPs take between two hosts: A < B (IDs), the
// path kind, how many QPs of the agents read take it, and the bytes
// their requests moved (sent, written or read) since they were made.
type LiveEdge struct {
	A     string         `json:"a"`
	B     string         `json:"b"`
	Path  vrdma.PathKind `json:"path"`
	QPs   int            `json:"qps"`
	Bytes uint64         `json:"bytes"`
}

func (s *server) live(ctx context.Context, _ *http.Request) (any, error) {
	sts := s.statuses(ctx)
	if sts[0].err != nil && len(sts) == 1 {
		return nil, sts[0].err
	}
	l := Live{Host: sts[0].Host, Time: time.Now().UTC(), VMs: []LiveVM{}, Hosts: []LiveHost{}, Edges: []LiveEdge{}, Errors: []string{}}
	hosts := map[string]*LiveHost{}
	var order []string
	addHost := func(id, name, state string) *LiveHost {
		if h := hosts[id]; h != nil {
			return h
		}
		hosts[id] = &LiveHost{ID: id, Name: name, State: state}
		order = append(order, id)
		return hosts[id]
	}
	if s.cfg.Cache != nil {
		for _, h := range s.cfg.Cache.Hosts() {
			addHost(h.Host.ID, h.Host.Name, string(h.Host.State))
		}
	}
	edges := map[[3]string]*LiveEdge{}
	seen := map[string]bool{}
	for _, st := range sts {
		if st.err != nil {
			l.Errors = append(l.Errors, st.err.Error())
			continue
		}
		if seen[st.HostID] { // one agent given twice
			continue
		}
		seen[st.HostID] = true
		id := cmp.Or(st.HostID, st.Host)
		me := addHost(id, st.Host, "")
		me.Agent = true
		for _, v := range st.VMs {
			if !v.Attached {
				continue
			}
			lv := LiveVM{Name: v.Name, Host: st.Host, Adapters: v.AdapterCounters, QPs: v.QPs, Hidden: v.ObjectsHidden}
			if lv.Adapters == nil {
				lv.Adapters = []mgmt.AdapterCounters{}
			}
			if lv.QPs == nil {
				lv.QPs = []vrdma.QPStatus{}
			}
			l.VMs = append(l.VMs, lv)
			for _, q := range v.QPs {
				peer, ok := s.peerHost(q)
				switch {
				case q.Path.Path == abi.PathMemcpy || q.Path.Path == abi.PathMemcpyDirect:
					me.SameHostQPs++
				case ok && peer != id && (q.Path.Path == abi.PathTCP || q.Path.Path == abi.PathRDMA):
					a, b := min(id, peer), max(id, peer)
					k := [3]string{a, b, string(q.Path.Path)}
					e := edges[k]
					if e == nil {
						e = &LiveEdge{A: a, B: b, Path: q.Path.Path}
						edges[k] = e
					}
					e.QPs++
					e.Bytes += q.Counters.SendBytes
				}
			}
		}
	}
	for _, id := range order {
		l.Hosts = append(l.Hosts, *hosts[id])
	}
	for _, e := range edges {
		l.Edges = append(l.Edges, *e)
	}
	slices.SortFunc(l.Edges, func(x, y LiveEdge) int {
		return cmp.Or(cmp.Compare(x.A, y.A), cmp.Compare(x.B, y.B), cmp.Compare(x.Path, y.Path))
	})
	return l, nil
}

// peerHost returns the ID of the host that holds q's peer, a GID the
// control plane knows (a peer on the same host is named VM/vrdmaN).
func (s *server) peerHost(q vrdma.QPStatus) (string, bool) {
	gid, err := netip.ParseAddr(q.Peer)
	if err != nil || s.cfg.Cache == nil {
		return "", false
	}
	e, ok := s.cfg.Cache.HolderOf(gid)
	return e.Host, ok
}

// NetworkPage is GET /api/network: the RoCE network checks (vrdmactl
// network check --local-host none: the uplinks' state as their hosts
// reported or their operators declared it) with how to fix what fails.
type NetworkPage struct {
	OK       bool                    `json:"ok"`
	Counts   map[netcheck.Status]int `json:"counts"`
	Switches []netcheck.SwitchReport `json:"switches"`
}

func (s *server) network(context.Context, *http.Request) (any, error) {
	if s.cfg.Cache == nil {
		return nil, &httpError{http.StatusNotFound, "no control plane, so no network to check: " + s.cfg.ControlErr}
	}
	res := netcheck.Check(s.cfg.Cache.NetworkModel())
	p := NetworkPage{OK: res.OK(), Counts: res.Count(), Switches: res.Switches}
	if p.Switches == nil {
		p.Switches = []netcheck.SwitchReport{}
	}
	return p, nil
}

// PathAnswer is GET /api/path?a=VM/vrdmaN&b=VM/vrdmaM: the path the two
// adapters get, why, and every rejected candidate, decided from the
// control plane as the agents decide it (vrdmactl path explain).
type PathAnswer struct {
	A  string `json:"a"`
	B  string `json:"b"`
	OK bool   `json:"ok"`
	pathsel.Decision
	// Error says why the two cannot connect, or why an end is unknown.
	Error string `json:"error,omitempty"`
}

func (s *server) path(ctx context.Context, r *http.Request) (any, error) {
	if s.cfg.Cache == nil {
		return nil, &httpError{http.StatusNotFound, "no control plane, so no path decisions: " + s.cfg.ControlErr}
	}
	a, b := r.URL.Query().Get("a"), r.URL.Query().Get("b")
	if a == "" || b == "" {
		return nil, &httpError{http.StatusBadRequest, "name both ends: /api/path?a=VM/vrdmaN&b=VM/vrdmaM (or GIDs)"}
	}
	// Decide checks the names before it looks them up.
	d, err := s.cfg.Cache.Decide(ctx, a, b)
	ans := PathAnswer{A: a, B: b, OK: err == nil, Decision: d}
	if ans.Rejected == nil {
		ans.Rejected = []pathsel.Rejection{}
	}
	if err != nil {
		ans.Error = err.Error()
	}
	return ans, nil
}
