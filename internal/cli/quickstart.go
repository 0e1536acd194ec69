package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
)

// pairSpec is one pair quickstart checks: two adapters that must connect
// over a given path. Today both VMs live on the local agent, so the path is
// memcpy; pairs over tcp and rdma join this list with the hosts they need.
type pairSpec struct {
	A, B string         // "vm/vrdmaN"; A dials B
	Path vrdma.PathKind // the path the pair must get
}

var quickstartPairs = []pairSpec{
	{A: "vm1/vrdma0", B: "vm2/vrdma0", Path: vrdma.PathMemcpy},
}

// quickstartVMMB is each quickstart VM's guest memory: two of them, locked,
// fit the 8 MiB RLIMIT_MEMLOCK that unprivileged users commonly get.
const quickstartVMMB = 3

// Samples quickstart measures on each pair.
var (
	quickstartBW  = perf.Config{Test: perf.WriteBW, Size: 64 << 10, Duration: 300 * time.Millisecond}
	quickstartLat = perf.Config{Test: perf.WriteLat, Size: 8, Iters: 2000}
)

// quickstartReport is quickstart's result (-o json prints it).
type quickstartReport struct {
	OK           bool         `json:"ok"`
	Agent        string       `json:"agent"`
	AgentPID     int          `json:"agent_pid"`
	Host         string       `json:"host"`
	MemoryLocked bool         `json:"memory_locked"`
	Switch       string       `json:"switch,omitempty"`     // created in the agent's control plane
	PortGroup    string       `json:"port_group,omitempty"` // created on Switch; the VMs' adapters are on it
	Notes        []string     `json:"notes,omitempty"`
	Pairs        []pairReport `json:"pairs"`
	ElapsedS     float64      `json:"elapsed_s"`
	Error        string       `json:"error,omitempty"`
}

type pairReport struct {
	A       string            `json:"a"`
	B       string            `json:"b"`
	Path    string            `json:"path"`
	Want    string            `json:"want_path"`
	Reason  string            `json:"reason"`
	Opcodes map[string]string `json:"opcodes"` // opcode → "ok" or what went wrong
	BWMiBs  float64           `json:"bw_mib_s"`
	LatUs   float64           `json:"lat_us"`
	OK      bool              `json:"ok"`
	Errors  []string          `json:"errors,omitempty"`
}

func (a *app) quickstartCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "quickstart",
		Short: "Start a throw-away agent with two VMs and show RDMA between them",
		Long: `quickstart shows vrdma working on this machine, with no root, no installed
agent and nothing left behind. It starts a host agent process with temporary
state (vrdmad next to vrdmactl or on PATH, else vrdmactl itself) and its
embedded control plane (etcd), creates a distributed switch and a port group
there (quickstart-dvs, dvportgroup-quickstart), defines two VMs on them, vm1 and vm2, with 3 MiB of guest memory each (reserved and locked when the
memlock limit allows), attaches a workload to each, connects vm1/vrdma0 to
vm2/vrdma0 through the connection manager, runs every opcode (SEND,
SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, ATOMIC_CMP_AND_SWP,
ATOMIC_FETCH_AND_ADD) checking the data, measures a short bandwidth (64 KiB
RDMA WRITEs) and latency (8-byte RDMA WRITE ping-pong) sample, prints the path
each pair took and why, and removes everything. It exits 1 if anything failed.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			progress := io.Discard
			if !a.json() {
				progress = a.stdout
			}
			rep := a.quickstart(ctx, progress)
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
}

// quickstart runs everything and reports; it never leaves the agent or its
// directory behind.
func (a *app) quickstart(ctx context.Context, progress io.Writer) (rep quickstartReport) {
	start := time.Now()
	defer func() { rep.ElapsedS = round2(time.Since(start).Seconds()) }()
	fail := func(err error) quickstartReport {
		rep.OK, rep.Error = false, err.Error()
		return rep
	}

	fmt.Fprintf(progress, "starting a host agent with temporary state… ")
	ag, err := startLocalAgent(ctx, "--switch", quickstartSwitch) // quickstart_control.go
	if err != nil {
		fmt.Fprintln(progress, "failed")
		return fail(err)
	}
	defer func() {
		if err := ag.Close(); err != nil {
			rep.Notes = append(rep.Notes, "stopping the agent: "+err.Error())
		}
	}()
	rep.Agent, rep.AgentPID, rep.Host = ag.How, ag.PID(), ag.Host
	fmt.Fprintf(progress, "pid %d, %s\n", ag.PID(), ag.How)

	fmt.Fprintf(progress, "creating switch %s and port group %s in its control plane… ", quickstartSwitch, quickstartPortGroup)
	if err := createQuickstartFabric(ctx, ag); err != nil {
		fmt.Fprintln(progress, "failed")
		return fail(err)
	}
	rep.Switch, rep.PortGroup = quickstartSwitch, quickstartPortGroup
	fmt.Fprintln(progress, "ok")

	specs := []*localVM{{Name: "vm1", MemMB: quickstartVMMB, Locked: true, Switch: quickstartSwitch, PortGroup: quickstartPortGroup},
		{Name: "vm2", MemMB: quickstartVMMB, Locked: true, Switch: quickstartSwitch, PortGroup: quickstartPortGroup}}
	fmt.Fprintf(progress, "defining and attaching VMs vm1 and vm2 (%d MiB of guest memory each)… ", quickstartVMMB)
	octx, cancel := context.WithTimeout(ctx, 20*time.Second)
	vms, notes, err := openLocalVMs(octx, ag.Socket, "vrdmactl quickstart", specs)
	cancel()
	rep.Notes = append(rep.Notes, notes...)
	if err != nil {
		fmt.Fprintln(progress, "failed")
		return fail(err)
	}
	defer func() {
		for _, v := range vms {
			v.Close()
		}
	}()
	rep.MemoryLocked = specs[0].Locked && specs[1].Locked
	switch {
	case rep.MemoryLocked:
		fmt.Fprintln(progress, "reserved and locked")
	case !specs[0].Locked && !specs[1].Locked:
		fmt.Fprintln(progress, "unlocked")
	default:
		fmt.Fprintf(progress, "%s locked, %s unlocked\n", lockedName(specs, true), lockedName(specs, false))
	}
	byName := map[string]*vrdma.VM{}
	for _, v := range vms {
		byName[v.Name()] = v
	}

	rep.OK = true
	for _, ps := range quickstartPairs {
		fmt.Fprintf(progress, "pair %s → %s: ", ps.A, ps.B)
		pr := runQuickstartPair(ctx, ps, byName)
		if pr.OK {
			fmt.Fprintln(progress, "ok")
		} else {
			fmt.Fprintln(progress, "FAILED")
		}
		rep.Pairs = append(rep.Pairs, pr)
		rep.OK = rep.OK && pr.OK
	}
	return rep
}

func lockedName(specs []*localVM, locked bool) string {
	for _, s := range specs {
		if s.Locked == locked {
			return s.Name
		}
	}
	return ""
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
		fmt.Fprintln(tw, "PAIR\tPATH\tREASON\tRESULT")
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
			fmt.Fprintf(tw, "%s → %s\t%s\t%s\t%s\n", p.A, p.B, path, p.Reason, res)
		}
		tw.Flush()
		fmt.Fprintf(w, "(bandwidth: %d KiB RDMA WRITEs for %v; latency: typical of %d %d-byte RDMA WRITE ping-pongs, RTT/2)\n",
			quickstartBW.Size>>10, quickstartBW.Duration, quickstartLat.Iters, quickstartLat.Size)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
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
		fmt.Fprintf(w, "ok: every pair works (%.1f s); the agent and its temporary state are gone\n", rep.ElapsedS)
	} else {
		fmt.Fprintf(w, "FAILED (%.1f s)\n", rep.ElapsedS)
	}
}
