// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"fmt"
	"strings"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/locations"
)

// AgentInfo describes a host agent: its host, release and capability bits
// (Caps; see Caps.Effective for an agent that sends none).
type AgentInfo = abi.HelloReply

// Caps is a set of capability bits: the features an agent serves
// (AgentInfo.Caps).
type Caps = abi.Caps

// Capability bits of AgentInfo.Caps.
const (
	CapAsyncMode   = abi.CapAsyncMode   // vrdma.asyncMode is honoured
	CapFence       = abi.CapFence       // SendFence is honoured on every path
	CapPathMemcpy  = abi.CapPathMemcpy  // same-host peers over memcpy
	CapPathTCP     = abi.CapPathTCP     // other hosts over tcp (the agent runs a control plane and a PVRDMA address)
	CapCM          = abi.CapCM          // Listen, Connect and the other connection-management calls
	CapQPCounters  = abi.CapQPCounters  // QPStatus.Counters are filled
	CapVMManage    = abi.CapVMManage    // the VM management calls
	CapCoreVerbs   = abi.CapCoreVerbs   // CQ.Resize, MR.Rereg, solicited-only CQ events
	CapQPEvents    = abi.CapQPEvents    // EventCommEst and EventSQDrained
	CapCQOverrun   = abi.CapCQOverrun   // CQOverrun
	CapODP         = abi.CapODP         // AccessOnDemand regions and PD.AdviseMR
	CapAtomicWrite = abi.CapAtomicWrite // OpAtomicWrite
)

// Status is an agent's report of its VMs, adapters and QPs.
type Status = mgmt.Status

// VMStatus is one VM in a Status.
type VMStatus = mgmt.VMStatus

// QPStatus is one QP in a VMStatus.
type QPStatus = mgmt.QPStatus

// ProcessResources counts the PDs, MRs, CQs, QPs and SRQs one workload
// process holds on one adapter, in a VMStatus.
type ProcessResources = mgmt.ProcessResources

// QPCounters are a QP's statistics in a QPStatus: work requests by
// opcode and their bytes, receives, completions by status; retries, RNR
// NAKs, dropped, duplicate and out-of-sequence requests, the READ and
// atomic depth reached.
type QPCounters = mgmt.QPCounters

// RDMAStatus is one of the host's RDMA uplinks in a Status: its RoCEv2
// engine's address and packet counters.
type RDMAStatus = mgmt.RDMAStatus

// UplinkStatus is the agent's traffic with one other host over the tcp
// path, in a Status.
type UplinkStatus = mgmt.UplinkStatus

// PathDecisionCount counts an agent's path decisions of one kind in a
// Status: a path chosen for a QP or address handle, or a refusal by its
// reason.
type PathDecisionCount = mgmt.PathDecisionCount

// ConnectCount counts connection management's connects of one side (a
// dial, a request to a listener) by result in a Status.
type ConnectCount = mgmt.ConnectCount

// PVRDMAStatus is the host's end of the tcp path in Status: its PVRDMA
// address, where the agent listens, and the pvrdma firewall rule.
type PVRDMAStatus = mgmt.PVRDMAStatus

// AdapterInfo describes an adapter in a VMStatus.
type AdapterInfo = abi.AdapterInfo

// Agent is a management connection to a host agent, for tools such as
// vrdmactl: it defines VMs and reads status, but attaches to none.
type Agent struct {
	c    *conn
	Info AgentInfo
}

// DialAgent connects to the host agent (see WithSocket for the default).
func DialAgent(ctx context.Context, opts ...Option) (*Agent, error) {
	o := options{socket: locations.Socket()}
	for _, f := range opts {
		f(&o)
	}
	c, err := dial(o.socket)
	if err != nil {
		return nil, err
	}
	a := &Agent{c: c}
	if _, err := c.call(ctx, abi.OpHello, &abi.Hello{Client: "vrdma", Caps: helloCaps}, &a.Info); err != nil {
		c.close()
		return nil, fmt.Errorf("vrdma: hello to the agent: %w", err)
	}
	return a, nil
}

// DefineVM stores (or replaces) the VMX configuration of VM name on the
// agent's host, where it is then powered on; the caller owns it (only its
// uid or root may attach it, and its primary group if the VMX says
// vrdma.groupAttach = "TRUE").
func (a *Agent) DefineVM(ctx context.Context, name string, vmx []byte) error {
	_, err := a.c.call(ctx, abi.OpDefineVM, &mgmt.DefineVM{Name: name, VMX: string(vmx)}, nil)
	return err
}

// DefineVMFor is DefineVM with another owner than the caller: processes
// running as owner.UID may attach, and those with primary group
// owner.GID if the VMX grants it (vrdma.groupAttach). Only root (or the
// agent's user) may name someone else.
func (a *Agent) DefineVMFor(ctx context.Context, name string, vmx []byte, owner Owner) error {
	_, err := a.c.call(ctx, abi.OpDefineVM, &mgmt.DefineVM{Name: name, VMX: string(vmx), Owner: &owner}, nil)
	return err
}

// Owner is who may use a VM: processes running as UID may attach, and
// with primary group GID when the VMX grants it (vrdma.groupAttach); UID
// may change it; root may do both.
type Owner = mgmt.Owner

// Placement is where a VM sits in the inventory: datacenter, VM folder
// and resource pool.
type Placement = mgmt.Placement

// VMInfo describes a VM: its VMX, power state, host, owner and placement.
type VMInfo = mgmt.VMInfo

// Finding is what a rule (or a power-on check) says of a VM.
type Finding = mgmt.Finding

// VMSpec is a VM to create: name, VMX, and optionally its owner, host and
// placement.
type VMSpec = mgmt.CreateVM

// VMEdit is a change to a powered-off VM's VMX: adapters to add or
// remove, advanced parameters to set or unset, the memory reservation.
// Its Name is set by EditVM.
type VMEdit = mgmt.EditVM

// NewAdapter is a PVRDMA adapter that a VMEdit adds.
type NewAdapter = mgmt.NewAdapter

// KeyValue is a VMX setting of a VMEdit.
type KeyValue = mgmt.KeyValue

// EditResult is a VM after an edit, with what the rules say of it.
type EditResult = mgmt.EditReply

// PowerResult reports a power-on or power-off.
type PowerResult = mgmt.PowerReply

// ConnectResult reports a connect or disconnect of an adapter.
type ConnectResult = mgmt.ConnectReply

// RefusedError is a power-on or an edit that the rules refused; nothing
// changed. Findings holds every finding (errors and warnings).
type RefusedError struct {
	Op       string // "power-on" or "edit"
	VM       string
	Findings []Finding
}

// Error lists the findings that are errors: "power-on of VM web refused by
// 2 rules: hw-version: …; memory-reservation: …".
func (e *RefusedError) Error() string {
	var errs []string
	for _, f := range e.Findings {
		if f.Severity == "error" {
			errs = append(errs, f.Rule+": "+f.Message)
		}
	}
	return fmt.Sprintf("%s of VM %s refused by %d rules: %s", e.Op, e.VM, len(errs), strings.Join(errs, "; "))
}

// CreateVM creates a powered-off VM: in the control plane when the agent
// has one (any host may then run it), else on the agent's host.
func (a *Agent) CreateVM(ctx context.Context, spec VMSpec) (VMInfo, error) {
	var in VMInfo
	_, err := a.c.call(ctx, abi.OpCreateVM, &spec, &in)
	return in, err
}

// VM returns VM name's configuration, power state and placement.
func (a *Agent) VM(ctx context.Context, name string) (VMInfo, error) {
	var in VMInfo
	_, err := a.c.call(ctx, abi.OpGetVM, &mgmt.VMRef{Name: name}, &in)
	return in, err
}

// EditVM changes powered-off VM name's VMX. An edit that would break a
// rule that held before is refused with a *RefusedError, and the result
// still describes the VM.
func (a *Agent) EditVM(ctx context.Context, name string, e VMEdit) (EditResult, error) {
	e.Name = name
	var r EditResult
	if _, err := a.c.call(ctx, abi.OpEditVM, &e, &r); err != nil {
		return r, err
	}
	if r.Refused {
		return r, &RefusedError{Op: "edit", VM: name, Findings: r.Findings}
	}
	return r, nil
}

// PowerOnVM runs every rule against VM name and host (name or ID; "" is
// the host the VM is registered on, or the agent's) and powers the VM on
// there if none fails; otherwise it returns a *RefusedError with every
// finding, and the result too.
func (a *Agent) PowerOnVM(ctx context.Context, name, host string) (PowerResult, error) {
	var r PowerResult
	if _, err := a.c.call(ctx, abi.OpPowerOnVM, &mgmt.PowerOnVM{Name: name, Host: host}, &r); err != nil {
		return r, err
	}
	if r.Refused {
		return r, &RefusedError{Op: "power-on", VM: name, Findings: r.Findings}
	}
	return r, nil
}

// PowerOffVM powers VM name off and detaches its workload, wherever it
// runs: the workload's calls fail and its peers' QPs flush.
func (a *Agent) PowerOffVM(ctx context.Context, name string) (PowerResult, error) {
	var r PowerResult
	_, err := a.c.call(ctx, abi.OpPowerOffVM, &mgmt.VMRef{Name: name}, &r)
	return r, err
}

// ConnectAdapter connects (connected true) or disconnects adapter vrdmaN
// of VM name, whose workload runs on the agent's host, as the vSphere
// Client's "Connected" box: while it is disconnected its port is down
// (PORT_DOWN), its QPs' requests go unanswered, and every context of the
// adapter gets IBV_EVENT_PORT_ERR, then IBV_EVENT_PORT_ACTIVE when it is
// connected again.
func (a *Agent) ConnectAdapter(ctx context.Context, name, adapter string, connected bool) (ConnectResult, error) {
	var r ConnectResult
	_, err := a.c.call(ctx, abi.OpConnectVM, &mgmt.ConnectAdapter{VM: name, Adapter: adapter, Connected: connected}, &r)
	return r, err
}

// UndefineVM removes VM name's definition: from the agent's host (it must
// not be attached), or a managed VM from the control plane (it must be
// powered off).
func (a *Agent) UndefineVM(ctx context.Context, name string) error {
	_, err := a.c.call(ctx, abi.OpUndefineVM, &mgmt.VMRef{Name: name}, nil)
	return err
}

// Status returns the agent's VMs, adapters, QPs and their paths.
func (a *Agent) Status(ctx context.Context) (Status, error) {
	var s Status
	_, err := a.c.call(ctx, abi.OpStatus, &abi.Empty{}, &s)
	return s, err
}

// Close ends the management connection.
func (a *Agent) Close() error { return a.c.close() }
