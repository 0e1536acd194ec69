// SPDX-License-Identifier: Apache-2.0

package member

// Goroutines. A Cache owns one, run: it lists everything under
// records.Prefix, then watches the prefix from the list's revision + 1 and
// applies each event to the cache's maps. The watch carries
// WithRequireLeader, so a member cut off from its cluster cancels it
// instead of going quiet; run then watches again from the last revision it
// applied. When etcd has compacted that revision (the watch reports
// CompactRevision), run lists again and swaps the whole state at once.
// While etcd is out of reach, run retries with backoff and the cache keeps
// serving what it has. Close cancels run's context and waits for it.
//
// Lookups run on the callers' goroutines: a hit reads the maps under a
// read lock; a miss reads etcd (bounded by LookupTimeout) and may add what
// it read, if the watch has not yet got that far.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vrdma/vrdma/internal/control/pathsel"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/netcheck"
)

// CacheConfig configures a Cache.
type CacheConfig struct {
	// LookupTimeout bounds a lookup that goes to etcd; default 3s.
	LookupTimeout time.Duration
	// OnBadRecord is called (on the cache's goroutine, or a lookup's) for
	// every stored value that is not a usable record; the record is
	// skipped. Default: log it at warning level.
	OnBadRecord func(*store.RecordError)
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// entry is a cached record and the ModRevision it was read at.
type entry[T any] struct {
	v   T
	rev int64
}

// state is everything a Cache holds. A fresh state is built by each list
// and then swapped in whole.
type state struct {
	switches   map[string]entry[records.Switch]    // by name
	portGroups map[string]entry[records.PortGroup] // by key
	hosts      map[string]entry[records.Host]      // by host ID
	alive      map[string]entry[records.Alive]     // by host ID
	vms        map[string]entry[records.VM]        // by name
	adapters   map[string]entry[records.Adapter]   // by "vm/vrdmaN"
	byName     map[string]entry[records.Endpoint]  // by "vm/vrdmaN"
	byGID      map[netip.Addr]entry[records.Endpoint]
	bad        map[string]*store.RecordError // by key
}

func newState() *state {
	return &state{
		switches:   map[string]entry[records.Switch]{},
		portGroups: map[string]entry[records.PortGroup]{},
		hosts:      map[string]entry[records.Host]{},
		alive:      map[string]entry[records.Alive]{},
		vms:        map[string]entry[records.VM]{},
		adapters:   map[string]entry[records.Adapter]{},
		byName:     map[string]entry[records.Endpoint]{},
		byGID:      map[netip.Addr]entry[records.Endpoint]{},
		bad:        map[string]*store.RecordError{},
	}
}

// Cache is a watch-driven copy of the control plane's inventory. It is
// safe for concurrent use.
type Cache struct {
	st     *store.Store
	cfg    CacheConfig
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{} // closed when run returns
	synced chan struct{} // closed after the first list

	mu sync.RWMutex
	s  *state // +checklocks:mu
	// revision the cache reflects
	rev int64 // +checklocks:mu
	// closed and replaced at every change of rev
	changed chan struct{} // +checklocks:mu
	// why the last list or watch failed; nil once it works again
	lastErr error // +checklocks:mu
}

// NewCache starts a cache of st's inventory. It returns at once: the first
// list runs in the background (Synced says when it is done); until then
// every lookup goes to etcd. Close stops the cache.
func NewCache(st *store.Store, cfg CacheConfig) *Cache {
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = 3 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Cache{
		st:      st,
		cfg:     cfg,
		log:     cfg.Logger,
		done:    make(chan struct{}),
		synced:  make(chan struct{}),
		s:       newState(),
		changed: make(chan struct{}),
	}
	if c.cfg.OnBadRecord == nil {
		c.cfg.OnBadRecord = func(e *store.RecordError) {
			c.log.Warn("skipping bad control-plane record", "key", e.Key, "err", e.Err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(ctx)
	return c
}

// Close stops the cache's watch and waits for it. Lookups keep answering
// from what the cache holds (and go to etcd on a miss).
func (c *Cache) Close() {
	c.cancel()
	<-c.done
}

// Synced is closed once the cache has listed the store for the first time.
func (c *Cache) Synced() <-chan struct{} { return c.synced }

// Rev returns the store revision the cache reflects.
func (c *Cache) Rev() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.rev
}

// Err returns why the cache's last list or watch failed, or nil if it is
// listing and watching fine.
func (c *Cache) Err() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.lastErr
}

// Changed returns a channel that is closed at the cache's next change
// (a watch event or a new list). Take it before reading the cache, then
// wait on it, and no change is missed.
func (c *Cache) Changed() <-chan struct{} {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.changed
}

// WaitRev waits until the cache reflects revision rev or later (the
// revision a write returned, for instance).
func (c *Cache) WaitRev(ctx context.Context, rev int64) error {
	for {
		c.mu.RLock()
		cur, ch := c.rev, c.changed
		c.mu.RUnlock()
		if cur >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cache at revision %d, waiting for %d: %w", cur, rev, ctx.Err())
		}
	}
}

// setErr records the state of the list/watch loop.
func (c *Cache) setErr(err error) {
	c.mu.Lock()
	prev := c.lastErr
	c.lastErr = err
	c.mu.Unlock()
	if err != nil && prev == nil {
		c.log.Warn("control-plane watch interrupted; serving cached entries", "err", err)
	} else if err == nil && prev != nil {
		c.log.Info("control-plane watch resumed")
	}
}

// run lists and watches. See the comment at the top of the file.
func (c *Cache) run(ctx context.Context) {
	defer close(c.done)
	var rev int64 // last revision applied; 0: list first
	for attempt := 0; ctx.Err() == nil; {
		if rev == 0 {
			r, err := c.list(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				if c.st.Client().Ctx().Err() != nil {
					c.setErr(errors.New("the etcd client is closed"))
					<-ctx.Done()
					return
				}
				c.setErr(err)
				attempt++
				sleep(ctx, attempt)
				continue
			}
			rev = r
		}
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := c.st.Client().Watch(wctx, records.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
		for resp := range wch {
			if resp.CompactRevision != 0 {
				c.log.Info("control-plane watch compacted; listing again", "rev", rev, "compacted", resp.CompactRevision)
				rev = 0
				break
			}
			if err := resp.Err(); err != nil {
				c.setErr(c.st.Classify(err))
				break
			}
			if len(resp.Events) > 0 || resp.IsProgressNotify() {
				c.apply(resp.Events, resp.Header.Revision)
				rev = max(rev, resp.Header.Revision)
				attempt = 0
				c.setErr(nil)
			}
		}
		wcancel()
		if ctx.Err() != nil {
			return
		}
		if c.st.Client().Ctx().Err() != nil {
			c.setErr(errors.New("the etcd client is closed"))
			<-ctx.Done() // nothing more to watch with
			return
		}
		attempt++
		sleep(ctx, attempt)
	}
}

// sleep waits a backoff that grows with attempt, up to 2 s.
func sleep(ctx context.Context, attempt int) {
	d := min(50*time.Millisecond<<min(attempt, 6), 2*time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// list reads everything and swaps it in.
func (c *Cache) list(ctx context.Context) (int64, error) {
	s := newState()
	var bad []*store.RecordError
	rev, err := c.st.Range(ctx, records.Prefix, func(kv *mvccpb.KeyValue) {
		if e := s.put(string(kv.Key), kv.Value, kv.ModRevision); e != nil {
			bad = append(bad, e)
		}
	})
	if err != nil {
		return 0, err
	}
	for _, e := range bad {
		c.cfg.OnBadRecord(e)
	}
	c.mu.Lock()
	c.s = s
	c.bumpLocked(rev)
	c.lastErr = nil
	c.mu.Unlock()
	select {
	case <-c.synced:
	default:
		close(c.synced)
	}
	return rev, nil
}

// apply applies watch events seen at revision rev.
func (c *Cache) apply(evs []*clientv3.Event, rev int64) {
	var bad []*store.RecordError
	c.mu.Lock()
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		switch ev.Type {
		case clientv3.EventTypePut:
			if e := c.s.put(key, ev.Kv.Value, ev.Kv.ModRevision); e != nil {
				bad = append(bad, e)
			}
		case clientv3.EventTypeDelete:
			c.s.del(key)
		}
	}
	c.bumpLocked(rev)
	c.mu.Unlock()
	for _, e := range bad {
		c.cfg.OnBadRecord(e)
	}
}

// bumpLocked moves the cache to revision rev and wakes WaitRev.
// +checklocks:c.mu
func (c *Cache) bumpLocked(rev int64) {
	if rev > c.rev {
		c.rev = rev
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

// put stores the value of key at ModRevision rev, replacing what was
// there. A value that is not a usable record removes the key's entry and is
// returned; a key this build does not know is ignored.
func (s *state) put(key string, val []byte, rev int64) *store.RecordError {
	ref, err := records.ParseKey(key)
	if err != nil {
		return nil // not ours to read (another layout version, or a stray key)
	}
	bad := func(err error) *store.RecordError {
		s.del(key)
		var re *store.RecordError
		if !errors.As(err, &re) {
			re = &store.RecordError{Key: key, Err: err}
		}
		s.bad[key] = re
		return re
	}
	delete(s.bad, key)
	switch ref.Kind {
	case records.KindSwitch:
		return putT(s.switches, ref.ID, key, val, rev, bad, func(v records.Switch) string { return v.Name })
	case records.KindPortGroup:
		return putT(s.portGroups, ref.ID, key, val, rev, bad, func(v records.PortGroup) string { return v.Key })
	case records.KindHost:
		return putT(s.hosts, ref.ID, key, val, rev, bad, func(v records.Host) string { return v.ID })
	case records.KindAlive:
		return putT(s.alive, ref.ID, key, val, rev, bad, func(v records.Alive) string { return v.HostID })
	case records.KindVM:
		return putT(s.vms, ref.ID, key, val, rev, bad, func(v records.VM) string { return v.Name })
	case records.KindAdapter:
		return putT(s.adapters, ref.ID, key, val, rev, bad, func(v records.Adapter) string { return v.VM + "/" + v.Name() })
	case records.KindEndpoint:
		if ref.ByGID {
			v, err := store.Decode[records.Endpoint](key, val)
			if err != nil {
				return bad(err)
			}
			if v.GID.String() != ref.ID {
				return bad(fmt.Errorf("%w: entry of GID %s under the key of %s", store.ErrForeign, v.GID, ref.ID))
			}
			s.byGID[v.GID] = entry[records.Endpoint]{v, rev}
			return nil
		}
		return putT(s.byName, ref.ID, key, val, rev, bad, func(v records.Endpoint) string { return v.Name() })
	}
	return nil
}

// putT decodes a T into m[id], checking that the record is the one its key
// names.
func putT[T records.Record](m map[string]entry[T], id, key string, val []byte, rev int64,
	bad func(error) *store.RecordError, idOf func(T) string) *store.RecordError {
	v, err := store.Decode[T](key, val)
	if err != nil {
		return bad(err)
	}
	if got := idOf(v); got != id {
		return bad(fmt.Errorf("%w: record of %q under the key of %q", store.ErrForeign, got, id))
	}
	m[id] = entry[T]{v, rev}
	return nil
}

// del removes key's entry.
func (s *state) del(key string) {
	delete(s.bad, key)
	ref, err := records.ParseKey(key)
	if err != nil {
		return
	}
	switch ref.Kind {
	case records.KindSwitch:
		delete(s.switches, ref.ID)
	case records.KindPortGroup:
		delete(s.portGroups, ref.ID)
	case records.KindHost:
		delete(s.hosts, ref.ID)
	case records.KindAlive:
		delete(s.alive, ref.ID)
	case records.KindVM:
		delete(s.vms, ref.ID)
	case records.KindAdapter:
		delete(s.adapters, ref.ID)
	case records.KindEndpoint:
		if ref.ByGID {
			g, _ := records.ParseGID(ref.ID)
			delete(s.byGID, g)
		} else {
			delete(s.byName, ref.ID)
		}
	}
}

// ---- lookups ------------------------------------------------------------------

// fetch reads keys from etcd for a lookup that missed the cache, in one
// round trip, bounded by LookupTimeout. It adds what it read to the cache
// if the watch has not got that far yet, and returns the raw values (nil
// for a missing key).
func (c *Cache) fetch(ctx context.Context, what string, keys ...string) ([]*mvccpb.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.LookupTimeout)
	defer cancel()
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(k)
	}
	resp, err := c.st.Client().Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("look up %s: not in the cache, and %w", what, c.st.Classify(err))
	}
	kvs := make([]*mvccpb.KeyValue, len(keys))
	for i, r := range resp.Responses {
		if got := r.GetResponseRange().Kvs; len(got) > 0 {
			kvs[i] = got[0]
		}
	}
	var bad []*store.RecordError
	c.mu.Lock()
	// Newer than the cache: no watch event about these keys up to
	// resp's revision can be missing from what we read, and the watch
	// brings every later one, so adding them cannot resurrect anything.
	if resp.Header.Revision > c.rev {
		for i, kv := range kvs {
			if kv == nil {
				continue
			}
			if e := c.s.put(keys[i], kv.Value, kv.ModRevision); e != nil {
				bad = append(bad, e)
			}
		}
	}
	c.mu.Unlock()
	for _, e := range bad {
		c.cfg.OnBadRecord(e)
	}
	return kvs, nil
}

// lookup returns m[id] from the cache, or reads keyOf(id) from etcd.
func lookup[T records.Record](ctx context.Context, c *Cache, table func(*state) map[string]entry[T], keyOf func(string) string, id string) (T, error) {
	var zero T
	c.mu.RLock()
	e, ok := table(c.s)[id]
	c.mu.RUnlock()
	if ok {
		return e.v, nil
	}
	key := keyOf(id)
	what := fmt.Sprintf("%s %s", zero.Kind(), id)
	kvs, err := c.fetch(ctx, what, key)
	if err != nil {
		return zero, err
	}
	if kvs[0] == nil {
		return zero, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	return store.Decode[T](key, kvs[0].Value)
}

// pairKey turns a key function of (vm, adapter) into one of "vm/adapter".
func pairKey(f func(vm, adapter string) string) func(string) string {
	return func(id string) string {
		vm, ad, _ := strings.Cut(id, "/")
		return f(vm, ad)
	}
}

var (
	adapterKeyOf      = pairKey(records.AdapterKey)
	endpointNameKeyOf = pairKey(records.EndpointNameKey)
)

// Switch returns switch name.
func (c *Cache) Switch(ctx context.Context, name string) (records.Switch, error) {
	return lookup(ctx, c, func(s *state) map[string]entry[records.Switch] { return s.switches }, records.SwitchKey, name)
}

// PortGroup returns the port group whose key is key.
func (c *Cache) PortGroup(ctx context.Context, key string) (records.PortGroup, error) {
	return lookup(ctx, c, func(s *state) map[string]entry[records.PortGroup] { return s.portGroups }, records.PortGroupKey, key)
}

// VM returns VM name.
func (c *Cache) VM(ctx context.Context, name string) (records.VM, error) {
	return lookup(ctx, c, func(s *state) map[string]entry[records.VM] { return s.vms }, records.VMKey, name)
}

// Adapter returns adapter "vrdmaN" of VM vm.
func (c *Cache) Adapter(ctx context.Context, vm, adapter string) (records.Adapter, error) {
	return lookup(ctx, c, func(s *state) map[string]entry[records.Adapter] { return s.adapters }, adapterKeyOf, vm+"/"+adapter)
}

// HostStatus is a host as the cache sees it.
type HostStatus struct {
	// Host is the host's record, with State the effective state: HostDown
	// when the host holds no live lease, whatever the record says.
	Host records.Host
	// Declared is the state in the record.
	Declared records.HostState
	// Alive is the host's heartbeat; nil when it is down.
	Alive *records.Alive
}

// LeaseAge returns how long the host has held its current lease (0 when
// down).
func (h HostStatus) LeaseAge(now time.Time) time.Duration {
	if h.Alive == nil {
		return 0
	}
	return now.Sub(time.UnixMilli(h.Alive.SinceUnixMs))
}

func hostStatus(h records.Host, a *records.Alive) HostStatus {
	hs := HostStatus{Host: h, Declared: h.State, Alive: a}
	if a == nil {
		hs.Host.State = records.HostDown
	}
	return hs
}

// Host returns host id and whether it is alive. While etcd is out of reach
// the liveness is as last seen.
func (c *Cache) Host(ctx context.Context, id string) (HostStatus, error) {
	c.mu.RLock()
	h, ok := c.s.hosts[id]
	a, alive := c.s.alive[id]
	c.mu.RUnlock()
	if ok {
		if alive {
			return hostStatus(h.v, &a.v), nil
		}
		return hostStatus(h.v, nil), nil
	}
	what := "host " + id
	kvs, err := c.fetch(ctx, what, records.HostKey(id), records.AliveKey(id))
	if err != nil {
		return HostStatus{}, err
	}
	if kvs[0] == nil {
		return HostStatus{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	hv, err := store.Decode[records.Host](records.HostKey(id), kvs[0].Value)
	if err != nil {
		return HostStatus{}, err
	}
	if kvs[1] != nil {
		if av, err := store.Decode[records.Alive](records.AliveKey(id), kvs[1].Value); err == nil {
			return hostStatus(hv, &av), nil
		}
	}
	return hostStatus(hv, nil), nil
}

// Hosts returns every cached host, by ID.
func (c *Cache) Hosts() []HostStatus {
	c.mu.RLock()
	out := make([]HostStatus, 0, len(c.s.hosts))
	for id, h := range c.s.hosts {
		if a, ok := c.s.alive[id]; ok {
			av := a.v
			out = append(out, hostStatus(h.v, &av))
		} else {
			out = append(out, hostStatus(h.v, nil))
		}
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b HostStatus) int { return strings.Compare(a.Host.ID, b.Host.ID) })
	return out
}

// NetworkModel returns the network the cache holds, for the RoCE
// network checks (netcheck.Check): its switches, port groups and hosts.
func (c *Cache) NetworkModel() netcheck.Model {
	m := netcheck.Model{Switches: c.Switches(), PortGroups: c.PortGroups()}
	for _, h := range c.Hosts() {
		m.Hosts = append(m.Hosts, h.Host)
	}
	return m
}

// Switches returns every cached switch, by name.
func (c *Cache) Switches() []records.Switch {
	return values(c, func(s *state) map[string]entry[records.Switch] { return s.switches })
}

// PortGroups returns every cached port group, by key.
func (c *Cache) PortGroups() []records.PortGroup {
	return values(c, func(s *state) map[string]entry[records.PortGroup] { return s.portGroups })
}

// VMs returns every cached VM, by name.
func (c *Cache) VMs() []records.VM {
	return values(c, func(s *state) map[string]entry[records.VM] { return s.vms })
}

// BadRecords returns the stored values the cache skipped, by key.
func (c *Cache) BadRecords() []*store.RecordError {
	c.mu.RLock()
	out := make([]*store.RecordError, 0, len(c.s.bad))
	for _, e := range c.s.bad {
		out = append(out, e)
	}
	c.mu.RUnlock()
	slices.SortFunc(out, func(a, b *store.RecordError) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Len returns how many records of each kind the cache holds.
func (c *Cache) Len() map[records.Kind]int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return map[records.Kind]int{
		records.KindSwitch: len(c.s.switches), records.KindPortGroup: len(c.s.portGroups),
		records.KindHost: len(c.s.hosts), records.KindAlive: len(c.s.alive), records.KindVM: len(c.s.vms),
		records.KindAdapter: len(c.s.adapters), records.KindEndpoint: len(c.s.byName) + len(c.s.byGID),
	}
}

func values[T any](c *Cache, table func(*state) map[string]entry[T]) []T {
	c.mu.RLock()
	m := table(c.s)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]T, len(keys))
	for i, k := range keys {
		out[i] = m[k].v
	}
	c.mu.RUnlock()
	return out
}

// ErrBadTarget: a target is neither "vm/vrdmaN" nor a GID.
var ErrBadTarget = errors.New("bad target")

// Resolve finds an adapter by "vm/vrdmaN" or by GID (IPv6 form, or an IPv4
// address for its IPv4-mapped GID) in the endpoint directory.
func (c *Cache) Resolve(ctx context.Context, target string) (records.Endpoint, error) {
	if vm, ad, ok := strings.Cut(target, "/"); ok {
		if err := records.CheckName(vm); err != nil {
			return records.Endpoint{}, fmt.Errorf("%w %q: VM name %v", ErrBadTarget, target, err)
		}
		if _, err := records.ParseAdapterName(ad); err != nil {
			return records.Endpoint{}, fmt.Errorf("%w %q: %v", ErrBadTarget, target, err)
		}
		e, err := lookup(ctx, c, func(s *state) map[string]entry[records.Endpoint] { return s.byName }, endpointNameKeyOf, target)
		if errors.Is(err, store.ErrNotFound) {
			return e, fmt.Errorf("endpoint %s: %w (no such VM or adapter, or the VM is on no host)", target, store.ErrNotFound)
		}
		return e, err
	}
	gid, err := records.ParseGID(target)
	if err != nil {
		return records.Endpoint{}, fmt.Errorf("%w %q: not vm/vrdmaN, and %v", ErrBadTarget, target, err)
	}
	c.mu.RLock()
	e, ok := c.s.byGID[gid]
	c.mu.RUnlock()
	if ok {
		return e.v, nil
	}
	key := records.EndpointGIDKey(gid)
	kvs, err := c.fetch(ctx, "endpoint "+gid.String(), key)
	if err != nil {
		return records.Endpoint{}, err
	}
	if kvs[0] == nil {
		return records.Endpoint{}, fmt.Errorf("endpoint %s: %w (no adapter has this GID)", gid, store.ErrNotFound)
	}
	return store.Decode[records.Endpoint](key, kvs[0].Value)
}

// End is one resolved end of a connection, with everything path selection
// needs.
type End struct {
	Endpoint  records.Endpoint
	Host      HostStatus
	PortGroup records.PortGroup
}

// ResolveEnd resolves target (see Resolve) with its host and port group.
func (c *Cache) ResolveEnd(ctx context.Context, target string) (End, error) {
	e, err := c.Resolve(ctx, target)
	if err != nil {
		return End{}, err
	}
	h, err := c.Host(ctx, e.Host)
	if err != nil {
		return End{}, fmt.Errorf("%s: %w", e.Name(), err)
	}
	pg, err := c.PortGroup(ctx, e.PortGroup)
	if err != nil {
		return End{}, fmt.Errorf("%s: %w", e.Name(), err)
	}
	return End{Endpoint: e, Host: h, PortGroup: pg}, nil
}

// HolderOf returns the directory entry of GID gid as the cache holds it,
// without going to etcd, so also while etcd is out of reach; ok is false
// when the cache has none. Until Synced, the cache may not have listed
// the directory yet.
func (c *Cache) HolderOf(gid netip.Addr) (e records.Endpoint, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	en, ok := c.s.byGID[records.GIDOf(gid)]
	return en.v, ok
}

// Decide returns the path between two adapters, each named "vm/vrdmaN" or
// by GID: it resolves both ends with their hosts, port groups and switch,
// from the cache when it holds them, and calls pathsel.Select. On error
// the Decision's Rejected still explains what it can (see pathsel.Select).
func (c *Cache) Decide(ctx context.Context, a, b string) (pathsel.Decision, error) {
	if d, err, ok := c.decideCached(a, b); ok {
		return d, err
	}
	ea, err := c.ResolveEnd(ctx, a)
	if err != nil {
		return pathsel.Decision{}, err
	}
	eb, err := c.ResolveEnd(ctx, b)
	if err != nil {
		return pathsel.Decision{}, err
	}
	sw, err := c.Switch(ctx, ea.PortGroup.Switch)
	if err != nil {
		return pathsel.Decision{}, fmt.Errorf("%s: port group %s: %w", ea.Endpoint.Name(), ea.PortGroup.Key, err)
	}
	return pathsel.Select(sw, pathsel.End{Name: ea.Endpoint.Name(), Host: ea.Host.Host, PortGroup: ea.PortGroup},
		pathsel.End{Name: eb.Endpoint.Name(), Host: eb.Host.Host, PortGroup: eb.PortGroup})
}

// decideCached is Decide for the case where the cache holds everything,
// under one read lock; ok is false if anything is missing.
func (c *Cache) decideCached(a, b string) (d pathsel.Decision, err error, ok bool) {
	c.mu.RLock()
	ea, oka := c.cachedEndLocked(a)
	eb, okb := c.cachedEndLocked(b)
	if !oka || !okb {
		c.mu.RUnlock()
		return d, nil, false
	}
	sw, ok := c.s.switches[ea.PortGroup.Switch]
	c.mu.RUnlock()
	if !ok {
		return d, nil, false
	}
	d, err = pathsel.Select(sw.v, ea, eb)
	return d, err, true
}

// +checklocksread:c.mu
func (c *Cache) cachedEndLocked(target string) (pathsel.End, bool) {
	var e entry[records.Endpoint]
	var ok bool
	if strings.IndexByte(target, '/') >= 0 {
		e, ok = c.s.byName[target]
	} else if g, err := netip.ParseAddr(target); err == nil {
		e, ok = c.s.byGID[records.GIDOf(g)]
	}
	if !ok {
		return pathsel.End{}, false
	}
	h, ok := c.s.hosts[e.v.Host]
	if !ok {
		return pathsel.End{}, false
	}
	pg, ok := c.s.portGroups[e.v.PortGroup]
	if !ok {
		return pathsel.End{}, false
	}
	host := h.v
	if _, alive := c.s.alive[e.v.Host]; !alive {
		host.State = records.HostDown
	}
	return pathsel.End{Name: e.v.Name(), Host: host, PortGroup: pg.v}, true
}
