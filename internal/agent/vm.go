package agent

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/manage"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// VM is an attached VM: its guest memory, adapters and verbs objects.
type VM struct {
	a       *Agent
	name    string
	cfg     *vmconfig.Config
	async   bool
	poller  *asyncPoller // async mode: watches idle QPs (asyncpoll.go); nil in doorbell mode
	owner   *session
	managed bool // a managed VM of the control plane (manage.go)
	memSize uint64
	memFD   sys.FD

	// memMu orders unmapping against use: see the package comment.
	memMu sync.RWMutex
	mem   *sys.Mapping  // +checklocks:memMu (for Unmap)
	dead  bool          // +checklocks:memMu
	dying atomic.Bool   // set first in teardown, read by waiters that must give up
	ready atomic.Bool   // set once memory and adapters exist; until then others ignore the VM
	gone  chan struct{} // closed when teardown has released the name

	adapters []*Adapter

	// mrs is the key table: mrs[key>>8] holds the region whose key is key.
	// Lookups are lock-free; writes happen under objMu.
	mrs []atomic.Pointer[MR]

	objMu      sync.Mutex
	pds        map[uint32]*PD // +checklocks:objMu
	mrHandles  map[uint32]*MR // +checklocks:objMu
	cqs        map[uint32]*CQ // +checklocks:objMu
	qps        map[uint32]*QP // +checklocks:objMu
	nextHandle uint32         // +checklocks:objMu
	mrGen      uint8          // +checklocks:objMu
}

// How long an attach waits for a VM's previous workload: closeGrace for
// its session to notice the close, manage.DetachWait for the teardown.
const closeGrace = 200 * time.Millisecond

// Name, Managed, Running, PID, Kick and Detach make v a manage.VM.

// Name returns the VM's name.
func (v *VM) Name() string { return v.name }

// Managed reports whether v is a managed VM of the control plane.
func (v *VM) Managed() bool { return v.managed }

// Running reports whether v is set up and not being torn down.
func (v *VM) Running() bool { return v.ready.Load() && !v.dying.Load() }

// PID returns v's workload's process ID.
func (v *VM) PID() int32 { return v.owner.pid }

// Kick detaches v's workload, as if it had gone away: it closes the
// workload's session, which then ends and tears the VM down (its peers'
// QPs flush).
func (v *VM) Kick(why string) {
	v.a.log.Info("detaching VM", "vm", v.name, "pid", v.owner.pid, "why", why)
	v.owner.conn.Close()
}

// Detach kicks v and waits for the teardown, at most manage.DetachWait.
func (v *VM) Detach(why string) bool {
	v.Kick(why)
	select {
	case <-v.gone:
		return true
	case <-time.After(manage.DetachWait):
		return false
	}
}

// Adapter is one vrdmaN Adapter of a VM.
type Adapter struct {
	vm    *VM
	name  string
	index int
	mac   net.HardwareAddr
	gid   abi.GID
}

func (ad *Adapter) info() abi.AdapterInfo {
	return abi.AdapterInfo{Name: ad.name, Index: ad.index, MAC: ad.mac.String(), GID: ad.gid}
}

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

// attachVM creates the runtime VM for a session: guest memory (a memfd of
// memSize, locked when all guest memory is reserved) and the adapters.
func (a *Agent) attachVM(s *session, name string) (*VM, error) {
	cfg, managed, err := a.proc.AttachConfig(s.caller(), name) // owner, power, placement
	if err != nil {
		return nil, err
	}
	if len(cfg.Adapters) == 0 {
		return nil, abi.Errorf(abi.CodeInvalid, "vmx", "VM %q has no PVRDMA adapter: add ethernetN.virtualDev = \"vrdma\"", name)
	}
	// A workload that closed its VM a moment ago may still be detaching
	// (its session has seen the close, or is about to): wait for that,
	// briefly, rather than refuse an immediate reopen.
	start := time.Now()
	for {
		a.mu.Lock()
		old, ok := a.vms[name]
		if !ok {
			break // a.mu stays held: reserve the name below
		}
		a.mu.Unlock()
		if old.owner.ctx.Err() != nil {
			select {
			case <-old.gone:
			case <-time.After(manage.DetachWait):
				return nil, abi.Errorf(abi.CodeState, "vm", "VM %q is still detaching from its previous workload after %v: try again", name, manage.DetachWait)
			}
			continue
		}
		if time.Since(start) > closeGrace {
			return nil, abi.Errorf(abi.CodeExists, "vm", "VM %q is already attached by another workload (pid %d): one workload per VM", name, old.owner.pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	v := &VM{a: a, name: name, cfg: cfg, async: cfg.AsyncMode, owner: s, managed: managed, gone: make(chan struct{}),
		pds: map[uint32]*PD{}, mrHandles: map[uint32]*MR{}, cqs: map[uint32]*CQ{}, qps: map[uint32]*QP{},
		mrs: make([]atomic.Pointer[MR], a.cfg.Limits.MaxMR+1)}
	a.vms[name] = v // reserve the name while memory is set up
	a.mu.Unlock()

	// A power-off that ran since the check above found no VM to detach:
	// check again now that the name is taken (manage.go).
	_, _, err = a.proc.AttachConfig(s.caller(), name)
	if err == nil {
		err = v.setupMemory()
	}
	if err != nil {
		a.mu.Lock()
		delete(a.vms, name)
		a.mu.Unlock()
		close(v.gone)
		return nil, err
	}
	for _, c := range cfg.Adapters {
		mac := c.MAC
		if len(mac) != 6 {
			mac = generatedMAC(a.hostID, name, c.Index)
		}
		v.adapters = append(v.adapters, &Adapter{vm: v, name: c.Name(), index: c.Index, mac: mac, gid: gidFromMAC(mac)})
	}
	if v.async {
		v.poller = newAsyncPoller()
	}
	a.publishVM(v, s.uid) // control.go
	v.ready.Store(true)
	if v.managed && a.ctl != nil {
		// A power-off or a move that came after the checks above, and
		// whose change the watch delivered before v was ready, found
		// nothing to detach: look once more.
		a.proc.Reconcile(v)
	}
	return v, nil
}

func (v *VM) setupMemory() error {
	v.memSize = uint64(v.cfg.MemSizeMB) << 20
	fd, err := sys.Memfd("vrdma-guest-"+v.name, int64(v.memSize))
	if err != nil {
		return abi.Errorf(abi.CodeInternal, "", "VM %q guest memory: %v", v.name, err)
	}
	locked := v.cfg.MemoryLocked()
	m, err := sys.Map(fd.Int(), int(v.memSize), locked)
	if err != nil {
		fd.Close()
		return abi.Errorf(abi.CodeInternal, "", "VM %q guest memory: %v", v.name, err)
	}
	if locked {
		if err := m.Lock(); err != nil {
			m.Unmap()
			fd.Close()
			return abi.Errorf(abi.CodeLimit, "memSize",
				"VM %q reserves and locks all %d MiB of guest memory (sched.mem.pin = \"TRUE\", sched.mem.min >= memSize), but the lock failed: %v; or lower memSize, or drop sched.mem.pin to run unlocked",
				v.name, v.cfg.MemSizeMB, err)
		}
	}
	v.memFD, v.mem = fd, m
	return nil
}

// generatedMAC derives a stable MAC in VMware's generated range (00:0c:29)
// from the host, VM and adapter.
func generatedMAC(hostID, vmName string, index int) net.HardwareAddr {
	h := sha256.Sum256(fmt.Appendf(nil, "%s/%s/%d", hostID, vmName, index))
	return net.HardwareAddr{0x00, 0x0c, 0x29, h[0], h[1], h[2]}
}

// gidFromMAC returns the link-local GID (GID index 0 of a RoCE port) whose
// interface ID is the MAC's modified EUI-64.
func gidFromMAC(mac net.HardwareAddr) abi.GID {
	var g abi.GID
	g[0], g[1] = 0xfe, 0x80
	g[8], g[9], g[10] = mac[0]^0x02, mac[1], mac[2]
	g[11], g[12] = 0xff, 0xfe
	g[13], g[14], g[15] = mac[3], mac[4], mac[5]
	return g
}

func (v *VM) Adapter(name string) (*Adapter, error) {
	for _, ad := range v.adapters {
		if ad.name == name {
			return ad, nil
		}
	}
	names := make([]string, len(v.adapters))
	for i, ad := range v.adapters {
		names[i] = ad.name
	}
	return nil, abi.Errorf(abi.CodeNotFound, "adapter", "VM %q has no adapter %q (it has %v)", v.name, name, names)
}

// lookupMR returns the region with key, or nil. Lock-free: data path.
func (v *VM) lookupMR(key uint32) *MR {
	idx := key >> 8
	if idx == 0 || int(idx) >= len(v.mrs) {
		return nil
	}
	m := v.mrs[idx].Load()
	if m == nil || m.key != key {
		return nil
	}
	return m
}

// resolve checks that [addr, addr+n) lies in region key of protection
// domain pd with the access flags need, and returns that guest memory.
// Zero-length ranges need no key. The caller keeps v's memory alive.
func (v *VM) resolve(pd *PD, key uint32, addr, n uint64, need abi.Access) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	m := v.lookupMR(key)
	if m == nil || m.pd != pd || m.access&need != need {
		return nil, false
	}
	if addr < m.addr || !sys.InBounds(addr-m.addr, n, m.length) {
		return nil, false
	}
	return v.mem.Bytes()[addr : addr+n], true
}

func (v *VM) allocHandleLocked() uint32 {
	v.nextHandle++
	return v.nextHandle
}

// Status returns the VM's Status report.
func (v *VM) Status() mgmt.VMStatus {
	st := mgmt.VMStatus{Name: v.name, Attached: true, Power: string(records.PoweredOn), AsyncMode: v.async, MemSize: v.memSize, MemLocked: v.mem.Locked()}
	for _, ad := range v.adapters {
		st.Adapters = append(st.Adapters, ad.info())
	}
	v.objMu.Lock()
	for _, q := range v.qps {
		st.QPs = append(st.QPs, q.statusReport())
	}
	v.objMu.Unlock()
	sort.Slice(st.QPs, func(i, j int) bool { return st.QPs[i].QPN < st.QPs[j].QPN })
	return st
}

// findAdapterByGID returns the adapter of an attached VM with gid, or nil.
func (a *Agent) findAdapterByGIDLocked(gid abi.GID) *Adapter {
	for _, v := range a.vms {
		if !v.ready.Load() {
			continue
		}
		for _, ad := range v.adapters {
			if ad.gid == gid {
				return ad
			}
		}
	}
	return nil
}

// teardown destroys everything a VM holds, after its workload is gone:
// its QPs (peers' QPs move to ERR and flush), listeners, CQs, MRs, PDs and
// finally its mappings.
func (v *VM) teardown() {
	a := v.a
	v.dying.Store(true)
	v.objMu.Lock()
	qps := make([]*QP, 0, len(v.qps))
	for _, q := range v.qps {
		qps = append(qps, q)
	}
	v.objMu.Unlock()

	a.mu.Lock()
	for k, l := range a.listeners {
		if l.ad.vm == v {
			l.close()
			delete(a.listeners, k)
		}
	}
	// Peers: QPs elsewhere whose remote end is one of ours. remoteIsVM
	// takes o.mu, which is taken before a.mu elsewhere (peerQP, modify):
	// look only after a.mu is released.
	var others []*QP
	for _, o := range a.qps {
		if o.vm != v {
			others = append(others, o)
		}
	}
	a.mu.Unlock()
	for _, o := range others {
		if !o.remoteIsVM(v) {
			continue
		}
		// o's VM may be tearing down at the same time and unmapping o's
		// rings: touch them only under its memMu, while o lives.
		o.vm.memMu.RLock()
		if !o.vm.dead && !o.destroyed.Load() {
			o.MoveToErr("peer VM " + v.name + " went away")
		}
		o.vm.memMu.RUnlock()
	}
	for _, q := range qps {
		v.DestroyQP(q)
	}
	if v.poller != nil {
		v.poller.close()
	}

	v.memMu.Lock()
	v.dead = true
	v.objMu.Lock()
	for _, c := range v.cqs {
		c.release()
	}
	v.cqs, v.mrHandles, v.pds = nil, nil, nil
	v.objMu.Unlock()
	v.mem.Unmap()
	v.memFD.Close()
	v.memMu.Unlock()

	a.unpublishVM(v) // control.go; while the name is still taken, so a new attach publishes after
	a.mu.Lock()
	if a.vms[v.name] == v {
		delete(a.vms, v.name)
	}
	a.mu.Unlock()
	close(v.gone)
	a.log.Info("VM detached", "vm", v.name)
}
