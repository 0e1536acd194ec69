// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
)

// pairSpec is one pair quickstart checks: two adapters that must connect
// over a given path.
type pairSpec struct {
	A, B string         // "vm/vrdmaN"; A dials B
	Path vrdma.PathKind // the path the pair must get
}

var quickstartPairs = []pairSpec{
	{A: "vm1/vrdma0", B: "vm2/vrdma0", Path: vrdma.PathMemcpy},       // both on host1
	{A: "vm1/vrdma0", B: "vm3/vrdma0", Path: vrdma.PathTCP},          // host1 → host2
	{A: "vm4/vrdma0", B: "vm5/vrdma0", Path: vrdma.PathRDMA},         // host3 → host4, both with an RDMA uplink
	{A: "vm6/vrdma0", B: "vm7/vrdma0", Path: vrdma.PathMemcpyDirect}, // both on host1, listing each other in vrdma.directPeers
}

// quickstartVMs are the VMs quickstart defines, the index in
// quickstartHosts of the host of each, and its vrdma.directPeers.
var quickstartVMs = []struct {
	Name        string
	Host        int
	DirectPeers []string
}{{"vm1", 0, nil}, {"vm2", 0, nil}, {"vm3", 1, nil}, {"vm4", 2, nil}, {"vm5", 3, nil}, {"vm6", 0, []string{"vm7"}}, {"vm7", 0, []string{"vm6"}}}

// quickstartVMMB is each quickstart VM's guest memory by default
// (--memory): enough for perftest's -a (ib_write_bw registers two 8 MiB
// buffers), rdma-core's test suite and UCX (rc_verbs registers a 36 MiB
// pool, ud_verbs more). Reserved and locked where the memlock limit
// allows; an unprivileged user's 8 MiB RLIMIT_MEMLOCK does not, and then
// the VMs run unlocked (a note says so).
const quickstartVMMB = 256

// quickstartMaxMB bounds --memory: seven VMs of it are mapped at once.
const quickstartMaxMB = 4096

// Samples quickstart measures on each pair.
var (
	quickstartBW  = perf.Config{Test: perf.WriteBW, Size: 64 << 10, Duration: 300 * time.Millisecond}
	quickstartLat = perf.Config{Test: perf.WriteLat, Size: 8, Iters: 2000}
)

// quickstartReport is quickstart's result (-o json prints it).
type quickstartReport struct {
	OK           bool             `json:"ok"`
	Agent        string           `json:"agent"`     // which binary the agents run, and why that one
	AgentPID     int              `json:"agent_pid"` // the first host's agent
	Host         string           `json:"host"`      // the first host's name
	Hosts        []quickstartHost `json:"hosts"`
	MemoryLocked bool             `json:"memory_locked"`
	Switch       string           `json:"switch,omitempty"`     // created in the first host's control plane
	PortGroup    string           `json:"port_group,omitempty"` // created on Switch; the VMs' adapters are on it
	Notes        []string         `json:"notes,omitempty"`
	Pairs        []pairReport     `json:"pairs"`
	ElapsedS     float64          `json:"elapsed_s"`
	Error        string           `json:"error,omitempty"`
}

// quickstartHost is one host agent quickstart started.
type quickstartHost struct {
	Name          string   `json:"name"`
	PID           int      `json:"pid,omitempty"`
	PVRDMAAddress string   `json:"pvrdma_address"`        // where it listens for the tcp path
	ControlPlane  string   `json:"control_plane"`         // "embedded etcd" or "joined ENDPOINT"
	RDMAUplink    string   `json:"rdma_uplink,omitempty"` // its software RoCEv2 uplink, ADDRESS:4791
	VMs           []string `json:"vms"`
	Error         string   `json:"error,omitempty"` // why it did not start
}

type pairReport struct {
	A     string `json:"a"`
	B     string `json:"b"`
	HostA string `json:"host_a"`
	HostB string `json:"host_b"`
	// AddressA and AddressB are the adapters' IPv4 addresses on the
	// port group, what rdma_cm resolves ("" for none).
	AddressA string            `json:"address_a,omitempty"`
	AddressB string            `json:"address_b,omitempty"`
	Path     string            `json:"path"`
	Want     string            `json:"want_path"`
	Reason   string            `json:"reason"`
	Opcodes  map[string]string `json:"opcodes"` // opcode → "ok" or what went wrong
	BWMiBs   float64           `json:"bw_mib_s"`
	LatUs    float64           `json:"lat_us"`
	OK       bool              `json:"ok"`
	Errors   []string          `json:"errors,omitempty"`
}

func (a *app) quickstartCommand() *cobra.Command {
	var keep bool
	memMB := quickstartVMMB
	cmd := &cobra.Command{
		Use:   "quickstart",
		Short: "Start four throw-away host agents with seven VMs and show RDMA between them",
		Long: `quickstart shows vrdma working on this machine, with no root, no installed
agent and nothing left behind. It starts four host agent processes with
temporary state (vrdmad next to vrdmactl or on PATH, else vrdmactl itself),
each a host on its own loopback address: host1 on 127.0.0.2 with its embedded
control plane (etcd), and host2, host3 and host4 on 127.0.0.3, .4 and .5
joined to it; host3 and host4 have a software RoCEv2 uplink on their address
(UDP 4791), declared lossless, the others none. It creates a distributed
switch and a port group (quickstart-dvs, dvportgroup-quickstart, VLAN 100),
defines VMs on them, vm1, vm2, vm6 and vm7 on host1, vm3 on host2, vm4 on
host3 and vm5 on host4, with 256 MiB of guest memory each (--memory; reserved
and locked when the memlock limit allows), vm6 and vm7 listing each other in
vrdma.directPeers, each adapter with an address of the port group's subnet
(10.77.0.0/24, only inside vrdma), attaches a workload to each, and connects
four pairs through the connection manager: vm1/vrdma0 to vm2/vrdma0 (same
host: the memcpy path, the agent copies), vm1/vrdma0 to vm3/vrdma0 (different
hosts: the tcp path), vm4/vrdma0 to vm5/vrdma0 (different hosts with RDMA
uplinks: the rdma path, the agents' RoCEv2 engines) and vm6/vrdma0 to
vm7/vrdma0 (same host, direct peers: the memcpy-direct path, the libraries
copy). On each pair it
runs every opcode (SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM,
RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD) checking the data,
measures a short bandwidth (64 KiB RDMA WRITEs) and latency (8-byte RDMA
WRITE ping-pong) sample, prints the path each pair took and why, and removes
everything. It exits 1 if anything failed.

With --keep it then keeps the hosts and the VMs (none of them attached) until
interrupted (SIGINT or SIGTERM): it prints "ready" on a line of its own, the
line to source that points vrdmactl at its first host (VRDMA_SOCKET and
VRDMA_STATE_DIR: vm list, status, portgroup list then work on the lab),
then, for each pair, the vrdmactl exec commands that run unmodified
programs across it on the drop-in libibverbs and librdmacm, the server in
the pair's second VM, the client in its first: ib_write_bw -a (perftest,
every size to 8 MiB) and rping to the server adapter's address.`,
		Example: `  vrdmactl quickstart
  vrdmactl quickstart -o json
  vrdmactl quickstart --keep --memory 256`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			progress := io.Discard
			if !a.json() {
				progress = a.stdout
			}
			if memMB < 3 || memMB > quickstartMaxMB {
				return usageErrorf("quickstart: --memory %d: give each VM 3 to %d MiB of guest memory", memMB, quickstartMaxMB)
			}
			var hold func([]*localHost, []pairReport)
			if keep && a.json() {
				return usageErrorf("quickstart --keep prints the commands to run, not JSON: drop -o json")
			}
			if keep {
				sig, stop := signal.NotifyContext(context.WithoutCancel(cmd.Context()), os.Interrupt, syscall.SIGTERM)
				defer stop()
				hold = func(hosts []*localHost, pairs []pairReport) { a.holdQuickstart(sig, hosts, pairs) }
			}
			rep := a.quickstart(ctx, progress, memMB, hold)
			if a.json() {
				if err := a.printJSON(rep); err != nil {
					return err
				}
			} else {
				printQuickstart(a.stdout, rep)
			}
			if !rep.OK {
				if rep.Error != "" && a.json() {
					return &exitError{code: exitFailure, err: fmt.Errorf("quickstart: %s", rep.Error)}
				}
				return &exitError{code: exitFailure}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the hosts and VMs until interrupted, and print the commands that run ib_write_bw and rping across each pair")
	cmd.Flags().IntVar(&memMB, "memory", quickstartVMMB, "MiB of guest memory of each VM (3 to 4096)")
	return cmd
}

// holdQuickstart prints "ready", the environment line that points
// vrdmactl at the first host, and the commands that run ib_write_bw and
// rping across each pair, then waits for sig.
func (a *app) holdQuickstart(sig context.Context, hosts []*localHost, pairs []pairReport) {
	self := "vrdmactl"
	if _, err := exec.LookPath(self); err != nil {
		if exe, err := os.Executable(); err == nil {
			self = exe
		}
	}
	socket := func(adapter string) string {
		name := strings.SplitN(adapter, "/", 2)[0]
		for _, v := range quickstartVMs {
			if v.Name == name && hosts[v.Host] != nil {
				return hosts[v.Host].Socket
			}
		}
		return ""
	}
	w := a.stdout
	fmt.Fprintln(w, "ready")
	fmt.Fprintf(w, "# the lab's control plane and first host, for vrdmactl vm list, status, portgroup list:\n")
	fmt.Fprintf(w, "export VRDMA_SOCKET=%s VRDMA_STATE_DIR=%s\n", hosts[0].Socket, hosts[0].StateDir())
	for _, p := range pairs {
		vmA, adA, _ := strings.Cut(p.A, "/")
		vmB, adB, _ := strings.Cut(p.B, "/")
		fmt.Fprintf(w, "# %s: %s (%s, %s) → %s (%s, %s)\n", p.Path, p.A, p.HostA, p.AddressA, p.B, p.HostB, p.AddressB)
		fmt.Fprintf(w, "%s --socket %s exec --vm %s -- ib_write_bw -a -d %s -x 0 &\n", self, socket(p.B), vmB, adB)
		fmt.Fprintf(w, "%s --socket %s exec --vm %s -- ib_write_bw -a -d %s -x 0 localhost\n", self, socket(p.A), vmA, adA)
		fmt.Fprintf(w, "%s --socket %s exec --vm %s -- rping -s -a %s -C 10 &\n", self, socket(p.B), vmB, p.AddressB)
		fmt.Fprintf(w, "%s --socket %s exec --vm %s -- rping -c -a %s -C 10 -v\n", self, socket(p.A), vmA, p.AddressB)
	}
	fmt.Fprintln(w, "# interrupt (Ctrl-C) to stop the hosts and remove everything")
	<-sig.Done()
}

// quickstart runs everything and reports; it never leaves an agent or its
// directory behind. With hold, a run whose pairs all worked detaches its
// workloads and calls hold with the hosts before it stops them.
func (a *app) quickstart(ctx context.Context, progress io.Writer, memMB int, hold func([]*localHost, []pairReport)) (rep quickstartReport) {
	start := time.Now()
	defer func() { rep.ElapsedS = round2(time.Since(start).Seconds()) }()
	fail := func(err error) quickstartReport {
		rep.OK, rep.Error = false, err.Error()
		return rep
	}
	hosts := make([]*localHost, len(quickstartHosts))
	hostErrs := make([]error, len(quickstartHosts))
	rep.Hosts = make([]quickstartHost, len(quickstartHosts))
	for i, s := range quickstartHosts {
		rep.Hosts[i] = quickstartHost{Name: s.Name, PVRDMAAddress: s.Addr.String()}
		if s.RDMA {
			rep.Hosts[i].RDMAUplink = netip.AddrPortFrom(s.Addr.Addr(), 4791).String()
		}
		for _, v := range quickstartVMs {
			if v.Host == i {
				rep.Hosts[i].VMs = append(rep.Hosts[i].VMs, v.Name)
			}
		}
	}
	// The last host first: the first serves the others' etcd.
	defer func() {
		for i := len(hosts) - 1; i >= 0; i-- {
			if hosts[i] == nil {
				continue
			}
			if err := hosts[i].Close(); err != nil {
				rep.Notes = append(rep.Notes, fmt.Sprintf("stopping host %s's agent: %v", hosts[i].Name, err))
			}
		}
	}()

	// host1, with the embedded etcd; nothing works without it.
	hs := quickstartHosts[0]
	fmt.Fprintf(progress, "starting host agent %s on %s with temporary state and an embedded control plane (etcd)… ", hs.Name, hs.Addr.Addr())
	h, err := startLocalHost(ctx, hs, quickstartSwitch, "")
	if err != nil {
		fmt.Fprintln(progress, "failed")
		return fail(err)
	}
	hosts[0] = h
	rep.Agent, rep.AgentPID, rep.Host = h.How, h.PID(), h.Name
	rep.Hosts[0].PID, rep.Hosts[0].PVRDMAAddress, rep.Hosts[0].ControlPlane = h.PID(), h.Addr.String(), "embedded etcd"
	fmt.Fprintf(progress, "pid %d, %s\n", h.PID(), h.How)
	endpoint, err := h.etcdEndpoint()
	if err != nil {
		return fail(err)
	}

	fmt.Fprintf(progress, "creating switch %s and port group %s in its control plane… ", quickstartSwitch, quickstartPortGroup)
	if err := createLocalFabric(ctx, endpoint, quickstartSwitch, quickstartPortGroup); err != nil {
		fmt.Fprintln(progress, "failed")
		return fail(err)
	}
	rep.Switch, rep.PortGroup = quickstartSwitch, quickstartPortGroup
	fmt.Fprintln(progress, "ok")

	// The other hosts, joined to host1's etcd. One that does not start
	// fails the pairs with its VMs, not the others.
	for i, hs := range quickstartHosts[1:] {
		i++
		uplink := "no RDMA uplink"
		if hs.RDMA {
			uplink = "a software RoCEv2 uplink on " + hs.Addr.Addr().String() + ":4791"
		}
		fmt.Fprintf(progress, "starting host agent %s on %s, joined to %s's control plane, %s… ", hs.Name, hs.Addr.Addr(), hosts[0].Name, uplink)
		h, err := startLocalHost(ctx, hs, quickstartSwitch, endpoint)
		if err != nil {
			fmt.Fprintln(progress, "failed")
			hostErrs[i] = err
			rep.Hosts[i].Error = err.Error()
			continue
		}
		hosts[i] = h
		rep.Hosts[i].PID, rep.Hosts[i].PVRDMAAddress, rep.Hosts[i].ControlPlane = h.PID(), h.Addr.String(), "joined "+endpoint
		fmt.Fprintf(progress, "pid %d\n", h.PID())
	}

	var specs []*localVM
	var where []string
	for i, hr := range rep.Hosts {
		if hosts[i] != nil && len(hr.VMs) > 0 {
			where = append(where, andList(hr.VMs)+" on "+hr.Name)
		}
	}
	fmt.Fprintf(progress, "defining and attaching VMs %s (%d MiB of guest memory each)… ", strings.Join(where, ", "), memMB)
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	byName := map[string]*vrdma.VM{}
	defer func() {
		for _, v := range byName {
			v.Close()
		}
	}()
	for i, h := range hosts {
		if h == nil {
			continue
		}
		var hspecs []*localVM
		for _, v := range quickstartVMs {
			if v.Host == i {
				s := &localVM{Name: v.Name, MemMB: memMB, Locked: true, DirectPeers: v.DirectPeers, Switch: quickstartSwitch, PortGroup: quickstartPortGroup}
				hspecs = append(hspecs, s)
			}
		}
		vms, notes, err := openLocalVMs(octx, h.Socket, "vrdmactl quickstart", hspecs)
		rep.Notes = append(rep.Notes, notes...)
		for _, v := range vms {
			byName[v.Name()] = v
		}
		if err != nil {
			cancel()
			fmt.Fprintln(progress, "failed")
			return fail(fmt.Errorf("host %s: %w", h.Name, err))
		}
		specs = append(specs, hspecs...)
	}
	cancel()
	var locked, unlocked []string
	for _, s := range specs {
		if s.Locked {
			locked = append(locked, s.Name)
		} else {
			unlocked = append(unlocked, s.Name)
		}
	}
	rep.MemoryLocked = len(unlocked) == 0
	switch {
	case rep.MemoryLocked:
		fmt.Fprintln(progress, "reserved and locked")
	case len(locked) == 0:
		fmt.Fprintln(progress, "unlocked")
	default:
		fmt.Fprintf(progress, "%s locked, %s unlocked\n", strings.Join(locked, ", "), strings.Join(unlocked, ", "))
	}

	rep.OK = true
	for _, ps := range quickstartPairs {
		fmt.Fprintf(progress, "pair %s → %s: ", ps.A, ps.B)
		var pr pairReport
		if err := pairHostsErr(ps, hostErrs); err != nil {
			pr = pairReport{A: ps.A, B: ps.B, Want: string(ps.Path), Opcodes: map[string]string{}, Errors: []string{err.Error()}}
		} else {
			pr = runQuickstartPair(ctx, ps, byName)
		}
		pr.HostA, pr.HostB = vmHost(ps.A), vmHost(ps.B)
		pr.AddressA, pr.AddressB = adapterAddr(ps.A, byName), adapterAddr(ps.B, byName)
		if pr.OK {
			fmt.Fprintln(progress, "ok")
		} else {
			fmt.Fprintln(progress, "FAILED")
		}
		rep.Pairs = append(rep.Pairs, pr)
		rep.OK = rep.OK && pr.OK
	}
	if hold != nil && rep.OK {
		for name, v := range byName {
			v.Close()
			delete(byName, name)
		}
		hold(hosts, rep.Pairs)
	}
	return rep
}

// andList joins names as a sentence does: "a", "a and b", "a, b and c".
func andList(names []string) string {
	if len(names) <= 1 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// adapterAddr returns the IPv4 address of adapter "vm/vrdmaN" among the
// attached VMs, "" when it has none.
func adapterAddr(name string, vms map[string]*vrdma.VM) string {
	ad, err := adapterOf(name, vms)
	if err != nil || !ad.IPv4().IsValid() {
		return ""
	}
	return ad.IPv4().String()
}

// vmHost returns the name of the host of adapter "vm/vrdmaN".
func vmHost(adapter string) string {
	vm, _, _ := strings.Cut(adapter, "/")
	for _, v := range quickstartVMs {
		if v.Name == vm {
			return quickstartHosts[v.Host].Name
		}
	}
	return ""
}

// pairHostsErr returns why a host of the pair's VMs did not start, nil
// if both did.
func pairHostsErr(ps pairSpec, hostErrs []error) error {
	for _, ad := range []string{ps.A, ps.B} {
		vm, _, _ := strings.Cut(ad, "/")
		for _, v := range quickstartVMs {
			if v.Name == vm && hostErrs[v.Host] != nil {
				return fmt.Errorf("%s's host did not start: %w", vm, hostErrs[v.Host])
			}
		}
	}
	return nil
}

// adapterOf resolves "vm/vrdmaN" among the attached VMs.
func adapterOf(name string, vms map[string]*vrdma.VM) (*vrdma.Adapter, error) {
	vm, ad, ok := strings.Cut(name, "/")
	v := vms[vm]
	if !ok || v == nil {
		return nil, fmt.Errorf("no attached VM for %q", name)
	}
	return v.Adapter(ad)
}

func runQuickstartPair(ctx context.Context, ps pairSpec, vms map[string]*vrdma.VM) pairReport {
	pr := pairReport{A: ps.A, B: ps.B, Want: string(ps.Path), Opcodes: map[string]string{}}
	fail := func(format string, args ...any) pairReport {
		pr.Errors = append(pr.Errors, fmt.Sprintf(format, args...))
		pr.OK = false
		return pr
	}
	adA, err := adapterOf(ps.A, vms)
	if err != nil {
		return fail("%v", err)
	}
	adB, err := adapterOf(ps.B, vms)
	if err != nil {
		return fail("%v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	p, err := perf.Connect(cctx, adA, adB, perf.PairConfig{BufSize: 2 * quickstartBW.Size, MaxInline: 220})
	cancel()
	if err != nil {
		return fail("connect: %v", err)
	}
	defer p.Close(context.WithoutCancel(ctx))
	path := p.Path()
	pr.Path, pr.Reason = string(path.Path), path.Reason
	pr.OK = true
	if path.Path != ps.Path {
		fail("got path %q, want %q", path.Path, ps.Path)
	}
	opsOK := true
	for _, r := range p.CheckOpcodes(ctx) {
		if r.Err != nil {
			pr.Opcodes[r.Opcode.String()] = r.Err.Error()
			fail("%s: %v", r.Opcode, r.Err)
			opsOK = false
		} else {
			pr.Opcodes[r.Opcode.String()] = "ok"
		}
	}
	if !opsOK {
		return fail("bandwidth and latency not measured: an opcode failed")
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	defer shareOneCore()()
	if r, err := p.Run(rctx, quickstartBW); err != nil {
		fail("bandwidth: %v", err)
	} else {
		pr.BWMiBs = round2(r.BWAvg)
	}
	if r, err := p.Run(rctx, quickstartLat); err != nil {
		fail("latency: %v", err)
	} else {
		pr.LatUs = round2(r.TTypical)
	}
	return pr
}

func printQuickstart(w io.Writer, rep quickstartReport) {
	fmt.Fprintln(w)
	if len(rep.Pairs) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PAIR\tHOSTS\tPATH\tRESULT\tREASON")
		for _, p := range rep.Pairs {
			ok := 0
			for _, v := range p.Opcodes {
				if v == "ok" {
					ok++
				}
			}
			res := fmt.Sprintf("%d/%d opcodes ok", ok, len(perf.Opcodes))
			if p.BWMiBs > 0 {
				res += fmt.Sprintf(", %.0f MiB/s", p.BWMiBs)
			}
			if p.LatUs > 0 {
				res += fmt.Sprintf(", %.1f µs", p.LatUs)
			}
			path := p.Path
			if path == "" {
				path = "-"
			}
			fmt.Fprintf(tw, "%s → %s\t%s → %s\t%s\t%s\t%s\n", p.A, p.B, p.HostA, p.HostB, path, res, p.Reason)
		}
		tw.Flush()
		fmt.Fprintf(w, "(bandwidth: %d KiB RDMA WRITEs for %v; latency: typical of %d %d-byte RDMA WRITE ping-pongs, RTT/2)\n",
			quickstartBW.Size>>10, quickstartBW.Duration, quickstartLat.Iters, quickstartLat.Size)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, h := range rep.Hosts {
		if h.Error != "" {
			fmt.Fprintf(w, "FAIL %s\n", h.Error) // "host NAME: ..."
		}
	}
	for _, p := range rep.Pairs {
		for _, e := range p.Errors {
			fmt.Fprintf(w, "FAIL %s → %s: %s\n", p.A, p.B, e)
		}
	}
	if rep.Error != "" {
		fmt.Fprintf(w, "FAIL: %s\n", rep.Error)
	}
	if rep.OK {
		fmt.Fprintf(w, "ok: every pair works (%.1f s); the agents and their temporary state are gone\n", rep.ElapsedS)
	} else {
		fmt.Fprintf(w, "FAILED (%.1f s)\n", rep.ElapsedS)
	}
}
