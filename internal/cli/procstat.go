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

// wakeups is what procWakeups counts: every thread's sleeps, and those of
// the Go runtime's monitor thread among them.
type wakeups struct {
	Total   uint64
	Monitor uint64
}

// procWakeups returns how many times the processes' threads have slept and
// been woken so far: the sum of voluntary_ctxt_switches in each thread's
// /proc/PID/task/TID/status. A thread that blocks (a futex, a read, a
// poll) and is woken counts one; a thread that spins or yields the CPU
// (sched_yield) counts none, and neither does one the scheduler preempts
// (nonvoluntary_ctxt_switches), so on a loaded machine the count stays
// what the design makes it.
//
// Monitor is the part of the Go runtime's monitor thread (sysmon) of each
// process: the first thread the runtime starts after the main one (the
// earliest start time, then the lowest thread ID). It sleeps on its own
// clock, every 20 µs while a goroutine's system call may need its P
// handed on, so it counts time, not work.
func procWakeups(pids ...int) (wakeups, error) {
	var w wakeups
	for _, pid := range pids {
		var first struct {
			start, tid, n uint64
			found         bool
		}
		err := eachThread([]int{pid}, "status", "wake-ups", func(t string, b []byte) error {
			n, err := statusField(b, "voluntary_ctxt_switches:")
			if err != nil {
				return fmt.Errorf("%s: %w", t, err)
			}
			w.Total += n
			tid, err := strconv.ParseUint(filepath.Base(filepath.Dir(t)), 10, 64)
			if err != nil || tid == uint64(pid) {
				return nil // the main thread
			}
			st, err := os.ReadFile(filepath.Join(filepath.Dir(t), "stat"))
			if err != nil {
				return nil // a thread that exited meanwhile
			}
			start, err := threadStart(st)
			if err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(filepath.Dir(t), "stat"), err)
			}
			if !first.found || start < first.start || start == first.start && tid < first.tid {
				first.start, first.tid, first.n, first.found = start, tid, n, true
			}
			return nil
		})
		if err != nil {
			return wakeups{}, err
		}
		w.Monitor += first.n
	}
	return w, nil
}

// threadStart returns the start time of a thread (field 22 of its
// /proc/PID/task/TID/stat, clock ticks since boot), b being that file.
func threadStart(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')') // the command name may hold anything
	if i < 0 {
		return 0, fmt.Errorf("no \")\" ending the command name")
	}
	f := bytes.Fields(b[i+1:]) // fields 3 …
	if len(f) < 20 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 20", len(f))
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
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
