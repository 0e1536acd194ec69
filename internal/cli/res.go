// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
)

// resRow is one workload process's objects on one adapter.
type resRow struct {
	VM string `json:"vm"`
	vrdma.ProcessResources
}

// resQP is one QP with the process that holds it.
type resQP struct {
	VM      string `json:"vm"`
	PID     int32  `json:"pid"`
	Adapter string `json:"adapter"`
	QPN     uint32 `json:"qpn"`
	State   string `json:"state"`
	Peer    string `json:"peer,omitempty"`
	Path    string `json:"path"`
}

// resReport is what res prints (-o json).
type resReport struct {
	Resources []resRow `json:"resources"`
	QPs       []resQP  `json:"qps,omitempty"`
}

func (a *app) resCommand() *cobra.Command {
	var qps bool
	c := &cobra.Command{
		Use:   "res [VM] [--qp]",
		Short: "Show the PDs, MRs, CQs, QPs and SRQs each workload process holds, like rdma res",
		Long: `res shows, as rdma res does for a device, the verbs objects each workload
process holds on each adapter of its VM: protection domains, memory regions
(and the bytes they cover), completion queues, queue pairs and shared receive
queues. --qp lists the QPs too, with the process that created each, its state,
peer and path. Only the VMs you may see (yours; root: all) have their objects
listed.`,
		Example: `  vrdmactl res
  vrdmactl res vm1 --qp -o json`,
		Args: rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, _, err := a.agentStatus(cmd, "res")
			if err != nil {
				return err
			}
			rep := resReport{Resources: []resRow{}}
			found := false
			for _, v := range st.VMs {
				if len(args) == 1 && v.Name != args[0] {
					continue
				}
				found = true
				for _, r := range v.Resources {
					rep.Resources = append(rep.Resources, resRow{VM: v.Name, ProcessResources: r})
				}
				if qps {
					for _, q := range v.QPs {
						rep.QPs = append(rep.QPs, resQP{VM: v.Name, PID: q.PID, Adapter: q.Adapter, QPN: q.QPN, State: q.State, Peer: q.Peer, Path: string(q.Path.Path)})
					}
				}
			}
			if len(args) == 1 && !found {
				return fmt.Errorf("res: the agent knows no VM %q ('vrdmactl vm list' lists them)", args[0])
			}
			if a.json() {
				return a.printJSON(rep)
			}
			if len(rep.Resources) == 0 {
				fmt.Fprintln(a.stdout, "no workload holds any object (none is attached, or its VM is another user's)")
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "VM\tPID\tADAPTER\tPD\tMR\tMR BYTES\tCQ\tQP\tSRQ")
			for _, r := range rep.Resources {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", r.VM, r.PID, r.Adapter, r.PDs, r.MRs, r.MRBytes, r.CQs, r.QPs, r.SRQs)
			}
			if err := tw.Flush(); err != nil || !qps {
				return err
			}
			fmt.Fprintln(a.stdout)
			tw = tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "VM\tPID\tADAPTER\tQPN\tSTATE\tPEER\tPATH")
			for _, q := range rep.QPs {
				fmt.Fprintf(tw, "%s\t%d\t%s\t0x%x\t%s\t%s\t%s\n", q.VM, q.PID, q.Adapter, q.QPN, q.State, q.Peer, q.Path)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&qps, "qp", false, "list the QPs too, with their processes")
	return c
}
