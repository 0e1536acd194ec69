// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// procCPU returns the CPU time the processes have used so far, summed
// over all their threads: the first field of each thread's
// /proc/PID/task/TID/schedstat (nanoseconds on a CPU, exact where
// /proc/PID/stat counts clock ticks).
func procCPU(pids ...int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		if err != nil || len(tasks) == 0 {
			return 0, fmt.Errorf("CPU time of process %d: no /proc/%d/task/*/schedstat (has it exited?)", pid, pid)
		}
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue // a thread that exited since the glob
			}
			f := bytes.Fields(b)
			if len(f) == 0 {
				return 0, fmt.Errorf("CPU time of process %d: %s is empty", pid, t)
			}
			ns, err := strconv.ParseInt(string(f[0]), 10, 64)
			if err != nil || ns < 0 {
				return 0, fmt.Errorf("CPU time of process %d: %s: %q is not a count of nanoseconds", pid, t, f[0])
			}
			total += time.Duration(ns)
		}
	}
	return total, nil
}

// procRSS returns the resident memory of the processes in KiB (VmRSS of
// /proc/PID/status, shared pages included: the rings an agent shares
// with its workloads are memory it holds).
func procRSS(pids ...int) (uint64, error) {
	var total uint64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			return 0, fmt.Errorf("memory of process %d: %w", pid, err)
		}
		found := false
		for line := range bytes.Lines(b) {
			rest, ok := bytes.CutPrefix(line, []byte("VmRSS:"))
			if !ok {
				continue
			}
			f := bytes.Fields(rest)
			if len(f) != 2 || string(f[1]) != "kB" {
				return 0, fmt.Errorf("memory of process %d: VmRSS line %q is not \"N kB\"", pid, bytes.TrimSpace(line))
			}
			kib, err := strconv.ParseUint(string(f[0]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("memory of process %d: VmRSS %q: %w", pid, f[0], err)
			}
			total += kib
			found = true
			break
		}
		if !found {
			return 0, fmt.Errorf("memory of process %d: no VmRSS in /proc/%d/status (a kernel thread?)", pid, pid)
		}
	}
	return total, nil
}
