// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vrdma/vrdma/internal/agent"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/hostlink"
	"github.com/vrdma/vrdma/internal/tcpwire"
)

// controlFlags are the agent's control-plane flags.
type controlFlags struct {
	none      bool
	endpoints string
	cert, key string
	ca        string
	insecure  bool // --insecure-etcd
	// warning, if set, is logged once the logger runs: plaintext etcd
	// accepted by --insecure-etcd
	warning  string
	dataDir  string
	address  string
	firewall bool
	sw       string
	uplinks  []records.Uplink
	lossless int // --rdma-uplink-lossless: -1 unset
	nicPoll  time.Duration
	// --max-handshakes, --max-handshakes-per-source
	handshakes, handshakesPerSource int
	// --tcp-lanes, --tcp-stripe-min
	lanes     int
	stripeMin uint64
}

func addControlFlags(fs *pflag.FlagSet) *controlFlags {
	c := &controlFlags{lossless: -1}
	fs.BoolVar(&c.none, "no-control-plane", false, "run standalone: no etcd, same-host peers only")
	fs.StringVar(&c.endpoints, "etcd-endpoints", "", "comma-separated endpoints of an external etcd cluster (default: an embedded etcd under the state directory)")
	fs.StringVar(&c.cert, "etcd-cert", "", "client certificate for etcd (PEM)")
	fs.StringVar(&c.key, "etcd-key", "", "client key for etcd (PEM)")
	fs.StringVar(&c.ca, "etcd-ca", "", "CA that signed etcd's certificates (PEM)")
	fs.BoolVar(&c.insecure, "insecure-etcd", false, "accept an --etcd-endpoints reached over plaintext TCP (http://, or host:port without the TLS flags): anyone on that network can read and write the control plane, the switch secrets included")
	fs.StringVar(&c.dataDir, "etcd-data-dir", "", "data directory of the embedded etcd (default STATE-DIR/etcd)")
	fs.StringVar(&c.address, "pvrdma-address", "", "ADDRESS:PORT that carries PVRDMA traffic between hosts (Net.PVRDMAVmknic)")
	fs.BoolVar(&c.firewall, "firewall-pvrdma", false, "the host's pvrdma firewall ruleset is enabled (needed for traffic with other hosts)")
	fs.StringVar(&c.sw, "switch", "", "the distributed switch this host is on")
	fs.Func("rdma-uplink", "an RDMA uplink on the switch, KIND/ADDRESS[/GID][@DEVICE], KIND rocev2-soft (the agent's RoCE engine: RoCE v2 on ADDRESS, UDP 4791, and, as root, RoCE v1 frames on the Ethernet interface holding ADDRESS or DEVICE: the rdma path) or hca (recorded only)", func(s string) error {
		u, err := agent.ParseUplink(s)
		if err != nil {
			return err
		}
		c.uplinks = append(c.uplinks, u)
		return nil
	})
	fs.DurationVar(&c.nicPoll, "nic-poll", 0, "how often to read the RDMA uplinks' NIC state (PFC, pause, DCB trust, MTU, teaming) from the kernel and publish it in the host record when it changed (default 30s; negative: only at start)")
	fs.IntVar(&c.handshakes, "max-handshakes", hostlink.DefaultHandshakes, "connections from other hosts in their handshake at once; more are reset at accept")
	fs.IntVar(&c.handshakesPerSource, "max-handshakes-per-source", hostlink.DefaultHandshakesPerSource, "connections from one source address in their handshake at once, so that no host (or non-member) keeps the others out")
	fs.IntVar(&c.lanes, "tcp-lanes", 0, "connections this host carries its requests to another host on over the tcp path, the first included, large messages striped over them (1..8; 0: one per two cores, at most 4, so none on two cores; a peer that takes fewer gets fewer)")
	fs.Uint64Var(&c.stripeMin, "tcp-stripe-min", hostlink.DefaultStripeMin, "the least stripe of a message striped over the tcp path's lanes, in bytes (512 or more): messages under twice that stay on one connection")
	fs.IntVar(&c.lossless, "rdma-uplink-lossless", -1, "declare the RDMA uplinks lossless for this 802.1Q priority (PFC on it, no pause, not teamed), for NICs whose kernel reports no DCB state (loopback, veth): what vrdmactl host uplink declare would record")
	return c
}

// config returns the agent's ControlConfig, nil for --no-control-plane.
func (c *controlFlags) config() (*agent.ControlConfig, error) {
	if c.none {
		if c.endpoints != "" || c.address != "" || c.sw != "" || len(c.uplinks) > 0 {
			return nil, errors.New("--no-control-plane excludes --etcd-endpoints, --pvrdma-address, --switch and --rdma-uplink")
		}
		return nil, nil
	}
	if c.lossless >= 0 {
		if c.lossless > records.MaxPFCPriority || len(c.uplinks) == 0 {
			return nil, fmt.Errorf("--rdma-uplink-lossless %d: want a priority 0..%d, and --rdma-uplink", c.lossless, records.MaxPFCPriority)
		}
		pfc, teamed := records.PrioritiesOf(c.lossless), false
		for i := range c.uplinks {
			c.uplinks[i].Declared = records.NICState{PFC: &pfc, Pause: &records.Pause{}, Teamed: &teamed}
		}
	}
	cfg := &agent.ControlConfig{DataDir: c.dataDir, FirewallPVRDMA: c.firewall, Switch: c.sw, Uplinks: c.uplinks, NICPoll: c.nicPoll}
	if c.handshakes < 1 || c.handshakesPerSource < 1 || c.handshakesPerSource > c.handshakes {
		return nil, fmt.Errorf("--max-handshakes %d, --max-handshakes-per-source %d: want at least 1 each, and no more per source than in all", c.handshakes, c.handshakesPerSource)
	}
	cfg.Handshakes, cfg.HandshakesPerSource = c.handshakes, c.handshakesPerSource
	if c.lanes < 0 || c.lanes > tcpwire.MaxLanes || c.stripeMin < tcpwire.MinStripe {
		return nil, fmt.Errorf("--tcp-lanes %d, --tcp-stripe-min %d: want 0..%d lanes and a stripe of %d bytes or more", c.lanes, c.stripeMin, tcpwire.MaxLanes, tcpwire.MinStripe)
	}
	cfg.Lanes, cfg.StripeMin = c.lanes, c.stripeMin
	for _, e := range strings.Split(c.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.Endpoints = append(cfg.Endpoints, e)
		}
	}
	cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.CAFile = c.cert, c.key, c.ca
	if (c.cert == "") != (c.key == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	if len(cfg.Endpoints) == 0 && (c.cert != "" || c.ca != "") {
		return nil, errors.New("--etcd-cert, --etcd-key and --etcd-ca need --etcd-endpoints (the embedded etcd listens on a private Unix socket)")
	}
	if err := store.CheckPlaintext(cfg.Endpoints, cfg.TLS, "--etcd-cert/--etcd-key/--etcd-ca", "--insecure-etcd"); err != nil {
		if !c.insecure {
			return nil, err
		}
		c.warning = strings.Replace(err.Error(), "; give", " (accepted by --insecure-etcd); you could give", 1)
	}
	if c.address != "" {
		ap, err := netip.ParseAddrPort(c.address)
		if err != nil {
			return nil, fmt.Errorf("--pvrdma-address %q: want ADDRESS:PORT: %v", c.address, err)
		}
		cfg.PVRDMAAddress = ap
	}
	if c.sw != "" {
		if err := records.CheckName(c.sw); err != nil {
			return nil, fmt.Errorf("--switch: %v", err)
		}
	}
	if len(c.uplinks) > 0 && c.sw == "" {
		return nil, errors.New("--rdma-uplink needs --switch: an uplink belongs to the host's switch")
	}
	return cfg, nil
}
