// SPDX-License-Identifier: Apache-2.0

// Package fault is vrdma's fault harness: traffic whose every work request
// is written to a ledger, faults to inject under it, and leak checks on
// the processes that survive them. It is used by the TestFault… system
// tests (tests/fault_test.go) and is meant for a soak command as well: its
// core takes a context and returns errors and reports, never a
// *testing.T.
//
// The pieces:
//
//   - Ledger records each work request posted (QP, ID, opcode, length,
//     the checksum its bytes must have where they land), each completion
//     with its status, the bytes as they landed (checksummed again at the
//     receiver, at the target through a READ back, or at the requester of
//     a READ) and each FETCH_AND_ADD's result. Verify then fails on a WR
//     lost or completed twice, a completion of a WR never posted, a
//     success after an error on the same queue, an error status a run
//     without faults must not see, a byte mismatch, a SEND delivered twice
//     and an atomic executed twice.
//   - Side is one end of a connection (VM, PD, CQs, QP, region); Run
//     drives mixed traffic (SEND, RDMA WRITE verified by a READ back,
//     RDMA READ, FETCH_AND_ADD) from one side to a Target, and a Responder
//     keeps receives posted at the other side and checks every message it
//     gets. The responder may run in this process or in a workload process
//     of its own (Workload, WorkloadMain), which a test can kill.
//   - Resources snapshots what a process holds (descriptors by kind,
//     shared-memory mappings, threads, goroutines) so that a survivor's
//     leak shows as a difference (Resources.Leaks).
//   - NetFaults puts loss and duplication on a link between network
//     namespaces with nftables, Relay reordering and delay (forwarding
//     between two ports of the switch in the bridge's place), and SetLink
//     cuts and restores a link.
//
// Every WR's payload is derived from a seed and the WR's ID (Fill), so a
// receiver in another process recomputes what it must have got.
//
// A round of traffic between two attached VMs, as a soak command makes
// one:
//
//	l := fault.NewLedger()
//	p, err := fault.NewPair(ctx, va, vb, fault.DefaultLayout, fault.DefaultRC, seed, l)
//	if err != nil { … }
//	defer p.Close(ctx)
//	res, err := p.Run(ctx, fault.Config{Seed: seed, WRs: 1000, Window: 16, MaxLen: 2048})
//	// … a fault strikes meanwhile (Config.Progress), more runs follow
//	// (Config.FirstID = res.LastID) …
//	err = p.Finish(ctx)
//	report, err := l.Verify(fault.Policy{}) // fault.Lenient after a kill or a cut for good
//
// With the responder in a workload process instead, StartWorkload and
// Run on the local side (tests/fault_test.go, caseKillWorkload).
package fault
