// SPDX-License-Identifier: Apache-2.0

package vrdma

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/locations"
	"github.com/vrdma/vrdma/internal/sys"
)

// Option configures Open.
type Option func(*options)

type options struct {
	socket string
}

// WithSocket connects to the agent at path instead of the default
// ($VRDMA_SOCKET, /run/vrdma/vrdmad.sock for root, $XDG_RUNTIME_DIR/vrdma
// otherwise).
func WithSocket(path string) Option { return func(o *options) { o.socket = path } }

// VM is a workload's attachment to a VM: its guest memory and adapters. Its
// methods are safe for concurrent use.
type VM struct {
	c         *conn
	name      string
	host      string
	memLocked bool
	async     bool
	caps      abi.Caps // what the agent serves
	mem       *sys.Mapping
	adapters  []*Adapter

	allocMu  sync.Mutex
	allocOff uint64 // +checklocks:allocMu

	objMu sync.Mutex
	// woken when the agent dies; their descriptors closed by Close
	cqs map[*CQ]struct{} // +checklocks:objMu
	// the QPs with a doorbell, closed by Close
	qps map[*QP]struct{} // +checklocks:objMu

	// memcpy-direct (direct.go): the grant table, opened by the first QP
	// bound to the path; the library's regions by lkey (*localMR).
	dirMu sync.Mutex
	dir   *directTable // +checklocks:dirMu
	lmrs  sync.Map

	closed atomic.Bool
}

// helloCaps are the capability bits the library sends in its hello:
// every bit it knows.
const helloCaps = abi.CapsKnown

// Open attaches to the VM called name on this host's agent. The agent maps
// the VM's guest memory (locked if the VM reserves all of it) and shares it
// with this process; memory regions, buffers and work requests live there.
func Open(ctx context.Context, name string, opts ...Option) (*VM, error) {
	o := options{socket: locations.Socket()}
	for _, f := range opts {
		f(&o)
	}
	c, err := dial(o.socket)
	if err != nil {
		return nil, err
	}
	// Hello first: the agent's features, and ours, which some of its
	// behaviours wait for (the QP events of capability qp-events).
	var hr abi.HelloReply
	if _, err := c.call(ctx, abi.OpHello, &abi.Hello{Client: "vrdma", Caps: helloCaps}, &hr); err != nil {
		c.close()
		return nil, fmt.Errorf("vrdma: hello to the agent for VM %q: %w", name, err)
	}
	var r abi.AttachReply
	fds, err := c.call(ctx, abi.OpAttach, &abi.Attach{VM: name}, &r)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("vrdma: attach VM %q: %w", name, err)
	}
	if len(fds) != 1 {
		closeFDs(fds)
		c.close()
		return nil, fmt.Errorf("vrdma: attach VM %q: the agent sent %d descriptors, want the guest memory", name, len(fds))
	}
	size, err := sys.FileSize(fds[0])
	if err == nil && (r.MemSize == 0 || uint64(size) < r.MemSize) {
		err = fmt.Errorf("guest memory file of %d bytes is smaller than the %d bytes announced", size, r.MemSize)
	}
	var m *sys.Mapping
	if err == nil {
		m, err = sys.Map(fds[0], int(r.MemSize), false)
	}
	sys.CloseFD(fds[0])
	if err != nil {
		c.close()
		return nil, fmt.Errorf("vrdma: attach VM %q: %w", name, err)
	}
	v := &VM{c: c, name: r.VM, host: r.Host, memLocked: r.MemLocked, async: r.AsyncMode, caps: hr.Caps.Effective(), mem: m, cqs: map[*CQ]struct{}{}, qps: map[*QP]struct{}{}}
	for _, ai := range r.Adapters {
		mac, _ := net.ParseMAC(ai.MAC)
		ip4, _ := netip.ParseAddr(ai.IPv4)
		ip6, _ := netip.ParseAddr(ai.IPv6)
		v.adapters = append(v.adapters, &Adapter{vm: v, name: ai.Name, index: ai.Index, mac: mac, gid: ai.GID, ip4: ip4, ip6: ip6})
	}
	c.whenDead(v.wakeAll)
	return v, nil
}

// Caps returns the features the VM's agent serves (its hello's caps).
func (v *VM) Caps() Caps { return v.caps }

// Name returns the VM's name.
func (v *VM) Name() string { return v.name }

// Host returns the name of the host whose agent serves the VM.
func (v *VM) Host() string { return v.host }

// MemoryLocked reports whether the guest memory is locked in RAM.
func (v *VM) MemoryLocked() bool { return v.memLocked }

// AsyncMode reports whether the agent polls this VM's queues (vrdma.asyncMode).
func (v *VM) AsyncMode() bool { return v.async }

// Memory returns the VM's whole guest memory. Guest address 0 is its first
// byte.
func (v *VM) Memory() []byte { return v.mem.Bytes() }

// Alloc returns n bytes of guest memory that no other Alloc returns,
// aligned to 64 bytes (to a page when n is a page or more). Memory is never
// given back; Alloc is a convenience for programs that size their buffers
// once.
func (v *VM) Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, errorf(abi.CodeInvalid, "vrdma: Alloc(%d): size must be positive", n)
	}
	align := uint64(64)
	if n >= sys.PageSize {
		align = uint64(sys.PageSize)
	}
	v.allocMu.Lock()
	defer v.allocMu.Unlock()
	off := (v.allocOff + align - 1) &^ (align - 1)
	if !sys.InBounds(off, uint64(n), uint64(v.mem.Len())) {
		return nil, errorf(abi.CodeLimit, "vrdma: Alloc(%d): VM %q has %d bytes of guest memory and %d are taken: raise memSize",
			n, v.name, v.mem.Len(), v.allocOff)
	}
	v.allocOff = off + uint64(n)
	return v.mem.Bytes()[off : off+uint64(n) : off+uint64(n)], nil
}

// AddrOf returns the guest address of b's first byte, and false if b does
// not lie within guest memory.
func (v *VM) AddrOf(b []byte) (uint64, bool) {
	mem := v.mem.Bytes()
	if len(b) == 0 || len(mem) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || !sys.InBounds(uint64(p-base), uint64(len(b)), uint64(len(mem))) {
		return 0, false
	}
	return uint64(p - base), true
}

// Adapters returns the VM's adapters in index order.
func (v *VM) Adapters() []*Adapter { return v.adapters }

// Adapter returns the adapter called name ("vrdma0").
func (v *VM) Adapter(name string) (*Adapter, error) {
	for _, a := range v.adapters {
		if a.name == name {
			return a, nil
		}
	}
	return nil, errorf(abi.CodeNotFound, "vrdma: VM %q has no adapter %q", v.name, name)
}

// Close detaches from the VM: the agent destroys every object the VM holds
// and its peers' QPs move to ERR. Guest memory becomes unusable.
func (v *VM) Close() error {
	if v.closed.Swap(true) {
		return nil
	}
	err := v.c.close()
	v.dirMu.Lock()
	if v.dir != nil {
		v.dir.close()
	}
	v.dirMu.Unlock()
	v.mem.Unmap()
	v.closeObjects()
	return err
}

// closeObjects closes the doorbells of the CQs and QPs not destroyed
// before Close (two descriptors each): a process that closes VMs without
// destroying every object, and goes on, must not keep their descriptors
// (a test binary's 1,024 QPs ran it out of them). A CQ's waiters are
// woken first; a QP's ring then fails with os.ErrClosed.
func (v *VM) closeObjects() {
	v.objMu.Lock()
	cqs, qps := v.cqs, v.qps
	v.cqs, v.qps = map[*CQ]struct{}{}, map[*QP]struct{}{}
	v.objMu.Unlock()
	for cq := range cqs {
		cq.ev.Wake()
		cq.ev.Close()
	}
	for q := range qps {
		q.db.Close()
	}
}

func (v *VM) wakeAll() {
	v.objMu.Lock()
	defer v.objMu.Unlock()
	for cq := range v.cqs {
		cq.ev.Wake()
	}
}

func (v *VM) check() error {
	if v.c.dead.Load() {
		return ErrAgentGone
	}
	return nil
}

// Adapter is one vrdma adapter of a VM (vrdmaN, the PVRDMA adapter
// ethernetN of its VMX).
type Adapter struct {
	vm    *VM
	name  string
	index int
	mac   net.HardwareAddr
	gid   GID
	ip4   netip.Addr
	ip6   netip.Addr
}

// IPv4 returns the adapter's IPv4 address on its port group (the zero
// Addr when it has none): from vrdmaN.ipAddress, or assigned by the
// control plane from the port group's subnet. Its GID is then the
// IPv4-mapped form, and peers connect to it by this address.
func (a *Adapter) IPv4() netip.Addr { return a.ip4 }

// IPv6 returns the adapter's optional IPv6 address (vrdmaN.ip6Address).
func (a *Adapter) IPv6() netip.Addr { return a.ip6 }

// Name returns the adapter's name, "vrdmaN".
func (a *Adapter) Name() string { return a.name }

// VM returns the adapter's VM.
func (a *Adapter) VM() *VM { return a.vm }

// MAC returns the adapter's MAC address.
func (a *Adapter) MAC() net.HardwareAddr { return a.mac }

// GID returns the adapter's GID (index 0).
func (a *Adapter) GID() GID { return a.gid }

// QueryDevice returns the device attributes (ibv_query_device).
func (a *Adapter) QueryDevice(ctx context.Context) (DeviceAttr, error) {
	var r DeviceAttr
	_, err := a.vm.c.call(ctx, abi.OpQueryDevice, &abi.AdapterRef{Adapter: a.name}, &r)
	return r, err
}

// QueryPort returns the attributes of the adapter's port 1 (ibv_query_port).
func (a *Adapter) QueryPort(ctx context.Context) (PortAttr, error) {
	var r PortAttr
	_, err := a.vm.c.call(ctx, abi.OpQueryPort, &abi.AdapterRef{Adapter: a.name}, &r)
	return r, err
}

// ErrNoGID is QueryGID's error for an empty entry of the GID table.
var ErrNoGID = errorf(abi.CodeNotFound, "vrdma: the GID table has no GID at that index")

// QueryGID returns entry index of the adapter's GID table
// (ibv_query_gid_ex; all RoCE v2): index 0 is its GID; index 1 (NativeGIDIndex),
// for an adapter with native endpoints, the address RoCE peers that are
// not vrdma VMs reach it at; an empty entry is ErrNoGID.
func (a *Adapter) QueryGID(ctx context.Context, index int) (GID, error) {
	switch {
	case index < 0 || index >= abi.GIDTableLen:
		return GID{}, errorf(abi.CodeInvalid, "vrdma: GID index %d is outside the table (0..%d)", index, abi.GIDTableLen-1)
	case index == 0:
		return a.gid, nil
	case index != abi.NativeGIDIndex:
		return GID{}, ErrNoGID
	}
	pa, err := a.QueryPort(ctx)
	if err != nil {
		return GID{}, err
	}
	if pa.NativeGID == nil {
		return GID{}, ErrNoGID
	}
	return *pa.NativeGID, nil
}

// NativeGIDIndex is the GID table index of an adapter's GID for native
// endpoints (QueryGID).
const NativeGIDIndex = abi.NativeGIDIndex
