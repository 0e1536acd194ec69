// SPDX-License-Identifier: Apache-2.0

package store_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/testenv"
)

// TestControlPlaneStoreTLS connects to an etcd that serves clients over
// TLS and requires client certificates: with the right files the store
// works; without a client certificate it does not.
func TestControlPlaneStoreTLS(t *testing.T) {
	ctx := ctxT(t)
	p := testenv.NewPKI(t, t.TempDir())
	p.Issue(t, "server", net.IPv4(127, 0, 0, 1))
	p.Issue(t, "client")
	cfg := etcdtest.Config(t.TempDir())
	cfg.ClientTLS = &store.ServerTLSFiles{CertFile: p.Cert("server"), KeyFile: p.Key("server"), ClientCAFile: p.CA()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientURL = "https://" + ln.Addr().String()
	ln.Close()
	m := etcdtest.StartConfig(t, cfg)

	st, err := store.Open(ctx, store.Config{
		Endpoints: []string{m.ClientURL()},
		TLS:       store.TLSFiles{CertFile: p.Cert("client"), KeyFile: p.Key("client"), CAFile: p.CA()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Create(ctx, records.SwitchKey("dvs1"), sw("dvs1", 9000)); err != nil {
		t.Fatalf("Create over TLS: %v", err)
	}
	if got, _, err := store.Get[records.Switch](ctx, st, records.SwitchKey("dvs1")); err != nil || got.MTU != 9000 {
		t.Fatalf("Get over TLS = %+v, %v", got, err)
	}

	// Trusting the server but presenting no certificate: refused.
	noCert, err := store.Open(ctx, store.Config{
		Endpoints:   []string{m.ClientURL()},
		TLS:         store.TLSFiles{CAFile: p.CA()},
		DialTimeout: 2 * time.Second,
	})
	if err == nil {
		defer noCert.Close()
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, _, err := store.Get[records.Switch](gctx, noCert, records.SwitchKey("dvs1")); err == nil {
			t.Fatal("a client without a certificate read the store")
		}
	}
	// Bad TLS files are reported when opening.
	if _, err := store.Open(ctx, store.Config{Endpoints: []string{m.ClientURL()}, TLS: store.TLSFiles{CAFile: filepath.Join(t.TempDir(), "missing.crt")}}); err == nil {
		t.Fatal("Open with a missing CA file succeeded")
	}
}
