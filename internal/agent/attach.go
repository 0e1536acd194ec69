// SPDX-License-Identifier: Apache-2.0

package agent

// Attaching and detaching a session's VM: the procedures' checks (package
// manage), the device's VM (package device), and the control plane's
// record of it (control.go).

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// loadVMConfig reads a VM's definition from the state directory.
func (a *Agent) loadVMConfig(name string) (*vmconfig.Config, error) {
	p := filepath.Join(a.cfg.StateDir, "vms", name+".vmx")
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, abi.Errorf(abi.CodeNotFound, "vm", "VM %q is not defined on host %s: define it first (vrdmactl vm define %s FILE.vmx)", name, a.cfg.Host, name)
	}
	if err != nil {
		return nil, abi.Errorf(abi.CodeInternal, "vm", "read VM %q: %v", name, err)
	}
	cfg, err := vmconfig.Parse(b)
	if err != nil {
		return nil, abi.Errorf(abi.CodeInvalid, "vmx", "VM %q (%s): %v", name, p, err)
	}
	return cfg, nil
}

// attachVM attaches VM name for session s: the procedures check the
// caller, the VM's power state and placement (twice: once more when the
// name is reserved), the device sets up its memory and adapters, and the
// control plane publishes it before peers may see it.
func (a *Agent) attachVM(s *session, name string) (*device.Context, error) {
	cfg, managed, err := a.proc.AttachConfig(s.caller(), name) // owner, power, placement
	if err != nil {
		return nil, err
	}
	if err := a.quota.Take(s.uid, quota.Processes, 1); err != nil {
		return nil, err
	}
	v, err := a.dev.Attach(s, name, cfg, managed, func() error {
		// A power-off that ran since the check above found no VM to
		// detach: check again now that the name is taken.
		_, _, err := a.proc.AttachConfig(s.caller(), name)
		return err
	})
	if err != nil {
		a.quota.Give(s.uid, quota.Processes, 1)
		return nil, err
	}
	if !v.Joined() { // a process joining a VM shares the first's record
		err = a.publishVM(v, s.uid) // control.go
		for _, ad := range v.Adapters() {
			ad.SetActiveMTU(a.nativeMTU) // a native peer's; 0 leaves the default
		}
	}
	if err == nil {
		err = v.SetReadyUnique() // no other VM of this host has one of its addresses
	}
	if err == nil && !v.Joined() && a.vmnet != nil {
		err = a.addVMNet(v) // vmnet.go: its addresses are final now
	}
	if err != nil {
		a.detachVM(v)
		return nil, err
	}
	if v.Managed() && a.ctl != nil {
		// A power-off or a move that came after the checks above, and
		// whose change the watch delivered before v was ready, found
		// nothing to detach: look once more.
		a.proc.Reconcile(v)
	}
	return v, nil
}

// detachVM tears down the VM of a session that ended: its listeners, then
// its objects and memory (peers' QPs flush), then, when no other workload
// has the VM, its record in the control plane, and last its name.
func (a *Agent) detachVM(v *device.Context) {
	a.cm.CloseVM(v)
	v.Teardown()
	for _, ad := range v.Adapters() {
		a.syncMcast(ad) // mcast.go: its QPs left their groups
	}
	if v.LastProcess() {
		if a.vmnet != nil {
			a.vmnet.RemoveVM(v.Name())
		}
		a.unpublishVM(v) // while the name is still taken, so a new attach publishes after
	}
	a.dev.Remove(v)
	a.quota.Give(v.UID(), quota.Processes, 1)
}
