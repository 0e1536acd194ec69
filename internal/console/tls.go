// SPDX-License-Identifier: Apache-2.0

package console

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"
)

// TLSConfig returns the console's TLS configuration: its certificate
// and key (PEM files), and, when clientCA is not empty, a client
// certificate signed by one of clientCA's certificates required of
// every connection (Config.ClientCerts).
func TLSConfig(certFile, keyFile, clientCA string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w (want PEM files of a certificate and its private key)", certFile, keyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(clientCA)
	if err != nil {
		return nil, fmt.Errorf("--tls-client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-client-ca %s: no PEM certificate in it", clientCA)
	}
	cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	return cfg, nil
}

// URL is the address to open of a console listening on addr: https with
// TLS, and with the token (which the page moves into a cookie).
func URL(addr net.Addr, withTLS bool, token string) string {
	u := "http://" + addr.String() + "/"
	if withTLS {
		u = "https://" + addr.String() + "/"
	}
	if token != "" {
		u += "?token=" + url.QueryEscape(token)
	}
	return u
}

// Serve serves h on ln, over TLS with tlsCfg if it is not nil, until
// ctx ends; then it lets the requests under way finish (5 s at most).
func Serve(ctx context.Context, ln net.Listener, h http.Handler, tlsCfg *tls.Config) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsCfg}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-stopped:
			return
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(ln)
	close(stopped)
	if !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}
