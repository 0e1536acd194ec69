// SPDX-License-Identifier: Apache-2.0

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/abi"
)

// devinfoHCA is one adapter in devinfo's report (-o json prints them).
type devinfoHCA struct {
	HCAID  string           `json:"hca_id"`
	MAC    string           `json:"mac"`
	IPv4   string           `json:"ipv4,omitempty"`
	IPv6   string           `json:"ipv6,omitempty"`
	Device vrdma.DeviceAttr `json:"device"`
	Ports  []devinfoPort    `json:"ports"`
}

type devinfoPort struct {
	Port int `json:"port"`
	vrdma.PortAttr
}

type devinfoReport struct {
	VM   string       `json:"vm"`
	Host string       `json:"host"`
	HCAs []devinfoHCA `json:"hcas"`
}

func (a *app) devinfoCommand() *cobra.Command {
	var vmName string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "devinfo --vm NAME [-v]",
		Short: "Show a VM's RDMA adapters, like ibv_devinfo",
		Long: `devinfo prints, for each vrdma adapter of a VM, what ibv_devinfo prints for an
HCA: hca_id, transport, firmware, GUIDs, vendor, port state, MTUs, link layer
and GID; -v adds the device limits (max_qp, max_qp_wr, max_sge, max_cq, max_cqe,
max_mr, max_mr_size, max_pd, max_qp_rd_atom, max_inline_data, atomic_cap, ...).

Querying an adapter needs the VM attached, so devinfo attaches the VM for a
moment, beside any workloads that have it (a VM whose memory is reserved and
locked takes one workload at a time: devinfo fails while one holds it).`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if vmName == "" {
				return usageErrorf("devinfo: --vm NAME is required: devinfo attaches the VM to query its adapters")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			rep, err := a.devinfo(ctx, vmName)
			if err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(rep)
			}
			printDevinfo(a.stdout, rep, verbose)
			return nil
		},
	}
	cmd.Flags().StringVar(&vmName, "vm", "", "the VM whose adapters to show (required)")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print the device limits too")
	return cmd
}

func (a *app) devinfo(ctx context.Context, name string) (devinfoReport, error) {
	v, err := vrdma.Open(ctx, name, vrdma.WithSocket(a.socket))
	if err != nil {
		var ae *vrdma.Error
		if errors.As(err, &ae) && ae.Code == abi.CodeExists {
			return devinfoReport{}, fmt.Errorf("devinfo attaches VM %q to query its adapters, but a workload holds it (%s): run devinfo while the VM is free", name, ae.Message)
		}
		return devinfoReport{}, err
	}
	defer v.Close()
	rep := devinfoReport{VM: v.Name(), Host: v.Host()}
	for _, ad := range v.Adapters() {
		dev, err := ad.QueryDevice(ctx)
		if err != nil {
			return rep, fmt.Errorf("query device %s: %w", ad.Name(), err)
		}
		port, err := ad.QueryPort(ctx)
		if err != nil {
			return rep, fmt.Errorf("query port 1 of %s: %w", ad.Name(), err)
		}
		h := devinfoHCA{HCAID: ad.Name(), MAC: ad.MAC().String(), Device: dev, Ports: []devinfoPort{{Port: 1, PortAttr: port}}}
		if ip := ad.IPv4(); ip.IsValid() {
			h.IPv4 = ip.String()
		}
		if ip := ad.IPv6(); ip.IsValid() {
			h.IPv6 = ip.String()
		}
		rep.HCAs = append(rep.HCAs, h)
	}
	return rep, nil
}

// mtuEnum is ibv_mtu's value for an MTU in bytes.
func mtuEnum(m uint32) int {
	for i, v := range []uint32{256, 512, 1024, 2048, 4096} {
		if v == m {
			return i + 1
		}
	}
	return 0
}

func portStateEnum(s string) int {
	switch s {
	case "PORT_DOWN":
		return 1
	case "PORT_INIT":
		return 2
	case "PORT_ARMED":
		return 3
	case "PORT_ACTIVE":
		return 4
	case "PORT_ACTIVE_DEFER":
		return 5
	}
	return 0
}

// printDevinfo prints rep in ibv_devinfo's layout.
func printDevinfo(w io.Writer, rep devinfoReport, verbose bool) {
	for i, h := range rep.HCAs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		d := &h.Device
		fmt.Fprintf(w, "hca_id:\t%s\n", h.HCAID)
		fmt.Fprintf(w, "\ttransport:\t\t\t%s\n", d.TransportType)
		fmt.Fprintf(w, "\tfw_ver:\t\t\t\t%s\n", d.FWVer)
		fmt.Fprintf(w, "\tnode_guid:\t\t\t%s\n", d.NodeGUID)
		fmt.Fprintf(w, "\tsys_image_guid:\t\t\t%s\n", d.SysImageGUID)
		fmt.Fprintf(w, "\tvendor_id:\t\t\t0x%04x\n", d.VendorID)
		fmt.Fprintf(w, "\tvendor_part_id:\t\t\t%d\n", d.VendorPartID)
		fmt.Fprintf(w, "\thw_ver:\t\t\t\t0x%X\n", d.HWVer)
		if h.IPv4 != "" {
			fmt.Fprintf(w, "\tipv4:\t\t\t\t%s\n", h.IPv4)
		}
		if h.IPv6 != "" {
			fmt.Fprintf(w, "\tipv6:\t\t\t\t%s\n", h.IPv6)
		}
		if verbose {
			fmt.Fprintf(w, "\tmax_mr_size:\t\t\t0x%x\n", d.MaxMRSize)
			fmt.Fprintf(w, "\tpage_size_cap:\t\t\t0x%x\n", d.PageSizeCap)
			fmt.Fprintf(w, "\tmax_qp:\t\t\t\t%d\n", d.MaxQP)
			fmt.Fprintf(w, "\tmax_qp_wr:\t\t\t%d\n", d.MaxQPWR)
			fmt.Fprintf(w, "\tmax_sge:\t\t\t%d\n", d.MaxSGE)
			fmt.Fprintf(w, "\tmax_cq:\t\t\t\t%d\n", d.MaxCQ)
			fmt.Fprintf(w, "\tmax_cqe:\t\t\t%d\n", d.MaxCQE)
			fmt.Fprintf(w, "\tmax_mr:\t\t\t\t%d\n", d.MaxMR)
			fmt.Fprintf(w, "\tmax_pd:\t\t\t\t%d\n", d.MaxPD)
			fmt.Fprintf(w, "\tmax_qp_rd_atom:\t\t\t%d\n", d.MaxQPRdAtom)
			fmt.Fprintf(w, "\tmax_qp_init_rd_atom:\t\t%d\n", d.MaxQPInitRdAtom)
			fmt.Fprintf(w, "\tmax_inline_data:\t\t%d\n", d.MaxInlineData)
			fmt.Fprintf(w, "\tatomic_cap:\t\t\t%s\n", d.AtomicCap)
			fmt.Fprintf(w, "\tmax_srq:\t\t\t%d\n", d.MaxSRQ)
		}
		fmt.Fprintf(w, "\tphys_port_cnt:\t\t\t%d\n", d.PhysPortCnt)
		for _, p := range h.Ports {
			fmt.Fprintf(w, "\t\tport:\t%d\n", p.Port)
			fmt.Fprintf(w, "\t\t\tstate:\t\t\t%s (%d)\n", p.State, portStateEnum(p.State))
			fmt.Fprintf(w, "\t\t\tmax_mtu:\t\t%d (%d)\n", p.MaxMTU, mtuEnum(p.MaxMTU))
			fmt.Fprintf(w, "\t\t\tactive_mtu:\t\t%d (%d)\n", p.ActiveMTU, mtuEnum(p.ActiveMTU))
			fmt.Fprintf(w, "\t\t\tsm_lid:\t\t\t0\n\t\t\tport_lid:\t\t0\n\t\t\tport_lmc:\t\t0x00\n")
			fmt.Fprintf(w, "\t\t\tlink_layer:\t\t%s\n", p.LinkLayer)
			if verbose {
				fmt.Fprintf(w, "\t\t\tport_cap_flags:\t\t%s\n", strings.Join(p.PortCapFlags, ", "))
				fmt.Fprintf(w, "\t\t\tgid_tbl_len:\t\t%d\n", p.GIDTblLen)
				fmt.Fprintf(w, "\t\t\tactive_speed:\t\t%s\n", p.ActiveSpeed)
				fmt.Fprintf(w, "\t\t\tmac:\t\t\t%s\n", p.MAC)
			}
			fmt.Fprintf(w, "\t\t\tGID[  0]:\t\t%s\n", p.GID)
		}
	}
}
