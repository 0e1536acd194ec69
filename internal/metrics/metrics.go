// SPDX-License-Identifier: Apache-2.0

// Package metrics serves an agent's counters and health as Prometheus
// metrics (vrdmad --metrics-listen): the counters of every QP
// (vrdma_qp_*, labelled by VM, adapter, QPN and path) and adapter
// (vrdma_adapter_*), those of the paths to other hosts (vrdma_tcp_*,
// vrdma_rdma_*), the agent's path decisions and connection management's
// connects (vrdma_path_*, vrdma_cm_*), what the agent is (build, host
// and adapter info), and
// its health — sessions, control plane, lease — beside the Go runtime's
// and the process's; and /healthz and /readyz. Every scrape reads the
// agent's status report, the same one "vrdmactl status" and "vrdmactl
// stat" print, so the three agree.
//
// Names: vrdma_ then the object (qp, adapter, tcp, rdma, control_plane,
// ...), then what is counted; counters end in _total, and a direction
// label is "sent" or "received". docs/observability.md lists them, and
// TestMetricsNames holds the list.
package metrics

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/buildinfo"
)

// Source is what the metrics come from: an agent.
type Source interface {
	// Status is the agent's status report, counters included.
	Status() mgmt.Status
	// Health is the agent's health.
	Health() Health
}

// Health is an agent's health beyond its status report.
type Health struct {
	Sessions     int  // workload sessions attached
	ControlPlane bool // the agent runs with a control plane
	// ControlPlaneUp: its cache is in sync with etcd.
	ControlPlaneUp bool
	// LeaseHeld: the host holds its lease; LeaseAge is for how long.
	LeaseHeld bool
	LeaseAge  time.Duration
}

// Options choose what Handler serves.
type Options struct {
	// NoQPSeries leaves out the per-QP series (vrdma_qp_*): with many
	// QPs they are most of the series. The adapters' counters, which
	// include their QPs', and vrdma_queue_pairs stay.
	NoQPSeries bool
}

// Handler serves src's metrics in the Prometheus exposition formats.
func Handler(src Source, o Options) http.Handler {
	r := prometheus.NewRegistry()
	bi := buildinfo.Read("vrdmad")
	build := prometheus.MustNewConstMetric(buildDesc, prometheus.GaugeValue, 1, bi.Version, bi.Revision, bi.GoVersion)
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collector{src, o, build})
	return promhttp.HandlerFor(r, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Ready says whether an agent in health h is ready for workloads: nil
// without a control plane, else when its cache is in sync with etcd and
// it holds its lease; otherwise why not.
func Ready(h Health) error {
	switch {
	case !h.ControlPlane:
		return nil
	case !h.ControlPlaneUp:
		return errors.New("the control plane's cache is not in sync with etcd")
	case !h.LeaseHeld:
		return errors.New("the host holds no lease in the control plane")
	}
	return nil
}

// HealthHandlers returns /healthz and /readyz of src: /healthz answers
// 200 while the agent serves; /readyz 200 when Ready, else 503 with the
// reason.
func HealthHandlers(src Source) (healthz, readyz http.Handler) {
	healthz = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	readyz = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err := Ready(src.Health()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	return healthz, readyz
}

var (
	qpLabels = []string{"vm", "adapter", "qpn", "path"}

	vmsDesc         = desc("vms", "VMs the agent knows, by state (attached to a workload, or only defined).", "state")
	qpsDesc         = desc("queue_pairs", "QPs, by VM, adapter, path and state.", "vm", "adapter", "path", "state")
	workDesc        = desc("qp_work_requests_total", "Send-queue work requests completed successfully, by opcode.", append(qpLabels, "opcode")...)
	bytesDesc       = desc("qp_bytes_total", "Bytes moved by the work requests completed successfully: the send queue's (sent, written or read) and the receive queue's.", append(qpLabels, "queue")...)
	recvsDesc       = desc("qp_receives_total", "Receives completed successfully.", qpLabels...)
	completionsDesc = desc("qp_completions_total", "Completions of both queues, by status (flushes and errors included).", append(qpLabels, "status")...)
	retriesDesc     = desc("qp_transport_retries_total", "Requests sent again after a timeout, a sequence error or no answer.", qpLabels...)
	rnrDesc         = desc("qp_rnr_naks_total", "RNR NAKs, received by the requester and sent by the responder.", append(qpLabels, "direction")...)
	refusedDesc     = desc("qp_requests_refused_total", "Requests the responder did not execute: dropped (not connected, wrong state), duplicate (executed already, answered again), out of sequence.", append(qpLabels, "reason")...)
	doorbellsDesc   = desc("qp_doorbells_total", "Times the QP's send queue slept until its doorbell rang (doorbell mode).", qpLabels...)
	pollDesc        = desc("qp_poll_seconds_total", "Time the QP's send queue polled for work before sleeping (doorbell mode).", qpLabels...)
	adWorkDesc      = desc("adapter_work_requests_total", "An adapter's send-queue work requests completed successfully, by opcode (its QPs', destroyed ones included).", "vm", "adapter", "opcode")
	adBytesDesc     = desc("adapter_bytes_total", "The bytes an adapter's work requests moved, by queue.", "vm", "adapter", "queue")
	adCompDesc      = desc("adapter_completions_total", "An adapter's completions, by status.", "vm", "adapter", "status")
	adRetriesDesc   = desc("adapter_transport_retries_total", "An adapter's requests sent again.", "vm", "adapter")
	adRNRDesc       = desc("adapter_rnr_naks_total", "An adapter's RNR NAKs, received and sent.", "vm", "adapter", "direction")
	inFlightDesc    = desc("qp_in_flight", "Work requests the QP's path has taken from the send queue and not completed.", qpLabels...)

	upBytesDesc  = desc("tcp_bytes_total", "Bytes of the tcp path with a peer host.", "peer_host", "direction")
	upFramesDesc = desc("tcp_frames_total", "Frames of the tcp path with a peer host.", "peer_host", "direction")
	upConnsDesc  = desc("tcp_connections", "Open tcp path connections with a peer host, both directions.", "peer_host")
	upDialsDesc  = desc("tcp_dials_total", "Connections opened to a peer host.", "peer_host")
	upPanicsDesc = desc("tcp_panics_total", "Connections with a peer host closed because a goroutine serving them panicked (a bug reached by the peer's input; the agent went on).", "peer_host")
	hsPanicsDesc = desc("tcp_handshake_panics_total", "Accepted connections closed because their handshake panicked (a bug; the agent went on).")

	acceptRefusedDesc = desc("tcp_accept_refused_total", "Connections from other hosts reset at accept: reason non_member (the source is no PVRDMA address of a host of the switch), source_slots (the source held its 4 handshake slots) or slots (the agent's 64 were taken).", "reason")

	rdmaPacketsDesc = desc("rdma_packets_total", "Packets of an RDMA uplink's RoCE engine.", "uplink", "roce", "direction")
	rdmaBytesDesc   = desc("rdma_bytes_total", "UDP payload bytes of an RDMA uplink's RoCE engine.", "uplink", "roce", "direction")
	rdmaBatchesDesc = desc("rdma_batches_total", "System calls that carried several packets (UDP GSO out, GRO in).", "uplink", "roce", "direction")
	rdmaRetxDesc    = desc("rdma_retransmits_total", "Packets sent again (go-back-N).", "uplink", "roce")
	rdmaSeqNakDesc  = desc("rdma_seq_err_naks_total", "PSN sequence error NAKs received.", "uplink", "roce")
	rdmaDropDesc    = desc("rdma_dropped_total", "Packets dropped on receipt, by reason.", "uplink", "roce", "reason")
	udDropDesc      = desc("datagrams_dropped_total", "UD datagrams dropped at their destination on this host, on every path.")

	decisionsDesc   = desc("path_decisions_total", "Paths the agent chose: for a QP moving to RTR (object qp) or an address handle (ah).", "object", "path")
	refusalsDesc    = desc("path_refusals_total", "Path decisions that chose no path, by the rule or cause that refused (vlan_isolation, address_unique, no_control_plane, ...): for a QP, an address handle, or a connect's target (object connect).", "object", "reason")
	cmConnectsDesc  = desc("cm_connects_total", "Connection management's connects: side dial (this host's workloads dialed; result established, rejected, unreachable, timeout, error) and accept (requests to this host's listeners; result accepted, rejected, no_listener, abandoned, failed).", "side", "result")
	tcpConnectsDesc = desc("tcp_connects_total", "Connections of the tcp path with a peer host: side dial (result established, refused by either host's rule, failed) and accept (established, refused).", "peer_host", "side", "result")

	buildDesc       = desc("build_info", "1, labelled with the agent's version (from git's tags: vrdmad --version), commit and Go version.", "version", "revision", "goversion")
	hostDesc        = desc("host_info", "1, labelled with the host's name, ID and PVRDMA address (empty without a control plane).", "host", "host_id", "pvrdma_address")
	adapterInfoDesc = desc("adapter_info", "1 for each adapter of each VM the agent knows, labelled with its MAC, GID and addresses.", "vm", "adapter", "mac", "gid", "ipv4", "ipv6")

	sessionsDesc = desc("agent_sessions", "Workload sessions attached to the agent.")
	cpDesc       = desc("control_plane_up", "1 when the agent's control-plane cache is in sync with etcd, 0 when not; absent without a control plane.")
	leaseDesc    = desc("control_plane_lease_held", "1 while the host holds its lease in the control plane.")
	leaseAgeDesc = desc("control_plane_lease_age_seconds", "How long the host has held its current lease.")
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("vrdma_"+name, help, labels, nil)
}

// collector turns a status report into metrics at every scrape. It
// describes nothing up front (an unchecked collector): which label
// values exist is the report's.
type collector struct {
	src   Source
	o     Options
	build prometheus.Metric // vrdma_build_info
}

func (collector) Describe(chan<- *prometheus.Desc) {}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Status()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ch <- c.build
	pv := ""
	if st.PVRDMA != nil {
		pv = st.PVRDMA.Address
	}
	gauge(hostDesc, 1, st.Host, st.HostID, pv)
	attached, defined := 0, 0
	type qpKey struct{ vm, adapter, path, state string }
	qps := map[qpKey]int{}
	for _, v := range st.VMs {
		if v.Attached {
			attached++
		} else {
			defined++
		}
		for _, q := range v.QPs {
			path := string(q.Path.Path)
			qps[qpKey{v.Name, q.Adapter, path, q.State}]++
			if c.o.NoQPSeries {
				continue
			}
			l := []string{v.Name, q.Adapter, "0x" + strconv.FormatUint(uint64(q.QPN), 16), path}
			k := q.Counters
			for op, n := range k.Ops {
				counter(workDesc, n, append(l, op)...)
			}
			counter(bytesDesc, k.SendBytes, append(l, "send")...)
			counter(bytesDesc, k.RecvBytes, append(l, "recv")...)
			counter(recvsDesc, k.Recvs, l...)
			for s, n := range k.Completions {
				counter(completionsDesc, n, append(l, s)...)
			}
			counter(retriesDesc, k.TransportRetries, l...)
			counter(rnrDesc, k.RNRNaksReceived, append(l, "received")...)
			counter(rnrDesc, k.RNRNaksSent, append(l, "sent")...)
			counter(refusedDesc, k.RequestsDropped, append(l, "dropped")...)
			counter(refusedDesc, k.DuplicateRequest, append(l, "duplicate")...)
			counter(refusedDesc, k.OutOfSeqRequest, append(l, "out_of_sequence")...)
			counter(doorbellsDesc, k.Doorbells, l...)
			ch <- prometheus.MustNewConstMetric(pollDesc, prometheus.CounterValue, float64(k.PollNanos)/1e9, l...)
			gauge(inFlightDesc, float64(q.InFlight), l...)
		}
	}
	for _, v := range st.VMs {
		for _, a := range v.Adapters {
			gauge(adapterInfoDesc, 1, v.Name, a.Name, a.MAC, a.GID.String(), a.IPv4, a.IPv6)
		}
		for _, a := range v.AdapterCounters {
			k := a.Counters
			for op, n := range k.Ops {
				counter(adWorkDesc, n, v.Name, a.Adapter, op)
			}
			counter(adBytesDesc, k.SendBytes, v.Name, a.Adapter, "send")
			counter(adBytesDesc, k.RecvBytes, v.Name, a.Adapter, "recv")
			for s, n := range k.Completions {
				counter(adCompDesc, n, v.Name, a.Adapter, s)
			}
			counter(adRetriesDesc, k.TransportRetries, v.Name, a.Adapter)
			counter(adRNRDesc, k.RNRNaksReceived, v.Name, a.Adapter, "received")
			counter(adRNRDesc, k.RNRNaksSent, v.Name, a.Adapter, "sent")
		}
	}
	counter(udDropDesc, st.DatagramsDropped)
	for _, d := range st.PathDecisions {
		if d.Path != "" {
			counter(decisionsDesc, d.Count, d.Object, d.Path)
		} else {
			counter(refusalsDesc, d.Count, d.Object, d.Reason)
		}
	}
	for _, c := range st.Connects {
		counter(cmConnectsDesc, c.Count, c.Side, c.Result)
	}
	gauge(vmsDesc, float64(attached), "attached")
	gauge(vmsDesc, float64(defined), "defined")
	for k, n := range qps {
		gauge(qpsDesc, float64(n), k.vm, k.adapter, k.path, k.state)
	}
	for _, u := range st.Uplinks {
		peer := u.PeerHost
		if peer == "" {
			peer = u.PeerHostID
		}
		counter(upBytesDesc, u.BytesOut, peer, "sent")
		counter(upBytesDesc, u.BytesIn, peer, "received")
		counter(upFramesDesc, u.FramesOut, peer, "sent")
		counter(upFramesDesc, u.FramesIn, peer, "received")
		gauge(upConnsDesc, float64(u.Conns), peer)
		counter(upDialsDesc, u.Dials, peer)
		counter(tcpConnectsDesc, u.DialsEstablished, peer, "dial", "established")
		counter(tcpConnectsDesc, u.DialsRefused, peer, "dial", "refused")
		counter(tcpConnectsDesc, u.DialsFailed, peer, "dial", "failed")
		counter(tcpConnectsDesc, u.Accepted, peer, "accept", "established")
		counter(tcpConnectsDesc, u.AcceptsRefused, peer, "accept", "refused")
		counter(upPanicsDesc, u.Panics, peer)
	}
	for _, r := range st.RDMA {
		u, v := r.Address, r.RoCE
		counter(rdmaPacketsDesc, r.PacketsOut, u, v, "sent")
		counter(rdmaPacketsDesc, r.PacketsIn, u, v, "received")
		counter(rdmaBytesDesc, r.BytesOut, u, v, "sent")
		counter(rdmaBytesDesc, r.BytesIn, u, v, "received")
		counter(rdmaBatchesDesc, r.BatchesOut, u, v, "sent")
		counter(rdmaBatchesDesc, r.BatchesIn, u, v, "received")
		counter(rdmaRetxDesc, r.Retransmits, u, v)
		counter(rdmaSeqNakDesc, r.SeqErrNaks, u, v)
		counter(rdmaDropDesc, r.BadICRC, u, v, "bad_icrc")
		counter(rdmaDropDesc, r.Malformed, u, v, "malformed")
		counter(rdmaDropDesc, r.NoQP, u, v, "no_qp")
		counter(rdmaDropDesc, r.Panics, u, v, "panic")
	}
	if p := st.PVRDMA; p != nil {
		counter(hsPanicsDesc, p.HandshakePanics)
		counter(acceptRefusedDesc, p.AcceptRefused, "non_member")
		counter(acceptRefusedDesc, p.SourceSlotsFull, "source_slots")
		counter(acceptRefusedDesc, p.HandshakeSlotsFull, "slots")
	}
	h := c.src.Health()
	gauge(sessionsDesc, float64(h.Sessions))
	if h.ControlPlane {
		gauge(cpDesc, b2f(h.ControlPlaneUp))
		gauge(leaseDesc, b2f(h.LeaseHeld))
		if h.LeaseHeld {
			gauge(leaseAgeDesc, h.LeaseAge.Seconds())
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
