// Command vrdmad is the vrdma host agent: one per host, it is the device
// behind every vrdma adapter of the VMs whose workloads attach to it.
//
//	vrdmad [--socket PATH] [--state-dir DIR] [--host NAME] [--log-level LEVEL]
package main

import (
	"os"

	"github.com/vrdma/vrdma/internal/agentcmd"
)

func main() {
	os.Exit(agentcmd.Main("vrdmad", os.Args[1:], os.Stderr))
}
