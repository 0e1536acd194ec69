// SPDX-License-Identifier: Apache-2.0

package sys

import (
	"net"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openFDs counts this process's open descriptors (/proc/self/fd): in a
// test of the agent's socket code, the agent's.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// received makes n real descriptors, as the kernel installs those an
// SCM_RIGHTS message brings, and returns them.
func received(t *testing.T, n int) []int {
	t.Helper()
	fds := make([]int, n)
	for i := range fds {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds[i] = fd
	}
	return fds
}

// TestSecurityMalformedCmsgClosesFDs: control data that does not parse
// is refused and the descriptors it brought — installed in the agent by
// the kernel already — are closed, not leaked: well-formed SCM_RIGHTS
// messages before a bad header, an SCM_RIGHTS message cut short, and one
// followed by a header too short for itself. Well-formed data gives its
// descriptors to the caller.
func TestSecurityMalformedCmsgClosesFDs(t *testing.T) {
	badHeader := func(length uint64) []byte {
		b := make([]byte, unix.CmsgSpace(0))
		h := (*unix.Cmsghdr)(unsafePointer(b))
		h.Level, h.Type = unix.SOL_SOCKET, unix.SCM_RIGHTS
		h.SetLen(int(length))
		return b
	}
	cases := []struct {
		name string
		oob  func(fds []int) []byte
	}{
		{"rights-then-overlong-header", func(fds []int) []byte {
			return append(unix.UnixRights(fds...), badHeader(1000)...)
		}},
		{"rights-then-short-header", func(fds []int) []byte {
			return append(unix.UnixRights(fds...), badHeader(4)...)
		}},
		{"rights-cut-short", func(fds []int) []byte {
			b := unix.UnixRights(fds...)
			h := (*unix.Cmsghdr)(unsafePointer(b))
			h.SetLen(unix.CmsgLen(4 * (len(fds) + 2))) // claims two more than the data holds
			return b[:unix.CmsgLen(4*len(fds))]
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			fds, err := takeRights(tc.oob(received(t, 3)))
			if err == nil {
				closeFDs(fds)
				t.Fatalf("malformed control data accepted, giving %d descriptors", len(fds))
			}
			if after := openFDs(t); after != before {
				t.Fatalf("%d descriptors leaked (%d open before, %d after): %v", after-before, before, after, err)
			}
		})
	}
	t.Run("well-formed", func(t *testing.T) {
		want := received(t, 2)
		fds, err := takeRights(unix.UnixRights(want...))
		if err != nil || len(fds) != 2 || fds[0] != want[0] || fds[1] != want[1] {
			t.Fatalf("takeRights = %v, %v; want %v", fds, err, want)
		}
		closeFDs(fds)
	})
	t.Run("too-many-over-a-socket", func(t *testing.T) {
		// The real path: a client sends more descriptors than a message may
		// carry; the kernel installs those that fit and says the control
		// data was cut (MSG_CTRUNC); Recv closes them.
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(sp[0]), "agent end")
		nc, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		p := NewPacketConn(nc.(*net.UnixConn))
		defer p.Close()
		defer unix.Close(sp[1])
		sent := received(t, MaxFDsPerMessage+3)
		if err := unix.Sendmsg(sp[1], []byte("x"), unix.UnixRights(sent...), nil, 0); err != nil {
			t.Fatal(err)
		}
		closeFDs(sent)
		before := openFDs(t)
		if _, fds, err := p.Recv(make([]byte, 64)); err == nil {
			t.Fatalf("a message with %d descriptors accepted (%d given)", len(sent), len(fds))
		}
		if after := openFDs(t); after != before {
			t.Fatalf("%d descriptors leaked by Recv", after-before)
		}
	})
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
