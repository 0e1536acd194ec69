// SPDX-License-Identifier: Apache-2.0

package console

import (
	"context"
	"errors"
	"net/http"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/rules"
	"github.com/vrdma/vrdma/internal/vmconfig"
	"github.com/vrdma/vrdma/internal/vmx"
)

// VMPage is GET /api/vms/{name}: the VM, its settings as Edit Settings
// shows them, what the rules say of it now, and the port groups a new
// adapter may go on.
type VMPage struct {
	VM vrdma.VMInfo `json:"vm"`
	// Adapters are its PVRDMA adapters and their port groups.
	Adapters []AdapterNode `json:"adapters"`
	// MemSizeMB is memSize; MemoryReserved says all of it is reserved
	// and locked ("Reserve all guest memory (All locked)").
	MemSizeMB      int  `json:"mem_size_mb"`
	MemoryReserved bool `json:"memory_reserved"`
	// Params are the VMX's settings, in file order: the advanced
	// configuration parameters.
	Params []vrdma.KeyValue `json:"params"`
	// Findings are the rules' verdicts on the VMX as it is (vrdmactl
	// vmx check's rules; power-on adds the host's).
	Findings   []vrdma.Finding   `json:"findings"`
	PortGroups []PortGroupChoice `json:"portgroups"`
	// Hosts are the hosts it may be powered on on (a managed VM's
	// choice; the power-on checks them).
	Hosts []HostChoice `json:"hosts"`
	// ConfigError says why the VMX's settings cannot be read.
	ConfigError string `json:"config_error,omitempty"`
}

func (s *server) vm(ctx context.Context, r *http.Request) (any, error) {
	ag, err := s.agent(ctx)
	if err != nil {
		return nil, err
	}
	defer ag.Close()
	in, err := ag.VM(ctx, r.PathValue("name"))
	if err != nil {
		return nil, err
	}
	p := VMPage{VM: in, Adapters: adaptersOfVMX(in.VMX), Params: []vrdma.KeyValue{}, Findings: []vrdma.Finding{}, PortGroups: portGroups(s.cfg.Cache), Hosts: hostChoices(s.cfg.Cache)}
	f, err := vmx.Parse([]byte(in.VMX))
	if err != nil {
		p.ConfigError = err.Error()
		return p, nil
	}
	for _, k := range f.Keys() {
		v, _ := f.Get(k)
		p.Params = append(p.Params, vrdma.KeyValue{Key: k, Value: v})
	}
	for _, fd := range rules.Check(f, rules.Target{}) {
		p.Findings = append(p.Findings, vrdma.Finding{Rule: fd.Rule, Severity: fd.Severity, Key: fd.Key, Line: fd.Line, Message: fd.Message})
	}
	if cfg, err := vmconfig.FromFile(f); err != nil {
		p.ConfigError = err.Error()
	} else {
		p.MemSizeMB, p.MemoryReserved = cfg.MemSizeMB, cfg.MemoryLocked()
	}
	return p, nil
}

// edit is POST /api/vms/{name}/edit: body a vrdma.VMEdit (its dry_run
// asks only what a save would answer); the answer is the agent's
// EditResult, Refused with the rules the change would break.
func (s *server) edit(ctx context.Context, r *http.Request) (any, error) {
	var e vrdma.VMEdit
	return s.call(ctx, r, &e, func(ag *vrdma.Agent) (any, error) {
		return ag.EditVM(ctx, r.PathValue("name"), e)
	})
}

// powerOnRequest is POST /api/vms/{name}/power-on's body.
type powerOnRequest struct {
	Host string `json:"host"` // name or ID; "": where the VM is registered
}

// powerOn powers the VM on; a refusal answers 200 with Refused and every
// failed rule.
func (s *server) powerOn(ctx context.Context, r *http.Request) (any, error) {
	var req powerOnRequest
	return s.call(ctx, r, &req, func(ag *vrdma.Agent) (any, error) {
		return ag.PowerOnVM(ctx, r.PathValue("name"), req.Host)
	})
}

func (s *server) powerOff(ctx context.Context, r *http.Request) (any, error) {
	return s.call(ctx, r, &struct{}{}, func(ag *vrdma.Agent) (any, error) {
		return ag.PowerOffVM(ctx, r.PathValue("name"))
	})
}

// connectRequest is POST /api/vms/{name}/connect's body.
type connectRequest struct {
	Adapter   string `json:"adapter"` // vrdmaN
	Connected bool   `json:"connected"`
}

// connect connects or disconnects a running VM's adapter (the
// "Connected" box; vm connect and disconnect).
func (s *server) connect(ctx context.Context, r *http.Request) (any, error) {
	var req connectRequest
	return s.call(ctx, r, &req, func(ag *vrdma.Agent) (any, error) {
		return ag.ConnectAdapter(ctx, r.PathValue("name"), req.Adapter, req.Connected)
	})
}

// call decodes r's body into req, then runs fn with the agent. A refusal
// by the rules is an answer (the result, Refused with its findings), not
// an error.
func (s *server) call(ctx context.Context, r *http.Request, req any, fn func(*vrdma.Agent) (any, error)) (any, error) {
	if err := decode(r, req); err != nil {
		return nil, err
	}
	ag, err := s.agent(ctx)
	if err != nil {
		return nil, err
	}
	defer ag.Close()
	res, err := fn(ag)
	var rf *vrdma.RefusedError
	if errors.As(err, &rf) {
		return res, nil
	}
	return res, err
}
