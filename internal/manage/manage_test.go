// SPDX-License-Identifier: Apache-2.0

package manage

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
)

// fakeVM is an attached VM that records its detaches and its adapters'
// connections.
type fakeVM struct {
	name   string
	mu     sync.Mutex
	kicked []string
	down   map[string]bool
}

func (v *fakeVM) Name() string  { return v.name }
func (v *fakeVM) Managed() bool { return false }
func (v *fakeVM) Running() bool { return true }
func (v *fakeVM) PID() int32    { return 42 }
func (v *fakeVM) Kick(why string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.kicked = append(v.kicked, why)
}
func (v *fakeVM) Detach(why string) bool { v.Kick(why); return true }
func (v *fakeVM) SetConnected(adapter string, connected bool) (bool, int, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.down == nil {
		v.down = map[string]bool{}
	}
	changed := v.down[adapter] == connected
	v.down[adapter] = !connected
	return changed, 1, nil
}

type fakeAttached map[string]*fakeVM

func (f fakeAttached) Attached(name string) (VM, bool) {
	v, ok := f[name]
	if !ok {
		return nil, false
	}
	return v, true
}

func (f fakeAttached) AttachedVMs() []VM {
	var out []VM
	for _, v := range f {
		out = append(out, v)
	}
	return out
}

// reconciled is fakeAttached whose VMs vanish once off says so, as when
// the agent's reconcile, which sees a power-off's record change, detaches
// a workload on its own.
type reconciled struct {
	fakeAttached
	off func() bool
}

func (r reconciled) Attached(name string) (VM, bool) {
	if r.off() {
		return nil, false
	}
	return r.fakeAttached.Attached(name)
}

// TestPowerOffReportsARacingDetach: a workload the reconcile detached
// once the record said powered off, before the power-off looked for it
// again, is still reported detached, and waited for.
func TestPowerOffReportsARacingDetach(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "vms"), 0o700); err != nil {
		t.Fatal(err)
	}
	var p *Procedures
	attached := false
	web := &fakeVM{name: "web"}
	off := func() bool { // the state file, read as the reconcile would, without the procedures' lock
		_, st, ok, _ := p.readLocal("web")
		return !attached || ok && string(st.Power) == "poweredOff"
	}
	p = New(Config{StateDir: dir, Host: "hostA", HostID: "00112233445566778899aabbccddeeff",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), VMs: reconciled{fakeAttached{"web": web}, off}})
	root := &Caller{Cred: true, Ctx: context.Background()}
	if err := p.Define(root, &mgmt.DefineVM{Name: "web", VMX: testVMX}); err != nil {
		t.Fatal(err)
	}
	attached = true
	rep, err := p.Serve(root, abi.OpPowerOffVM, &mgmt.VMRef{Name: "web"})
	if r, _ := rep.(mgmt.PowerReply); err != nil || !r.Changed || !r.Detached || len(web.kicked) != 1 {
		t.Fatalf("power off: %+v %v; detaches %v, want it reported detached", rep, err, web.kicked)
	}
}

const testVMX = "memSize = \"4\"\nvirtualHW.version = \"20\"\nguestOS = \"ubuntu-64\"\nethernet0.present = \"TRUE\"\nethernet0.virtualDev = \"vrdma\"\n"

func standalone(t *testing.T, att fakeAttached) *Procedures {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "vms"), 0o700); err != nil {
		t.Fatal(err)
	}
	return New(Config{StateDir: dir, Host: "hostA", HostID: "00112233445566778899aabbccddeeff",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), VMs: att})
}

func code(err error) string {
	var e *abi.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// TestStandaloneProcedures drives the procedures of a standalone agent
// through the owner rule: define, show, attach rules, power off with the
// workload detached, undefine.
func TestStandaloneProcedures(t *testing.T) {
	att := fakeAttached{}
	p := standalone(t, att)
	ctx := context.Background()
	root := &Caller{Cred: true, Ctx: ctx}
	alice := &Caller{Cred: true, UID: 1000, GID: 1000, PID: 7, Ctx: ctx}
	bob := &Caller{Cred: true, UID: 1001, GID: 1001, PID: 8, Ctx: ctx}

	if err := p.Define(root, &mgmt.DefineVM{Name: "web", VMX: testVMX, Owner: &mgmt.Owner{UID: 1000, GID: 1000}}); err != nil {
		t.Fatal(err)
	}
	if err := p.Define(bob, &mgmt.DefineVM{Name: "web", VMX: testVMX}); code(err) != abi.CodePermission {
		t.Fatalf("bob redefines alice's VM: %v, want %s", err, abi.CodePermission)
	}
	in, err := p.Serve(alice, abi.OpGetVM, &mgmt.VMRef{Name: "web"})
	if info := in.(mgmt.VMInfo); err != nil || info.Power != "poweredOn" || info.Owner.UID != 1000 || info.Host != "hostA" {
		t.Fatalf("get: %+v %v", in, err)
	}
	if _, _, err := p.AttachConfig(bob, "web"); code(err) != abi.CodePermission {
		t.Fatalf("bob attaches alice's VM: %v", err)
	}
	if cfg, managed, err := p.AttachConfig(alice, "web"); err != nil || managed || cfg == nil {
		t.Fatalf("alice attaches her VM: %v %v %v", cfg, managed, err)
	}
	if _, owner, ok := p.LocalVM("web"); !ok || owner.UID != 1000 {
		t.Fatalf("LocalVM: %+v %v", owner, ok)
	}

	off := &mgmt.ConnectAdapter{VM: "web", Adapter: "vrdma0", Connected: false}
	if _, err := p.Serve(alice, abi.OpConnectVM, off); code(err) != abi.CodeState {
		t.Fatalf("disconnect an adapter of a VM with no workload: %v, want %s", err, abi.CodeState)
	}
	att["web"] = &fakeVM{name: "web"}
	if err := p.Undefine(alice, "web"); code(err) != abi.CodeState {
		t.Fatalf("undefine an attached VM: %v, want %s", err, abi.CodeState)
	}
	if _, err := p.Serve(bob, abi.OpConnectVM, off); code(err) != abi.CodePermission {
		t.Fatalf("bob disconnects alice's adapter: %v, want %s", err, abi.CodePermission)
	}
	for i, want := range []bool{true, false} {
		rep, err := p.Serve(alice, abi.OpConnectVM, off)
		if r, _ := rep.(mgmt.ConnectReply); err != nil || r.Changed != want || r.Connected || r.Adapter != "vrdma0" {
			t.Fatalf("disconnect %d: %+v %v, want changed %v", i+1, rep, err, want)
		}
	}
	if !att["web"].down["vrdma0"] {
		t.Fatal("the disconnect did not reach the VM")
	}
	rep, err := p.Serve(alice, abi.OpPowerOffVM, &mgmt.VMRef{Name: "web"})
	if err != nil || !rep.(mgmt.PowerReply).Detached || len(att["web"].kicked) != 1 {
		t.Fatalf("power off: %+v %v; detaches %v", rep, err, att["web"].kicked)
	}
	if p.LocalPower("web") != "poweredOff" {
		t.Fatalf("power after power-off: %q", p.LocalPower("web"))
	}
	if _, _, err := p.AttachConfig(alice, "web"); code(err) != abi.CodeState {
		t.Fatalf("attach a powered-off VM: %v", err)
	}
	delete(att, "web")
	if err := p.Undefine(alice, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Serve(alice, abi.OpGetVM, &mgmt.VMRef{Name: "web"}); code(err) != abi.CodeNotFound {
		t.Fatalf("get after undefine: %v", err)
	}
	if err := p.Define(&Caller{Ctx: ctx}, &mgmt.DefineVM{Name: "x", VMX: testVMX}); code(err) != abi.CodePermission {
		t.Fatalf("define without credentials: %v", err)
	}
}

// TestEditDryRun checks that a dry-run edit answers what the save would,
// with the VM as it would be, and stores nothing; that it is refused as
// the save is (another user's VM, a powered-on VM, a rule broken).
func TestEditDryRun(t *testing.T) {
	p := standalone(t, fakeAttached{})
	ctx := context.Background()
	alice := &Caller{Cred: true, UID: 1000, GID: 1000, PID: 7, Ctx: ctx}
	bob := &Caller{Cred: true, UID: 1001, GID: 1001, PID: 8, Ctx: ctx}
	if err := p.Define(alice, &mgmt.DefineVM{Name: "web", VMX: testVMX}); err != nil {
		t.Fatal(err)
	}
	set := &mgmt.EditVM{Name: "web", Set: []mgmt.KeyValue{{Key: "vrdma.asyncMode", Value: "TRUE"}}, DryRun: true}
	if _, err := p.EditVM(alice, set); code(err) != abi.CodeState {
		t.Fatalf("dry run on a powered-on VM: %v, want %s", err, abi.CodeState)
	}
	if _, err := p.Serve(alice, abi.OpPowerOffVM, &mgmt.VMRef{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.EditVM(bob, set); code(err) != abi.CodePermission {
		t.Fatalf("bob's dry run on alice's VM: %v, want %s", err, abi.CodePermission)
	}
	r, err := p.EditVM(alice, set)
	if err != nil || r.Refused || r.VM.VMX != testVMX+"vrdma.asyncMode = \"TRUE\"\n" {
		t.Fatalf("dry run: %+v %v", r, err)
	}
	bad := &mgmt.EditVM{Name: "web", Set: []mgmt.KeyValue{{Key: "virtualHW.version", Value: "10"}}, DryRun: true}
	if r, err := p.EditVM(alice, bad); err != nil || !r.Refused || len(r.Findings) == 0 || r.VM.VMX != testVMX {
		t.Fatalf("dry run breaking a rule: %+v %v, want refused with the VM unchanged", r, err)
	}
	in, err := p.Serve(alice, abi.OpGetVM, &mgmt.VMRef{Name: "web"})
	if err != nil || in.(mgmt.VMInfo).VMX != testVMX {
		t.Fatalf("after dry runs the VMX is %q (%v), want it unchanged", in.(mgmt.VMInfo).VMX, err)
	}
}
