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
	err := eachThread(pids, "schedstat", "CPU time", func(t string, b []byte) error {
		f := bytes.Fields(b)
		if len(f) == 0 {
			return fmt.Errorf("%s is empty", t)
		}
		ns, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || ns < 0 {
			return fmt.Errorf("%s: %q is not a count of nanoseconds", t, f[0])
		}
		total += time.Duration(ns)
		return nil
	})
	return total, err
}

// eachThread calls f with the path and contents of file of each thread
// of the processes (/proc/PID/task/TID/file); what names the figure, for
// errors.
func eachThread(pids []int, file, what string, f func(path string, b []byte) error) error {
	for _, pid := range pids {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/%s", pid, file))
		if err != nil || len(tasks) == 0 {
			return fmt.Errorf("%s of process %d: no /proc/%d/task/*/%s (has it exited?)", what, pid, pid, file)
		}
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue // a thread that exited since the glob
			}
			if err := f(t, b); err != nil {
				return fmt.Errorf("%s of process %d: %w", what, pid, err)
			}
		}
	}
	return nil
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

// procWakeups returns how many times the processes' threads have slept and
// been woken so far: the sum of voluntary_ctxt_switches in each thread's
// /proc/PID/task/TID/status. A thread that blocks (a futex, a read, a
// poll) and is woken counts one; a thread that spins or yields the CPU
// (sched_yield) counts none, and neither does one the scheduler preempts
// (nonvoluntary_ctxt_switches), so on a loaded machine the count stays
// what the design makes it.
func procWakeups(pids ...int) (uint64, error) {
	var total uint64
	err := eachThread(pids, "status", "wake-ups", func(t string, b []byte) error {
		n, err := statusField(b, "voluntary_ctxt_switches:")
		if err != nil {
			return fmt.Errorf("%s: %w", t, err)
		}
		total += n
		return nil
	})
	return total, err
}

// statusField returns the number after key at the start of a line of a
// /proc status file.
func statusField(b []byte, key string) (uint64, error) {
	for line := range bytes.Lines(b) {
		rest, ok := bytes.CutPrefix(line, []byte(key))
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(rest)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s %q is not a count", key, bytes.TrimSpace(rest))
		}
		return n, nil
	}
	return 0, fmt.Errorf("no %s line", key)
}
