// SPDX-License-Identifier: Apache-2.0

package hostlink

// The tcp path follows its host's record: vrdmactl host configure changes
// the record in the control plane, and the host's agent applies it at
// once, as ESXi applies a VMkernel adapter's tag or a firewall ruleset:
//
//   - a new PVRDMA address: the listener moves to it and every connection
//     with other hosts is dropped (they were made from the old address,
//     which peers now refuse by rule pvrdma-address); QPs reconnect from
//     the new one within their retry budget;
//   - no PVRDMA address any more: the listener closes, every connection is
//     dropped, and the host has no tcp path until it gets one again;
//   - the pvrdma firewall rule turned off: every connection is dropped and
//     new ones are refused (rule host-rdma-configured) until it is on;
//   - a host key that is not this host's (someone who can write the
//     control plane replaced it): logged, since hosts that see this host
//     for the first time would pin that key; the agent publishes its own
//     again when it next registers (a restart).
//
// An address that cannot be bound (not on this host, port taken) leaves
// the host without a listener, tried again every listenRetry; vrdmactl
// status shows why.

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vrdma/vrdma/internal/abi/mgmt"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/hostkey"
)

// watchConfig applies each change of this host's record to the tcp path,
// until close.
func (u *Links) watchConfig() {
	defer u.wg.Done()
	c := &u.cfg
	for {
		ch := c.Cache.Changed()
		ctx, cancel := context.WithTimeout(context.Background(), c.LookupTimeout)
		hs, err := c.Cache.Host(ctx, u.cfg.HostID)
		cancel()
		if err == nil {
			u.apply(hs.Host)
		}
		var retry <-chan time.Time
		if u.listenFailed() {
			retry = time.After(listenRetry)
		}
		select {
		case <-ch:
		case <-retry:
		case <-u.stop:
			return
		}
	}
}

// apply brings the tcp path in line with host record h.
func (u *Links) apply(h records.Host) {
	if own := hostkey.Encode(u.cfg.HostKey.Public().(ed25519.PublicKey)); h.HostKey != own && h.HostKey != u.badKey {
		u.log.Warn("tcp path: rule host-key: this host's record in the control plane publishes another host key than this agent's: "+
			"someone with write access to the control plane replaced it, and hosts that have not pinned this host's key yet would "+
			"trust that one; restart the agent to publish its own again, and find out who changed it",
			"published", h.HostKey, "own", own)
	}
	u.badKey = h.HostKey
	if on := h.FirewallPVRDMA; u.firewall.Swap(on) != on {
		if on {
			u.log.Info("tcp path: the pvrdma firewall rule is on: PVRDMA traffic with other hosts is allowed")
		} else {
			u.log.Warn("tcp path: the pvrdma firewall rule is off: connections with other hosts dropped, new ones refused")
			u.dropAll(errors.New("rule host-rdma-configured: this host's pvrdma firewall rule was turned off"))
		}
	}
	u.mu.Lock()
	if u.closed || h.PVRDMAAddress == u.addr && (u.ln != nil || u.listenErr == "") {
		u.mu.Unlock()
		return
	}
	old, oldErr := u.addr, u.listenErr
	if u.ln != nil {
		u.ln.Close() // its serve returns
		u.ln = nil
	}
	var err error
	if h.PVRDMAAddress.IsValid() {
		err = u.listenLocked(h.PVRDMAAddress)
	} else {
		u.addr, u.listenErr = netip.AddrPort{}, ""
	}
	u.mu.Unlock()
	switch {
	case err != nil && old == h.PVRDMAAddress && err.Error() == oldErr:
		// Still failing the same way: logged already.
	case err != nil:
		u.log.Warn("tcp path: the host's new PVRDMA address cannot be used: no tcp path until it is fixed (vrdmactl host configure --pvrdma-address)", "address", h.PVRDMAAddress, "err", err)
	case !h.PVRDMAAddress.IsValid():
		u.log.Warn("tcp path: the host has no PVRDMA address any more: no tcp path", "was", old)
	}
	if old.IsValid() && old != h.PVRDMAAddress {
		u.dropAll(fmt.Errorf("this host's PVRDMA address changed from %s to %s", old, fmtAddr(h.PVRDMAAddress)))
	}
}

// listenRetry is how often a PVRDMA address that could not be bound is
// tried again.
const listenRetry = 5 * time.Second

// listenFailed reports whether the host's PVRDMA address could not be
// bound.
func (u *Links) listenFailed() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.ln == nil && u.listenErr != ""
}

func fmtAddr(a netip.AddrPort) string {
	if !a.IsValid() {
		return "none"
	}
	return a.String()
}

// PVRDMAStatus describes the host's side of the tcp path for status.
func (u *Links) PVRDMAStatus() *mgmt.PVRDMAStatus {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := &mgmt.PVRDMAStatus{Firewall: u.firewall.Load(), Error: u.listenErr, HandshakePanics: u.hsPanics.Load(),
		AcceptRefused: u.adm.refused[refuseMember].Load(), SourceSlotsFull: u.adm.refused[refuseSource].Load(),
		HandshakeSlotsFull: u.adm.refused[refuseTotal].Load()}
	if u.addr.IsValid() {
		s.Address = u.addr.String()
	}
	if u.ln != nil {
		s.Listening = u.ln.Addr().String()
	}
	return s
}
