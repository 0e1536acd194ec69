// SPDX-License-Identifier: Apache-2.0

package vrdma_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

// nativeBenchReport is the part of vrdmactl native-peer --bench -o json
// the test reads.
type nativeBenchReport struct {
	Role       string  `json:"role"`
	Test       string  `json:"test"`
	Path       string  `json:"path"`
	MsgSize    int     `json:"msg_size"`
	Iterations int     `json:"iterations"`
	BWAverage  float64 `json:"bw_average_mibps"`
	TTypical   float64 `json:"t_typical_us"`
}

// TestNativePeerBench: vrdmactl native-peer --bench runs perftest's tests
// between the plain peer, in a namespace of its own with no agent, and a
// VM adapter with native endpoints: RDMA WRITE bandwidth with the VM
// measuring, RDMA READ latency with the plain peer measuring. Both sides
// report the active side's figures, the moved bytes pass through host A's
// RoCEv2 engine, and sides that name different tests refuse each other.
func TestNativePeerBench(t *testing.T) {
	peerAddr := netip.MustParseAddr("10.199.1.202")
	_, ha, ns := nativeCMHost(t, peerAddr)
	vmSide := func(args ...string) *nativeSide {
		return startNative(t, ha.Netns, append([]string{"--socket", ha.Socket, "-o", "json", "native-peer", "--vm", "nat", "--timeout", "45s"}, args...)...)
	}
	peerSide := func(args ...string) *nativeSide {
		return startNative(t, ns, append([]string{"-o", "json", "native-peer", "--address", peerAddr.String(), "--timeout", "45s"}, args...)...)
	}
	report := func(what string, s *nativeSide) nativeBenchReport {
		t.Helper()
		out, err := s.wait(t)
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		var r nativeBenchReport
		// The JSON document ends the output; the passive side says it
		// waits first.
		if err := json.Unmarshal([]byte(out[max(strings.LastIndex(out, "\n{"), 0):]), &r); err != nil {
			t.Fatalf("%s: the report is not JSON: %v\n%s", what, err, out)
		}
		t.Logf("%s: %+v", what, r)
		return r
	}

	// RDMA WRITE bandwidth, 64 KiB × 2,000, the VM's side measuring.
	before := rdmaStatus(t, ha.Socket)
	peer := peerSide("--bench", "write_bw")
	vm := vmSide("--bench", "write_bw", "-s", "65536", "-n", "2000", peerAddr.String())
	vr, pr := report("the VM's side, active", vm), report("the plain peer, passive", peer)
	for _, r := range []nativeBenchReport{vr, pr} {
		if r.Test != "write_bw" || r.Path != "rdma" || r.MsgSize != 65536 || r.Iterations != 2000 || r.BWAverage <= 0 {
			t.Errorf("write_bw report %+v: want write_bw over rdma, 65536 bytes × 2000, a bandwidth", r)
		}
	}
	if vr.Role != "active" || pr.Role != "passive" || vr.BWAverage != pr.BWAverage {
		t.Errorf("the passive side reports %+v, the active %+v: want the active side's figures on both", pr, vr)
	}
	after := rdmaStatus(t, ha.Socket)
	if moved := after.BytesOut - before.BytesOut; moved < 2000*65536 {
		t.Errorf("host A's RoCEv2 engine sent %d bytes during a write_bw of 2000 × 64 KiB: the run did not go through it", moved)
	}

	// RDMA READ latency, 8 bytes × 500, the plain peer measuring.
	vm = vmSide("--bench", "read_lat", "-p", "18519")
	peer = peerSide("--bench", "read_lat", "-n", "500", "-p", "18519", ha.Addr().String())
	pr, vr = report("the plain peer, active", peer), report("the VM's side, passive", vm)
	if pr.Test != "read_lat" || pr.Path != "rdma" || pr.Iterations != 500 || pr.TTypical <= 0 || vr.TTypical != pr.TTypical {
		t.Errorf("read_lat reports: active %+v, passive %+v", pr, vr)
	}

	// Different tests on the two sides: refused by the passive one.
	peer = peerSide("--bench", "write_bw", "-p", "18520")
	vm = vmSide("--bench", "read_lat", "-p", "18520", peerAddr.String())
	pout, perr := peer.wait(t)
	vout, verr := vm.wait(t)
	if perr == nil || !strings.Contains(pout, "give both sides the same --bench") || verr == nil {
		t.Errorf("write_bw against read_lat: the passive side %v:\n%s\nthe active side %v:\n%s", perr, pout, verr, vout)
	}
}
