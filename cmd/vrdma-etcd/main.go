// SPDX-License-Identifier: Apache-2.0

// Command vrdma-etcd is etcd's own server, at the version vrdmad embeds
// (go.etcd.io/etcd/server/v3 in go.mod), with etcd's flags and behaviour
// (vrdma-etcd --help): a member of a control-plane cluster where the
// distribution's etcd is older (Debian 12 ships 3.4). README.md, "Two hosts
// from nothing", runs a three-member cluster of it, or of Debian's
// etcd-server, with TLS client certificates.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
