// SPDX-License-Identifier: Apache-2.0

// Package vrdma_test holds vrdma's system tests: black-box tests of the
// client library (package vrdma) against real agents, in this process
// (internal/testenv's Start) or as processes of their own, on every path —
// the conformance suite on each (TestConformance/...), the RC rules and
// their clock, connection management and rdma_cm events, lifecycle and
// hostile clients, the tcp path's configuration and faults, scale and
// allocation counts. They use only the library's public API, the ABI
// (internal/abi) where they play a raw or hostile client, and the test
// support packages (testenv, testlink, rdmatest, libdiag); the layout
// follows gVisor's tests/ and Tailscale's tstest/integration.
package vrdma_test
