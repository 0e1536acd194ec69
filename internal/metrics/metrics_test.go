// SPDX-License-Identifier: Apache-2.0

package metrics_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/buildinfo"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/metrics"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/testenv"
)

// scrape reads the metrics at addr with the Prometheus text parser.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the metrics do not parse: %v", err)
	}
	return mfs
}

// sum adds the values of family name's metrics whose labels include
// want; false if there is none.
func sum(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	total, found := 0.0, false
next:
	for _, m := range mf.GetMetric() {
		for k, v := range want {
			ok := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					ok = true
				}
			}
			if !ok {
				continue next
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		}
	}
	return total, found
}

// traffic connects a pair between the first adapters of a and b, checks
// its path, and runs iters RDMA WRITEs of size bytes and as many SENDs.
// The pair stays connected until t ends: a QP's series go with it.
func traffic(t *testing.T, a, b *vrdma.VM, path vrdma.PathKind, size, iters int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, a.Adapters()[0], b.Adapters()[0], perf.PairConfig{BufSize: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	if got := p.Path().Path; got != path {
		t.Fatalf("path %q, want %s", got, path)
	}
	for _, c := range []perf.Config{{Test: perf.WriteBW, Size: size, Iters: iters}, {Test: perf.SendBW, Size: size, Iters: iters}} {
		if _, err := p.Run(ctx, c); err != nil {
			t.Fatalf("%s: %v", c.Test.Title(""), err)
		}
	}
}

// atLeast fails t unless the metrics of family name with labels want add
// up to at least min.
func atLeast(t *testing.T, mfs map[string]*dto.MetricFamily, name string, want map[string]string, min float64) {
	t.Helper()
	v, ok := sum(mfs, name, want)
	if !ok || v < min {
		t.Errorf("%s%v = %v (present %v), want at least %v", name, want, v, ok, min)
	}
}

// TestMetrics scrapes an agent's metrics endpoint after known traffic on
// each path and checks, with the Prometheus text parser, that the
// counters moved by what the traffic did: the work requests by opcode
// and their bytes, the receives, the completions, the uplinks' bytes and
// packets; and the agent's health.
func TestMetrics(t *testing.T) {
	const size, iters = 4096, 300
	t.Run("memcpy", func(t *testing.T) {
		env := testenv.StartWith(t, testenv.Options{MetricsListen: "127.0.0.1:0"})
		a, b := env.Open(t, "m1", testenv.VMOptions{}), env.Open(t, "m2", testenv.VMOptions{})
		traffic(t, a, b, vrdma.PathMemcpy, size, iters)
		mfs := scrape(t, env.Agent.MetricsAddr().String())
		path := map[string]string{"path": "memcpy"}
		atLeast(t, mfs, "vrdma_qp_work_requests_total", map[string]string{"path": "memcpy", "opcode": "RDMA_WRITE", "vm": "m1"}, iters)
		atLeast(t, mfs, "vrdma_qp_work_requests_total", map[string]string{"path": "memcpy", "opcode": "SEND", "vm": "m1"}, iters)
		atLeast(t, mfs, "vrdma_qp_bytes_total", map[string]string{"path": "memcpy", "queue": "send", "vm": "m1"}, 2*iters*size)
		atLeast(t, mfs, "vrdma_qp_bytes_total", map[string]string{"path": "memcpy", "queue": "recv", "vm": "m2"}, iters*size)
		atLeast(t, mfs, "vrdma_qp_receives_total", map[string]string{"path": "memcpy", "vm": "m2"}, iters)
		atLeast(t, mfs, "vrdma_qp_completions_total", map[string]string{"path": "memcpy", "status": "SUCCESS"}, iters)
		atLeast(t, mfs, "vrdma_queue_pairs", path, 2)
		atLeast(t, mfs, "vrdma_vms", map[string]string{"state": "attached"}, 2)
		atLeast(t, mfs, "vrdma_agent_sessions", nil, 2)
		atLeast(t, mfs, "vrdma_qp_doorbells_total", map[string]string{"vm": "m1"}, 1)
		atLeast(t, mfs, "vrdma_adapter_work_requests_total", map[string]string{"vm": "m1", "adapter": "vrdma0", "opcode": "RDMA_WRITE"}, iters)
		atLeast(t, mfs, "vrdma_adapter_bytes_total", map[string]string{"vm": "m2", "queue": "recv"}, iters*size)
		atLeast(t, mfs, "vrdma_qp_poll_seconds_total", map[string]string{"vm": "m1"}, 1e-9)
		atLeast(t, mfs, "go_goroutines", nil, 1)
		if _, ok := mfs["vrdma_control_plane_up"]; ok {
			t.Errorf("vrdma_control_plane_up is there for an agent without a control plane")
		}
	})
	t.Run("rdma", func(t *testing.T) {
		env := testenv.StartWith(t, testenv.Options{MetricsListen: "127.0.0.1:0", RDMALoop: netip.MustParseAddrPort("127.0.33.21:4791")})
		a, b := env.Open(t, "r1", testenv.VMOptions{}), env.Open(t, "r2", testenv.VMOptions{})
		traffic(t, a, b, vrdma.PathRDMA, size, iters)
		mfs := scrape(t, env.Agent.MetricsAddr().String())
		atLeast(t, mfs, "vrdma_qp_work_requests_total", map[string]string{"path": "rdma", "opcode": "RDMA_WRITE"}, iters)
		atLeast(t, mfs, "vrdma_rdma_packets_total", map[string]string{"direction": "sent", "uplink": "127.0.33.21:4791"}, 2*iters)
		atLeast(t, mfs, "vrdma_rdma_bytes_total", map[string]string{"direction": "received"}, 2*iters*size)
		if v, ok := sum(mfs, "vrdma_rdma_dropped_total", map[string]string{"reason": "bad_icrc"}); !ok || v != 0 {
			t.Errorf("vrdma_rdma_dropped_total{reason=bad_icrc} = %v (present %v), want 0", v, ok)
		}
	})
	t.Run("tcp", func(t *testing.T) {
		c, ports := metricsCluster(t)
		a, b := c.Hosts[0].Open(t, "t1", testenv.VMOptions{MemMB: 8}), c.Hosts[1].Open(t, "t2", testenv.VMOptions{MemMB: 8})
		traffic(t, a, b, vrdma.PathTCP, size, iters)
		mfs := scrape(t, ports[c.Hosts[0].Name])
		atLeast(t, mfs, "vrdma_qp_work_requests_total", map[string]string{"path": "tcp", "opcode": "RDMA_WRITE", "vm": "t1"}, iters)
		atLeast(t, mfs, "vrdma_tcp_bytes_total", map[string]string{"direction": "sent", "peer_host": c.Hosts[1].Name}, 2*iters*size)
		atLeast(t, mfs, "vrdma_tcp_connections", nil, 1)
		atLeast(t, mfs, "vrdma_control_plane_up", nil, 1)
		atLeast(t, mfs, "vrdma_control_plane_lease_held", nil, 1)
		if _, ok := mfs["vrdma_control_plane_lease_age_seconds"]; !ok {
			t.Errorf("no vrdma_control_plane_lease_age_seconds")
		}
		// An agent in the control plane, holding its lease, is ready.
		if code, body := get(t, ports[c.Hosts[0].Name], "/readyz"); code != http.StatusOK {
			t.Errorf("/readyz of an agent holding its lease: %d %s", code, body)
		}
		mfs = scrape(t, ports[c.Hosts[1].Name])
		atLeast(t, mfs, "vrdma_qp_bytes_total", map[string]string{"path": "tcp", "queue": "recv", "vm": "t2"}, iters*size)
	})
}

// metricsCluster starts two vrdmad processes on loopback addresses,
// each serving its metrics on a port of its own: the ports by host name.
func metricsCluster(t *testing.T) (*testenv.Cluster, map[string]string) {
	t.Helper()
	ports := map[string]string{}
	c := testenv.StartCluster(t, testenv.ClusterOptions{Hosts: 2, Netns: testenv.NetnsOff, ExtraArgs: func(h *testenv.Host) []string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		ports[h.Name] = addr
		return []string{"--metrics-listen", addr}
	}})
	return c, ports
}

// get returns the status code and body of GET http://addr+path.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// names are the agent's metrics, every one of them, each with whether an
// agent without a control plane but with an RDMA uplink and traffic on it
// exports it too (the others need a control plane, peers on the tcp
// path, or a refused path: TestMetricsDecisions has those).
var names = []struct {
	name       string
	standalone bool
}{
	{"vrdma_build_info", true}, {"vrdma_host_info", true}, {"vrdma_adapter_info", true},
	{"vrdma_vms", true}, {"vrdma_queue_pairs", true}, {"vrdma_agent_sessions", true},
	{"vrdma_qp_work_requests_total", true}, {"vrdma_qp_bytes_total", true}, {"vrdma_qp_receives_total", true},
	{"vrdma_qp_completions_total", true}, {"vrdma_qp_transport_retries_total", true}, {"vrdma_qp_rnr_naks_total", true},
	{"vrdma_qp_requests_refused_total", true}, {"vrdma_qp_doorbells_total", true}, {"vrdma_qp_poll_seconds_total", true},
	{"vrdma_qp_in_flight", true},
	{"vrdma_adapter_work_requests_total", true}, {"vrdma_adapter_bytes_total", true}, {"vrdma_adapter_completions_total", true},
	{"vrdma_adapter_transport_retries_total", true}, {"vrdma_adapter_rnr_naks_total", true},
	{"vrdma_rdma_packets_total", true}, {"vrdma_rdma_bytes_total", true}, {"vrdma_rdma_batches_total", true},
	{"vrdma_rdma_retransmits_total", true}, {"vrdma_rdma_seq_err_naks_total", true}, {"vrdma_rdma_dropped_total", true},
	{"vrdma_datagrams_dropped_total", true},
	{"vrdma_path_decisions_total", true}, {"vrdma_path_refusals_total", false}, {"vrdma_cm_connects_total", true},
	{"vrdma_tcp_connects_total", false},
	{"vrdma_tcp_bytes_total", false}, {"vrdma_tcp_frames_total", false}, {"vrdma_tcp_connections", false},
	{"vrdma_tcp_dials_total", false}, {"vrdma_tcp_panics_total", false}, {"vrdma_tcp_handshake_panics_total", false},
	{"vrdma_tcp_accept_refused_total", false},
	{"vrdma_control_plane_up", false}, {"vrdma_control_plane_lease_held", false}, {"vrdma_control_plane_lease_age_seconds", false},
}

// TestMetricsNames checks the names the agent exports against the list
// above and docs/observability.md: a standalone agent with traffic on
// its RDMA uplink exports every name marked standalone and no name
// outside the list, the list is in the docs, and the label values of a
// direction are "sent" and "received". It then checks what
// --metrics-no-qp-series leaves out, and /healthz and /readyz.
func TestMetricsNames(t *testing.T) {
	doc, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, n := range names {
		listed[n.name] = true
		if !strings.Contains(string(doc), "`"+n.name+"`") {
			t.Errorf("%s is not in docs/observability.md", n.name)
		}
	}
	const size, iters = 4096, 50
	for i, noQP := range []bool{false, true} {
		uplink := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 33, byte(22 + i)}), 4791)
		env := testenv.StartWith(t, testenv.Options{MetricsListen: "127.0.0.1:0", MetricsNoQPSeries: noQP, RDMALoop: uplink})
		a, b := env.Open(t, "n1", testenv.VMOptions{}), env.Open(t, "n2", testenv.VMOptions{})
		traffic(t, a, b, vrdma.PathRDMA, size, iters)
		addr := env.Agent.MetricsAddr().String()
		mfs := scrape(t, addr)
		for name, mf := range mfs {
			if !strings.HasPrefix(name, "vrdma_") {
				continue
			}
			if !listed[name] {
				t.Errorf("%s is exported but not in the list (nor, then, in the docs)", name)
			}
			if noQP && strings.HasPrefix(name, "vrdma_qp_") {
				t.Errorf("%s is exported with --metrics-no-qp-series", name)
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "direction" && l.GetValue() != "sent" && l.GetValue() != "received" {
						t.Errorf("%s{direction=%q}: want sent or received", name, l.GetValue())
					}
				}
			}
		}
		for _, n := range names {
			if _, ok := mfs[n.name]; n.standalone && !ok && !(noQP && strings.HasPrefix(n.name, "vrdma_qp_")) {
				t.Errorf("no %s (no-qp-series %v)", n.name, noQP)
			}
		}
		// The adapters' counters hold what the QPs moved either way.
		atLeast(t, mfs, "vrdma_adapter_work_requests_total", map[string]string{"vm": "n1", "opcode": "RDMA_WRITE"}, iters)
		atLeast(t, mfs, "vrdma_queue_pairs", map[string]string{"path": "rdma"}, 2)
		atLeast(t, mfs, "vrdma_path_decisions_total", map[string]string{"object": "qp", "path": "rdma"}, 2)
		atLeast(t, mfs, "vrdma_build_info", map[string]string{"version": buildinfo.Read("vrdmad").Version}, 1)
		atLeast(t, mfs, "vrdma_host_info", map[string]string{"host_id": env.Agent.HostID()}, 1)
		atLeast(t, mfs, "vrdma_adapter_info", map[string]string{"vm": "n2", "adapter": "vrdma0", "mac": b.Adapters()[0].MAC().String()}, 1)
		for _, p := range []string{"/healthz", "/readyz"} {
			if code, body := get(t, addr, p); code != http.StatusOK || body != "ok\n" {
				t.Errorf("%s of a standalone agent: %d %q, want 200 ok", p, code, body)
			}
		}
	}
	// What /readyz answers for an agent whose control plane is not there.
	for _, h := range []metrics.Health{{ControlPlane: true}, {ControlPlane: true, ControlPlaneUp: true}} {
		if metrics.Ready(h) == nil {
			t.Errorf("Ready(%+v) = nil, want an error", h)
		}
	}
	if err := metrics.Ready(metrics.Health{ControlPlane: true, ControlPlaneUp: true, LeaseHeld: true}); err != nil {
		t.Errorf("Ready of an agent in sync and holding its lease: %v", err)
	}
}

// delta is how much the metrics of family name with labels want grew
// from before to after.
func delta(before, after map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	b, _ := sum(before, name, want)
	a, _ := sum(after, name, want)
	return a - b
}

// TestMetricsDecisions drives path decisions and connects through two
// agents of a cluster — a memcpy pair and a tcp pair connected through
// connection management, a connect to a port nothing listens on, one to
// an adapter of another VLAN, rdma_cm connects to a port nothing listens
// on and to a listener that never accepts, a QP and an address handle to
// the other VLAN, address handles on memcpy and tcp — and checks that the decision and connect
// counters moved by exactly that, with those labels: the paths chosen
// (vrdma_path_decisions_total), the refusals by the rule that refused
// (vrdma_path_refusals_total), connection management's dials and
// requests by result (vrdma_cm_connects_total), and the tcp path's
// connections by side (vrdma_tcp_connects_total).
func TestMetricsDecisions(t *testing.T) {
	c, ports := metricsCluster(t)
	h0, h1 := c.Hosts[0], c.Hosts[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := records.PortGroup{Name: "other-vlan", Key: "dvportgroup-20", Switch: c.Switch.Name, VLAN: 20,
		PFCPriority: 3, DSCP: 26, RoCEVersion: records.RoCEv2}
	if _, err := c.Store().Create(ctx, records.PortGroupKey(pg.Key), pg); err != nil {
		t.Fatal(err)
	}
	a := h0.Open(t, "dA", testenv.VMOptions{MemMB: 8})
	b := h0.Open(t, "dB", testenv.VMOptions{MemMB: 8})
	cv := h1.Open(t, "dC", testenv.VMOptions{MemMB: 8})
	d := h0.OpenVMX(t, "dD", testenv.VMXOn(testenv.VMOptions{MemMB: 8}, c.Switch.UUID, pg.Key)) // host 0, VLAN 20
	before0, before1 := scrape(t, ports[h0.Name]), scrape(t, ports[h1.Name])

	traffic(t, a, b, vrdma.PathMemcpy, 4096, 10) // a dial and a request on host 0, two QPs' decisions
	traffic(t, a, cv, vrdma.PathTCP, 4096, 10)   // a dial on host 0, a request on host 1, a QP's decision on each
	if err := testenv.NewQP(t, a.Adapters()[0]).Connect(ctx, "dB/vrdma0", 4999); err == nil {
		t.Fatal("a connect to a port nothing listens on succeeded")
	}
	if err := testenv.NewQP(t, a.Adapters()[0]).Connect(ctx, "dD/vrdma0", 4999); err == nil {
		t.Fatal("a connect to an adapter of another VLAN succeeded")
	}
	// rdma_cm's event channel: a connect to a port nothing listens on
	// (REJECTED), and one to a listener that never accepts (UNREACHABLE,
	// -ETIMEDOUT; its request abandoned). Each is counted before its event.
	ch, err := a.OpenEventChannel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close(context.Background())
	l, err := b.Adapters()[0].Listen(ctx, 5000)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	for _, x := range []struct {
		port   uint16
		want   vrdma.CMEventType
		status int
	}{{4999, vrdma.CMRejected, 0}, {5000, vrdma.CMUnreachable, -int(syscall.ETIMEDOUT)}} {
		if _, err := ch.Connect(ctx, testenv.NewQP(t, a.Adapters()[0]), "dB/vrdma0", x.port, nil, time.Second); err != nil {
			t.Fatal(err)
		}
		ev, err := ch.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != x.want || x.status != 0 && ev.Status != x.status {
			t.Fatalf("rdma_cm connect to port %d: %s status %d, want %s", x.port, ev.Type, ev.Status, x.want)
		}
	}
	dgid := d.Adapters()[0].GID()
	if err := testenv.NewQP(t, a.Adapters()[0]).ConnectTo(ctx, vrdma.Endpoint{GID: dgid, QPN: 0x100}); err == nil {
		t.Fatal("a QP moved to RTR facing an adapter of another VLAN")
	}
	pd, err := a.Adapters()[0].AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.CreateAH(ctx, vrdma.AHAttr{DGID: dgid}); err == nil {
		t.Fatal("an address handle to an adapter of another VLAN was made")
	}
	for _, to := range []*vrdma.VM{b, cv} {
		if _, err := pd.CreateAH(ctx, vrdma.AHAttr{DGID: to.Adapters()[0].GID()}); err != nil {
			t.Fatalf("an address handle to %s: %v", to.Name(), err)
		}
	}
	after0, after1 := scrape(t, ports[h0.Name]), scrape(t, ports[h1.Name])

	for _, w := range []struct {
		host          string
		before, after map[string]*dto.MetricFamily
		name          string
		labels        map[string]string
		want          float64
	}{
		{h0.Name, before0, after0, "vrdma_path_decisions_total", map[string]string{"object": "qp", "path": "memcpy"}, 2},
		{h0.Name, before0, after0, "vrdma_path_decisions_total", map[string]string{"object": "qp", "path": "tcp"}, 1},
		{h0.Name, before0, after0, "vrdma_path_decisions_total", map[string]string{"object": "ah", "path": "memcpy"}, 1},
		{h0.Name, before0, after0, "vrdma_path_decisions_total", map[string]string{"object": "ah", "path": "tcp"}, 1},
		{h0.Name, before0, after0, "vrdma_path_refusals_total", map[string]string{"object": "qp"}, 1},
		{h0.Name, before0, after0, "vrdma_path_refusals_total", map[string]string{"object": "qp", "reason": "vlan_isolation"}, 1},
		{h0.Name, before0, after0, "vrdma_path_refusals_total", map[string]string{"object": "ah", "reason": "vlan_isolation"}, 1},
		{h0.Name, before0, after0, "vrdma_path_refusals_total", map[string]string{"object": "connect", "reason": "vlan_isolation"}, 1},
		{h0.Name, before0, after0, "vrdma_path_refusals_total", nil, 3},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "dial", "result": "established"}, 2},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "dial", "result": "rejected"}, 2},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "dial", "result": "unreachable"}, 1},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "dial", "result": "timeout"}, 1},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "dial"}, 6},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "accept", "result": "accepted"}, 1},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "accept", "result": "no_listener"}, 2},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "accept", "result": "abandoned"}, 1},
		{h0.Name, before0, after0, "vrdma_cm_connects_total", map[string]string{"side": "accept"}, 4},
		{h1.Name, before1, after1, "vrdma_path_decisions_total", map[string]string{"object": "qp", "path": "tcp"}, 1},
		{h1.Name, before1, after1, "vrdma_path_decisions_total", nil, 1},
		{h1.Name, before1, after1, "vrdma_cm_connects_total", map[string]string{"side": "accept", "result": "accepted"}, 1},
		{h1.Name, before1, after1, "vrdma_cm_connects_total", map[string]string{"side": "dial"}, 0},
	} {
		if got := delta(w.before, w.after, w.name, w.labels); got != w.want {
			t.Errorf("host %s: %s%v grew by %v, want %v", w.host, w.name, w.labels, got, w.want)
		}
	}
	// The tcp path: host 0 dialed host 1 (its CM request went that way),
	// and host 1 accepted; nobody was refused.
	atLeast(t, after0, "vrdma_tcp_connects_total", map[string]string{"peer_host": h1.Name, "side": "dial", "result": "established"}, 1)
	atLeast(t, after1, "vrdma_tcp_connects_total", map[string]string{"peer_host": h0.Name, "side": "accept", "result": "established"}, 1)
	listed := map[string]bool{}
	for _, n := range names {
		listed[n.name] = true
	}
	for _, mfs := range []map[string]*dto.MetricFamily{after0, after1} {
		for name := range mfs {
			if strings.HasPrefix(name, "vrdma_") && !listed[name] {
				t.Errorf("%s is exported but not in the list", name)
			}
		}
		for _, r := range []string{"refused", "failed"} {
			if v, ok := sum(mfs, "vrdma_tcp_connects_total", map[string]string{"result": r}); !ok || v != 0 {
				t.Errorf("vrdma_tcp_connects_total{result=%s} = %v (present %v), want 0", r, v, ok)
			}
		}
	}
}
