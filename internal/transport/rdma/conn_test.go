package rdma

import (
	"net/netip"
	"testing"
)

// TestWriteToAllocs checks that sending a datagram, with or without a TOS
// byte, allocates nothing: it runs for every packet.
func TestWriteToAllocs(t *testing.T) {
	c, err := ListenUDP(netip.MustParseAddrPort("127.0.33.12:4791"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dst := c.LocalAddr()
	payload := make([]byte, 64)
	bufs := [][]byte{payload[:12], payload[12:]}
	for _, tos := range []uint8{0, 26 << 2} {
		if n := testing.AllocsPerRun(200, func() {
			if err := c.WriteTo(bufs, dst, tos); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("WriteTo with TOS %#x: %v allocations per datagram, want 0", tos, n)
		}
	}
}
