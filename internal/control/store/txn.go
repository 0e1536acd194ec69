// SPDX-License-Identifier: Apache-2.0

package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vrdma/vrdma/internal/control/records"
)

// Tx is one attempt of a multi-record transaction run by Txn. Reads see
// one revision of the store; at commit, every key read or written must
// still have the ModRevision this attempt saw (missing keys must still be
// missing), or the attempt is thrown away and Txn runs fn again.
//
// A Tx is used by the one goroutine running fn; it is not safe for
// concurrent use.
type Tx struct {
	ctx    context.Context
	s      *Store
	rev    int64                       // the revision reads see; 0 until the first read
	seen   map[string]*mvccpb.KeyValue // keys read, nil value if missing
	writes map[string]clientv3.Op      // last write per key
	order  []string                    // keys written, first-write order
}

// Prefetch reads keys in one round trip, so that later reads of them cost
// nothing. Keys already read are skipped.
func (tx *Tx) Prefetch(keys ...string) error {
	var ops []clientv3.Op
	var want []string
	for _, k := range keys {
		if _, ok := tx.seen[k]; ok || slices.Contains(want, k) {
			continue
		}
		want = append(want, k)
		if tx.rev != 0 {
			ops = append(ops, clientv3.OpGet(k, clientv3.WithRev(tx.rev)))
		} else {
			ops = append(ops, clientv3.OpGet(k))
		}
	}
	if len(ops) == 0 {
		return nil
	}
	resp, err := tx.s.cli.Txn(tx.ctx).Then(ops...).Commit()
	if err != nil {
		return tx.s.classify(err)
	}
	if tx.rev == 0 {
		tx.rev = resp.Header.Revision
	}
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) > 0 {
			tx.seen[want[i]] = kvs[0]
		} else {
			tx.seen[want[i]] = nil
		}
	}
	return nil
}

func (tx *Tx) get(key string) (*mvccpb.KeyValue, error) {
	if kv, ok := tx.seen[key]; ok {
		return kv, nil
	}
	if err := tx.Prefetch(key); err != nil {
		return nil, err
	}
	return tx.seen[key], nil
}

// Exists reports whether key holds a value (as of the transaction's
// revision).
func (tx *Tx) Exists(key string) (bool, error) {
	kv, err := tx.get(key)
	return kv != nil, err
}

// TxGet returns the record under key as the transaction sees it: nil if
// there is none, a *RecordError if the value is not a usable T.
// A key written earlier in the same attempt reads as it was before.
func TxGet[T records.Record](tx *Tx, key string) (*T, error) {
	kv, err := tx.get(key)
	if err != nil || kv == nil {
		return nil, err
	}
	v, err := Decode[T](key, kv.Value)
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// Put stores r under key when the transaction commits. The key is read
// first if it was not, so that the commit checks it too.
func (tx *Tx) Put(key string, r records.Record) error {
	val, err := Encode(r)
	if err != nil {
		return err
	}
	if _, err := tx.get(key); err != nil {
		return err
	}
	tx.write(key, clientv3.OpPut(key, string(val)))
	return nil
}

// Delete removes key when the transaction commits (nothing if it is
// missing then as now).
func (tx *Tx) Delete(key string) error {
	kv, err := tx.get(key)
	if err != nil {
		return err
	}
	if kv == nil {
		delete(tx.writes, key)
		return nil
	}
	tx.write(key, clientv3.OpDelete(key))
	return nil
}

func (tx *Tx) write(key string, op clientv3.Op) {
	if _, ok := tx.writes[key]; !ok {
		tx.order = append(tx.order, key)
	}
	tx.writes[key] = op
}

// Txn runs fn and commits what it wrote as one etcd transaction, guarded
// by a compare on every key fn read or wrote. If another writer changed
// one of them in between, fn runs again on fresh reads, up to MaxRetries
// attempts; then Txn fails with ErrConflict. An error from fn aborts
// without writing. Txn returns the revision of the commit (0 if fn wrote
// nothing).
func Txn(ctx context.Context, s *Store, fn func(tx *Tx) error) (int64, error) {
	for attempt := 1; ; attempt++ {
		tx := &Tx{ctx: ctx, s: s, seen: map[string]*mvccpb.KeyValue{}, writes: map[string]clientv3.Op{}}
		err := fn(tx)
		if errors.Is(err, rpctypes.ErrCompacted) {
			continue // our read revision is gone: read again
		}
		if err != nil {
			return 0, err
		}
		if len(tx.order) == 0 {
			return 0, nil
		}
		keys := make([]string, 0, len(tx.seen))
		for k := range tx.seen {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		cmps := make([]clientv3.Cmp, 0, len(keys))
		for _, k := range keys {
			var rev int64
			if kv := tx.seen[k]; kv != nil {
				rev = kv.ModRevision
			}
			cmps = append(cmps, revIs(k, rev))
		}
		ops := make([]clientv3.Op, 0, len(tx.order))
		for _, k := range tx.order {
			if op, ok := tx.writes[k]; ok {
				ops = append(ops, op)
			}
		}
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return 0, s.classify(err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		if attempt >= s.maxRetries {
			return 0, fmt.Errorf("transaction on %d keys: %w: still changing after %d attempts", len(keys), ErrConflict, attempt)
		}
		if err := backoff(ctx, attempt); err != nil {
			return 0, err
		}
	}
}
