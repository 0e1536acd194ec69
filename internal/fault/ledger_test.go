// SPDX-License-Identifier: Apache-2.0

package fault

import (
	"strings"
	"testing"

	"github.com/vrdma/vrdma"
)

const qpA, qpB = 0x11, 0x22

// payload returns n bytes of WR id's payload and their checksum.
func payload(id uint64, n int) ([]byte, uint64) {
	b := make([]byte, n)
	Fill(b, 7, id)
	return b, Sum(b)
}

// history is a ledger fed a clean run: a SEND delivered, a WRITE read
// back, a READ, two FETCH_ADDs and the counter, each completed once in
// order, and the receive that took the SEND.
func history(t *testing.T) *Ledger {
	t.Helper()
	l := NewLedger()
	_, sendSum := payload(1, 100)
	_, writeSum := payload(2, 200)
	l.Posted(WR{QPN: qpB, ID: recvIDBase, Op: OpRecv})
	l.Posted(WR{QPN: qpA, ID: 1, Op: OpSend, Len: 100, Sum: sendSum})
	l.Posted(WR{QPN: qpA, ID: 2, Op: OpWrite, Len: 200, Sum: writeSum})
	l.Posted(WR{QPN: qpA, ID: 3, Op: OpRead, Len: 200, Sum: writeSum}) // the WRITE read back
	l.Posted(WR{QPN: qpA, ID: 4, Op: OpFetchAdd})
	l.Posted(WR{QPN: qpA, ID: 5, Op: OpFetchAdd})
	l.Posted(WR{QPN: qpA, ID: 6, Op: OpReadCounter})
	l.Completed(vrdma.WorkCompletion{WRID: recvIDBase, QPNum: qpB, Status: vrdma.WCSuccess, Opcode: vrdma.WCRecv, ByteLen: 100})
	l.Landed(qpA, 1, 100, sendSum)
	for id := uint64(1); id <= 6; id++ {
		l.Completed(vrdma.WorkCompletion{WRID: id, QPNum: qpA, Status: vrdma.WCSuccess})
	}
	l.Landed(qpA, 2, 200, writeSum)
	l.Landed(qpA, 3, 200, writeSum)
	l.Fetched(qpA, 4, 0)
	l.Fetched(qpA, 5, 1)
	l.Counter(2)
	return l
}

func TestFaultLedgerClean(t *testing.T) {
	l := history(t)
	// The books close: the receive still posted flushes.
	l.Posted(WR{QPN: qpB, ID: recvIDBase + 1, Op: OpRecv})
	l.CloseBooks()
	l.Completed(vrdma.WorkCompletion{WRID: recvIDBase + 1, QPNum: qpB, Status: vrdma.WCWRFlushErr, Opcode: vrdma.WCRecv})
	r, err := l.Verify(Policy{})
	if err != nil {
		t.Fatalf("a clean history fails: %v", err)
	}
	if r.Posted != 8 || r.Completed != 8 || r.Verified != 3 || r.Lost != 0 || r.Mismatches != 0 || r.Duplicates != 0 {
		t.Errorf("report %s: want 8 posted and completed, 3 verified, nothing lost, duplicated or mismatched", r)
	}
	t.Log(r)
}

// TestFaultLedgerCatches feeds the ledger histories with one fault each and
// checks that Verify names it: the harness is able to fail.
func TestFaultLedgerCatches(t *testing.T) {
	_, sendSum := payload(1, 100)
	cases := []struct {
		name   string
		policy Policy
		spoil  func(l *Ledger)
		want   string
	}{
		{"lost WR", Policy{}, func(l *Ledger) {
			l.Posted(WR{QPN: qpA, ID: 9, Op: OpSend, Len: 10, Sum: 1})
		}, "lost: WR 9"},
		{"completed twice", Policy{}, func(l *Ledger) {
			l.Completed(vrdma.WorkCompletion{WRID: 2, QPNum: qpA, Status: vrdma.WCSuccess})
		}, "WR 2 (WRITE, 200 bytes) on QP 0x11 completed twice"},
		{"completion never posted", Policy{}, func(l *Ledger) {
			l.Completed(vrdma.WorkCompletion{WRID: 77, QPNum: qpA, Status: vrdma.WCSuccess})
		}, "WR 77 on QP 0x11, which was never posted"},
		{"byte mismatch", Policy{}, func(l *Ledger) {
			bad, sum := payload(8, 64)
			bad[40] ^= 1
			l.Posted(WR{QPN: qpA, ID: 8, Op: OpRead, Len: 64, Sum: sum})
			l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCSuccess})
			l.Landed(qpA, 8, 64, Sum(bad))
		}, "byte mismatch: WR 8"},
		{"short message", Policy{}, func(l *Ledger) {
			l.Posted(WR{QPN: qpA, ID: 8, Op: OpSend, Len: 64, Sum: 5})
			l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCSuccess})
			l.Landed(qpA, 8, 32, 5)
		}, "32 bytes of checksum"},
		{"landed, never posted", Policy{}, func(l *Ledger) {
			l.Landed(qpA, 66, 10, 1)
		}, "10 bytes landed for WR 66 of QP 0x11, which was never posted"},
		{"SEND delivered twice", Policy{}, func(l *Ledger) {
			l.Landed(qpA, 1, 100, sendSum)
		}, "WR 1 (SEND, 100 bytes) on QP 0x11 delivered twice"},
		{"SEND never delivered", Policy{}, func(l *Ledger) {
			l.Posted(WR{QPN: qpA, ID: 8, Op: OpSend, Len: 64, Sum: 5})
			l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCSuccess})
		}, "its bytes were never seen where they land"},
		{"error without a fault", Policy{}, func(l *Ledger) {
			l.Posted(WR{QPN: qpA, ID: 8, Op: OpSend, Len: 64, Sum: 5})
			l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCRetryExcErr})
		}, "a status this run must not see"},
		{"receive flushed mid-run", Policy{}, func(l *Ledger) {
			l.Posted(WR{QPN: qpB, ID: recvIDBase + 1, Op: OpRecv})
			l.Completed(vrdma.WorkCompletion{WRID: recvIDBase + 1, QPNum: qpB, Status: vrdma.WCWRFlushErr})
		}, "a status this run must not see"},
		{"status outside the policy", Lenient, func(l *Ledger) {
			l.Posted(WR{QPN: qpA, ID: 8, Op: OpSend, Len: 64, Sum: 5})
			l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCRemAccessErr})
		}, "a status this run must not see"},
		{"success after an error", Lenient, func(l *Ledger) {
			l.Posted(WR{QPN: qpA, ID: 8, Op: OpFetchAdd})
			l.Posted(WR{QPN: qpA, ID: 9, Op: OpFetchAdd})
			l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCRetryExcErr})
			l.Completed(vrdma.WorkCompletion{WRID: 9, QPNum: qpA, Status: vrdma.WCSuccess})
			l.Fetched(qpA, 9, 1)
		}, "after an error every later WR must flush"},
		{"out of order", Policy{}, func(l *Ledger) {
			l.Posted(WR{QPN: qpA, ID: 8, Op: OpFetchAdd})
			l.Posted(WR{QPN: qpA, ID: 9, Op: OpFetchAdd})
			l.Completed(vrdma.WorkCompletion{WRID: 9, QPNum: qpA, Status: vrdma.WCSuccess})
			l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCSuccess})
		}, "completed out of order"},
		{"atomic executed twice", Policy{}, func(l *Ledger) {
			l.Posted(WR{QPN: qpA, ID: 8, Op: OpFetchAdd})
			l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCSuccess})
			l.Fetched(qpA, 8, 1) // as WR 5 did
			l.Counter(3)
		}, "both returned 1"},
		{"counter beyond the adds", Policy{}, func(l *Ledger) {
			l.Counter(3)
		}, "the FETCH_ADD target holds 3 after 2 adds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := history(t)
			c.spoil(l)
			_, err := l.Verify(c.policy)
			if err == nil {
				t.Fatalf("Verify passed a history with %s", c.name)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Verify: %v\nwant a violation containing %q", err, c.want)
			}
		})
	}
}

// TestFaultLedgerExcuses: after a kill, the dead side's outstanding WRs
// are abandoned, not lost, and its peer's successful SENDs may have no
// delivery on record; nothing else is excused.
func TestFaultLedgerExcuses(t *testing.T) {
	l := history(t)
	l.Posted(WR{QPN: qpB, ID: recvIDBase + 1, Op: OpRecv})
	l.Posted(WR{QPN: qpA, ID: 8, Op: OpSend, Len: 64, Sum: 5})
	l.Posted(WR{QPN: qpA, ID: 9, Op: OpSend, Len: 64, Sum: 6})
	l.Posted(WR{QPN: qpA, ID: 10, Op: OpSend, Len: 64, Sum: 6})
	l.Completed(vrdma.WorkCompletion{WRID: 8, QPNum: qpA, Status: vrdma.WCSuccess})
	l.Completed(vrdma.WorkCompletion{WRID: 9, QPNum: qpA, Status: vrdma.WCRetryExcErr})
	l.Completed(vrdma.WorkCompletion{WRID: 10, QPNum: qpA, Status: vrdma.WCWRFlushErr})
	if _, err := l.Verify(Lenient); err == nil {
		t.Fatal("Verify passed with a receive outstanding and a SEND never delivered")
	}
	l.Abandon(qpB, "workload killed")
	l.PeerGone(qpA, "workload killed")
	r, err := l.Verify(Lenient)
	if err != nil {
		t.Fatal(err)
	}
	if r.Abandoned != 1 || r.Unverified != 1 {
		t.Errorf("report %s: want 1 abandoned, 1 unverified", r)
	}
	if _, err := l.Verify(Policy{}); err == nil {
		t.Error("Verify with no error allowed passed a RETRY_EXC_ERR")
	}
}

func TestFaultFillDeterministic(t *testing.T) {
	a, b := make([]byte, 1001), make([]byte, 1001)
	Fill(a, 3, 42)
	Fill(b, 3, 42)
	if string(a) != string(b) {
		t.Fatal("Fill gives different bytes for the same seed and ID")
	}
	if id, ok := PayloadID(a); !ok || id != 42 {
		t.Fatalf("PayloadID = %d, %v; want 42", id, ok)
	}
	Fill(b, 3, 43)
	if string(a[8:]) == string(b[8:]) {
		t.Fatal("Fill gives the same bytes for two IDs")
	}
}
