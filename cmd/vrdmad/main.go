// SPDX-License-Identifier: Apache-2.0

// Command vrdmad is the vrdma host agent: one per host, it is the device
// behind every vrdma adapter of the VMs whose workloads attach to it.
//
//	vrdmad --version
//	vrdmad --help
//	vrdmad [--config FILE] [--socket PATH] [--socket-group GROUP] [--state-dir DIR] [--host NAME] [--log-level LEVEL] [--log-format text|json]
//	       [--etcd-endpoints URLS [--etcd-cert F --etcd-key F] [--etcd-ca F] [--insecure-etcd] | --no-control-plane]
//	       [--switch NAME] [--pvrdma-address ADDR:PORT] [--firewall-pvrdma] [--rdma-uplink KIND/ADDR[/GID][@DEV]]...
//
// By default it runs the control plane's embedded etcd under
// STATE-DIR/etcd; see docs/control-plane.md. --config reads flags from a
// YAML file keyed by flag name; the command line wins (README.md,
// "Installing the agent as a service").
package main

import (
	"os"

	"github.com/vrdma/vrdma/internal/agentcmd"
)

func main() {
	os.Exit(agentcmd.Main("vrdmad", os.Args[1:], os.Stdout, os.Stderr))
}
