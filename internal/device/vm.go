// SPDX-License-Identifier: Apache-2.0

package device

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/vmconfig"
)

// Context is one workload process's context on an attached VM, as an
// ibv_context is a process's on a device: its mapping of the VM's guest
// memory, its adapters and its verbs objects. Several processes may
// attach to one VM (vmProcs: they share its memory budget and its ports'
// links); each has its own Context.
type Context struct {
	d       *Device
	name    string
	cfg     *vmconfig.Config
	async   bool
	owner   Owner
	managed bool     // a managed VM of the control plane (package manage)
	procs   *vmProcs // the VM's workloads, v among them
	joined  bool     // v joined a VM another workload had attached (Joined)
	memSize uint64
	pinned  uint64 // bytes charged to the host's pinned-memory budget (quota.Ledger)
	memFD   sys.FD

	// memMu orders unmapping against use: see the package comment.
	memMu sync.RWMutex
	mem   *sys.Mapping  // Unmap runs under memMu held for writing (see the package comment)
	dead  bool          // +checklocks:memMu
	dying atomic.Bool   // set first in teardown, read by waiters that must give up
	ready atomic.Bool   // set once memory and adapters exist; until then others ignore the VM
	gone  chan struct{} // closed when teardown has released the name

	adapters []*Adapter

	// mrs is the key table: mrs[keySlot(key)] holds the region whose key
	// is key (keys.go). Lookups are lock-free; writes happen under objMu.
	mrs     []atomic.Pointer[MR]
	keyBits uint // the low bits of a key that number its slot

	objMu     sync.Mutex
	pds       map[uint32]*PD         // +checklocks:objMu
	mrHandles map[uint32]*MR         // +checklocks:objMu
	cqs       map[uint32]*CQ         // +checklocks:objMu
	qps       map[uint32]*QP         // +checklocks:objMu
	srqs      map[uint32]*SRQ        // +checklocks:objMu
	xrcds     map[uint32]*xrcdHandle // +checklocks:objMu
	// XRC target QPs of other processes (or this one) this process
	// opened, by the open's handle; and this process's target QPs whose
	// handle it destroyed while others hold them open (xrc.go).
	openQPs map[uint32]*QPOpen // +checklocks:objMu
	orphans map[*QP]bool       // +checklocks:objMu
	ahs     map[uint32]*AH     // +checklocks:objMu
	// retiredAHs are destroyed address handles that WQEs posted before
	// their destroy may still name (ud.go), oldest first.
	retiredAHs []*AH    // +checklocks:objMu
	nextHandle uint32   // +checklocks:objMu
	mrKeys     keySlots // +checklocks:objMu
	// Memory windows (mw.go): the table of windows by slot, lock-free
	// for lookups as mrs, their handles, their slots, and how many
	// windows are bound to each region (by its handle).
	mws       []atomic.Pointer[MW]
	mwHandles map[uint32]*MW // +checklocks:objMu
	mwKeys    keySlots       // +checklocks:objMu
	mrWindows map[uint32]int // +checklocks:objMu

	// memcpy-direct (direct.go): whether the session's hello set the
	// capability, and its grant table (guarded by d.directMu).
	directCapable atomic.Bool
	direct        *directTable
	// direct-send (direct_send.go): whether the hello set that bit too.
	directSendCapable atomic.Bool
}

// Name, Managed, Running, PID, Kick and Detach make v a manage.VM.

// Name returns the VM's name.
func (v *Context) Name() string { return v.name }

// Managed reports whether v is a managed VM of the control plane.
func (v *Context) Managed() bool { return v.managed }

// Running reports whether v is set up and not being torn down.
func (v *Context) Running() bool { return v.ready.Load() && !v.dying.Load() }

// PID returns v's workload's process ID.
func (v *Context) PID() int32 { return v.owner.PID() }

// UID returns the user v's workload runs as.
func (v *Context) UID() uint32 { return v.owner.UID() }

// Kick detaches v's workload, as if it had gone away: it closes the
// workload's session, which then ends and tears the VM down (its peers'
// QPs flush).
func (v *Context) Kick(why string) {
	v.d.log.Info("detaching VM", "vm", v.name, "pid", v.owner.PID(), "why", why)
	v.owner.Close()
}

// Detach kicks v and waits for the teardown, at most Config.DetachWait.
func (v *Context) Detach(why string) bool {
	v.Kick(why)
	select {
	case <-v.gone:
		return true
	case <-time.After(v.d.cfg.DetachWait):
		return false
	}
}

// Adapter is one vrdmaN Adapter of a VM.
type Adapter struct {
	vm    *Context
	name  string
	index int
	mac   net.HardwareAddr
	gid   abi.GID
	// ip4 and ip6 are the adapter's addresses on its port group (invalid
	// when it has none); with ip4, gid is its IPv4-mapped form. Set at
	// attach, or by SetIPv4 before the VM is ready, and fixed after.
	ip4, ip6 netip.Addr

	activeMTU atomic.Uint32 // the port's active MTU; 0 until set: abi.DefaultPathMTU

	// link is the port's link, which every process of the VM shares
	// (vmProcs): vSphere's "Connected" state of the adapter.
	link *portLink

	// retired are the counters of the adapter's destroyed QPs; its
	// counters are these and its live QPs'. Guarded by vm.objMu.
	retired mgmt.QPCounters
}

// portLink is an adapter's link state: down while the adapter is
// disconnected (ethernetN.startConnected = FALSE at attach, vrdmactl vm
// disconnect). While it is down no request leaves the adapter's QPs and
// none reaches them, on every path: their requests go unanswered, and
// they retry and then fail with RETRY_EXC_ERR, as behind a pulled cable.
type portLink struct{ down atomic.Bool }

// Connected reports whether the adapter's port is up: the adapter is
// connected.
func (ad *Adapter) Connected() bool { return !ad.link.down.Load() }

// ActiveMTU is the port's active MTU: the RoCE MTU of the adapter's port
// group, which connection managers use as the path MTU (the smaller of
// the two ends').
func (ad *Adapter) ActiveMTU() uint32 {
	if m := ad.activeMTU.Load(); m != 0 {
		return m
	}
	return abi.DefaultPathMTU
}

// SetActiveMTU sets the port's active MTU, one of abi.ValidMTU's; other
// values are ignored.
func (ad *Adapter) SetActiveMTU(m uint32) {
	if abi.ValidMTU(m) {
		ad.activeMTU.Store(m)
	}
}

// Name is the adapter's name, "vrdmaN".
func (ad *Adapter) Name() string { return ad.name }

// Context is the process context the adapter belongs to.
func (ad *Adapter) Context() *Context { return ad.vm }

// GID is the adapter's GID (index 0 of its port).
func (ad *Adapter) GID() abi.GID { return ad.gid }

// Index is the adapter's index N (ethernetN).
func (ad *Adapter) Index() int { return ad.index }

// MAC is the adapter's MAC address.
func (ad *Adapter) MAC() net.HardwareAddr { return ad.mac }

// IPv4 is the adapter's IPv4 address on its port group; the zero Addr
// when it has none.
func (ad *Adapter) IPv4() netip.Addr { return ad.ip4 }

// IPv6 is the adapter's optional IPv6 address; the zero Addr when none.
func (ad *Adapter) IPv6() netip.Addr { return ad.ip6 }

// SetIPv4 gives the adapter IPv4 address ip (one the control plane
// assigned) and makes its GID the IPv4-mapped form, as on RoCE v2. Only
// before the VM is ready (SetReady): peers and QPs read the GID without a
// lock after that.
func (ad *Adapter) SetIPv4(ip netip.Addr) {
	if ad.vm.ready.Load() || !ip.Is4() {
		return
	}
	ad.ip4, ad.gid = ip, abi.GID(netip.AddrFrom4(ip.As4()).As16())
}

// ClearIPv4 takes back an address SetIPv4 gave (another adapter took it
// first): the GID is the MAC's link-local one again. Only before the VM
// is ready.
func (ad *Adapter) ClearIPv4() {
	if ad.vm.ready.Load() {
		return
	}
	ad.ip4, ad.gid = netip.Addr{}, gidFromMAC(ad.mac)
}

// Info describes the adapter.
func (ad *Adapter) Info() abi.AdapterInfo {
	in := abi.AdapterInfo{Name: ad.name, Index: ad.index, MAC: ad.mac.String(), GID: ad.gid}
	if ad.ip4.IsValid() {
		in.IPv4 = ad.ip4.String()
	}
	if ad.ip6.IsValid() {
		in.IPv6 = ad.ip6.String()
	}
	return in
}

// Owner is the workload that attached a VM: the agent's session with it.
type Owner interface {
	// PID is the workload's process ID.
	PID() int32
	// UID is the workload's user, charged for its rings and regions
	// (Config.Quota).
	UID() uint32
	// Close ends the workload's session; the session then tears the VM
	// down.
	Close()
	// Closed reports whether the session has ended or is ending.
	Closed() bool
	// PortChanged tells the workload that adapter ad's port went up
	// (active) or down: its contexts' IBV_EVENT_PORT_ACTIVE and
	// IBV_EVENT_PORT_ERR. It must not block.
	PortChanged(ad *Adapter, active bool)
}

// vmProcs are the workloads attached as one VM: each process has a VM of
// its own (guest memory, verbs objects, key table), the first attached
// first; the later ones join it, sharing its configuration, its adapters'
// identity (MAC, GID, addresses) and its record in the control plane, as
// processes share a device's ports. memMu orders the VM-wide charge of
// memory registrations (RegMR) against each other.
type vmProcs struct {
	list  []*Context // guarded by Device.mu
	memMu sync.Mutex
	use   vmUse // the VM-wide caps' charges (quota.go)
	// the XRC domains opened through a file, by the file (xrc.go)
	xrcds map[FileID]*XRCD // guarded by Device.mu
	// xmem is the memory of all the VM's processes at once, for an XRC
	// target QP's responder, which touches the memory of whichever
	// process owns the SRQ a request names (xrc.go): it holds xmem for
	// reading instead of one process's memMu. Whatever unmaps or changes
	// a process's memory holds xmem for writing too, after the process's
	// memMu (lockMem).
	xmem sync.RWMutex
}

// lockMem takes v's memory for writing: its memMu, then the VM's xmem,
// waiting out every responder that uses the memory (its own QPs' and the
// XRC target QPs' of every process of the VM).
//
// +checklocksacquire:v.memMu
// +checklocksacquire:v.procs.xmem
func (v *Context) lockMem() {
	v.memMu.Lock()
	v.procs.xmem.Lock()
}

// unlockMem ends lockMem.
//
// +checklocksrelease:v.memMu
// +checklocksrelease:v.procs.xmem
func (v *Context) unlockMem() {
	v.procs.xmem.Unlock()
	v.memMu.Unlock()
}

// Attach attaches workload o to VM name: a VM of its own with guest
// memory (a memfd of memSize, locked when all guest memory is reserved)
// and the adapters. When another live workload has the VM, o joins it
// (see vmProcs): at most Limits.MaxProcesses at once, and never a VM whose
// guest memory is reserved and locked. A VM whose previous workloads are
// all detaching is waited for, briefly. recheck runs once the attach is
// recorded and before memory is set up (the caller's access and power
// checks, again: a power-off may have come between). The VM is not ready,
// and no peer sees it, until SetReady.
func (d *Device) Attach(o Owner, name string, cfg *vmconfig.Config, managed bool, recheck func() error) (*Context, error) {
	if len(cfg.Adapters) == 0 {
		return nil, abi.Errorf(abi.CodeInvalid, "vmx", "VM %q has no PVRDMA adapter: add ethernetN.virtualDev = \"vrdma\"", name)
	}
	var first *Context // the live process o joins; nil when o is the first
	start := time.Now()
	for {
		d.mu.Lock()
		ps := d.vms[name]
		if ps == nil {
			ps = &vmProcs{}
			d.vms[name] = ps
			break // d.mu stays held: record o below
		}
		var leaving []*Context
		settingUp := false
		for _, v := range ps.list {
			switch {
			case v.dying.Load() || v.owner.Closed():
				leaving = append(leaving, v)
			case !v.ready.Load():
				settingUp = true
			case first == nil:
				first = v
			}
		}
		if first != nil {
			if err := d.joinableLocked(ps, first); err != nil {
				d.mu.Unlock()
				return nil, err
			}
			break
		}
		if !settingUp && len(leaving) == 0 {
			break // only failed attaches, gone: o is the first
		}
		d.mu.Unlock()
		if time.Since(start) > d.cfg.DetachWait {
			return nil, abi.Errorf(abi.CodeState, "vm", "VM %q is still attaching or detaching another workload after %v: try again", name, d.cfg.DetachWait)
		}
		if settingUp {
			// Join it once it is ready, or follow it if it fails.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		// A workload that closed the VM a moment ago is still detaching:
		// wait for that rather than refuse an immediate reopen.
		for _, v := range leaving {
			select {
			case <-v.gone:
			case <-time.After(d.cfg.DetachWait):
			}
		}
	}
	if first != nil {
		cfg, managed = first.cfg, first.managed
	}
	v := &Context{d: d, name: name, cfg: cfg, async: cfg.AsyncMode, owner: o, managed: managed, procs: d.vms[name], joined: first != nil,
		gone: make(chan struct{}), pds: map[uint32]*PD{}, mrHandles: map[uint32]*MR{}, cqs: map[uint32]*CQ{}, qps: map[uint32]*QP{}, srqs: map[uint32]*SRQ{}, ahs: map[uint32]*AH{}, xrcds: map[uint32]*xrcdHandle{},
		openQPs: map[uint32]*QPOpen{}, orphans: map[*QP]bool{},
		mrs: make([]atomic.Pointer[MR], d.cfg.Limits.MaxMR), keyBits: keyBits(d.cfg.Limits.MaxMR),
		mrKeys: keySlots{bits: keyBits(d.cfg.Limits.MaxMR), n: d.cfg.Limits.MaxMR},
		mws:    make([]atomic.Pointer[MW], d.cfg.Limits.MaxMR), mwHandles: map[uint32]*MW{}, mrWindows: map[uint32]int{},
		mwKeys: keySlots{bits: keyBits(d.cfg.Limits.MaxMR), n: d.cfg.Limits.MaxMR}}
	v.procs.list = append(v.procs.list, v) // recorded while memory is set up
	d.mu.Unlock()

	err := recheck()
	if err == nil {
		err = v.setupMemory()
	}
	if err != nil {
		d.Remove(v)
		return nil, err
	}
	if first != nil {
		for _, fa := range first.adapters {
			ad := &Adapter{vm: v, name: fa.name, index: fa.index, mac: fa.mac, gid: fa.gid, ip4: fa.ip4, ip6: fa.ip6, link: fa.link}
			ad.activeMTU.Store(fa.activeMTU.Load())
			v.adapters = append(v.adapters, ad)
		}
	} else {
		for _, c := range cfg.Adapters {
			mac := c.MAC
			if len(mac) != 6 {
				mac = generatedMAC(d.cfg.HostID, name, c.Index)
			}
			ad := &Adapter{vm: v, name: c.Name(), index: c.Index, mac: mac, gid: gidFromMAC(mac), ip6: c.IPv6, link: new(portLink)}
			ad.link.down.Store(!c.StartConnected)
			if c.IPv4.Is4() {
				ad.ip4, ad.gid = c.IPv4, abi.GID(netip.AddrFrom4(c.IPv4.As4()).As16())
			}
			v.adapters = append(v.adapters, ad)
		}
	}
	return v, nil
}

// joinableLocked refuses another process on the VM whose live process is
// first, when that would break a rule.
//
// +checklocks:d.mu
func (d *Device) joinableLocked(ps *vmProcs, first *Context) error {
	if first.cfg.MemoryLocked() {
		return abi.Errorf(abi.CodeExists, "vm", "VM %q is already attached by another workload (pid %d), and its guest memory is reserved and locked (sched.mem.pin): one workload at a time; drop sched.mem.pin to let several processes share it",
			first.name, first.owner.PID())
	}
	if n, max := len(ps.list), d.cfg.Limits.MaxProcesses; max > 0 && n >= max {
		return abi.Errorf(abi.CodeLimit, "vm", "VM %q has %d workloads attached, the limit (vrdmad --max-processes): end one first", first.name, n)
	}
	return nil
}

// Joined reports whether v joined a VM another workload had attached: it
// shares that one's adapters and control-plane record, which the first
// published.
func (v *Context) Joined() bool { return v.joined }

// LastProcess reports whether no other workload of v's VM is attached and
// staying: v's detach is the VM's (its control-plane record goes).
func (v *Context) LastProcess() bool {
	v.d.mu.Lock()
	defer v.d.mu.Unlock()
	for _, o := range v.procs.list {
		if o != v && !o.dying.Load() {
			return false
		}
	}
	return true
}

// Dying reports whether the VM is being torn down.
func (v *Context) Dying() bool { return v.dying.Load() }

// SetReady makes an attached VM visible to its peers and to status.
func (v *Context) SetReady() { v.ready.Store(true) }

// SetReadyUnique is SetReady, refused (CodeExists) when another VM of
// this host has an adapter with the GID (so the address) of one of v's.
func (v *Context) SetReadyUnique() error {
	d := v.d
	d.mu.Lock()
	defer d.mu.Unlock()
	var others []*Context
	for name, ps := range d.vms {
		if name != v.name {
			others = append(others, ps.list...)
		}
	}
	for _, ad := range v.adapters {
		for _, o := range others {
			if o.dying.Load() {
				continue
			}
			for _, oa := range o.adapters {
				if oa.gid == ad.gid {
					what := "GID " + netip.AddrFrom16(ad.gid).String()
					if ad.ip4.IsValid() {
						what = "IPv4 address " + ad.ip4.String()
					}
					return abi.Errorf(abi.CodeExists, "adapter", "rule address-unique: %s/%s cannot have %s: %s/%s on this host has it; give one of them another address (vrdma%d.ipAddress)",
						v.name, ad.name, what, o.name, oa.name, ad.index)
				}
			}
		}
	}
	v.ready.Store(true)
	return nil
}

// Adapters returns the VM's adapters, in configuration order.
func (v *Context) Adapters() []*Adapter { return v.adapters }

// Config returns the VM's configuration.
func (v *Context) Config() *vmconfig.Config { return v.cfg }

// AttachReply is the answer to the workload's attach, with the guest
// memory's descriptor to pass along.
func (v *Context) AttachReply(host string) (abi.AttachReply, int) {
	r := abi.AttachReply{VM: v.name, Host: host, MemSize: v.memSize, MemLocked: v.mem.Locked(), AsyncMode: v.async}
	for _, ad := range v.adapters {
		r.Adapters = append(r.Adapters, ad.Info())
	}
	return r, v.memFD.Int()
}

func (v *Context) setupMemory() error {
	v.memSize = uint64(v.cfg.MemSizeMB) << 20
	fd, err := sys.Memfd("vrdma-guest-"+v.name, int64(v.memSize))
	if err != nil {
		return abi.Errorf(abi.CodeInternal, "", "VM %q guest memory: %v", v.name, err)
	}
	locked := v.cfg.MemoryLocked()
	if locked {
		// Charged before a page is touched: the budget is what keeps
		// the host's memory from being locked away.
		if err := v.d.cfg.Quota.TakePinned(v.name, v.memSize); err != nil {
			fd.Close()
			return err
		}
	}
	m, err := sys.Map(fd.Int(), int(v.memSize), locked)
	if err != nil {
		fd.Close()
		if locked {
			v.d.cfg.Quota.GivePinned(v.memSize)
		}
		return abi.Errorf(abi.CodeInternal, "", "VM %q guest memory: %v", v.name, err)
	}
	if locked {
		if err := m.Lock(); err != nil {
			m.Unmap()
			fd.Close()
			v.d.cfg.Quota.GivePinned(v.memSize)
			return abi.Errorf(abi.CodeLimit, "memSize",
				"VM %q reserves and locks all %d MiB of guest memory (sched.mem.pin = \"TRUE\", sched.mem.min >= memSize), but the lock failed: %v; or lower memSize, or drop sched.mem.pin to run unlocked",
				v.name, v.cfg.MemSizeMB, err)
		}
	}
	v.memFD, v.mem = fd, m
	if locked {
		v.pinned = v.memSize
	}
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

// Adapter returns the VM's adapter name ("vrdmaN").
func (v *Context) Adapter(name string) (*Adapter, error) {
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
func (v *Context) lookupMR(key uint32) *MR {
	idx := v.keySlot(key)
	if int(idx) >= len(v.mrs) {
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
// addr is in the region's iova space (its guest address unless it was
// registered with an iova). Zero-length ranges need no key. The caller
// keeps v's memory alive.
func (v *Context) resolve(pd *PD, key uint32, addr, n uint64, need abi.Access) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	m := v.lookupMR(key)
	if m == nil || m.pd != pd || m.access&need != need {
		return nil, false
	}
	if addr < m.iova || !sys.InBounds(addr-m.iova, n, m.length) {
		return nil, false
	}
	g := m.addr + (addr - m.iova) // inside [m.addr, m.addr+m.length), which RegMR checked
	return v.mem.Bytes()[g : g+n], true
}

// +checklocks:v.objMu
func (v *Context) allocHandleLocked() uint32 {
	v.nextHandle++
	return v.nextHandle
}

// Status returns the VM's Status report.
func (v *Context) Status() mgmt.VMStatus {
	st := mgmt.VMStatus{Name: v.name, Attached: true, AsyncMode: v.async, MemSize: v.memSize, MemLocked: v.mem.Locked(),
		MemReserved: v.cfg.MemoryLocked(), Processes: []int32{v.owner.PID()}}
	for _, ad := range v.adapters {
		st.Adapters = append(st.Adapters, ad.Info())
	}
	v.objMu.Lock()
	st.MemRegistered = v.registeredLocked(0, 0)
	// The QPs it made, and the XRC target QPs it let go of that others
	// still hold open (xrc.go): they carry traffic, and count, until
	// they are destroyed.
	qps := slices.AppendSeq(slices.Collect(maps.Values(v.qps)), maps.Keys(v.orphans))
	for _, q := range qps {
		r := q.statusReport()
		r.PID = v.owner.PID()
		st.QPs = append(st.QPs, r)
	}
	st.Resources = v.resourcesLocked()
	for _, ad := range v.adapters {
		var c mgmt.QPCounters
		c.Add(ad.retired) // a copy: Add writes into c's maps
		for _, q := range qps {
			if q.pd.ad == ad {
				c.Add(q.ctr.report())
			}
		}
		st.AdapterCounters = append(st.AdapterCounters, mgmt.AdapterCounters{Adapter: ad.name, Counters: c})
	}
	v.objMu.Unlock()
	sort.Slice(st.QPs, func(i, j int) bool { return st.QPs[i].QPN < st.QPs[j].QPN })
	return st
}

// resourcesLocked counts the objects of v's process on each adapter.
//
// +checklocks:v.objMu
func (v *Context) resourcesLocked() []mgmt.ProcessResources {
	out := make([]mgmt.ProcessResources, len(v.adapters))
	idx := make(map[*Adapter]*mgmt.ProcessResources, len(v.adapters))
	for i, ad := range v.adapters {
		out[i] = mgmt.ProcessResources{PID: v.owner.PID(), Adapter: ad.name}
		idx[ad] = &out[i]
	}
	for _, p := range v.pds {
		idx[p.ad].PDs++
	}
	for _, m := range v.mrHandles {
		idx[m.pd.ad].MRs++
		idx[m.pd.ad].MRBytes += m.length
	}
	for _, c := range v.cqs {
		idx[c.ad].CQs++
	}
	for _, q := range v.qps {
		idx[q.pd.ad].QPs++
	}
	for _, s := range v.srqs {
		idx[s.pd.ad].SRQs++
	}
	return out
}

// Teardown destroys everything a VM holds, after its workload is gone:
// its QPs (peers' QPs move to ERR and flush), CQs, MRs, PDs and finally
// its mappings. The name stays taken until Remove.
func (v *Context) Teardown() {
	d := v.d
	v.dying.Store(true)
	// memcpy-direct (direct.go): peers' grants of our memory revoked and
	// unmapped before anything goes; ours dropped with our table.
	d.revoke(func(g *grant) bool { return g.owner == v || g.ch != nil && g.tab.v == v })
	v.closeDirect()
	v.objMu.Lock()
	qps := make([]*QP, 0, len(v.qps)+len(v.orphans))
	ours := make(map[uint32]bool, len(v.qps))
	for _, q := range v.qps {
		qps = append(qps, q)
		ours[q.qpn] = true
	}
	for q := range v.orphans {
		qps = append(qps, q)
	}
	opens := v.openQPs
	v.openQPs = map[uint32]*QPOpen{}
	for _, o := range opens {
		o.xh.refs--
	}
	v.objMu.Unlock()
	for _, o := range opens {
		v.dropOpen(o) // the XRC target QPs it opened (xrc.go)
	}

	// Peers: QPs elsewhere whose remote end is one of ours: any QP of the
	// VM when v is its last process, only v's QPs when others stay.
	// remoteIs takes o.mu, which is taken before d.mu elsewhere (modify,
	// status): look only after d.mu is released.
	if v.LastProcess() {
		ours = nil
	}
	d.mu.Lock()
	var others []*QP
	for _, o := range d.qps {
		if o.vm != v {
			others = append(others, o)
		}
	}
	d.mu.Unlock()
	for _, o := range others {
		if !o.remoteIs(v, ours) {
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
		if q.typ == abi.QPTypeXRCRecv {
			q.endOpens() // its opens lose it with the process that made it
		}
		v.destroyQP(q)
	}

	v.lockMem()
	v.dead = true
	v.objMu.Lock()
	for _, c := range v.cqs {
		l := c.release()
		v.refundQueue(cqCharge(l), l.Size)
	}
	for _, s := range v.srqs {
		if s.xrcd != nil {
			s.xrcd.removeSRQ(s, true) // its process's target QPs, the only ones that pin it, are gone
		}
		s.release()
		v.refundQueue(srqCharge(s.layout), s.layout.Size)
	}
	for _, m := range v.mrHandles {
		v.refundVM(vmCharge{mrs: 1})
		v.refundUser(quota.RegisteredMemory, m.length)
	}
	xrcds := v.xrcds
	v.cqs, v.srqs, v.ahs, v.mrHandles, v.pds, v.xrcds = nil, nil, nil, nil, nil, nil
	v.objMu.Unlock()
	v.mem.Unmap()
	v.memFD.Close()
	v.unlockMem()
	for _, xh := range xrcds {
		v.dropXRCD(xh.x)
	}
	v.d.cfg.Quota.GivePinned(v.pinned)
}

// Remove forgets a torn-down (or never set up) process of a VM; with
// the last, the VM's name is free: a new attach of it may go on.
func (d *Device) Remove(v *Context) {
	d.mu.Lock()
	ps := v.procs
	ps.list = slices.DeleteFunc(ps.list, func(o *Context) bool { return o == v })
	if len(ps.list) == 0 && d.vms[v.name] == ps {
		delete(d.vms, v.name)
	}
	d.mu.Unlock()
	close(v.gone)
	if v.ready.Load() {
		d.log.Info("VM detached", "vm", v.name, "pid", v.owner.PID())
	}
}

// Attached returns the processes attached as VM name, ready or not, the
// first attached first; none when it is not attached.
func (d *Device) Attached(name string) []*Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ps, ok := d.vms[name]; ok {
		return slices.Clone(ps.list)
	}
	return nil
}

// SetConnected connects or disconnects adapter vrdmaN of attached VM name, as vSphere's "Connected" box does: the
// port goes up or down for every process of the VM, each of which is told
// (Owner.PortChanged). It reports whether the state changed and how many
// processes were told.
func (d *Device) SetConnected(name, adapter string, connected bool) (changed bool, told int, err error) {
	ps := d.Attached(name)
	if len(ps) == 0 {
		return false, 0, abi.Errorf(abi.CodeNotFound, "vm", "VM %q has no workload attached on this host: an adapter is connected or not while the VM runs "+
			"(ethernetN.startConnected sets it for the next attach)", name)
	}
	var names []string
	for _, ad := range ps[0].adapters {
		names = append(names, ad.name)
		if ad.name != adapter {
			continue
		}
		if ad.link.down.Swap(!connected) == !connected {
			return false, 0, nil
		}
		if !connected {
			// memcpy-direct (direct.go): nothing reaches or leaves the
			// port any more, so no library writes across it either.
			link := ad.link
			d.revoke(func(g *grant) bool { return g.init.ad.link == link || g.target.ad.link == link })
		}
		for _, v := range ps {
			if !v.Running() {
				continue
			}
			for _, a := range v.adapters {
				if a.name == ad.name {
					v.owner.PortChanged(a, connected)
					told++
				}
			}
		}
		return true, told, nil
	}
	return false, 0, abi.Errorf(abi.CodeNotFound, "adapter", "VM %q has no adapter %q; it has %s", name, adapter, strings.Join(names, ", "))
}

// SetConnected connects or disconnects adapter vrdmaN of v's VM, for
// every process of it (Device.SetConnected).
func (v *Context) SetConnected(adapter string, connected bool) (changed bool, told int, err error) {
	return v.d.SetConnected(v.name, adapter, connected)
}

// AttachedVMs returns every attached VM's processes, ready or not.
func (d *Device) AttachedVMs() []*Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	var vms []*Context
	for _, ps := range d.vms {
		vms = append(vms, ps.list...)
	}
	return vms
}

// VMStatuses reports the attached VMs that are set up, one per VM: its
// processes' QPs and counters together.
func (d *Device) VMStatuses() []mgmt.VMStatus {
	byName := map[string]int{}
	var out []mgmt.VMStatus
	for _, v := range d.VMs() {
		st := v.Status()
		i, seen := byName[v.name]
		if !seen {
			byName[v.name] = len(out)
			out = append(out, st)
			continue
		}
		m := &out[i]
		m.Processes = append(m.Processes, st.Processes...)
		m.MemRegistered += st.MemRegistered
		m.QPs = append(m.QPs, st.QPs...)
		m.Resources = append(m.Resources, st.Resources...)
		for j := range m.AdapterCounters {
			if j < len(st.AdapterCounters) {
				m.AdapterCounters[j].Counters.Add(st.AdapterCounters[j].Counters)
			}
		}
	}
	for i := range out {
		slices.Sort(out[i].Processes)
		sort.Slice(out[i].QPs, func(a, b int) bool { return out[i].QPs[a].QPN < out[i].QPs[b].QPN })
	}
	return out
}

// DeviceAttr are the attributes ibv_query_device reports for adapter ad of
// v: each adapter is a device of its own, whose node GUID comes from its MAC
// (as a PVRDMA adapter's does); the system image GUID, the VM's, from the
// first adapter's.
func (v *Context) DeviceAttr(ad *Adapter) abi.DeviceAttr {
	l := v.d.cfg.Limits
	return abi.DeviceAttr{
		FWVer: v.d.cfg.FWVersion, NodeGUID: guid(ad.mac), SysImageGUID: guid(v.adapters[0].mac),
		VendorID: 0x15ad, VendorPartID: 0x0820, HWVer: 1,
		MaxMRSize: v.memSize, PageSizeCap: uint64(sys.PageSize),
		MaxQP: uint32(l.MaxQP), MaxQPWR: abi.MaxQPWR, MaxSGE: abi.MaxSGE, MaxCQ: uint32(l.MaxCQ), MaxCQE: abi.MaxCQE,
		MaxMR: uint32(l.MaxMR), MaxPD: uint32(l.MaxPD), MaxQPRdAtom: abi.MaxRdAtom, MaxQPInitRdAtom: abi.MaxRdAtom,
		MaxSRQ: uint32(l.MaxQP), MaxSRQWR: abi.MaxSRQWR, MaxSRQSGE: abi.MaxSRQSGE, MaxAH: maxAH, MaxMW: uint32(l.MaxMR), MaxXRCD: abi.MaxXRCD,
		MaxMcastGrp: abi.MaxMcastGrp, MaxMcastQPAttach: abi.MaxMcastQPAttach, MaxTotalMcastQPAttach: abi.MaxTotalMcastQPAttach,
		MaxInlineData: abi.MaxInline, AtomicCap: "ATOMIC_HCA", PhysPortCnt: 1, TransportType: "InfiniBand (RoCE)",
	}
}

// guid is the EUI-64 GUID of a MAC, as ibv_devinfo prints it.
func guid(mac net.HardwareAddr) string {
	return fmt.Sprintf("%02x%02x:%02xff:fe%02x:%02x%02x", mac[0]^2, mac[1], mac[2], mac[3], mac[4], mac[5])
}

// PortAttr are the attributes ibv_query_port reports for ad's port.
// A disconnected adapter's port is PORT_DOWN.
func (ad *Adapter) PortAttr() abi.PortAttr {
	state := "PORT_ACTIVE"
	if !ad.Connected() {
		state = "PORT_DOWN"
	}
	return abi.PortAttr{State: state, MaxMTU: 4096, ActiveMTU: ad.ActiveMTU(), GIDTblLen: abi.GIDTableLen, LinkLayer: "Ethernet",
		GID: ad.gid, MAC: ad.mac.String(), ActiveSpeed: "virtual", PortCapFlags: []string{"CM_SUP", "IP_BASED_GIDS"}}
}
