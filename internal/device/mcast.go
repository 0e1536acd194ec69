// SPDX-License-Identifier: Apache-2.0

package device

// UD multicast. A UD QP attaches to a group by its multicast GID
// (AttachMcast); the device keeps, per group, the QPs of this host
// attached to it. A datagram to a group (DstQPN abi.MulticastQPN, a
// multicast DGID) that reaches DeliverDatagram — sent by a QP of this
// host (memcpy) or carried from another host — goes to every member QP
// whose adapter its source may reach, by the rules unicast datagrams obey
// (UDRouter.AdmitDatagram: same switch, port group and VLAN; fail
// closed), so nothing crosses port groups. The sender's own QP gets a
// copy only if it is attached itself, as an HCA loops a group's traffic
// back to its attached QPs.
//
// The limits are per adapter (abi.MaxMcastGrp, abi.MaxMcastQPAttach,
// abi.MaxTotalMcastQPAttach), as ibv_query_device reports them.

import (
	"slices"

	"github.com/vrdma/vrdma/internal/abi"
)

// mcastGroups are the groups of a device: the member QPs of each, and
// the attachments of each adapter.
type mcastGroups struct {
	members map[abi.GID][]*QP            // in attach order
	byAd    map[*Adapter]map[abi.GID]int // an adapter's QPs attached to each group
}

// AttachMcast attaches UD QP q to the multicast group gid
// (ibv_attach_mcast). Attaching a QP to a group it is in already
// succeeds, as on Linux.
func (d *Device) AttachMcast(q *QP, gid abi.GID) error {
	if err := checkMcast(q, gid); err != nil {
		return err
	}
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	g := &d.mc
	if slices.Contains(g.members[gid], q) {
		return nil
	}
	ad := g.byAd[q.ad]
	total := 0
	for _, n := range ad {
		total += n
	}
	switch {
	case ad[gid] == 0 && len(ad) >= abi.MaxMcastGrp:
		return abi.Errorf(abi.CodeLimit, "gid", "adapter %s has QPs in %d multicast groups, the limit (max_mcast_grp): detach some first", q.ad.name, len(ad))
	case ad[gid] >= abi.MaxMcastQPAttach:
		return abi.Errorf(abi.CodeLimit, "gid", "adapter %s has %d QPs in group %s, the limit (max_mcast_qp_attach)", q.ad.name, ad[gid], gid)
	case total >= abi.MaxTotalMcastQPAttach:
		return abi.Errorf(abi.CodeLimit, "gid", "adapter %s has %d multicast attachments, the limit (max_total_mcast_qp_attach)", q.ad.name, total)
	}
	if q.destroyed.Load() {
		return abi.Errorf(abi.CodeNotFound, "qp", "QP 0x%x was destroyed", q.qpn)
	}
	if g.members == nil {
		g.members, g.byAd = map[abi.GID][]*QP{}, map[*Adapter]map[abi.GID]int{}
	}
	if ad == nil {
		ad = map[abi.GID]int{}
		g.byAd[q.ad] = ad
	}
	ad[gid]++
	g.members[gid] = append(g.members[gid], q)
	return nil
}

// DetachMcast detaches QP q from group gid (ibv_detach_mcast); a QP not
// attached to it is CodeNotFound (EINVAL from ibv_detach_mcast, as on
// Linux).
func (d *Device) DetachMcast(q *QP, gid abi.GID) error {
	if err := checkMcast(q, gid); err != nil {
		return err
	}
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	if !d.detachLocked(q, gid) {
		return abi.Errorf(abi.CodeNotFound, "gid", "QP 0x%x is not attached to multicast group %s", q.qpn, gid)
	}
	return nil
}

// checkMcast refuses an attachment of a QP that is not UD, or to a GID
// that is not multicast.
func checkMcast(q *QP, gid abi.GID) error {
	if !q.IsUD() {
		return abi.Errorf(abi.CodeInvalid, "qp", "QP 0x%x is %s: only UD QPs join multicast groups (EINVAL, as on Linux)", q.qpn, q.typ)
	}
	if !gid.IsMulticast() {
		return abi.Errorf(abi.CodeInvalid, "gid", "%s is not a multicast GID", gid)
	}
	return nil
}

// detachLocked removes q from gid's members; false if it was not one.
//
// +checklocks:d.mcMu
func (d *Device) detachLocked(q *QP, gid abi.GID) bool {
	g := &d.mc
	i := slices.Index(g.members[gid], q)
	if i < 0 {
		return false
	}
	// A new slice: deliveries range over the one they took.
	g.members[gid] = slices.Delete(slices.Clone(g.members[gid]), i, i+1)
	if len(g.members[gid]) == 0 {
		delete(g.members, gid)
	}
	ad := g.byAd[q.ad]
	if ad[gid]--; ad[gid] == 0 {
		delete(ad, gid)
	}
	if len(ad) == 0 {
		delete(g.byAd, q.ad)
	}
	return true
}

// detachAll detaches a QP being destroyed from all its groups.
func (d *Device) detachAll(q *QP) {
	if !q.IsUD() {
		return
	}
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	for gid := range d.mc.byAd[q.ad] {
		d.detachLocked(q, gid)
	}
}

// McastGroups returns the groups adapter ad's QPs are attached to.
func (d *Device) McastGroups(ad *Adapter) []abi.GID {
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	var out []abi.GID
	for gid := range d.mc.byAd[ad] {
		out = append(out, gid)
	}
	return out
}

// McastAll returns every group a QP of this device is attached to.
func (d *Device) McastAll() []abi.GID {
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	out := make([]abi.GID, 0, len(d.mc.members))
	for gid := range d.mc.members {
		out = append(out, gid)
	}
	return out
}

// deliverMulticast delivers dg, to a group, to each member QP its source
// may reach; it reports whether any took it.
func (d *Device) deliverMulticast(dg *Datagram, via Via) bool {
	if dg.DstQPN != abi.MulticastQPN {
		return false // a multicast DGID names no QP: IBTA wants the multicast QPN
	}
	d.mcMu.Lock()
	members := d.mc.members[dg.DGID]
	d.mcMu.Unlock()
	took := false
	for _, q := range members {
		if d.deliverTo(q, dg, via) {
			took = true
		}
	}
	return took
}
