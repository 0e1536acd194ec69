// SPDX-License-Identifier: Apache-2.0

package console

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/netcheck"
)

// HostPage is GET /api/hosts/{id}: the host's record (tagged PVRDMA
// address, pvrdma firewall rule, uplinks) and, when it is the local
// agent's host, what the agent reports of its PVRDMA listener and
// uplinks.
type HostPage struct {
	Host           HostNode             `json:"host"`
	Switch         string               `json:"switch"`
	PVRDMAAddress  string               `json:"pvrdma_address"`
	PVRDMAVmknic   string               `json:"pvrdma_vmknic,omitempty"`
	FirewallPVRDMA bool                 `json:"firewall_pvrdma"`
	AgentVersion   string               `json:"agent_version"`
	Local          bool                 `json:"local"`
	PVRDMA         *vrdma.PVRDMAStatus  `json:"pvrdma,omitempty"`
	TCPUplinks     []vrdma.UplinkStatus `json:"tcp_uplinks"`
	RDMAUplinks    []vrdma.RDMAStatus   `json:"rdma_uplinks"`
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
	h := hosts[i]
	p := HostPage{Host: hostNode(h, time.Now()), Switch: h.Host.Switch, PVRDMAVmknic: h.Host.PVRDMAVmknic, FirewallPVRDMA: h.Host.FirewallPVRDMA,
		AgentVersion: h.Host.AgentVersion, TCPUplinks: []vrdma.UplinkStatus{}, RDMAUplinks: []vrdma.RDMAStatus{}}
	if h.Host.PVRDMAAddress.IsValid() {
		p.PVRDMAAddress = h.Host.PVRDMAAddress.String()
	}
	if ag, err := s.agent(ctx); err == nil {
		defer ag.Close()
		if st, err := ag.Status(ctx); err == nil && st.HostID == id {
			p.Local, p.PVRDMA = true, st.PVRDMA
			p.TCPUplinks = append(p.TCPUplinks, st.Uplinks...)
			p.RDMAUplinks = append(p.RDMAUplinks, st.RDMA...)
		}
	}
	return p, nil
}

// Live is GET /api/live: the local agent's running VMs with their
// adapters' counters and their QPs' paths, for the live view, which
// polls it and charts the counters' growth.
type Live struct {
	Host string    `json:"host"`
	Time time.Time `json:"time"`
	VMs  []LiveVM  `json:"vms"`
}

// LiveVM is one attached VM of the live view.
type LiveVM struct {
	Name     string                 `json:"name"`
	Adapters []mgmt.AdapterCounters `json:"adapters"`
	QPs      []vrdma.QPStatus       `json:"qps"`
	Hidden   bool                   `json:"hidden,omitempty"` // another user's VM: no QPs or counters
}

func (s *server) live(ctx context.Context, _ *http.Request) (any, error) {
	ag, err := s.agent(ctx)
	if err != nil {
		return nil, err
	}
	defer ag.Close()
	st, err := ag.Status(ctx)
	if err != nil {
		return nil, err
	}
	l := Live{Host: st.Host, Time: time.Now().UTC(), VMs: []LiveVM{}}
	for _, v := range st.VMs {
		if !v.Attached {
			continue
		}
		lv := LiveVM{Name: v.Name, Adapters: v.AdapterCounters, QPs: v.QPs, Hidden: v.ObjectsHidden}
		if lv.Adapters == nil {
			lv.Adapters = []mgmt.AdapterCounters{}
		}
		if lv.QPs == nil {
			lv.QPs = []vrdma.QPStatus{}
		}
		l.VMs = append(l.VMs, lv)
	}
	return l, nil
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
