// SPDX-License-Identifier: Apache-2.0

package cli

// vrdmactl soak: mixed traffic on every path of a local fabric, with
// faults, for as long as asked, every work request on a ledger
// (internal/fault). It starts the hosts quickstart starts — host1 with
// the embedded etcd and host2 on loopback addresses, host3 and host4 with
// software RoCEv2 uplinks — and keeps one pair of VMs per path: memcpy on
// host1, tcp from host1 to host2, rdma from host3 to host4. Round after
// round, each path runs a few hundred WRs (SEND, RDMA WRITE read back,
// RDMA READ, FETCH_AND_ADD) under the next fault of its cycle, and the
// round's ledger must balance: every WR completed once, with the status
// the fault allows, its bytes intact where they landed. Before a round it
// snapshots what the surviving processes hold (descriptors, mappings,
// threads; goroutines of this one) and after it waits for them to give
// back what the round took.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/fault"
)

// The switch and port group soak creates.
const (
	soakSwitch    = "soak-dvs"
	soakPortGroup = "dvportgroup-soak"
)

// Each round's traffic: soakWRs WRs, at most soakWindow in flight, of up
// to soakMaxLen bytes; the fault strikes after soakAt completions.
const (
	soakWRs    = 300
	soakWindow = 16
	soakMaxLen = 2048
	soakAt     = 60
	soakRound  = 90 * time.Second // the most one round may take
	soakStall  = 300 * time.Millisecond
)

// soakFault is a fault soak injects.
type soakFault string

// The faults, in the order each path cycles through them.
const (
	faultNone          soakFault = "none"
	faultStalled       soakFault = "stalled-receiver" // the responder stops polling and posting receives
	faultKillWork      soakFault = "kill-workload"    // SIGKILL of the responder's workload process
	faultStopWork      soakFault = "stopped-workload" // SIGSTOP, then SIGCONT, of it
	faultLoss1         soakFault = "loss-1%"          // frames between the pair's hosts dropped (nftables)
	faultLoss5         soakFault = "loss-5%"
	faultDup1          soakFault = "dup-1%"     // frames between the pair's hosts duplicated
	faultReorder1      soakFault = "reorder-1%" // frames between the pair's hosts held behind the next (fault.Relay)
	faultDelay1        soakFault = "delay-1%"   // frames between the pair's hosts sent 2 ms late
	faultKillAgent     soakFault = "kill-agent"
	faultNoneAfter     soakFault = "none-after-restart" // warms the restarted agent's links: not checked for leaks
	soakLeakSettle               = 10 * time.Second
	soakViolationsKept           = 20
)

// soakPath is one path's pair of VMs and the faults it cycles through.
type soakPath struct {
	Name   string
	A, B   int // hosts of the requester's and the responder's VM
	faults []soakFault
	vmA    string
	vmB    string
	round  int
}

// soakReport is what soak prints (-o json: as is).
type soakReport struct {
	OK         bool              `json:"ok"`
	Duration   string            `json:"duration"`
	Rounds     int               `json:"rounds"`
	WRs        int               `json:"work_requests"` // posted
	Bytes      uint64            `json:"bytes"`         // moved by WRs that succeeded
	Verified   int               `json:"verified"`      // WRs whose bytes were checked where they landed
	Faults     map[string]int    `json:"faults"`        // injected, by kind
	Struck     map[string]uint64 `json:"frames_struck"` // frames the wire faults dropped, doubled, reordered or delayed, by kind
	ByStatus   map[string]int    `json:"completions"`   // by status
	ByPath     map[string]int    `json:"rounds_by_path"`
	Lost       int               `json:"lost"`
	Duplicates int               `json:"duplicates"`
	Mismatches int               `json:"mismatches"`
	Leaks      int               `json:"leaks"`
	Violations []string          `json:"violations,omitempty"` // the first ones, in words
	Notes      []string          `json:"notes,omitempty"`
	Hosts      map[string]string `json:"hosts"`
	Error      string            `json:"error,omitempty"`
}

func (a *app) soakCommand() *cobra.Command {
	var duration time.Duration
	var only soakFilter
	cmd := &cobra.Command{
		Use:   "soak [--duration 10m] [--path P,...] [--fault F,...]",
		Short: "Run mixed traffic on every path with faults, every work request on a ledger, and report",
		Long: `soak starts throw-away host agents as quickstart does (host1 with the embedded
control plane and host2 on loopback addresses, host3 and host4 with software
RoCEv2 uplinks) and runs traffic on one pair of VMs per path — memcpy (host1),
tcp (host1 to host2), rdma (host3 to host4) — round after round until the
duration is over or it is interrupted. Each round posts a few hundred work
requests (SEND, RDMA WRITE read back, RDMA READ, FETCH_AND_ADD) under the next
fault of the path's cycle:

  none, stalled-receiver   every WR succeeds once, its bytes intact
  kill-workload            the responder's workload process gets SIGKILL: WRs in
                           flight fail or flush, each once; its VM attaches again
  stopped-workload         the responder's process is stopped for 300 ms
  loss-1%, loss-5%, dup-1% frames between the pair's hosts are dropped or
                           duplicated (nftables on lo; root only): every WR succeeds
  reorder-1%, delay-1%     frames between the pair's hosts are held behind the
                           next one or sent 2 ms late (a relay on lo; root only):
                           every WR succeeds
  kill-agent               the responder's agent gets SIGKILL and is restarted;
                           the VM attaches to the new agent and serves again
                           (tcp and rdma: memcpy's agent holds the control plane)

Every WR is written to a ledger — posted, completed with its status, its bytes
checksummed where they landed — and each round's books must balance: a WR lost
or completed twice, a byte that landed wrong, an atomic executed twice is a
violation. Before each round soak notes what the processes that survive the
fault hold (descriptors, mappings, threads, and this process's goroutines), and
after it waits for them to give it back: what they keep is a leak.

The report: rounds, WRs, bytes, faults injected, completions by status, lost,
duplicates, mismatches and leaks, which must all be 0; soak exits 1 otherwise.`,
		Example: `  vrdmactl soak --duration 1m
  sudo vrdmactl soak --duration 10m -o json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if duration <= 0 {
				return usageErrorf("soak: --duration must be positive, got %v", duration)
			}
			sig, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			progress := io.Discard
			if !a.json() {
				progress = a.stdout
			}
			rep := runSoak(sig, progress, duration, only)
			if a.json() {
				if err := a.printJSON(rep); err != nil {
					return err
				}
			} else {
				printSoak(a.stdout, rep)
			}
			if !rep.OK {
				return &exitError{code: exitFailure}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&duration, "duration", 10*time.Minute, "how long to run")
	cmd.Flags().StringSliceVar(&only.paths, "path", nil, "run only these paths (memcpy, tcp, rdma; default: all)")
	cmd.Flags().StringSliceVar(&only.faults, "fault", nil, "inject only these faults (default: every one of each path's cycle)")
	return cmd
}

// soakFilter narrows a soak to some paths and faults; empty lists keep
// all.
type soakFilter struct{ paths, faults []string }

// apply returns the paths and their fault cycles that f keeps.
func (f soakFilter) apply(paths []*soakPath) ([]*soakPath, error) {
	var out []*soakPath
	for _, p := range paths {
		if len(f.paths) > 0 && !slices.Contains(f.paths, p.Name) {
			continue
		}
		if len(f.faults) > 0 {
			p.faults = slices.DeleteFunc(p.faults, func(x soakFault) bool { return !slices.Contains(f.faults, string(x)) })
		}
		if len(p.faults) > 0 {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--path %v --fault %v leave nothing to run: paths are memcpy, tcp and rdma; faults none, stalled-receiver, kill-workload, stopped-workload, kill-agent and none-after-restart (tcp, rdma), loss-1%%, loss-5%%, dup-1%%, reorder-1%%, delay-1%% (tcp, rdma; root)", f.paths, f.faults)
	}
	return out, nil
}

// soakRun is one soak: its fabric, paths, report and survivors.
type soakRun struct {
	f        *localFabric
	st       *store.Store
	progress io.Writer
	rep      *soakReport
	root     bool
	lo       sync.Mutex // one wire fault at a time (one nftables table on lo)
}

// runSoak runs soak for d and returns its report.
func runSoak(ctx context.Context, progress io.Writer, d time.Duration, only soakFilter) (rep soakReport) {
	start := time.Now()
	rep = soakReport{Faults: map[string]int{}, Struck: map[string]uint64{}, ByStatus: map[string]int{}, ByPath: map[string]int{}, Hosts: map[string]string{}}
	defer func() {
		rep.Duration = time.Since(start).Round(time.Second).String()
		rep.OK = rep.Error == "" && rep.Rounds > 0 && rep.Lost == 0 && rep.Duplicates == 0 && rep.Mismatches == 0 && rep.Leaks == 0 && len(rep.Violations) == 0
	}()
	fmt.Fprintf(progress, "starting 4 host agents with temporary state (host1 with the embedded control plane)… ")
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	f, err := startLocalFabric(sctx, soakSwitch, soakPortGroup, quickstartHosts)
	cancel()
	if err != nil {
		fmt.Fprintln(progress, "failed")
		rep.Error = err.Error()
		return rep
	}
	defer f.Close()
	fmt.Fprintln(progress, "ok")
	for _, h := range f.Hosts {
		rep.Hosts[h.Name] = h.Addr.Addr().String()
	}
	st, err := store.Open(ctx, store.Config{Endpoints: []string{f.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		rep.Error = fmt.Sprintf("the control plane at %s: %v", f.Endpoint, err)
		return rep
	}
	defer st.Close()
	// The client's connection, before any snapshot of this process.
	if _, _, err := store.Get[records.Switch](ctx, st, records.SwitchKey(soakSwitch)); err != nil {
		rep.Error = fmt.Sprintf("read switch %s from the control plane: %v", soakSwitch, err)
		return rep
	}
	s := &soakRun{f: f, st: st, progress: progress, rep: &rep, root: os.Geteuid() == 0}
	wire := []soakFault{faultLoss1, faultLoss5, faultDup1, faultReorder1, faultDelay1}
	if !s.root {
		wire = nil
		rep.Notes = append(rep.Notes, "not root: no wire faults (loss, duplication, reordering and delay need nftables and raw sockets)")
	}
	paths := []*soakPath{
		{Name: "memcpy", A: 0, B: 0, faults: []soakFault{faultNone, faultStalled, faultKillWork, faultStopWork}},
		{Name: "tcp", A: 0, B: 1, faults: append([]soakFault{faultNone, faultStalled, faultKillWork, faultStopWork, faultKillAgent, faultNoneAfter}, wire...)},
		{Name: "rdma", A: 2, B: 3, faults: append([]soakFault{faultNone, faultStalled, faultKillWork, faultStopWork, faultKillAgent, faultNoneAfter}, wire...)},
	}
	if paths, err = only.apply(paths); err != nil {
		rep.Error = err.Error()
		return rep
	}
	if slices.ContainsFunc(paths, func(p *soakPath) bool { return p.Name == "memcpy" }) {
		rep.Notes = append(rep.Notes, "memcpy: no wire faults (no wire) and no kill-agent (its agent holds the control plane)")
	}
	for _, p := range paths {
		p.vmA, p.vmB = "soak-"+p.Name+"-a", "soak-"+p.Name+"-b"
		for i, name := range []string{p.vmA, p.vmB} {
			h := f.Hosts[[]int{p.A, p.B}[i]]
			if err := defineSoakVM(ctx, h, name); err != nil {
				rep.Error = err.Error()
				return rep
			}
		}
	}
	// A round on each path first, unchecked for leaks: the connections an
	// agent keeps with a peer host for as long as it runs open then.
	for _, p := range paths {
		fmt.Fprintf(progress, "%-7s warm-up  ", p.Name)
		if _, err := s.pairRound(ctx, p, faultNone, 0); err != nil {
			fmt.Fprintln(progress, "error")
			rep.Error = fmt.Sprintf("%s warm-up: %v", p.Name, err)
			return rep
		}
		fmt.Fprintln(progress, "ok")
	}
	deadline := time.Now().Add(d)
	for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
		for _, p := range paths {
			if ctx.Err() != nil || !time.Now().Before(deadline) {
				break
			}
			flt := p.faults[p.round%len(p.faults)]
			p.round++
			if err := s.round(ctx, p, flt, uint64(n)<<8|uint64(p.round)); err != nil {
				if ctx.Err() != nil {
					break
				}
				rep.Error = fmt.Sprintf("%s round %d (%s): %v", p.Name, p.round, flt, err)
				return rep
			}
		}
	}
	return rep
}

// defineSoakVM defines VM name on host h: 8 MiB of guest memory, its
// adapter on soak's port group.
func defineSoakVM(ctx context.Context, h *localHost, name string) error {
	ag, err := vrdma.DialAgent(ctx, vrdma.WithSocket(h.Socket))
	if err != nil {
		return fmt.Errorf("host %s: %w", h.Name, err)
	}
	defer ag.Close()
	v := localVM{Name: name, MemMB: 8, Switch: soakSwitch, PortGroup: soakPortGroup}
	if err := ag.DefineVM(ctx, name, []byte(v.vmx("vrdmactl soak"))); err != nil {
		return fmt.Errorf("define VM %s on host %s: %w", name, h.Name, err)
	}
	return nil
}

// survivor is a process that must give back what a round took.
type survivor struct {
	name string
	snap func() (fault.Resources, error)
}

// survivors returns this process and the agents of hosts, but for the
// one at skip (-1: none).
func (s *soakRun) survivors(hosts []int, skip int) []survivor {
	out := []survivor{{"vrdmactl soak", func() (fault.Resources, error) {
		return fault.Snapshot(0, func() (int, error) { return runtime.NumGoroutine(), nil })
	}}}
	seen := map[int]bool{}
	for _, i := range hosts {
		if i == skip || seen[i] {
			continue
		}
		seen[i] = true
		h := s.f.Hosts[i]
		pid := h.PID()
		out = append(out, survivor{h.Name + "'s agent", func() (fault.Resources, error) { return s.agentSnapshot(pid) }})
	}
	return out
}

// agentSnapshot is fault.Snapshot of agent pid with its links to the
// other hosts apart: a connection with a peer host lives as long as the
// agents (it is opened when first needed, and again after a fault closed
// it), so it is no leak, but two to one peer in one direction are (the
// peer's newer connection replaces its older one). Link sockets are taken
// out of the "socket" count, and those beyond one per peer and direction
// counted as "tcp link to a peer beyond one per direction".
func (s *soakRun) agentSnapshot(pid int) (fault.Resources, error) {
	r, err := fault.Snapshot(pid, nil)
	if err != nil {
		return r, err
	}
	hosts := map[netip.Addr]uint16{} // PVRDMA address → listening port
	for _, h := range s.f.Hosts {
		hosts[h.Addr.Addr()] = h.Addr.Port()
	}
	links, err := tcpLinks(pid, hosts)
	if err != nil {
		return r, err
	}
	extra := 0
	for _, n := range links {
		r.FDs["socket"] -= n
		extra += n - 1
	}
	if extra > 0 {
		r.FDs["tcp link to a peer beyond one per direction"] = extra
	}
	return r, nil
}

// tcpLinks returns process pid's established TCP connections between two
// of the hosts' PVRDMA addresses, counted by local address, remote
// address and direction (accepted on the local host's PVRDMA port, or
// dialed), read from /proc/net/tcp and the process's descriptors.
func tcpLinks(pid int, hosts map[netip.Addr]uint16) (map[string]int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, e := range fds {
		t, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if err == nil && strings.HasPrefix(t, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(t, "socket:["), "]")] = true
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 10 || f[3] != "01" || !inodes[f[9]] { // 01: ESTABLISHED
			continue
		}
		la, lp, ok1 := procTCPAddr(f[1])
		ra, _, ok2 := procTCPAddr(f[2])
		port, isHost := hosts[la]
		if _, isPeer := hosts[ra]; !ok1 || !ok2 || !isHost || !isPeer || la == ra {
			continue
		}
		dir := "dialed"
		if lp == port {
			dir = "accepted"
		}
		out[la.String()+" "+dir+" "+ra.String()]++
	}
	return out, nil
}

// procTCPAddr parses an IPv4 address and port of /proc/net/tcp
// ("0200007F:9C3B": the address in the host's byte order, here little
// endian, the port big endian).
func procTCPAddr(s string) (netip.Addr, uint16, bool) {
	a, p, ok := strings.Cut(s, ":")
	if !ok || len(a) != 8 {
		return netip.Addr{}, 0, false
	}
	v, err1 := strconv.ParseUint(a, 16, 32)
	port, err2 := strconv.ParseUint(p, 16, 16)
	if err1 != nil || err2 != nil {
		return netip.Addr{}, 0, false
	}
	return netip.AddrFrom4([4]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}), uint16(port), true
}

// round runs one round of p's traffic under fault flt and books it.
func (s *soakRun) round(ctx context.Context, p *soakPath, flt soakFault, seed uint64) error {
	ctx, cancel := context.WithTimeout(ctx, soakRound)
	defer cancel()
	skip := -1
	if flt == faultKillAgent {
		skip = p.B
	}
	ss := s.survivors([]int{p.A, p.B}, skip)
	base := make([]fault.Resources, len(ss))
	for i, sv := range ss {
		r, err := sv.snap()
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", sv.name, err)
		}
		base[i] = r
	}
	fmt.Fprintf(s.progress, "%-7s round %3d %-20s ", p.Name, p.round, flt)
	t0 := time.Now()
	var rep fault.Report
	var err error
	switch flt {
	case faultKillWork, faultStopWork:
		rep, err = s.workloadRound(ctx, p, flt, seed)
	default:
		rep, err = s.pairRound(ctx, p, flt, seed)
	}
	if err != nil {
		fmt.Fprintln(s.progress, "error")
		return err
	}
	leaks := 0
	if flt == faultNoneAfter {
		ss = nil // the agents open their links to the restarted one now
	}
	for i, sv := range ss {
		sctx, c := context.WithTimeout(ctx, soakLeakSettle)
		if err := fault.Settle(sctx, sv.name, base[i], sv.snap); err != nil {
			leaks++
			s.violation(fmt.Sprintf("%s round %d (%s): %v", p.Name, p.round, flt, err))
		}
		c()
	}
	s.book(p, flt, rep, leaks)
	fmt.Fprintf(s.progress, "%4d WRs %s, %v\n", sum(rep.ByOp), statusLine(rep.ByStatus), time.Since(t0).Round(time.Millisecond))
	return nil
}

// book adds a round's report to the soak's.
func (s *soakRun) book(p *soakPath, flt soakFault, r fault.Report, leaks int) {
	rep := s.rep
	rep.Rounds++
	rep.ByPath[p.Name]++
	if flt != faultNone && flt != faultNoneAfter {
		rep.Faults[string(flt)]++
	}
	rep.WRs += sum(r.ByOp)
	rep.Bytes += r.Bytes
	rep.Verified += r.Verified
	for k, v := range r.ByStatus {
		rep.ByStatus[k] += v
	}
	rep.Lost += r.Lost
	rep.Duplicates += r.Duplicates
	rep.Mismatches += r.Mismatches
	rep.Leaks += leaks
	for _, v := range r.Violations {
		s.violation(fmt.Sprintf("%s round %d (%s): %s", p.Name, p.round, flt, v))
	}
}

// violation records one, keeping the first soakViolationsKept in words.
func (s *soakRun) violation(v string) {
	if len(s.rep.Violations) < soakViolationsKept {
		s.rep.Violations = append(s.rep.Violations, v)
	} else if len(s.rep.Violations) == soakViolationsKept {
		s.rep.Violations = append(s.rep.Violations, "… more")
	}
}

// open attaches this process to VM name on host i.
func (s *soakRun) open(ctx context.Context, i int, name string) (*vrdma.VM, error) {
	h := s.f.Hosts[i]
	for {
		v, err := vrdma.Open(ctx, name, vrdma.WithSocket(h.Socket))
		// A VM whose workload was just killed is detached by its agent a
		// moment later: attach again until it is.
		if err == nil || !errors.Is(err, vrdma.ErrState) && !errors.Is(err, vrdma.ErrExists) || ctx.Err() != nil {
			if err != nil {
				return nil, fmt.Errorf("attach VM %s on host %s: %w", name, h.Name, err)
			}
			return v, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// config is a round's traffic, hook run after soakAt completions.
func soakConfig(seed uint64, hook func()) fault.Config {
	return fault.Config{Seed: seed, WRs: soakWRs, Window: soakWindow, MaxLen: soakMaxLen, Drain: time.Minute,
		Progress: func(done int) {
			if done == soakAt && hook != nil {
				hook()
			}
		}}
}

// pairRound runs a round with both sides in this process: no fault, a
// stalled receiver, a wire fault or the responder's agent killed.
func (s *soakRun) pairRound(ctx context.Context, p *soakPath, flt soakFault, seed uint64) (fault.Report, error) {
	va, err := s.open(ctx, p.A, p.vmA)
	if err != nil {
		return fault.Report{}, err
	}
	defer va.Close()
	vb, err := s.open(ctx, p.B, p.vmB)
	if err != nil {
		return fault.Report{}, err
	}
	defer vb.Close()
	l := fault.NewLedger()
	pair, err := fault.NewPair(ctx, va, vb, fault.DefaultLayout, fault.DefaultRC, seed, l)
	if err != nil {
		return fault.Report{}, err
	}
	defer pair.Close(context.WithoutCancel(ctx))
	if got := pair.A.QP.Path(); got.Path != vrdma.PathKind(p.Name) {
		return fault.Report{}, fmt.Errorf("QP 0x%x of VM %s is on path %q (%s), want %s", pair.A.QP.QPN(), p.vmA, got.Path, got.Reason, p.Name)
	}
	policy := fault.Policy{}
	var hook func()
	var wire interface { // the wire fault in place, if any
		Struck(context.Context) (uint64, string, error)
	}
	switch flt {
	case faultStalled:
		hook = func() { pair.Stall(soakStall) }
	case faultLoss1, faultLoss5, faultDup1:
		w := fault.Wire{Loss: 0.01}
		switch flt {
		case faultLoss5:
			w = fault.Wire{Loss: 0.05}
		case faultDup1:
			w = fault.Wire{Dup: 0.01}
		}
		s.lo.Lock()
		defer s.lo.Unlock()
		nf, err := fault.ApplyLoopback(ctx, s.f.Hosts[p.A].Addr.Addr(), s.f.Hosts[p.B].Addr.Addr(), w)
		if err != nil {
			return fault.Report{}, err
		}
		defer nf.Remove(context.WithoutCancel(ctx))
		wire = nf
	case faultReorder1, faultDelay1:
		q := fault.Queueing{Reorder: 0.01, Seed: seed}
		if flt == faultDelay1 {
			q = fault.Queueing{Delay: 0.01, Seed: seed}
		}
		s.lo.Lock()
		defer s.lo.Unlock()
		r, err := fault.StartLoopbackRelay(ctx, s.f.Hosts[p.A].Addr.Addr(), s.f.Hosts[p.B].Addr.Addr(), q)
		if err != nil {
			return fault.Report{}, err
		}
		defer r.Remove(context.WithoutCancel(ctx))
		wire = r
	case faultKillAgent:
		policy = fault.Lenient
		hook = func() {
			s.f.Hosts[p.B].kill()
			l.Abandon(pair.B.QP.QPN(), "its agent was killed")
			l.PeerGone(pair.A.QP.QPN(), "its peer's agent was killed")
		}
	}
	if _, err := pair.Run(ctx, soakConfig(seed, hook)); err != nil {
		return fault.Report{}, err
	}
	if wire != nil {
		n, _, err := wire.Struck(ctx)
		if err != nil {
			return fault.Report{}, err
		}
		s.rep.Struck[string(flt)] += n
	}
	if err := pair.Finish(ctx); err != nil && !errors.Is(err, vrdma.ErrAgentGone) {
		return fault.Report{}, err
	}
	rep, _ := l.Verify(policy) // the violations are in rep
	if flt == faultKillAgent {
		if err := s.restart(ctx, p.B); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// workloadRound runs a round whose responder is a workload process
// (this binary, re-executed), killed or stopped mid-round.
func (s *soakRun) workloadRound(ctx context.Context, p *soakPath, flt soakFault, seed uint64) (fault.Report, error) {
	va, err := s.open(ctx, p.A, p.vmA)
	if err != nil {
		return fault.Report{}, err
	}
	defer va.Close()
	l := fault.NewLedger()
	a, err := fault.NewSide(ctx, va, fault.DefaultLayout, seed)
	if err != nil {
		return fault.Report{}, err
	}
	defer a.Close(context.WithoutCancel(ctx))
	self, err := os.Executable()
	if err != nil {
		return fault.Report{}, err
	}
	spec := fault.WorkloadSpec{Socket: s.f.Hosts[p.B].Socket, VM: p.vmB, Seed: seed, Layout: fault.DefaultLayout, RC: fault.DefaultRC}
	var w *fault.Workload
	for {
		w, err = fault.StartWorkload(ctx, exec.Command(self), spec, l)
		if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "attach") {
			break
		}
		time.Sleep(50 * time.Millisecond) // the last round's workload is still detaching
	}
	if err != nil {
		return fault.Report{}, err
	}
	defer w.Kill()
	if err := a.Connect(ctx, w.Target.Endpoint, fault.DefaultRC); err != nil {
		return fault.Report{}, err
	}
	if err := w.Connect(ctx, a.Target()); err != nil {
		return fault.Report{}, err
	}
	policy := fault.Policy{}
	var wg sync.WaitGroup
	var stallErr error
	hook := func() {
		// The staller, owned by this round, which waits for it.
		wg.Go(func() { stallErr = w.Stall(soakStall) })
	}
	if flt == faultKillWork {
		policy = fault.Lenient
		hook = func() {
			w.Kill()
			l.Abandon(w.Target.Endpoint.QPN, "its workload process was killed")
			l.PeerGone(a.QP.QPN(), "its peer's workload process was killed")
		}
	}
	_, err = fault.Run(ctx, a, w.Target, l, soakConfig(seed, hook))
	wg.Wait()
	if err = errors.Join(err, stallErr); err != nil {
		return fault.Report{}, err
	}
	l.CloseBooks()
	if flt == faultStopWork {
		if err := w.Stop(ctx); err != nil {
			return fault.Report{}, err
		}
	}
	if err := errors.Join(a.Fail(ctx), fault.Drain(ctx, a, l)); err != nil {
		return fault.Report{}, err
	}
	rep, _ := l.Verify(policy)
	return rep, nil
}

// restart starts host i's killed agent again on its state: its lease is
// revoked first (as its expiry would), so that the new agent takes the
// host's place at once; the agent's VMs are defined still.
func (s *soakRun) restart(ctx context.Context, i int) error {
	h := s.f.Hosts[i]
	a, _, err := store.Get[records.Alive](ctx, s.st, records.AliveKey(h.HostID))
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return fmt.Errorf("host %s: read its lease: %w", h.Name, err)
	default:
		if _, err := s.st.Client().Revoke(ctx, clientv3.LeaseID(a.Lease)); err != nil && !strings.Contains(err.Error(), "lease not found") {
			return fmt.Errorf("host %s: revoke its lease: %w", h.Name, err)
		}
	}
	if err := h.restart(ctx); err != nil {
		return fmt.Errorf("host %s: restart its agent: %w", h.Name, err)
	}
	return nil
}

// sum adds a map's counts.
func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// statusLine writes completions by status, SUCCESS first.
func statusLine[N int | uint64](m map[string]N) string {
	keys := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for _, k := range keys {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

// printSoak prints the report.
func printSoak(w io.Writer, rep soakReport) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "duration\t%s\n", rep.Duration)
	fmt.Fprintf(tw, "rounds\t%d (%s)\n", rep.Rounds, statusLine(rep.ByPath))
	fmt.Fprintf(tw, "work requests\t%d posted, %d verified where they landed\n", rep.WRs, rep.Verified)
	fmt.Fprintf(tw, "bytes\t%d\n", rep.Bytes)
	fmt.Fprintf(tw, "faults injected\t%s\n", statusLine(rep.Faults))
	if len(rep.Struck) > 0 {
		fmt.Fprintf(tw, "frames struck\t%s\n", statusLine(rep.Struck))
	}
	fmt.Fprintf(tw, "completions\t%s\n", statusLine(rep.ByStatus))
	fmt.Fprintf(tw, "lost\t%d\n", rep.Lost)
	fmt.Fprintf(tw, "duplicates\t%d\n", rep.Duplicates)
	fmt.Fprintf(tw, "mismatches\t%d\n", rep.Mismatches)
	fmt.Fprintf(tw, "leaks\t%d\n", rep.Leaks)
	tw.Flush()
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, v := range rep.Violations {
		fmt.Fprintf(w, "FAIL %s\n", v)
	}
	if rep.Error != "" {
		fmt.Fprintf(w, "FAIL: %s\n", rep.Error)
	}
	if rep.OK {
		fmt.Fprintln(w, "ok: no WR lost or doubled, no byte wrong, nothing leaked")
	} else {
		fmt.Fprintln(w, "FAILED")
	}
}
