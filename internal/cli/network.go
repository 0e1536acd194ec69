// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma/internal/control/admin"
	"github.com/vrdma/vrdma/internal/control/member"
	"github.com/vrdma/vrdma/internal/control/records"
	"github.com/vrdma/vrdma/internal/control/store"
	"github.com/vrdma/vrdma/internal/netcheck"
	"github.com/vrdma/vrdma/internal/netcheck/netfile"
	"github.com/vrdma/vrdma/internal/netcheck/nicstate"
)

// The RoCE network checks (docs/network.md): vrdmactl network check runs the
// checks of package netcheck on the network the control plane holds, with
// the NIC state this machine's kernel reports for the local host's
// uplinks, or on a network declared in a file (package netfile). Path
// selection applies the same checks to every rdma decision.

// networkReport is what network check prints (-o json).
type networkReport struct {
	OK     bool                    `json:"ok"`
	Source string                  `json:"source"` // "control plane" or "file PATH"
	Counts map[netcheck.Status]int `json:"counts"`
	// Local is the kernel state read for the local host's uplinks.
	Local    *localNICs              `json:"local,omitempty"`
	Switches []netcheck.SwitchReport `json:"switches"`
}

// localNICs is the kernel state of the local host's uplinks.
type localNICs struct {
	Host    string           `json:"host"`
	Uplinks []nicstate.State `json:"uplinks"`
	Notes   []string         `json:"notes,omitempty"`
}

func (a *app) networkCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Check the RoCE network: lossless layers 2 and 3, VLAN and PFC, no teaming, MTU",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("network: name a subcommand: check")
		},
	}
	var sw, file, local string
	check := &cobra.Command{
		Use:   "check [--switch S] [--config FILE] [--local-host H|none]",
		Short: "Run the RoCE network checks and say how to fix what fails",
		Long: `check runs the RoCE network checks on every switch of the control plane (or
--switch S only), and prints each check's outcome — pass, fail or unknown — with
what it looked at and how to fix it:

  roce-l2-lossless  PFC on the port group's priority, or global pause, on every uplink
  roce-vlan-pfc     the port group is in a VLAN with PFC on its priority
  roce-l3-lossless  across routers (RoCE v2 only): the priority maps to the DSCP at
                    every hop and DSCP is preserved, or PCP is copied from tagged packets
  roce-no-teaming   the RDMA uplink is not teamed and is the host's only uplink
  roce-mtu          the path MTU carries the port group's RoCE MTU

An uplink's state is what its host's kernel reports or, where it cannot (a veth,
virtio or loopback NIC has no DCB), what its operator declared with 'vrdmactl
host uplink declare'; with neither, the check is unknown and says what to
declare. For the local host (the host of --state-dir's agent, or --local-host)
check reads this machine's kernel: PFC through DCB netlink, pause through
ethtool netlink, MTU and teaming through rtnetlink.

--config FILE checks the network a YAML or JSON file declares instead, before it
exists (see docs/network.md); it reads no control plane and no kernel.

Path selection applies the same checks to every rdma decision, as the switch's
network policy says (strict, warn or off: vrdmactl switch set S
--network-policy P). check exits 0 when every check passes, 1 when one fails or
is unknown, and 2 when the input is bad.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var rep networkReport
			var m netcheck.Model
			if file != "" {
				if cmd.Flags().Changed("local-host") {
					return usageErrorf("network check: --local-host reads the control plane's hosts; --config reads none")
				}
				data, err := readConfig(a.stdin, file)
				if err != nil {
					return usageErrorf("network check: %v", err)
				}
				if m, err = netfile.Parse(data); err != nil {
					return usageErrorf("network check --config %s: %v", file, err)
				}
				rep.Source = "file " + file
			} else {
				err := a.withCache(cmd.Context(), func(_ *store.Store, c *member.Cache) error {
					m = c.NetworkModel()
					var err error
					rep.Local, err = a.readLocalNICs(c, &m, local)
					return err
				})
				if err != nil {
					return err
				}
				rep.Source = "control plane"
			}
			if sw != "" {
				var only []records.Switch
				for _, s := range m.Switches {
					if s.Name == sw {
						only = append(only, s)
					}
				}
				if len(only) == 0 {
					return usageErrorf("network check: switch %s: not in the %s", sw, rep.Source)
				}
				m.Switches = only
			}
			res := netcheck.Check(m)
			rep.Switches, rep.Counts, rep.OK = res.Switches, res.Count(), res.OK()
			if a.json() {
				if err := a.printJSON(rep); err != nil {
					return err
				}
			} else {
				printNetwork(a.stdout, rep)
			}
			if !rep.OK {
				return &exitError{code: exitFailure}
			}
			return nil
		},
	}
	f := check.Flags()
	f.StringVar(&sw, "switch", "", "check switch S only")
	f.StringVar(&file, "config", "", "check the network this YAML or JSON file declares (- for standard input), not the control plane")
	f.StringVar(&local, "local-host", "", "the host whose uplinks are this machine's NICs, by ID or name (default: the host of --state-dir's agent); none reads no kernel state")
	cmd.AddCommand(check)
	return cmd
}

// readConfig reads a network file, or standard input for "-".
func readConfig(stdin io.Reader, name string) ([]byte, error) {
	r := stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, netfile.MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return b, nil
}

// readLocalNICs reads this machine's kernel for the uplinks of the local
// host (ref, or the host of the agent in --state-dir) and puts what it
// reports in m as the uplinks' observed state. It reads nothing for ref
// "none", or when no local host is known.
func (a *app) readLocalNICs(c *member.Cache, m *netcheck.Model, ref string) (*localNICs, error) {
	if ref == "none" {
		return nil, nil
	}
	explicit := ref != ""
	if !explicit {
		b, err := os.ReadFile(filepath.Join(a.ctl.stateDir, "host-id"))
		if err != nil {
			return nil, nil // no local agent: nothing is local
		}
		ref = strings.TrimSpace(string(b))
	}
	id, err := admin.HostID(c, ref)
	if err != nil {
		if explicit {
			return nil, usageErrorf("network check --local-host: %v", err)
		}
		return nil, nil // the local agent's host is not in this control plane
	}
	i := 0
	for i < len(m.Hosts) && m.Hosts[i].ID != id {
		i++
	}
	if i == len(m.Hosts) {
		return nil, nil
	}
	h := &m.Hosts[i]
	h.Uplinks = append([]records.Uplink(nil), h.Uplinks...)
	out := &localNICs{Host: hostRef(*h), Uplinks: []nicstate.State{}}
	k, err := nicstate.Dial(0)
	if err != nil {
		out.Notes = append(out.Notes, fmt.Sprintf("cannot ask this machine's kernel: %v", err))
		return out, nil
	}
	defer k.Close()
	for j := range h.Uplinks {
		u := &h.Uplinks[j]
		if u.Device == "" {
			out.Notes = append(out.Notes, fmt.Sprintf("uplink %s names no device: its kernel state is not read", u.Name()))
			continue
		}
		st, err := nicstate.Read(k, u.Device)
		if err != nil {
			out.Notes = append(out.Notes, fmt.Sprintf("uplink %s: %v", u.Name(), err))
			continue
		}
		u.Observed = st.NICState
		out.Uplinks = append(out.Uplinks, st)
	}
	return out, nil
}

func hostRef(h records.Host) string {
	if h.Name != "" {
		return h.Name
	}
	return h.ID
}

func printNetwork(w io.Writer, rep networkReport) {
	if l := rep.Local; l != nil {
		var devs []string
		for _, u := range l.Uplinks {
			devs = append(devs, u.Device)
		}
		fmt.Fprintf(w, "local host %s: NIC state read from this machine's kernel for %s\n", l.Host, orDash(strings.Join(devs, ", ")))
		for _, n := range l.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
	}
	if len(rep.Switches) == 0 {
		fmt.Fprintf(w, "no switches in the %s\n", rep.Source)
	}
	for _, s := range rep.Switches {
		fmt.Fprintf(w, "switch %s (network policy %s)\n", s.Switch, s.Policy)
		for _, r := range s.Results {
			pg := ""
			if r.PortGroup != "" {
				pg = "port group " + r.PortGroup + ", "
			}
			fmt.Fprintf(w, "  %-7s %s: %s%s: %s\n", strings.ToUpper(string(r.Status)), r.Check, pg, r.Subject, r.Detail)
			if r.Fix != "" {
				fmt.Fprintf(w, "          fix: %s\n", r.Fix)
			}
		}
		for _, n := range s.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
	}
	fmt.Fprintf(w, "network check: %d pass, %d fail, %d unknown\n", rep.Counts[netcheck.Pass], rep.Counts[netcheck.Fail], rep.Counts[netcheck.Unknown])
}

// ---- editing the network model -----------------------------------------------

// parseOnOff parses a boolean flag's value: on, yes, true or off, no,
// false.
func parseOnOff(name, v string) (bool, error) {
	switch v {
	case "on", "true", "yes":
		return true, nil
	case "off", "false", "no":
		return false, nil
	}
	return false, usageErrorf("--%s %q: want on or off (or yes, no, true, false)", name, v)
}

// uplinkDeclareReport is "vrdmactl host uplink declare -o json".
type uplinkDeclareReport struct {
	Host   string         `json:"host"`   // the host's ID
	Name   string         `json:"name"`   // its name
	Uplink records.Uplink `json:"uplink"` // the uplink, with what it now declares
}

// hostUplinkCommand is "vrdmactl host uplink": the network state an
// operator declares for a host's RDMA uplinks.
func (a *app) hostUplinkCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "uplink",
		Short: "Declare the lossless-Ethernet state of a host's RDMA uplink",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("host uplink: name a subcommand: declare")
		},
	}
	var pfc, pause, trust, mtu, teamed, team, sole string
	var clear bool
	declare := &cobra.Command{
		Use:   "declare HOST UPLINK [--pfc P,...|none] [--pause rx,tx|rx|tx|off] [--trust pcp|dscp] [--mtu N] [--teamed on|off] [--team NAME] [--sole-uplink on|off] [--clear]",
		Short: "Declare what an uplink's NIC does, where its kernel cannot report it",
		Long: `declare records in the control plane what the NIC of a host's RDMA uplink
(named by its device, or its address) does for lossless Ethernet, as its
operator knows it: the priorities with PFC on (--pfc 3, --pfc 3,4, --pfc none),
802.3x global pause (--pause rx,tx or off), which header its priority comes
from (--trust pcp or dscp), its MTU, whether it is teamed (in a bond or team),
and whether it is the host's only uplink on the switch. The network checks and
path selection use a declaration where the host's kernel reports nothing (a
veth, virtio or loopback NIC has no DCB); what the kernel reports wins. Each
flag's value "unknown" removes that declaration; --clear removes them all
first. Only the flags given change; the host's agent keeps the declarations
when it registers again.`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			fl := cmd.Flags()
			d := admin.UplinkDeclaration{PFC: ifChanged(fl, "pfc", &pfc), Pause: ifChanged(fl, "pause", &pause), Trust: ifChanged(fl, "trust", &trust), MTU: ifChanged(fl, "mtu", &mtu),
				Teamed: ifChanged(fl, "teamed", &teamed), Team: ifChanged(fl, "team", &team), SoleUplink: ifChanged(fl, "sole-uplink", &sole), Clear: clear}
			var out records.Uplink
			var host records.Host
			err := a.withCache(cmd.Context(), func(st *store.Store, c *member.Cache) error {
				var err error
				host, out, err = admin.DeclareUplink(cmd.Context(), st, c, args[0], args[1], d)
				return adminErr(err)
			})
			if err != nil {
				return cmdErr("host uplink declare "+args[0]+" "+args[1], err)
			}
			if a.json() {
				return a.printJSON(uplinkDeclareReport{Host: host.ID, Name: host.Name, Uplink: out})
			}
			fmt.Fprintf(a.stdout, "host %s uplink %s declares: %s\n", hostRef(host), out.Name(), admin.NICText(out.Declared))
			return nil
		},
	}
	f := declare.Flags()
	f.StringVar(&pfc, "pfc", "", "priorities with PFC on: 3, 3,4 or none")
	f.StringVar(&pause, "pause", "", "802.3x global pause: rx,tx, rx, tx or off")
	f.StringVar(&trust, "trust", "", "which header gives a received packet its priority: pcp or dscp")
	f.StringVar(&mtu, "mtu", "", "the NIC's MTU")
	f.StringVar(&teamed, "teamed", "", "the NIC is in a bond or team: on or off")
	f.StringVar(&team, "team", "", "the bond or team it is in (with --teamed yes)")
	f.StringVar(&sole, "sole-uplink", "", "the NIC is the host's only uplink on the switch: on or off")
	f.BoolVar(&clear, "clear", false, "remove every declaration first")
	cmd.AddCommand(declare)
	return cmd
}
