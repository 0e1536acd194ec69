package vrdma

import (
	"context"
	"fmt"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/paths"
)

// AgentInfo describes a host agent.
type AgentInfo = abi.HelloReply

// Status is an agent's report of its VMs, adapters and QPs.
type Status = abi.Status

// VMStatus is one VM in a Status.
type VMStatus = abi.VMStatus

// QPStatus is one QP in a VMStatus.
type QPStatus = abi.QPStatus

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
	o := options{socket: paths.Socket()}
	for _, f := range opts {
		f(&o)
	}
	c, err := dial(o.socket)
	if err != nil {
		return nil, err
	}
	a := &Agent{c: c}
	if _, err := c.call(ctx, abi.OpHello, &abi.Hello{Client: "vrdma"}, &a.Info); err != nil {
		c.close()
		return nil, fmt.Errorf("vrdma: hello to the agent: %w", err)
	}
	return a, nil
}

// DefineVM stores (or replaces) the VMX configuration of VM name.
func (a *Agent) DefineVM(ctx context.Context, name string, vmx []byte) error {
	_, err := a.c.call(ctx, abi.OpDefineVM, &abi.DefineVM{Name: name, VMX: string(vmx)}, nil)
	return err
}

// UndefineVM removes VM name's definition; it must not be attached.
func (a *Agent) UndefineVM(ctx context.Context, name string) error {
	_, err := a.c.call(ctx, abi.OpUndefineVM, &abi.VMRef{Name: name}, nil)
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
