// SPDX-License-Identifier: Apache-2.0

// Package vmnet gives a host agent's VMs their network: one network
// namespace per VM on the host, shared by its processes, where interface
// vrdmaN carries adapter N's MAC and addresses, attached to its port
// group's layer 2 — on the host a Linux bridge per port group, between
// hosts a VXLAN device per port group over the hosts' PVRDMA addresses,
// its VNI derived from the port group and its VLAN (VNI). Everything is
// made through rtnetlink (github.com/vishvananda/netlink), and named with
// a prefix of the agent's own host ID, so that an agent that starts again
// after a crash finds and removes what its previous run left (New sweeps).
//
// Names, for host ID h (32 hex digits) and VNI v (6 hex digits):
//
//	/run/netns/vrdmavm-h[:8]-VM   the VM's namespace
//	vrb h[:4] v                   the port group's bridge (host namespace)
//	vrx h[:4] v                   the port group's VXLAN device, a port of the bridge
//	vre h[:4] NNNNNNNN            the host end of a veth whose other end is vrdmaN
//
// A Net is safe for concurrent use.
package vmnet

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/sys"
)

// VXLANPort is the UDP port of the VXLAN tunnels (IANA's).
const VXLANPort = 4789

// vxlanOverhead is what VXLAN over IPv4 adds to a frame: outer Ethernet,
// IPv4, UDP and VXLAN headers.
const vxlanOverhead = 50

// defaultMTU is the VM interfaces' MTU where no tunnel lowers it.
const defaultMTU = 1500

// NamespacePrefix starts the name of every VM namespace an agent makes.
const NamespacePrefix = "vrdmavm-"

// Config configures a Net.
type Config struct {
	// HostID is the agent's stable host ID (32 hex digits): the prefix
	// of every name comes from it.
	HostID string
	// Local is this host's PVRDMA address, the tunnels' local end; an
	// invalid address makes no tunnels (VMs reach only this host's).
	Local netip.Addr
	Log   *slog.Logger
}

// Group is a port group as its layer 2 sees it.
type Group struct {
	// Key is the port group's key; "" for an adapter on no port group
	// (a bridge of this host only, VNI 0).
	Key string
	// VNI is VNI(Key, VLAN); 0 for no port group.
	VNI uint32
}

// Adapter is one adapter of a VM: its interface's name, MAC, addresses
// (with the prefix length that makes its port group's subnet on-link) and
// port group.
type Adapter struct {
	Name  string // vrdmaN
	MAC   net.HardwareAddr
	Addrs []netip.Prefix
	Group Group
}

// Net is the VM namespaces, bridges and tunnels of one agent.
type Net struct {
	cfg    Config
	log    *slog.Logger
	nsName string // NamespacePrefix + h[:8] + "-"
	tag    string // h[:4]

	mu     sync.Mutex
	vms    map[string]*vmState // by VM name
	groups map[uint32]*group   // by VNI
	peers  []netip.Addr        // other hosts' PVRDMA addresses
	seq    uint32              // veth names
	closed bool
}

// vmState is what a VM's namespace holds on this host: its name, the
// host ends of its veths, and the VNIs of its adapters' port groups (one
// share of each group per adapter).
type vmState struct {
	ns    string
	veths []string // host ends
	vnis  []uint32
}

// group is one port group's layer 2 on this host.
type group struct {
	bridge string
	vxlan  string // "" without a tunnel
	mtu    int
	users  int                 // VMs' adapters on it
	fdb    map[netip.Addr]bool // peers in the tunnel's FDB
}

// New checks that this process may make namespaces and links (root:
// CAP_SYS_ADMIN and CAP_NET_ADMIN), removes what an earlier run of the
// same host's agent left, and returns the Net.
func New(cfg Config) (*Net, error) {
	if len(cfg.HostID) < 8 {
		return nil, fmt.Errorf("VM namespaces: host ID %q is shorter than 8 digits", cfg.HostID)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("VM namespaces (--vm-netns) need root: the agent makes network namespaces, bridges and VXLAN devices (CAP_SYS_ADMIN and CAP_NET_ADMIN; euid %d): run vrdmad as root, or without --vm-netns", os.Geteuid())
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Local.IsValid() && !cfg.Local.Is4() {
		return nil, fmt.Errorf("VM namespaces: the PVRDMA address %s is not IPv4: the tunnels run over IPv4 (give the host an IPv4 --pvrdma-address, or run vrdmad without --vm-netns)", cfg.Local)
	}
	n := &Net{cfg: cfg, log: cfg.Log.With("component", "vmnet"),
		nsName: NamespacePrefix + cfg.HostID[:8] + "-", tag: cfg.HostID[:4],
		vms: map[string]*vmState{}, groups: map[uint32]*group{}}
	if err := n.sweep(); err != nil {
		return nil, err
	}
	return n, nil
}

// Namespace returns the name of VM vm's namespace (in /run/netns) when it
// has one.
func (n *Net) Namespace(vm string) (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.vms[vm]
	if !ok {
		return "", false
	}
	return s.ns, true
}

// AddVM makes VM vm's namespace with an interface per adapter, attached
// to its port group's bridge (made, with its tunnel, if this is the port
// group's first VM on the host), and returns the namespace's name. On
// failure nothing of it is left.
func (n *Net) AddVM(vm string, ads []Adapter) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return "", errors.New("VM namespaces: the agent is stopping")
	}
	if _, ok := n.vms[vm]; ok {
		return "", fmt.Errorf("VM %s has a namespace already", vm)
	}
	s := &vmState{ns: n.nsName + vm}
	if err := n.makeVMLocked(s, vm, ads); err != nil {
		n.removeLocked(s)
		return "", err
	}
	n.vms[vm] = s
	n.log.Info("VM network namespace made", "vm", vm, "netns", s.ns, "adapters", len(ads))
	return s.ns, nil
}

// makeVMLocked makes s, VM vm's namespace, with its interfaces; what it
// made is in s, for removeLocked to undo on a failure.
//
// +checklocks:n.mu
func (n *Net) makeVMLocked(s *vmState, vm string, ads []Adapter) error {
	if err := newNamed(s.ns); err != nil {
		return fmt.Errorf("VM %s: make network namespace %s: %w", vm, s.ns, err)
	}
	h, err := netns.GetFromName(s.ns)
	if err != nil {
		return fmt.Errorf("VM %s: open network namespace %s: %w", vm, s.ns, err)
	}
	defer h.Close()
	in, err := netlink.NewHandleAt(h)
	if err != nil {
		return fmt.Errorf("VM %s: netlink in namespace %s: %w", vm, s.ns, err)
	}
	defer in.Close()
	lo, err := in.LinkByName("lo")
	if err == nil {
		err = in.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("VM %s: set lo up in %s: %w", vm, s.ns, err)
	}
	for _, ad := range ads {
		g, err := n.groupLocked(ad.Group)
		if err != nil {
			return fmt.Errorf("VM %s, adapter %s: %w", vm, ad.Name, err)
		}
		s.vnis = append(s.vnis, ad.Group.VNI)
		g.users++
		if err := n.addInterfaceLocked(s, h, in, g, ad); err != nil {
			return fmt.Errorf("VM %s, adapter %s: %w", vm, ad.Name, err)
		}
	}
	return nil
}

// addInterfaceLocked makes adapter ad's veth: its host end a port of
// g's bridge, its other end vrdmaN in the VM's namespace h, with the MAC
// and addresses, up.
func (n *Net) addInterfaceLocked(s *vmState, h netns.NsHandle, in *netlink.Handle, g *group, ad Adapter) error {
	br, err := netlink.LinkByName(g.bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", g.bridge, err)
	}
	n.seq++
	host := fmt.Sprintf("vre%s%08x", n.tag, n.seq)
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host, MTU: g.mtu, MasterIndex: br.Attrs().Index},
		PeerName: ad.Name, PeerHardwareAddr: ad.MAC, PeerNamespace: netlink.NsFd(int(h)), PeerMTU: uint32(g.mtu)}
	if err := netlink.LinkAdd(v); err != nil {
		return fmt.Errorf("make veth %s (peer %s in %s): %w", host, ad.Name, s.ns, err)
	}
	s.veths = append(s.veths, host)
	hl, err := netlink.LinkByName(host)
	if err == nil {
		err = netlink.LinkSetUp(hl)
	}
	if err != nil {
		return fmt.Errorf("set veth %s up: %w", host, err)
	}
	l, err := in.LinkByName(ad.Name)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", ad.Name, s.ns, err)
	}
	for _, p := range ad.Addrs {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD // usable at once, as the control plane checked it is unique
		}
		if err := in.AddrAdd(l, a); err != nil {
			return fmt.Errorf("add address %s to %s: %w", p, ad.Name, err)
		}
	}
	if err := in.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", ad.Name, err)
	}
	return nil
}

// groupLocked returns g's layer 2 on this host, making its bridge and,
// for a port group when this host has a PVRDMA address, its tunnel with
// the known peers.
func (n *Net) groupLocked(pg Group) (*group, error) {
	if g, ok := n.groups[pg.VNI]; ok {
		return g, nil
	}
	g := &group{bridge: fmt.Sprintf("vrb%s%06x", n.tag, pg.VNI), mtu: defaultMTU, fdb: map[netip.Addr]bool{}}
	if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: g.bridge}}); err != nil {
		return nil, fmt.Errorf("make bridge %s for port group %q: %w", g.bridge, pg.Key, err)
	}
	n.groups[pg.VNI] = g
	br, err := netlink.LinkByName(g.bridge)
	if err == nil {
		err = netlink.LinkSetUp(br)
	}
	if err != nil {
		n.dropGroupLocked(pg.VNI, g)
		return nil, fmt.Errorf("set bridge %s up: %w", g.bridge, err)
	}
	if pg.VNI != 0 && n.cfg.Local.IsValid() {
		if err := n.addTunnelLocked(g, pg, br); err != nil {
			n.dropGroupLocked(pg.VNI, g)
			return nil, err
		}
	}
	n.log.Info("port group layer 2 made", "port_group", pg.Key, "vni", pg.VNI, "bridge", g.bridge, "vxlan", g.vxlan)
	return g, nil
}

// addTunnelLocked makes g's VXLAN device, VNI pg.VNI from this host's
// PVRDMA address, a port of bridge br, with an FDB entry per peer (the
// flood list; the device learns where each MAC is).
func (n *Net) addTunnelLocked(g *group, pg Group, br netlink.Link) error {
	name := fmt.Sprintf("vrx%s%06x", n.tag, pg.VNI)
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: name, MasterIndex: br.Attrs().Index},
		VxlanId: int(pg.VNI), SrcAddr: n.cfg.Local.AsSlice(), Port: VXLANPort, Learning: true}
	if dev, mtu, ok := linkOfAddr(n.cfg.Local); ok {
		vx.VtepDevIndex = dev
		g.mtu = min(defaultMTU, mtu-vxlanOverhead)
		vx.MTU = g.mtu
	}
	if err := netlink.LinkAdd(vx); err != nil {
		return fmt.Errorf("make VXLAN %s (VNI %d, port group %q) from %s: %w (is the vxlan module there? modprobe vxlan)", name, pg.VNI, pg.Key, n.cfg.Local, err)
	}
	g.vxlan = name
	l, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("set VXLAN %s up: %w", name, err)
	}
	n.syncFDBLocked(g)
	return nil
}

// linkOfAddr returns the index and MTU of the interface holding addr.
func linkOfAddr(addr netip.Addr) (index, mtu int, ok bool) {
	as, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, 0, false
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return 0, 0, false
			}
			return l.Attrs().Index, l.Attrs().MTU, true
		}
	}
	return 0, 0, false
}

// zeroMAC is the FDB's flood entry: frames to unknown and broadcast MACs
// go to every such destination.
var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// fdbEntry is the flood entry of tunnel link toward peer.
func fdbEntry(link int, peer netip.Addr) *netlink.Neigh {
	return &netlink.Neigh{LinkIndex: link, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT | netlink.NUD_NOARP, HardwareAddr: zeroMAC, IP: peer.AsSlice()}
}

// syncFDBLocked makes g's tunnel's flood list the peers.
func (n *Net) syncFDBLocked(g *group) {
	if g.vxlan == "" {
		return
	}
	l, err := netlink.LinkByName(g.vxlan)
	if err != nil {
		n.log.Warn("VXLAN device gone", "vxlan", g.vxlan, "err", err)
		return
	}
	want := map[netip.Addr]bool{}
	for _, p := range n.peers {
		want[p] = true
		if g.fdb[p] {
			continue
		}
		if err := netlink.NeighAppend(fdbEntry(l.Attrs().Index, p)); err != nil {
			n.log.Warn("VXLAN peer not added", "vxlan", g.vxlan, "peer", p, "err", err)
			continue
		}
		g.fdb[p] = true
	}
	for p := range g.fdb {
		if want[p] {
			continue
		}
		if err := netlink.NeighDel(fdbEntry(l.Attrs().Index, p)); err != nil && !errors.Is(err, unix.ENOENT) {
			n.log.Warn("VXLAN peer not removed", "vxlan", g.vxlan, "peer", p, "err", err)
		}
		delete(g.fdb, p)
	}
}

// SetPeers sets the other hosts' PVRDMA addresses, the far ends of every
// tunnel, and updates the tunnels.
func (n *Net) SetPeers(peers []netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ps []netip.Addr
	for _, p := range peers {
		if p = p.Unmap(); p.Is4() && p != n.cfg.Local && !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	slices.SortFunc(ps, netip.Addr.Compare)
	if slices.Equal(ps, n.peers) {
		return
	}
	n.peers = ps
	for _, g := range n.groups {
		n.syncFDBLocked(g)
	}
	n.log.Info("VXLAN peers", "peers", ps)
}

// RemoveVM removes VM vm's namespace and interfaces, and the bridges and
// tunnels no VM uses any more. Processes still in the namespace keep it
// (without its interfaces) until they end.
func (n *Net) RemoveVM(vm string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.vms[vm]
	if !ok {
		return
	}
	delete(n.vms, vm)
	n.removeLocked(s)
	n.log.Info("VM network namespace removed", "vm", vm, "netns", s.ns)
}

// removeLocked removes what s holds: the host ends of its veths (their
// other ends go with them), its namespace's name, and its share of the
// port groups.
func (n *Net) removeLocked(s *vmState) {
	for _, v := range s.veths {
		if l, err := netlink.LinkByName(v); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				n.log.Warn("veth not removed", "veth", v, "err", err)
			}
		}
	}
	if err := deleteNamed(s.ns); err != nil {
		n.log.Warn("network namespace not removed", "netns", s.ns, "err", err)
	}
	for _, vni := range s.vnis {
		g := n.groups[vni]
		if g == nil {
			continue
		}
		if g.users--; g.users <= 0 {
			n.dropGroupLocked(vni, g)
		}
	}
}

// dropGroupLocked removes a port group's tunnel and bridge.
func (n *Net) dropGroupLocked(vni uint32, g *group) {
	for _, name := range []string{g.vxlan, g.bridge} {
		if name == "" {
			continue
		}
		if l, err := netlink.LinkByName(name); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				n.log.Warn("link not removed", "link", name, "err", err)
			}
		}
	}
	delete(n.groups, vni)
}

// Close removes every namespace, interface, bridge and tunnel the Net
// made; a Net is not used after.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for vm, s := range n.vms {
		delete(n.vms, vm)
		n.removeLocked(s)
	}
	return n.sweepLocked()
}

// sweep removes every namespace and link named with this agent's prefix:
// what a run that did not stop cleanly left.
func (n *Net) sweep() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sweepLocked()
}

func (n *Net) sweepLocked() error {
	var errs []error
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("VM namespaces: list links: %w", err)
	}
	// veths first (their VMs' ends go with them), then tunnels, bridges.
	for _, kind := range []string{"vre", "vrx", "vrb"} {
		for _, l := range links {
			name := l.Attrs().Name
			if !strings.HasPrefix(name, kind+n.tag) {
				continue
			}
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("remove link %s: %w", name, err))
			} else {
				n.log.Info("removed a link of an earlier run", "link", name)
			}
		}
	}
	ents, _ := os.ReadDir(sys.NetnsDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), n.nsName) {
			continue
		}
		if err := deleteNamed(e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		n.log.Info("removed a network namespace of an earlier run", "netns", e.Name())
	}
	if len(errs) > 0 {
		return fmt.Errorf("VM namespaces: cleaning up what an earlier run left: %w", errors.Join(errs...))
	}
	return nil
}

// newNamed makes network namespace name in /run/netns, on an OS thread
// that returns to this process's namespace after (or ends, if it cannot).
func newNamed(name string) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open this thread's namespace: %w", err)
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		if serr := netns.Set(orig); serr != nil {
			// The thread stays locked and ends with the goroutine.
			done <- errors.Join(err, fmt.Errorf("return to the agent's namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// deleteNamed removes network namespace name from /run/netns: its bind
// mount (none on a file left half made) and its file.
func deleteNamed(name string) error {
	p := filepath.Join(sys.NetnsDir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount network namespace %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove network namespace %s: %w", p, err)
	}
	return nil
}
