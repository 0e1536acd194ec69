// SPDX-License-Identifier: Apache-2.0

package rdma_test

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vrdma/vrdma"
	"github.com/vrdma/vrdma/internal/perf"
	"github.com/vrdma/vrdma/internal/rocewire"
	"github.com/vrdma/vrdma/internal/testenv"
	"github.com/vrdma/vrdma/internal/transport/rdma"
	"github.com/vrdma/vrdma/internal/transport/rdma/rdmatest"
)

// injector is the engine's socket with a side door: datagrams put on in
// are read as if the network had brought them.
type injector struct {
	rdma.Conn
	in chan []byte
}

func (j *injector) Read(bufs [][]byte, reads []rdma.Read) (int, error) {
	select {
	case d := <-j.in:
		reads[0] = rdma.Read{N: copy(bufs[0], d), Src: j.LocalAddr()}
		return 1, nil
	default:
	}
	return j.Conn.Read(bufs, reads)
}

// FuzzEngine feeds hostile packets to a running engine, from the address
// of the QPs' peer and with a correct ICRC, so that they reach the
// responder's and the requester's rules: a QP that is connected, its
// number in the BTH, any opcode, PSN, header and payload. The engine must
// not panic (the agent logs a QP goroutine's or a session's panic as an
// error, which fails the test), and the pair must still answer status.
func FuzzEngine(f *testing.F) {
	j := &injector{in: make(chan []byte, 1)}
	// An address of this process's own: the fuzzing coordinator and its
	// workers each run this setup.
	addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 34 + byte(os.Getpid()>>8%200), byte(os.Getpid()%250 + 1)}), 4791)
	env := testenv.StartWith(f, testenv.Options{RDMALoop: addr, RDMALoopConn: func(c rdma.Conn) rdma.Conn { j.Conn = c; return j }})
	v1, v2 := env.Open(f, "f1", testenv.VMOptions{}), env.Open(f, "f2", testenv.VMOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := perf.Connect(ctx, v1.Adapters()[0], v2.Adapters()[0], perf.PairConfig{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { p.Close(context.Background()) })
	ua, ub := ucPair(f, ctx, v1, v2)
	xs := xrcPair(f, ctx, v1, v2)
	qpns := []uint32{p.A.QP.QPN(), p.B.QP.QPN(), ua.qp.QPN(), ub.qp.QPN(), xs.tgt.QPN(), xs.ini.QPN()}
	xbuf, err := v2.Alloc(8 * 4096)
	if err != nil {
		f.Fatal(err)
	}
	xmr, err := xs.pd2.RegMR(ctx, xbuf, vrdma.AccessAll)
	if err != nil {
		f.Fatal(err)
	}
	for i := range 8 { // receives for the target QP's SENDs
		if err := xs.srq.PostRecv([]vrdma.RecvWR{{ID: uint64(i), SGL: []vrdma.SGE{xmr.SGE(i*4096, 4096)}}}); err != nil {
			f.Fatal(err)
		}
	}
	for _, u := range []*ucSide{ua, ub} { // receives for the UC QPs' SENDs
		for i := range 8 {
			if err := u.qp.PostRecv([]vrdma.RecvWR{{ID: uint64(i), SGL: []vrdma.SGE{u.mr.SGE(i*4096, 4096)}}}); err != nil {
				f.Fatal(err)
			}
		}
	}

	bth := func(op rocewire.Opcode, psn uint32, rest ...byte) []byte {
		b := make([]byte, rocewire.BTHLen, 64)
		rocewire.BTH(b).Encode(&rocewire.BTHFields{Opcode: op, PKey: rocewire.DefaultPKey, PSN: psn, AckReq: true})
		return append(b, rest...)
	}
	f.Add(uint8(0), bth(rocewire.SendOnly, 0, []byte("hello")...))
	f.Add(uint8(1), bth(rocewire.RDMAWriteFirst, 5, make([]byte, 16+1024)...))
	f.Add(uint8(0), bth(rocewire.RDMAReadRequest, 1, make([]byte, 16)...))
	f.Add(uint8(1), bth(rocewire.CompareSwap, 2, make([]byte, 28)...))
	f.Add(uint8(0), bth(rocewire.Acknowledge, 3, 0x60, 0, 0, 1))
	f.Add(uint8(1), bth(rocewire.RDMAReadResponseOnly, 4, append([]byte{0x1f, 0, 0, 0}, make([]byte, 64)...)...))
	f.Add(uint8(0), bth(rocewire.SendMiddle, 0xffffff, make([]byte, 1024)...))
	// SENDs with invalidate: of an rkey that is no window, and of a
	// window's shape, alone and ending a message.
	f.Add(uint8(0), bth(rocewire.SendOnlyWithInvalidate, 0, append([]byte{0x80, 0, 1, 7}, "inv!"...)...))
	f.Add(uint8(1), bth(rocewire.SendOnlyWithInvalidate, 0, 0, 0, 0x10, 1))
	f.Add(uint8(0), bth(rocewire.SendLastWithInvalidate, 1, append([]byte{0x80, 0, 2, 0}, "tail"...)...))
	// UD: DETH (Q_Key, source QP), then the source GID and the message;
	// and one too short for the GID.
	f.Add(uint8(0), bth(rocewire.UDSendOnly, 0, append([]byte{0x11, 0x11, 0x11, 0x11, 0, 0, 0, 7}, make([]byte, 16+64)...)...))
	f.Add(uint8(1), bth(rocewire.UDSendOnlyWithImmediate, 0, append([]byte{0x11, 0x11, 0x11, 0x11, 0, 0, 0, 7, 1, 2, 3, 4}, 5, 6)...))
	// UC packets for the UC QPs (which 2, 3), and for an RC one.
	f.Add(uint8(2), bth(rocewire.UC|rocewire.SendOnly, 0, []byte("hello")...))
	f.Add(uint8(3), bth(rocewire.UC|rocewire.SendFirst, 7, make([]byte, 1024)...))
	f.Add(uint8(2), bth(rocewire.UC|rocewire.SendLastWithImmediate, 9, make([]byte, 4+17)...))
	f.Add(uint8(3), bth(rocewire.UC|rocewire.RDMAWriteFirst, 5, make([]byte, 16+1024)...))
	f.Add(uint8(2), bth(rocewire.UC|rocewire.RDMAWriteOnlyWithImmediate, 1, make([]byte, 16+4+8)...))
	f.Add(uint8(3), bth(rocewire.RDMAReadRequest, 1, make([]byte, 16)...))
	f.Add(uint8(0), bth(rocewire.UC|rocewire.SendOnly, 0, []byte("hello")...))
	// XRC: a target QP's requests naming its SRQ, another number, an RC
	// packet for it, an XRC packet for an RC QP, a response for the
	// initiator.
	srqn := binary.BigEndian.AppendUint32(nil, xs.srq.Num())
	f.Add(uint8(4), bth(rocewire.XRC|rocewire.SendOnly, 0, append(srqn, []byte("hello")...)...))
	f.Add(uint8(4), bth(rocewire.XRC|rocewire.SendFirst, 0, append([]byte{0, 0x12, 0x34, 0x56}, make([]byte, 1024)...)...))
	f.Add(uint8(4), bth(rocewire.XRC|rocewire.RDMAReadRequest, 0, append(srqn, make([]byte, 16)...)...))
	f.Add(uint8(4), bth(rocewire.XRC|rocewire.CompareSwap, 0, append(srqn, make([]byte, 28)...)...))
	f.Add(uint8(4), bth(rocewire.SendOnly, 0, []byte("hello")...))
	f.Add(uint8(0), bth(rocewire.XRC|rocewire.SendOnly, 0, append(srqn, []byte("hello")...)...))
	f.Add(uint8(5), bth(rocewire.XRC|rocewire.Acknowledge, 0, 0x60, 0, 0, 1))

	f.Fuzz(func(t *testing.T, which uint8, tp []byte) {
		if len(tp) < rocewire.BTHLen || len(tp) > 4096 {
			return
		}
		pkt := append(append([]byte(nil), tp...), 0, 0, 0, 0)
		binary.BigEndian.PutUint32(pkt[4:], qpns[int(which)%len(qpns)]) // FECN, BECN zero: the QP under test
		if err := rdmatest.SealLoopback(pkt, addr.Addr()); err != nil {
			t.Fatal(err)
		}
		j.in <- pkt
		// Wake the reader: a datagram it reads after the injected one.
		probe := append(append([]byte(nil), pkt[:rocewire.BTHLen]...), 0, 0, 0, 0)
		probe[0] = byte(rocewire.CNP)
		j.Conn.WriteTo([][]byte{probe}, []rdma.Datagram{{End: 1}}, addr, rdma.Marks{})
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a2, err := vrdma.DialAgent(sctx, vrdma.WithSocket(env.Socket))
		if err != nil {
			t.Fatal(err)
		}
		defer a2.Close()
		if _, err := a2.Status(sctx); err != nil {
			t.Fatalf("the agent stopped answering: %v", err)
		}
	})
}
