// SPDX-License-Identifier: Apache-2.0

package sys

// Named network namespaces ("ip netns add"), entered by one OS thread.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// NetnsDir is where "ip netns" keeps named network namespaces.
const NetnsDir = "/run/netns"

// InNetns runs fn on an OS thread that is in named network namespace ns,
// and waits for it. Sockets fn creates belong to ns, and so do processes it
// starts (the child inherits the thread's namespace); goroutines fn starts
// run in the process's own namespace. A panic in fn is raised again in the
// caller.
func InNetns(ns string, fn func() error) error {
	target, err := os.Open(filepath.Join(NetnsDir, ns))
	if err != nil {
		return fmt.Errorf("network namespace %s: %w (was the cluster cleaned up already?)", ns, err)
	}
	defer target.Close()
	type result struct {
		err   error
		panic any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// The thread goes back to the pool only if it is back in its own
		// namespace; otherwise it ends with this goroutine.
		back := false
		defer func() {
			if back {
				runtime.UnlockOSThread()
			}
		}()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			back = true
			done <- result{err: fmt.Errorf("enter network namespace %s: open this thread's namespace: %w", ns, err)}
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			back = true
			done <- result{err: fmt.Errorf("enter network namespace %s: setns: %w (needs CAP_SYS_ADMIN)", ns, err)}
			return
		}
		var r result
		func() {
			defer func() { r.panic = recover() }()
			r.err = fn()
		}()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			r.err = errors.Join(r.err, fmt.Errorf("leave network namespace %s: setns: %w", ns, err))
		} else {
			back = true
		}
		done <- r
	}()
	r := <-done
	if r.panic != nil {
		panic(r.panic)
	}
	return r.err
}

// SameNetns reports whether process pid is in this process's network
// namespace. A namespace that cannot be read (the process is gone, or
// another user's that this one may not inspect) is not the same.
func SameNetns(pid int32) bool {
	var self, other unix.Stat_t
	if unix.Stat("/proc/self/ns/net", &self) != nil || unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &other) != nil {
		return false
	}
	return self.Dev == other.Dev && self.Ino == other.Ino
}
