package store_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/control/etcdtest"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// pki writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, into dir.
type pki struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newPKI(t *testing.T, dir string) pki {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vrdma test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		return write(name+".crt", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", kb)
	}
	p := pki{ca: write("ca.crt", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// TestControlPlaneStoreTLS connects to an etcd that serves clients over
// TLS and requires client certificates: with the right files the store
// works; without a client certificate it does not.
func TestControlPlaneStoreTLS(t *testing.T) {
	ctx := ctxT(t)
	p := newPKI(t, t.TempDir())
	cfg := etcdtest.Config(t.TempDir())
	cfg.ClientTLS = &store.ServerTLSFiles{CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.ca}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientURL = "https://" + ln.Addr().String()
	ln.Close()
	m := etcdtest.StartConfig(t, cfg)

	st, err := store.Open(ctx, store.Config{
		Endpoints: []string{m.ClientURL()},
		TLS:       store.TLSFiles{CertFile: p.clientCert, KeyFile: p.clientKey, CAFile: p.ca},
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
		TLS:         store.TLSFiles{CAFile: p.ca},
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
