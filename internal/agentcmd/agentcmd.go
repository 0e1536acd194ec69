// SPDX-License-Identifier: Apache-2.0

// Package agentcmd is the command line of the host agent, shared by
// vrdmad and by "vrdmactl agent" (which quickstart and perf start when no
// vrdmad binary is installed).
package agentcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/buildinfo"
	"github.com/vrdma/vrdma/internal/locations"
)

// about is the head of vrdmad's usage.
const about = `vrdmad is the vrdma host agent: one per host, the device behind every
vrdma adapter of the VMs whose workloads attach to it.

Flags are --long-names, as vrdmactl's ("-socket" is still accepted for
--socket). --config FILE reads flags from a YAML file whose keys are the
flag names (socket: /run/vrdma/vrdmad.sock, rdma-uplink: [a list]); a flag
on the command line wins over the file, and the file over the environment
(VRDMA_SOCKET, VRDMA_STATE_DIR) and the defaults.`

// flags are vrdmad's command line: the flag set and where it puts the
// values.
type flags struct {
	fs         *pflag.FlagSet
	cfg        agent.Config
	configFile string
	level      string
	format     string
	version    bool
	quota      *quotaFlags
	control    *controlFlags
}

// newFlags defines vrdmad's flags, for the program named name.
func newFlags(name string) *flags {
	f := &flags{fs: pflag.NewFlagSet(name, pflag.ContinueOnError), cfg: agent.Config{Limits: agent.DefaultLimits}}
	fs, cfg := f.fs, &f.cfg
	fs.StringVar(&f.configFile, "config", "", "read flags from this YAML file, its keys the flag names (socket: /run/vrdma/vrdmad.sock); the command line's win")
	fs.StringVar(&cfg.Socket, "socket", locations.AgentSocket(), "Unix socket to serve (env VRDMA_SOCKET)")
	fs.StringVar(&cfg.SocketGroup, "socket-group", "", "give the socket to this group, mode 0660, so that only root and the group's members reach the agent (default: mode 0666, every local user)")
	fs.StringVar(&cfg.StateDir, "state-dir", locations.StateDir(), "directory for VM definitions and the host ID")
	fs.StringVar(&cfg.Host, "host", "", "host name (default: the system's)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", "", "serve Prometheus metrics at http://ADDR/metrics, and /healthz and /readyz (e.g. 127.0.0.1:9464; default: none)")
	fs.StringVar(&cfg.MetricsWebConfig, "web.config.file", "", "serve the metrics with TLS and basic authentication as this web configuration file says (the Prometheus exporter toolkit's, as node_exporter's --web.config.file: tls_server_config, basic_auth_users)")
	fs.BoolVar(&cfg.MetricsPprof, "metrics-pprof", false, "also serve Go's profiles (goroutines, heap, CPU) at http://ADDR/debug/pprof/ on the metrics address, behind its web configuration: for debugging, as etcd's --enable-pprof")
	fs.BoolVar(&cfg.MetricsNoQPSeries, "metrics-no-qp-series", false, "leave the per-QP series (vrdma_qp_*) out of the metrics: the adapters' counters, which include their QPs', stay")
	fs.IntVar(&cfg.Limits.MaxQP, "max-qp", agent.DefaultLimits.MaxQP, "QPs per VM workload's context (max_qp)")
	fs.IntVar(&cfg.Limits.MaxCQ, "max-cq", agent.DefaultLimits.MaxCQ, "CQs per VM workload's context (max_cq)")
	fs.IntVar(&cfg.Limits.MaxMR, "max-mr", agent.DefaultLimits.MaxMR, "memory regions per VM workload's context (max_mr)")
	fs.IntVar(&cfg.Limits.MaxPD, "max-pd", agent.DefaultLimits.MaxPD, "protection domains per VM workload's context (max_pd)")
	fs.IntVar(&cfg.Limits.MaxProcesses, "max-processes", agent.DefaultLimits.MaxProcesses, "workloads (processes) attached to one VM at once")
	fs.IntVar(&cfg.Limits.MaxListeners, "max-listeners", agent.DefaultLimits.MaxListeners, "listening service ports of one VM")
	fs.IntVar(&cfg.Limits.MaxCQEPerVM, "max-cqe-per-vm", agent.DefaultLimits.MaxCQEPerVM, "CQ entries of all of one VM's CQs together")
	fs.IntVar(&cfg.Limits.MaxWRPerVM, "max-wr-per-vm", agent.DefaultLimits.MaxWRPerVM, "send and receive queue entries of all of one VM's QPs together")
	fs.IntVar(&cfg.MaxBlocking, "max-blocking-per-session", agent.DefaultMaxBlocking, "blocking commands (CM event waits, connects) in flight on one connection to the socket")
	fs.BoolVar(&cfg.VMNetns, "vm-netns", false, "as root: give every attached VM a network namespace (/run/netns/vrdmavm-HOST-VM) where interface vrdmaN carries adapter N's address, on its port group's bridge and VXLAN tunnel to the other hosts (vrdmactl exec --netns runs programs there)")
	fs.Func("native-peer", "run as a plain RoCEv2 peer on this IP address (UDP 4791), with --no-control-plane: every adapter reaches RoCE endpoints by their addresses, and RDMA CM runs on QP1, as a kernel RoCE device's; a native endpoint for VMs with vrdmaX.nativeEndpointSupport", func(s string) error {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("not an IP address: %v", err)
		}
		cfg.NativePeer = a.Unmap()
		return nil
	})
	f.quota = addQuotaFlags(fs)
	fs.StringVar(&f.level, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.format, "log-format", "text", "log lines as text (key=value) or json, one object a line")
	fs.BoolVar(&f.version, "version", false, "print the version and build information (module, commit, Go version) and exit")
	f.control = addControlFlags(fs)
	return f
}

// Command is vrdmad's command line as a cobra command, for documentation
// that cobra generates (man pages): its usage, description and flags, the
// same as --help prints. It does not run the agent.
func Command(name string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   name + " [flags]",
		Short: "the vrdma host agent",
		Long:  about,
		Example: `  vrdmad --version
  vrdmad --socket /run/vrdma/vrdmad.sock --socket-group vrdma --metrics-listen 127.0.0.1:9464
  vrdmad --config /etc/vrdma/vrdmad.yaml`,
		DisableAutoGenTag: true,
	}
	cmd.Flags().AddFlagSet(newFlags(name).fs)
	return cmd
}

// Main parses args (without the program name), runs the agent until
// SIGINT or SIGTERM, and returns the process exit code. --version prints
// the build information (buildinfo) to stdout and exits, and so does
// --help with the usage; errors go to stderr, and so do the agent's logs.
func Main(name string, args []string, stdout, stderr io.Writer) int {
	f := newFlags(name)
	fs := f.fs
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "%s\n\nUsage:\n  %s [flags]\n\nFlags:\n%s", about, name, fs.FlagUsages()) // -h, as vrdmactl's, to stdout
	}
	cfg := &f.cfg
	if err := fs.Parse(longFlags(fs, args)); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0 // -h asked for the usage, which Parse printed
		}
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", name, err, name)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q: vrdmad takes flags only\nRun '%s --help' for usage.\n", name, fs.Args(), name)
		return 2
	}
	if f.configFile != "" {
		data, err := os.ReadFile(f.configFile)
		if err == nil {
			err = applyConfig(fs, data)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: --config %s: %v\n", name, f.configFile, err)
			return 2
		}
	}
	if f.version {
		fmt.Fprint(stdout, buildinfo.Read(name))
		return 0
	}
	ctl, err := f.control.config()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	cfg.Control = ctl
	if cfg.NativePeer.IsValid() && ctl != nil {
		fmt.Fprintf(stderr, "%s: --native-peer runs without a control plane: give --no-control-plane\n", name)
		return 2
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(f.level)); err != nil {
		fmt.Fprintf(stderr, "%s: --log-level %q: %v\n", name, f.level, err)
		return 2
	}
	for _, l := range []struct {
		n      string
		v, max int
	}{{"max-qp", cfg.Limits.MaxQP, 1 << 16}, {"max-cq", cfg.Limits.MaxCQ, 1 << 16}, {"max-mr", cfg.Limits.MaxMR, 1 << 16}, {"max-pd", cfg.Limits.MaxPD, 1 << 16},
		{"max-processes", cfg.Limits.MaxProcesses, 1 << 16}, {"max-listeners", cfg.Limits.MaxListeners, 1 << 16}, {"max-cqe-per-vm", cfg.Limits.MaxCQEPerVM, 1 << 30}, {"max-wr-per-vm", cfg.Limits.MaxWRPerVM, 1 << 30},
		{"max-blocking-per-session", cfg.MaxBlocking, 1 << 16}} {
		if l.v < 1 || l.v > l.max {
			fmt.Fprintf(stderr, "%s: --%s %d out of range 1..%d\n", name, l.n, l.v, l.max)
			return 2
		}
	}
	quotas, err := f.quota.limits()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	cfg.Quotas = quotas
	opts := &slog.HandlerOptions{Level: lv}
	switch f.format {
	case "text":
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, opts))
	case "json":
		cfg.Logger = slog.New(slog.NewJSONHandler(stderr, opts))
	default:
		fmt.Fprintf(stderr, "%s: --log-format %q: want text or json\n", name, f.format)
		return 2
	}
	if f.control.warning != "" {
		cfg.Logger.Warn(f.control.warning)
	}
	a, err := agent.New(*cfg)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Under systemd (Type=notify) the unit is started once the socket
	// listens and the control plane is joined, which agent.New did.
	notify(cfg.Logger, daemon.SdNotifyReady)
	// STOPPING=1 goes out before the agent tears its sessions down.
	serving, stopServing := context.WithCancel(context.Background())
	context.AfterFunc(ctx, func() {
		notify(cfg.Logger, daemon.SdNotifyStopping)
		stopServing()
	})
	if err := a.Serve(serving); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// notify tells systemd the agent's state (sd_notify, on $NOTIFY_SOCKET);
// without NOTIFY_SOCKET it does nothing.
func notify(log *slog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Warn("cannot notify systemd", "state", state, "socket", os.Getenv("NOTIFY_SOCKET"), "err", err)
	}
}
