// SPDX-License-Identifier: Apache-2.0

package testenv

import (
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
)

// PKI is a certificate authority of a test's own, for TLS between etcd,
// agents and vrdmactl: P-256 keys, certificates valid for a day, PEM files
// in a directory (NAME.pem and NAME-key.pem, the CA's ca.pem).
type PKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

// NewPKI makes a CA in dir.
func NewPKI(tb testing.TB, dir string) *PKI {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vrdma test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	p := &PKI{dir: dir, caKey: key, serial: 1}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		tb.Fatal(err)
	}
	p.write(tb, "ca", der, nil)
	return p
}

// CA returns the CA's certificate file.
func (p *PKI) CA() string { return p.Cert("ca") }

// Cert returns the certificate file of name.
func (p *PKI) Cert(name string) string { return filepath.Join(p.dir, name+".pem") }

// Key returns the key file of name.
func (p *PKI) Key(name string) string { return filepath.Join(p.dir, name+"-key.pem") }

// Issue writes Cert(name) and Key(name): a certificate with common name
// name (etcd's user name for a client certificate) for both TLS server
// and client use, naming the IP addresses ips.
func (p *PKI) Issue(tb testing.TB, name string, ips ...net.IP) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		IPAddresses: ips}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		tb.Fatal(err)
	}
	p.write(tb, name, der, key)
}

// write writes name's certificate, and its key unless key is nil.
func (p *PKI) write(tb testing.TB, name string, der []byte, key *ecdsa.PrivateKey) {
	tb.Helper()
	if err := os.WriteFile(p.Cert(name), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		tb.Fatal(err)
	}
	if key == nil {
		return
	}
	b, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p.Key(name), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b}), 0o600); err != nil {
		tb.Fatal(err)
	}
}
