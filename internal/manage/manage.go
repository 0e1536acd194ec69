// SPDX-License-Identifier: Apache-2.0

// Package manage holds the agent's VM procedures, power state, placement
// and access (docs/control-plane.md): the agent's side of vrdmactl vm create, show, edit, set,
// reserve-memory, power-on, power-off, define and undefine.
//
// Where a VM lives:
//
//   - A VM defined on this agent (vrdmactl vm define), and every VM of a
//     standalone agent, lives in the state directory: vms/NAME.vmx is its
//     VMX, byte for byte, and vms/NAME.state its power state, owner and
//     inventory placement (JSON). It runs on this host only. "vm define"
//     means defined and powered on here, as before the procedures
//     existed, so that a workload attaches at once (the quickstart,
//     testenv); a .vmx without a .state file (written by an older agent)
//     is powered on and owned by the file's owner. Its records.VM in the
//     control plane is published while a workload is attached, as before.
//   - With a control plane, vm create makes a managed VM: its records.VM
//     (Managed) in etcd holds its VMX, power state, the host it is
//     registered on and its placement; every change is a
//     compare-and-swap (store.Update). Power-on places it on a host; that
//     host's agent attaches its workload. An agent with managed VMs
//     attached watches their records (reconcile) and detaches a workload
//     whose VM was powered off, moved or deleted, from whichever host the
//     power-off came: the same teardown as a workload that goes away, so
//     its peers' QPs flush.
//
// Names are global: the state directory is looked at first, then the
// control plane; vm define refuses the name of a managed VM or of a VM
// running on another host that is up, and vm create any name known
// (docs/control-plane.md).
//
// Access: a workload attaches only to a powered-on VM placed on this
// host, and only if SO_PEERCRED says it runs as the VM's owner uid, as
// root or the agent's own user, or with the owner's gid as primary group
// when the owner granted its group (vrdma.groupAttach = "TRUE").
// Changing a VM (define over it, edit, power on or off, undefine) takes
// its owner uid, root or the agent's user.
//
// Quotas (package quota): a VM that reserves and locks its guest memory
// must be owned by root, the agent's user or a uid the administrator
// listed (--pin-allowed-uids); a uid owns at most Limits.VMsPerUser VMs
// here and in the control plane together; and its writes of managed VM
// records are bounded per hour (Ledger.TakeWrite).
package manage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"log/slog"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/rules"
	"github.com/vrdma/vrdma/internal/vmconfig"
	"github.com/vrdma/vrdma/internal/vmx"
)

// DetachWait bounds how long a procedure waits for a detached workload's
// teardown.
const DetachWait = 10 * time.Second

// Procedures serve the VM commands of one agent. Its methods are safe for
// concurrent use.
type Procedures struct {
	stateDir string // the agent's state directory: vms/NAME.vmx, vms/NAME.state
	host     string // this host's name
	hostID   string // this host's ID
	log      *slog.Logger
	ctl      *Control // nil: standalone
	vms      Attached

	quota *quota.Ledger

	mu    sync.Mutex // serialises changes to the VMs of the state directory
	watch sync.Once  // starts reconcile, at the first attach of a managed VM
}

// Config is what the procedures need from their agent.
type Config struct {
	StateDir string
	Host     string // this host's name
	HostID   string
	Logger   *slog.Logger
	// Control is the control plane; nil runs standalone, with the state
	// directory's VMs only.
	Control *Control
	// VMs are the agent's attached VMs.
	VMs Attached
	// Quota is the agent's ledger: who may pin memory, how many VMs a
	// uid may own and write; nil enforces none of them.
	Quota *quota.Ledger
}

// Control is the agent's control plane as the procedures use it.
type Control struct {
	Store         *store.Store
	Cache         *member.Cache
	LookupTimeout time.Duration
	// Stop ends the reconcile goroutine; WG waits for it.
	Stop <-chan struct{}
	WG   *sync.WaitGroup
}

// Attached are the VMs a workload has attached on this host.
type Attached interface {
	// Attached returns VM name if it is attached.
	Attached(name string) (VM, bool)
	// AttachedVMs returns every attached VM.
	AttachedVMs() []VM
}

// VM is an attached VM.
type VM interface {
	Name() string
	// Managed reports whether it is a managed VM of the control plane.
	Managed() bool
	// Running reports whether it is set up and not being torn down.
	Running() bool
	// PID is its workload's process.
	PID() int32
	// Kick detaches its workload, as if it had gone away (its peers'
	// QPs flush).
	Kick(why string)
	// Detach kicks it and waits for the teardown, at most DetachWait;
	// false if it did not end in time.
	Detach(why string) bool
	// SetConnected connects or disconnects its adapter vrdmaN, for all
	// its processes; changed is false when it was so already, told the
	// processes told.
	SetConnected(adapter string, connected bool) (changed bool, told int, err error)
}

// Caller is the client a command comes from: its credentials
// (SO_PEERCRED; Cred false when they could not be read) and the context
// that ends with its connection.
type Caller struct {
	Cred     bool
	UID, GID uint32
	PID      int32
	Ctx      context.Context
}

// New returns the procedures of an agent.
func New(c Config) *Procedures {
	return &Procedures{stateDir: c.StateDir, host: c.Host, hostID: c.HostID, log: c.Logger, ctl: c.Control, vms: c.VMs, quota: c.Quota}
}

// localState is a state-directory VM's vms/NAME.state.
type localState struct {
	Power records.PowerState `json:"power"`
	Owner records.Owner      `json:"owner"`
	// PinAllowed says an administrator allowed the VM to reserve and
	// lock its guest memory (records.VM.PinAllowed).
	PinAllowed bool `json:"pinAllowed,omitempty"`
	records.Inventory
}

// vmEntry is a VM as the procedures see it, wherever it lives.
type vmEntry struct {
	name     string
	vmx      string
	power    records.PowerState
	owner    records.Owner
	host     string // ID of the host it runs or is registered on
	inv      records.Inventory
	managed  bool
	adapters int  // adapters published in the control plane (managed VMs)
	pinOK    bool // an administrator allowed it to pin its memory (checkPin)
}

func entryOf(r records.VM) *vmEntry {
	return &vmEntry{name: r.Name, vmx: r.VMX, power: r.Power, owner: r.Owner, host: r.Host, inv: r.Inventory, managed: true, adapters: len(r.Adapters), pinOK: r.PinAllowed}
}

// into writes e's fields into managed record r.
func (e *vmEntry) into(r *records.VM) {
	r.VMX, r.Power, r.Owner, r.Host, r.Inventory, r.PinAllowed = e.vmx, e.power, e.owner, e.host, e.inv, e.pinOK
}

// privileged reports whether s runs as root or as the agent's own user.
func (s *Caller) privileged() bool {
	return s.Cred && (s.UID == 0 || s.UID == uint32(os.Geteuid()))
}

// mayAttach reports whether s may attach a VM owned by o; group says
// the owner granted its group (vrdma.groupAttach).
func (s *Caller) mayAttach(o records.Owner, group bool) bool {
	return s.Cred && (s.privileged() || o.MayAttach(s.UID, s.GID, group))
}

// mayChange reports whether s may change a VM owned by o.
func (s *Caller) mayChange(o records.Owner) bool {
	return s.Cred && (s.privileged() || o.MayChange(s.UID))
}

func (s *Caller) who() string {
	if !s.Cred {
		return "a process whose credentials the agent could not read (SO_PEERCRED failed)"
	}
	return fmt.Sprintf("uid %d gid %d (pid %d)", s.UID, s.GID, s.PID)
}

// checkChange refuses s a change to VM e unless s is its owner or root.
func (s *Caller) checkChange(e *vmEntry) error {
	if s.mayChange(e.owner) {
		return nil
	}
	return abi.Errorf(abi.CodePermission, "owner", "VM %q belongs to uid %d: only its owner or root may change it, and this request comes from %s",
		e.name, e.owner.UID, s.who())
}

// ownerFor returns the owner of a VM s creates or defines: o, which only a
// privileged caller may set to someone else, or s's own credentials.
func (s *Caller) ownerFor(o *mgmt.Owner) (records.Owner, error) {
	if !s.Cred {
		return records.Owner{}, abi.Errorf(abi.CodePermission, "owner", "the agent could not read this client's credentials (SO_PEERCRED), so it cannot own a VM")
	}
	if o == nil {
		return records.Owner{UID: s.UID, GID: s.GID}, nil
	}
	// The agent knows only a client's primary group (SO_PEERCRED), so
	// that is the only group a client may name without being root.
	if !s.privileged() && (o.UID != s.UID || o.GID != s.GID) {
		return records.Owner{}, abi.Errorf(abi.CodePermission, "owner", "only root may give a VM to uid %d gid %d; this request comes from %s", o.UID, o.GID, s.who())
	}
	return records.Owner{UID: o.UID, GID: o.GID}, nil
}

func (mg *Procedures) vmxPath(name string) string {
	return filepath.Join(mg.stateDir, "vms", name+".vmx")
}
func (mg *Procedures) statePath(name string) string {
	return filepath.Join(mg.stateDir, "vms", name+".state")
}

// readLocal reads VM name of the state directory; ok is false if there is
// none. The caller holds mg.mu when it goes on to change the VM.
func (mg *Procedures) readLocal(name string) (vmxText []byte, st localState, ok bool, err error) {
	p := mg.vmxPath(name)
	vmxText, err = os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, st, false, nil
	}
	if err != nil {
		return nil, st, false, abi.Errorf(abi.CodeInternal, "vm", "read VM %q: %v", name, err)
	}
	b, err := os.ReadFile(mg.statePath(name))
	switch {
	case errors.Is(err, os.ErrNotExist):
		// Defined by an agent older than the procedures: powered on,
		// owned by whoever owns the file (the agent's user).
		st.Power = records.PoweredOn
		if fi, err := os.Stat(p); err == nil {
			if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
				st.Owner = records.Owner{UID: sys.Uid, GID: sys.Gid}
			}
		}
	case err != nil:
		return nil, st, false, abi.Errorf(abi.CodeInternal, "vm", "read VM %q's state: %v", name, err)
	default:
		if err := json.Unmarshal(b, &st); err != nil || (st.Power != records.PoweredOn && st.Power != records.PoweredOff) {
			return nil, st, false, abi.Errorf(abi.CodeInternal, "vm", "VM %q: state file %s is not valid (%v, power %q): remove it (the VM is then powered on and owned by the .vmx file's owner) or undefine the VM",
				name, mg.statePath(name), err, st.Power)
		}
	}
	return vmxText, st, true, nil
}

// writeLocal stores VM name in the state directory: its VMX (unless nil)
// and its state, each replaced whole (write and rename).
func (mg *Procedures) writeLocal(name string, vmxText []byte, st localState) error {
	write := func(p string, b []byte) error {
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return abi.Errorf(abi.CodeInternal, "", "store VM %q: %v", name, err)
		}
		if err := os.Rename(tmp, p); err != nil {
			return abi.Errorf(abi.CodeInternal, "", "store VM %q: %v", name, err)
		}
		return nil
	}
	if vmxText != nil {
		if err := write(mg.vmxPath(name), vmxText); err != nil {
			return err
		}
	}
	b, _ := json.Marshal(st)
	return write(mg.statePath(name), append(b, '\n'))
}

func (mg *Procedures) localEntry(name string, vmxText []byte, st localState) *vmEntry {
	return &vmEntry{name: name, vmx: string(vmxText), power: st.Power, owner: st.Owner, host: mg.hostID, inv: st.Inventory, pinOK: st.PinAllowed}
}

// notDefined is the error for a VM this agent does not know.
func (mg *Procedures) notDefined(name string) error {
	where := ""
	if mg.ctl != nil {
		where = " nor in the control plane"
	}
	return abi.Errorf(abi.CodeNotFound, "name", "VM %q is not defined on host %s%s: create it (vrdmactl vm create %s) or define it (vrdmactl vm define %s FILE.vmx)",
		name, mg.host, where, name, name)
}

// hostLabel names host id for messages: its name and ID when known.
func (mg *Procedures) hostLabel(id string) string {
	if h, ok := mg.hostRecord(id); ok {
		return h.Label()
	}
	if id == "" {
		return "(none)"
	}
	return id
}

// hostName returns host id's name, or id when it is not known.
func (mg *Procedures) hostName(id string) string {
	if h, ok := mg.hostRecord(id); ok {
		return h.Name
	}
	return id
}

func (mg *Procedures) hostRecord(id string) (records.Host, bool) {
	switch {
	case id == "":
		return records.Host{}, false
	case id == mg.hostID:
		return records.Host{ID: id, Name: mg.host}, true
	case mg.ctl == nil:
		return records.Host{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	h, err := mg.ctl.Cache.Host(ctx, id)
	return h.Host, err == nil
}

// elsewhere is the error for a VM defined on another host's agent.
func (mg *Procedures) elsewhere(r records.VM) error {
	return abi.Errorf(abi.CodeNotFound, "name", "VM %q is defined on host %s (vrdmactl vm define there), not on this host (%s): manage it and run its workload there",
		r.Name, mg.hostLabel(r.Host), mg.host)
}

// ctlErr turns a control-plane error about VM name into an agent error;
// agent errors and refusals pass through.
func ctlErr(err error, name string) error {
	var ae *abi.Error
	var rf *refusal
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae), errors.As(err, &rf), errors.Is(err, errDryRun):
		return err
	case errors.Is(err, store.ErrNotFound):
		return abi.Errorf(abi.CodeNotFound, "name", "VM %q: %v", name, err)
	case errors.Is(err, store.ErrExists):
		return abi.Errorf(abi.CodeExists, "name", "VM %q: %v", name, err)
	case errors.Is(err, store.ErrUnavailable):
		return abi.Errorf(abi.CodeUnavailable, "", "VM %q: %v (try again when etcd is reachable)", name, err)
	case errors.Is(err, store.ErrConflict):
		return abi.Errorf(abi.CodeState, "", "VM %q: %v: try again", name, err)
	case errors.Is(err, records.ErrInvalid):
		return abi.Errorf(abi.CodeInvalid, "", "VM %q: %v", name, err)
	}
	return abi.Errorf(abi.CodeInternal, "", "VM %q: %v", name, err)
}

// refusal is a change the rules refused; the reply carries the findings.
type refusal struct{ findings []mgmt.Finding }

func (r *refusal) Error() string { return fmt.Sprintf("%d rules refused the change", len(r.findings)) }

// lookup returns VM name: from the state directory, else from the
// control plane (read from etcd, not the cache: a procedure acts on the
// latest).
func (mg *Procedures) lookup(ctx context.Context, name string) (*vmEntry, error) {
	mg.mu.Lock()
	b, st, ok, err := mg.readLocal(name)
	mg.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if ok {
		return mg.localEntry(name, b, st), nil
	}
	if mg.ctl == nil {
		return nil, mg.notDefined(name)
	}
	r, _, err := store.Get[records.VM](ctx, mg.ctl.Store, records.VMKey(name))
	if errors.Is(err, store.ErrNotFound) {
		return nil, mg.notDefined(name)
	}
	if err != nil {
		return nil, ctlErr(err, name)
	}
	if !r.Managed {
		return nil, mg.elsewhere(r)
	}
	return entryOf(r), nil
}

// update changes VM name with fn, a read-modify-write under the state
// directory's lock or a compare-and-swap on the control plane's record;
// fn may run more than once. It returns the VM as written. A write to the
// control plane is charged to s's uid (Ledger.TakeWrite).
func (mg *Procedures) update(ctx context.Context, s *Caller, name string, fn func(e *vmEntry) error) (*vmEntry, error) {
	mg.mu.Lock()
	b, st, ok, err := mg.readLocal(name)
	if err != nil || ok {
		defer mg.mu.Unlock()
		if err != nil {
			return nil, err
		}
		e := mg.localEntry(name, b, st)
		if err := fn(e); err != nil {
			return nil, err
		}
		var nb []byte
		if e.vmx != string(b) {
			nb = []byte(e.vmx)
		}
		if err := mg.writeLocal(name, nb, localState{Power: e.power, Owner: e.owner, Inventory: e.inv, PinAllowed: e.pinOK}); err != nil {
			return nil, err
		}
		return e, nil
	}
	mg.mu.Unlock()
	if mg.ctl == nil {
		return nil, mg.notDefined(name)
	}
	var out *vmEntry
	_, _, err = store.Update(ctx, mg.ctl.Store, records.VMKey(name), func(old *records.VM) (*records.VM, error) {
		if old == nil {
			return nil, mg.notDefined(name)
		}
		if !old.Managed {
			return nil, mg.elsewhere(*old)
		}
		e := entryOf(*old)
		if err := fn(e); err != nil {
			return nil, err
		}
		n := *old
		e.into(&n)
		if err := mg.quota.TakeWrite(s.UID, recordBytes(&n)); err != nil {
			return nil, err
		}
		out = e
		return &n, nil
	})
	if err != nil {
		return nil, ctlErr(err, name)
	}
	return out, nil
}

// attached returns VM name if a workload has it attached here.
func (mg *Procedures) attached(name string) VM {
	v, _ := mg.vms.Attached(name)
	return v
}

// info describes e.
func (mg *Procedures) info(e *vmEntry) mgmt.VMInfo {
	in := mgmt.VMInfo{Name: e.name, VMX: e.vmx, Power: string(e.power), HostID: e.host, Owner: mgmt.Owner{UID: e.owner.UID, GID: e.owner.GID},
		Managed: e.managed, Attached: mg.attached(e.name) != nil,
		Placement: mgmt.Placement{Datacenter: e.inv.Datacenter, Folder: e.inv.Folder, ResourcePool: e.inv.ResourcePool}}
	if e.host != "" {
		in.Host = mg.hostName(e.host)
	}
	return in
}

// The VM procedures other than define and undefine, one method per op of
// the table of operations (abi.Ops): the agent's handler of the op calls
// it (internal/agent/ops.go). Each runs within 2×DetachWait of s's
// context.

// CreateVM serves create-vm.
func (mg *Procedures) CreateVM(s *Caller, req *mgmt.CreateVM) (mgmt.VMInfo, error) {
	ctx, cancel := s.procCtx()
	defer cancel()
	return mg.createVM(ctx, s, req)
}

// GetVM serves get-vm.
func (mg *Procedures) GetVM(s *Caller, req *mgmt.VMRef) (mgmt.VMInfo, error) {
	ctx, cancel := s.procCtx()
	defer cancel()
	e, err := mg.lookup(ctx, req.Name)
	if err != nil {
		return mgmt.VMInfo{}, err
	}
	return mg.info(e), nil
}

// EditVM serves edit-vm.
func (mg *Procedures) EditVM(s *Caller, req *mgmt.EditVM) (mgmt.EditReply, error) {
	ctx, cancel := s.procCtx()
	defer cancel()
	return mg.editVM(ctx, s, req)
}

// PowerOn serves power-on-vm.
func (mg *Procedures) PowerOn(s *Caller, req *mgmt.PowerOnVM) (mgmt.PowerReply, error) {
	ctx, cancel := s.procCtx()
	defer cancel()
	return mg.powerOn(ctx, s, req)
}

// PowerOff serves power-off-vm.
func (mg *Procedures) PowerOff(s *Caller, req *mgmt.VMRef) (mgmt.PowerReply, error) {
	ctx, cancel := s.procCtx()
	defer cancel()
	return mg.powerOff(ctx, s, req.Name)
}

// ConnectAdapter serves connect-vm.
func (mg *Procedures) ConnectAdapter(s *Caller, req *mgmt.ConnectAdapter) (mgmt.ConnectReply, error) {
	ctx, cancel := s.procCtx()
	defer cancel()
	return mg.connect(ctx, s, req)
}

// procCtx is the context a procedure runs in.
func (s *Caller) procCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.Ctx, 2*DetachWait)
}

// Serve runs the procedure of op (one of the methods above) with req, the
// op's request body: for callers that hold an op and a decoded body, as
// the tests do. The agent calls the methods directly.
func (mg *Procedures) Serve(s *Caller, op abi.Op, req any) (any, error) {
	switch op {
	case abi.OpCreateVM:
		return mg.CreateVM(s, req.(*mgmt.CreateVM))
	case abi.OpGetVM:
		return mg.GetVM(s, req.(*mgmt.VMRef))
	case abi.OpEditVM:
		return mg.EditVM(s, req.(*mgmt.EditVM))
	case abi.OpPowerOnVM:
		return mg.PowerOn(s, req.(*mgmt.PowerOnVM))
	case abi.OpPowerOffVM:
		return mg.PowerOff(s, req.(*mgmt.VMRef))
	case abi.OpConnectVM:
		return mg.ConnectAdapter(s, req.(*mgmt.ConnectAdapter))
	}
	return nil, abi.Errorf(abi.CodeInvalid, "op", "op %s is not a VM procedure", op)
}

// ---- attach ----------------------------------------------------------------

// AttachConfig decides whether session s may attach VM name on this host
// and returns its configuration, and whether the VM is managed: the VM
// must be powered on, on this host, and s must run as its owner (uid or
// primary group) or root.
func (mg *Procedures) AttachConfig(s *Caller, name string) (*vmconfig.Config, bool, error) {
	mg.mu.Lock()
	b, st, ok, err := mg.readLocal(name)
	mg.mu.Unlock()
	if err != nil {
		return nil, false, err
	}
	var e *vmEntry
	switch {
	case ok:
		e = mg.localEntry(name, b, st)
	case mg.ctl == nil:
		return nil, false, abi.Errorf(abi.CodeNotFound, "vm", "VM %q is not defined on host %s: define it first (vrdmactl vm define %s FILE.vmx)", name, mg.host, name)
	default:
		ctx, cancel := context.WithTimeout(context.Background(), mg.ctl.LookupTimeout)
		defer cancel()
		r, err := mg.ctl.Cache.VM(ctx, name)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil, false, abi.Errorf(abi.CodeNotFound, "vm", "VM %q is not defined on host %s nor in the control plane: define it (vrdmactl vm define %s FILE.vmx) or create it (vrdmactl vm create %s)", name, mg.host, name, name)
		case err != nil:
			return nil, false, abi.Errorf(abi.CodeUnavailable, "vm", "VM %q is not defined on this host and cannot be read from the control plane: %v", name, err)
		case !r.Managed:
			return nil, false, abi.Errorf(abi.CodeNotFound, "vm", "VM %q is defined on host %s, not on this host (%s): run its workload there", name, mg.hostLabel(r.Host), mg.host)
		}
		e = entryOf(r)
		// The cache may lag behind a power-on or a power-off: what etcd
		// says decides, while it answers.
		if r, _, err := store.Get[records.VM](ctx, mg.ctl.Store, records.VMKey(name)); err == nil && r.Managed {
			e = entryOf(r)
		}
	}
	cfg, err := vmconfig.Parse([]byte(e.vmx))
	if err != nil {
		return nil, false, abi.Errorf(abi.CodeInvalid, "vmx", "VM %q: %v", name, err)
	}
	if !s.mayAttach(e.owner, cfg.GroupAttach) {
		group := "its owner has not granted its group gid %d (vrdma.groupAttach = \"TRUE\" in the VMX)"
		if cfg.GroupAttach {
			group = "or by processes whose primary group is gid %d"
		}
		return nil, false, abi.Errorf(abi.CodePermission, "vm", "VM %q may be attached only by its owner, uid %d, or by root (the owner rule); "+group+"; this workload runs as %s: run it as the owner, or have root give the VM to its user (vrdmactl vm define|create --owner UID:GID)",
			name, e.owner.UID, e.owner.GID, s.who())
	}
	if err := mg.checkPin(s, e, cfg); err != nil {
		return nil, false, err
	}
	if e.power != records.PoweredOn {
		return nil, false, abi.Errorf(abi.CodeState, "vm", "VM %q is powered off: power it on first (vrdmactl vm power-on %s)", name, name)
	}
	if e.host != mg.hostID {
		return nil, false, abi.Errorf(abi.CodeState, "vm", "VM %q is powered on on host %s, not on this host (%s): run its workload there, or power it off and on again with --host %s",
			name, mg.hostLabel(e.host), mg.host, mg.host)
	}
	if e.managed {
		mg.startReconcile()
	}
	return cfg, e.managed, nil
}

// startReconcile starts reconcile once, when a managed VM is attached.
// The control plane's stop and wait group own it.
func (mg *Procedures) startReconcile() {
	c := mg.ctl
	mg.watch.Do(func() {
		c.WG.Add(1)
		go func() {
			defer c.WG.Done()
			for {
				ch := c.Cache.Changed()
				mg.reconcile(c)
				select {
				case <-ch:
				case <-c.Stop:
					return
				}
			}
		}()
	})
}

// reconcile detaches every attached managed VM whose record no longer
// lets it run here: powered off, placed on another host, or deleted.
func (mg *Procedures) reconcile(c *Control) {
	for _, v := range mg.vms.AttachedVMs() {
		if !v.Managed() || !v.Running() {
			continue
		}
		mg.reconcileVM(c, v)
	}
}

// reconcileVM detaches managed VM v if its record no longer lets it run
// here.
func (mg *Procedures) reconcileVM(c *Control, v VM) {
	ctx, cancel := context.WithTimeout(context.Background(), c.LookupTimeout)
	r, err := c.Cache.VM(ctx, v.Name())
	if err != nil || r.Power != records.PoweredOn || r.Host != mg.hostID {
		// Confirm with etcd: the cache may lag behind the power-on
		// that let this VM attach.
		r, _, err = store.Get[records.VM](ctx, c.Store, records.VMKey(v.Name()))
	}
	cancel()
	why := ""
	switch {
	case errors.Is(err, store.ErrNotFound):
		why = "deleted from the inventory"
	case err != nil:
		return // out of reach: leave it running
	case r.Power != records.PoweredOn:
		why = "powered off"
	case r.Host != mg.hostID:
		why = "placed on host " + r.Host
	}
	if why != "" {
		v.Kick(why)
	}
}

// ---- define, undefine, create ----------------------------------------------

// Define stores VM d.Name in the state directory, powered on here.
func (mg *Procedures) Define(s *Caller, d *mgmt.DefineVM) error {
	cfg, err := vmconfig.Parse([]byte(d.VMX))
	if err != nil {
		return abi.Errorf(abi.CodeInvalid, "vmx", "VM %q: %v", d.Name, err)
	}
	owner, err := s.ownerFor(d.Owner)
	if err != nil {
		return err
	}
	if err := mg.defineNative(s.Ctx, d, cfg); err != nil {
		return err
	}
	if c := mg.ctl; c != nil {
		ctx, cancel := context.WithTimeout(s.Ctx, c.LookupTimeout)
		r, err := c.Cache.VM(ctx, d.Name)
		cancel()
		if err == nil && r.Managed {
			return abi.Errorf(abi.CodeExists, "name", "VM %q is a managed VM of the control plane (vm create): change it with vrdmactl vm edit/set, or delete it first (vrdmactl vm undefine %s)", d.Name, d.Name)
		}
		if err == nil && r.Host != "" && r.Host != mg.hostID {
			ctx, cancel := context.WithTimeout(s.Ctx, c.LookupTimeout)
			hs, herr := c.Cache.Host(ctx, r.Host)
			cancel()
			if herr == nil && hs.Alive != nil {
				return abi.Errorf(abi.CodeExists, "name", "VM %q runs on host %s: VM names are global in the control plane; define this one under another name", d.Name, hs.Host.Label())
			}
		}
	}
	mg.mu.Lock()
	defer mg.mu.Unlock()
	_, st, ok, err := mg.readLocal(d.Name)
	if err != nil {
		return err
	}
	if ok {
		if err := s.checkChange(mg.localEntry(d.Name, nil, st)); err != nil {
			return err
		}
		if d.Owner == nil {
			owner = st.Owner // redefining keeps the owner
		}
	} else if err := mg.checkVMCount(s.Ctx, s, owner.UID); err != nil {
		return err
	}
	e := &vmEntry{name: d.Name, owner: owner, pinOK: st.PinAllowed}
	if err := mg.checkPin(s, e, cfg); err != nil {
		return err
	}
	if mg.attached(d.Name) != nil {
		return abi.Errorf(abi.CodeState, "name", "VM %q is attached: detach its workload (power it off) before changing it", d.Name)
	}
	return mg.writeLocal(d.Name, []byte(d.VMX), localState{Power: records.PoweredOn, Owner: owner, Inventory: st.Inventory, PinAllowed: e.pinOK})
}

// defineNative refuses a definition whose adapters have native endpoints
// where this host cannot give them (rule host-native-endpoint): a VM
// defined here is powered on here.
func (mg *Procedures) defineNative(ctx context.Context, d *mgmt.DefineVM, cfg *vmconfig.Config) error {
	if !slices.ContainsFunc(cfg.Adapters, func(a vmconfig.Adapter) bool { return a.NativeEndpoint }) {
		return nil // the control plane is not asked: a define works through its outage
	}
	f, err := vmx.Parse([]byte(d.VMX))
	if err != nil {
		return abi.Errorf(abi.CodeInvalid, "vmx", "VM %q: %v", d.Name, err)
	}
	var host *records.Host
	if c := mg.ctl; c != nil {
		ctx, cancel := context.WithTimeout(ctx, c.LookupTimeout)
		h, err := c.Cache.Host(ctx, mg.hostID)
		cancel()
		if err != nil {
			return abi.Errorf(abi.CodeUnavailable, "vmx", "VM %q has native endpoints, and this host's record, which says whether it can give them, cannot be read: %v", d.Name, err)
		}
		host = &h.Host
	}
	for _, fd := range vmRules(f, host, mg.ctl == nil) {
		if fd.Rule == rules.RuleHostNativeEndpoint {
			return abi.Errorf(abi.CodeRefused, "vmx", "VM %q cannot be defined (powered on) on this host: [%s] %s", d.Name, fd.Rule, fd.Message)
		}
	}
	return nil
}

// Undefine removes VM name: from the state directory if it is there
// (it must not be attached), else a managed VM from the control plane
// (it must be powered off).
func (mg *Procedures) Undefine(s *Caller, name string) error {
	mg.mu.Lock()
	_, st, ok, err := mg.readLocal(name)
	if err != nil || ok {
		defer mg.mu.Unlock()
		if err != nil {
			return err
		}
		if err := s.checkChange(mg.localEntry(name, nil, st)); err != nil {
			return err
		}
		if mg.attached(name) != nil {
			return abi.Errorf(abi.CodeState, "name", "VM %q is attached: detach its workload first (vrdmactl vm power-off %s)", name, name)
		}
		if err := os.Remove(mg.vmxPath(name)); err != nil {
			return abi.Errorf(abi.CodeInternal, "", "%v", err)
		}
		os.Remove(mg.statePath(name))
		return nil
	}
	mg.mu.Unlock()
	if mg.ctl == nil {
		return abi.Errorf(abi.CodeNotFound, "name", "VM %q is not defined", name)
	}
	ctx, cancel := context.WithTimeout(s.Ctx, DetachWait)
	defer cancel()
	err = member.DeleteVM(ctx, mg.ctl.Store, name, func(r records.VM) error {
		if !r.Managed {
			return mg.elsewhere(r)
		}
		e := entryOf(r)
		if err := s.checkChange(e); err != nil {
			return err
		}
		if r.Power != records.PoweredOff {
			return abi.Errorf(abi.CodeState, "name", "VM %q is powered on (on host %s): power off the VM first (vrdmactl vm power-off %s)", name, mg.hostLabel(r.Host), name)
		}
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return abi.Errorf(abi.CodeNotFound, "name", "VM %q is not defined on host %s nor in the control plane", name, mg.host)
	}
	return ctlErr(err, name)
}

// resolveHost finds a host of the control plane by ID or name; "" is this
// agent's host. The record is read from etcd when it answers (a procedure
// must see a "host configure" that has just happened, which the cache may
// not have yet), from the cache otherwise; liveness comes from the cache.
func (mg *Procedures) resolveHost(ctx context.Context, ref string) (member.HostStatus, error) {
	c := mg.ctl
	if ref == "" {
		ref = mg.hostID
	}
	var all []records.Host
	if hs, _, _, err := store.List[records.Host](ctx, c.Store, records.HostPrefix); err == nil {
		for _, it := range hs {
			all = append(all, it.Value)
		}
	} else {
		for _, h := range c.Cache.Hosts() {
			all = append(all, h.Host)
		}
	}
	var found []records.Host
	for _, h := range all {
		if h.ID == ref {
			found = []records.Host{h}
			break
		}
		if h.Name == ref {
			found = append(found, h)
		}
	}
	switch len(found) {
	case 0:
		return member.HostStatus{}, abi.Errorf(abi.CodeNotFound, "host", "host %q is not in the control plane: name a host of vrdmactl host list (by name or ID)", ref)
	case 1:
		hs, err := c.Cache.Host(ctx, found[0].ID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return hs, abi.Errorf(abi.CodeUnavailable, "host", "host %q: %v", ref, err)
		}
		declared := found[0].State
		hs.Host, hs.Declared = found[0], declared
		if hs.Alive == nil {
			hs.Host.State = records.HostDown
		}
		return hs, nil
	}
	var ids []string
	for _, h := range found {
		ids = append(ids, h.ID)
	}
	return member.HostStatus{}, abi.Errorf(abi.CodeInvalid, "host", "host name %q is ambiguous: name one of the host IDs %s", ref, strings.Join(ids, ", "))
}

// isThisHost reports whether ref names this agent's host.
func (mg *Procedures) isThisHost(ref string) bool {
	return ref == "" || ref == mg.hostID || ref == mg.host
}

func (mg *Procedures) createVM(ctx context.Context, s *Caller, req *mgmt.CreateVM) (mgmt.VMInfo, error) {
	cfg, err := vmconfig.Parse([]byte(req.VMX))
	if err != nil {
		return mgmt.VMInfo{}, abi.Errorf(abi.CodeInvalid, "vmx", "VM %q: %v", req.Name, err)
	}
	owner, err := s.ownerFor(req.Owner)
	if err != nil {
		return mgmt.VMInfo{}, err
	}
	pe := &vmEntry{name: req.Name, owner: owner}
	if err := mg.checkPin(s, pe, cfg); err != nil {
		return mgmt.VMInfo{}, err
	}
	inv := records.Inventory{Datacenter: req.Datacenter, Folder: req.Folder, ResourcePool: req.ResourcePool}
	rec := records.VM{Name: req.Name, VMX: req.VMX, Owner: owner, Power: records.PoweredOff, Managed: true, Inventory: inv, PinAllowed: pe.pinOK}
	if err := rec.Validate(); err != nil {
		return mgmt.VMInfo{}, abi.Errorf(abi.CodeInvalid, "", "%v", err)
	}
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if _, _, ok, err := mg.readLocal(req.Name); err != nil {
		return mgmt.VMInfo{}, err
	} else if ok {
		return mgmt.VMInfo{}, abi.Errorf(abi.CodeExists, "name", "VM %q is already defined on host %s: pick another name, or change it with vrdmactl vm edit/set", req.Name, mg.host)
	}
	if err := mg.checkVMCount(ctx, s, owner.UID); err != nil {
		return mgmt.VMInfo{}, err
	}
	if mg.ctl == nil {
		if !mg.isThisHost(req.Host) {
			return mgmt.VMInfo{}, abi.Errorf(abi.CodeInvalid, "host", "this agent runs standalone (no control plane): its VMs live on host %s only, not %q", mg.host, req.Host)
		}
		if err := mg.writeLocal(req.Name, []byte(req.VMX), localState{Power: records.PoweredOff, Owner: owner, Inventory: inv, PinAllowed: pe.pinOK}); err != nil {
			return mgmt.VMInfo{}, err
		}
		return mg.info(mg.localEntry(req.Name, []byte(req.VMX), localState{Power: records.PoweredOff, Owner: owner, Inventory: inv, PinAllowed: pe.pinOK})), nil
	}
	h, err := mg.resolveHost(ctx, req.Host)
	if err != nil {
		return mgmt.VMInfo{}, err
	}
	if dc := h.Host.Datacenter; dc != "" && inv.Datacenter != "" && dc != inv.Datacenter {
		return mgmt.VMInfo{}, abi.Errorf(abi.CodeInvalid, "datacenter", "host %s is in datacenter %s, not %s: register the VM on a host of %s (--host)", h.Host.Label(), dc, inv.Datacenter, inv.Datacenter)
	}
	if rec.Datacenter == "" {
		rec.Datacenter = h.Host.Datacenter
	}
	rec.Host = h.Host.ID
	if err := mg.quota.TakeWrite(s.UID, recordBytes(&rec)); err != nil {
		return mgmt.VMInfo{}, err
	}
	if _, err := mg.ctl.Store.Create(ctx, records.VMKey(req.Name), rec); err != nil {
		if errors.Is(err, store.ErrExists) {
			return mgmt.VMInfo{}, abi.Errorf(abi.CodeExists, "name", "VM name %q is taken in the control plane (VM names are unique across hosts): pick another", req.Name)
		}
		return mgmt.VMInfo{}, ctlErr(err, req.Name)
	}
	return mg.info(entryOf(rec)), nil
}

// ---- edit -----------------------------------------------------------------

// poweredOnErr is the refusal of a change to a powered-on VM.
func (mg *Procedures) poweredOnErr(e *vmEntry) error {
	return abi.Errorf(abi.CodeState, "power", "VM %q is powered on (on host %s): power off the VM first (vrdmactl vm power-off %s)", e.name, mg.hostLabel(e.host), e.name)
}

func (mg *Procedures) editVM(ctx context.Context, s *Caller, req *mgmt.EditVM) (mgmt.EditReply, error) {
	// Port groups' switches are looked up before the change, outside
	// its compare-and-swap.
	adds := slices.Clone(req.AddAdapters)
	for i := range adds {
		if adds[i].Switch != "" {
			continue
		}
		sw, err := mg.portGroupSwitch(ctx, adds[i].PortGroup)
		if err != nil {
			return mgmt.EditReply{}, err
		}
		adds[i].Switch = sw
	}
	var after []mgmt.Finding
	var preview vmEntry // the VM as the edit leaves it, for a dry run
	e, err := mg.update(ctx, s, req.Name, func(e *vmEntry) error {
		if err := s.checkChange(e); err != nil {
			return err
		}
		if e.power != records.PoweredOff {
			if key, ok := nativeEndpointKey(req); ok {
				return abi.Errorf(abi.CodeState, "power", "VM %q is powered on (on host %s), and %s turns native endpoints on or off, "+
					"which changes the identifiers its adapter has on the fabric: power off the VM first (vrdmactl vm power-off %s)",
					e.name, mg.hostLabel(e.host), key, e.name)
			}
			return mg.poweredOnErr(e)
		}
		f, err := vmx.Parse([]byte(e.vmx))
		if err != nil {
			return abi.Errorf(abi.CodeInvalid, "vmx", "VM %q: %v", e.name, err)
		}
		before := vmRules(f, nil, false)
		touched, err := applyEdit(f, req, adds)
		if err != nil {
			return abi.Errorf(abi.CodeInvalid, "", "VM %q: %v", e.name, err)
		}
		cfg, err := vmconfig.FromFile(f)
		if err != nil {
			return abi.Errorf(abi.CodeInvalid, "vmx", "VM %q after the change: %v", e.name, err)
		}
		if err := mg.checkPin(s, e, cfg); err != nil {
			return err
		}
		after = vmRules(f, nil, false)
		if added := newErrors(before, after, touched); len(added) > 0 {
			return &refusal{findings: added}
		}
		e.vmx = string(f.Bytes())
		if req.DryRun {
			preview = *e
			return errDryRun
		}
		return nil
	})
	if errors.Is(err, errDryRun) {
		return mgmt.EditReply{VM: mg.info(&preview), Findings: nonNil(after)}, nil
	}
	var rf *refusal
	if errors.As(err, &rf) {
		cur, lerr := mg.lookup(ctx, req.Name)
		if lerr != nil {
			return mgmt.EditReply{}, lerr
		}
		return mgmt.EditReply{VM: mg.info(cur), Refused: true, Findings: rf.findings}, nil
	}
	if err != nil {
		return mgmt.EditReply{}, err
	}
	return mgmt.EditReply{VM: mg.info(e), Findings: nonNil(after)}, nil
}

// nativeEndpointKey returns the first vrdmaX.nativeEndpointSupport key
// that edit req sets or removes.
func nativeEndpointKey(req *mgmt.EditVM) (string, bool) {
	keys := slices.Clone(req.Unset)
	for _, kv := range req.Set {
		keys = append(keys, kv.Key)
	}
	for _, k := range keys {
		if _, _, ok := vmconfig.IndexedKey(k, "vrdma", ".nativeendpointsupport"); ok {
			return k, true
		}
	}
	return "", false
}

// errDryRun stops a dry-run edit's update before it stores anything.
var errDryRun = errors.New("dry run: nothing stored")

func nonNil(f []mgmt.Finding) []mgmt.Finding {
	if f == nil {
		return []mgmt.Finding{}
	}
	return f
}

// newErrors returns the errors of after that are about a key the edit
// touched (lower case) and that before did not have (by rule and key): an
// edit may not break a rule on what it changes. Errors elsewhere (the
// prerequisites that apply once a VM has its first adapter, say) are the
// procedure's next steps, not the edit's fault.
func newErrors(before, after []mgmt.Finding, touched map[string]bool) []mgmt.Finding {
	type rk struct{ rule, key string }
	had := map[rk]bool{}
	for _, f := range before {
		if f.Severity == "error" {
			had[rk{f.Rule, strings.ToLower(f.Key)}] = true
		}
	}
	var out []mgmt.Finding
	for _, f := range after {
		k := strings.ToLower(f.Key)
		if f.Severity == "error" && touched[k] && !had[rk{f.Rule, k}] {
			out = append(out, f)
		}
	}
	return out
}

// portGroupSwitch returns the switch ID of port group pg's switch, for
// ethernetN.dvs.switchId: the switch's UUID.
func (mg *Procedures) portGroupSwitch(ctx context.Context, pg string) (string, error) {
	if mg.ctl == nil {
		return "", abi.Errorf(abi.CodeInvalid, "switch", "this agent runs standalone: there is no control plane to find port group %s's switch in; name it (--switch)", pg)
	}
	p, err := mg.ctl.Cache.PortGroup(ctx, pg)
	if errors.Is(err, store.ErrNotFound) {
		return "", abi.Errorf(abi.CodeNotFound, "portgroup", "port group %s does not exist in the control plane: create it (vrdmactl portgroup create %s --switch SWITCH), or name an existing one (vrdmactl portgroup list)", pg, pg)
	}
	if err != nil {
		return "", abi.Errorf(abi.CodeUnavailable, "portgroup", "port group %s: %v", pg, err)
	}
	sw, err := mg.ctl.Cache.Switch(ctx, p.Switch)
	if err != nil {
		return "", abi.Errorf(abi.CodeNotFound, "switch", "port group %s is on switch %s, which cannot be read: %v", pg, p.Switch, err)
	}
	return sw.UUID, nil
}

// maxEthernet is the number of network adapters a VM may have
// (MAX_ETHERNET_CARDS): ethernet0 to ethernet9.
const maxEthernet = 10

// applyEdit applies req's changes to f, with adds' switches resolved, and
// returns the keys it set or removed, in lower case.
func applyEdit(f *vmx.File, req *mgmt.EditVM, adds []mgmt.NewAdapter) (map[string]bool, error) {
	touched := map[string]bool{}
	set := func(k, v string) error {
		touched[strings.ToLower(k)] = true
		return f.Set(k, v)
	}
	del := func(k string) {
		touched[strings.ToLower(k)] = true
		f.Delete(k)
	}
	keysOf := func(prefix string) []string {
		var ks []string
		for _, k := range f.Keys() {
			if strings.HasPrefix(strings.ToLower(k), prefix) {
				ks = append(ks, k)
			}
		}
		return ks
	}
	for _, n := range req.RemoveAdapters {
		if dev, _ := f.Get(fmt.Sprintf("ethernet%d.virtualDev", n)); !strings.EqualFold(dev, "vrdma") {
			return nil, fmt.Errorf("ethernet%d is not a PVRDMA adapter (no ethernet%d.virtualDev = \"vrdma\"): nothing to remove", n, n)
		}
		for _, k := range keysOf(fmt.Sprintf("ethernet%d.", n)) {
			del(k)
		}
		for _, k := range keysOf(fmt.Sprintf("vrdma%d.", n)) {
			del(k)
		}
	}
	for _, ad := range adds {
		n := -1
		for i := range maxEthernet {
			if len(keysOf(fmt.Sprintf("ethernet%d.", i))) == 0 {
				n = i
				break
			}
		}
		if n < 0 {
			return nil, fmt.Errorf("all %d network adapters (ethernet0 to ethernet%d) are in use: remove one first (--remove-adapter N)", maxEthernet, maxEthernet-1)
		}
		for _, kv := range [][2]string{
			{"present", "TRUE"}, {"virtualDev", "vrdma"}, {"addressType", "generated"},
			{"dvs.switchId", ad.Switch}, {"dvs.portgroupId", ad.PortGroup},
		} {
			if err := set(fmt.Sprintf("ethernet%d.%s", n, kv[0]), kv[1]); err != nil {
				return nil, err
			}
		}
	}
	for _, kv := range req.Set {
		if err := set(kv.Key, kv.Value); err != nil {
			return nil, err
		}
	}
	for _, k := range req.Unset {
		del(k)
	}
	if req.ReserveAllMemory {
		mem, ok := f.Get("memSize")
		if !ok {
			return nil, errors.New("memSize is not set: set it first (vrdmactl vm set NAME memSize=MB)")
		}
		if _, err := strconv.Atoi(strings.TrimSpace(mem)); err != nil {
			return nil, fmt.Errorf("memSize = %q is not a number of MB: fix it first", mem)
		}
		for _, k := range []string{"sched.mem.min", "sched.mem.minSize"} {
			if err := set(k, strings.TrimSpace(mem)); err != nil {
				return nil, err
			}
		}
		if err := set("sched.mem.pin", "TRUE"); err != nil {
			return nil, err
		}
	}
	return touched, nil
}

// ---- power ------------------------------------------------------------------

func (mg *Procedures) powerOn(ctx context.Context, s *Caller, req *mgmt.PowerOnVM) (mgmt.PowerReply, error) {
	e, err := mg.lookup(ctx, req.Name)
	if err != nil {
		return mgmt.PowerReply{}, err
	}
	if err := s.checkChange(e); err != nil {
		return mgmt.PowerReply{}, err
	}
	// The host to run on, and its record (none for a standalone agent).
	var host *records.Host
	target := mg.hostID
	switch {
	case !e.managed && !mg.isThisHost(req.Host):
		return mgmt.PowerReply{}, abi.Errorf(abi.CodeInvalid, "host", "VM %q lives on host %s (vm define, or a standalone agent): it powers on there only; to run a VM on any host, create it in the control plane (vrdmactl vm create)",
			e.name, mg.host)
	case mg.ctl != nil:
		ref := req.Host
		if ref == "" && e.managed {
			ref = e.host
		}
		h, err := mg.resolveHost(ctx, ref)
		if err != nil {
			return mgmt.PowerReply{}, err
		}
		host, target = &h.Host, h.Host.ID
	}
	if e.power == records.PoweredOn {
		if e.host != target {
			return mgmt.PowerReply{}, abi.Errorf(abi.CodeState, "power", "VM %q is powered on on host %s: power it off first (vrdmactl vm power-off %s)", e.name, mg.hostLabel(e.host), e.name)
		}
		f, err := vmx.Parse([]byte(e.vmx))
		if err != nil {
			return mgmt.PowerReply{}, abi.Errorf(abi.CodeInvalid, "vmx", "VM %q: %v", e.name, err)
		}
		return mgmt.PowerReply{VM: mg.info(e), Findings: nonNil(vmRules(f, host, mg.ctl == nil))}, nil
	}
	f, err := vmx.Parse([]byte(e.vmx))
	if err != nil {
		return mgmt.PowerReply{}, abi.Errorf(abi.CodeInvalid, "vmx", "VM %q: %v", e.name, err)
	}
	findings := append(vmRules(f, host, mg.ctl == nil), mg.placementChecks(ctx, e, f, host)...)
	for _, fd := range findings {
		if fd.Severity == "error" {
			return mgmt.PowerReply{VM: mg.info(e), Refused: true, Findings: findings}, nil
		}
	}
	read := e.vmx
	e, err = mg.update(ctx, s, req.Name, func(e *vmEntry) error {
		if err := s.checkChange(e); err != nil {
			return err
		}
		if e.power != records.PoweredOff || e.vmx != read {
			return abi.Errorf(abi.CodeState, "", "VM %q changed while it was checked for power-on: try again", e.name)
		}
		e.power, e.host = records.PoweredOn, target
		if e.inv.Datacenter == "" && host != nil {
			e.inv.Datacenter = host.Datacenter
		}
		return nil
	})
	if err != nil {
		return mgmt.PowerReply{}, err
	}
	mg.log.Info("VM powered on", "vm", e.name, "on_host", mg.hostLabel(target), "uid", s.UID)
	return mgmt.PowerReply{VM: mg.info(e), Changed: true, Findings: nonNil(findings)}, nil
}

// placementChecks are the power-on checks beyond the rules
// (member.PlacementFindings): the host is up and in the VM's datacenter,
// and every adapter's port group exists on its switch.
func (mg *Procedures) placementChecks(ctx context.Context, e *vmEntry, f *vmx.File, host *records.Host) []mgmt.Finding {
	if host == nil {
		return nil
	}
	return abiFindings(mg.ctl.Cache.PlacementFindings(ctx, f, *host, e.name, e.inv.Datacenter))
}

func (mg *Procedures) powerOff(ctx context.Context, s *Caller, name string) (mgmt.PowerReply, error) {
	changed := false
	// The workload attached now: the agent's reconcile, which sees the
	// record change too, may detach it before this call looks again.
	before := mg.attached(name)
	e, err := mg.update(ctx, s, name, func(e *vmEntry) error {
		if err := s.checkChange(e); err != nil {
			return err
		}
		changed = e.power != records.PoweredOff
		e.power = records.PoweredOff
		return nil
	})
	if err != nil {
		return mgmt.PowerReply{}, err
	}
	rep := mgmt.PowerReply{Changed: changed, Findings: []mgmt.Finding{}}
	v := mg.attached(name)
	if v == nil {
		v = before
	}
	if v != nil {
		if !v.Detach("powered off") {
			return mgmt.PowerReply{}, abi.Errorf(abi.CodeState, "", "VM %q is powered off, but its workload (pid %d) is still detaching after %v", name, v.PID(), DetachWait)
		}
		rep.Detached = true
	} else if e.managed && e.host != mg.hostID && e.adapters > 0 {
		// Attached on another host: its agent sees the record change
		// and detaches the workload (reconcile), which unpublishes it.
		deadline := time.Now().Add(DetachWait)
		for {
			r, _, err := store.Get[records.VM](ctx, mg.ctl.Store, records.VMKey(name))
			if err != nil || len(r.Adapters) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return mgmt.PowerReply{}, abi.Errorf(abi.CodeUnavailable, "", "VM %q is powered off, but host %s has not detached its workload after %v (is its agent running?): it will when it sees the change",
					name, mg.hostLabel(e.host), DetachWait)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rep.Detached = true
	}
	rep.VM = mg.info(e)
	if changed {
		mg.log.Info("VM powered off", "vm", name, "detached", rep.Detached, "uid", s.UID)
	}
	return rep, nil
}

// connect connects or disconnects an adapter of a VM whose workload runs
// on this host; its owner or root may.
func (mg *Procedures) connect(ctx context.Context, s *Caller, c *mgmt.ConnectAdapter) (mgmt.ConnectReply, error) {
	e, err := mg.lookup(ctx, c.VM)
	if err != nil {
		return mgmt.ConnectReply{}, err
	}
	if err := s.checkChange(e); err != nil {
		return mgmt.ConnectReply{}, err
	}
	v := mg.attached(c.VM)
	switch {
	case v == nil && e.managed && e.host != "" && e.host != mg.hostID:
		return mgmt.ConnectReply{}, abi.Errorf(abi.CodeUnavailable, "vm", "VM %q runs on host %s: connect its adapters through that host's agent (vrdmactl --socket)", c.VM, mg.hostLabel(e.host))
	case v == nil:
		return mgmt.ConnectReply{}, abi.Errorf(abi.CodeState, "vm", "VM %q has no running workload: an adapter is connected or not while the VM runs; "+
			"ethernetN.startConnected (vrdmactl vm set) decides it at the next attach", c.VM)
	}
	changed, told, err := v.SetConnected(c.Adapter, c.Connected)
	if err != nil {
		return mgmt.ConnectReply{}, err
	}
	if changed {
		mg.log.Info("adapter connected", "vm", c.VM, "adapter", c.Adapter, "connected", c.Connected, "workloads", told, "uid", s.UID)
	}
	return mgmt.ConnectReply{VM: c.VM, Adapter: c.Adapter, Connected: c.Connected, Changed: changed, Workloads: told}, nil
}

// ---- status -----------------------------------------------------------------

// LocalPower returns the power state of state-directory VM name.
func (mg *Procedures) LocalPower(name string) string {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if _, st, ok, err := mg.readLocal(name); err == nil && ok {
		return string(st.Power)
	}
	return ""
}

// ManagedHere returns the status of the managed VMs registered on this
// host that are not in seen (attached).
func (mg *Procedures) ManagedHere(seen map[string]bool) []mgmt.VMStatus {
	if mg.ctl == nil {
		return nil
	}
	var out []mgmt.VMStatus
	for _, r := range mg.ctl.Cache.VMs() {
		if !r.Managed || r.Host != mg.hostID || seen[r.Name] {
			continue
		}
		vs := mgmt.VMStatus{Name: r.Name, Power: string(r.Power)}
		if cfg, err := vmconfig.Parse([]byte(r.VMX)); err == nil {
			vs.AsyncMode, vs.MemSize, vs.MemReserved = cfg.AsyncMode, uint64(cfg.MemSizeMB)<<20, cfg.MemoryLocked()
			for _, c := range cfg.Adapters {
				vs.Adapters = append(vs.Adapters, abi.AdapterInfo{Name: c.Name(), Index: c.Index})
			}
		}
		out = append(out, vs)
	}
	return out
}

// MaySee reports whether s may see the objects (processes, QPs,
// counters) of VM name in a status report: s runs as root, as the agent's
// user, or as the VM's owner uid. A VM whose owner cannot be read is
// nobody's to see but the privileged.
func (mg *Procedures) MaySee(s *Caller, name string) bool {
	if s.privileged() {
		return true
	}
	if !s.Cred {
		return false
	}
	mg.mu.Lock()
	_, st, ok, err := mg.readLocal(name)
	mg.mu.Unlock()
	if err == nil && ok {
		return st.Owner.MayChange(s.UID)
	}
	if mg.ctl != nil {
		for _, r := range mg.ctl.Cache.VMs() {
			if r.Name == name {
				return r.Owner.MayChange(s.UID)
			}
		}
	}
	return false
}

// LocalVM returns VM name of the state directory: its VMX and owner; ok
// is false if the state directory has none.
func (mg *Procedures) LocalVM(name string) (vmxText []byte, owner records.Owner, ok bool) {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	b, st, ok, _ := mg.readLocal(name)
	return b, st.Owner, ok
}

// Reconcile detaches attached managed VM v if its record no longer lets it
// run here. The agent calls it once v is ready: a power-off or move whose
// change arrived before then found nothing to detach.
func (mg *Procedures) Reconcile(v VM) {
	if mg.ctl != nil {
		mg.reconcileVM(mg.ctl, v)
	}
}
