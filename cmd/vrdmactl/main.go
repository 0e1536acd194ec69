// SPDX-License-Identifier: Apache-2.0

// Command vrdmactl manages and measures vrdma: the host agent, its VMs and
// their RDMA adapters. Start with "vrdmactl quickstart".
package main

import (
	"os"

	"github.com/vrdma/vrdma/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
