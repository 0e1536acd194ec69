// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
)

// statReport is what stat prints (-o json): the counters of the QPs
// asked for and of the host's uplinks, path decisions and connects.
type statReport struct {
	Adapters      []statAdapter             `json:"adapters"`
	QPs           []statQP                  `json:"qps"`
	Uplinks       []vrdma.UplinkStatus      `json:"uplinks,omitempty"`
	RDMA          []vrdma.RDMAStatus        `json:"rdma,omitempty"`
	PathDecisions []vrdma.PathDecisionCount `json:"path_decisions,omitempty"`
	Connects      []vrdma.ConnectCount      `json:"connects,omitempty"`
}

// statAdapter is one adapter's counters: its QPs', destroyed ones
// included.
type statAdapter struct {
	VM       string           `json:"vm"`
	Adapter  string           `json:"adapter"`
	Counters vrdma.QPCounters `json:"counters"`
}

// statQP is one QP's counters.
type statQP struct {
	VM       string           `json:"vm"`
	Adapter  string           `json:"adapter"`
	QPN      uint32           `json:"qpn"`
	State    string           `json:"state"`
	Path     vrdma.PathKind   `json:"path"`
	Counters vrdma.QPCounters `json:"counters"`
	InFlight int              `json:"in_flight"`
}

func (a *app) statCommand() *cobra.Command {
	var watch bool
	var every time.Duration
	var count int
	cmd := &cobra.Command{
		Use:   "stat [VM[/ADAPTER]]",
		Short: "Show the counters of QPs and uplinks, as rdma statistic does",
		Long: `stat prints the counters of every QP of the agent's VMs (or of one VM, or one
adapter of it), one line per QP as "rdma statistic show" prints a link's: the
work requests completed by opcode, the bytes they moved, the receives and their
bytes, the completions by status, the requester's retries and RNR NAKs, the
responder's refusals; then the host's uplinks: the tcp path's byte and frame
counters and connections by result per peer host, and the RDMA uplinks' packet,
retransmission and drop counters; then the agent's path decisions ("paths": for
QPs and address handles, the paths chosen and the refusals by reason) and
connection management's connects ("cm": dials and requests to listeners, by
result). -w prints them again every --interval until interrupted (or --count
times): in place on a terminal; elsewhere one after the other, each after a line
"# TIME" (RFC 3339, UTC), or with -o json one JSON document each.`,
		Example: `  vrdmactl stat
  vrdmactl stat vm1/vrdma0 -w
  vrdmactl stat -w --interval 10s > counters.log
  vrdmactl stat vm1 -o json`,
		Args: rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var vm, ad string
			if len(args) == 1 {
				vm, ad, _ = strings.Cut(args[0], "/")
			}
			ctx, ag, done, err := a.openAgent(cmd)
			if err != nil {
				return err
			}
			defer done()
			show := func() error {
				if watch { // each call its own deadline: a watch has none
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(cmd.Context(), callTimeout)
					defer cancel()
				}
				st, err := ag.Status(ctx)
				if err != nil {
					return fmt.Errorf("stat: %w", err)
				}
				rep, err := statOf(st, vm, ad)
				if err != nil {
					return err
				}
				if a.json() {
					return a.printJSON(rep)
				}
				printStat(a.stdout, rep)
				return nil
			}
			if !watch {
				return show()
			}
			if every <= 0 || count < 0 {
				return usageErrorf("stat: --interval %v, --count %d: want a positive interval and a count of 0 (until interrupted) or more", every, count)
			}
			sig, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			t := time.NewTicker(every)
			defer t.Stop()
			inPlace := !a.json() && isTerminal(a.stdout)
			for n := 1; ; n++ {
				switch {
				case inPlace:
					fmt.Fprint(a.stdout, "\033[H\033[2J") // home, clear
				case !a.json():
					fmt.Fprintf(a.stdout, "# %s\n", time.Now().UTC().Format(time.RFC3339))
				}
				if err := show(); err != nil {
					return err
				}
				if n == count {
					return nil
				}
				select {
				case <-sig.Done():
					return nil
				case <-t.C:
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "print again every --interval until interrupted")
	cmd.Flags().DurationVar(&every, "interval", time.Second, "with -w, how often")
	cmd.Flags().IntVar(&count, "count", 0, "with -w, stop after printing this many times (0: until interrupted)")
	return cmd
}

// statOf picks the counters of VM vm's adapter ad ("": all) from st.
func statOf(st vrdma.Status, vm, ad string) (statReport, error) {
	rep := statReport{Adapters: []statAdapter{}, QPs: []statQP{}, Uplinks: st.Uplinks, RDMA: st.RDMA,
		PathDecisions: st.PathDecisions, Connects: st.Connects}
	found := vm == ""
	for _, v := range st.VMs {
		if vm != "" && v.Name != vm {
			continue
		}
		found = true
		for _, a := range v.AdapterCounters {
			if ad == "" || a.Adapter == ad {
				rep.Adapters = append(rep.Adapters, statAdapter{VM: v.Name, Adapter: a.Adapter, Counters: a.Counters})
			}
		}
		for _, q := range v.QPs {
			if ad != "" && q.Adapter != ad {
				continue
			}
			rep.QPs = append(rep.QPs, statQP{VM: v.Name, Adapter: q.Adapter, QPN: q.QPN, State: q.State, Path: q.Path.Path,
				Counters: q.Counters, InFlight: q.InFlight})
		}
	}
	if !found {
		return rep, &exitError{code: exitFailure, err: fmt.Errorf("stat: the agent has no VM %q (vrdmactl status lists them)", vm)}
	}
	return rep, nil
}

// counterText appends c to b as " name value" pairs.
func counterText(b *strings.Builder, c vrdma.QPCounters) {
	for _, op := range slices.Sorted(maps.Keys(c.Ops)) {
		fmt.Fprintf(b, " %s %d", strings.ToLower(op), c.Ops[op])
	}
	fmt.Fprintf(b, " send_bytes %d recvs %d recv_bytes %d", c.SendBytes, c.Recvs, c.RecvBytes)
	for _, s := range slices.Sorted(maps.Keys(c.Completions)) {
		fmt.Fprintf(b, " wc_%s %d", strings.ToLower(s), c.Completions[s])
	}
	fmt.Fprintf(b, " transport_retries %d rnr_naks_received %d rnr_naks_sent %d requests_dropped %d duplicate_requests %d out_of_seq_requests %d doorbells %d poll_us %d",
		c.TransportRetries, c.RNRNaksReceived, c.RNRNaksSent, c.RequestsDropped, c.DuplicateRequest, c.OutOfSeqRequest, c.Doorbells, c.PollNanos/1000)
}

func printStat(w io.Writer, rep statReport) {
	for _, a := range rep.Adapters {
		var b strings.Builder
		fmt.Fprintf(&b, "link %s/%s", a.VM, a.Adapter)
		counterText(&b, a.Counters)
		fmt.Fprintln(w, b.String())
	}
	for _, q := range rep.QPs {
		var b strings.Builder
		fmt.Fprintf(&b, "link %s/%s qp 0x%x state %s path %s", q.VM, q.Adapter, q.QPN, q.State, orDash(string(q.Path)))
		counterText(&b, q.Counters)
		fmt.Fprintf(&b, " in_flight %d", q.InFlight)
		fmt.Fprintln(w, b.String())
	}
	for _, u := range rep.Uplinks {
		fmt.Fprintf(w, "uplink tcp %s (%s) state %s conns %d bytes_out %d bytes_in %d frames_out %d frames_in %d dials %d refused %d"+
			" dials_established %d dials_refused %d dials_failed %d accepted %d accepts_refused %d\n",
			orDash(u.PeerHost), u.Address, u.State, u.Conns, u.BytesOut, u.BytesIn, u.FramesOut, u.FramesIn, u.Dials, u.Refused,
			u.DialsEstablished, u.DialsRefused, u.DialsFailed, u.Accepted, u.AcceptsRefused)
	}
	for _, r := range rep.RDMA {
		fmt.Fprintf(w, "uplink rdma %s %s packets_out %d packets_in %d bytes_out %d bytes_in %d batches_out %d batches_in %d retransmits %d seq_err_naks %d bad_icrc %d malformed %d no_qp %d not_vrdma %d"+
			" cm_in %d cm_out %d cm_dropped %d cm_duplicates %d cm_resent %d cm_timed_out %d cm_rejected %d cm_refused_not_native %d\n",
			orDash(r.RoCE), r.Address, r.PacketsOut, r.PacketsIn, r.BytesOut, r.BytesIn, r.BatchesOut, r.BatchesIn, r.Retransmits, r.SeqErrNaks, r.BadICRC, r.Malformed, r.NoQP, r.NotVRDMA,
			r.CMIn, r.CMOut, r.CMDropped, r.CMDuplicates, r.CMResent, r.CMTimedOut, r.CMRejected, r.CMRefusedNotNative)
	}
	printCounts(w, "paths", rep.PathDecisions, func(d vrdma.PathDecisionCount) (string, string, uint64) {
		if d.Path == "" {
			return d.Object, "refused_" + d.Reason, d.Count
		}
		return d.Object, d.Path, d.Count
	})
	printCounts(w, "cm", rep.Connects, func(c vrdma.ConnectCount) (string, string, uint64) { return c.Side, c.Result, c.Count })
}

// printCounts prints counts one line per group, in the order the groups
// first come: "what GROUP NAME VALUE NAME VALUE ...", where f says each
// count's group, name and value.
func printCounts[T any](w io.Writer, what string, counts []T, f func(T) (group, name string, n uint64)) {
	var groups []string
	lines := map[string]*strings.Builder{}
	for _, c := range counts {
		g, name, n := f(c)
		b, ok := lines[g]
		if !ok {
			b = &strings.Builder{}
			fmt.Fprintf(b, "%s %s", what, g)
			lines[g] = b
			groups = append(groups, g)
		}
		fmt.Fprintf(b, " %s %d", name, n)
	}
	for _, g := range groups {
		fmt.Fprintln(w, lines[g].String())
	}
}
