// SPDX-License-Identifier: Apache-2.0

package agent

// The agent's metrics endpoint (Config.MetricsListen): an HTTP server of
// its own, serving /metrics, /healthz and /readyz (package metrics) from
// the agent's status report and health, and with Config.MetricsPprof Go's
// profiles under /debug/pprof/; started by New, stopped by shutdown. Config.MetricsWebConfig adds TLS and basic authentication
// through the Prometheus exporter toolkit's web configuration file, the
// same file as node_exporter's --web.config.file.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/exporter-toolkit/web"

	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/metrics"
)

// startMetrics listens on addr and serves the agent's metrics there, with
// TLS and basic authentication if Config.MetricsWebConfig says so.
func (a *Agent) startMetrics(addr string) error {
	webConfig := a.cfg.MetricsWebConfig
	// The toolkit reads the file again on every connection (so that
	// certificates can be renewed in place): a file that is wrong now is
	// refused at start rather than at the first scrape.
	if err := web.Validate(webConfig); err != nil {
		return fmt.Errorf("metrics: web configuration %s: %w (the exporter toolkit's format: tls_server_config, basic_auth_users with bcrypt hashes)", webConfig, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w (pick another --metrics-listen address)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(metricsSource{a}, metrics.Options{NoQPSeries: a.cfg.MetricsNoQPSeries}))
	healthz, readyz := metrics.HealthHandlers(metricsSource{a})
	mux.Handle("/healthz", healthz)
	mux.Handle("/readyz", readyz)
	if a.cfg.MetricsPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index) // the named profiles: goroutine, heap, …
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	a.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	a.metricsAddr = ln.Addr()
	go func() {
		flags := &web.FlagConfig{WebConfigFile: &webConfig}
		if err := web.Serve(ln, a.metrics, flags, a.log.With("component", "metrics")); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Warn("metrics server", "err", err)
		}
	}()
	a.log.Info("metrics", "address", ln.Addr().String())
	return nil
}

// MetricsAddr is where the agent serves its metrics; nil without.
func (a *Agent) MetricsAddr() net.Addr { return a.metricsAddr }

// stopMetrics stops the metrics server.
func (a *Agent) stopMetrics() {
	if a.metrics == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	a.metrics.Shutdown(ctx)
}

// metricsSource is the agent as package metrics reads it.
type metricsSource struct{ a *Agent }

func (m metricsSource) Status() mgmt.Status { return m.a.status() }

func (m metricsSource) Health() metrics.Health {
	a := m.a
	a.mu.Lock()
	h := metrics.Health{Sessions: len(a.sessions)}
	a.mu.Unlock()
	if c := a.ctl; c != nil {
		h.ControlPlane = true
		h.ControlPlaneUp = c.cache.Err() == nil
		h.LeaseAge, h.LeaseHeld = c.member.LeaseAge()
	}
	return h
}
