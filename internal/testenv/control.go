// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
)

// StartControl runs an agent in this process with a control plane: ctl
// says which etcd (Endpoints; e.g. those of etcdtest.Start, shared by
// several agents) and the host record's fields. Lookups and publishes
// give up after 2 s and the host's lease lives 2 s, so that outage tests
// stay short.
func StartControl(tb testing.TB, host string, ctl agent.ControlConfig) *Env {
	tb.Helper()
	if ctl.LookupTimeout == 0 {
		ctl.LookupTimeout = 2 * time.Second
	}
	if ctl.LeaseTTL == 0 {
		ctl.LeaseTTL = 2 * time.Second
	}
	ctl.UnsafeNoFsync = true
	return StartWith(tb, Options{Host: host, Control: &ctl})
}

// VMXOn returns VMX text for o whose adapters are on distributed port
// group pg of switch sw (ethernetN.dvs.portgroupId and .dvs.switchId).
func VMXOn(o VMOptions, sw, pg string) string {
	s := VMX(o)
	n := o.Adapters
	if n == 0 {
		n = 1
	}
	for i := 0; i < n; i++ {
		if sw != "" {
			s += fmt.Sprintf("ethernet%d.dvs.switchId = %q\n", i, sw)
		}
		s += fmt.Sprintf("ethernet%d.dvs.portgroupId = %q\n", i, pg)
	}
	return s
}

// DefineVMX defines VM name on the agent with VMX text vmx.
func (e *Env) DefineVMX(tb testing.TB, name, vmx string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(e.Socket))
	if err != nil {
		tb.Fatal(err)
	}
	defer a.Close()
	if err := a.DefineVM(ctx, name, []byte(vmx)); err != nil {
		tb.Fatalf("define VM %s: %v", name, err)
	}
}

// OpenVMX defines VM name with VMX text vmx and attaches to it; the VM is
// closed at the end of the test.
func (e *Env) OpenVMX(tb testing.TB, name, vmx string) *vrdma.VM {
	tb.Helper()
	e.DefineVMX(tb, name, vmx)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := vrdma.Open(ctx, name, vrdma.WithSocket(e.Socket))
	if err != nil {
		tb.Fatalf("open VM %s: %v", name, err)
	}
	tb.Cleanup(func() { v.Close() })
	return v
}
