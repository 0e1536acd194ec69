// SPDX-License-Identifier: Apache-2.0

// Command dropin-hash prints the digest of the drop-in libraries' sources
// embedded in this checkout (guest.SourceHash). packaging/build-deb writes
// it beside the libraries it installs, so that vrdmactl uses an installed
// copy only when it was built from the same sources as vrdmactl itself.
package main

import (
	"fmt"

	"github.com/vrdma/vrdma/guest"
)

func main() { fmt.Println(guest.SourceHash()) }
