// SPDX-License-Identifier: Apache-2.0

package fault

// Wire faults between two addresses of the loopback interface, for
// processes that are hosts on 127.0.0.x addresses of one namespace (the
// soak command's): an nftables table in the netdev family on lo's
// ingress, whose rules match the two addresses only, so that nothing else
// on the machine's loopback is touched.

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
)

// loTable is the nftables table of the loopback faults.
const loTable = "vrdma_fault_lo"

// LoopbackFaults are wire faults on lo between two addresses.
type LoopbackFaults struct{ w Wire }

// ApplyLoopback puts w on every packet between a and b (both ways) as it
// enters lo: lost with probability w.Loss, or else duplicated with
// probability w.Dup (the copy sent out on lo again). It needs root and
// nftables; one table at a time.
func ApplyLoopback(ctx context.Context, a, b netip.Addr, w Wire) (*LoopbackFaults, error) {
	if w.Loss < 0 || w.Loss > 1 || w.Dup < 0 || w.Dup > 1 {
		return nil, fmt.Errorf("fault: wire faults %s: each must be in [0, 1]", w)
	}
	if !a.Is4() || !b.Is4() || !a.IsLoopback() || !b.IsLoopback() {
		return nil, fmt.Errorf("fault: loopback faults between %s and %s: both must be IPv4 loopback addresses", a, b)
	}
	var r strings.Builder
	fmt.Fprintf(&r, "table netdev %s {\n  chain in {\n    type filter hook ingress device \"lo\" priority 0; policy accept;\n", loTable)
	for _, d := range [][2]netip.Addr{{a, b}, {b, a}} {
		if w.Loss > 0 {
			fmt.Fprintf(&r, "    ip saddr %s ip daddr %s numgen random mod %d < %d counter drop\n", d[0], d[1], nftScale, int(w.Loss*nftScale))
		}
		if w.Dup > 0 {
			fmt.Fprintf(&r, "    ip saddr %s ip daddr %s numgen random mod %d < %d counter dup to \"lo\"\n", d[0], d[1], nftScale, int(w.Dup*nftScale))
		}
	}
	r.WriteString("  }\n}\n")
	if _, err := nft(ctx, "", r.String(), "-f", "-"); err != nil {
		return nil, fmt.Errorf("fault: apply %s between %s and %s: %w", w, a, b, err)
	}
	return &LoopbackFaults{w: w}, nil
}

// Struck returns how many packets the faults dropped or duplicated so
// far, and says what they did.
func (l *LoopbackFaults) Struck(ctx context.Context) (uint64, string, error) {
	d, u, err := hits(ctx, "", loTable)
	return d + u, fmt.Sprintf("%s: %d packets dropped, %d duplicated", l.w, d, u), err
}

// Remove deletes the faults.
func (*LoopbackFaults) Remove(ctx context.Context) error {
	if _, err := nft(ctx, "", "", "delete", "table", "netdev", loTable); err != nil {
		return fmt.Errorf("fault: remove the loopback faults: %w", err)
	}
	return nil
}
