// SPDX-License-Identifier: Apache-2.0

// Package control is the root of vrdma's control plane: the shared
// inventory of distributed switches, port groups, hosts, VMs and their
// adapters, kept in etcd (docs/control-plane.md). It holds
// no code; the work is split into packages of one job each:
//
//   - records: the typed records (Switch, PortGroup, Host, VM, Adapter,
//     Endpoint, Alive), their validation and the key layout. Pure, no etcd.
//   - store: the Store over go.etcd.io/etcd/client/v3. It runs an embedded
//     single-node etcd when no endpoints are given, or connects to an
//     external cluster. Every write is a compare-and-swap transaction.
//   - member: host membership under a lease (a host whose lease expired is
//     shown down) and the watch-driven Cache that agents serve lookups
//     from: endpoint resolution ("vm/vrdmaN" or a GID) and path decisions.
//   - pathsel: the one pure, deterministic, symmetric function that picks a
//     pair's path (memcpy, rdma or tcp) by PVRDMA's rules; rdma only when
//     the RoCE network checks of package netcheck pass, as the switch's
//     network policy says (docs/network.md).
//   - etcdtest: helpers that start real embedded etcd members (one, or a
//     three-member cluster) for tests.
//
// # Key layout
//
// Every key lives under [records.Prefix], "/vrdma/v1/". The "v1" is the
// layout version: a change to the layout that old agents cannot read moves
// to "/vrdma/v2/". Each value is a JSON object that carries its own schema
// version and kind ({"schema":1,"kind":"host",...}), so a record written
// by a newer build is recognised and skipped, never misread.
//
//	/vrdma/v1/switches/<switch>                  records.Switch
//	/vrdma/v1/portgroups/<key>                   records.PortGroup (key e.g. dvportgroup-80)
//	/vrdma/v1/hosts/<host-id>                    records.Host (durable; no lease)
//	/vrdma/v1/alive/<host-id>                    records.Alive, bound to the host's lease
//	/vrdma/v1/vms/<vm>                           records.VM
//	/vrdma/v1/adapters/<vm>/<vrdmaN>             records.Adapter
//	/vrdma/v1/endpoints/gid/<gid>                records.Endpoint (directory by GID)
//	/vrdma/v1/endpoints/name/<vm>/<vrdmaN>       records.Endpoint (directory by name)
//	/vrdma/v1/mcast/<pg>/<gid>/<host-id>/<vm>/<vrdmaN>/<n>
//	                                             a multicast membership: no value, bound to the host's lease
//
// Names (switches, port-group keys, host IDs, VMs) are 1–64 characters of
// letters, digits, '.', '_' and '-', starting with a letter or digit, so a
// '/' never appears inside one segment and every key parses back.
package control
