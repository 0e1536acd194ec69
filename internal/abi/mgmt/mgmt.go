// SPDX-License-Identifier: Apache-2.0

// Package mgmt is the management and status part of the agent's socket
// protocol (docs/wire-local.md §4.11): the JSON bodies of the VM
// commands — define, create, edit, power on and off — and of status.
// The data-path ABI the verbs need (framing, the verbs commands, the
// rings) is package abi; a verbs client needs nothing from here.
package mgmt

import (
	"github.com/vrdma/vrdma/internal/abi"
)

func init() {
	abi.RegisterRequest(abi.OpDefineVM, func() any { return new(DefineVM) })
	abi.RegisterRequest(abi.OpCreateVM, func() any { return new(CreateVM) })
	abi.RegisterRequest(abi.OpEditVM, func() any { return new(EditVM) })
	abi.RegisterRequest(abi.OpPowerOnVM, func() any { return new(PowerOnVM) })
	abi.RegisterRequest(abi.OpConnectVM, func() any { return new(ConnectAdapter) })
	for _, op := range []abi.Op{abi.OpUndefineVM, abi.OpGetVM, abi.OpPowerOffVM} {
		abi.RegisterRequest(op, func() any { return new(VMRef) })
	}
}

// DefineVM stores (or replaces) a VM's VMX configuration on the agent; the
// VM is then powered on on that agent's host.
type DefineVM struct {
	Name string `json:"name"`
	VMX  string `json:"vmx"`
	// Owner may attach; nil: the caller. Only root (or the agent's user)
	// may name another owner.
	Owner *Owner `json:"owner,omitempty"`
}

// Validate checks the name and size.
func (d *DefineVM) Validate() error {
	if err := abi.ValidName("name", d.Name); err != nil {
		return err
	}
	if len(d.VMX) > 1<<19 {
		return abi.Errorf(abi.CodeInvalid, "vmx", "VMX of %d bytes exceeds the 512 KiB limit", len(d.VMX))
	}
	return nil
}

// Owner is who may use a VM: processes running as UID may attach, and
// those with primary group GID when the VMX grants its group
// (vrdma.groupAttach = "TRUE"); UID may change it. Root may do both.
type Owner struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Placement is where a VM sits in the inventory: a datacenter, a VM
// folder and a resource pool (paths of names separated by '/'). Empty
// fields are not placed.
type Placement struct {
	Datacenter   string `json:"datacenter,omitempty"`
	Folder       string `json:"folder,omitempty"`
	ResourcePool string `json:"resource_pool,omitempty"`
}

// CreateVM creates a powered-off VM with a VMX configuration: in the
// control plane's inventory when the agent has one, else in the agent's
// state directory.
type CreateVM struct {
	Name  string `json:"name"`
	VMX   string `json:"vmx"`
	Owner *Owner `json:"owner,omitempty"` // nil: the caller
	// Host registers the VM on a host (name or ID); "": the agent's.
	Host string `json:"host,omitempty"`
	Placement
}

// Validate checks the name and size.
func (c *CreateVM) Validate() error {
	d := DefineVM{Name: c.Name, VMX: c.VMX}
	return d.Validate()
}

// VMInfo describes a VM: its configuration, power state, placement and
// owner.
type VMInfo struct {
	Name string `json:"name"`
	VMX  string `json:"vmx"`
	// Power is "poweredOn" or "poweredOff".
	Power  string `json:"power"`
	Host   string `json:"host,omitempty"`    // the host it runs or is registered on (name)
	HostID string `json:"host_id,omitempty"` // and its ID
	Owner  Owner  `json:"owner"`
	// Managed: the VM lives in the control plane's inventory (vm create
	// with a control plane) and runs on whichever host it is powered on.
	// Otherwise it lives in this agent's state directory.
	Managed  bool `json:"managed"`
	Attached bool `json:"attached"` // a workload is attached, on this agent
	Placement
}

// EditVM changes a powered-off VM's VMX. The changes apply in order:
// removals, additions, then settings, then the memory reservation; the
// result must be a valid VM and must not break a rule that held before.
type EditVM struct {
	Name string `json:"name"`
	// AddAdapters adds PVRDMA adapters, each at the lowest free ethernetN.
	AddAdapters []NewAdapter `json:"add_adapters,omitempty"`
	// RemoveAdapters removes PVRDMA adapters ethernetN (N as in vrdmaN),
	// with their vrdmaN.* settings.
	RemoveAdapters []int `json:"remove_adapters,omitempty"`
	// Set sets advanced configuration parameters, in order.
	Set []KeyValue `json:"set,omitempty"`
	// Unset removes keys.
	Unset []string `json:"unset,omitempty"`
	// ReserveAllMemory reserves and locks all guest memory:
	// sched.mem.pin = "TRUE", sched.mem.min = sched.mem.minSize = memSize.
	ReserveAllMemory bool `json:"reserve_all_memory,omitempty"`
	// DryRun checks the edit as a save would (the caller's rights, the
	// VM powered off, every rule) and answers what the save would, with
	// the VM as it would be, but stores nothing: the web console's
	// checks before saving.
	DryRun bool `json:"dry_run,omitempty"`
}

// MaxEdits bounds the changes of one EditVM.
const MaxEdits = 256

// Validate checks the name and the number of changes.
func (e *EditVM) Validate() error {
	if err := abi.ValidName("name", e.Name); err != nil {
		return err
	}
	if n := len(e.AddAdapters) + len(e.RemoveAdapters) + len(e.Set) + len(e.Unset); n > MaxEdits {
		return abi.Errorf(abi.CodeInvalid, "set", "%d changes in one edit, more than %d", n, MaxEdits)
	}
	for _, a := range e.AddAdapters {
		if a.PortGroup == "" {
			return abi.Errorf(abi.CodeInvalid, "add_adapters", "a new PVRDMA adapter needs a distributed port group (--portgroup)")
		}
	}
	return nil
}

// NewAdapter is a PVRDMA adapter to add, on a distributed port group.
type NewAdapter struct {
	PortGroup string `json:"portgroup"`        // ethernetN.dvs.portgroupId: the port group's key
	Switch    string `json:"switch,omitempty"` // ethernetN.dvs.switchId; "": the port group's switch's UUID
}

// KeyValue is one VMX setting.
type KeyValue struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Finding is a rule's verdict on a VM (see internal/rules and
// docs/control-plane.md for the rule IDs).
type Finding struct {
	Rule     string `json:"rule"`
	Severity string `json:"severity"` // "error" or "warning"
	Key      string `json:"key,omitempty"`
	Line     int    `json:"line,omitempty"`
	Message  string `json:"message"`
}

// EditReply is the VM after an edit, with what the rules say of it. When
// Refused, nothing changed and Findings holds the errors the edit would
// have introduced.
type EditReply struct {
	VM       VMInfo    `json:"vm"`
	Refused  bool      `json:"refused"`
	Findings []Finding `json:"findings"`
}

// PowerOnVM powers a VM on on a host (name or ID; "": the host it is
// registered on) after every rule passes.
type PowerOnVM struct {
	Name string `json:"name"`
	Host string `json:"host,omitempty"`
}

// Validate checks the name.
func (p *PowerOnVM) Validate() error { return abi.ValidName("name", p.Name) }

// PowerReply reports a power operation. When Refused, nothing changed and
// Findings holds every rule that failed (and the warnings). Changed is
// false when the VM was already in the requested state.
type PowerReply struct {
	VM       VMInfo    `json:"vm"`
	Changed  bool      `json:"changed"`
	Refused  bool      `json:"refused"`
	Findings []Finding `json:"findings"`
	// Detached is set by a power-off that detached a running workload.
	Detached bool `json:"detached,omitempty"`
}

// ConnectAdapter connects or disconnects an adapter of a running VM, as
// the "Connected" box of a network adapter in the vSphere Client does:
// while it is disconnected its port is down.
type ConnectAdapter struct {
	VM        string `json:"vm"`
	Adapter   string `json:"adapter"` // vrdmaN
	Connected bool   `json:"connected"`
}

// Validate checks the names.
func (c *ConnectAdapter) Validate() error {
	if err := abi.ValidName("vm", c.VM); err != nil {
		return err
	}
	return abi.ValidAdapter(c.Adapter)
}

// ConnectReply says what a connect or disconnect did.
type ConnectReply struct {
	VM        string `json:"vm"`
	Adapter   string `json:"adapter"`
	Connected bool   `json:"connected"`
	// Changed is false when the adapter was in that state already.
	Changed bool `json:"changed"`
	// Workloads is how many of the VM's processes were told (their
	// contexts get IBV_EVENT_PORT_ERR or IBV_EVENT_PORT_ACTIVE).
	Workloads int `json:"workloads"`
}

// VMRef names a VM.
type VMRef struct {
	Name string `json:"name"`
}

// Validate checks the name.
func (v *VMRef) Validate() error { return abi.ValidName("name", v.Name) }

// VMList lists the VMs an agent knows.
type VMList struct {
	VMs []VMStatus `json:"vms"`
}

// QPStatus is one QP in a status report.
type QPStatus struct {
	QPN     uint32       `json:"qpn"`
	Adapter string       `json:"adapter"`
	State   string       `json:"state"`
	Peer    string       `json:"peer,omitempty"`
	PeerQPN uint32       `json:"peer_qpn,omitempty"`
	Path    abi.PathInfo `json:"path"`
	// PID is the workload process that created the QP.
	PID int32 `json:"pid,omitempty"`
	// Counters are the QP's RC statistics since it was created (a move
	// to RESET does not clear them), named after rxe's hardware counters.
	Counters QPCounters `json:"counters"`
	// InFlight is how many work requests the QP's path has taken from
	// the send queue and not completed yet: in its window, or waiting
	// out an RNR or retry delay.
	InFlight int `json:"in_flight,omitempty"`
}

// QPCounters are one QP's RC statistics: the requester's retries and
// the responder's refusals, so that the RC rules can be observed (and
// tested by counting attempts).
type QPCounters struct {
	// Requester side.
	TransportRetries uint64 `json:"transport_retries"` // requests sent again after a timeout, NO_QP or sequence error
	RNRNaksReceived  uint64 `json:"rnr_naks_received"` // RNR NAKs its requests got (rxe: rcvd_rnr_err)
	RdAtomicPeak     uint32 `json:"rd_atomic_peak"`    // most RDMA READs and atomics it had outstanding at once (≤ max_rd_atomic)
	// Responder side.
	RNRNaksSent      uint64 `json:"rnr_naks_sent"`       // requests it answered RNR: no receive posted, or its receive CQ full (rxe: send_rnr_err)
	RequestsDropped  uint64 `json:"requests_dropped"`    // requests it ignored: outside RTR..SQD, or from a QP it is not connected to
	DuplicateRequest uint64 `json:"duplicate_requests"`  // retried requests it had executed already, answered again (rxe: duplicate_request)
	OutOfSeqRequest  uint64 `json:"out_of_seq_requests"` // requests past the expected PSN, answered with a sequence error (rxe: out_of_seq_request)
	// The work done.
	Ops         map[string]uint64 `json:"ops,omitempty"`         // send-queue work requests completed successfully, by opcode (RDMA_WRITE, …)
	SendBytes   uint64            `json:"send_bytes"`            // the bytes they moved: sent, written or read
	Recvs       uint64            `json:"recvs"`                 // receives completed successfully
	RecvBytes   uint64            `json:"recv_bytes"`            // their bytes
	Completions map[string]uint64 `json:"completions,omitempty"` // completions of both queues by status (SUCCESS, WR_FLUSH_ERR, …)
	Doorbells   uint64            `json:"doorbells"`             // times the send queue slept until its doorbell rang (doorbell mode)
	PollNanos   uint64            `json:"poll_ns"`               // time it polled for work before sleeping, ns (doorbell mode)
}

// Add adds o's counts to c; RdAtomicPeak becomes the larger of the two.
func (c *QPCounters) Add(o QPCounters) {
	c.TransportRetries += o.TransportRetries
	c.RNRNaksReceived += o.RNRNaksReceived
	c.RdAtomicPeak = max(c.RdAtomicPeak, o.RdAtomicPeak)
	c.RNRNaksSent += o.RNRNaksSent
	c.RequestsDropped += o.RequestsDropped
	c.DuplicateRequest += o.DuplicateRequest
	c.OutOfSeqRequest += o.OutOfSeqRequest
	c.SendBytes += o.SendBytes
	c.Recvs += o.Recvs
	c.RecvBytes += o.RecvBytes
	c.Doorbells += o.Doorbells
	c.PollNanos += o.PollNanos
	c.Ops = addCounts(c.Ops, o.Ops)
	c.Completions = addCounts(c.Completions, o.Completions)
}

func addCounts(to, from map[string]uint64) map[string]uint64 {
	for k, n := range from {
		if to == nil {
			to = map[string]uint64{}
		}
		to[k] += n
	}
	return to
}

// AdapterCounters are an adapter's counters: the sums of its QPs', the
// destroyed ones' included.
type AdapterCounters struct {
	Adapter  string     `json:"adapter"`
	Counters QPCounters `json:"counters"`
}

// ProcessResources counts the verbs objects one workload process of a
// VM holds on one adapter, as rdma res counts a device's.
type ProcessResources struct {
	PID     int32  `json:"pid"`
	Adapter string `json:"adapter"`
	PDs     int    `json:"pds"`
	MRs     int    `json:"mrs"`
	MRBytes uint64 `json:"mr_bytes"` // the length of its memory regions, added up
	CQs     int    `json:"cqs"`
	QPs     int    `json:"qps"`
	SRQs    int    `json:"srqs"`
}

// VMStatus is one VM in a status report.
type VMStatus struct {
	Name      string `json:"name"`
	Attached  bool   `json:"attached"`
	Power     string `json:"power,omitempty"` // "poweredOn" or "poweredOff"
	AsyncMode bool   `json:"async_mode"`
	MemSize   uint64 `json:"mem_size"`
	MemLocked bool   `json:"mem_locked"`
	// MemReserved says the VMX reserves and locks all guest memory
	// (sched.mem.pin, sched.mem.min >= memSize): attaching the VM locks
	// MemSize bytes in the agent, against its RLIMIT_MEMLOCK.
	MemReserved bool `json:"mem_reserved,omitempty"`
	// Processes are the attached VM's workloads' process IDs: several
	// processes may attach one VM, as they open one device.
	Processes []int32 `json:"processes,omitempty"`
	// MemRegistered is the guest memory their memory regions cover
	// (overlaps once per process), which memSize bounds.
	MemRegistered uint64            `json:"mem_registered,omitempty"`
	Adapters      []abi.AdapterInfo `json:"adapters"`
	// Netns is the attached VM's network namespace on this host (a name
	// in /run/netns; vrdmad --vm-netns), where interface vrdmaN carries
	// adapter N's addresses; "" without one.
	Netns string     `json:"netns,omitempty"`
	QPs   []QPStatus `json:"qps,omitempty"`
	// AdapterCounters are the attached VM's adapters' counters.
	AdapterCounters []AdapterCounters `json:"adapter_counters,omitempty"`
	// Resources count the verbs objects each workload process holds on
	// each adapter (vrdmactl res).
	Resources []ProcessResources `json:"resources,omitempty"`
	// ObjectsHidden says the report leaves out the VM's processes,
	// registered memory, QPs and counters: the VM is another user's, and
	// only its owner, root and the agent's user see them.
	ObjectsHidden bool `json:"objects_hidden,omitempty"`
}

// Status is an agent's status report.
type Status struct {
	Host   string     `json:"host"`
	HostID string     `json:"host_id"`
	VMs    []VMStatus `json:"vms"`
	// PVRDMA is the host's end of the tcp path; nil without a control
	// plane.
	PVRDMA *PVRDMAStatus `json:"pvrdma,omitempty"`
	// Uplinks are the host's links to other hosts (the tcp path).
	Uplinks []UplinkStatus `json:"uplinks,omitempty"`
	// RDMA are the host's RDMA uplinks (the rdma path).
	RDMA []RDMAStatus `json:"rdma,omitempty"`
	// DatagramsDropped counts the UD datagrams this host dropped at their
	// destination, on every path: to a QPN that is no UD QP of the
	// adapter they name, with another Q_Key, from a source that may not
	// reach it, with no receive posted or the CQ full. Those for a QP are
	// also in its requests_dropped.
	DatagramsDropped uint64 `json:"datagrams_dropped,omitempty"`
	// Decision and connect counters (metrics): since the agent started.
	// PathDecisions count the paths the agent decided, for QPs and
	// address handles, and the refusals; Connects count connection
	// management's connects, those this host's workloads dialed and the
	// requests to its listeners. (The tcp path's own connects are per
	// peer host, in Uplinks.)
	PathDecisions []PathDecisionCount `json:"path_decisions,omitempty"`
	Connects      []ConnectCount      `json:"connects,omitempty"`
}

// PathDecisionCount counts the agent's path decisions of one kind: for
// one object, a path chosen or, when Path is "", no path, refused for
// Reason. A connect's target is counted only when refused (its QPs'
// decisions count the paths).
type PathDecisionCount struct {
	Object string `json:"object"`           // "qp" (a QP moving to RTR), "ah" (an address handle) or "connect" (a connect's target, refused before any QP moved)
	Path   string `json:"path,omitempty"`   // the path chosen (memcpy, tcp, rdma); "" for a refusal
	Reason string `json:"reason,omitempty"` // a refusal's rule or cause (vlan_isolation, address_unique, unavailable, ...); "" for a path chosen
	Count  uint64 `json:"count"`
}

// ConnectCount counts connection management's connects of one side by
// result.
type ConnectCount struct {
	// Side is "dial" (connects this host's workloads dialed) or "accept"
	// (requests to this host's listeners, from this host or another).
	Side string `json:"side"`
	// Result: a dial is established, rejected (the listener's side sent
	// a reject, or nothing listens), unreachable (no path to the remote
	// end, or it is nowhere), timeout or error (a bad request); a request
	// is accepted, rejected (by the listener's workload, or the listener
	// closed) or abandoned (its dialer gave up first).
	Result string `json:"result"`
	Count  uint64 `json:"count"`
}

// UplinkStatus describes the agent's traffic with one other host over the
// tcp path: the connections it opened to the peer (requests out,
// responses in) and those the peer opened to it (requests in, responses
// out), with byte and frame counters that only grow.
type UplinkStatus struct {
	PeerHostID string `json:"peer_host_id"`
	PeerHost   string `json:"peer_host"`
	Address    string `json:"address"` // the peer's PVRDMA address:port
	State      string `json:"state"`   // "up": a connection is open; "idle"; "down": the last attempt failed
	Conns      int    `json:"conns"`   // open connections, both directions
	BytesOut   uint64 `json:"bytes_out"`
	BytesIn    uint64 `json:"bytes_in"`
	FramesOut  uint64 `json:"frames_out"`
	FramesIn   uint64 `json:"frames_in"`
	Dials      uint64 `json:"dials"`   // connections opened to the peer
	Refused    uint64 `json:"refused"` // handshakes refused, either side
	// Panics counts the connections with the peer closed because a
	// goroutine serving them panicked: a bug reached by the peer's input,
	// logged with its stack; the agent went on.
	Panics    uint64 `json:"panics,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Connects by side and result (metrics); Dials and Refused above are
	// their sums (Dials also counts those under way). DialsEstablished,
	// DialsRefused and DialsFailed: this host's dials whose handshake
	// succeeded, those refused (by either host's rule), and those that
	// failed (no answer, a broken handshake). Accepted and
	// AcceptsRefused: connections the peer opened to this host that it
	// accepted, and those it refused.
	DialsEstablished uint64 `json:"dials_established"`
	DialsRefused     uint64 `json:"dials_refused"`
	DialsFailed      uint64 `json:"dials_failed"`
	Accepted         uint64 `json:"accepted"`
	AcceptsRefused   uint64 `json:"accepts_refused"`
	// Multi-lane tcp: Lanes is how many connections this host's requests
	// to the peer may be striped over (its open connection's, the first
	// included; 0 when none is open); StripedBatches counts the batches of
	// requests written striped over them.
	Lanes          int    `json:"lanes,omitempty"`
	StripedBatches uint64 `json:"striped_batches,omitempty"`
}

// RDMAStatus describes one of the host's RDMA uplinks: its RoCEv2
// engine's address and packet counters.
type RDMAStatus struct {
	Address     string `json:"address"`        // the uplink's address:port (UDP 4791); RoCE v1: its interface, MAC and GID
	RoCE        string `json:"roce,omitempty"` // "v2" (UDP datagrams) or "v1" (Ethernet frames, Ethertype 0x8915)
	PacketsOut  uint64 `json:"packets_out"`
	PacketsIn   uint64 `json:"packets_in"`
	BytesOut    uint64 `json:"bytes_out"` // UDP payload bytes
	BytesIn     uint64 `json:"bytes_in"`
	Retransmits uint64 `json:"retransmits"`      // packets sent again (go-back-N)
	SeqErrNaks  uint64 `json:"seq_err_naks"`     // PSN sequence error NAKs received
	BadICRC     uint64 `json:"bad_icrc"`         // dropped: the ICRC did not match
	Malformed   uint64 `json:"malformed"`        // dropped: headers that do not parse
	Panics      uint64 `json:"panics,omitempty"` // dropped: serving it panicked (a bug, logged with its stack; the engine went on)
	NoQP        uint64 `json:"no_qp"`            // dropped: no QP of this path with that number facing the sender (from an uplink of the switch; the others are NotVRDMA)
	BatchesOut  uint64 `json:"batches_out"`      // sendmsg calls that carried several packets (UDP GSO)
	BatchesIn   uint64 `json:"batches_in"`       // datagrams read that held several packets (UDP GRO)
	// Native endpoints (isolation): NotVRDMA counts the packets dropped,
	// unanswered, because their source address (RoCE v1: source GID) is
	// no RDMA uplink of a host of this host's switch: a peer that is not
	// a vrdma VM, which no adapter without native endpoints answers.
	// They are not in NoQP.
	NotVRDMA uint64 `json:"not_vrdma"`
	// RDMA CM over QP1 with native endpoints (RoCE v2 only): the CM MADs
	// received and sent; those dropped (malformed, for no connection,
	// spoofed, out of state); resent ones the peer sent again; the
	// engine's own resends; connections that timed out after the last;
	// REJs sent; and REQs refused because only adapters without native
	// endpoints listen on their port.
	CMIn               uint64 `json:"cm_in"`
	CMOut              uint64 `json:"cm_out"`
	CMDropped          uint64 `json:"cm_dropped"`
	CMDuplicates       uint64 `json:"cm_duplicates"`
	CMResent           uint64 `json:"cm_resent"`
	CMTimedOut         uint64 `json:"cm_timed_out"`
	CMRejected         uint64 `json:"cm_rejected"`
	CMRefusedNotNative uint64 `json:"cm_refused_not_native"`
}

// PVRDMAStatus describes the host's end of the tcp path, as its agent
// applies its host record: the tagged PVRDMA address, where the agent
// listens, and the pvrdma firewall rule.
type PVRDMAStatus struct {
	Address   string `json:"address,omitempty"`   // the host record's PVRDMA address:port
	Listening string `json:"listening,omitempty"` // where the agent accepts other hosts' connections
	Firewall  bool   `json:"firewall"`            // the pvrdma firewall rule is on
	Error     string `json:"error,omitempty"`     // why it does not listen on Address
	// HandshakePanics counts accepted connections closed because their
	// handshake panicked (a bug, logged with its stack; the agent went
	// on).
	HandshakePanics uint64 `json:"handshake_panics,omitempty"`
	// AcceptRefused counts connections reset at accept because their
	// source address is not the PVRDMA address of a host of this host's
	// switch (or the host records could not be read to tell).
	AcceptRefused uint64 `json:"accept_refused,omitempty"`
	// SourceSlotsFull counts connections reset at accept because their
	// source address already had every handshake slot one source may
	// hold (4); HandshakeSlotsFull those reset because every slot of the
	// agent was taken (64).
	SourceSlotsFull    uint64 `json:"source_slots_full,omitempty"`
	HandshakeSlotsFull uint64 `json:"handshake_slots_full,omitempty"`
}
