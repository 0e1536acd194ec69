// SPDX-License-Identifier: Apache-2.0

// Package member is a host's membership in the control plane and its
// view of everyone else.
//
// Register puts the host's record in the store and proves the host alive
// with a lease: the host's Alive record lives under the lease, the Member
// keeps the lease alive, and when the lease expires (the agent died, or
// could not reach etcd for a TTL) etcd deletes the record and every cache
// shows the host down. A host that is down gets no new connections
// (package pathsel); its established QPs fail only when their own transport
// times out, never because of etcd.
//
// Cache is an agent's watch-driven copy of the inventory: hosts (with their
// liveness), switches, port groups, VMs, adapters and the endpoint
// directory. Lookups are served from memory; a lookup of something the
// cache does not hold goes to etcd, bounded by a timeout, and fails with
// store.ErrUnavailable when etcd cannot be reached. What is cached keeps
// working while etcd is unreachable.
//
// PublishVM and RemoveVM write a VM, its adapters and their directory
// entries in one transaction.
package member

// Goroutines. A Member owns one, keepalive: it waits for the lease's
// session to end (the lease expired or was revoked, or etcd stayed out of
// reach past the TTL) and claims the host again under a new lease, with
// backoff, until Close. The session itself (concurrency.Session) runs the
// etcd client's lease keep-alive loop; Close revokes it. Close stops
// keepalive and waits for it.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// ErrHostIDInUse: another live agent holds the host ID.
var ErrHostIDInUse = errors.New("host ID in use")

// revokeWait bounds the revocation of the host's lease at Close.
const revokeWait = 2 * time.Second

// ErrHostNameInUse: a live host with another host ID has the name.
var ErrHostNameInUse = errors.New("host name in use")

// Options configure Register.
type Options struct {
	// TTL is the lease's time to live: how long after its agent stops
	// (or loses etcd) a host is shown down. Rounded up to whole seconds,
	// at least 1 s; etcd raises it to its own minimum (1.5 election
	// timeouts). Default 10 s.
	TTL time.Duration
	// TakeoverWait is how long Register waits for a previous lease of
	// the same host ID to expire (an agent restarted right after a crash)
	// before failing with ErrHostIDInUse. Default TTL + 2 s.
	TakeoverWait time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Member is a registered host. It is safe for concurrent use.
type Member struct {
	st   *store.Store
	id   string
	ttl  int64 // seconds
	opts Options
	log  *slog.Logger

	ctx    context.Context // lives until Close has revoked the lease
	cancel context.CancelFunc
	stopc  chan struct{} // closed by Close: keepalive must return
	done   chan struct{} // closed when keepalive has returned
	once   sync.Once

	mu sync.Mutex
	// the current lease; nil while unclaimed
	sess *concurrency.Session // +checklocks:mu
	// when sess was claimed
	claimed time.Time // +checklocks:mu
}

// Register registers host h: it claims the host under a lease, then
// creates or updates h's record. What an administrator set in the record
// (vrdmactl host configure) and h leaves unset is kept: a "maintenance"
// state, the inventory placement, the PVRDMA address and vmknic when h
// has none, the pvrdma firewall ruleset when it is on, and the declared
// network state of every uplink h still has (vrdmactl host uplink
// declare) when h declares none for it. Register claims
// the host under a
// lease that the Member keeps alive. If another live agent holds the same
// host ID, Register waits up to TakeoverWait for its lease to expire, then
// fails with ErrHostIDInUse.
func Register(ctx context.Context, st *store.Store, h records.Host, opts Options) (*Member, error) {
	if opts.TTL <= 0 {
		opts.TTL = 10 * time.Second
	}
	ttl := int64(math.Ceil(opts.TTL.Seconds()))
	if ttl < 1 {
		ttl = 1
	}
	if opts.TakeoverWait <= 0 {
		opts.TakeoverWait = time.Duration(ttl)*time.Second + 2*time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if h.State == "" || h.State == records.HostDown {
		h.State = records.HostUp
	}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	if err := checkNameFree(ctx, st, h); err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(context.Background())
	m := &Member{
		st: st, id: h.ID, ttl: ttl, opts: opts,
		log:    opts.Logger.With("host", h.ID),
		ctx:    mctx,
		cancel: cancel,
		stopc:  make(chan struct{}),
		done:   make(chan struct{}),
	}
	sess, err := m.claim(ctx, h.AgentVersion, opts.TakeoverWait)
	if err != nil {
		cancel()
		return nil, err
	}
	// The record changes only once the host is claimed: a second agent
	// with this host ID must not rewrite the live host's record (its
	// address, switch, name) before it is refused.
	if _, _, err := store.Update(ctx, st, records.HostKey(h.ID), func(old *records.Host) (*records.Host, error) {
		n := h
		if old != nil {
			if old.State == records.HostMaintenance {
				n.State = records.HostMaintenance
			}
			if n.Inventory == (records.Inventory{}) {
				n.Inventory = old.Inventory
			}
			if !n.PVRDMAAddress.IsValid() {
				n.PVRDMAAddress = old.PVRDMAAddress
				if n.PVRDMAVmknic == "" {
					n.PVRDMAVmknic = old.PVRDMAVmknic
				}
			}
			n.FirewallPVRDMA = n.FirewallPVRDMA || old.FirewallPVRDMA
			n.PVRDMANamespaces = old.PVRDMANamespaces // an administrator's setting only
			n.Uplinks = keepDeclared(n.Uplinks, old.Uplinks)
		}
		return &n, nil
	}); err != nil {
		m.revoke(sess)
		cancel()
		return nil, fmt.Errorf("register host %s: %w", h.ID, err)
	}
	m.mu.Lock()
	m.sess, m.claimed = sess, time.Now()
	m.mu.Unlock()
	go m.keepalive(h.AgentVersion)
	return m, nil
}

// keepDeclared returns ups with the declared network state of the same
// uplinks in old, for those of ups that declare none. ups is not changed.
func keepDeclared(ups, old []records.Uplink) []records.Uplink {
	out := slices.Clone(ups)
	for i, u := range out {
		if !u.Declared.IsZero() {
			continue
		}
		if j := slices.IndexFunc(old, func(o records.Uplink) bool { return records.SameUplink(u, o) }); j >= 0 {
			out[i].Declared = old[j].Declared
		}
	}
	return out
}

// checkNameFree fails with ErrHostNameInUse when a live host (one whose
// agent holds a lease) other than h has h's name: names are how people
// and vrdmactl name hosts. A down host's name may be taken over (vrdmactl
// host remove deletes its record). Two agents that register the same new
// name at the same instant are not caught.
func checkNameFree(ctx context.Context, st *store.Store, h records.Host) error {
	hosts, _, _, err := store.List[records.Host](ctx, st, records.HostPrefix)
	if err != nil {
		return fmt.Errorf("register host %s: list the hosts: %w", h.ID, err)
	}
	for _, it := range hosts {
		o := it.Value
		if o.ID == h.ID || o.Name != h.Name {
			continue
		}
		_, _, err := store.Get[records.Alive](ctx, st, records.AliveKey(o.ID))
		switch {
		case err == nil:
			return fmt.Errorf("register host %s: %w: host %s is up under the name %q: start this agent with another --host, or stop that host's agent and remove it (vrdmactl host remove %s)",
				h.ID, ErrHostNameInUse, o.ID, h.Name, o.ID)
		case !errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("register host %s: is host %s, also named %q, up? %w", h.ID, o.ID, h.Name, err)
		}
	}
	return nil
}

// claim grants a lease and puts the host's Alive record under it, if no
// other lease holds it; otherwise it waits up to wait for that lease to go.
func (m *Member) claim(ctx context.Context, agentVersion string, wait time.Duration) (*concurrency.Session, error) {
	cli := m.st.Client()
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(m.ttl)), concurrency.WithContext(m.ctx))
	if err != nil {
		return nil, fmt.Errorf("register host %s: grant lease: %w", m.id, m.st.Classify(err))
	}
	key := records.AliveKey(m.id)
	val, err := store.Encode(records.Alive{
		HostID: m.id, Lease: int64(sess.Lease()), TTL: m.ttl,
		SinceUnixMs: time.Now().UnixMilli(), AgentVersion: agentVersion,
	})
	if err != nil {
		sess.Orphan()
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		resp, err := cli.Txn(wctx).
			If(clientv3.Compare(clientv3.Version(key), "=", 0)).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(sess.Lease()))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			m.revoke(sess)
			return nil, fmt.Errorf("register host %s: %w", m.id, m.st.Classify(err))
		}
		if resp.Succeeded {
			return sess, nil
		}
		holder := "another agent"
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			if a, err := store.Decode[records.Alive](key, kvs[0].Value); err == nil {
				holder = fmt.Sprintf("an agent (version %s, lease %x, since %s)", a.AgentVersion, a.Lease, time.UnixMilli(a.SinceUnixMs).Format(time.RFC3339))
			}
		}
		// Wait for the holder's record to go: its lease expires or is
		// revoked.
		wch := cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1))
		gone := false
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					gone = true
				}
			}
			if gone || wr.Err() != nil {
				break
			}
		}
		if !gone {
			m.revoke(sess)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("register host %s: %w: %s holds it (another vrdmad with this host ID, or one that died less than %ds ago)",
				m.id, ErrHostIDInUse, holder, m.ttl)
		}
	}
}

// revoke gives up a session's lease, waiting at most revokeWait: with
// etcd out of reach, the lease expires on its own after its TTL.
func (m *Member) revoke(sess *concurrency.Session) error {
	sess.Orphan()
	ctx, cancel := context.WithTimeout(context.Background(), revokeWait)
	defer cancel()
	if _, err := m.st.Client().Revoke(ctx, sess.Lease()); err != nil {
		return fmt.Errorf("revoke host %s's lease (it expires on its own after %d s): %w", m.id, m.ttl, m.st.Classify(err))
	}
	return nil
}

// keepalive claims the host again whenever its lease is lost. See the
// comment at the top of the file.
func (m *Member) keepalive(agentVersion string) {
	defer close(m.done)
	m.log.Debug("member keepalive started")
	defer m.log.Debug("member keepalive stopped")
	for {
		m.mu.Lock()
		sess := m.sess
		m.mu.Unlock()
		select {
		case <-m.stopc:
			return
		case <-sess.Done():
		}
		select {
		case <-m.stopc:
			return
		default:
		}
		m.log.Warn("host lease lost: the host shows down until it is claimed again", "lease", fmt.Sprintf("%x", sess.Lease()))
		m.mu.Lock()
		m.sess = nil
		m.mu.Unlock()
		for attempt := 0; ; attempt++ {
			if m.st.Client().Ctx().Err() != nil {
				m.log.Warn("host lease lost and the etcd client is closed: giving up")
				<-m.stopc
				return
			}
			d := min(time.Second<<min(attempt, 5), time.Duration(m.ttl)*time.Second)
			select {
			case <-m.stopc:
				return
			case <-time.After(d / 2):
			}
			ctx, cancel := context.WithTimeout(m.ctx, time.Duration(m.ttl)*time.Second+5*time.Second)
			s, err := m.claim(ctx, agentVersion, time.Duration(m.ttl)*time.Second+2*time.Second)
			cancel()
			if err == nil {
				m.mu.Lock()
				m.sess, m.claimed = s, time.Now()
				m.mu.Unlock()
				m.log.Info("host claimed again", "lease", fmt.Sprintf("%x", s.Lease()))
				break
			}
			m.log.Warn("claim host again", "err", err)
		}
	}
}

// HostID returns the registered host's ID.
func (m *Member) HostID() string { return m.id }

// Lease returns the lease the host is alive under, or 0 while it has none
// (it lost its lease and has not claimed the host again yet).
func (m *Member) Lease() clientv3.LeaseID {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sess == nil {
		return 0
	}
	return m.sess.Lease()
}

// LeaseAge is how long the host has held its current lease; false while
// it holds none.
func (m *Member) LeaseAge() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sess == nil {
		return 0, false
	}
	return time.Since(m.claimed), true
}

// UpdateHost changes the host's record with a compare-and-swap
// read-modify-write (see store.Update): fn gets the current record and
// edits it in place.
func (m *Member) UpdateHost(ctx context.Context, fn func(h *records.Host) error) (records.Host, error) {
	h, _, err := store.Update(ctx, m.st, records.HostKey(m.id), func(old *records.Host) (*records.Host, error) {
		if old == nil {
			return nil, fmt.Errorf("host %s: %w", m.id, store.ErrNotFound)
		}
		if err := fn(old); err != nil {
			return nil, err
		}
		return old, nil
	})
	return h, err
}

// Close stops keeping the host alive and revokes its lease: every cache
// shows the host down at once. Close may be called more than once.
func (m *Member) Close() error {
	var err error
	m.once.Do(func() {
		close(m.stopc)
		<-m.done
		m.mu.Lock()
		sess := m.sess
		m.sess = nil
		m.mu.Unlock()
		if sess != nil {
			// Revoke the lease so that the host shows down at once; with
			// etcd out of reach, give up soon: the lease then expires on
			// its own after its TTL (Session.Close would wait the TTL).
			err = m.revoke(sess)
		}
		m.cancel()
		if errors.Is(err, context.Canceled) || m.st.Client().Ctx().Err() != nil {
			err = nil
		}
	})
	return err
}
