// SPDX-License-Identifier: Apache-2.0

// Package store is vrdma's control-plane store: typed records in etcd,
// reached through go.etcd.io/etcd/client/v3.
//
// Open runs an embedded single-node etcd (go.etcd.io/etcd/server/v3/embed)
// in a data directory when no endpoints are given — the default, one
// machine — or connects to an external etcd cluster, with TLS if asked.
// Every key lives under records.Prefix ("/vrdma/v1/"); every value is a
// record encoded by Encode, which carries its schema version and kind.
//
// Every write is a compare-and-swap transaction on the key's ModRevision
// (a create compares "key missing"), so concurrent writers never lose an
// update: a writer whose compare fails learns the current value and, in
// Update and Txn, computes its change again, up to MaxRetries times.
//
//	st, err := store.Open(ctx, store.Config{DataDir: dir})
//	defer st.Close()
//	_, err = st.Create(ctx, records.SwitchKey("dvs1"), records.Switch{...})
//	sw, rev, err := store.Update(ctx, st, records.SwitchKey("dvs1"),
//		func(old *records.Switch) (*records.Switch, error) {
//			n := *old
//			n.MTU = 9000
//			return &n, nil
//		})
//
// Reads report a value that is not a usable record (garbage, another
// schema version or kind, a missing field) as a *RecordError naming the
// key; List skips such records and returns them apart, so one bad record
// never hides the others.
//
// When etcd cannot be reached in time, operations fail with
// ErrUnavailable (an *UnavailableError naming the endpoints). For a write
// that means the outcome is unknown: the transaction may have been applied
// before the connection broke. Callers retry writes that are idempotent
// (member.PublishVM is) and re-read before retrying the others; the store
// does not retry writes by itself, since a compare-and-swap retried after
// an unseen success would apply a change twice.
//
// A Store is safe for concurrent use.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vrdma/vrdma/internal/control/records"
)

// Errors of store operations. Test them with errors.Is.
var (
	// ErrNotFound: no record under the key.
	ErrNotFound = errors.New("not found")
	// ErrExists: a create found the key already there.
	ErrExists = errors.New("already exists")
	// ErrConflict: another writer changed the record between our read and
	// our write (and, for Update and Txn, kept doing so for MaxRetries
	// attempts).
	ErrConflict = errors.New("conflicting update")
	// ErrUnavailable: etcd could not be reached in time (no endpoint
	// answers, or the cluster has no leader).
	ErrUnavailable = errors.New("control plane unreachable")
	// ErrUnchanged may be returned by an Update function to leave the
	// record as it is; Update then returns the current record and no error.
	ErrUnchanged = errors.New("unchanged")
)

// TLSFiles names the PEM files for a TLS connection to an external etcd.
type TLSFiles struct {
	CertFile string // client certificate (with KeyFile), for client-cert auth
	KeyFile  string
	CAFile   string // CA that signed the servers' certificates
}

// Config configures Open.
type Config struct {
	// Endpoints of an external etcd cluster. Empty: run an embedded
	// single-node etcd in DataDir.
	Endpoints []string
	// TLS for an external cluster; zero: plain connections.
	TLS TLSFiles
	// DialTimeout bounds connecting to etcd; default 5s.
	DialTimeout time.Duration
	// DataDir holds the embedded etcd's data (required without Endpoints).
	DataDir string
	// Embed sets the embedded member up beyond the defaults (its Dir is
	// DataDir).
	Embed EmbedConfig
	// UnsafeNoFsync turns fsync off in the embedded etcd. Tests only.
	UnsafeNoFsync bool
	// MaxRetries bounds the attempts of Update and Txn; default 16.
	MaxRetries int
	// Logger receives the store's own messages; default slog.Default().
	Logger *slog.Logger
	// EtcdLog receives the etcd client's and embedded server's logs; nil
	// discards them.
	EtcdLog io.Writer
	// EtcdLogger, if set, receives them instead, through slog (the
	// client's at warn and above, the embedded server's at Embed.LogLevel,
	// and at debug level once it is closing).
	EtcdLogger *slog.Logger
}

// Store is the control-plane store. It is safe for concurrent use.
type Store struct {
	cli        *clientv3.Client
	emb        *Embedded // nil for an external cluster
	endpoints  []string
	maxRetries int
	log        *slog.Logger
}

// Open opens the store: it connects to cfg.Endpoints, or starts an
// embedded etcd in cfg.DataDir and connects to it. For an embedded store
// it writes the client URL to DataDir/EndpointFile.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Store{maxRetries: cfg.MaxRetries, log: cfg.Logger, endpoints: cfg.Endpoints}
	ccfg := clientv3.Config{
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Logger:               etcdLogger(cfg.EtcdLog, cfg.EtcdLogger, "warn", nil),
	}
	if len(cfg.Endpoints) == 0 {
		if cfg.DataDir == "" {
			return nil, errors.New("control plane: no etcd endpoints and no data directory for the embedded etcd")
		}
		ec := cfg.Embed
		ec.Dir = cfg.DataDir
		ec.UnsafeNoFsync = ec.UnsafeNoFsync || cfg.UnsafeNoFsync
		if ec.Log == nil && ec.Logger == nil {
			ec.Log, ec.Logger = cfg.EtcdLog, cfg.EtcdLogger
		}
		emb, err := StartEmbedded(ctx, ec)
		if err != nil {
			return nil, err
		}
		s.emb = emb
		s.endpoints = []string{emb.ClientURL()}
		if err := os.WriteFile(filepath.Join(cfg.DataDir, EndpointFile), []byte(emb.ClientURL()+"\n"), 0o600); err != nil {
			emb.Close()
			return nil, fmt.Errorf("control plane: write %s: %w", EndpointFile, err)
		}
	} else if cfg.TLS != (TLSFiles{}) {
		info := transport.TLSInfo{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, TrustedCAFile: cfg.TLS.CAFile}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("control plane: TLS: %w", err)
		}
		ccfg.TLS = tc
	}
	ccfg.Endpoints = s.endpoints
	cli, err := clientv3.New(ccfg)
	if err != nil {
		if s.emb != nil {
			s.emb.Close()
		}
		return nil, fmt.Errorf("control plane: connect to etcd at %s: %w", strings.Join(s.endpoints, ","), s.classify(err))
	}
	s.cli = cli
	return s, nil
}

// ReadEndpointFile returns the client URL an embedded store in dataDir
// wrote (see EndpointFile).
func ReadEndpointFile(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, EndpointFile))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Client returns the etcd client. It stays owned by the Store.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Endpoints returns the etcd endpoints the store uses.
func (s *Store) Endpoints() []string { return append([]string(nil), s.endpoints...) }

// Embedded returns the embedded etcd member, or nil for an external
// cluster. Its Done channel tells an agent that its store is gone.
func (s *Store) Embedded() *Embedded { return s.emb }

// Close closes the client and stops the embedded etcd, if any. etcd lets
// other clients' open watch streams drain for up to its request timeout
// (about 7 s) before it stops.
func (s *Store) Close() error {
	err := s.cli.Close()
	if s.emb != nil {
		s.emb.Close()
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// UnavailableError says that etcd could not be reached, where, and why.
// It matches ErrUnavailable.
type UnavailableError struct {
	Endpoints []string
	Err       error
}

// Error says that etcd is unreachable, at which endpoints, and why.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("control plane unreachable (etcd at %s): %v", strings.Join(e.Endpoints, ","), e.Err)
}

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// classify turns an error of the etcd client into ErrUnavailable when it
// means that etcd is out of reach; other errors pass through.
func (s *Store) classify(err error) error {
	if err == nil || errors.Is(err, context.Canceled) {
		return err
	}
	unavailable := errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, rpctypes.ErrNoLeader) ||
		errors.Is(err, rpctypes.ErrTimeout) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) ||
		errors.Is(err, rpctypes.ErrGRPCNoLeader)
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			unavailable = true
		}
	}
	if unavailable {
		return &UnavailableError{Endpoints: s.endpoints, Err: err}
	}
	return err
}

// Classify is classify for packages that call the etcd client directly
// (leases, watches): errors meaning "etcd is out of reach" become
// ErrUnavailable.
func (s *Store) Classify(err error) error { return s.classify(err) }

// ---- single-key operations --------------------------------------------------

// Get returns the record under key and its ModRevision. ErrNotFound if
// there is none; a *RecordError if the value is not a usable T.
func Get[T records.Record](ctx context.Context, s *Store, key string) (T, int64, error) {
	var zero T
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return zero, 0, s.classify(err)
	}
	if len(resp.Kvs) == 0 {
		return zero, 0, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	kv := resp.Kvs[0]
	v, err := Decode[T](key, kv.Value)
	if err != nil {
		return zero, kv.ModRevision, err
	}
	return v, kv.ModRevision, nil
}

// Create stores r under key if the key is missing; ErrExists otherwise.
// It returns the record's ModRevision.
func (s *Store) Create(ctx context.Context, key string, r records.Record) (int64, error) {
	val, err := Encode(r)
	if err != nil {
		return 0, err
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val))).
		Commit()
	if err != nil {
		return 0, s.classify(err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%s: %w", key, ErrExists)
	}
	return resp.Header.Revision, nil
}

// Put replaces the record under key if its ModRevision is still rev (0:
// the key must be missing); ErrConflict otherwise. It returns the new
// ModRevision.
func (s *Store) Put(ctx context.Context, key string, r records.Record, rev int64) (int64, error) {
	val, err := Encode(r)
	if err != nil {
		return 0, err
	}
	resp, err := s.cli.Txn(ctx).If(revIs(key, rev)).Then(clientv3.OpPut(key, string(val))).Commit()
	if err != nil {
		return 0, s.classify(err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%s: %w: it changed since revision %d", key, ErrConflict, rev)
	}
	return resp.Header.Revision, nil
}

// Delete removes the record under key if its ModRevision is still rev;
// ErrConflict otherwise (also when it is gone).
func (s *Store) Delete(ctx context.Context, key string, rev int64) error {
	resp, err := s.cli.Txn(ctx).If(revIs(key, rev)).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return s.classify(err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%s: %w: it changed since revision %d", key, ErrConflict, rev)
	}
	return nil
}

// revIs compares key's ModRevision with rev; rev 0 means "key missing".
func revIs(key string, rev int64) clientv3.Cmp {
	if rev == 0 {
		return clientv3.Compare(clientv3.Version(key), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(key), "=", rev)
}

// Update is a read-modify-write of the record under key. fn gets the
// current record (nil if there is none) and returns the new one: nil to
// delete it, or ErrUnchanged to leave it. The write is a compare-and-swap
// on the ModRevision fn saw; when another writer got there first, fn runs
// again on the newer record, up to MaxRetries attempts, then Update fails
// with ErrConflict. fn must not have side effects that cannot run twice.
//
// Update returns the record as it now is (zero if deleted) and its
// ModRevision. A value under key that is not a usable T is returned as a
// *RecordError and left alone.
func Update[T records.Record](ctx context.Context, s *Store, key string, fn func(old *T) (*T, error)) (T, int64, error) {
	var zero T
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return zero, 0, s.classify(err)
	}
	cur := resp.Kvs
	for attempt := 1; ; attempt++ {
		var old *T
		var rev int64
		if len(cur) > 0 {
			v, err := Decode[T](key, cur[0].Value)
			if err != nil {
				return zero, cur[0].ModRevision, err
			}
			old, rev = &v, cur[0].ModRevision
		}
		var arg *T
		if old != nil {
			c := *old // fn may change what it gets; our copy stays as read
			arg = &c
		}
		next, err := fn(arg)
		if errors.Is(err, ErrUnchanged) {
			if old == nil {
				return zero, 0, nil
			}
			return *old, rev, nil
		}
		if err != nil {
			return zero, rev, err
		}
		var op clientv3.Op
		switch {
		case next == nil && old == nil:
			return zero, 0, nil
		case next == nil:
			op = clientv3.OpDelete(key)
		default:
			val, err := Encode(*next)
			if err != nil {
				return zero, rev, err
			}
			op = clientv3.OpPut(key, string(val))
		}
		tr, err := s.cli.Txn(ctx).If(revIs(key, rev)).Then(op).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return zero, rev, s.classify(err)
		}
		if tr.Succeeded {
			if next == nil {
				return zero, tr.Header.Revision, nil
			}
			return *next, tr.Header.Revision, nil
		}
		if attempt >= s.maxRetries {
			return zero, rev, fmt.Errorf("%s: %w: still changing after %d attempts", key, ErrConflict, attempt)
		}
		cur = tr.Responses[0].GetResponseRange().Kvs
		if err := backoff(ctx, attempt); err != nil {
			return zero, rev, err
		}
	}
}

// backoff sleeps a short random time that grows with attempt, so that
// writers racing on one key spread out (full jitter, at most 128 ms).
func backoff(ctx context.Context, attempt int) error {
	d := time.Duration(rand.Int64N(int64(2*time.Millisecond) << min(attempt, 6)))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ---- listing ------------------------------------------------------------------

// ListPageSize is how many keys List and Range read per request.
const ListPageSize = 2000

// Range calls fn for every key under prefix, in key order, as of one
// revision, which it returns. It reads ListPageSize keys per request and
// calls fn once every page is read; if the revision is compacted while it
// pages, it starts over, so fn sees each key once.
func (s *Store) Range(ctx context.Context, prefix string, fn func(kv *mvccpb.KeyValue)) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	for {
		kvs, rev, err := s.rangeOnce(ctx, prefix, end)
		if errors.Is(err, rpctypes.ErrCompacted) {
			continue
		}
		if err != nil {
			return 0, s.classify(err)
		}
		for _, kv := range kvs {
			fn(kv)
		}
		return rev, nil
	}
}

func (s *Store) rangeOnce(ctx context.Context, prefix, end string) ([]*mvccpb.KeyValue, int64, error) {
	var rev int64
	var kvs []*mvccpb.KeyValue
	key := prefix
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(ListPageSize)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, key, opts...)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		kvs = append(kvs, resp.Kvs...)
		if !resp.More || len(resp.Kvs) == 0 {
			return kvs, rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Item is one record read by List.
type Item[T records.Record] struct {
	Key    string
	ModRev int64
	Value  T
}

// List returns every usable T under prefix, as of one revision (returned),
// and apart from them the values that are not (each a *RecordError naming
// its key).
func List[T records.Record](ctx context.Context, s *Store, prefix string) ([]Item[T], int64, []*RecordError, error) {
	var items []Item[T]
	var bad []*RecordError
	rev, err := s.Range(ctx, prefix, func(kv *mvccpb.KeyValue) {
		v, err := Decode[T](string(kv.Key), kv.Value)
		if err != nil {
			var re *RecordError
			if errors.As(err, &re) {
				bad = append(bad, re)
			}
			return
		}
		items = append(items, Item[T]{Key: string(kv.Key), ModRev: kv.ModRevision, Value: v})
	})
	if err != nil {
		return nil, 0, nil, err
	}
	return items, rev, bad, nil
}
