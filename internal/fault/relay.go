// SPDX-License-Identifier: Apache-2.0

package fault

// Reordering and delay on real links. They need a queue, which nftables
// has not, and the kernel's queue that has them, netem, is a module
// (sch_netem) that kernels do not always carry. So a Relay takes the
// link's place: an nftables rule drops every frame of the link as it
// enters, and the relay — which read the frame first, through an
// AF_PACKET socket (taps see a frame before the ingress hook) — sends it
// on itself, on time, late, or after the frame that followed it.
//
// Between network namespaces (StartRelay) the link is two ports of the
// switch: the rule drops what enters either port, and the relay sends it
// out of the other. On the loopback interface (StartLoopbackRelay) the
// link is the packets between two addresses: the rule drops those that
// lack the relay's mark, and the relay sends them into lo again with it
// (SO_MARK), a socket filter keeping its own copies from it.
//
// Goroutines: one reader per socket, owned by the Relay, forwarding what
// it reads; the timers of delayed and held frames send them from timer
// goroutines. Remove stops the timers and the readers, waits for the
// readers, and removes the drop rule.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/sys"
)

// Queueing is how often a frame is reordered or delayed, as probabilities
// in [0, 1], and by how much.
type Queueing struct {
	// Reorder: the frame is held until the next frame in its direction
	// has gone out (or DelayBy has passed, if none comes), then sent.
	Reorder float64
	// Delay: the frame is sent DelayBy late; the frames behind it pass it.
	Delay float64
	// DelayBy is how long a delayed frame waits, and the longest a
	// reordered one is held; 0 means 2 ms.
	DelayBy time.Duration
	// Seed makes the draws repeatable.
	Seed uint64
}

// String names the faults: "reorder 1%, delay 0% (2ms)".
func (q Queueing) String() string {
	return fmt.Sprintf("reorder %g%%, delay %g%% (%v)", 100*q.Reorder, 100*q.Delay, q.delayBy())
}

func (q Queueing) delayBy() time.Duration {
	if q.DelayBy <= 0 {
		return 2 * time.Millisecond
	}
	return q.DelayBy
}

func (q Queueing) check() error {
	if q.Reorder < 0 || q.Reorder > 1 || q.Delay < 0 || q.Delay > 1 || q.Reorder+q.Delay > 1 {
		return fmt.Errorf("fault: queueing faults %s: each must be in [0, 1], and their sum too", q)
	}
	return nil
}

// relayTable is the nftables table that keeps a switch's bridge from
// carrying what the relay carries, in the switch's namespace. On lo, the
// table's name ends with the two addresses, so that relays between other
// pairs of addresses may run beside it.
const relayTable = "vrdma_fault_relay"

// relayMark marks the packets a loopback relay sends ("vr" in ASCII), so
// that the drop rule lets them pass and the relay does not read them.
const relayMark = 0x7672

// vnetHdrLen is the size of the virtio_net_hdr that PACKET_VNET_HDR puts
// in front of each frame: it carries a segmentation offload's parameters
// (a veth or lo passes TCP's 64 KiB segments whole) from where a frame is
// read to where it is sent, so it is segmented, or checksummed, there as
// it would have been.
const vnetHdrLen = 10

// relayFrameMax bounds a frame the relay reads: a 64 KiB segment, its
// Ethernet header and the virtio header.
const relayFrameMax = 65536 + 14 + vnetHdrLen

// relayRcvBuf is the receive buffer of a relay's socket: 64 MiB, thousands
// of 64 KiB segments, so that no frame is lost while its reader waits for
// a core (the link no longer carries it).
const relayRcvBuf = 64 << 20

// Relay carries the frames of a link in both directions, reordering and
// delaying some. Its counters may be read while it runs.
type Relay struct {
	netns string // "" for this process's namespace
	table string
	q     Queueing
	socks []*os.File // read, one goroutine each
	raw   *os.File   // on lo, where packets are sent
	// emit sends a frame of direction d on, as it was read (virtio
	// header first).
	emit func(d int, frame []byte) error
	// dir says which direction a frame read from socket i goes.
	dir func(i int, frame []byte) int
	wg  sync.WaitGroup

	mu sync.Mutex
	// +checklocks:mu
	closing bool
	// held is, per direction, a reordered frame waiting for the next.
	// +checklocks:mu
	held [2][]byte
	// holdT is the timer that sends held[d] if no frame follows it.
	// +checklocks:mu
	holdT [2]*time.Timer
	// late is the delayed frames, by their timer.
	// +checklocks:mu
	late map[*time.Timer][]byte

	// Forwarded, Reordered and Delayed count frames sent on, held behind
	// their successor and sent late; SendErrors counts frames refused
	// where they were sent (a port that is down loses them, as a cable
	// would).
	Forwarded, Reordered, Delayed, SendErrors atomic.Uint64
}

// StartRelay puts q on the frames that enter the switch in namespace
// netns through ports (exactly two: the switch's ends of two hosts'
// veths), forwarding them itself from one port to the other. The bridge
// forwards nothing between them until Remove. It needs root.
func StartRelay(ctx context.Context, netns string, ports []string, q Queueing) (*Relay, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	if len(ports) != 2 {
		return nil, fmt.Errorf("fault: a relay joins exactly two ports, got %v", ports)
	}
	r := &Relay{netns: netns, table: relayTable, q: q, late: map[*time.Timer][]byte{}}
	for _, p := range ports {
		f, err := openPacket(netns, p, nil)
		if err != nil {
			r.closeSocks()
			return nil, fmt.Errorf("fault: relay port %s in namespace %s: %w", p, netns, err)
		}
		r.socks = append(r.socks, f)
	}
	r.emit = func(d int, frame []byte) error {
		_, err := r.socks[1-d].Write(frame)
		return err
	}
	r.dir = func(i int, _ []byte) int { return i }
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s {\n", relayTable)
	for i, p := range ports {
		fmt.Fprintf(&b, "  chain in%d {\n    type filter hook ingress device %q priority -10; policy accept;\n    counter drop\n  }\n", i, p)
	}
	b.WriteString("}\n")
	if err := r.start(ctx, b.String()); err != nil {
		return nil, fmt.Errorf("fault: relay %s between %v: %w", q, ports, err)
	}
	return r, nil
}

// StartLoopbackRelay puts q on the IPv4 packets between loopback
// addresses a and b (both ways), carrying them itself. It needs root and
// nftables; one relay at a time between two addresses.
func StartLoopbackRelay(ctx context.Context, a, b netip.Addr, q Queueing) (*Relay, error) {
	if err := q.check(); err != nil {
		return nil, err
	}
	if !a.Is4() || !b.Is4() || !a.IsLoopback() || !b.IsLoopback() || a == b {
		return nil, fmt.Errorf("fault: loopback relay between %s and %s: both must be IPv4 loopback addresses, and two", a, b)
	}
	filter, err := loopbackFilter(a, b)
	if err != nil {
		return nil, fmt.Errorf("fault: loopback relay between %s and %s: %w", a, b, err)
	}
	f, err := openPacket("", "lo", filter)
	if err != nil {
		return nil, fmt.Errorf("fault: loopback relay between %s and %s: %w", a, b, err)
	}
	table := relayTable + "_" + strings.NewReplacer(".", "_").Replace(a.String()+"_"+b.String())
	r := &Relay{table: table, q: q, late: map[*time.Timer][]byte{}, socks: []*os.File{f}}
	raw, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fault: loopback relay between %s and %s: raw IP socket: %w (needs root: CAP_NET_RAW)", a, b, err)
	}
	if err := unix.SetsockoptInt(raw, unix.SOL_SOCKET, unix.SO_MARK, relayMark); err != nil {
		unix.Close(raw)
		f.Close()
		return nil, fmt.Errorf("fault: loopback relay between %s and %s: mark its packets: %w", a, b, err)
	}
	r.raw = os.NewFile(uintptr(raw), "relay:raw")
	r.emit = func(d int, frame []byte) error {
		ps, err := localPackets(frame)
		if err != nil {
			return err
		}
		for _, ip := range ps {
			if err := unix.Sendto(raw, ip, 0, &unix.SockaddrInet4{Addr: [4]byte(ip[16:20])}); err != nil {
				return err
			}
		}
		return nil
	}
	src := a.As4()
	r.dir = func(_ int, frame []byte) int {
		if len(frame) >= vnetHdrLen+14+16 && [4]byte(frame[vnetHdrLen+14+12:]) == src {
			return 0
		}
		return 1
	}
	var rule strings.Builder
	fmt.Fprintf(&rule, "table netdev %s {\n  chain in {\n    type filter hook ingress device \"lo\" priority -10; policy accept;\n", table)
	for _, d := range [][2]netip.Addr{{a, b}, {b, a}} {
		fmt.Fprintf(&rule, "    meta mark != %#x ip saddr %s ip daddr %s counter drop\n", relayMark, d[0], d[1])
	}
	rule.WriteString("  }\n}\n")
	if err := r.start(ctx, rule.String()); err != nil {
		return nil, fmt.Errorf("fault: loopback relay %s between %s and %s: %w", q, a, b, err)
	}
	return r, nil
}

// loopbackFilter is a socket filter that takes the IPv4 packets between a
// and b that do not carry the relay's mark (on lo, after the Ethernet
// header of zeros). The socket is one of all protocols (ETH_P_ALL), as
// those of one protocol see a frame only after the ingress hook, where
// the relay's rule has dropped it.
func loopbackFilter(a, b netip.Addr) ([]bpf.RawInstruction, error) {
	av, bv := binary.BigEndian.Uint32(a.AsSlice()), binary.BigEndian.Uint32(b.AsSlice())
	const reject, accept = 0, 0xffffffff
	return bpf.Assemble([]bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtMark},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: relayMark, SkipTrue: 9},
		bpf.LoadAbsolute{Off: 12, Size: 2}, // EtherType
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.ETH_P_IP, SkipTrue: 7},
		bpf.LoadAbsolute{Off: 14 + 12, Size: 4}, // source
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: av, SkipFalse: 2},
		bpf.LoadAbsolute{Off: 14 + 16, Size: 4}, // destination
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: bv, SkipTrue: 4, SkipFalse: 3},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: bv, SkipFalse: 2},
		bpf.LoadAbsolute{Off: 14 + 16, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: av, SkipTrue: 1},
		bpf.RetConstant{Val: reject},
		bpf.RetConstant{Val: accept},
	})
}

// start puts rules in place (the relay's sockets are open, so from then on
// every frame they drop is read by the relay) and starts the readers.
func (r *Relay) start(ctx context.Context, rules string) error {
	if _, err := nft(ctx, r.netns, rules, "-f", "-"); err != nil {
		r.closeSocks()
		return err
	}
	for i, f := range r.socks {
		rng := rand.New(rand.NewPCG(r.q.Seed, uint64(i)))
		r.wg.Go(func() { r.forward(i, f, rng) })
	}
	return nil
}

// openPacket opens an AF_PACKET socket on interface ifname in namespace
// netns ("" for this one) that reads the frames entering it that filter
// (if any) takes — not the ones sent out of it —, virtio
// header first. What it sends carries the relay's mark.
func openPacket(netns, ifname string, filter []bpf.RawInstruction) (*os.File, error) {
	var f *os.File
	open := func() error {
		ifi, err := netInterfaceIndex(ifname)
		if err != nil {
			return err
		}
		// Protocol 0: the socket takes no frame until it is bound to
		// ifname, after its filter. Opened for ETH_P_ALL, it took every
		// interface's frames from the start, and forwarded those that
		// came before the filter: other programs' packets, sent twice.
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w (needs root: CAP_NET_RAW)", err)
		}
		for _, o := range [][3]int{
			{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1},
			{unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1},
			{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, relayRcvBuf},
			{unix.SOL_SOCKET, unix.SO_MARK, relayMark},
		} {
			if err := unix.SetsockoptInt(fd, o[0], o[1], o[2]); err != nil {
				unix.Close(fd)
				return fmt.Errorf("setsockopt %d/%d: %w", o[0], o[1], err)
			}
		}
		if filter != nil {
			ins := make([]unix.SockFilter, len(filter))
			for k, in := range filter {
				ins[k] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
			}
			prog := unix.SockFprog{Len: uint16(len(ins)), Filter: &ins[0]}
			if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
				unix.Close(fd)
				return fmt.Errorf("attach the socket filter: %w", err)
			}
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind to %s: %w", ifname, err)
		}
		f = os.NewFile(uintptr(fd), "relay:"+ifname)
		return nil
	}
	if netns == "" {
		return f, open()
	}
	return f, sys.InNetns(netns, open)
}

// virtioGSOUDPL4 is the virtio header's gso_type of a UDP GSO datagram
// (VIRTIO_NET_HDR_GSO_UDP_L4): one datagram of the sender's, to be cut
// into gso_size pieces where it leaves.
const virtioGSOUDPL4 = 5

// localPackets returns the IPv4 packets in frame (virtio header, Ethernet
// header, packet), read on lo, to be sent into lo again through a raw IP
// socket: as packets sent on this host, so that they are routed as such
// (a packet with a loopback source that merely enters lo is a martian).
// What a device would have done to the packet is done first: its
// transport checksum, left to the device on lo, is completed, and a UDP
// GSO datagram is cut into its datagrams, each with its own lengths and
// checksum. (A TCP segment of 64 KiB stays whole: lo's MTU takes it.)
func localPackets(frame []byte) ([][]byte, error) {
	if len(frame) < vnetHdrLen+14+20 {
		return nil, fmt.Errorf("a frame of %d bytes is no IPv4 packet", len(frame))
	}
	hdr, pkt := frame[:vnetHdrLen], frame[vnetHdrLen:]
	ip := pkt[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < 20 || len(ip) < ihl {
		return nil, fmt.Errorf("no IPv4 header in a frame of %d bytes", len(frame))
	}
	if hdr[1] == virtioGSOUDPL4 {
		return cutUDP(ip, ihl, int(binary.LittleEndian.Uint16(hdr[4:])))
	}
	if hdr[0]&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
		start := int(binary.LittleEndian.Uint16(hdr[6:]))
		at := start + int(binary.LittleEndian.Uint16(hdr[8:]))
		if start < 14+ihl || at+2 > len(pkt) {
			return nil, fmt.Errorf("checksum at %d from %d outside the packet of a frame of %d bytes", at, start, len(pkt))
		}
		sum := ^onesSum(pkt[start:])
		if sum == 0 && ip[9] == unix.IPPROTO_UDP {
			sum = 0xffff
		}
		binary.BigEndian.PutUint16(pkt[at:], sum)
	}
	return [][]byte{ip}, nil
}

// cutUDP cuts the UDP GSO datagram in IPv4 packet ip (header ihl bytes)
// into datagrams of size bytes of payload (the last one shorter), each
// with its IP and UDP lengths and its UDP checksum. The raw socket fills
// in each IP header's checksum and, when 0, its ID.
func cutUDP(ip []byte, ihl, size int) ([][]byte, error) {
	if ip[9] != unix.IPPROTO_UDP || len(ip) < ihl+8 || size <= 0 {
		return nil, fmt.Errorf("a UDP GSO frame with no UDP datagram to cut (protocol %d, %d bytes, pieces of %d)", ip[9], len(ip), size)
	}
	var out [][]byte
	for payload := ip[ihl+8:]; len(payload) > 0; {
		n := min(size, len(payload))
		p := make([]byte, ihl+8+n)
		copy(p, ip[:ihl+8])
		copy(p[ihl+8:], payload[:n])
		payload = payload[n:]
		binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
		binary.BigEndian.PutUint16(p[4:], 0) // ID: the kernel's
		udp := p[ihl:]
		binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
		binary.BigEndian.PutUint16(udp[6:], 0)
		var pseudo [12]byte
		copy(pseudo[:], p[12:20])
		pseudo[9] = unix.IPPROTO_UDP
		binary.BigEndian.PutUint16(pseudo[10:], uint16(len(udp)))
		sum := ^onesSum2(pseudo[:], udp)
		if sum == 0 {
			sum = 0xffff
		}
		binary.BigEndian.PutUint16(udp[6:], sum)
		out = append(out, p)
	}
	return out, nil
}

// onesSum is the ones' complement sum of b, as the Internet checksum
// takes it (RFC 1071).
func onesSum(b []byte) uint16 { return onesSum2(b, nil) }

// onesSum2 is the ones' complement sum of a then b; a is of even length.
func onesSum2(a, b []byte) uint16 {
	var s uint32
	for _, b := range [][]byte{a, b} {
		for len(b) >= 2 {
			s += uint32(b[0])<<8 | uint32(b[1])
			b = b[2:]
		}
		if len(b) == 1 {
			s += uint32(b[0]) << 8
		}
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// netInterfaceIndex is the index of interface name in the calling
// thread's namespace.
func netInterfaceIndex(name string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for SIOCGIFINDEX: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, fmt.Errorf("interface %q: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, fmt.Errorf("interface %q: %w", name, err)
	}
	return int(ifr.Uint32()), nil
}

// htons is x in network byte order, as AF_PACKET takes protocols.
func htons(x uint16) uint16 { return x<<8 | x>>8 }

// forward reads the frames of socket i (f) and sends each on in its
// direction, until the socket is closed.
func (r *Relay) forward(i int, f *os.File, rng *rand.Rand) {
	buf := make([]byte, relayFrameMax)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return // closed
		}
		frame := buf[:n]
		d := r.dir(i, frame)
		switch p := rng.Float64(); {
		case p < r.q.Reorder:
			r.hold(d, frame)
		case p < r.q.Reorder+r.q.Delay:
			r.delay(d, frame)
		default:
			r.send(d, frame)
			r.release(d, false)
		}
	}
}

// send sends frame on in direction d.
func (r *Relay) send(d int, frame []byte) {
	if err := r.emit(d, frame); err != nil {
		r.SendErrors.Add(1)
		return
	}
	r.Forwarded.Add(1)
}

// hold keeps frame until the next frame of direction d has gone out; a
// frame held already goes out first (so no frame waits behind two).
func (r *Relay) hold(d int, frame []byte) {
	r.release(d, false)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return
	}
	r.held[d] = append([]byte(nil), frame...)
	r.Reordered.Add(1)
	r.holdT[d] = time.AfterFunc(r.q.delayBy(), func() { r.release(d, true) })
}

// release sends the frame held in direction d, if any. byTimer says the
// hold's timer fired (rather than a later frame having gone out).
func (r *Relay) release(d int, byTimer bool) {
	r.mu.Lock()
	frame := r.held[d]
	r.held[d] = nil
	if t := r.holdT[d]; t != nil && !byTimer {
		t.Stop()
	}
	r.holdT[d] = nil
	r.mu.Unlock()
	if frame != nil {
		r.send(d, frame)
	}
}

// delay sends frame DelayBy from now.
func (r *Relay) delay(d int, frame []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return
	}
	c := append([]byte(nil), frame...)
	r.Delayed.Add(1)
	var t *time.Timer
	t = time.AfterFunc(r.q.delayBy(), func() {
		r.mu.Lock()
		_, ok := r.late[t]
		delete(r.late, t)
		r.mu.Unlock()
		if ok {
			r.send(d, c)
		}
	})
	r.late[t] = c
}

// Struck returns how many frames the relay reordered or delayed so far,
// and says what it did.
func (r *Relay) Struck(context.Context) (uint64, string, error) {
	ro, d := r.Reordered.Load(), r.Delayed.Load()
	return ro + d, fmt.Sprintf("%s: %d frames relayed, %d reordered, %d delayed, %d refused where sent",
		r.q, r.Forwarded.Load(), ro, d, r.SendErrors.Load()), nil
}

// Remove stops the relay and gives the link back. The frames it still
// holds or delays are lost, as on a link taken down.
func (r *Relay) Remove(ctx context.Context) error {
	r.mu.Lock()
	r.closing = true
	for d, t := range r.holdT {
		if t != nil {
			t.Stop()
		}
		r.held[d], r.holdT[d] = nil, nil
	}
	for t := range r.late {
		t.Stop()
		delete(r.late, t)
	}
	r.mu.Unlock()
	// The readers end first, so that no frame is carried twice, by the
	// relay and by the link, once the drop rule is gone.
	r.closeSocks()
	r.wg.Wait()
	if _, err := nft(ctx, r.netns, "", "delete", "table", "netdev", r.table); err != nil {
		return fmt.Errorf("fault: relay: give the link back: %w", err)
	}
	return nil
}

// closeSocks closes the relay's sockets.
func (r *Relay) closeSocks() {
	for _, f := range r.socks {
		f.Close()
	}
	if r.raw != nil {
		r.raw.Close()
	}
}
