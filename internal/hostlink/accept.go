// SPDX-License-Identifier: Apache-2.0

package hostlink

// Admission at accept. Before a connection gets a goroutine and a
// handshake, its source address must be the PVRDMA address of a host of
// this host's switch (a member), and that source and the agent must each
// have a handshake slot free: Config.HandshakesPerSource per source
// address, Config.Handshakes in all. Anything else is reset at once (SO_LINGER 0),
// counted (PVRDMAStatus.AcceptRefused, HandshakesDropped) and logged at
// most once a second per reason. So a non-member that opens connections
// and never sends HELLO holds nothing, and a member that does holds at
// most its own slots: it cannot keep another member out.
//
// Membership comes from the host records in the control plane: the
// addresses of the hosts whose record puts them on this host's switch,
// recomputed from the agent's watch-driven cache (member.Cache) whenever
// the cache moves. A source the cache does not know may be a host that
// has just registered or moved: it waits, holding a slot, for one fresh
// read of the host records from etcd, shared by every connection that
// waits (at most an eighth of the handshake slots, and at most one read per
// memberRefreshEvery); if that read fails or does not list it either, it
// is refused. Without etcd only the addresses the cache holds are
// admitted: membership fails closed.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// Admission limits.
const (
	// DefaultHandshakes is the default of Config.Handshakes: the
	// accepted connections in their handshake at once; more are reset at
	// accept.
	DefaultHandshakes = 64
	// DefaultHandshakesPerSource is the default of
	// Config.HandshakesPerSource, those from one source address: a host
	// opens one connection to a peer at a time (Peer.Conn), so 4 leave
	// room for a restart or a retry, not for a flood.
	DefaultHandshakesPerSource = 4
	// memberRefreshEvery is the least time between two fresh reads of
	// the host records made for unknown sources.
	memberRefreshEvery = time.Second
)

// Reasons a connection is not admitted.
const (
	admitOK      = iota
	admitWait    // unknown source: wait for a fresh read (holds a slot)
	refuseMember // not a member's address
	refuseSource // its source's handshake slots are taken
	refuseTotal  // every handshake slot is taken
	readFailed   // (for logAccept) a fresh read of the host records failed
	numAdmit
)

// admission is the state of admission at accept (see the top of the
// file).
type admission struct {
	mu sync.Mutex
	// handshakes under way (and unknown sources waiting), by source
	slots map[netip.Addr]int // +checklocks:mu
	// their sum
	total int // +checklocks:mu
	// connections from unknown sources waiting for a fresh read
	waiting int // +checklocks:mu
	// the member addresses as of the cache's revision rev (-1: never
	// computed)
	members map[netip.Addr]struct{} // +checklocks:mu
	rev     int64                   // +checklocks:mu
	// the member addresses of the last fresh read, at revision freshRev;
	// dropped once the cache has caught up with it
	fresh    map[netip.Addr]struct{} // +checklocks:mu
	freshRev int64                   // +checklocks:mu
	// when the last fresh read began
	lastRead time.Time // +checklocks:mu
	// non-nil while a fresh read runs; closed when it ends
	reading chan struct{} // +checklocks:mu

	// connections refused, by reason (refuseMember, refuseSource,
	// refuseTotal), and when each reason was last logged (nanotime)
	refused [numAdmit]atomic.Uint64
	logged  [numAdmit]atomic.Int64
}

// admit decides at accept about a connection from from (an unmapped
// address). For admitOK and admitWait it has taken a slot, which release
// gives back; for admitWait also a waiting place, which refreshMember
// gives back.
func (u *Links) admit(from netip.Addr) int {
	a := &u.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	verdict := admitOK
	if !a.isMemberLocked(u, from) {
		if a.waiting >= max(1, u.cfg.Handshakes/8) || a.reading == nil && time.Since(a.lastRead) < memberRefreshEvery {
			return refuseMember
		}
		verdict = admitWait
	}
	switch {
	case a.slots[from] >= u.cfg.HandshakesPerSource:
		return refuseSource
	case a.total >= u.cfg.Handshakes:
		return refuseTotal
	}
	if a.slots == nil {
		a.slots = map[netip.Addr]int{}
	}
	a.slots[from]++
	a.total++
	if verdict == admitWait {
		a.waiting++
	}
	return verdict
}

// release gives back the handshake slot of a connection from from.
func (u *Links) release(from netip.Addr) {
	a := &u.adm
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.slots[from]--; a.slots[from] <= 0 {
		delete(a.slots, from)
	}
	a.total--
}

// isMemberLocked reports whether from is the PVRDMA address of a host of
// u's switch, as u's cache (or a fresh read newer than the cache) says.
//
// +checklocks:a.mu
func (a *admission) isMemberLocked(u *Links, from netip.Addr) bool {
	if c := u.cfg.Cache; c != nil {
		if rev := c.Rev(); rev != a.rev || a.members == nil {
			hosts := c.Hosts()
			m := make(map[netip.Addr]struct{}, len(hosts))
			for _, h := range hosts {
				u.addMember(m, h.Host)
			}
			a.members, a.rev = m, rev
		}
	}
	if _, ok := a.members[from]; ok {
		return true
	}
	if a.fresh != nil && a.freshRev <= a.rev {
		a.fresh = nil // the cache has caught up
	}
	_, ok := a.fresh[from]
	return ok
}

// addMember adds h's PVRDMA address to m if h is a member: another host
// of this host's switch with a PVRDMA address. Whether it is up, and the
// other rules, are the handshake's to check.
func (u *Links) addMember(m map[netip.Addr]struct{}, h records.Host) {
	c := &u.cfg
	if c.Switch != "" && h.Switch == c.Switch && h.ID != c.HostID && h.PVRDMAAddress.IsValid() {
		m[h.PVRDMAAddress.Addr().Unmap()] = struct{}{}
	}
}

// refreshMember is admitWait's second chance: it waits for a fresh read
// of the host records from etcd (starting one, or joining the one under
// way) and reports whether from is a member's address after it. It gives
// back the waiting place admit took.
func (u *Links) refreshMember(from netip.Addr) bool {
	a := &u.adm
	a.mu.Lock()
	ch := a.reading
	if ch == nil {
		ch = make(chan struct{})
		a.reading, a.lastRead = ch, time.Now()
		a.mu.Unlock()
		m, rev, err := u.readMembers()
		if err != nil {
			u.logAccept(readFailed, "tcp path: cannot read the host records to admit a connection from an unknown address; "+
				"only addresses of hosts in the agent's cache are admitted until etcd answers", "from", from.String(), "err", err)
		}
		a.mu.Lock()
		if err == nil {
			a.fresh, a.freshRev = m, rev
		}
		a.reading = nil
		close(ch)
	} else {
		a.mu.Unlock()
		<-ch
		a.mu.Lock()
	}
	ok := a.isMemberLocked(u, from)
	a.waiting--
	a.mu.Unlock()
	return ok
}

// readMembers reads every host record from etcd and returns the member
// addresses (see addMember) and the revision read.
func (u *Links) readMembers() (map[netip.Addr]struct{}, int64, error) {
	c := &u.cfg
	if c.Store == nil {
		return nil, 0, fmt.Errorf("no control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(max(c.LookupTimeout, 100*time.Millisecond), handshakeTimeout))
	defer cancel()
	hosts, rev, _, err := store.List[records.Host](ctx, c.Store, records.HostPrefix)
	if err != nil {
		return nil, 0, err
	}
	m := make(map[netip.Addr]struct{}, len(hosts))
	for _, it := range hosts {
		u.addMember(m, it.Value)
	}
	return m, rev, nil
}

// refuseAtAccept resets nc, which admit (or refreshMember) did not admit
// for reason why, counts it and logs it (once a second per reason).
func (u *Links) refuseAtAccept(nc *net.TCPConn, from netip.Addr, why int) {
	nc.SetLinger(0)
	nc.Close()
	u.adm.refused[why].Add(1)
	switch why {
	case refuseMember:
		u.logAccept(why, "tcp path: connection reset at accept: its source is not the PVRDMA address of a host of this switch",
			"rule", "host-on-switch", "from", from.String(), "refused_total", u.adm.refused[why].Load())
	case refuseSource:
		u.logAccept(why, "tcp path: connection reset at accept: its source address has every handshake slot it may hold",
			"from", from.String(), "limit", u.cfg.HandshakesPerSource, "flag", "--max-handshakes-per-source", "dropped_total", u.adm.refused[why].Load())
	case refuseTotal:
		u.logAccept(why, "tcp path: too many handshakes under way; connection dropped",
			"from", from.String(), "limit", u.cfg.Handshakes, "flag", "--max-handshakes", "dropped_total", u.adm.refused[why].Load())
	}
}

// logAccept logs msg at warning level unless a line for reason why was
// logged less than a second ago.
func (u *Links) logAccept(why int, msg string, args ...any) {
	now := max(nanotime(), 1) // 0: never logged
	last := u.adm.logged[why].Load()
	if last != 0 && now-last < int64(time.Second) || !u.adm.logged[why].CompareAndSwap(last, now) {
		return
	}
	u.log.Warn(msg, args...)
}
