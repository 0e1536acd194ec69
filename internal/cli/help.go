// SPDX-License-Identifier: Apache-2.0

package cli

import "github.com/spf13/cobra"

// The man-page part of every command's --help: a Long description for the
// commands whose definition has none, and the Examples section of each.
// TestHelpTexts fails for a runnable command that lacks Short, Long or
// Example, or whose examples do not run it.

// manualPage is a command's description and examples.
type manualPage struct {
	long    string // used when the command defines no Long of its own
	example string
}

var manual = map[string]manualPage{
	"vrdmactl": {example: `  vrdmactl quickstart                     # see RDMA between VMs on this machine, no setup
  vrdmactl doctor                         # check this host
  vrdmactl status -o json                 # the agent's VMs and QPs
  source <(vrdmactl completion bash)      # tab completion in this shell`},
	"vrdmactl switch delete": {example: `  vrdmactl portgroup delete dvportgroup-10   # its port groups first
  vrdmactl switch delete dvs1`},
	"vrdmactl portgroup delete": {example: `  vrdmactl vm power-off web                  # a VM's adapter on it: power the VM off first
  vrdmactl portgroup delete dvportgroup-10`},
	"vrdmactl devinfo": {example: `  vrdmactl devinfo --vm vm1
  vrdmactl devinfo --vm vm1 -v            # with the device limits (max_qp, max_mr, ...)
  vrdmactl devinfo --vm vm1 -o json`},
	"vrdmactl host": {
		long: `host lists, shows and configures the hosts of the control plane: each host
is an agent (vrdmad) that registered under a lease, with its switch, its PVRDMA
address, its RDMA uplinks and its place in the inventory. A host shows down when
its agent stops renewing the lease.`,
		example: `  vrdmactl host list
  vrdmactl host show esx1
  vrdmactl host configure esx1 --pvrdma-address 10.0.0.11:4791 --firewall-pvrdma on`},
	"vrdmactl host configure": {example: `  vrdmactl host configure esx1 --pvrdma-address 10.0.0.11:4791 --firewall-pvrdma on
  vrdmactl host configure esx1 --datacenter dc1 --cluster c1
  vrdmactl host configure esx1 --maintenance on
  vrdmactl host configure esx1 --pvrdma-address none`},
	"vrdmactl host list": {
		long: `list prints every host of the control plane: its name and ID, up or down
(up while its agent holds its lease), its switch, PVRDMA address, pvrdma
firewall rule, RDMA uplinks, the age of its lease and its agent's version.`,
		example: `  vrdmactl host list
  vrdmactl host list -o json
  vrdmactl --etcd-endpoints https://etcd1:2379 host list`},
	"vrdmactl host remove": {example: `  vrdmactl host remove esx3               # a host that is down, e.g. decommissioned`},
	"vrdmactl host forget-key": {example: `  vrdmactl host forget-key esx3           # esx3 was reinstalled: pin the key its record now publishes
  vrdmactl host forget-key 0123456789abcdef0123456789abcdef --state-dir /var/lib/vrdma`},
	"vrdmactl host show": {
		long: `show prints one host (by name or ID): its state and lease, switch, PVRDMA
address and firewall rule, its agent, its RDMA uplinks with their declared and
observed NIC state, its place in the inventory, and the VMs on it.`,
		example: `  vrdmactl host show esx1
  vrdmactl host show esx1 -o json`},
	"vrdmactl host uplink": {
		long: `uplink declares what an RDMA uplink's NIC does for lossless Ethernet (PFC,
pause, trust, MTU, teaming), for NICs whose kernel cannot report it; the RoCE
network checks (vrdmactl network check) and path selection read the
declaration.`,
		example: `  vrdmactl host uplink declare esx1 rocev2-soft/10.0.1.11 --pfc 3 --pause off --trust dscp --mtu 9000 --teamed no`},
	"vrdmactl host uplink declare": {example: `  vrdmactl host uplink declare esx1 rocev2-soft/10.0.1.11 --pfc 3 --pause off --trust dscp --mtu 9000 --teamed no
  vrdmactl host uplink declare esx1 rocev2-soft/10.0.1.11 --clear     # forget the declaration`},
	"vrdmactl inventory": {example: `  vrdmactl inventory
  vrdmactl inventory --datacenter dc1
  vrdmactl inventory -o json`},
	"vrdmactl network": {
		long: `network runs the RoCE network checks: lossless layer 2 (PFC or
global pause), a VLAN with PFC, a lossless layer 3 for RoCE v2 (routers map the
priority to DSCP and keep it), no teamed RoCE NICs, and the MTU. See
docs/network.md.`,
		example: `  vrdmactl network check
  vrdmactl network check --switch dvs1 -o json
  vrdmactl network check --config network.yaml`},
	"vrdmactl network check": {example: `  vrdmactl network check
  vrdmactl network check --switch dvs1
  vrdmactl network check --config network.yaml -o json
  vrdmactl network check --local-host none   # the declarations only, no kernel state`},
	"vrdmactl path": {
		long: `path explains the path decision between two adapters: memcpy on one host,
rdma between two hosts with RDMA uplinks on the switch whose network passes the
RoCE checks, tcp otherwise, with every candidate rejected and why.`,
		example: `  vrdmactl path explain vm1/vrdma0 vm2/vrdma0`},
	"vrdmactl path explain": {example: `  vrdmactl path explain vm1/vrdma0 vm2/vrdma0
  vrdmactl path explain vm1/vrdma0 vm3/vrdma1 -o json`},
	"vrdmactl perf": {example: `  vrdmactl perf write_bw --local -s 65536 -n 1000
  vrdmactl perf write_lat --local --path tcp
  vrdmactl perf read_bw --local --path rdma -a
  vrdmactl perf send_bw --local --async --out_json --out_json_file bw.json`},
	"vrdmactl portgroup": {example: `  vrdmactl portgroup create dvportgroup-10 --switch dvs1 --vlan 10 --pfc-priority 3 --dscp 26 --roce-version v2
  vrdmactl portgroup list --switch dvs1
  vrdmactl portgroup set dvportgroup-10 --roce-mtu 4096`},
	"vrdmactl portgroup create": {
		long: `create adds distributed port group KEY to switch --switch: its VLAN, the
802.1Q priority RoCE traffic uses (PFC), the DSCP its packets carry, the RoCE
version and the RoCE MTU. VMs' adapters join it with ethernetN.dvs.portgroupId.`,
		example: `  vrdmactl portgroup create dvportgroup-10 --switch dvs1 --vlan 10
  vrdmactl portgroup create dvportgroup-20 --switch dvs1 --vlan 20 --pfc-priority 3 --dscp 26 --roce-version v2 --roce-mtu 4096`},
	"vrdmactl portgroup list": {
		long:    `list prints the port groups of every switch, or of --switch only: key, name, switch, VLAN, PFC priority, DSCP and RoCE version.`,
		example: "  vrdmactl portgroup list\n  vrdmactl portgroup list --switch dvs1 -o json"},
	"vrdmactl portgroup set": {example: `  vrdmactl portgroup set dvportgroup-10 --vlan 11
  vrdmactl portgroup set dvportgroup-10 --pfc-priority 3 --dscp 26 --roce-version v2 --roce-mtu 4096`},
	"vrdmactl portgroup show": {
		long:    `show prints one port group: its switch, VLAN, PFC priority, DSCP, RoCE version and MTU.`,
		example: "  vrdmactl portgroup show dvportgroup-10\n  vrdmactl portgroup show dvportgroup-10 -o json"},
	"vrdmactl quickstart": {example: `  vrdmactl quickstart
  vrdmactl quickstart -o json`},
	"vrdmactl status": {example: `  vrdmactl status
  vrdmactl status -o json
  vrdmactl --socket /run/vrdma/vrdmad.sock status`},
	"vrdmactl switch": {example: `  vrdmactl switch create dvs1 --mtu 9000
  vrdmactl switch list
  vrdmactl switch set dvs1 --network-policy warn`},
	"vrdmactl switch create": {
		long: `create adds distributed switch NAME to the control plane: its MTU, its
network policy (how path selection obeys the RoCE network checks: strict, warn
or off) and its uplink policy. Hosts join it with vrdmad --switch NAME.`,
		example: `  vrdmactl switch create dvs1
  vrdmactl switch create dvs1 --mtu 9000 --network-policy strict`},
	"vrdmactl switch list": {
		long:    `list prints the distributed switches of the control plane: name, UUID, MTU, uplink policy, and how many port groups and hosts each has.`,
		example: "  vrdmactl switch list\n  vrdmactl switch list -o json"},
	"vrdmactl switch router": {
		long: `router declares the routers between a switch's hosts, the layer-3 hops of
RoCE v2: the subnets each joins, how it maps the RoCE priority to DSCP, whether
it keeps DSCP unchanged or copies PCP, and its MTU. The roce-l3-lossless check
reads them.`,
		example: `  vrdmactl switch router set dvs1 r1 --subnet 10.0.1.0/24 --subnet 10.0.2.0/24 --dscp-map 3:26 --dscp-preserved on
  vrdmactl switch router remove dvs1 r1`},
	"vrdmactl switch router remove": {
		long:    `remove deletes router ROUTER's declaration from switch SWITCH.`,
		example: "  vrdmactl switch router remove dvs1 r1"},
	"vrdmactl switch router set": {example: `  vrdmactl switch router set dvs1 r1 --subnet 10.0.1.0/24 --subnet 10.0.2.0/24 --dscp-map 3:26 --dscp-preserved on
  vrdmactl switch router set dvs1 r1 --mtu 9000 --pcp-copied on`},
	"vrdmactl switch set": {example: `  vrdmactl switch set dvs1 --network-policy warn
  vrdmactl switch set dvs1 --mtu 9000 --uplink-policy failover`},
	"vrdmactl switch show": {
		long:    `show prints one distributed switch: its UUID, MTU and policies, routers, port groups and hosts.`,
		example: "  vrdmactl switch show dvs1\n  vrdmactl switch show dvs1 -o json"},
	"vrdmactl vm": {
		long: `vm runs vSphere's VM procedures: create a powered-off VM, add PVRDMA
adapters on a port group, reserve all guest memory, set advanced parameters,
then power it on (every rule against the VM and the host) and off. define is
the quick path: a VMX stored on this agent's host, powered on at once.`,
		example: `  vrdmactl vm create vm1 --memory 4096 --guest-os ubuntu-64 --hw-version 20
  vrdmactl vm edit vm1 --add-adapter --portgroup dvportgroup-10
  vrdmactl vm reserve-memory vm1 --all
  vrdmactl vm power-on vm1 --host esx1
  vrdmactl vm list`},
	"vrdmactl vm create": {example: `  vrdmactl vm create vm1 --memory 4096 --guest-os ubuntu-64 --hw-version 20
  vrdmactl vm create vm2 --memory 8192 --guest-os ubuntu-64 --hw-version 20 --host esx1 --datacenter dc1 --folder f1 --resource-pool rp1`},
	"vrdmactl vm define": {example: `  vrdmactl vm define vm1 vm1.vmx
  vrdmactl vm define vm1 - < vm1.vmx
  vrdmactl vm define vm1 vm1.vmx --owner 1000:1000`},
	"vrdmactl vm edit": {example: `  vrdmactl vm edit vm1 --add-adapter --portgroup dvportgroup-10
  vrdmactl vm edit vm1 --remove-adapter 1`},
	"vrdmactl vm list": {example: `  vrdmactl vm list
  vrdmactl vm list --cluster c1
  vrdmactl vm list --datacenter dc1 --host esx1 -o json`},
	"vrdmactl vm connect": {example: `  vrdmactl vm connect vm1 vrdma0
  vrdmactl vm connect vm1 ethernet1 -o json`},
	"vrdmactl vm disconnect": {example: `  vrdmactl vm disconnect vm1 vrdma0
  vrdmactl vm set vm1 ethernet0.startConnected=FALSE   # down at the next attach`},
	"vrdmactl vm power-off": {example: `  vrdmactl vm power-off vm1`},
	"vrdmactl vm power-on": {example: `  vrdmactl vm power-on vm1
  vrdmactl vm power-on vm1 --host esx2`},
	"vrdmactl vm reserve-memory": {example: `  vrdmactl vm reserve-memory vm1 --all`},
	"vrdmactl vm set": {example: `  vrdmactl vm set vm1 vrdma.asyncMode=TRUE sched.cpu.latencySensitivity=high
  vrdmactl vm set vm1 vrdma1.nativeEndpointSupport=TRUE
  vrdmactl vm set vm1 --unset vrdma.asyncMode`},
	"vrdmactl vm show": {example: `  vrdmactl vm show vm1
  vrdmactl vm show vm1 --vmx
  vrdmactl vm show vm1 -o json`},
	"vrdmactl vm undefine": {
		long: `undefine removes VM NAME: a VM defined on this agent (vm define) when no
workload is attached to it, a managed VM (vm create) when it is powered off.
Only its owner or root may.`,
		example: "  vrdmactl vm undefine vm1"},
	"vrdmactl vmx": {
		long: `vmx lints real vSphere .vmx files against the PVRDMA prerequisites — the
rules that refuse a power-on in vrdma — for a target ESXi version. See
docs/vmx-rules.md.`,
		example: `  vrdmactl vmx check --esxi 7.0U1 rdma-node1.vmx
  vrdmactl vmx rules`},
	"vrdmactl vmx check": {example: `  vrdmactl vmx check rdma-node1.vmx rdma-node2.vmx
  vrdmactl vmx check --esxi 7.0U1 rdma-node1.vmx
  vrdmactl vmx check --host esx1 - < rdma-node1.vmx
  vrdmactl vmx check -o json *.vmx`},
	"vrdmactl vmx rules": {
		long:    `rules lists the rules vmx check and vm power-on apply: each one's stable ID, its severity and what it checks.`,
		example: "  vrdmactl vmx rules\n  vrdmactl vmx rules -o json"},
	"vrdmactl help": {example: `  vrdmactl help
  vrdmactl help vm power-on`},
	"vrdmactl completion": {example: `  source <(vrdmactl completion bash)
  vrdmactl completion bash > /etc/bash_completion.d/vrdmactl
  vrdmactl completion zsh > "${fpath[1]}/_vrdmactl"
  vrdmactl completion fish > ~/.config/fish/completions/vrdmactl.fish`},
	"vrdmactl completion bash": {example: `  source <(vrdmactl completion bash)
  vrdmactl completion bash > /etc/bash_completion.d/vrdmactl`},
	"vrdmactl completion zsh":        {example: `  vrdmactl completion zsh > "${fpath[1]}/_vrdmactl"`},
	"vrdmactl completion fish":       {example: `  vrdmactl completion fish > ~/.config/fish/completions/vrdmactl.fish`},
	"vrdmactl completion powershell": {example: `  vrdmactl completion powershell | Out-String | Invoke-Expression`},
}

// addManual adds cobra's help and completion commands to root (so that
// they get their examples too) and applies the manual to every command.
func addManual(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if p, ok := manual[c.CommandPath()]; ok {
			if c.Long == "" {
				c.Long = p.long
			}
			if c.Example == "" {
				c.Example = p.example
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}
