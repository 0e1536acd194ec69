// SPDX-License-Identifier: Apache-2.0

// Package quota is the host agent's accounting of what local users hold:
// the host-wide budget of pinned (locked) guest memory, and each uid's
// sessions, attached processes, ring memory, registered memory and
// writes of VM records to the control plane. docs/SECURITY.md ("Tenants
// and quotas") lists every cap with its flag and default.
//
// Root (uid 0) and the agent's own user are the host's administrators:
// the per-uid caps do not apply to them. The pinned-memory budget applies
// to everyone, root included, since it protects the host itself.
//
// A refusal is an *abi.Error of CodeLimit whose message names the limit,
// what the uid holds, the flag that sets it with its default, and what to
// do.
package quota

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
)

// Resource is a per-uid resource the Ledger counts.
type Resource int

// The per-uid resources.
const (
	Sessions         Resource = iota // connections to the agent's socket
	Processes                        // workloads attached to a VM
	RingMemory                       // bytes of QP and CQ rings, which the agent locks in memory
	RegisteredMemory                 // bytes of memory regions, each counted whole
	numResources
)

// resources describe each Resource for errors: the limit's name, its
// flag, its unit and what the refused user can do.
var resources = [numResources]struct {
	name, flag, what, do string
	bytes                bool
}{
	Sessions:         {"sessions-per-user", "--max-sessions-per-user", "sessions open to the agent", "close some (end idle clients)", false},
	Processes:        {"processes-per-user", "--max-processes-per-user", "workloads attached to VMs", "end some workloads", false},
	RingMemory:       {"ring-memory-per-user", "--max-ring-memory-per-user", "of QP and CQ rings", "destroy some QPs or CQs, or create them with fewer entries", true},
	RegisteredMemory: {"registered-memory-per-user", "--max-registered-memory-per-user", "of memory regions", "deregister some regions", true},
}

// Limits are the caps the Ledger enforces, and those that the VM
// procedures enforce with its help (VMsPerUser). A zero field takes its
// default (Defaults).
type Limits struct {
	// PinnedMemory is the host-wide budget, in bytes, of guest memory that
	// VMs reserve and lock (sched.mem.pin): the sum over every attached
	// VM, whoever owns it.
	PinnedMemory uint64
	// PinUIDs are the uids, besides root and the agent's user, whose VMs
	// may reserve and lock guest memory at all.
	PinUIDs []uint32
	// SessionsPerUser bounds the connections one uid has open to the
	// agent's socket.
	SessionsPerUser int
	// ProcessesPerUser bounds the workloads one uid has attached.
	ProcessesPerUser int
	// VMsPerUser bounds the VMs one uid owns: those defined on this agent
	// and the managed VMs of the control plane together.
	VMsPerUser int
	// RingMemoryPerUser bounds the bytes of QP and CQ rings of one uid's
	// workloads (the agent populates and locks them).
	RingMemoryPerUser uint64
	// RegisteredMemoryPerUser bounds the bytes of memory regions one
	// uid's workloads have registered, each region counted whole.
	RegisteredMemoryPerUser uint64
	// VMWriteBytesPerHour bounds the bytes of VM records one uid writes to
	// the control plane in an hour (create, edit, set, power on and off):
	// etcd keeps every revision until it compacts them (hourly).
	VMWriteBytesPerHour uint64
}

// Default caps that do not depend on the machine.
const (
	DefaultSessionsPerUser     = 64
	DefaultProcessesPerUser    = 32
	DefaultVMsPerUser          = 32
	DefaultRingMemoryPerUser   = 1 << 30  // 1 GiB
	DefaultVMWriteBytesPerHour = 64 << 20 // 64 MiB
)

// Defaults returns the default caps: PinnedMemory and
// RegisteredMemoryPerUser are half of the machine's RAM each.
func Defaults() Limits {
	ram := uint64(16 << 30)
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil && si.Totalram > 0 {
		ram = uint64(si.Totalram) * uint64(si.Unit)
	}
	return Limits{PinnedMemory: ram / 2, SessionsPerUser: DefaultSessionsPerUser, ProcessesPerUser: DefaultProcessesPerUser,
		VMsPerUser: DefaultVMsPerUser, RingMemoryPerUser: DefaultRingMemoryPerUser, RegisteredMemoryPerUser: ram / 2,
		VMWriteBytesPerHour: DefaultVMWriteBytesPerHour}
}

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	d := Defaults()
	if l.PinnedMemory == 0 {
		l.PinnedMemory = d.PinnedMemory
	}
	if l.SessionsPerUser <= 0 {
		l.SessionsPerUser = d.SessionsPerUser
	}
	if l.ProcessesPerUser <= 0 {
		l.ProcessesPerUser = d.ProcessesPerUser
	}
	if l.VMsPerUser <= 0 {
		l.VMsPerUser = d.VMsPerUser
	}
	if l.RingMemoryPerUser == 0 {
		l.RingMemoryPerUser = d.RingMemoryPerUser
	}
	if l.RegisteredMemoryPerUser == 0 {
		l.RegisteredMemoryPerUser = d.RegisteredMemoryPerUser
	}
	if l.VMWriteBytesPerHour == 0 {
		l.VMWriteBytesPerHour = d.VMWriteBytesPerHour
	}
	return l
}

// Ledger counts what each uid holds against Limits. It is safe for
// concurrent use. A nil *Ledger refuses nothing and allows every uid to
// pin (a device or procedures made without an agent, in unit tests).
type Ledger struct {
	lim      Limits
	agentUID uint32
	now      func() time.Time

	mu     sync.Mutex
	used   map[uint32]*[numResources]uint64 // +checklocks:mu
	pinned uint64                           // +checklocks:mu
	writes map[uint32]*window               // +checklocks:mu
}

// window is one uid's control-plane writes of the last hour.
type window struct {
	at    []time.Time
	bytes []uint64
	sum   uint64
}

// New returns a ledger of l (zero fields take their defaults); agentUID
// is the agent's own user, exempt from the per-uid caps like root.
func New(l Limits, agentUID uint32) *Ledger {
	return &Ledger{lim: l.WithDefaults(), agentUID: agentUID, now: time.Now,
		used: map[uint32]*[numResources]uint64{}, writes: map[uint32]*window{}}
}

// Limits returns the ledger's caps; the zero Limits for a nil ledger.
func (l *Ledger) Limits() Limits {
	if l == nil {
		return Limits{}
	}
	return l.lim
}

// Exempt reports whether uid is root or the agent's user, to whom no
// per-uid cap applies.
func (l *Ledger) Exempt(uid uint32) bool { return l == nil || uid == 0 || uid == l.agentUID }

// Take charges n of r to uid, or refuses (CodeLimit) when that would go
// over the uid's cap; nothing is charged then. Exempt uids are counted
// but never refused.
func (l *Ledger) Take(uid uint32, r Resource, n uint64) error {
	if l == nil || n == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.used[uid]
	if u == nil {
		u = new([numResources]uint64)
		l.used[uid] = u
	}
	if max := l.maxOf(r); !l.Exempt(uid) && u[r]+n > max {
		rs := resources[r]
		if rs.bytes {
			return abi.Errorf(abi.CodeLimit, "", "limit %s: uid %d holds %s %s and asks for %s more, over the limit of %s (vrdmad %s, default %s); %s, or have the administrator raise the limit",
				rs.name, uid, Size(u[r]), rs.what, Size(n), Size(max), rs.flag, l.defaultOf(r), rs.do)
		}
		return abi.Errorf(abi.CodeLimit, "", "limit %s: uid %d has %d %s, and the limit is %d (vrdmad %s, default %s); %s, or have the administrator raise the limit",
			rs.name, uid, u[r], rs.what, max, rs.flag, l.defaultOf(r), rs.do)
	}
	u[r] += n
	return nil
}

// Give returns n of r that uid took.
func (l *Ledger) Give(uid uint32, r Resource, n uint64) {
	if l == nil || n == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.used[uid]
	if u == nil {
		return
	}
	u[r] -= min(n, u[r])
	if *u == ([numResources]uint64{}) {
		delete(l.used, uid)
	}
}

// Used returns what uid holds of r.
func (l *Ledger) Used(uid uint32, r Resource) uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if u := l.used[uid]; u != nil {
		return u[r]
	}
	return 0
}

// +checklocks:l.mu
func (l *Ledger) maxOf(r Resource) uint64 {
	switch r {
	case Sessions:
		return uint64(l.lim.SessionsPerUser)
	case Processes:
		return uint64(l.lim.ProcessesPerUser)
	case RingMemory:
		return l.lim.RingMemoryPerUser
	case RegisteredMemory:
		return l.lim.RegisteredMemoryPerUser
	}
	return 0
}

// defaultOf describes r's default for errors.
func (l *Ledger) defaultOf(r Resource) string {
	switch r {
	case Sessions:
		return strconv.Itoa(DefaultSessionsPerUser)
	case Processes:
		return strconv.Itoa(DefaultProcessesPerUser)
	case RingMemory:
		return Size(DefaultRingMemoryPerUser)
	case RegisteredMemory:
		return "half of the RAM"
	}
	return ""
}

// MayPin reports whether a VM owned by uid may reserve and lock its guest
// memory: root's, the agent user's and those of Limits.PinUIDs may.
func (l *Ledger) MayPin(uid uint32) bool {
	return l.Exempt(uid) || slices.Contains(l.lim.PinUIDs, uid)
}

// PinError is the refusal of a VM owned by uid that pins its memory
// without the administrator's leave (MayPin false).
func PinError(vm string, uid uint32) error {
	return abi.Errorf(abi.CodePermission, "sched.mem.pin",
		"limit pin-allowed-uids: VM %q reserves and locks its guest memory (sched.mem.pin = \"TRUE\"), but its owner uid %d may not pin memory: only VMs of root, of the uids in vrdmad --pin-allowed-uids (default none) and VMs that root defined, created or edited with pinning may; drop sched.mem.pin, have the administrator add uid %d, or have root define the VM",
		vm, uid, uid)
}

// TakePinned charges n bytes of locked guest memory of VM vm to the
// host-wide budget, or refuses (CodeLimit).
func (l *Ledger) TakePinned(vm string, n uint64) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pinned+n > l.lim.PinnedMemory {
		return abi.Errorf(abi.CodeLimit, "memSize",
			"limit pinned-memory-budget: VM %q would lock %s of guest memory, but attached VMs already lock %s of the host's budget of %s (vrdmad --pinned-memory-budget, default half of the RAM); detach a VM that pins memory, drop sched.mem.pin or lower memSize, or have the administrator raise the budget",
			vm, Size(n), Size(l.pinned), Size(l.lim.PinnedMemory))
	}
	l.pinned += n
	return nil
}

// GivePinned returns n bytes that TakePinned charged.
func (l *Ledger) GivePinned(n uint64) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pinned -= min(n, l.pinned)
}

// Pinned returns the bytes of locked guest memory charged to the budget.
func (l *Ledger) Pinned() uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pinned
}

// TakeWrite charges a write of n bytes of VM records to the control plane
// to uid, or refuses it (CodeLimit) when uid wrote more than
// VMWriteBytesPerHour in the last hour with it.
func (l *Ledger) TakeWrite(uid uint32, n uint64) error {
	if l == nil || l.Exempt(uid) {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	w := l.writes[uid]
	if w == nil {
		w = &window{}
		l.writes[uid] = w
	}
	i := 0
	for i < len(w.at) && now.Sub(w.at[i]) >= time.Hour {
		w.sum -= w.bytes[i]
		i++
	}
	w.at, w.bytes = w.at[i:], w.bytes[i:]
	if max := l.lim.VMWriteBytesPerHour; w.sum+n > max {
		return abi.Errorf(abi.CodeLimit, "",
			"limit vm-write-bytes-per-hour: uid %d wrote %s of VM records to the control plane in the last hour, and this change writes %s more, over the limit of %s (vrdmad --max-vm-write-bytes-per-hour, default %s), which keeps etcd far from its quota; wait, make fewer or smaller changes, or have the administrator raise the limit",
			uid, Size(w.sum), Size(n), Size(max), Size(DefaultVMWriteBytesPerHour))
	}
	w.at, w.bytes = append(w.at, now), append(w.bytes, n)
	w.sum += n
	return nil
}

// VMsError is the refusal of one more VM to uid, which owns n.
func VMsError(uid uint32, n, max int) error {
	return abi.Errorf(abi.CodeLimit, "name", "limit vms-per-user: uid %d owns %d VMs, and the limit is %d (vrdmad --max-vms-per-user, default %d); undefine one or have the administrator raise the limit",
		uid, n, max, DefaultVMsPerUser)
}

// Size formats n bytes for messages: "512 MiB", "3 GiB", "1234 bytes".
func Size(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d bytes", n)
}

// ParseSize reads a size flag: a number of bytes with an optional binary
// suffix (K, M, G, T, with or without "iB"), or a percentage of the
// machine's RAM ("50%").
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(t, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v <= 0 || v > 100 {
			return 0, fmt.Errorf("%q: want a percentage of the RAM from 0 to 100", s)
		}
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err != nil {
			return 0, fmt.Errorf("%q: read the RAM size: %v", s, err)
		}
		return uint64(float64(uint64(si.Totalram)*uint64(si.Unit)) * v / 100), nil
	}
	u := strings.ToUpper(t)
	u = strings.TrimSuffix(strings.TrimSuffix(u, "IB"), "B")
	shift := 0
	if n := len(u); n > 0 {
		switch u[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			u = u[:n-1]
		}
	}
	v, err := strconv.ParseUint(strings.TrimSpace(u), 10, 64)
	if err != nil || v > (1<<63)>>shift {
		return 0, fmt.Errorf("%q: want a size such as 4GiB, 512MiB, 1048576 or 50%%", s)
	}
	return v << shift, nil
}
