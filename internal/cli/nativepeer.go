// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/nativepeer"
	"github.com/vrdma/vrdma/internal/perf"
)

// nativePeerReport is "vrdmactl native-peer -o json".
type nativePeerReport struct {
	Role   string              `json:"role"`   // "active" (it connected and ran the operations) or "passive"
	Local  nativepeer.Info     `json:"local"`  // what it told the other side
	Result []nativepeer.Result `json:"result"` // the operations run (active), each with its latency
}

// nativeBenchReport is "vrdmactl native-peer --bench TEST -o json": the
// figures the active side measured, on both sides, in perftest's units
// (MiB/s, Mpps, µs).
type nativeBenchReport struct {
	Role       string  `json:"role"`   // "active" (it measured) or "passive"
	Test       string  `json:"test"`   // write_bw, read_lat, …
	Path       string  `json:"path"`   // this side's QP's path: rdma
	Reason     string  `json:"reason"` // why it took that path
	MsgSize    int     `json:"msg_size"`
	Iterations int     `json:"iterations"`
	BWPeak     float64 `json:"bw_peak_mibps,omitempty"`    // BW tests
	BWAverage  float64 `json:"bw_average_mibps,omitempty"` // BW tests
	MsgRate    float64 `json:"msg_rate_mpps,omitempty"`    // BW tests
	TMin       float64 `json:"t_min_us,omitempty"`         // latency tests (RTT/2 for write_lat and send_lat, the round trip for read_lat and atomic_lat)
	TTypical   float64 `json:"t_typical_us,omitempty"`
	TAvg       float64 `json:"t_avg_us,omitempty"`
	TMax       float64 `json:"t_max_us,omitempty"`
	P99        float64 `json:"percentile_99_us,omitempty"`
}

// nativeBench is the report of result r of this side (role).
func nativeBench(role string, r perf.Result) nativeBenchReport {
	rep := nativeBenchReport{Role: role, Test: string(r.Test), Path: string(r.Path.Path), Reason: r.Path.Reason, MsgSize: r.MsgSize, Iterations: r.Iters}
	if r.Test.Latency() {
		rep.TMin, rep.TTypical, rep.TAvg, rep.TMax, rep.P99 = round2(r.TMin), round2(r.TTypical), round2(r.TAvg), round2(r.TMax), round2(r.P99)
	} else {
		rep.BWPeak, rep.BWAverage, rep.MsgRate = round2(r.BWPeak), round2(r.BWAvg), float64(int64(r.MsgRate*1e6+0.5))/1e6
	}
	return rep
}

// nativePeerCommand is "vrdmactl native-peer": a plain RoCEv2 peer, or its
// counterpart in a VM with native endpoints (package nativepeer).
func (a *app) nativePeerCommand() *cobra.Command {
	var addr, vmName, adName, gid, bench string
	var port, size, iters int
	var timeout time.Duration
	var useCM bool
	var cmt nativepeer.CMTiming
	cmd := &cobra.Command{
		Use:   "native-peer (--address ADDR | --vm NAME [-d vrdmaN] [--gid GID]) [--cm | --bench TEST [-n ITERS]] [-p PORT] [-s SIZE] [PEER]",
		Short: "A plain RoCEv2 peer (no agent, no control plane), or its counterpart in a VM with native endpoints",
		Long: `native-peer runs RC operations between a plain RoCEv2 endpoint and a VM adapter
with native endpoints (vrdmaX.nativeEndpointSupport = "TRUE"), to test the
fabric between them.

With --address ADDR it is the plain peer: vrdma's RoCEv2 engine used on its own,
on UDP ADDR:4791, in this process, with no agent and no control plane; it knows
nothing of vrdma. With --vm NAME it is the VM's side, through the agent at
--socket: the adapter's QP is reached at its host's RDMA uplink address (the
agent's RoCEv2 engine, shown by vrdmactl status, and the adapter's GID table
entry 1), which it tells the other side as its GID unless --gid says otherwise.

The sides exchange their GID, QPN, PSN, and the rkey and address of a region out
of band over TCP port PORT, as ibv_rc_pingpong and perftest do, one JSON line
each. Without PEER a side listens (passive); with PEER it connects (active) and
runs SEND/RECV, RDMA WRITE with immediate, RDMA READ, compare and swap and fetch
and add against the other side's region, checking each result, then asks the
passive side to check its memory. Either side may be either role.

With --bench TEST (on both sides, as perftest's programs) it measures instead:
TEST is one of vrdmactl perf's tests (write_bw, read_bw, send_bw, atomic_bw,
write_lat, read_lat, send_lat, atomic_lat), run by the same code as vrdmactl
perf's, -s bytes per message (the test's default unless given) and -n
iterations, with the active side measuring. Both sides print the figures.

With --cm the sides connect with RDMA CM instead, as rping and ib_write_bw -R
do: the passive side listens on PORT (rdma_listen), the active side connects to
PEER's IP address and PORT (rdma_connect) — the CM MADs on QP1 (REQ, REP, RTU,
and DREQ/DREP at the end) when the other side is a native endpoint — and each
side's region (address, rkey, size) travels as the private data of the REQ and
the REP. The check is asked and answered with SENDs.`,
		Example: `  # the plain peer, listening, on a machine without vrdma:
  vrdmactl native-peer --address 10.0.1.50
  # the VM's side, connecting to it:
  vrdmactl native-peer --vm vm1 10.0.1.50
  # the same with RDMA CM: the VM listens on port 7471, the peer connects
  vrdmactl native-peer --vm vm1 --cm -p 7471
  vrdmactl native-peer --address 10.0.1.50 --cm -p 7471 10.0.1.10
  # RDMA WRITE bandwidth at 1 MiB from the VM to the plain peer:
  vrdmactl native-peer --address 10.0.1.50 --bench write_bw
  vrdmactl native-peer --vm vm1 --bench write_bw -s 1048576 10.0.1.50`,
		Args: rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (addr == "") == (vmName == "") {
				return usageErrorf("native-peer: give --address ADDR (the plain peer) or --vm NAME (the VM's side)")
			}
			var test perf.Test
			switch {
			case useCM && bench != "":
				return usageErrorf("native-peer: --cm and --bench: the benchmarks exchange out of band, give one of them")
			case bench != "":
				t, err := perf.ParseTest(bench)
				if err != nil {
					return usageErrorf("native-peer: --bench: %v", err)
				}
				test = t
				if !cmd.Flags().Changed("size") {
					size = test.DefaultSize()
				}
				if size < 1 || size > nativepeer.MaxBenchSize {
					return usageErrorf("native-peer: -s %d is outside 1..%d", size, nativepeer.MaxBenchSize)
				}
				if iters < 0 || iters > nativepeer.MaxBenchIters {
					return usageErrorf("native-peer: -n %d is outside 1..%d", iters, nativepeer.MaxBenchIters)
				}
			case size < nativepeer.MinSize || size > nativepeer.MaxSize:
				return usageErrorf("native-peer: -s %d is outside %d..%d", size, nativepeer.MinSize, nativepeer.MaxSize)
			case cmd.Flags().Changed("iters"):
				return usageErrorf("native-peer: -n counts the iterations of a --bench run")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			var vm *vrdma.VM
			var local netip.Addr
			if addr != "" {
				ip, err := netip.ParseAddr(addr)
				if err != nil {
					return usageErrorf("native-peer: --address %q is not an IP address", addr)
				}
				dir, err := os.MkdirTemp("", "vrdma-native-peer")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				log := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
				v, stop, err := nativepeer.Standalone(ctx, ip.Unmap(), dir, cmt, log)
				if err != nil {
					return fmt.Errorf("native-peer: %w", err)
				}
				defer stop()
				vm, local = v, records.GIDOf(ip)
			} else {
				v, err := vrdma.Open(ctx, vmName, vrdma.WithSocket(a.socket))
				if err != nil {
					return fmt.Errorf("native-peer: open VM %s: %w", vmName, err)
				}
				defer v.Close()
				vm = v
			}
			ad, err := vmAdapter(vm, adName)
			if err != nil {
				return fmt.Errorf("native-peer: %w", err)
			}
			if vmName != "" {
				if local, err = a.uplinkGID(ctx, ad, gid); err != nil {
					return fmt.Errorf("native-peer: %w", err)
				}
			}
			if bench != "" {
				b := nativepeer.BenchSide{Adapter: ad, GID: local, AgentInProcess: addr != ""}
				return a.nativeBenchRun(ctx, b, perf.Config{Test: test, Size: size, Iters: iters}, addr, args, port)
			}
			side, err := nativepeer.NewSide(ctx, vm, ad, local, size)
			if err != nil {
				return fmt.Errorf("native-peer: %w", err)
			}
			rep := nativePeerReport{Role: "passive", Local: side.Local(), Result: []nativepeer.Result{}}
			switch {
			case useCM && (port < 1 || port > 65535):
				return usageErrorf("native-peer: -p %d is not a port", port)
			case useCM:
				if err := a.nativeCM(ctx, vm, ad, side, &rep, args, uint16(port)); err != nil {
					return fmt.Errorf("native-peer: %w", err)
				}
			case len(args) == 0:
				err = a.nativePassive(ctx, side, addr, port)
			default:
				rep.Role = "active"
				rep.Result, err = a.nativeActive(ctx, side, args[0], port)
			}
			if err != nil {
				return fmt.Errorf("native-peer: %w", err)
			}
			if a.json() {
				return a.printJSON(rep)
			}
			fmt.Fprintf(a.stdout, "native-peer (%s): QPN 0x%06x at GID %s, region %#x rkey %#x\n", rep.Role, rep.Local.QPN, rep.Local.GID, rep.Local.Addr, rep.Local.RKey)
			for _, r := range rep.Result {
				fmt.Fprintf(a.stdout, "  %-22s ok  %v\n", r.Op, r.Latency.Round(time.Microsecond))
			}
			fmt.Fprintln(a.stdout, "all checks passed")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "address", "", "run as the plain RoCEv2 peer on this IP address (UDP 4791), without an agent")
	f.StringVar(&vmName, "vm", "", "run as the side of this VM, through the agent at --socket")
	f.StringVarP(&adName, "device", "d", "", "the VM's adapter (default: its first)")
	f.StringVar(&gid, "gid", "", "the GID the VM's side tells (default: its host's RDMA uplink address)")
	f.IntVarP(&port, "port", "p", 18515, "the TCP port of the out-of-band exchange")
	f.IntVarP(&size, "size", "s", 4096, "the bytes each RDMA WRITE and READ moves (--bench: the message size, default the test's)")
	f.StringVar(&bench, "bench", "", "measure TEST instead (write_bw, read_bw, send_bw, atomic_bw, write_lat, read_lat, send_lat, atomic_lat), as vrdmactl perf")
	f.IntVarP(&iters, "iters", "n", 0, "--bench: iterations (default the test's)")
	f.DurationVar(&timeout, "timeout", 60*time.Second, "give up after this long")
	f.BoolVar(&useCM, "cm", false, "connect with RDMA CM (by IP address and port) instead of the TCP exchange")
	f.Uint8Var(&cmt.ResponseTimeout, "cm-response-timeout", 0, "the plain peer's CM response timeout, 4.096 µs × 2^N (0: rdma_cm's 20, about 4.3 s)")
	f.Uint8Var(&cmt.MaxRetries, "cm-retries", 0, "the plain peer's Max CM Retries of its REQs (0: rdma_cm's 15)")
	return cmd
}

// vmAdapter returns vm's adapter name, or its first for "".
func vmAdapter(vm *vrdma.VM, name string) (*vrdma.Adapter, error) {
	if name != "" {
		return vm.Adapter(name)
	}
	if len(vm.Adapters()) == 0 {
		return nil, fmt.Errorf("VM %s has no adapter", vm.Name())
	}
	return vm.Adapters()[0], nil
}

// uplinkGID is the GID the VM's side tells: gid if given, else adapter
// ad's GID for native endpoints (its GID table's entry 1, as a program
// learns it with ibv_query_gid), else the address of the agent's RoCEv2
// engine (an adapter without native endpoints: the connect is refused).
func (a *app) uplinkGID(ctx context.Context, ad *vrdma.Adapter, gid string) (netip.Addr, error) {
	if gid != "" {
		g, err := netip.ParseAddr(gid)
		if err != nil {
			return netip.Addr{}, usageErrorf("--gid %q is not a GID (an IPv6 address, ::ffff:a.b.c.d for IPv4)", gid)
		}
		return records.GIDOf(g), nil
	}
	switch g, err := ad.QueryGID(ctx, vrdma.NativeGIDIndex); {
	case err == nil:
		return netip.AddrFrom16(g), nil
	case !errors.Is(err, vrdma.ErrNoGID):
		return netip.Addr{}, err
	}
	ag, err := a.dialAgent(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	defer ag.Close()
	st, err := ag.Status(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, r := range st.RDMA {
		if ap, err := netip.ParseAddrPort(r.Address); err == nil && r.RoCE == "v2" {
			return records.GIDOf(ap.Addr()), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("the agent at %s has no RoCEv2 uplink (vrdmad --rdma-uplink rocev2-soft/ADDRESS), which native endpoints are reached through; or give --gid", a.socket)
}

// nativeBenchRun runs benchmark c on side b: passive (listening on port,
// at addr or every address) without a peer in args, else active toward
// it; it prints the figures.
func (a *app) nativeBenchRun(ctx context.Context, b nativepeer.BenchSide, c perf.Config, addr string, args []string, port int) error {
	var r perf.Result
	role := "passive"
	err := func() error {
		var cn net.Conn
		var err error
		if len(args) == 0 {
			cn, err = a.nativeAccept(ctx, addr, port)
		} else {
			role = "active"
			cn, err = nativeDial(ctx, args[0], port)
		}
		if err != nil {
			return err
		}
		defer cn.Close()
		if role == "active" {
			r, err = b.Active(ctx, c, cn)
		} else {
			r, err = b.Passive(ctx, c.Test, cn)
		}
		return err
	}()
	if err != nil {
		return fmt.Errorf("native-peer: %s: %w", c.Test, err)
	}
	if a.json() {
		return a.printJSON(nativeBench(role, r))
	}
	fmt.Fprintf(a.stdout, "native-peer (%s): %s over %s (%s)\n", role, c.Test, r.Path.Path, r.Path.Reason)
	printPerfResult(a.stdout, r)
	fmt.Fprintln(a.stdout, perfRule)
	return nil
}

// nativePassive listens on port (at addr, or every address) for the
// active side, and serves it.
func (a *app) nativePassive(ctx context.Context, side *nativepeer.Side, addr string, port int) error {
	c, err := a.nativeAccept(ctx, addr, port)
	if err != nil {
		return err
	}
	defer c.Close()
	return side.Serve(ctx, c)
}

// nativeAccept listens on port (at addr, or every address) and returns
// the other side's connection, with ctx's deadline.
func (a *app) nativeAccept(ctx context.Context, addr string, port int) (net.Conn, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen for the exchange: %w", err)
	}
	defer ln.Close()
	fmt.Fprintf(a.stderr, "native-peer: waiting for the other side on %s\n", ln.Addr())
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	c, err := ln.Accept()
	if err != nil {
		return nil, fmt.Errorf("accept the other side: %w", err)
	}
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	return c, nil
}

// nativeCM runs side with RDMA CM on an event channel of vm: passive
// without args, else active against args[0].
func (a *app) nativeCM(ctx context.Context, vm *vrdma.VM, ad *vrdma.Adapter, side *nativepeer.Side, rep *nativePeerReport, args []string, port uint16) error {
	ch, err := vm.OpenEventChannel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close(context.Background())
	if len(args) == 0 {
		fmt.Fprintf(a.stderr, "native-peer: listening with RDMA CM on %s port %d\n", ad.Name(), port)
		return side.ServeCM(ctx, ch, ad.Name(), port)
	}
	rep.Role = "active"
	rep.Result, err = side.DriveCM(ctx, ch, args[0], port)
	return err
}

// nativeActive connects to the passive side at peer (HOST or HOST:PORT)
// and runs the operations.
func (a *app) nativeActive(ctx context.Context, side *nativepeer.Side, peer string, port int) ([]nativepeer.Result, error) {
	c, err := nativeDial(ctx, peer, port)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return side.Drive(ctx, c)
}

// nativeDial connects to the passive side at peer (HOST or HOST:PORT),
// waiting for it to listen, and returns the connection with ctx's
// deadline.
func nativeDial(ctx context.Context, peer string, port int) (net.Conn, error) {
	if _, _, err := net.SplitHostPort(peer); err != nil {
		peer = net.JoinHostPort(peer, strconv.Itoa(port))
	}
	var d net.Dialer
	var c net.Conn
	var err error
	for { // the passive side may not listen yet
		if c, err = d.DialContext(ctx, "tcp", peer); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("connect to the other side at %s: %w", peer, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	return c, nil
}
