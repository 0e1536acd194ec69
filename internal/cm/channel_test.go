// SPDX-License-Identifier: Apache-2.0

package cm

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/abi"
)

// stalledChannel is a started channel whose workload does not read its
// end yet: the writer soon blocks on a full socket, then the queue fills.
func stalledChannel(t *testing.T) (*Channel, int) {
	t.Helper()
	c, fd, err := NewChannel("test channel")
	if err != nil {
		t.Fatal(err)
	}
	c.Start(slog.New(slog.DiscardHandler))
	t.Cleanup(func() {
		c.Close()
		unix.Close(fd)
	})
	return c, fd
}

// readEvents reads n event messages from the workload's end fd, each
// decoded into a new value of T.
func readEvents[T any](t *testing.T, fd, n int) []T {
	t.Helper()
	out := make([]T, 0, n)
	buf := make([]byte, 4096)
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	for len(out) < n {
		k, err := unix.Read(fd, buf)
		if err != nil {
			t.Fatalf("after %d of %d events: read: %v", len(out), n, err)
		}
		var e T
		if err := json.Unmarshal(buf[:k], &e); err != nil {
			t.Fatalf("event %d: %v (%q)", len(out), err, buf[:k])
		}
		out = append(out, e)
	}
	return out
}

// TestFaultFullEventQueueKeepsDisconnected: a workload whose rdma_cm
// channel fell behind (a peer's CONNECT_REQUESTs fill its queue, which is
// then lost, as before) still gets its QP's DISCONNECTED and
// TIMEWAIT_EXIT, after every event posted before them.
func TestFaultFullEventQueueKeepsDisconnected(t *testing.T) {
	c, fd := stalledChannel(t)
	accepted := 0
	for i := range 100000 {
		if !c.Post(abi.CMEvent{Event: abi.CMEventConnectRequest, Cookie: 1, ID: uint32(i + 1)}) {
			break
		}
		accepted++
	}
	if accepted < ChannelQueueLen || accepted == 100000 {
		t.Fatalf("%d CONNECT_REQUESTs queued on a channel nobody reads, want at least %d and a refusal", accepted, ChannelQueueLen)
	}
	if !c.Post(abi.CMEvent{Event: abi.CMEventDisconnected, QP: 7}) {
		t.Fatal("DISCONNECTED refused by a full channel: the workload would never learn its connection ended")
	}
	if c.Post(abi.CMEvent{Event: abi.CMEventConnectRequest, Cookie: 1, ID: 999999}) {
		t.Error("a CONNECT_REQUEST accepted behind a waiting DISCONNECTED: the queue is unbounded")
	}
	if !c.Post(abi.CMEvent{Event: abi.CMEventTimewaitExit, QP: 7}) {
		t.Fatal("TIMEWAIT_EXIT refused by a full channel")
	}
	got := readEvents[abi.CMEvent](t, fd, accepted+2)
	for i, e := range got[:accepted] {
		if e.Event != abi.CMEventConnectRequest || e.ID != uint32(i+1) {
			t.Fatalf("event %d: %+v, want CONNECT_REQUEST %d (in order)", i, e, i+1)
		}
	}
	if d, w := got[accepted], got[accepted+1]; d.Event != abi.CMEventDisconnected || d.QP != 7 || w.Event != abi.CMEventTimewaitExit || w.QP != 7 {
		t.Fatalf("last events %+v, %+v; want DISCONNECTED then TIMEWAIT_EXIT of QP 7", d, w)
	}
}

// TestFaultFullEventQueueKeepsQPFatal: an async-event socket whose
// workload does not read it gets every QP's QP_FATAL once it does, in
// order, however many QPs failed meanwhile; a port's state changes while
// it is behind keep the last one.
func TestFaultFullEventQueueKeepsQPFatal(t *testing.T) {
	c, fd := stalledChannel(t)
	const qps = 3 * ChannelQueueLen
	for i := range qps {
		if !c.Post(abi.AsyncEvent{Event: abi.EventQPFatal, QP: uint32(i + 1), QPN: uint32(0x100 + i)}) {
			t.Fatalf("QP_FATAL of QP %d of %d refused: the workload would never learn its QP failed", i+1, qps)
		}
	}
	for _, ev := range []int{abi.EventPortErr, abi.EventPortActive, abi.EventPortErr} {
		if !c.Post(abi.AsyncEvent{Event: ev, Port: 1}) {
			t.Fatalf("port event %d refused", ev)
		}
	}
	got := readEvents[abi.AsyncEvent](t, fd, qps)
	for i, e := range got {
		if e.Event != abi.EventQPFatal || e.QP != uint32(i+1) {
			t.Fatalf("event %d: %+v, want QP_FATAL of QP %d (in order)", i, e, i+1)
		}
	}
	last := readEvents[abi.AsyncEvent](t, fd, 1)[0]
	if last.Event != abi.EventPortErr {
		t.Fatalf("after the QPs' events: %+v, want the port's last state, PORT_ERR", last)
	}
}
