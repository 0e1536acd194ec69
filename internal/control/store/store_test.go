// SPDX-License-Identifier: Apache-2.0

package store_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func sw(name string, mtu int) records.Switch {
	return records.Switch{Name: name, UUID: "50 1d 0b 8e 8d 95 4e 2b-b2 5c 2f 3a a6 1a 9e 1d", MTU: mtu, UplinkPolicy: records.UplinkSingle}
}

// TestControlPlaneStoreEmbedded opens the default store (an embedded etcd
// on a Unix socket in its data directory), and a second client that finds
// it through the endpoint file, as vrdmactl would.
func TestControlPlaneStoreEmbedded(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	st, err := store.Open(ctx, store.Config{DataDir: dir, UnsafeNoFsync: true, Embed: etcdtest.Config("")})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	url, err := store.ReadEndpointFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(url, "unix://"+dir) {
		t.Errorf("embedded client URL %q is not a Unix socket in %s", url, dir)
	}
	if _, err := st.Create(ctx, records.SwitchKey("dvs1"), sw("dvs1", 9000)); err != nil {
		t.Fatal(err)
	}
	other := etcdtest.Open(t, url)
	got, _, err := store.Get[records.Switch](ctx, other, records.SwitchKey("dvs1"))
	if err != nil || !reflect.DeepEqual(got, sw("dvs1", 9000)) {
		t.Fatalf("second client reads %+v, %v", got, err)
	}
	raw, err := other.Client().Get(ctx, records.SwitchKey("dvs1"))
	if err != nil {
		t.Fatal(err)
	}
	if v := string(raw.Kvs[0].Value); !strings.HasPrefix(v, `{"schema":1,"kind":"switch","name":"dvs1",`) {
		t.Errorf("stored form %s lacks the schema/kind header", v)
	}
	select {
	case <-st.Embedded().Done():
		t.Fatal("embedded etcd stopped")
	default:
	}
	st.Close()
	select {
	case <-st.Embedded().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("embedded etcd did not stop")
	}
	if err := st.Embedded().Err(); err != nil {
		t.Errorf("closed embedded etcd reports %v", err)
	}
}

// TestControlPlaneStoreCAS checks the compare-and-swap semantics of every
// single-key operation.
func TestControlPlaneStoreCAS(t *testing.T) {
	ctx := ctxT(t)
	st := etcdtest.OpenEmbedded(t)
	key := records.SwitchKey("dvs1")

	if _, _, err := store.Get[records.Switch](ctx, st, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v; want ErrNotFound", err)
	}
	rev1, err := st.Create(ctx, key, sw("dvs1", 1500))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create(ctx, key, sw("dvs1", 9000)); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second Create: %v; want ErrExists", err)
	}
	rev2, err := st.Put(ctx, key, sw("dvs1", 4000), rev1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, key, sw("dvs1", 5000), rev1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Put with a stale revision: %v; want ErrConflict", err)
	}
	if _, err := st.Put(ctx, records.SwitchKey("dvs2"), sw("dvs2", 1500), 7); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Put of a missing key with a revision: %v; want ErrConflict", err)
	}
	if err := st.Delete(ctx, key, rev1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Delete with a stale revision: %v; want ErrConflict", err)
	}
	got, rev, err := store.Get[records.Switch](ctx, st, key)
	if err != nil || got.MTU != 4000 || rev != rev2 {
		t.Fatalf("Get = %+v rev %d, %v; want MTU 4000 at rev %d", got, rev, err, rev2)
	}

	// Invalid records are refused before anything is written.
	if _, err := st.Put(ctx, key, sw("dvs1", 99999), rev2); !errors.Is(err, records.ErrInvalid) || !strings.Contains(err.Error(), "mtu: 99999 is out of range") {
		t.Fatalf("Put of an invalid record: %v; want ErrInvalid naming mtu", err)
	}

	// Update: modify, unchanged, delete, create.
	n, _, err := store.Update(ctx, st, key, func(old *records.Switch) (*records.Switch, error) {
		if old == nil || old.MTU != 4000 {
			return nil, fmt.Errorf("Update got %+v", old)
		}
		old.MTU = 9000
		return old, nil
	})
	if err != nil || n.MTU != 9000 {
		t.Fatalf("Update = %+v, %v", n, err)
	}
	n, _, err = store.Update(ctx, st, key, func(old *records.Switch) (*records.Switch, error) { return nil, store.ErrUnchanged })
	if err != nil || n.MTU != 9000 {
		t.Fatalf("unchanged Update = %+v, %v", n, err)
	}
	if _, _, err := store.Update(ctx, st, key, func(old *records.Switch) (*records.Switch, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Get[records.Switch](ctx, st, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after deleting Update: %v; want ErrNotFound", err)
	}
	n, _, err = store.Update(ctx, st, key, func(old *records.Switch) (*records.Switch, error) {
		if old != nil {
			return nil, errors.New("want nil")
		}
		s := sw("dvs1", 1500)
		return &s, nil
	})
	if err != nil || n.MTU != 1500 {
		t.Fatalf("creating Update = %+v, %v", n, err)
	}
	wantErr := errors.New("no")
	if _, _, err := store.Update(ctx, st, key, func(*records.Switch) (*records.Switch, error) { return nil, wantErr }); !errors.Is(err, wantErr) {
		t.Fatalf("Update returned %v; want fn's error", err)
	}
}

// counter is a record whose two fields must always agree: a torn or mixed
// write would break that.
func counter(n int) records.Switch {
	s := sw("ctr", records.MinMTU+n)
	s.UUID = fmt.Sprintf("%032x", n)
	return s
}

func checkCounter(t *testing.T, s records.Switch) int {
	t.Helper()
	n := s.MTU - records.MinMTU
	if s.UUID != fmt.Sprintf("%032x", n) {
		t.Fatalf("torn record: MTU %d with UUID %s", s.MTU, s.UUID)
	}
	return n
}

// TestControlPlaneStoreConcurrentWriters races two clients (two etcd
// connections, as two agents) on one record, many times: no update is
// lost, no record is torn, and a writer that loses a race either retries
// (Update) or fails cleanly with ErrConflict (Put).
func TestControlPlaneStoreConcurrentWriters(t *testing.T) {
	ctx := ctxT(t)
	m := etcdtest.Start(t)
	a := etcdtest.Open(t, m.ClientURL())
	b := etcdtest.Open(t, m.ClientURL())
	key := records.SwitchKey("ctr")
	if _, err := a.Create(ctx, key, counter(0)); err != nil {
		t.Fatal(err)
	}

	want := 0 // increments that succeeded
	t.Run("Update", func(t *testing.T) {
		const perWriter = 100
		var wg sync.WaitGroup
		var mu sync.Mutex
		var ok, gaveUp int
		for _, s := range []*store.Store{a, b, a, b} { // two goroutines per client
			wg.Go(func() {
				for range perWriter {
					_, _, err := store.Update(ctx, s, key, func(old *records.Switch) (*records.Switch, error) {
						n := checkCounter(t, *old)
						c := counter(n + 1)
						return &c, nil
					})
					mu.Lock()
					switch {
					case err == nil:
						ok++
					case errors.Is(err, store.ErrConflict):
						gaveUp++ // bounded retries ran out: a clean failure
					default:
						t.Errorf("Update: %v", err)
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		got, _, err := store.Get[records.Switch](ctx, a, key)
		if err != nil {
			t.Fatal(err)
		}
		if n := checkCounter(t, got); n != ok {
			t.Fatalf("counter = %d after %d successful increments: updates were lost", n, ok)
		}
		if gaveUp > 4*perWriter/10 {
			t.Errorf("%d of %d updates gave up: retries are not spreading writers out", gaveUp, 4*perWriter)
		}
		t.Logf("%d increments, %d gave up after MaxRetries", ok, gaveUp)
		want = ok
	})

	t.Run("Put", func(t *testing.T) {
		const rounds = 150
		for i := range rounds {
			cur, rev, err := store.Get[records.Switch](ctx, a, key)
			if err != nil {
				t.Fatal(err)
			}
			n := checkCounter(t, cur)
			start := make(chan struct{})
			res := make(chan error, 2)
			for _, s := range []*store.Store{a, b} {
				go func() {
					<-start
					_, err := s.Put(ctx, key, counter(n+1), rev)
					res <- err
				}()
			}
			close(start)
			e1, e2 := <-res, <-res
			switch {
			case e1 == nil && errors.Is(e2, store.ErrConflict), e2 == nil && errors.Is(e1, store.ErrConflict):
			default:
				t.Fatalf("round %d: results %v, %v; want one success and one ErrConflict", i, e1, e2)
			}
		}
		got, _, _ := store.Get[records.Switch](ctx, b, key)
		if n := checkCounter(t, got); n != want+rounds {
			t.Fatalf("counter = %d; want %d", n, want+rounds)
		}
	})

	t.Run("Txn", func(t *testing.T) {
		// Two records whose MTUs always sum to the same value; writers move
		// units between them with multi-key transactions.
		k1, k2 := records.SwitchKey("left"), records.SwitchKey("right")
		if _, err := a.Create(ctx, k1, sw("left", 5000)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Create(ctx, k2, sw("right", 5000)); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for i, s := range []*store.Store{a, b} {
			wg.Go(func() {
				for range 60 {
					_, err := store.Txn(ctx, s, func(tx *store.Tx) error {
						l, err := store.TxGet[records.Switch](tx, k1)
						if err != nil {
							return err
						}
						r, err := store.TxGet[records.Switch](tx, k2)
						if err != nil {
							return err
						}
						d := 1 - 2*i // a moves right to left, b the other way
						l.MTU += d
						r.MTU -= d
						if err := tx.Put(k1, *l); err != nil {
							return err
						}
						return tx.Put(k2, *r)
					})
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("Txn: %v", err)
		}
		l, _, _ := store.Get[records.Switch](ctx, a, k1)
		r, _, _ := store.Get[records.Switch](ctx, a, k2)
		if l.MTU != 5000 || r.MTU != 5000 {
			t.Fatalf("after 60 moves each way: left %d, right %d; want 5000 each (sum %d)", l.MTU, r.MTU, l.MTU+r.MTU)
		}
	})

	t.Run("UpdateGivesUp", func(t *testing.T) {
		// A writer that keeps losing stops after MaxRetries with
		// ErrConflict instead of spinning.
		st, err := store.Open(ctx, store.Config{Endpoints: []string{m.ClientURL()}, MaxRetries: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		calls := 0
		_, _, err = store.Update(ctx, st, key, func(old *records.Switch) (*records.Switch, error) {
			calls++
			// Someone else writes between our read and our write.
			if _, _, err := store.Update(ctx, b, key, func(o *records.Switch) (*records.Switch, error) {
				c := counter(checkCounter(t, *o) + 1)
				return &c, nil
			}); err != nil {
				return nil, err
			}
			c := counter(checkCounter(t, *old) + 1)
			return &c, nil
		})
		if !errors.Is(err, store.ErrConflict) || calls != 3 {
			t.Fatalf("Update = %v after %d calls; want ErrConflict after 3", err, calls)
		}
	})
}

// TestControlPlaneStoreBadRecords puts garbage, foreign and incomplete
// values where records belong: readers report each with its key and go on.
func TestControlPlaneStoreBadRecords(t *testing.T) {
	ctx := ctxT(t)
	st := etcdtest.OpenEmbedded(t)
	cli := st.Client()
	good := []string{"dvs-a", "dvs-b"}
	for _, n := range good {
		if _, err := st.Create(ctx, records.SwitchKey(n), sw(n, 1500)); err != nil {
			t.Fatal(err)
		}
	}
	bad := map[string]struct {
		val string
		err error
		say string
	}{
		"garbage":   {`{"schema":1,"kind":"switch","name":`, store.ErrGarbage, "not a JSON record"},
		"binary":    {"\x00\xff\xfe", store.ErrGarbage, "not a JSON record"},
		"schema2":   {`{"schema":2,"kind":"switch","name":"schema2","future":true}`, store.ErrSchema, "schema 2, this build reads schema 1"},
		"noschema":  {`{"kind":"switch","name":"noschema"}`, store.ErrSchema, "no schema version"},
		"foreign":   {`{"schema":1,"kind":"host","id":"foreign"}`, store.ErrForeign, `kind "host" where "switch" belongs`},
		"missing":   {`{"schema":1,"kind":"switch","name":"missing"}`, records.ErrInvalid, "uuid: missing"},
		"wrongtype": {`{"schema":1,"kind":"switch","name":"wrongtype","mtu":"big"}`, store.ErrGarbage, "cannot unmarshal"},
		"array":     {`[1,2,3]`, store.ErrGarbage, "not a JSON record"},
	}
	for name, b := range bad {
		if _, err := cli.Put(ctx, records.SwitchKey(name), b.val); err != nil {
			t.Fatal(err)
		}
	}
	items, _, badRecs, err := store.List[records.Switch](ctx, st, records.SwitchPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != len(good) || items[0].Value.Name != "dvs-a" || items[1].Value.Name != "dvs-b" {
		t.Errorf("List kept %+v; want the %d good switches", items, len(good))
	}
	if len(badRecs) != len(bad) {
		t.Errorf("List reported %d bad records; want %d: %v", len(badRecs), len(bad), badRecs)
	}
	for _, re := range badRecs {
		name := strings.TrimPrefix(re.Key, records.SwitchPrefix)
		b, ok := bad[name]
		if !ok {
			t.Errorf("unexpected bad record %v", re)
			continue
		}
		if !errors.Is(re, b.err) || !errors.Is(re, store.ErrBadRecord) || !strings.Contains(re.Error(), b.say) || !strings.Contains(re.Error(), re.Key) {
			t.Errorf("%s: %v; want %v saying %q and naming the key", name, re, b.err, b.say)
		}
	}
	// Single reads report the key too; Update leaves such a record alone.
	_, _, err = store.Get[records.Switch](ctx, st, records.SwitchKey("schema2"))
	var re *store.RecordError
	if !errors.As(err, &re) || re.Key != records.SwitchKey("schema2") {
		t.Errorf("Get of a schema-2 record: %v; want a *RecordError with its key", err)
	}
	_, _, err = store.Update(ctx, st, records.SwitchKey("garbage"), func(*records.Switch) (*records.Switch, error) {
		t.Error("Update ran fn on garbage")
		return nil, nil
	})
	if !errors.Is(err, store.ErrBadRecord) {
		t.Errorf("Update of garbage: %v; want ErrBadRecord", err)
	}
	raw, _ := cli.Get(ctx, records.SwitchKey("schema2"))
	if string(raw.Kvs[0].Value) != bad["schema2"].val {
		t.Errorf("a newer build's record was changed: %s", raw.Kvs[0].Value)
	}
}

// TestControlPlaneStoreNames checks that names are validated on the way in,
// with errors that say what to write.
func TestControlPlaneStoreNames(t *testing.T) {
	ctx := ctxT(t)
	st := etcdtest.OpenEmbedded(t)
	tests := []struct {
		r    records.Record
		says string
	}{
		{sw("", 1500), "name: missing"},
		{sw("dvs/1", 1500), `has '/' at offset 3`},
		{sw(strings.Repeat("d", 65), 1500), "65 characters, more than 64"},
		{sw("-dvs", 1500), "start with a letter or digit"},
		{records.PortGroup{Name: "pg", Key: "dvportgroup 80", Switch: "dvs1", RoCEVersion: records.RoCEv2}, `portgroup "dvportgroup 80": key:`},
		{records.VM{Name: "vm\n1", Power: records.PoweredOff}, `'\n' at offset 2`},
	}
	for _, tt := range tests {
		_, err := st.Create(ctx, records.Prefix+"names/x", tt.r)
		if !errors.Is(err, records.ErrInvalid) || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("Create(%+v) = %v; want ErrInvalid saying %q", tt.r, err, tt.says)
		}
	}
	resp, err := st.Client().Get(ctx, records.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Errorf("invalid records were written: count %d, %v", resp.Count, err)
	}
}

// TestControlPlaneStoreRange pages through more keys than one request
// returns.
func TestControlPlaneStoreRange(t *testing.T) {
	ctx := ctxT(t)
	st := etcdtest.OpenEmbedded(t)
	const n = store.ListPageSize + 321
	ops := make([]clientv3.Op, 0, 128)
	flush := func() {
		if _, err := st.Client().Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := range n {
		a := records.Adapter{VM: fmt.Sprintf("vm%05d", i), Index: 0, MAC: "00:50:56:00:00:01",
			GID: records.GIDOf(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})), PortGroup: "pg"}
		val, err := store.Encode(a)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(records.KeyOf(a), string(val)))
		if len(ops) == cap(ops) {
			flush()
		}
	}
	flush()
	items, _, bad, err := store.List[records.Adapter](ctx, st, records.AdapterPrefix)
	if err != nil || len(bad) != 0 {
		t.Fatal(err, bad)
	}
	if len(items) != n {
		t.Fatalf("List returned %d adapters; want %d", len(items), n)
	}
	for i, it := range items {
		if want := fmt.Sprintf("vm%05d", i); it.Value.VM != want {
			t.Fatalf("item %d is %s; want %s (order or duplicates)", i, it.Value.VM, want)
		}
	}
}

// TestControlPlaneStoreUnavailable checks that an operation on an etcd
// that is gone fails with ErrUnavailable, naming the endpoints.
func TestControlPlaneStoreUnavailable(t *testing.T) {
	m := etcdtest.Start(t)
	st := etcdtest.Open(t, m.ClientURL())
	m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _, err := store.Get[records.Switch](ctx, st, records.SwitchKey("dvs1"))
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), m.ClientURL()) {
		t.Fatalf("Get with etcd stopped: %v; want ErrUnavailable naming %s", err, m.ClientURL())
	}
}
