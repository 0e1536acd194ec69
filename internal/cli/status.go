// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
)

// statusReport is what status prints (-o json).
type statusReport struct {
	Socket       string `json:"socket"`
	AgentVersion string `json:"agent_version"`
	vrdma.Status
}

func (a *app) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the agent's VMs, adapters and QPs with their paths",
		Long: `status asks the agent for its VMs (attached to a workload, or only defined),
their adapters, and every QP with its state, its peer, and the path it takes
(memcpy, tcp, rdma) with the reason it was chosen.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, agentVersion, err := a.agentStatus(cmd, "status")
			if err != nil {
				return err
			}
			rep := statusReport{Socket: a.socket, AgentVersion: agentVersion, Status: st}
			if rep.VMs == nil {
				rep.VMs = []vrdma.VMStatus{}
			}
			if a.json() {
				return a.printJSON(rep)
			}
			printStatus(a.stdout, rep)
			return nil
		},
	}
}

func vmState(v *vrdma.VMStatus) string {
	if n := len(v.Processes); v.Attached && n > 1 {
		return fmt.Sprintf("attached (%d workloads)", n)
	}
	if v.Attached {
		return "attached"
	}
	return "defined"
}

func vmMemory(v *vrdma.VMStatus) string {
	s := mib(v.MemSize)
	if v.Attached {
		if v.MemLocked {
			s += ", locked"
		} else {
			s += ", unlocked"
		}
	}
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func printStatus(w io.Writer, rep statusReport) {
	fmt.Fprintf(w, "host %s (host ID %s), agent %s at %s\n", rep.Host, rep.HostID, rep.AgentVersion, rep.Socket)
	if p := rep.PVRDMA; p != nil {
		fmt.Fprintf(w, "PVRDMA address %s, %s, firewall rule pvrdma %s\n", orDash(p.Address), pvrdmaListening(p), onOff(p.Firewall))
	}
	for _, r := range rep.RDMA {
		fmt.Fprintf(w, "RDMA uplink %s (RoCE %s): %d packets in, %d dropped from peers that are not vrdma hosts of the switch\n",
			r.Address, orDash(r.RoCE), r.PacketsIn, r.NotVRDMA)
		if r.CMIn+r.CMOut > 0 {
			fmt.Fprintf(w, "  RDMA CM on QP1 (native endpoints): %d MADs in, %d out, %d dropped, %d resent, %d timed out, %d rejects sent, %d requests refused (listener without native endpoints)\n",
				r.CMIn, r.CMOut, r.CMDropped, r.CMResent, r.CMTimedOut, r.CMRejected, r.CMRefusedNotNative)
		}
	}
	fmt.Fprintln(w)
	defer printUplinks(w, rep.Uplinks)
	if len(rep.VMs) == 0 {
		fmt.Fprintln(w, "no VMs: define one with 'vrdmactl vm define NAME FILE.vmx'")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VM\tSTATE\tMEMORY\tASYNC\tADAPTERS")
	nqp := 0
	var hidden []string
	defer func() {
		if len(hidden) > 0 {
			fmt.Fprintf(w, "QPs and processes of %s not shown: other users' VMs (their owner and root see them)\n", strings.Join(hidden, ", "))
		}
	}()
	for i := range rep.VMs {
		v := &rep.VMs[i]
		var ads []string
		for _, ad := range v.Adapters {
			s := ad.Name
			if ad.IPv4 != "" {
				s += " " + ad.IPv4
			}
			if !ad.GID.IsZero() {
				s += " " + ad.GID.String()
			}
			ads = append(ads, s)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.Name, vmState(v), vmMemory(v), onOff(v.AsyncMode), strings.Join(ads, ", "))
		nqp += len(v.QPs)
		if v.ObjectsHidden {
			hidden = append(hidden, v.Name)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	if nqp == 0 {
		fmt.Fprintln(w, "no QPs")
		return
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "QPN\tADAPTER\tSTATE\tPEER\tPEER QPN\tPATH\tREASON")
	for _, v := range rep.VMs {
		for _, q := range v.QPs {
			peer, peerQPN, path := "-", "-", "-"
			if q.Peer != "" {
				peer = q.Peer
			}
			if q.PeerQPN != 0 {
				peerQPN = fmt.Sprintf("0x%06x", q.PeerQPN)
			}
			if q.Path.Path != "" {
				path = string(q.Path.Path)
			}
			reason := q.Path.Reason
			for i, r := range q.Path.Rejected {
				if i == 0 {
					reason += "; rejected: "
				} else {
					reason += "; "
				}
				reason += string(r.Path) + ": " + r.Why
			}
			fmt.Fprintf(tw, "0x%06x\t%s/%s\t%s\t%s\t%s\t%s\t%s\n", q.QPN, v.Name, q.Adapter, q.State, peer, peerQPN, path, reason)
		}
	}
	tw.Flush()
}

// pvrdmaListening says where the agent accepts other hosts' connections.
func pvrdmaListening(p *vrdma.PVRDMAStatus) string {
	switch {
	case p.Listening != "":
		return "listening on " + p.Listening
	case p.Error != "":
		return "not listening: " + p.Error
	case p.Address == "":
		return "no tcp path (vrdmactl host configure HOST --pvrdma-address ADDR:PORT)"
	}
	return "not listening"
}

// printUplinks prints the host's links to other hosts (the tcp path), if
// it has any.
func printUplinks(w io.Writer, ups []vrdma.UplinkStatus) {
	if len(ups) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "UPLINK (tcp) TO	ADDRESS	STATE	CONNS	BYTES OUT	BYTES IN	FRAMES OUT	FRAMES IN	DIALS	REFUSED	LAST ERROR")
	for _, u := range ups {
		peer := u.PeerHost
		if peer == "" {
			peer = u.PeerHostID
		}
		addr := u.Address
		if addr == "" {
			addr = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", peer, addr, u.State, u.Conns, u.BytesOut, u.BytesIn,
			u.FramesOut, u.FramesIn, u.Dials, u.Refused, u.LastError)
	}
	tw.Flush()
}
