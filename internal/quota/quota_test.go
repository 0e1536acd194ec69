// SPDX-License-Identifier: Apache-2.0

package quota

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/abi"
)

func TestLedgerPerUser(t *testing.T) {
	l := New(Limits{SessionsPerUser: 2, RingMemoryPerUser: 1 << 20}, 500)
	for i := 0; i < 2; i++ {
		if err := l.Take(1000, Sessions, 1); err != nil {
			t.Fatalf("session %d: %v", i, err)
		}
	}
	err := l.Take(1000, Sessions, 1)
	if !errors.Is(err, abi.ErrLimit) || !strings.Contains(err.Error(), "limit sessions-per-user: uid 1000 has 2") || !strings.Contains(err.Error(), "--max-sessions-per-user") {
		t.Fatalf("third session: %v", err)
	}
	if err := l.Take(1001, Sessions, 1); err != nil {
		t.Fatalf("another uid: %v", err)
	}
	for _, uid := range []uint32{0, 500} { // root and the agent's user
		for i := 0; i < 5; i++ {
			if err := l.Take(uid, Sessions, 1); err != nil {
				t.Fatalf("exempt uid %d: %v", uid, err)
			}
		}
	}
	l.Give(1000, Sessions, 1)
	if err := l.Take(1000, Sessions, 1); err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	if err := l.Take(1000, RingMemory, 1<<20); err != nil {
		t.Fatal(err)
	}
	err = l.Take(1000, RingMemory, 4096)
	if !errors.Is(err, abi.ErrLimit) || !strings.Contains(err.Error(), "holds 1 MiB of QP and CQ rings and asks for 4 KiB more, over the limit of 1 MiB (vrdmad --max-ring-memory-per-user") {
		t.Fatalf("ring memory: %v", err)
	}
	if got := l.Used(1000, RingMemory); got != 1<<20 {
		t.Fatalf("used %d after a refusal, want 1 MiB", got)
	}
}

func TestLedgerPinned(t *testing.T) {
	l := New(Limits{PinnedMemory: 3 << 30, PinUIDs: []uint32{1002}}, 500)
	if !l.MayPin(0) || !l.MayPin(500) || !l.MayPin(1002) || l.MayPin(1000) {
		t.Fatal("MayPin: want root, the agent's user and the listed uid only")
	}
	if err := l.TakePinned("a", 2<<30); err != nil {
		t.Fatal(err)
	}
	err := l.TakePinned("b", 2<<30)
	if !errors.Is(err, abi.ErrLimit) || !strings.Contains(err.Error(), "limit pinned-memory-budget") || !strings.Contains(err.Error(), "--pinned-memory-budget") {
		t.Fatalf("over the budget: %v", err)
	}
	l.GivePinned(2 << 30)
	if err := l.TakePinned("b", 2<<30); err != nil {
		t.Fatalf("after a VM left: %v", err)
	}
}

func TestLedgerWrites(t *testing.T) {
	now := time.Unix(1000000, 0)
	l := New(Limits{VMWriteBytesPerHour: 1000}, 500)
	l.now = func() time.Time { return now }
	for i := 0; i < 4; i++ {
		if err := l.TakeWrite(1000, 250); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		now = now.Add(time.Minute)
	}
	if err := l.TakeWrite(1000, 1); !errors.Is(err, abi.ErrLimit) || !strings.Contains(err.Error(), "limit vm-write-bytes-per-hour") {
		t.Fatalf("over the hour's bytes: %v", err)
	}
	if err := l.TakeWrite(0, 1<<20); err != nil {
		t.Fatalf("root: %v", err)
	}
	now = now.Add(57 * time.Minute) // the first write is an hour old
	if err := l.TakeWrite(1000, 250); err != nil {
		t.Fatalf("an hour later: %v", err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{"4096": 4096, "4K": 4096, "1GiB": 1 << 30, "512MiB": 512 << 20, "2gb": 2 << 30, "1T": 1 << 40} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "101%", "0%", "99999999999T"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q): no error", in)
		}
	}
	if n, err := ParseSize("50%"); err != nil || n == 0 {
		t.Errorf("ParseSize(50%%) = %d, %v", n, err)
	}
}
