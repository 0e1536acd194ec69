// SPDX-License-Identifier: Apache-2.0

package console

import (
	"context"
	"net/http"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// The control plane's administration from the browser: configure a host
// for PVRDMA, create and delete switches, port groups and VMs. Host,
// switch and port group changes go through package admin, as vrdmactl
// host configure, switch and portgroup do, with the console user's
// access to the control plane; VMs are created and removed by the agent,
// as vrdmactl vm create and undefine do. Refusals answer with their
// reason.

// needStore says why there is no control plane to write to, if there
// is none.
func (s *server) needStore() error {
	if s.cfg.Store == nil {
		return &httpError{http.StatusServiceUnavailable, "no control plane, so nothing to change there: " + s.cfg.ControlErr}
	}
	return nil
}

// hostConfigureRequest is POST /api/hosts/{id}/configure's body: only
// the fields given change (vrdmactl host configure's flags).
type hostConfigureRequest struct {
	PVRDMAAddress    *string `json:"pvrdma_address"` // ADDR:PORT, ADDR or none
	Vmknic           *string `json:"vmknic"`
	FirewallPVRDMA   *bool   `json:"firewall_pvrdma"`
	PVRDMANamespaces *bool   `json:"pvrdma_namespaces"`
	Maintenance      *bool   `json:"maintenance"`
}

// configureHost is POST /api/hosts/{id}/configure; it answers the host's
// page as it is after the change.
func (s *server) configureHost(ctx context.Context, r *http.Request) (any, error) {
	var req hostConfigureRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := s.needStore(); err != nil {
		return nil, err
	}
	hs, err := admin.ConfigureHost(ctx, s.cfg.Store, s.cfg.Cache, r.PathValue("id"), admin.HostChange{PVRDMAAddress: req.PVRDMAAddress, Vmknic: req.Vmknic,
		FirewallPVRDMA: req.FirewallPVRDMA, PVRDMANamespaces: req.PVRDMANamespaces, Maintenance: req.Maintenance})
	if err != nil {
		return nil, err
	}
	return s.hostPage(ctx, hs), nil
}

// switchRequest is POST /api/switches's body.
type switchRequest struct {
	Name          string `json:"name"`
	MTU           int    `json:"mtu"`
	UplinkPolicy  string `json:"uplink_policy"`
	NetworkPolicy string `json:"network_policy"`
}

func (s *server) createSwitch(ctx context.Context, r *http.Request) (any, error) {
	var req switchRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := s.needStore(); err != nil {
		return nil, err
	}
	return admin.CreateSwitch(ctx, s.cfg.Store, records.Switch{Name: req.Name, MTU: req.MTU,
		UplinkPolicy: records.UplinkPolicy(req.UplinkPolicy), NetworkPolicy: records.NetworkPolicy(req.NetworkPolicy)})
}

// portGroupRequest is POST /api/portgroups's body.
type portGroupRequest struct {
	Key         string `json:"key"`
	Name        string `json:"name"`
	Switch      string `json:"switch"`
	VLAN        int    `json:"vlan"`
	PFCPriority int    `json:"pfc_priority"`
	DSCP        int    `json:"dscp"`
	RoCEVersion string `json:"roce_version"`
	Subnet      string `json:"subnet"`
}

func (s *server) createPortGroup(ctx context.Context, r *http.Request) (any, error) {
	var req portGroupRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := s.needStore(); err != nil {
		return nil, err
	}
	return admin.CreatePortGroup(ctx, s.cfg.Store, records.PortGroup{Key: req.Key, Name: req.Name, Switch: req.Switch, VLAN: req.VLAN,
		PFCPriority: req.PFCPriority, DSCP: req.DSCP, RoCEVersion: records.RoCEVersion(req.RoCEVersion), Subnet: req.Subnet})
}

// deleted is the answer of a delete.
type deleted struct {
	Deleted string `json:"deleted"`
}

func (s *server) deleteSwitch(ctx context.Context, r *http.Request) (any, error) {
	if err := decode(r, &struct{}{}); err != nil {
		return nil, err
	}
	if err := s.needStore(); err != nil {
		return nil, err
	}
	name := r.PathValue("name")
	return deleted{"switch " + name}, admin.DeleteSwitch(ctx, s.cfg.Store, name)
}

func (s *server) deletePortGroup(ctx context.Context, r *http.Request) (any, error) {
	if err := decode(r, &struct{}{}); err != nil {
		return nil, err
	}
	if err := s.needStore(); err != nil {
		return nil, err
	}
	key := r.PathValue("key")
	return deleted{"port group " + key}, admin.DeletePortGroup(ctx, s.cfg.Store, key)
}

// vmRequest is POST /api/vms's body (vrdmactl vm create's flags).
type vmRequest struct {
	Name      string `json:"name"`
	MemoryMB  int    `json:"memory_mb"`
	GuestOS   string `json:"guest_os"`
	HWVersion int    `json:"hw_version"`
	Host      string `json:"host"` // name or ID; "": the agent's
}

// createVM creates a powered-off VM with no adapter, owned by the
// console's user, through the agent.
func (s *server) createVM(ctx context.Context, r *http.Request) (any, error) {
	var req vmRequest
	return s.call(ctx, r, &req, func(ag *vrdma.Agent) (any, error) {
		text, err := vmconfig.NewVMX(req.Name, req.MemoryMB, req.HWVersion, req.GuestOS)
		if err != nil {
			return nil, &httpError{http.StatusBadRequest, "create VM " + req.Name + ": " + err.Error()}
		}
		return ag.CreateVM(ctx, vrdma.VMSpec{Name: req.Name, VMX: text, Host: req.Host})
	})
}

// deleteVM removes a VM (vrdmactl vm undefine): the agent refuses one
// that runs.
func (s *server) deleteVM(ctx context.Context, r *http.Request) (any, error) {
	name := r.PathValue("name")
	return s.call(ctx, r, &struct{}{}, func(ag *vrdma.Agent) (any, error) {
		return deleted{"VM " + name}, ag.UndefineVM(ctx, name)
	})
}

// portGroupSetRequest is POST /api/portgroups/{key}/set's body: only the
// fields given change (vrdmactl portgroup set's flags).
type portGroupSetRequest struct {
	Name        *string `json:"name"`
	VLAN        *int    `json:"vlan"`
	PFCPriority *int    `json:"pfc_priority"`
	DSCP        *int    `json:"dscp"`
	RoCEVersion *string `json:"roce_version"`
	RoCEMTU     *int    `json:"roce_mtu"`
	Subnet      *string `json:"subnet"`
}

// setPortGroup changes a port group's network settings; the answer is
// the port group as it is after.
func (s *server) setPortGroup(ctx context.Context, r *http.Request) (any, error) {
	var req portGroupSetRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := s.needStore(); err != nil {
		return nil, err
	}
	ch := admin.PortGroupChange{Name: req.Name, VLAN: req.VLAN, PFCPriority: req.PFCPriority, DSCP: req.DSCP, RoCEMTU: req.RoCEMTU, Subnet: req.Subnet}
	if req.RoCEVersion != nil {
		v := records.RoCEVersion(*req.RoCEVersion)
		ch.RoCEVersion = &v
	}
	return admin.SetPortGroup(ctx, s.cfg.Store, r.PathValue("key"), ch)
}

// switchSetRequest is POST /api/switches/{name}/set's body (vrdmactl
// switch set's flags).
type switchSetRequest struct {
	MTU           *int    `json:"mtu"`
	UplinkPolicy  *string `json:"uplink_policy"`
	NetworkPolicy *string `json:"network_policy"`
}

// setSwitch changes a switch's MTU, uplink policy or network policy; the
// answer is the switch as it is after.
func (s *server) setSwitch(ctx context.Context, r *http.Request) (any, error) {
	var req switchSetRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := s.needStore(); err != nil {
		return nil, err
	}
	ch := admin.SwitchChange{MTU: req.MTU}
	if req.UplinkPolicy != nil {
		v := records.UplinkPolicy(*req.UplinkPolicy)
		ch.UplinkPolicy = &v
	}
	if req.NetworkPolicy != nil {
		v := records.NetworkPolicy(*req.NetworkPolicy)
		ch.NetworkPolicy = &v
	}
	return admin.SetSwitch(ctx, s.cfg.Store, r.PathValue("name"), ch)
}

// uplinkDeclareRequest is POST /api/hosts/{id}/uplinks/{uplink}/declare's
// body: vrdmactl host uplink declare's flags (each value "unknown"
// removes its declaration).
type uplinkDeclareRequest struct {
	PFC        *string `json:"pfc"`
	Pause      *string `json:"pause"`
	Trust      *string `json:"trust"`
	MTU        *string `json:"mtu"`
	Teamed     *string `json:"teamed"`
	Team       *string `json:"team"`
	SoleUplink *string `json:"sole_uplink"`
	Clear      bool    `json:"clear"`
}

// declareUplink records what an uplink's NIC does for lossless Ethernet
// where its kernel cannot say; the answer is the host's page after.
func (s *server) declareUplink(ctx context.Context, r *http.Request) (any, error) {
	var req uplinkDeclareRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := s.needStore(); err != nil {
		return nil, err
	}
	d := admin.UplinkDeclaration{PFC: req.PFC, Pause: req.Pause, Trust: req.Trust, MTU: req.MTU, Teamed: req.Teamed, Team: req.Team, SoleUplink: req.SoleUplink, Clear: req.Clear}
	h, _, err := admin.DeclareUplink(ctx, s.cfg.Store, s.cfg.Cache, r.PathValue("id"), r.PathValue("uplink"), d)
	if err != nil {
		return nil, err
	}
	hs, err := s.cfg.Cache.Host(ctx, h.ID)
	if err != nil {
		hs = member.HostStatus{Declared: h.State}
	}
	hs.Host = h
	return s.hostPage(ctx, hs), nil
}
