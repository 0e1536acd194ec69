// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/vrdma/vrdma/internal/quota"
)

// quotaFlags are the flags of the per-uid caps and the pinned-memory
// budget (package quota; docs/SECURITY.md, "Tenants and quotas").
type quotaFlags struct {
	pinned, pinUIDs, ring, registered, writes string
	sessions, processes, vms                  int
}

func addQuotaFlags(fs *pflag.FlagSet) *quotaFlags {
	q := &quotaFlags{}
	fs.StringVar(&q.pinned, "pinned-memory-budget", "50%", "guest memory that VMs reserve and lock (sched.mem.pin), all VMs of the host together: a size (8GiB) or a share of the RAM (50%)")
	fs.StringVar(&q.pinUIDs, "pin-allowed-uids", "", "comma-separated uids whose VMs may reserve and lock guest memory, besides root's and the agent user's (default: none)")
	fs.IntVar(&q.sessions, "max-sessions-per-user", quota.DefaultSessionsPerUser, "connections one uid may have open to the agent's socket (root and the agent's user: no cap)")
	fs.IntVar(&q.processes, "max-processes-per-user", quota.DefaultProcessesPerUser, "workloads one uid may have attached to VMs")
	fs.IntVar(&q.vms, "max-vms-per-user", quota.DefaultVMsPerUser, "VMs one uid may own: defined on this agent and managed in the control plane together")
	fs.StringVar(&q.ring, "max-ring-memory-per-user", "1GiB", "bytes of QP and CQ rings (locked by the agent) of one uid's workloads")
	fs.StringVar(&q.registered, "max-registered-memory-per-user", "50%", "bytes of memory regions one uid's workloads may register, each counted whole: a size or a share of the RAM")
	fs.StringVar(&q.writes, "max-vm-write-bytes-per-hour", "64MiB", "bytes of VM records one uid may write to the control plane in an hour (create, edit, power)")
	return q
}

// limits returns the flags' caps.
func (q *quotaFlags) limits() (quota.Limits, error) {
	var l quota.Limits
	for _, s := range []struct {
		flag, v string
		to      *uint64
	}{{"pinned-memory-budget", q.pinned, &l.PinnedMemory}, {"max-ring-memory-per-user", q.ring, &l.RingMemoryPerUser},
		{"max-registered-memory-per-user", q.registered, &l.RegisteredMemoryPerUser}, {"max-vm-write-bytes-per-hour", q.writes, &l.VMWriteBytesPerHour}} {
		n, err := quota.ParseSize(strings.ReplaceAll(s.v, " ", ""))
		if err != nil {
			return l, fmt.Errorf("--%s %w", s.flag, err)
		}
		if n == 0 {
			return l, fmt.Errorf("--%s %q: want more than 0", s.flag, s.v)
		}
		*s.to = n
	}
	for _, c := range []struct {
		flag string
		v    int
		to   *int
	}{{"max-sessions-per-user", q.sessions, &l.SessionsPerUser}, {"max-processes-per-user", q.processes, &l.ProcessesPerUser}, {"max-vms-per-user", q.vms, &l.VMsPerUser}} {
		if c.v < 1 {
			return l, fmt.Errorf("--%s %d: want at least 1", c.flag, c.v)
		}
		*c.to = c.v
	}
	if q.pinUIDs != "" {
		for _, f := range strings.Split(q.pinUIDs, ",") {
			u, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
			if err != nil {
				return l, fmt.Errorf("--pin-allowed-uids %q: %q is not a uid", q.pinUIDs, f)
			}
			l.PinUIDs = append(l.PinUIDs, uint32(u))
		}
	}
	return l, nil
}
