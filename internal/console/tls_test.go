// SPDX-License-Identifier: Apache-2.0

package console

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate of the CA for name (a server's for
// 127.0.0.1, or a client's) and its key, in PEM.
func (ca *testCA) issue(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// writeFile writes b to name in dir and returns its path.
func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConsoleTLS serves the console over TLS with client certificates
// required (TLSConfig from PEM files, as vrdmactl console --tls-cert
// --tls-key --tls-client-ca): a client without a certificate, or with
// one of another CA, does not get through the handshake; one with a
// certificate of the client CA reads and writes without a token, under
// a Host name that is not loopback.
func TestConsoleTLS(t *testing.T) {
	f := startFabric(t, "")
	dir := t.TempDir()
	serverCA, clientCA, otherCA := newCA(t, "console CA"), newCA(t, "operators CA"), newCA(t, "someone else")
	sc, sk := serverCA.issue(t, "console", true)
	cfg, err := TLSConfig(writeFile(t, dir, "console.pem", sc), writeFile(t, dir, "console-key.pem", sk), writeFile(t, dir, "operators.pem", clientCA.pem))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := TLSConfig(filepath.Join(dir, "console.pem"), filepath.Join(dir, "console-key.pem"), filepath.Join(dir, "console-key.pem")); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a client CA file with no certificate: %v", err)
	}
	// Served as vrdmactl console serves it, off loopback (every address
	// of the machine).
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckListen(ln.Addr().String(), "", true); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- Serve(ctx, ln, New(Config{Socket: f.env.Socket, Cache: f.cache, Store: f.st, ClientCerts: true}), cfg)
	}()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if u := URL(ln.Addr(), true, "t&"); u != "https://"+ln.Addr().String()+"/?token=t%26" {
		t.Errorf("URL: %s", u)
	}
	base := "https://127.0.0.1:" + port

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.pem)
	client := func(ca *testCA) *http.Client {
		tc := &tls.Config{RootCAs: roots}
		if ca != nil {
			c, k := ca.issue(t, "operator", false)
			pair, err := tls.X509KeyPair(c, k)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
	}
	for name, c := range map[string]*http.Client{"no certificate": client(nil), "another CA's certificate": client(otherCA)} {
		if resp, err := c.Get(base + "/api/inventory"); err == nil {
			resp.Body.Close()
			t.Errorf("%s: GET /api/inventory answered %d, want the handshake refused", name, resp.StatusCode)
		}
	}
	c := client(clientCA)
	req, _ := http.NewRequest("GET", base+"/api/inventory", nil)
	req.Host = "console.example:8479"
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var inv Inventory
	err = json.NewDecoder(resp.Body).Decode(&inv)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(inv.Switches) != 1 {
		t.Fatalf("GET /api/inventory with a client certificate: %d %+v %v", resp.StatusCode, inv, err)
	}
	req, _ = http.NewRequest("POST", base+"/api/switches", strings.NewReader(`{"name":"dvs-tls","mtu":9000}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(writeHeader, "1")
	if resp, err = c.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("create a switch with a client certificate: %d", resp.StatusCode)
	}
	// A browser over HTTPS with a token (no client certificates asked):
	// the token's cookie, and a write from the page (its origin is
	// https://...).
	tsrv := httptest.NewUnstartedServer(New(Config{Socket: f.env.Socket, Cache: f.cache, Store: f.st, Token: "s3cret"}))
	tsrv.TLS, err = TLSConfig(filepath.Join(dir, "console.pem"), filepath.Join(dir, "console-key.pem"), "")
	if err != nil {
		t.Fatal(err)
	}
	tsrv.StartTLS()
	defer tsrv.Close()
	spki := sha256.Sum256(tsrv.TLS.Certificates[0].Leaf.RawSubjectPublicKeyInfo)
	bctx := browser(t, 1000, chromedp.Flag("ignore-certificate-errors-spki-list", base64.StdEncoding.EncodeToString(spki[:])))
	stayHome(t, bctx, tsrv.URL)
	do(t, bctx, "create a switch over HTTPS",
		chromedp.Navigate(tsrv.URL+"/?token=s3cret"),
		waitText("main", "Switch dvs1", "Switch dvs-tls"),
		chromedp.Evaluate[chromedp.Void](`document.querySelectorAll('#create-h ~ details').forEach(d => d.open = true)`),
		chromedp.SendKeys(chromedp.CSS("#sw-name"), "dvs-https\r"),
		waitText("#admin-result", "Switch dvs-https created."))

	// Over plain TCP, without TLS, the same handler lets nobody in: the
	// client certificate is its only credential.
	plain := httptest.NewServer(New(Config{Socket: f.env.Socket, Cache: f.cache, ClientCerts: true}))
	defer plain.Close()
	var e map[string]string
	if code := call(t, plain, "GET", "/api/inventory", nil, &e); code != 401 {
		t.Errorf("no TLS, client certificates required: %d %v", code, e)
	}
}
