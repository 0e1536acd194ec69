// SPDX-License-Identifier: Apache-2.0

// Package device is vrdma's virtual RDMA device: the attached VMs with
// their guest memory and adapters, the verbs objects (PD, MR, CQ, QP), the
// QP state machine, each QP's send-queue goroutine, the receive queues
// and completion queues, and the one RC responder every path shares.
//
// The device moves no byte between QPs itself: a connected QP is bound at
// RTR to a Path (path.go), which the Router the agent installs chooses
// (memcpy, tcp, and later rdma, memcpy-direct and native endpoints, each
// in a package of its own under internal/transport). Paths see the send
// queue through the device's half of the interface (sq.go) and deliver
// at a responder QP through Hold, then Respond or Begin, Place and End
// (respond.go).
// Nothing in this package knows a path, a session or the control plane.
//
// Memory safety. Guest memory is a memfd mapped by the agent and by the
// workload. Every range a request names is checked against a memory
// region of the right protection domain and access before a byte moves
// (VM.resolve); a VM's memory is unmapped only under memMu held for
// writing, and every user of another VM's memory holds it for reading
// and checks the VM alive first. An XRC target QP's responder, which
// writes into whichever process of its VM owns the SRQ a request names,
// holds the VM-wide xmem instead, which every writer of memMu takes too
// (lockMem, xrc.go). Rings are the workload's to scribble on:
// the device copies each slot before it decodes it and checks every index
// it reads.
package device

import (
	crand "crypto/rand"
	"encoding/binary"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/quota"
)

// Limits are the per-VM resource limits; errors that refuse an object name
// the limit. max_mr, max_cq and max_qp bound each workload's context and
// also all the VM's workloads together; max_pd bounds each context.
type Limits struct {
	MaxPD int // max_pd
	MaxMR int // max_mr
	MaxCQ int // max_cq
	MaxQP int // max_qp
	// MaxCQEPerVM bounds the CQ entries of all the VM's CQs together
	// (each entry is abi.CQESize bytes of ring); 0: no such bound.
	MaxCQEPerVM int
	// MaxWRPerVM bounds the send and receive queue entries of all the
	// VM's QPs together; 0: no such bound.
	MaxWRPerVM   int
	MaxListeners int // listening service ports per VM (package cm)
	// MaxProcesses bounds the workloads (processes) attached to one VM
	// at once; the object limits above apply to each one's context, and
	// the VM's memSize to all their memory regions together.
	MaxProcesses int
}

// DefaultLimits are the limits an agent applies unless told otherwise.
var DefaultLimits = Limits{MaxPD: 1024, MaxMR: 4096, MaxCQ: 1024, MaxQP: 512, MaxListeners: 256, MaxProcesses: 16,
	MaxCQEPerVM: 1 << 20, MaxWRPerVM: 1 << 20}

// Config configures a Device.
type Config struct {
	Host      string // this host's name, for messages
	HostID    string // this host's ID: generated MACs derive from it
	FWVersion string // reported as the adapters' firmware version
	Limits    Limits
	Clock     clock.Clock // the QPs' RC timers; nil is the real clock
	Log       *slog.Logger
	// Router binds connected QPs to their paths; nil refuses every
	// connection (a device of tests that connect nothing).
	Router Router
	// DetachWait bounds how long a detach waits for a VM's teardown, and
	// an attach for a previous workload's; default 10 s.
	DetachWait time.Duration
	// Quota charges workloads' ring and registered memory to their uids
	// and locked guest memory to the host's budget; nil charges nothing.
	Quota *quota.Ledger
}

// Router chooses the path of a QP that moves from INIT to RTR.
type Router interface {
	// Route decides how q reaches the remote end (dgid, dqpn). It is
	// called before q's lock is taken and may block on the control
	// plane; an error fails the transition with that error.
	Route(q *QP, dgid abi.GID, dqpn uint32) (Route, error)
}

// Route is a Router's decision: the report of it, and the path to bind.
type Route struct {
	Info abi.PathInfo
	// New makes q's path; it is called under q's lock when the
	// transition succeeds, and must not take it. The path sees its QP
	// as a Source only.
	New func(q Source) Path
}

// Device is one host's virtual RDMA device. It is safe for concurrent use.
type Device struct {
	cfg Config
	log *slog.Logger
	clk clock.Clock

	mu sync.Mutex
	// attached VMs by name
	vms map[string]*vmProcs // +checklocks:mu
	// every QP by QPN
	qps map[uint32]*QP // +checklocks:mu

	udDropped atomic.Uint64 // datagrams dropped at their destination (ud.go)

	gov asyncGovernor // async mode's choice between polling and the doorbell (spin.go)

	mcMu sync.Mutex
	mc   mcastGroups // +checklocks:mcMu

	// The memcpy-direct grants (direct.go), and every session's grant
	// table (Context.direct).
	directMu sync.Mutex
	grants   map[*grant]struct{} // +checklocks:directMu
}

// New returns an empty device.
func New(cfg Config) *Device {
	d := &Device{cfg: cfg, log: cfg.Log, clk: cfg.Clock, vms: map[string]*vmProcs{}, qps: map[uint32]*QP{}, grants: map[*grant]struct{}{}}
	if d.log == nil {
		d.log = slog.Default()
	}
	if d.clk == nil {
		d.clk = clock.Real
	}
	if d.cfg.DetachWait <= 0 {
		d.cfg.DetachWait = 10 * time.Second
	}
	return d
}

// Clock is the time source of the device's RC timers.
func (d *Device) Clock() clock.Clock { return d.clk }

// Limits returns the device's per-VM limits.
func (d *Device) Limits() Limits { return d.cfg.Limits }

// QP returns the QP numbered qpn, or nil.
func (d *Device) QP(qpn uint32) *QP {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.qps[qpn]
}

// allocQPNLocked returns an unused QPN drawn at random from the 24-bit
// space (never 0 or 1, which IB reserves for QP0 and QP1, nor 0xffffff,
// its multicast QPN). A QPN is what a request names its target by: drawn
// at random, a QP's number says nothing of the next one's, and a number a
// destroyed QP had comes back only by chance, one in 16 million per QP
// created (docs/SECURITY.md, "Addresses, keys and QP numbers").
//
// +checklocks:d.mu
func (d *Device) allocQPNLocked() uint32 {
	var b [4]byte
	for {
		crand.Read(b[:]) // never fails (crypto/rand)
		n := binary.LittleEndian.Uint32(b[:]) & 0xffffff
		if n < 2 || n == 0xffffff {
			continue
		}
		if _, used := d.qps[n]; !used {
			return n
		}
	}
}

// AdapterByGID returns the adapter of an attached VM with gid, or nil.
func (d *Device) AdapterByGID(gid abi.GID) *Adapter {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.adapterByGIDLocked(gid)
}

// +checklocks:d.mu
func (d *Device) adapterByGIDLocked(gid abi.GID) *Adapter {
	for _, ps := range d.vms {
		for _, v := range ps.list {
			if !v.ready.Load() {
				continue
			}
			for _, ad := range v.adapters {
				if ad.gid == gid {
					return ad
				}
			}
		}
	}
	return nil
}

// ReadyVM returns a process of the attached VM name (the first attached
// that is set up and not torn down): its adapters are the VM's.
func (d *Device) ReadyVM(name string) (*Context, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ps, ok := d.vms[name]; ok {
		for _, v := range ps.list {
			if v.Running() {
				return v, true
			}
		}
	}
	return nil, false
}

// VMs returns the attached VMs' processes that are set up.
func (d *Device) VMs() []*Context {
	return slices.DeleteFunc(d.AttachedVMs(), func(v *Context) bool { return !v.ready.Load() })
}
