// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// TestMetricsWebConfig runs vrdmad with --web.config.file naming TLS and a
// basic-auth user, and scrapes it as Prometheus would: over TLS, trusting
// the test's CA, with the right password (200, the metrics), a wrong one
// or none (401); a client that does not trust the CA fails the handshake,
// and plain HTTP gets no metrics. A web configuration that names a
// missing certificate stops vrdmad at start, exit 1, saying so.
func TestMetricsWebConfig(t *testing.T) {
	dir, err := os.MkdirTemp("", "vrdmaweb")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	pool := writeServerCert(t, dir)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webConfig, []byte("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\nbasic_auth_users:\n  prometheus: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// A web configuration naming a missing key: vrdmad refuses to start.
	bad := filepath.Join(dir, "bad.yml")
	os.WriteFile(bad, []byte("tls_server_config:\n  cert_file: cert.pem\n  key_file: missing.pem\n"), 0o600)
	var out, errb bytes.Buffer
	if code := Main("vrdmad", []string{"--socket", filepath.Join(dir, "s0"), "--state-dir", filepath.Join(dir, "state0"), "--no-control-plane",
		"--metrics-listen", "127.0.0.1:0", "--web.config.file", bad}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "web configuration "+bad) || !strings.Contains(errb.String(), "missing.pem") {
		t.Errorf("a web configuration with a missing key: exit %d, stderr %q", code, errb.String())
	}

	cmd, lines := startAgent(t, dir, "--no-control-plane", "--log-format", "json", "--metrics-listen", "127.0.0.1:0", "--web.config.file", webConfig)
	defer func() {
		cmd.Process.Kill()
		for range lines {
		}
		cmd.Wait()
	}()
	addr := ""
	deadline := time.After(30 * time.Second)
	for addr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("vrdmad exited before it served metrics: %v", cmd.Wait())
			}
			if strings.Contains(l, `"msg":"metrics"`) {
				_, rest, _ := strings.Cut(l, `"address":"`)
				addr, _, _ = strings.Cut(rest, `"`)
			}
		case <-deadline:
			t.Fatal("vrdmad logged no metrics address within 30 s")
		}
	}
	go func() { // the rest of its log, unread
		for range lines {
		}
	}()
	url := "https://" + addr + "/metrics"
	scrape := func(cfg *tls.Config, user, pass string) (int, string, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		req, _ := http.NewRequest("GET", url, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	trusted := &tls.Config{RootCAs: pool, ServerName: "localhost"}
	if code, body, err := scrape(trusted, "prometheus", "s3cret"); err != nil || code != 200 || !strings.Contains(body, "vrdma_build_info") {
		t.Errorf("the right password: %v, status %d, body %.200q", err, code, body)
	}
	for _, c := range []struct{ user, pass string }{{"prometheus", "wrong"}, {"nobody", "s3cret"}, {"", ""}} {
		if code, body, err := scrape(trusted, c.user, c.pass); err != nil || code != http.StatusUnauthorized || strings.Contains(body, "vrdma_") {
			t.Errorf("user %q password %q: %v, status %d (want 401), body %.200q", c.user, c.pass, err, code, body)
		}
	}
	var unknown x509.UnknownAuthorityError
	if _, _, err := scrape(&tls.Config{ServerName: "localhost"}, "prometheus", "s3cret"); !errors.As(err, &unknown) {
		t.Errorf("a client that does not trust the CA: %v, want an unknown authority error", err)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 || strings.Contains(string(b), "vrdma_") {
			t.Errorf("plain HTTP: status %d, body %.200q", resp.StatusCode, b)
		}
	}
}

// writeServerCert writes cert.pem and key.pem into dir, a certificate for
// localhost and 127.0.0.1 signed by a CA of its own, and returns a pool
// that trusts that CA.
func writeServerCert(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vrdma test CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(filepath.Join(dir, "cert.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool
}
