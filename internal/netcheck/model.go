// SPDX-License-Identifier: Apache-2.0

package netcheck

import (
	"cmp"
	"slices"
	"strings"

	"github.com/vrdma/vrdma/internal/control/records"
)

// Model is a network to check: switches, their port groups, and the hosts
// on them with their uplinks. It is what vrdmactl network check reads from
// the control plane or from a file.
type Model struct {
	Switches   []records.Switch
	PortGroups []records.PortGroup
	Hosts      []records.Host
}

// Report is the outcome of Check.
type Report struct {
	Switches []SwitchReport `json:"switches"`
}

// SwitchReport is the outcome of the checks of one switch.
type SwitchReport struct {
	Switch  string                `json:"switch"`
	Policy  records.NetworkPolicy `json:"networkPolicy"` // effective: strict when the record says none
	Results []Result              `json:"results"`
	// Notes say what was not checked, and why (a host with no RDMA
	// uplink, a switch with one host).
	Notes []string `json:"notes,omitempty"`
}

// Count returns how many results have each status.
func (r Report) Count() map[Status]int {
	n := map[Status]int{Pass: 0, Fail: 0, Unknown: 0}
	for _, s := range r.Switches {
		for _, res := range s.Results {
			n[res.Status]++
		}
	}
	return n
}

// OK reports whether every result passed.
func (r Report) OK() bool {
	n := r.Count()
	return n[Fail] == 0 && n[Unknown] == 0
}

// Check runs every check of m: for each switch (by name) and each of its
// port groups (by key), roce-l2-lossless and roce-vlan-pfc on the RDMA
// uplink of every host of the switch that has one, roce-l3-lossless and
// roce-mtu between every two such hosts; and roce-no-teaming once on each
// host's uplink. A host's uplink is its first, the only one or the active
// one in failover order. Port groups and hosts on switches m does not
// hold are not checked.
func Check(m Model) Report {
	sws := slices.Clone(m.Switches)
	slices.SortFunc(sws, func(a, b records.Switch) int { return strings.Compare(a.Name, b.Name) })
	pgs := slices.Clone(m.PortGroups)
	slices.SortFunc(pgs, func(a, b records.PortGroup) int { return strings.Compare(a.Key, b.Key) })
	hosts := slices.Clone(m.Hosts)
	slices.SortFunc(hosts, func(a, b records.Host) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID))
	})
	rep := Report{Switches: []SwitchReport{}}
	for _, sw := range sws {
		sr := SwitchReport{Switch: sw.Name, Policy: sw.NetworkPolicy.Effective(), Results: []Result{}}
		var ends []End
		for _, h := range hosts {
			if h.Switch != sw.Name {
				continue
			}
			if len(h.Uplinks) == 0 {
				sr.Notes = append(sr.Notes, "host "+hostRef(h)+" has no RDMA uplink on switch "+sw.Name+": its VMs reach other hosts over tcp, nothing to check")
				continue
			}
			ends = append(ends, End{Host: h, Uplink: h.Uplinks[0]})
		}
		if len(ends) < 2 {
			sr.Notes = append(sr.Notes, "switch "+sw.Name+" has fewer than two hosts with an RDMA uplink: no path between hosts to check")
		}
		var mine []records.PortGroup
		for _, pg := range pgs {
			if pg.Switch == sw.Name {
				mine = append(mine, pg)
			}
		}
		if len(mine) == 0 {
			sr.Notes = append(sr.Notes, "switch "+sw.Name+" has no port group")
		}
		for _, pg := range mine {
			for _, e := range ends {
				v := viewOf(e.Uplink)
				sr.Results = append(sr.Results, l2Lossless(sw, pg, e, v), vlanPFC(sw, pg, e, v))
			}
			for i, a := range ends {
				for _, b := range ends[i+1:] {
					sr.Results = append(sr.Results, Path(sw, pg, a, b)...)
				}
			}
		}
		for _, e := range ends {
			sr.Results = append(sr.Results, noTeaming(sw, e, viewOf(e.Uplink)))
		}
		rep.Switches = append(rep.Switches, sr)
	}
	return rep
}
