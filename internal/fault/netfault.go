// SPDX-License-Identifier: Apache-2.0

package fault

// Faults on real links between network namespaces. The kernel's netem
// queueing discipline is the usual tool, but it is a module (sch_netem)
// that kernels do not always carry; nftables' netdev family is in every
// kernel that has nf_tables, and gives loss (numgen random … drop) and
// duplication (… dup to DEVICE) on the ingress of a device. Reordering and
// delay need a queue, which nftables has not: Relay (relay.go) injects
// those between namespaces, and on the in-process paths package testlink
// and rdmatest do.

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Wire is how often a frame is lost or duplicated, as probabilities in
// [0, 1].
type Wire struct {
	Loss float64
	Dup  float64
}

// String names the faults: "loss 1%, dup 0%".
func (w Wire) String() string {
	return fmt.Sprintf("loss %g%%, dup %g%%", 100*w.Loss, 100*w.Dup)
}

// nftTable is the nftables table the faults live in, in the namespace
// given (a test's own).
const nftTable = "vrdma_fault"

// nftScale is the resolution of the probabilities: numgen draws in
// [0, nftScale).
const nftScale = 1_000_000

// NetFaults are faults on the ports of a switch: an nftables table in the
// switch's network namespace.
type NetFaults struct {
	netns string
	w     Wire
}

// ApplyWire puts w on every frame that enters the switch in namespace
// netns through one of ports (the switch's ends of its hosts' veths): it
// is lost with probability w.Loss, or else duplicated with probability
// w.Dup, the copy sent straight out of the other port (duplication needs
// exactly two ports). Each rule counts what it did (Hits).
func ApplyWire(ctx context.Context, netns string, ports []string, w Wire) (*NetFaults, error) {
	if w.Loss < 0 || w.Loss > 1 || w.Dup < 0 || w.Dup > 1 {
		return nil, fmt.Errorf("fault: wire faults %s: each must be in [0, 1]", w)
	}
	if w.Dup > 0 && len(ports) != 2 {
		return nil, fmt.Errorf("fault: duplication needs exactly two ports, got %v", ports)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s {\n", nftTable)
	for i, p := range ports {
		fmt.Fprintf(&b, "  chain in%d {\n    type filter hook ingress device %q priority 0; policy accept;\n", i, p)
		if w.Loss > 0 {
			fmt.Fprintf(&b, "    numgen random mod %d < %d counter drop\n", nftScale, int(w.Loss*nftScale))
		}
		if w.Dup > 0 {
			fmt.Fprintf(&b, "    numgen random mod %d < %d counter dup to %q\n", nftScale, int(w.Dup*nftScale), ports[1-i])
		}
		b.WriteString("  }\n")
	}
	b.WriteString("}\n")
	if _, err := nft(ctx, netns, b.String(), "-f", "-"); err != nil {
		return nil, fmt.Errorf("fault: apply %s on %v: %w", w, ports, err)
	}
	return &NetFaults{netns: netns, w: w}, nil
}

// Hits returns how many frames the faults dropped and duplicated so far.
func (n *NetFaults) Hits(ctx context.Context) (dropped, duplicated uint64, err error) {
	return hits(ctx, n.netns, nftTable)
}

// hits reads the counters of the drop and dup rules of nftables table
// (netdev family) in namespace netns ("" for this one).
func hits(ctx context.Context, netns, table string) (dropped, duplicated uint64, err error) {
	out, err := nft(ctx, netns, "", "list", "table", "netdev", table)
	if err != nil {
		return 0, 0, fmt.Errorf("fault: read the faults' counters: %w", err)
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		for i := 0; i+1 < len(f); i++ {
			if f[i] != "packets" {
				continue
			}
			k, _ := strconv.ParseUint(f[i+1], 10, 64)
			switch {
			case strings.HasSuffix(strings.TrimSpace(l), "drop"):
				dropped += k
			case strings.Contains(l, " dup to "):
				duplicated += k
			}
		}
	}
	return dropped, duplicated, nil
}

// Struck returns how many frames the faults dropped or duplicated so far,
// and says what they did.
func (n *NetFaults) Struck(ctx context.Context) (uint64, string, error) {
	d, u, err := n.Hits(ctx)
	return d + u, fmt.Sprintf("%s: %d frames dropped, %d duplicated", n.w, d, u), err
}

// Remove deletes the faults.
func (n *NetFaults) Remove(ctx context.Context) error {
	if _, err := nft(ctx, n.netns, "", "delete", "table", "netdev", nftTable); err != nil {
		return fmt.Errorf("fault: remove the wire faults: %w", err)
	}
	return nil
}

// nft runs nft with args in namespace netns ("" for this process's),
// stdin as its input, and returns its output; the error carries it.
func nft(ctx context.Context, netns, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "nft", args...)
	where := ""
	if netns != "" {
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns, "nft"}, args...)...)
		where = " in namespace " + netns
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("nft %s%s: %v: %s", strings.Join(args, " "), where, err, bytes.TrimSpace(out.Bytes()))
	}
	return out.String(), nil
}

// SetLink sets interface dev in namespace netns up or down (ip link set):
// down cuts the host behind it off, as a pulled cable does.
func SetLink(ctx context.Context, netns, dev string, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	out, err := exec.CommandContext(ctx, "ip", "-n", netns, "link", "set", dev, state).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fault: ip -n %s link set %s %s: %v: %s", netns, dev, state, err, bytes.TrimSpace(out))
	}
	return nil
}
