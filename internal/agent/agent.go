// SPDX-License-Identifier: Apache-2.0

// Package agent is vrdmad, the host agent. It wires the layers together:
// the device (package device: VMs, verbs objects, QPs and their send-queue
// goroutines, the responder), the paths (package transport/memcpy, and
// transport/tcp and transport/rdma for other hosts), the links to other
// hosts (package hostlink), connection management (package cm), the
// control plane (control.go) and the VM procedures (package manage). It
// serves workloads and management clients on a Unix socket (session.go)
// and is the device's Router (route.go): the control plane's decision
// picks each connected QP's path.
//
// Goroutines and who owns them:
//
//	Agent.Serve            accept loop; owns the listening socket.
//	session.serve          one per client connection: reads commands in order
//	                       and answers them; blocking commands (connect,
//	                       get-request) run in their own goroutine, owned by
//	                       the session and waited for when it ends.
//
// The device's goroutines (a send-queue goroutine per QP) are described
// in package device; the links' to other
// hosts in package hostlink. docs/architecture.md has the whole picture.
package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/buildinfo"
	"github.com/vrdma/vrdma/internal/clock"
	"github.com/vrdma/vrdma/internal/cm"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/gsi"
	"github.com/vrdma/vrdma/internal/hostkey"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/locations"
	"github.com/vrdma/vrdma/internal/manage"
	"github.com/vrdma/vrdma/internal/quota"
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/sys"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/vmnet"
)

// Version is the agent's release (buildinfo.Release).
const Version = buildinfo.Release

// Limits are the per-VM resource limits (device.Limits).
type Limits = device.Limits

// DefaultLimits are the limits an agent applies unless told otherwise.
var DefaultLimits = device.DefaultLimits

// Quotas are the per-uid caps and the pinned-memory budget (quota.Limits).
type Quotas = quota.Limits

// Config configures an Agent.
type Config struct {
	Socket string // Unix socket path
	// SocketGroup, if set, is the group (name or number) the socket is
	// given to, mode 0660: only root and the group's members reach the
	// agent. Empty: mode 0666, every local user does.
	SocketGroup string
	StateDir    string // VM definitions and host identity live here
	Host        string // host name; defaults to os.Hostname
	Limits      Limits
	// MaxBlocking bounds the blocking commands (a CM event wait, an
	// rdma_cm connect) in flight on one session; 0: DefaultMaxBlocking.
	MaxBlocking int
	// Quotas are the per-uid caps and the host's pinned-memory budget
	// (package quota); a zero field takes its default.
	Quotas Quotas
	Logger *slog.Logger
	// Control configures the control plane (control.go); nil runs the
	// agent standalone, with same-host peers only.
	Control *ControlConfig
	// NativePeer, if valid, makes an agent without a control plane a
	// plain RoCEv2 peer (vrdmactl native-peer): it runs a RoCEv2 engine
	// on UDP NativePeer:4791, and a QP of its adapters whose remote GID is
	// no adapter of its own reaches the RoCE endpoint at that GID's IP
	// address through the engine, as a QP of an adapter with native
	// endpoints does (routeNative).
	NativePeer netip.Addr
	// InProcess says the agent's workloads run in its own process (a
	// native peer of vrdmactl native-peer): its RoCEv2 engine's polling
	// yields the Go scheduler to them (rdma.YieldGoroutines).
	InProcess bool
	// CMResponseTimeout and CMMaxRetries are the CM response timeouts
	// (a 5-bit code: 4.096 µs × 2^n) and Max CM Retries of the REQs
	// the agent sends to native endpoints over QP1 (package gsi); zero
	// takes rdma_cm's (20, about 4.3 s; 15).
	CMResponseTimeout, CMMaxRetries uint8
	// MetricsListen, if set, is the TCP address where the agent serves
	// Prometheus metrics at /metrics, and /healthz and /readyz (package
	// metrics).
	MetricsListen string
	// MetricsWebConfig, if set, is the path of an exporter toolkit web
	// configuration file (TLS, client certificates, basic authentication
	// users) for the metrics endpoint; empty serves plain HTTP to anyone.
	MetricsWebConfig string
	// MetricsNoQPSeries leaves the per-QP series out of the metrics
	// (metrics.Options.NoQPSeries).
	MetricsNoQPSeries bool
	// MetricsPprof adds Go's profiles (net/http/pprof: goroutines, heap,
	// CPU) under /debug/pprof/ to the metrics endpoint, behind the same
	// web configuration; off by default, as etcd's --enable-pprof.
	MetricsPprof bool
	// Clock is the time source of the QPs' RC timers (retry, RNR and
	// response timeouts); nil is the real clock. Tests pass a fake.
	Clock clock.Clock
	// VMNetns gives every attached VM a network namespace of its own on
	// this host (package vmnet): interface vrdmaN per adapter with its
	// address, on its port group's bridge and, between hosts, VXLAN
	// tunnel. It needs root.
	VMNetns bool
}

// Agent is a running host agent. It is safe for concurrent use.
type Agent struct {
	mcPub     mcastPublished // multicast memberships published (mcast.go)
	decisions decisions      // path decisions counted (decisions.go)

	cfg    Config
	log    *slog.Logger
	hostID string
	// hostKey signs this host's tcp handshakes (package hostkey); its
	// public half is in the host record.
	hostKey ed25519.PrivateKey

	ln  *net.UnixListener
	dev *device.Device
	cm  *cm.Manager
	ctl *control        // nil: standalone
	up  *hostlink.Links // the links to other hosts (the tcp path, CM across hosts); nil without the control plane
	// admits are recent verdicts on datagrams' sources (ud.go).
	admits admitCache
	clk    clock.Clock

	// cmreg is the connections made through rdma_cm event channels
	// (package cm), for their DISCONNECTED events.
	cmreg *cm.Conns

	// local routes QPs between two VMs of this host in place of memcpy
	// (WithLocalPaths); nil without.
	local LocalPaths
	// rdma is the RoCEv2 engine of the host's RDMA uplink (the first
	// rocev2-soft uplink of ControlConfig.Uplinks); nil without one.
	rdma *rdma.Engine
	// nativeMTU is a native peer's (Config.NativePeer) adapters' active
	// MTU: the largest RoCE MTU its address's interface carries, as a
	// RoCE NIC's port MTU follows its netdev's (0: the default).
	nativeMTU uint32
	// gsi is RDMA CM over QP1 of rdma, with native endpoints (native.go);
	// nil without a RoCEv2 engine.
	gsi *gsi.Manager
	// nativeRefused counts the native peers' REQs refused because only
	// adapters without native endpoints listen on their port.
	nativeRefused atomic.Uint64
	// rdma1 is the RoCE v1 engine of the same uplink, on its interface
	// (rdmaV1Conn, opened before the host registers, so that the record
	// publishes the interface's MAC); nil where RoCE v1 is not offered.
	rdma1      *rdma.Engine
	rdmaV1Conn rdma.FrameConn

	quota *quota.Ledger // what each uid holds (Config.Quotas)

	// vmnet is the VMs' network namespaces (Config.VMNetns); nil without.
	// vmnetStop ends followPeers, which closes vmnetDone.
	vmnet     *vmnet.Net
	vmnetStop chan struct{}
	vmnetDone chan struct{}

	mu       sync.Mutex
	sessions map[*session]struct{} // +checklocks:mu
	proc     *manage.Procedures    // VM procedures, power state and access (package manage)

	metrics     *http.Server // Config.MetricsListen's; nil without
	metricsAddr net.Addr

	wg      sync.WaitGroup
	closing atomic.Bool
}

// New prepares an agent: it creates the state directory, loads or creates
// the host ID, and binds the socket (removing a stale one). Options are
// for tests (WithLocalPaths).
func New(cfg Config, opts ...Option) (*Agent, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if cfg.Socket == "" {
		cfg.Socket = locations.AgentSocket()
	}
	if cfg.StateDir == "" {
		cfg.StateDir = locations.StateDir()
	}
	if cfg.Host == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("host name: %w (pass --host)", err)
		}
		cfg.Host = h
	}
	// A limit left at zero takes its default (a zero limit would refuse
	// every object of its kind).
	for _, l := range []struct{ v, def *int }{{&cfg.Limits.MaxPD, &DefaultLimits.MaxPD}, {&cfg.Limits.MaxMR, &DefaultLimits.MaxMR},
		{&cfg.Limits.MaxCQ, &DefaultLimits.MaxCQ}, {&cfg.Limits.MaxQP, &DefaultLimits.MaxQP}, {&cfg.Limits.MaxListeners, &DefaultLimits.MaxListeners},
		{&cfg.Limits.MaxProcesses, &DefaultLimits.MaxProcesses}, {&cfg.Limits.MaxCQEPerVM, &DefaultLimits.MaxCQEPerVM},
		{&cfg.Limits.MaxWRPerVM, &DefaultLimits.MaxWRPerVM}} {
		if *l.v <= 0 {
			*l.v = *l.def
		}
	}
	if cfg.MaxBlocking <= 0 {
		cfg.MaxBlocking = DefaultMaxBlocking
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "vms"), 0o700); err != nil {
		return nil, fmt.Errorf("create state directory: %w (pass --state-dir)", err)
	}
	id, err := loadHostID(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	key, err := hostkey.Load(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:      cfg,
		log:      cfg.Logger.With("host", cfg.Host),
		hostID:   id,
		hostKey:  key,
		sessions: make(map[*session]struct{}),
		quota:    quota.New(cfg.Quotas, uint32(os.Geteuid())),
	}
	a.cfg.Quotas = a.quota.Limits()
	a.clk = cfg.Clock
	if a.clk == nil {
		a.clk = clock.Real
	}
	a.dev = device.New(device.Config{Host: cfg.Host, HostID: id, FWVersion: Version, Limits: cfg.Limits, Clock: a.clk,
		Log: a.log, Router: a, DetachWait: manage.DetachWait, Quota: a.quota})
	a.cm = cm.New(a.dev, cfg.Host, cfg.Limits.MaxListeners)
	a.cmreg = cm.NewConns(cmHosts{a}, a.log)
	if o.localPaths != nil {
		lp, err := o.localPaths(PathEnv{Device: a.dev, Links: a.linksConfig(), Clock: a.clk, Log: a.log, Host: cfg.Host})
		if err != nil {
			return nil, err
		}
		a.local = lp
	}
	if cfg.NativePeer.IsValid() {
		if cfg.Control != nil {
			return nil, errors.New("a native peer runs without a control plane: give NativePeer or Control, not both")
		}
		c, err := rdma.ListenUDP(netip.AddrPortFrom(cfg.NativePeer, rocewire.UDPPort))
		if err != nil {
			return nil, err
		}
		if cfg.InProcess {
			rdma.YieldGoroutines(c)
		}
		var eng atomic.Pointer[rdma.Engine]
		a.rdma = rdma.Start(rdma.Config{Device: a.dev, Conn: c, Log: a.log, GSI: a.newGSI(cfg.NativePeer, &eng)})
		eng.Store(a.rdma)
		a.nativeMTU = nativeMTU(cfg.NativePeer)
	}
	if err := a.listen(); err != nil {
		if a.rdma != nil {
			a.rdma.Close()
		}
		return nil, err
	}
	if cfg.Control != nil {
		a.prepareRoCEv1()
		if err := a.startControl(); err != nil {
			if a.rdmaV1Conn != nil {
				a.rdmaV1Conn.Close()
			}
			a.ln.Close()
			return nil, err
		}
		if err := a.startLinks(); err != nil {
			a.stopControl()
			a.ln.Close()
			return nil, err
		}
		if err := a.startRDMA(); err != nil {
			a.up.Close()
			a.stopControl()
			a.ln.Close()
			return nil, err
		}
	}
	if cfg.VMNetns {
		if err := a.startVMNet(); err != nil {
			a.ln.Close()
			a.shutdown()
			return nil, err
		}
	}
	var mc *manage.Control
	if c := a.ctl; c != nil {
		mc = &manage.Control{Store: c.st, Cache: c.cache, LookupTimeout: c.cfg.LookupTimeout, Stop: c.stop, WG: &c.wg}
	}
	a.proc = manage.New(manage.Config{StateDir: cfg.StateDir, Host: cfg.Host, HostID: id, Logger: a.log, Control: mc, VMs: attachedVMs{a}, Quota: a.quota})
	if cfg.MetricsListen != "" {
		if err := a.startMetrics(cfg.MetricsListen); err != nil {
			a.ln.Close()
			a.shutdown()
			return nil, err
		}
	}
	return a, nil
}

// attachedVMs are the agent's attached VMs, for the procedures.
type attachedVMs struct{ a *Agent }

// Attached returns the VM attached as name: all its workloads.
func (v attachedVMs) Attached(name string) (manage.VM, bool) {
	ps := v.a.dev.Attached(name)
	if len(ps) == 0 {
		return nil, false
	}
	return workloads(ps), true
}

// workloads are the processes attached as one VM (the first attached
// first), which the procedures power off and detach together.
type workloads []*device.Context

func (w workloads) Name() string  { return w[0].Name() }
func (w workloads) Managed() bool { return w[0].Managed() }

// Running reports whether one of the workloads is set up and staying.
func (w workloads) Running() bool {
	return slices.ContainsFunc(w, (*device.Context).Running)
}

// PID is the first workload's process.
func (w workloads) PID() int32 { return w[0].PID() }

// Kick detaches every workload.
func (w workloads) Kick(why string) {
	for _, v := range w {
		v.Kick(why)
	}
}

// Detach kicks every workload and waits for their teardowns.
func (w workloads) Detach(why string) bool {
	w.Kick(why)
	ok := true
	for _, v := range w {
		ok = v.Detach(why) && ok
	}
	return ok
}

// SetConnected connects or disconnects an adapter of the VM, for every
// workload.
func (w workloads) SetConnected(adapter string, connected bool) (bool, int, error) {
	return w[0].SetConnected(adapter, connected)
}

// AttachedVMs returns every attached VM.
func (v attachedVMs) AttachedVMs() []manage.VM {
	vms := v.a.dev.AttachedVMs()
	out := make([]manage.VM, len(vms))
	for i, m := range vms {
		out[i] = m
	}
	return out
}

func loadHostID(dir string) (string, error) {
	p := filepath.Join(dir, "host-id")
	if b, err := os.ReadFile(p); err == nil {
		id := strings.TrimSpace(string(b))
		if len(id) == 32 {
			if _, err := hex.DecodeString(id); err == nil {
				return id, nil
			}
		}
		return "", fmt.Errorf("%s holds %q, not a 32-digit hex host ID: remove it to get a new one", p, id)
	}
	var b [16]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	if err := os.WriteFile(p, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write host ID: %w", err)
	}
	return id, nil
}

func (a *Agent) listen() error {
	path := a.cfg.Socket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}
	// A socket nobody answers on is stale; one that answers belongs to a
	// running agent, which we must not steal.
	if c, err := net.Dial("unixpacket", path); err == nil {
		c.Close()
		return fmt.Errorf("an agent already serves %s: stop it or pass another --socket", path)
	}
	os.Remove(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := shareSocket(path, a.cfg.SocketGroup); err != nil {
		ln.Close()
		return err
	}
	a.ln = ln
	return nil
}

// shareSocket opens the socket at path to the workloads of other users:
// to group's members (mode 0660) when group is set, else to everyone
// (0666). Either way, the VM's owner check (the management rules) decides
// who may attach.
func shareSocket(path, group string) error {
	if group == "" {
		return os.Chmod(path, 0o666)
	}
	gid, err := strconv.Atoi(group)
	if err != nil {
		g, lerr := user.LookupGroup(group)
		if lerr != nil {
			return fmt.Errorf("socket group %q: %v (create it with groupadd --system %s, or name another with --socket-group)", group, lerr, group)
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	if err := os.Chown(path, -1, gid); err != nil {
		return fmt.Errorf("give the socket %s to group %s: %w (the agent must run as root or be a member of the group)", path, group, err)
	}
	return os.Chmod(path, 0o660)
}

// Socket returns the path the agent serves.
func (a *Agent) Socket() string { return a.cfg.Socket }

// HostID returns the agent's stable host ID.
func (a *Agent) HostID() string { return a.hostID }

// Serve accepts clients until ctx ends or Close is called, then tears down
// every session and returns.
func (a *Agent) Serve(ctx context.Context) error {
	a.log.Info("vrdmad serving", "socket", a.cfg.Socket, "state_dir", a.cfg.StateDir, "host_id", a.hostID, "version", Version)
	stop := context.AfterFunc(ctx, func() { a.Close() })
	defer stop()
	for {
		c, err := a.ln.AcceptUnix()
		if err != nil {
			if a.closing.Load() || errors.Is(err, net.ErrClosed) {
				a.shutdown()
				return nil
			}
			a.log.Warn("accept", "err", err)
			continue
		}
		s := newSession(a, sys.NewPacketConn(c))
		a.mu.Lock()
		a.sessions[s] = struct{}{}
		a.mu.Unlock()
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer func() {
				// A bug in a session's teardown must not take the other
				// VMs down with it.
				if r := recover(); r != nil {
					buf := make([]byte, 8192)
					buf = buf[:runtime.Stack(buf, false)]
					s.log.Error("session failed", "panic", r, "stack", string(buf))
				}
			}()
			s.serve()
			a.mu.Lock()
			delete(a.sessions, s)
			a.mu.Unlock()
		}()
	}
}

// Close stops accepting clients; Serve then ends every session.
func (a *Agent) Close() error {
	if a.closing.Swap(true) {
		return nil
	}
	return a.ln.Close()
}

func (a *Agent) shutdown() {
	a.mu.Lock()
	for s := range a.sessions {
		s.conn.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
	if a.up != nil {
		a.up.Close()
	}
	if a.local != nil {
		a.local.Close()
	}
	if a.rdma != nil {
		a.rdma.Close()
	}
	if a.rdma1 != nil {
		a.rdma1.Close()
	}
	a.stopMetrics()
	a.stopVMNet()
	a.stopControl()
	a.log.Info("vrdmad stopped")
}
