// SPDX-License-Identifier: Apache-2.0

package testenv

// Goroutines. Each agent process has one goroutine that waits for it and
// closes its exited channel; StartCluster starts the agents on one
// goroutine each and waits for all. The cluster's cache (member.Cache)
// runs its own watch until Cleanup closes it. inNetns runs its function on
// a goroutine locked to an OS thread that is in the namespace.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/sys"
)

// NetnsMode says where a cluster's hosts run.
type NetnsMode int

// Placements of a cluster's hosts.
const (
	// NetnsAuto puts each host in its own network namespace when the test
	// runs as root, and on a loopback address otherwise. The environment
	// variable VRDMA_TEST_NETNS=on|off|auto overrides it.
	NetnsAuto NetnsMode = iota
	// NetnsOn puts each host in its own network namespace; the test is
	// skipped when not root.
	NetnsOn
	// NetnsOff runs every host in this process's network namespace, on
	// loopback addresses of the cluster's own, 127.X.Y.2, 127.X.Y.3, …
	// (loopbackNet): test binaries of other packages run at the same time,
	// and an RDMA uplink binds its address's UDP port 4791.
	NetnsOff
)

// String returns "auto", "on" or "off".
func (m NetnsMode) String() string {
	switch m {
	case NetnsAuto:
		return "auto"
	case NetnsOn:
		return "on"
	case NetnsOff:
		return "off"
	}
	return "NetnsMode(" + strconv.Itoa(int(m)) + ")"
}

// NetnsEnv is the environment variable that overrides NetnsAuto: on, off
// or auto.
const NetnsEnv = "VRDMA_TEST_NETNS"

// ClusterSubnet is the subnet of the hosts' interfaces in network
// namespaces: host i (from 0) has address .i+1. Each cluster has its own
// namespaces, so clusters of parallel tests do not collide.
var ClusterSubnet = netip.MustParsePrefix("10.199.1.0/24")

// MaxClusterHosts is the most hosts a cluster may have (hostA..hostZ).
const MaxClusterHosts = 26

// ClusterOptions shape a cluster.
type ClusterOptions struct {
	// Hosts is the number of hosts, 1..MaxClusterHosts; default 2.
	Hosts int
	// Netns says where the hosts run; default NetnsAuto.
	Netns NetnsMode
	// Switch is the distributed switch's name; default "dvs1".
	Switch string
	// PortGroup is the key of the port group VMs' adapters are on;
	// default "dvportgroup-10".
	PortGroup string
	// VLAN of the port group; default 0 (untagged).
	VLAN int
	// MTU of the switch record and of the namespaces' links; default
	// 9000.
	MTU int
	// Port is the TCP port of every host's PVRDMA address. Default: 4791
	// in network namespaces (each has its own stack), and a port free at
	// start per loopback address otherwise.
	Port int
	// Limits are the agents' per-VM limits; a zero field takes the
	// default.
	Limits agent.Limits
	// LogLevel is the agents' --log-level; default "info". Their stderr
	// is logged when the test fails.
	LogLevel string
	// RDMA gives every host a software RoCEv2 uplink on its PVRDMA
	// address (UDP 4791 beside the tcp path's TCP port), so that VMs on
	// two hosts take the rdma path. The switch's network policy is then
	// "off": loopback and veth NICs report no DCB state, and the
	// lossless checks have tests of their own (TestNetwork…).
	RDMA bool
	// NoRDMA, with RDMA, lists the indexes of hosts that get no RDMA
	// uplink: their VMs' pairs with other hosts take the tcp path.
	NoRDMA []int
	// RoCEVersion is the port group's RoCE version; default v2. With v1
	// (and RDMA) the rdma path runs RoCE v1 frames over the hosts' veth
	// interfaces, which needs the hosts in network namespaces: the test
	// is skipped without them (loopback has no MAC to address frames to).
	RoCEVersion records.RoCEVersion
	// Subnet is the port group's subnet adapter addresses are assigned
	// from (records.PortGroup.Subnet); "" for none.
	Subnet string
	// ExtraArgs, if set, returns more vrdmad flags for host h (called at
	// every start of h, restarts included).
	ExtraArgs func(h *Host) []string
	// AllowAgentErrors keeps the test from failing when an agent logged
	// at level ERROR (by default such a line, a panic caught by the agent,
	// fails the test at cleanup).
	AllowAgentErrors bool
	// StartTimeout bounds the start of each agent until it answers on its
	// socket; default 60 s (a restarted agent may wait up to its lease's
	// TTL, 10 s, for its previous lease to expire).
	StartTimeout time.Duration
}

// Cluster is several real vrdmad processes, each a host, sharing one etcd
// (a real embedded member whose client URL is a Unix socket, reachable
// from every network namespace), registered on one distributed switch with
// one port group, and joined by a network: as root, each host is in its
// own network namespace, joined to the others by a veth pair to a bridge
// in one more namespace (the switch); otherwise every host is on its own
// loopback address. Everything is stopped and removed by the test's
// Cleanup, even when the test fails; a failing test logs every agent's
// stderr.
//
// A Cluster is for the test's goroutine: its methods and its hosts' are
// not safe for concurrent use with Kill, Stop and Restart.
type Cluster struct {
	// Hosts are the hosts, hostA first.
	Hosts []*Host
	// Switch and PortGroup are the records the cluster created.
	Switch    records.Switch
	PortGroup records.PortGroup
	// Netns reports whether the hosts are in network namespaces; when
	// not, NoNetnsReason says why.
	Netns         bool
	NoNetnsReason string
	// ID is unique to this cluster among the clusters of every test
	// process running; namespaces are named vrdma-ID-ROLE.
	ID string

	tb    testing.TB
	opts  ClusterOptions
	bin   string
	dir   string
	etcd  *store.Embedded
	st    *store.Store
	cache *member.Cache
	net   *netnsNetwork // nil without namespaces
}

// StartCluster starts a cluster (see Cluster) with o: an etcd, the
// switch and port group records, the network, then o.Hosts vrdmad
// processes in parallel, and returns once every agent answers on its
// socket and is registered. It fails the test if anything does not start,
// and skips it if o.Netns is NetnsOn and the test is not root.
func StartCluster(tb testing.TB, o ClusterOptions) *Cluster {
	tb.Helper()
	t0 := time.Now()
	if o.Hosts == 0 {
		o.Hosts = 2
	}
	if o.Hosts < 1 || o.Hosts > MaxClusterHosts {
		tb.Fatalf("StartCluster: %d hosts: want 1..%d", o.Hosts, MaxClusterHosts)
	}
	if o.Switch == "" {
		o.Switch = "dvs1"
	}
	if o.PortGroup == "" {
		o.PortGroup = "dvportgroup-10"
	}
	if o.MTU == 0 {
		o.MTU = records.MaxMTU
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	c := &Cluster{tb: tb, opts: o, ID: clusterID()}
	c.Netns, c.NoNetnsReason = chooseNetns(tb, o.Netns)
	if o.RoCEVersion == records.RoCEv1 && !c.Netns {
		tb.Skipf("StartCluster with RoCE v1: the hosts need network namespaces (Ethernet interfaces; root): %s", c.NoNetnsReason)
	}
	c.bin = AgentBinary(tb)
	c.dir = shortTempDir(tb)
	tBuild := time.Now()

	// etcd, on a Unix socket: its client URL must not be a TCP address on
	// the root namespace's loopback, which agents in namespaces cannot
	// reach.
	c.etcd = etcdtest.StartConfig(tb, etcdtest.Config(filepath.Join(c.dir, "etcd")))
	if !strings.HasPrefix(c.etcd.ClientURL(), "unix") {
		tb.Fatalf("StartCluster: etcd's client URL %s is not a Unix socket (is the temporary directory %s too long for a socket path?)", c.etcd.ClientURL(), c.dir)
	}
	c.st = etcdtest.Open(tb, c.etcd.ClientURL())
	c.cache = member.NewCache(c.st, member.CacheConfig{LookupTimeout: 3 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	tb.Cleanup(c.cache.Close)
	c.createFabric()
	tEtcd := time.Now()

	if c.Netns {
		sweepStaleNetns()
		n, err := newNetnsNetwork(c.nsName("sw"), o.MTU)
		c.net = n
		tb.Cleanup(func() {
			if err := n.close(); err != nil {
				tb.Errorf("cluster cleanup: delete network namespaces: %v (delete them with 'ip netns delete NAME')", err)
			}
		})
		if err != nil {
			tb.Fatalf("StartCluster: %v (or run the hosts on loopback addresses: %s=off)", err, NetnsEnv)
		}
	}
	net3 := loopbackNet()
	for i := range o.Hosts {
		h := &Host{Name: "host" + string(rune('A'+i)), Index: i, c: c}
		dir := filepath.Join(c.dir, h.Name)
		h.Env = &Env{Socket: filepath.Join(dir, "s"), StateDir: filepath.Join(dir, "state"), exited: make(chan struct{})}
		close(h.exited) // not started yet
		if c.Netns {
			h.Netns = c.nsName(h.Name)
			h.Link = hostLink
			addr := ClusterSubnet.Addr().As4()
			addr[3] += byte(i + 1)
			port := o.Port
			if port == 0 {
				port = 4791
			}
			h.PVRDMAAddress = netip.AddrPortFrom(netip.AddrFrom4(addr), uint16(port))
			if err := c.net.addHost(h.Netns, h.SwitchPort(), net.IP(addr[:]), ClusterSubnet.Bits(), o.MTU); err != nil {
				tb.Fatalf("StartCluster: %v", err)
			}
		} else {
			ip := netip.AddrFrom4([4]byte{127, net3[0], net3[1], byte(2 + i)})
			port := o.Port
			if port == 0 {
				p, err := freePort(ip)
				if err != nil {
					tb.Fatalf("StartCluster: %s: %v", h.Name, err)
				}
				port = p
			}
			h.PVRDMAAddress = netip.AddrPortFrom(ip, uint16(port))
		}
		c.Hosts = append(c.Hosts, h)
	}
	tNet := time.Now()

	// Registered before the agents start, so that it runs after they
	// have been killed: their stderr is complete.
	tb.Cleanup(c.report)
	for _, h := range c.Hosts {
		tb.Cleanup(h.kill)
	}
	errs := make([]error, len(c.Hosts))
	var wg sync.WaitGroup
	for i, h := range c.Hosts {
		wg.Go(func() { errs[i] = h.start() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatalf("StartCluster: %v", err)
	}
	for _, h := range c.Hosts {
		id, err := os.ReadFile(filepath.Join(h.StateDir, "host-id"))
		if err != nil {
			tb.Fatalf("StartCluster: %s: read its host ID: %v", h.Name, err)
		}
		h.id = strings.TrimSpace(string(id))
	}
	where := "loopback addresses (" + c.NoNetnsReason + ")"
	if c.Netns {
		where = "network namespaces " + netnsPrefix + c.ID + "-*"
	}
	tb.Logf("cluster %s: %d hosts in %s; vrdmad binary %v, etcd and fabric %v, network %v, agents %v; total %v",
		c.ID, len(c.Hosts), where, tBuild.Sub(t0).Round(time.Millisecond), tEtcd.Sub(tBuild).Round(time.Millisecond),
		tNet.Sub(tEtcd).Round(time.Millisecond), time.Since(tNet).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	return c
}

// chooseNetns decides whether hosts go in network namespaces.
func chooseNetns(tb testing.TB, m NetnsMode) (bool, string) {
	tb.Helper()
	if m == NetnsAuto {
		switch v := os.Getenv(NetnsEnv); v {
		case "", "auto":
		case "on":
			m = NetnsOn
		case "off":
			m = NetnsOff
		default:
			tb.Fatalf("StartCluster: %s=%q: want on, off or auto", NetnsEnv, v)
		}
	}
	ok, why := netnsUsable()
	switch m {
	case NetnsOff:
		return false, "network namespaces turned off (ClusterOptions.Netns or " + NetnsEnv + "=off)"
	case NetnsOn:
		if !ok {
			tb.Skipf("StartCluster with NetnsOn: %s", why)
		}
		return true, ""
	}
	return ok, why
}

// clusterID returns PID-RANDOM: unique among live test processes, and
// telling which process made a namespace.
func clusterID() string {
	var b [3]byte
	rand.Read(b[:])
	return strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}

// nsName returns the name of the cluster's namespace for role.
func (c *Cluster) nsName(role string) string { return netnsPrefix + c.ID + "-" + role }

// freePort returns a TCP port on ip that was free a moment ago.
func freePort(ip netip.Addr) (int, error) {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w (is the loopback interface up with 127.0.0.0/8?)", ip, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// clusters counts this process's clusters, for loopbackNet.
var clusters atomic.Uint32

// loopbackNet returns the second and third bytes of a new NetnsOff
// cluster's loopback addresses: from this process's pid (64–191: clear
// of 127.0.x.x, which the quickstart, perf --local and tests with fixed
// addresses use) and the cluster's number in it.
func loopbackNet() [2]byte {
	return [2]byte{byte(64 + os.Getpid()%128), byte(clusters.Add(1))}
}

// createFabric creates the switch and the port group.
func (c *Cluster) createFabric() {
	tb := c.tb
	tb.Helper()
	var u [16]byte
	rand.Read(u[:])
	h := hex.EncodeToString(u[:])
	c.Switch = records.Switch{Name: c.opts.Switch, UUID: h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:],
		MTU: c.opts.MTU, UplinkPolicy: records.UplinkSingle}
	if c.opts.RDMA {
		c.Switch.NetworkPolicy = records.NetworkOff
	}
	c.PortGroup = records.PortGroup{Name: c.opts.PortGroup, Key: c.opts.PortGroup, Switch: c.opts.Switch, VLAN: c.opts.VLAN,
		PFCPriority: 3, DSCP: 26, RoCEVersion: cmp.Or(c.opts.RoCEVersion, records.RoCEv2), Subnet: c.opts.Subnet}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.st.Create(ctx, records.SwitchKey(c.Switch.Name), c.Switch); err != nil {
		tb.Fatalf("StartCluster: create switch %s: %v", c.Switch.Name, err)
	}
	if _, err := c.st.Create(ctx, records.PortGroupKey(c.PortGroup.Key), c.PortGroup); err != nil {
		tb.Fatalf("StartCluster: create port group %s: %v", c.PortGroup.Key, err)
	}
}

// report logs every agent's stderr if the test failed, and fails it if an
// agent logged an error (unless AllowAgentErrors).
func (c *Cluster) report() {
	for _, h := range c.Hosts {
		out := h.Stderr()
		if c.tb.Failed() {
			c.tb.Logf("%s (pid %d, %s, namespace %q) stderr:\n%s", h.Name, h.pid(), h.PVRDMAAddress, h.Netns, out)
		}
		if c.opts.AllowAgentErrors {
			continue
		}
		var errs []string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "level=ERROR") {
				errs = append(errs, l)
			}
		}
		if len(errs) > 0 {
			c.tb.Errorf("%s logged %d errors (a bug; set ClusterOptions.AllowAgentErrors if the test expects them):\n%s", h.Name, len(errs), strings.Join(errs, "\n"))
		}
	}
}

// Endpoint returns the client URL of the cluster's etcd (unix://...), for
// --etcd-endpoints.
func (c *Cluster) Endpoint() string { return c.etcd.ClientURL() }

// StopEtcd stops the cluster's etcd for the rest of the test: the
// agents' control plane is out of reach (their caches keep serving what
// they hold), as is the cluster's own Store and Cache.
func (c *Cluster) StopEtcd() { c.etcd.Close() }

// Store returns a store on the cluster's etcd, owned by the cluster.
func (c *Cluster) Store() *store.Store { return c.st }

// Cache returns a watch-driven cache of the cluster's control plane, as an
// agent keeps one, owned by the cluster.
func (c *Cluster) Cache() *member.Cache { return c.cache }

// Host returns the host called name (hostA, ...), or nil.
func (c *Cluster) Host(name string) *Host {
	for _, h := range c.Hosts {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// SwitchNetns returns the name of the namespace that holds the bridge,
// "" without namespaces.
func (c *Cluster) SwitchNetns() string {
	if c.net == nil {
		return ""
	}
	return c.net.sw
}

// PeerNetns makes a network namespace for a machine that is not a vrdma
// host (a native RDMA peer), named prefix, pid and cluster ID, joined to
// the cluster's bridge at address addr/24 with MTU 9000, and removes it
// at tb's cleanup. Both ends of its link cut UDP GSO batches into
// datagrams, as a NIC does on the wire: a capture on its eth0 sees
// packets, not the batches a veth passes whole.
func (c *Cluster) PeerNetns(tb testing.TB, prefix string, addr netip.Addr) string {
	tb.Helper()
	sw := c.SwitchNetns()
	if sw == "" {
		tb.Fatalf("the cluster has no network namespaces: %s", c.NoNetnsReason)
	}
	ns, port := fmt.Sprintf("%s%d-%s", prefix, os.Getpid(), c.ID), fmt.Sprintf("%s%d", prefix, os.Getpid()%1000000)
	run := func(name string, args ...string) {
		tb.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			tb.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
	}
	run("ip", "netns", "add", ns)
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
			tb.Errorf("delete network namespace %s: %v: %s", ns, err, out)
		}
	})
	run("ip", "-n", ns, "link", "set", "lo", "up")
	run("ip", "-n", sw, "link", "add", port, "mtu", "9000", "type", "veth", "peer", "name", "eth0", "mtu", "9000", "netns", ns)
	run("ip", "-n", sw, "link", "set", port, "master", "br0", "up")
	run("ip", "-n", ns, "addr", "add", addr.String()+"/24", "dev", "eth0")
	run("ip", "-n", ns, "link", "set", "eth0", "up")
	for _, dev := range [][2]string{{ns, "eth0"}, {sw, port}} {
		run("ip", "netns", "exec", dev[0], "ethtool", "-K", dev[1], "tx-udp-segmentation", "off")
	}
	return ns
}

// Decide returns the control plane's path between two adapters, each
// "vm/vrdmaN" or a GID, as the agents decide it (member.Cache.Decide).
func (c *Cluster) Decide(ctx context.Context, a, b string) (pathsel.Decision, error) {
	return c.cache.Decide(ctx, a, b)
}

// HostStatus returns h's record and liveness as the control plane has
// them.
func (c *Cluster) HostStatus(ctx context.Context, h *Host) (member.HostStatus, error) {
	return c.cache.Host(ctx, h.ID())
}

// WaitHost waits up to timeout until the control plane shows h in state
// (records.HostUp, records.HostDown), and fails the test otherwise.
func (c *Cluster) WaitHost(tb testing.TB, h *Host, state records.HostState, timeout time.Duration) member.HostStatus {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		hs, err := c.HostStatus(ctx, h)
		cancel()
		if err == nil && hs.Host.State == state {
			return hs
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s (host ID %s) is not %s after %v: state %q, %v", h.Name, h.ID(), state, timeout, hs.Host.State, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Host is one host of a cluster: a vrdmad process with its own socket,
// state directory and PVRDMA address, in its own network namespace when
// the cluster has them. The embedded Env reaches the agent (Socket for
// vrdma.Open with vrdma.WithSocket, DefineVMX, OpenVMX, Stderr); Define and
// Open put VMs' adapters on the cluster's port group.
type Host struct {
	*Env
	// Name is the host's name (--host): hostA, hostB, ...
	Name string
	// Index is the host's position in Cluster.Hosts.
	Index int
	// PVRDMAAddress is the host's --pvrdma-address.
	PVRDMAAddress netip.AddrPort
	// Netns is the host's network namespace ("" on a loopback address),
	// for "ip netns exec NETNS ...".
	Netns string
	// Link is the host's interface in its namespace ("eth0"; "" on a
	// loopback address).
	Link string

	c      *Cluster
	id     string
	starts int
}

// ID returns the host's stable host ID (its state directory's host-id).
func (h *Host) ID() string { return h.id }

// SwitchPort returns the name of the switch's end of the host's veth, in
// the switch's namespace (Cluster.SwitchNetns): where faults on the
// host's frames are put. Only meaningful with network namespaces.
func (h *Host) SwitchPort() string { return "v" + h.Name }

// Addr returns the IP address of the host's PVRDMA address.
func (h *Host) Addr() netip.Addr { return h.PVRDMAAddress.Addr() }

// Define defines VM name on the host, its adapters on the cluster's port
// group. VM names are cluster-wide: use each name on one host only.
func (h *Host) Define(tb testing.TB, name string, o VMOptions) {
	tb.Helper()
	h.DefineVMX(tb, name, h.VMX(o))
}

// Open defines VM name on the host (see Define) and attaches to it; the VM
// is closed at the end of the test.
func (h *Host) Open(tb testing.TB, name string, o VMOptions) *vrdma.VM {
	tb.Helper()
	return h.OpenVMX(tb, name, h.VMX(o))
}

// VMX returns VMX text for o whose adapters are on the cluster's port
// group (ethernetN.dvs.switchId is the switch's UUID).
func (h *Host) VMX(o VMOptions) string {
	return VMXOn(o, h.c.Switch.UUID, h.c.PortGroup.Key)
}

// args returns the host's vrdmad flags.
func (h *Host) args() []string {
	o := h.c.opts
	args := []string{"--socket", h.Socket, "--state-dir", h.StateDir, "--host", h.Name, "--log-level", o.LogLevel,
		"--etcd-endpoints", h.c.Endpoint(), "--switch", o.Switch, "--firewall-pvrdma", "--pvrdma-address", h.PVRDMAAddress.String()}
	for _, l := range []struct {
		flag string
		v    int
	}{{"--max-qp", o.Limits.MaxQP}, {"--max-cq", o.Limits.MaxCQ}, {"--max-mr", o.Limits.MaxMR}, {"--max-pd", o.Limits.MaxPD}} {
		if l.v > 0 {
			args = append(args, l.flag, strconv.Itoa(l.v))
		}
	}
	if o.RDMA && !slices.Contains(o.NoRDMA, h.Index) {
		args = append(args, "--rdma-uplink", "rocev2-soft/"+h.PVRDMAAddress.Addr().String())
	}
	if o.ExtraArgs != nil {
		args = append(args, o.ExtraArgs(h)...)
	}
	return args
}

// start starts the host's agent (in its namespace) and waits until it
// answers on its socket. It is called on any goroutine: it returns an
// error rather than failing the test.
func (h *Host) start() error {
	e := h.Env
	if h.starts > 0 {
		fmt.Fprintf(&e.stderr, "--- testenv: %s restarted at %s ---\n", h.Name, time.Now().Format("15:04:05.000"))
	}
	h.starts++
	cmd := exec.Command(h.c.bin, h.args()...)
	cmd.Stderr = &e.stderr
	// The agent dies with the test process, even one killed before its
	// cleanup ran.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.StartCmd(cmd); err != nil {
		return fmt.Errorf("%s: start %s: %w", h.Name, h.c.bin, err)
	}
	exited := make(chan struct{})
	e.Cmd, e.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		e.waitErr = err
		close(exited)
	}()
	deadline := time.Now().Add(h.c.opts.StartTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		a, err := vrdma.DialAgent(ctx, vrdma.WithSocket(e.Socket))
		cancel()
		if err == nil {
			a.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s: vrdmad exited before serving: %v\n%s", h.Name, e.waitErr, e.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			h.kill()
			return fmt.Errorf("%s: vrdmad does not answer on %s after %v: %v\n%s", h.Name, e.Socket, h.c.opts.StartTimeout, err, e.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pid returns the process ID of the host's agent (the last one started),
// 0 if none was.
func (h *Host) pid() int {
	if h.Cmd == nil || h.Cmd.Process == nil {
		return 0
	}
	return h.Cmd.Process.Pid
}

// Pid returns the process ID of the host's agent (the last one started).
func (h *Host) Pid() int { return h.pid() }

// Running reports whether the host's agent process runs.
func (h *Host) Running() bool {
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

// kill kills the agent, if it runs, and waits for it.
func (h *Host) kill() {
	if h.Running() {
		h.Cmd.Process.Kill()
	}
	<-h.exited
}

// Kill kills the host's agent with SIGKILL, as a crash would, and waits
// until it has exited. Its lease lives on until its TTL (10 s) passes:
// the control plane shows the host up until then (see ExpireLease).
func (h *Host) Kill() { h.kill() }

// Stop stops the host's agent with SIGTERM, as an administrator would
// (it leaves the control plane: its lease is revoked), and waits until it
// has exited; after 10 s it kills it and fails the test.
func (h *Host) Stop(tb testing.TB) {
	tb.Helper()
	if !h.Running() {
		return
	}
	h.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(10 * time.Second):
		h.kill()
		tb.Errorf("%s: vrdmad did not exit within 10 s of SIGTERM; killed", h.Name)
	}
}

// Restart starts the host's agent again, with the same flags, state
// directory (so the same host ID), socket and PVRDMA address, after
// killing it (SIGKILL) if it runs. A restarted agent first waits for the
// lease of its previous run to expire, as vrdmad does after a crash (up
// to the TTL, 10 s, after a Kill): call ExpireLease before to skip that
// wait. It fails the test if the agent does not come up.
func (h *Host) Restart(tb testing.TB) {
	tb.Helper()
	h.kill()
	if err := h.start(); err != nil {
		tb.Fatalf("restart: %v", err)
	}
}

// ExpireLease revokes the host's current lease in etcd, as if its TTL had
// passed: the control plane shows the host down at once. A running agent
// notices and claims its host again under a new lease.
func (h *Host) ExpireLease(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, _, err := store.Get[records.Alive](ctx, h.c.st, records.AliveKey(h.id))
	if errors.Is(err, store.ErrNotFound) {
		return // expired already
	}
	if err != nil {
		tb.Fatalf("%s: read its lease: %v", h.Name, err)
	}
	if _, err := h.c.st.Client().Revoke(ctx, clientv3.LeaseID(a.Lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		tb.Fatalf("%s: revoke its lease %x: %v", h.Name, a.Lease, err)
	}
}

// LinkDown sets the host's interface down in its namespace (ip link set
// eth0 down): the host is cut from the others, as by a pulled cable, until
// LinkUp (the test's cleanup sets it up again). The test is skipped when
// the host is not in a namespace; it fails if ip fails.
func (h *Host) LinkDown(tb testing.TB) {
	tb.Helper()
	h.setLink(tb, "down")
	tb.Cleanup(func() {
		if h.Netns != "" && netnsExists(h.Netns) {
			ipRun("-n", h.Netns, "link", "set", h.Link, "up")
		}
	})
}

// LinkUp sets the host's interface up again in its namespace (ip link set
// eth0 up); see LinkDown.
func (h *Host) LinkUp(tb testing.TB) {
	tb.Helper()
	h.setLink(tb, "up")
}

func (h *Host) setLink(tb testing.TB, state string) {
	tb.Helper()
	if h.Netns == "" {
		tb.Skipf("%s: link %s needs the hosts in network namespaces: %s", h.Name, state, h.c.NoNetnsReason)
	}
	if err := ipRun("-n", h.Netns, "link", "set", h.Link, state); err != nil {
		tb.Fatalf("%s: %v", h.Name, err)
	}
}

// Do runs fn in the host's network namespace, on an OS thread locked to
// it, and waits for it: sockets fn creates, and processes it starts,
// belong to the namespace (goroutines fn starts do not). Without a
// namespace it just calls fn.
func (h *Host) Do(fn func() error) error {
	if h.Netns == "" {
		return fn()
	}
	return sys.InNetns(h.Netns, fn)
}

// Dial connects to address from the host's network namespace. A host
// without a namespace dials from its own loopback address, as its agent
// does: from 127.0.0.1 the connection would not come from a host of the
// switch.
func (h *Host) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() error {
		var d net.Dialer
		if h.Netns == "" && strings.HasPrefix(network, "tcp") {
			d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(h.Addr(), 0))
		}
		var err error
		c, err = d.DialContext(ctx, network, address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", h.Name, err)
	}
	return c, nil
}

// Listen listens on address in the host's network namespace.
func (h *Host) Listen(network, address string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() error {
		var err error
		ln, err = net.Listen(network, address)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", h.Name, err)
	}
	return ln, nil
}

// StartCmd starts cmd in the host's network namespace (cmd.Start); the
// caller waits for it.
func (h *Host) StartCmd(cmd *exec.Cmd) error {
	return h.Do(cmd.Start)
}

// Exec runs the command args in the host's network namespace, for at most
// 30 s, and returns its combined output; the error carries the output.
func (h *Host) Exec(args ...string) (string, error) {
	if len(args) == 0 {
		return "", errors.New("testenv: Exec needs a command to run")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var out SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := h.StartCmd(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		where := "namespace " + h.Netns
		if h.Netns == "" {
			where = "the root namespace"
		}
		return out.String(), fmt.Errorf("%s: %s in %s: %v: %s", h.Name, strings.Join(args, " "), where, err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}
