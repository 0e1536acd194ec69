// SPDX-License-Identifier: Apache-2.0

package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
)

// Unknown is the value that removes a declaration.
const Unknown = "unknown"

// UplinkDeclaration is what DeclareUplink declares of the NIC of a
// host's RDMA uplink, as its operator knows it: each field nil (left as
// it is), Unknown (the declaration removed) or a value as vrdmactl host
// uplink declare's flag of that name takes it.
type UplinkDeclaration struct {
	PFC        *string // priorities with PFC on: "3", "3,4" or "none"
	Pause      *string // 802.3x global pause: "rx,tx", "rx", "tx" or "off"
	Trust      *string // "pcp" or "dscp"
	MTU        *string // the NIC's MTU
	Teamed     *string // "yes" or "no" (on, off, true, false)
	Team       *string // the bond or team it is in
	SoleUplink *string // "yes" or "no": the host's only uplink on the switch
	// Clear removes every declaration first.
	Clear bool
}

// edit turns d into an edit of a declaration; nil if d declares
// nothing. A bad value is an InvalidError naming the flag.
func (d UplinkDeclaration) edit() (func(*records.NICState), error) {
	var edits []func(*records.NICState)
	set := func(flag string, v *string, parse func(string) (func(*records.NICState), error), unset func(*records.NICState)) error {
		if v == nil {
			return nil
		}
		if *v == Unknown {
			edits = append(edits, unset)
			return nil
		}
		e, err := parse(*v)
		if err != nil {
			return invalidf("host uplink declare --%s: %v", flag, err)
		}
		edits = append(edits, e)
		return nil
	}
	yesNo := func(v string) (bool, error) {
		switch v {
		case "on", "true", "yes":
			return true, nil
		case "off", "false", "no":
			return false, nil
		}
		return false, fmt.Errorf("%q: want yes, no or %s", v, Unknown)
	}
	errs := []error{
		set("pfc", d.PFC, func(v string) (func(*records.NICState), error) {
			p, err := records.ParsePrioritySet(v)
			return func(s *records.NICState) { s.PFC = &p }, err
		}, func(s *records.NICState) { s.PFC = nil }),
		set("pause", d.Pause, func(v string) (func(*records.NICState), error) {
			p, err := records.ParsePause(v)
			return func(s *records.NICState) { s.Pause = &p }, err
		}, func(s *records.NICState) { s.Pause = nil }),
		set("trust", d.Trust, func(v string) (func(*records.NICState), error) {
			t, err := records.ParseTrust(v)
			return func(s *records.NICState) { s.Trust = t }, err
		}, func(s *records.NICState) { s.Trust = "" }),
		set("mtu", d.MTU, func(v string) (func(*records.NICState), error) {
			var n int
			if _, err := fmt.Sscan(v, &n); err != nil || fmt.Sprint(n) != v || n < records.MinNICMTU || n > records.MaxNICMTU {
				return nil, fmt.Errorf("%q is not an MTU %d–%d", v, records.MinNICMTU, records.MaxNICMTU)
			}
			return func(s *records.NICState) { s.MTU = n }, nil
		}, func(s *records.NICState) { s.MTU = 0 }),
		set("teamed", d.Teamed, func(v string) (func(*records.NICState), error) {
			b, err := yesNo(v)
			return func(s *records.NICState) {
				s.Teamed = &b
				if !b {
					s.Team = ""
				}
			}, err
		}, func(s *records.NICState) { s.Teamed, s.Team = nil, "" }),
		set("team", d.Team, func(v string) (func(*records.NICState), error) {
			return func(s *records.NICState) { s.Team = v }, records.CheckName(v)
		}, func(s *records.NICState) { s.Team = "" }),
		set("sole-uplink", d.SoleUplink, func(v string) (func(*records.NICState), error) {
			b, err := yesNo(v)
			return func(s *records.NICState) { s.SoleUplink = &b }, err
		}, func(s *records.NICState) { s.SoleUplink = nil }),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, &InvalidError{err}
	}
	if len(edits) == 0 {
		return nil, nil
	}
	return func(s *records.NICState) {
		for _, e := range edits {
			e(s)
		}
	}, nil
}

// DeclareUplink records d for uplink (its device or its address) of host
// hostRef (an ID or a name) and returns the host's record and the
// uplink as they are after. The network checks and path selection use a
// declaration where the host's kernel reports nothing.
func DeclareUplink(ctx context.Context, st *store.Store, c *member.Cache, hostRef, uplink string, d UplinkDeclaration) (records.Host, records.Uplink, error) {
	edit, err := d.edit()
	if err != nil {
		return records.Host{}, records.Uplink{}, err
	}
	if edit == nil && !d.Clear {
		return records.Host{}, records.Uplink{}, invalidf("host uplink declare: say what to declare (--pfc, --pause, --trust, --mtu, --teamed, --team, --sole-uplink, --clear)")
	}
	id, err := HostID(c, hostRef)
	if err != nil {
		return records.Host{}, records.Uplink{}, err
	}
	var out records.Uplink
	host, _, err := store.Update(ctx, st, records.HostKey(id), func(old *records.Host) (*records.Host, error) {
		if old == nil {
			return nil, fmt.Errorf("host %s: %w", id, store.ErrNotFound)
		}
		n := *old
		n.Uplinks = append([]records.Uplink(nil), old.Uplinks...)
		i, err := n.UplinkIndex(uplink)
		if err != nil {
			return nil, notFoundError{err}
		}
		dst := &n.Uplinks[i].Declared
		if d.Clear {
			*dst = records.NICState{}
		}
		if edit != nil {
			edit(dst)
		}
		if err := n.Validate(); err != nil {
			return nil, &InvalidError{err}
		}
		out = n.Uplinks[i]
		return &n, nil
	})
	return host, out, err
}

// NICText is a NIC state for people: "pfc 3, pause off, trust dscp, mtu
// 9000, not teamed", or "nothing".
func NICText(s records.NICState) string {
	var p []string
	if s.PFC != nil {
		p = append(p, "pfc "+s.PFC.String())
	}
	if s.Pause != nil {
		p = append(p, "pause "+s.Pause.String())
	}
	if s.Trust != "" {
		p = append(p, "trust "+string(s.Trust))
	}
	if s.MTU != 0 {
		p = append(p, fmt.Sprintf("mtu %d", s.MTU))
	}
	switch {
	case s.Teamed != nil && *s.Teamed && s.Team != "":
		p = append(p, "teamed in "+s.Team)
	case s.Teamed != nil && *s.Teamed:
		p = append(p, "teamed")
	case s.Teamed != nil:
		p = append(p, "not teamed")
	}
	if s.SoleUplink != nil {
		if *s.SoleUplink {
			p = append(p, "sole uplink on")
		} else {
			p = append(p, "sole uplink off")
		}
	}
	if len(p) == 0 {
		return "nothing"
	}
	return strings.Join(p, ", ")
}

// notFoundError is an error that says what is not there in its own
// words, and is store.ErrNotFound.
type notFoundError struct{ err error }

// Error is the error's own words.
func (e notFoundError) Error() string { return e.err.Error() }

// Is says it is store.ErrNotFound.
func (e notFoundError) Is(target error) bool { return target == store.ErrNotFound }
