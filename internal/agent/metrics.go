package agent

// The agent's metrics endpoint (Config.MetricsListen): an HTTP server of
// its own, serving /metrics, /healthz and /readyz (package metrics) from
// the agent's status report and health; started by New, stopped by
// shutdown.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/metrics"
)

// startMetrics listens on addr and serves the agent's metrics there.
func (a *Agent) startMetrics(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w (pick another --metrics-listen address)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(metricsSource{a}, metrics.Options{NoQPSeries: a.cfg.MetricsNoQPSeries}))
	healthz, readyz := metrics.HealthHandlers(metricsSource{a})
	mux.Handle("/healthz", healthz)
	mux.Handle("/readyz", readyz)
	a.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	a.metricsAddr = ln.Addr()
	go func() {
		if err := a.metrics.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
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
