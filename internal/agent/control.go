// SPDX-License-Identifier: Apache-2.0

package agent

// The agent's side of the control plane (docs/control-plane.md, "vrdmad").
// With Config.Control set, the agent
//
//   - opens the store: an embedded single-node etcd under the state
//     directory by default, or the external cluster at Control.Endpoints;
//   - registers its host under a lease (member.Register) and keeps a
//     watch-driven member.Cache of the inventory;
//   - publishes every attached VM with its adapters (member.PublishVM) and
//     removes it when it detaches;
//   - resolves connect targets ("vm/vrdmaN" or a GID) that are not on this
//     host through the cache (etcd only on a miss), and decides every new
//     connection's path with pathsel through the cache.
//
// Only connection setup reads the control plane: the data path of an
// established QP never does, so QPs keep moving data while etcd is out of
// reach. A peer on another host is reached over the tcp path, on the
// links to other hosts (package hostlink), or over the rdma path, as
// path selection says; a path this host cannot run is refused with an
// error (code unavailable) that carries the decision: the path, the
// reason, and every rejected candidate with why.

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/device"
	"github.com/vrdma/vrdma/internal/hostkey"
	"github.com/vrdma/vrdma/internal/netcheck"
)

// ControlConfig configures the agent's control plane. A nil
// Config.Control runs the agent standalone: only same-host peers, no etcd.
type ControlConfig struct {
	// Endpoints of an external etcd cluster; empty runs an embedded
	// single-node etcd in DataDir.
	Endpoints []string
	// TLS files for an external cluster.
	TLS store.TLSFiles
	// DataDir of the embedded etcd; default <StateDir>/etcd.
	DataDir string

	// The host record (records.Host) beyond ID, name and version.
	PVRDMAAddress  netip.AddrPort   // Net.PVRDMAVmknic: address:port of inter-host PVRDMA traffic
	FirewallPVRDMA bool             // the "pvrdma" firewall ruleset is enabled
	Switch         string           // the distributed switch the host is on
	Uplinks        []records.Uplink // RDMA uplinks on Switch: the first rocev2-soft one runs the agent's RoCEv2 engine (the rdma path)

	// LeaseTTL is how long after the agent stops (or loses etcd) its host
	// is shown down; default 10 s.
	LeaseTTL time.Duration
	// LookupTimeout bounds a lookup that misses the cache and goes to
	// etcd, and each publish or remove of a VM; default 3 s.
	LookupTimeout time.Duration
	// NICPoll is how often the agent reads its uplinks' NIC state from
	// the kernel and publishes it when it changed (records.Uplink.
	// Observed); default 30 s, negative: only when it starts.
	NICPoll time.Duration
	// Handshakes and HandshakesPerSource bound the connections from other
	// hosts in their handshake at once, in all and per source address
	// (hostlink.Config); 0: hostlink's defaults, 64 and 4.
	Handshakes, HandshakesPerSource int
	// Lanes and StripeMin are the tcp path's lanes to each peer host and
	// its least stripe (hostlink.Config); 0: hostlink's defaults.
	Lanes     int
	StripeMin uint64
	// StartTimeout bounds opening the store and registering; default 60 s.
	StartTimeout time.Duration
	// UnsafeNoFsync turns fsync off in the embedded etcd (tests only).
	UnsafeNoFsync bool
	// EtcdLog receives etcd's own logs as JSON lines; nil logs them
	// through the agent's logger (component=etcd): the client's warnings
	// and errors, the embedded server's errors.
	EtcdLog io.Writer
}

// control is a running control-plane client of the agent.
type control struct {
	a      *Agent
	cfg    ControlConfig
	log    *slog.Logger
	st     *store.Store
	member *member.Member
	cache  *member.Cache

	pubMu sync.Mutex // orders publishes and removals of VMs

	stop chan struct{}  // closed by stopControl: retries give up
	wg   sync.WaitGroup // publish retries
}

// ParseUplink parses an RDMA uplink given as KIND/ADDRESS[/GID][@DEVICE]:
// "rocev2-soft/192.0.2.10", "hca/192.0.2.10/fe80::1@mlx5_0". Without a GID
// the address's GID form is used (IPv4-mapped for an IPv4 address).
func ParseUplink(s string) (records.Uplink, error) {
	var u records.Uplink
	spec, dev, _ := strings.Cut(s, "@")
	parts := strings.SplitN(spec, "/", 3)
	if len(parts) < 2 {
		return u, fmt.Errorf("uplink %q: want KIND/ADDRESS[/GID][@DEVICE], e.g. rocev2-soft/192.0.2.10", s)
	}
	u.Kind = records.UplinkKind(parts[0])
	if u.Kind != records.UplinkSoftRoCEv2 && u.Kind != records.UplinkHCA {
		return u, fmt.Errorf("uplink %q: kind %q is not %q or %q", s, parts[0], records.UplinkSoftRoCEv2, records.UplinkHCA)
	}
	addr, err := netip.ParseAddr(parts[1])
	if err != nil {
		return u, fmt.Errorf("uplink %q: address: %v", s, err)
	}
	u.Address = addr
	u.GID = records.GIDOf(addr)
	if len(parts) == 3 {
		if u.GID, err = records.ParseGID(parts[2]); err != nil {
			return u, fmt.Errorf("uplink %q: GID: %v", s, err)
		}
	}
	u.Device = dev
	return u, nil
}

// startControl opens the store, registers the host and starts the cache.
func (a *Agent) startControl() error {
	cfg := *a.cfg.Control
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Join(a.cfg.StateDir, "etcd")
	}
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = 3 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StartTimeout)
	defer cancel()
	log := a.log.With("component", "control")
	scfg := store.Config{Endpoints: cfg.Endpoints, TLS: cfg.TLS, Logger: log, EtcdLog: cfg.EtcdLog}
	if cfg.EtcdLog == nil {
		scfg.EtcdLogger = a.log.With("component", "etcd")
	}
	if len(cfg.Endpoints) > 0 {
		log.Info("connecting to the control plane", "endpoints", cfg.Endpoints, "give_up_after", cfg.StartTimeout)
	}
	if len(cfg.Endpoints) == 0 {
		scfg.DataDir = cfg.DataDir
		scfg.UnsafeNoFsync = cfg.UnsafeNoFsync
	}
	st, err := store.Open(ctx, scfg)
	if err != nil {
		where := "embedded etcd in " + cfg.DataDir
		if len(cfg.Endpoints) > 0 {
			where = "etcd at " + strings.Join(cfg.Endpoints, ",")
		}
		return fmt.Errorf("control plane (%s): %w (or run standalone with --no-control-plane)", where, err)
	}
	observed := observeUplinks(cfg.Uplinks, log)
	h := records.Host{ID: a.hostID, Name: a.cfg.Host, PVRDMAAddress: cfg.PVRDMAAddress, FirewallPVRDMA: cfg.FirewallPVRDMA,
		Uplinks: observed, Switch: cfg.Switch, AgentVersion: Version, State: records.HostUp,
		HostKey: hostkey.Encode(a.hostKey.Public().(ed25519.PublicKey))}
	m, err := member.Register(ctx, st, h, member.Options{TTL: cfg.LeaseTTL, Logger: log})
	if err != nil {
		st.Close()
		return fmt.Errorf("control plane: register host %s: %w", h.Label(), err)
	}
	c := &control{a: a, cfg: cfg, log: log, st: st, member: m, stop: make(chan struct{})}
	c.cache = member.NewCache(st, member.CacheConfig{LookupTimeout: cfg.LookupTimeout, Logger: log})
	// No VM is attached yet: VMs a previous run of this host left
	// published (it crashed) are gone.
	if vms, _, _, err := store.List[records.VM](ctx, st, records.VMPrefix); err == nil {
		for _, it := range vms {
			// A managed VM keeps its record, less the adapters it had
			// here (also when it was powered off while this host was down).
			if v := it.Value; v.Host == a.hostID && (v.Power != records.PoweredOff || len(v.Adapters) > 0) {
				if err := member.RemoveVMOf(ctx, st, v.Name, a.hostID); err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, member.ErrPlacement) {
					log.Warn("remove VM left by a previous run", "vm", it.Value.Name, "err", err)
				}
			}
		}
	}
	a.ctl = c
	if poll := cmp.Or(cfg.NICPoll, defaultNICPoll); poll > 0 && len(cfg.Uplinks) > 0 {
		c.wg.Add(1)
		go c.pollNICs(poll, observed)
	}
	log.Info("control plane", "endpoints", st.Endpoints(), "embedded", st.Embedded() != nil, "switch", cfg.Switch)
	return nil
}

// stopControl removes the host's VMs (none is attached any more), revokes
// the host's lease and closes the store.
func (a *Agent) stopControl() {
	c := a.ctl
	if c == nil {
		return
	}
	close(c.stop)
	c.wg.Wait()
	c.cache.Close()
	if err := c.member.Close(); err != nil {
		c.log.Warn("leave the control plane", "err", err)
	}
	if err := c.st.Close(); err != nil {
		c.log.Warn("close the control plane", "err", err)
	}
}

// ControlCache returns the agent's control-plane cache, or nil when the
// agent runs standalone.
func (a *Agent) ControlCache() *member.Cache {
	if a.ctl == nil {
		return nil
	}
	return a.ctl.cache
}

// ControlStore returns the agent's control-plane store, or nil when the
// agent runs standalone. It stays owned by the agent.
func (a *Agent) ControlStore() *store.Store {
	if a.ctl == nil {
		return nil
	}
	return a.ctl.st
}

// publishAdapterBytes is what the control-plane write quota charges for
// each adapter's records and for the VM record's fields besides its VMX:
// more than they take.
const publishAdapterBytes = 1024

// publishVM publishes attached VM v and its adapters, assigning adapter
// addresses from their port groups' subnets (address.go). It fails the
// attach only when an address is taken (CodeExists) or the attaching
// user's hourly control-plane writes are spent (CodeLimit, package
// quota): otherwise a VM the
// control plane does not know is reachable from this host only, and the
// warning says why.
func (a *Agent) publishVM(v *device.Context, uid uint32) error {
	c := a.ctl
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
	defer cancel()
	// The VM's own record: its VMX and owner (from the state directory;
	// a VM defined before owners existed is its attaching user's).
	owner := records.Owner{UID: uid}
	vmx, o, ok := a.proc.LocalVM(v.Name())
	if ok {
		owner = o
	}
	rec := records.VM{Name: v.Name(), VMX: string(vmx), Owner: owner, Host: a.hostID, Power: records.PoweredOn}
	if len(rec.VMX) > records.MaxVMXBytes {
		rec.VMX = ""
	}
	// Every attach writes the record (and its adapters') anew, and etcd
	// keeps each revision until it compacts: the attaching user pays
	// from its hourly budget (quota.Ledger.TakeWrite).
	if err := a.quota.TakeWrite(uid, uint64(len(rec.VMX))+uint64(len(v.Adapters()))*publishAdapterBytes+publishAdapterBytes); err != nil {
		return err
	}
	var ads []records.Adapter
	type assignment struct {
		i  int
		pr netip.Prefix
	}
	var assigned []assignment
	for i, ad := range v.Adapters() {
		vc := v.Config().Adapters[i]
		pg := vc.PortGroupID
		if pg == "" {
			c.log.Warn("adapter not on a distributed port group (no ethernetN.dvs.portgroupId): reachable from this host only",
				"vm", v.Name(), "adapter", ad.Name())
			continue
		}
		sw := vc.SwitchID
		if sw == "" {
			sw = c.cfg.Switch
		}
		if p, err := c.cache.PortGroup(ctx, pg); err == nil {
			if sw != "" && !sameSwitch(c, ctx, sw, p.Switch) {
				c.log.Warn("adapter's switch is not its port group's", "vm", v.Name(), "adapter", ad.Name(),
					"switch", sw, "port_group", pg, "port_group_switch", p.Switch)
			}
			ad.SetActiveMTU(uint32(roceMTU(c, ctx, p)))
			if pr, ok := p.SubnetPrefix(); ok && !ad.IPv4().IsValid() {
				if err := c.assignIPv4(ctx, ad, pr, nil); err != nil {
					c.log.Warn("adapter has no address", "vm", v.Name(), "adapter", ad.Name(), "port_group", pg, "err", err)
				} else {
					assigned = append(assigned, assignment{i, pr})
					c.log.Info("adapter address assigned", "vm", v.Name(), "adapter", ad.Name(), "port_group", pg, "ipv4", ad.IPv4())
				}
			}
		}
		ads = append(ads, records.Adapter{VM: v.Name(), Index: ad.Index(), MAC: ad.MAC().String(), GID: netip.AddrFrom16(ad.GID()),
			PortGroup: pg, NativeEndpoint: vc.NativeEndpoint})
	}
	if err := c.checkAddresses(ctx, v); err != nil { // address.go
		c.log.Warn("VM refused: an adapter address is taken, or cannot be checked", "vm", v.Name(), "err", err)
		return err
	}
	err := c.publish(ctx, v, rec, ads)
	// An assigned address another host took meanwhile: assign again.
	for try := 0; errors.Is(err, member.ErrGIDInUse) && len(assigned) > 0 && try < 3; try++ {
		taken := map[netip.Addr]bool{}
		for _, as := range assigned {
			ad := v.Adapters()[as.i]
			taken[ad.IPv4()] = true
			ad.ClearIPv4()
			if aerr := c.assignIPv4(ctx, ad, as.pr, taken); aerr != nil {
				break
			}
			ads[as.i].GID = netip.AddrFrom16(ad.GID())
		}
		err = c.publish(ctx, v, rec, ads)
	}
	if err == nil {
		return nil
	}
	if cerr := addressConflict(v, err); cerr != nil {
		c.log.Warn("VM refused: an adapter address is taken", "vm", v.Name(), "err", err)
		return cerr
	}
	if !errors.Is(err, store.ErrUnavailable) {
		c.log.Warn("VM not published in the control plane: other hosts cannot reach it", "vm", v.Name(), "err", err)
		return nil
	}
	// etcd is out of reach: keep trying in the background while the VM
	// stays attached, so that it appears once etcd is back.
	c.log.Warn("VM not published in the control plane yet (unreachable); retrying", "vm", v.Name(), "err", err)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		wait := time.Second
		for {
			select {
			case <-c.stop:
				return
			case <-time.After(wait):
			}
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
			err := c.publish(ctx, v, rec, ads)
			cancel()
			switch {
			case err == nil:
				c.log.Info("VM published in the control plane", "vm", v.Name())
				return
			case errors.Is(err, errDetached):
				return
			case errors.Is(err, member.ErrGIDInUse):
				// Another host's VM took the address while this host was
				// cut off: connects to this VM's adapters are refused
				// (checkLocalTarget) until it attaches with another.
				c.log.Warn("VM not published: rule address-unique: another host's VM holds one of its addresses; its adapters take no connections: detach it and give it another address", "vm", v.Name(), "err", err)
				return
			case !errors.Is(err, store.ErrUnavailable):
				c.log.Warn("VM not published in the control plane: other hosts cannot reach it", "vm", v.Name(), "err", err)
				return
			}
			wait = min(2*wait, 10*time.Second)
		}
	}()
	return nil
}

var errDetached = errors.New("VM detached")

// publish publishes v unless it is detaching, and waits until the cache
// sees it, so that the VM is in the cache before anyone is told it is
// attached.
func (c *control) publish(ctx context.Context, v *device.Context, rec records.VM, ads []records.Adapter) error {
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	if v.Dying() {
		return errDetached
	}
	if err := member.PublishVM(ctx, c.st, rec, ads); err != nil {
		return err
	}
	if _, rev, err := store.Get[records.VM](ctx, c.st, records.VMKey(v.Name())); err == nil {
		if err := c.cache.WaitRev(ctx, rev); err != nil {
			c.log.Warn("control-plane cache lags", "vm", v.Name(), "err", err)
		}
	}
	return nil
}

func sameSwitch(c *control, ctx context.Context, id, name string) bool {
	if id == name {
		return true
	}
	sw, err := c.cache.Switch(ctx, name)
	if err != nil {
		return true // cannot tell; pathsel decides
	}
	return records.SameUUID(sw.UUID, id)
}

// roceMTU is the RoCE MTU of port group p's QPs: its own, or the largest
// its switch's MTU carries; 0 when neither is known.
func roceMTU(c *control, ctx context.Context, p records.PortGroup) int {
	if p.RoCEMTU != 0 {
		return p.RoCEMTU
	}
	sw, err := c.cache.Switch(ctx, p.Switch)
	if err != nil {
		return 0
	}
	return netcheck.MaxRoCEMTU(sw.MTU)
}

// unpublishVM removes VM v from the control plane after it detached.
func (a *Agent) unpublishVM(v *device.Context) {
	c := a.ctl
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
	defer cancel()
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	// Only the record this host published: the VM may run elsewhere now.
	err := member.RemoveVMOf(ctx, c.st, v.Name(), a.hostID)
	if err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, member.ErrPlacement) {
		c.log.Warn("VM not removed from the control plane", "vm", v.Name(), "err", err)
	}
}

// endName is how the control plane names adapter ad: "vm/vrdmaN".
func endName(ad *device.Adapter) string { return ad.Context().Name() + "/" + ad.Name() }

// explain formats a decision for error messages: the path and reason, then
// every rejected candidate with why.
func explain(d pathsel.Decision) string {
	var b strings.Builder
	if d.Path != "" {
		fmt.Fprintf(&b, "decision: %s", d.String())
	}
	if len(d.Rejected) > 0 {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString("rejected: ")
		for i, r := range d.Rejected {
			if i > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%s: %s", r.Path, r.Why)
		}
	}
	return b.String()
}

// decideLocal decides the path between local adapters from and to, and
// fails closed. Both must pass rule address-unique (checkLocalTarget).
// Two adapters on no port group have no decision to make: ok is false,
// and the agent uses memcpy, as standalone. Otherwise both must be on a
// port group and path selection must decide: a refusal, and any failure
// to decide (the directory out of reach for something uncached), is an
// error (rule same-host-decision).
func (c *control) decideLocal(from, to *device.Adapter) (d pathsel.Decision, ok bool, err error) {
	for _, ad := range []*device.Adapter{to, from} {
		if err := c.checkLocalTarget(ad, "remote"); err != nil { // address.go
			return d, false, err
		}
	}
	pf, pt := portGroupOf(from), portGroupOf(to)
	switch {
	case pf == "" && pt == "":
		return d, false, nil
	case pf == "" || pt == "":
		on, off := to, from
		if pf != "" {
			on, off = from, to
		}
		return d, false, refusedBy(reasonSameHost, abi.Errorf(abi.CodeRefused, "remote", "rule same-host-decision: %s cannot connect to %s: %s is on port group %s and %s on none, so path selection cannot check their VLANs; put both on a port group (ethernetN.dvs.portgroupId), or neither",
			endName(from), endName(to), endName(on), portGroupOf(on), endName(off)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
	defer cancel()
	d, err = c.cache.Decide(ctx, endName(from), endName(to))
	switch reason := policyReason(err); {
	case err == nil:
		return d, true, nil
	case reason != "":
		msg := fmt.Sprintf("%s cannot connect to %s: %v", endName(from), endName(to), err)
		if e := explain(d); e != "" {
			msg += " (" + e + ")"
		}
		return d, false, refusedBy(reason, abi.Errorf(abi.CodeRefused, "remote", "%s", msg))
	default:
		return d, false, refusedBy(reasonSameHost, abi.Errorf(abi.CodeUnavailable, "remote", "rule same-host-decision: cannot decide the path from %s to %s, both on this host: %v; connect once the control plane answers",
			endName(from), endName(to), err))
	}
}

// lookupRemote resolves target, a "vm/vrdmaN" or GID that is not an
// attached adapter of this host, in the control plane (cache first) and
// decides the path from adapter from to it. The error explains a refusal
// or a failed lookup; a path this agent cannot serve is refused too.
func (c *control) lookupRemote(from *device.Adapter, target, field string) (member.End, pathsel.Decision, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LookupTimeout)
	defer cancel()
	end, err := c.cache.ResolveEnd(ctx, target)
	switch {
	case errors.Is(err, member.ErrBadTarget):
		return end, pathsel.Decision{}, abi.Errorf(abi.CodeInvalid, field, "%q is neither \"vm/vrdmaN\" nor a GID", target)
	case errors.Is(err, store.ErrNotFound):
		return end, pathsel.Decision{}, abi.Errorf(abi.CodeNotFound, field, "%s is not attached on any host (not in the control plane's endpoint directory): %v", target, err)
	case errors.Is(err, store.ErrUnavailable):
		return end, pathsel.Decision{}, refusedBy(reasonControlPlaneDown, abi.Errorf(abi.CodeUnavailable, field, "cannot look up %s: it is not in host %s's cache and the control plane is unreachable: %v", target, c.a.cfg.Host, err))
	case err != nil:
		return end, pathsel.Decision{}, refusedBy(reasonControlPlaneDown, abi.Errorf(abi.CodeUnavailable, field, "cannot look up %s in the control plane: %v", target, err))
	}
	if end.Endpoint.Host == c.a.hostID {
		return end, pathsel.Decision{}, refusedBy(reasonNotAttached, abi.Errorf(abi.CodeUnavailable, field, "%s is published on this host (%s) but not attached: start its workload", end.Endpoint.Name(), c.a.cfg.Host))
	}
	d, err := c.cache.Decide(ctx, endName(from), target)
	if err != nil {
		msg := fmt.Sprintf("%s cannot connect to %s on host %s: %v", endName(from), end.Endpoint.Name(), end.Host.Host.Label(), err)
		if e := explain(d); e != "" {
			msg += " (" + e + ")"
		}
		code, reason := abi.CodeRefused, policyReason(err)
		if reason == "" {
			code, reason = abi.CodeUnavailable, reasonControlPlaneDown
		}
		return end, d, refusedBy(reason, abi.Errorf(code, field, "%s", msg))
	}
	if !(d.Path == pathsel.TCP && c.a.up != nil || d.Path == pathsel.RDMA && c.a.rdmaFor(end.PortGroup) != nil && c.a.up != nil) {
		return end, d, refusedBy(reasonPathUnavailable, abi.Errorf(abi.CodeUnavailable, field, "path not available yet: %s is on host %s, and this agent has no %s path to other hosts yet (%s)",
			end.Endpoint.Name(), end.Host.Host.Label(), d.Path, explain(d)))
	}
	return end, d, nil
}

// resolveConnect finds the adapter a connect from adapter from targets. Same-host
// targets resolve locally (and must pass path selection, when the control
// plane can decide); others are looked up in the control plane and
// returned as end, reached over the tcp path. A target refused is
// counted (decisions.go).
func (a *Agent) resolveConnect(from *device.Adapter, remote string) (*device.Adapter, *member.End, error) {
	ad, end, err := a.resolveTarget(from, remote)
	if err != nil {
		a.decisions.count("connect", "", err)
	}
	return ad, end, err
}

// resolveTarget is resolveConnect but for the counting.
func (a *Agent) resolveTarget(from *device.Adapter, remote string) (*device.Adapter, *member.End, error) {
	ad, err := a.cm.Resolve(remote)
	c := a.ctl
	if c == nil {
		var ae *abi.Error
		if errors.As(err, &ae) && ae.Code == abi.CodeUnavailable {
			return nil, nil, refusedBy(reasonNoControlPlane, ae) // not on this host, and no other host to look on
		}
		return ad, nil, err
	}
	if err == nil {
		if _, _, perr := c.decideLocal(from, ad); perr != nil {
			return nil, nil, perr
		}
		return ad, nil, nil
	}
	var ae *abi.Error
	if !errors.As(err, &ae) || ae.Code != abi.CodeUnavailable {
		return nil, nil, err
	}
	end, _, err := c.lookupRemote(from, remote, "remote")
	if err != nil {
		return nil, nil, err
	}
	return nil, &end, nil
}
