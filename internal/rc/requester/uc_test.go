// SPDX-License-Identifier: Apache-2.0

package requester

import (
	"testing"

	"github.com/vrdma/vrdma/internal/abi"
)

// TestEngineUC runs the engine in UC mode over a wire that answers
// nothing and loses a request packet in five: every WR completes with
// success once its packets left, in order, each packet sent exactly once
// (no retransmission, no timeout, no retry spent, no wait), messages
// longer than the outstanding-PSN bound included.
func TestEngineUC(t *testing.T) {
	sq, w, r := setup(t, Config{Outstanding: 8, BatchBytes: 4096})
	sq.attrs.UC = true
	w.dropReq = func(n int, _ pkt) bool { return n%5 == 0 }
	w.dropResp = func(int, resp) bool { return true } // a UC responder answers nothing
	want := 0
	for i := range 40 {
		op, n := abi.OpRDMAWrite, 1000 // 4 packets at MTU 256
		switch i % 4 {
		case 1:
			op, n = abi.OpSend, 300
		case 2:
			op, n = abi.OpSendWithImm, 5000 // 20 packets: beyond the outstanding bound
		case 3:
			op, n = abi.OpRDMAWriteWithImm, 1
		}
		sq.post(abi.SendWQE{Opcode: op}, n)
		want += (n + 255) / 256
	}
	run(t, sq, r)
	if len(sq.done) != len(sq.wqes) {
		t.Fatalf("%d completions for %d WRs", len(sq.done), len(sq.wqes))
	}
	for i, c := range sq.done {
		if c.st != abi.WCSuccess || c.n != uint32(len(sq.local[i])) {
			t.Fatalf("WR %d completed %s with %d bytes, want SUCCESS with %d", i, c.st, c.n, len(sq.local[i]))
		}
	}
	r.wire.Collect() // the packets of the last batch reach the wire's count
	if w.nreq != want || w.timeouts != 0 || sq.ctr.Retries.Load() != 0 || len(sq.sleeps) != 0 {
		t.Errorf("%d request packets sent for %d, %d timeouts, %d retries, sleeps %v: want each once and none of the rest",
			w.nreq, want, w.timeouts, sq.ctr.Retries.Load(), sq.sleeps)
	}
}
