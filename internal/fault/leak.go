// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Resources is what a process holds that a fault might leak: its open
// descriptors by kind, its mappings of vrdma's shared memory, and its
// goroutines when they can be counted. OS threads are not counted: the Go
// runtime never gives one back, so their number says nothing of a leak.
type Resources struct {
	// FDs counts open descriptors by what they name: "socket", "pipe",
	// "anon_inode:[eventfd]", a file's path ("/memfd:vrdma-guest-vm1
	// (deleted)").
	FDs map[string]int
	// Mappings counts the lines of /proc/PID/maps of vrdma's shared
	// memory (guest memory, rings): memfds named vrdma….
	Mappings int
	// Goroutines is the number of goroutines, -1 if unknown.
	Goroutines int
	// Stacks, if known, is the process's goroutine profile in pprof's
	// debug=1 text (each distinct stack once, with its count), kept with a
	// baseline so that a goroutine leak can be named by StackDiff. Snapshot
	// leaves it empty: taking it stops the world, too dear for Settle's
	// loop.
	Stacks string
}

// Snapshot returns the resources of process pid (0: this process);
// goroutines, if set, counts its goroutines (runtime.NumGoroutine for
// this process, an agent's go_goroutines gauge for an agent process).
func Snapshot(pid int, goroutines func() (int, error)) (Resources, error) {
	proc := "/proc/self"
	if pid != 0 {
		proc = "/proc/" + strconv.Itoa(pid)
	}
	r := Resources{FDs: map[string]int{}, Goroutines: -1}
	ents, err := os.ReadDir(proc + "/fd")
	if err != nil {
		return r, fmt.Errorf("fault: snapshot of %s: %w", proc, err)
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(proc, "fd", e.Name()))
		if err != nil {
			continue // closed meanwhile (the directory's own descriptor)
		}
		if i := strings.Index(target, ":["); i > 0 && !strings.HasPrefix(target, "anon_inode") {
			target = target[:i] // socket:[123], pipe:[456]: counted by kind
		}
		r.FDs[target]++
	}
	maps, err := os.ReadFile(proc + "/maps")
	if err != nil {
		return r, fmt.Errorf("fault: snapshot of %s: %w", proc, err)
	}
	r.Mappings = strings.Count(string(maps), "/memfd:vrdma")
	if goroutines != nil {
		if r.Goroutines, err = goroutines(); err != nil {
			return r, fmt.Errorf("fault: snapshot of %s: count goroutines: %w", proc, err)
		}
	}
	return r, nil
}

// Leaks describes what r holds beyond base, "" if nothing: every
// descriptor kind, mapping and goroutine counts exactly (a fault that has
// settled leaves nothing behind, so no tolerance is needed).
func (r Resources) Leaks(base Resources) string {
	var out []string
	for k, n := range r.FDs {
		if n > base.FDs[k] {
			out = append(out, fmt.Sprintf("%d more descriptors of %s (%d, was %d)", n-base.FDs[k], k, n, base.FDs[k]))
		}
	}
	if r.Mappings > base.Mappings {
		out = append(out, fmt.Sprintf("%d more mappings of vrdma shared memory (%d, was %d)", r.Mappings-base.Mappings, r.Mappings, base.Mappings))
	}
	if r.Goroutines >= 0 && base.Goroutines >= 0 && r.Goroutines > base.Goroutines {
		out = append(out, fmt.Sprintf("%d more goroutines (%d, was %d)", r.Goroutines-base.Goroutines, r.Goroutines, base.Goroutines))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// Settle takes snapshots with snap until one holds nothing beyond base
// (what a fault's victims held is released asynchronously: a dead VM's
// detach, a connection's close), and returns an error naming the leak if
// ctx ends first.
func Settle(ctx context.Context, who string, base Resources, snap func() (Resources, error)) error {
	for {
		r, err := snap()
		if err != nil {
			return err
		}
		l := r.Leaks(base)
		if l == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fault: %s leaked: %s", who, l)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// StackDiff names the goroutines that profile now (pprof's goroutine
// profile, debug=1 text) holds beyond profile base: each stack whose count
// grew, with how many more, most first; "" if none grew or a profile does
// not parse. A stack is compared by its functions and lines, not by its
// program counters' addresses (the "N @ 0x…" header), which are the same
// for one binary anyway.
func StackDiff(base, now string) string {
	b, n := stackCounts(base), stackCounts(now)
	type grown struct {
		stack string
		more  int
	}
	var out []grown
	for _, k := range slices.Sorted(maps.Keys(n)) {
		if d := n[k] - b[k]; d > 0 {
			out = append(out, grown{k, d})
		}
	}
	slices.SortStableFunc(out, func(x, y grown) int { return y.more - x.more })
	var sb strings.Builder
	for _, g := range out {
		fmt.Fprintf(&sb, "%d more goroutines at:\n%s\n", g.more, g.stack)
	}
	return sb.String()
}

// CountGoroutines returns how many goroutines profile (pprof's goroutine
// profile, debug=1 text) holds, leaving out those whose stack passes
// through one of the functions except (a monitor's own footprint, such as
// the HTTP server's goroutine serving the scrape that took the profile).
func CountGoroutines(profile string, except ...string) int {
	n := 0
	for stack, c := range stackCounts(profile) {
		if !slices.ContainsFunc(except, func(fn string) bool { return strings.Contains(stack, "\t"+fn+" ") }) {
			n += c
		}
	}
	return n
}

// stackCounts parses a goroutine profile in debug=1 text into its stacks
// (the "#" lines of each record, addresses dropped) and their counts.
func stackCounts(profile string) map[string]int {
	counts := map[string]int{}
	for _, rec := range strings.Split(profile, "\n\n") {
		lines := strings.Split(strings.TrimSpace(rec), "\n")
		if strings.HasPrefix(lines[0], "goroutine profile:") {
			lines = lines[1:] // the first record follows the header's line
		}
		if len(lines) == 0 {
			continue
		}
		nStr, _, ok := strings.Cut(lines[0], " @ ")
		n, err := strconv.Atoi(nStr)
		if !ok || err != nil {
			continue // not a record
		}
		var frames []string
		for _, l := range lines[1:] {
			l = strings.TrimSpace(l)
			if !strings.HasPrefix(l, "#") {
				continue
			}
			// "#\t0x4a1b2c\tpkg.fn+0x2c\t/path/file.go:12": keep the
			// function (without its offset) and the file:line.
			f := strings.Fields(l)
			if len(f) >= 4 {
				fn, _, _ := strings.Cut(f[2], "+0x")
				frames = append(frames, "\t"+fn+" "+f[3])
			}
		}
		if len(frames) > 0 {
			counts[strings.Join(frames, "\n")] += n
		}
	}
	return counts
}
