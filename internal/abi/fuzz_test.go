// SPDX-License-Identifier: Apache-2.0

package abi

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// requestSeeds are well-formed requests of every op, the seeds of
// FuzzDecodeRequest (testdata/fuzz/FuzzDecodeRequest holds more, and
// malformed ones).
func requestSeeds() map[Op]any {
	gid, _ := ParseGID("fe80::20c:29ff:fe01:203")
	return map[Op]any{
		OpHello:         &Hello{Client: "vrdma"},
		OpAttach:        &Attach{VM: "vm1"},
		OpQueryDevice:   &AdapterRef{Adapter: "vrdma0"},
		OpQueryPort:     &AdapterRef{Adapter: "vrdma1"},
		OpAllocPD:       &AdapterRef{Adapter: "vrdma9"},
		OpDeallocPD:     &Handle{Handle: 1},
		OpRegMR:         &RegMR{PD: 1, Addr: 4096, Length: 1 << 20, Access: AccessLocalWrite | AccessRemoteWrite},
		OpDeregMR:       &Handle{Handle: 2},
		OpCreateCQ:      &CreateCQ{Adapter: "vrdma0", CQE: 256},
		OpDestroyCQ:     &Handle{Handle: 3},
		OpCreateQP:      &CreateQP{PD: 1, SendCQ: 3, RecvCQ: 3, Type: QPTypeRC, SQSigAll: true, Caps: QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}},
		OpModifyQP:      &ModifyQP{Handle: 4, Mask: MaskState | MaskAV | MaskDestQPN, Attr: QPAttr{State: QPSRTR, DGID: gid, DestQPN: 0x1234, PathMTU: 1024}},
		OpQueryQP:       &Handle{Handle: 4},
		OpDestroyQP:     &Handle{Handle: 4},
		OpListen:        &Listen{Adapter: "vrdma0", Port: 7471},
		OpGetRequest:    &Handle{Handle: 5},
		OpAcceptRequest: &AcceptRequest{Listener: 5, ID: 1, QP: 4},
		OpRejectRequest: &RejectRequest{Listener: 5, ID: 2, Reason: "busy"},
		OpCloseListener: &Handle{Handle: 5},
		OpConnect:       &Connect{QP: 4, Remote: "vm2/vrdma0", Port: 7471, TimeoutMS: 1000},
		OpStatus:        &Empty{},
		OpListVMs:       &Empty{},
		OpReregMR:       &ReregMR{Handle: 2, Flags: ReregAll, PD: 1, Addr: 8192, Length: 4096, IOVA: 0x7f0000001000, Access: AccessLocalWrite},
		OpResizeCQ:      &ResizeCQ{Handle: 3, CQE: 1000},
		OpAllocMW:       &AllocMW{PD: 1, Type: MWType2},
		OpDeallocMW:     &Handle{Handle: 4},
		OpOpenQP:        &OpenQP{XRCD: 6, QPN: 0xabcdef},
		OpDirectChannel: &Handle{Handle: 4},
		OpDirectNotify:  &DirectNotify{QP: 4, CQ: NotifyRecv, Solicited: true},
		OpAdviseMR:      &AdviseMR{PD: 1, Advice: AdvicePrefetchWrite, Flags: AdviseFlush, SGEs: []AdviseSGE{{Addr: 0x7f0000001000, Length: 4096, LKey: 0x101}}},
		// The management commands' bodies are package mgmt's (its
		// tests); here their ops have none.
	}
}

// FuzzDecodeRequest checks that DecodeRequest never panics on any message,
// that it returns a body exactly when it returns no error, that an error
// is an *Error naming a field when the header was sound, and that a
// decoded request encodes (AppendMessage) and decodes again to an equal
// header and body.
func FuzzDecodeRequest(f *testing.F) {
	for op, body := range requestSeeds() {
		msg, err := AppendMessage(nil, Header{Version: Version, Op: op, Seq: uint32(op) * 7}, body)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(msg)
	}
	hdr := func(version, flags uint8, op Op, n uint32) []byte {
		h := make([]byte, CmdHeaderSize)
		h[0], h[1], h[2], h[3] = 'V', 'R', version, flags
		binary.LittleEndian.PutUint16(h[4:], uint16(op))
		binary.LittleEndian.PutUint32(h[12:], n)
		return h
	}
	f.Add([]byte{})
	f.Add([]byte("VR"))
	f.Add(append(hdr(Version, 0, OpCreateCQ, 2), "{}"...))
	f.Add(append(hdr(Version, 0, OpCreateCQ, 29), `{"adapter":"vrdma0","cqe":1e9}`...))
	f.Add(append(hdr(Version, 0, OpModifyQP, 39), `{"handle":1,"mask":1,"attr":{"dgid":7}}`...))
	f.Add(append(hdr(Version, FlagResponse, OpHello, 2), "{}"...))
	f.Add(append(hdr(Version+1, 0, OpHello, 2), "{}"...))
	f.Add(append(hdr(Version, 0, opMax, 2), "{}"...))
	f.Add(append(hdr(Version, 0, OpCMConnect, 40), `{"channel":1,"qp":2,"qpn":3,"remote":"x"}`...))
	f.Add(append(hdr(Version, 0, OpCMEstablish, 8), `{"qp":1}`...))
	f.Add(append(hdr(Version, 0, OpOpenQP, 27), `{"xrcd":1,"qpn":16777216}`...))
	f.Add(append(hdr(Version, 0, OpReregMR, 26), `{"handle":1,"flags":1}`+"    "...))
	f.Add(append(hdr(Version, 0, OpResizeCQ, 24), `{"handle":1,"cqe":70000}`...))
	f.Add(append(hdr(Version, 0, OpAllocMW, 17), `{"pd":1,"type":3}`...))
	f.Add(append(hdr(Version, 0, OpAdviseMR, 39), `{"pd":1,"advice":3,"flags":0,"sges":[]}`...))
	f.Fuzz(func(t *testing.T, msg []byte) {
		h, req, err := DecodeRequest(msg)
		if err != nil {
			if req != nil {
				t.Fatalf("error %v with a body %#v", err, req)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not an *Error", err)
			}
			if e.Field == "" {
				t.Fatalf("error %v names no field", err)
			}
			_ = err.Error()
			return
		}
		if req == nil || !h.Op.Known() || h.Version != Version || h.Flags&FlagResponse != 0 {
			t.Fatalf("decoded header %+v body %#v", h, req)
		}
		if int(h.Len) != len(msg)-CmdHeaderSize {
			t.Fatalf("header length %d for a %d-byte body", h.Len, len(msg)-CmdHeaderSize)
		}
		out, err := AppendMessage(nil, h, req)
		if err != nil {
			t.Fatalf("re-encode %#v: %v", req, err)
		}
		h2, req2, err := DecodeRequest(out)
		if err != nil {
			t.Fatalf("re-encoded request %q does not decode: %v", out, err)
		}
		h.Len, h2.Len = 0, 0
		if h2 != h || !reflect.DeepEqual(req2, req) {
			t.Fatalf("round trip changed the request:\n%+v %#v\n%+v %#v", h, req, h2, req2)
		}
		// A canonical encoding is stable.
		out2, _ := AppendMessage(nil, h2, req2)
		if !bytes.Equal(out, out2) {
			t.Fatalf("encoding is not stable: %q then %q", out, out2)
		}
	})
}

// FuzzDecodeSend checks that DecodeSend never panics, whatever the slot
// bytes and the limits (even limits beyond the device's), that what it
// accepts respects the limits and fits the slot, and that an accepted WQE
// encodes and decodes back to itself.
func FuzzDecodeSend(f *testing.F) {
	slot := make([]byte, 128)
	EncodeSend(slot, &SendWQE{WRID: 1, Opcode: OpSend, Flags: SendSignaled, NumSGE: 2,
		SGE: [MaxSGE]SGE{{Addr: 4096, Length: 100, LKey: 0x101}, {Addr: 8192, Length: 10, LKey: 0x202}}}, nil)
	f.Add(slot, uint32(4), uint32(64))
	slot = make([]byte, 128)
	EncodeSend(slot, &SendWQE{WRID: 2, Opcode: OpRDMAWrite, Flags: SendInline, InlineLen: 11, RemoteAddr: 64, RKey: 0x303}, []byte("hello, rdma"))
	f.Add(slot, uint32(4), uint32(64))
	slot = make([]byte, 64)
	EncodeSend(slot, &SendWQE{WRID: 3, Opcode: OpAtomicCmpAndSwp, CompareAdd: 1, Swap: 2}, nil)
	f.Add(slot, uint32(0), uint32(0))
	f.Add(bytes.Repeat([]byte{0xff}, 320), uint32(0xffffffff), uint32(0xffffffff))
	f.Add([]byte{1, 2, 3}, uint32(1), uint32(1))
	// More SGEs than the device has, allowed by a caller's limit.
	slot = make([]byte, SendHdr+17*SGESize)
	EncodeSend(slot, &SendWQE{WRID: 4, Opcode: OpSend}, nil)
	slot[swNumSGE] = 17
	f.Add(slot, uint32(100), uint32(0))
	// An inline length that wraps around when the header is added.
	slot = make([]byte, 128)
	EncodeSend(slot, &SendWQE{WRID: 5, Opcode: OpSend, Flags: SendInline, InlineLen: 0xffffffc0}, nil)
	f.Add(slot, uint32(1), uint32(0xffffffff))
	// A BIND_MW and a LOCAL_INV (their fields in imm, rkey, remote_addr,
	// compare_add and swap).
	slot = make([]byte, 64)
	w := SendWQE{WRID: 6, Opcode: OpBindMW, Flags: SendSignaled}
	w.SetBindMW(MWBind{MW: 7, RKey: MWKeyBit | 0x101, MRKey: 0x202, Addr: 4096, Length: 1 << 40, Access: AccessRemoteWrite | 1<<20})
	EncodeSend(slot, &w, nil)
	f.Add(slot, uint32(1), uint32(0))
	slot = make([]byte, 64)
	EncodeSend(slot, &SendWQE{WRID: 7, Opcode: OpLocalInv, Imm: MWKeyBit | 0x1ff, Flags: SendInline, InlineLen: 3}, nil)
	f.Add(slot, uint32(1), uint32(8))
	f.Fuzz(func(t *testing.T, slot []byte, maxSGE, maxInline uint32) {
		var w SendWQE
		st := DecodeSend(slot, &w, maxSGE, maxInline)
		if st != WCSuccess {
			if st != WCLocQPOpErr && st != WCLocLenErr {
				t.Fatalf("status %s", st)
			}
			return
		}
		if !w.Opcode.Valid() {
			t.Fatalf("accepted opcode %d", w.Opcode)
		}
		var inline []byte
		if w.Flags&SendInline != 0 {
			if w.InlineLen > maxInline || uint64(SendHdr)+uint64(w.InlineLen) > uint64(len(slot)) || w.NumSGE != 0 {
				t.Fatalf("accepted inline length %d (max %d, slot %d bytes), %d SGEs", w.InlineLen, maxInline, len(slot), w.NumSGE)
			}
			if w.Opcode == OpRDMARead || w.Opcode.IsAtomic() {
				t.Fatalf("accepted inline %s", w.Opcode)
			}
			inline = Inline(slot, &w)
		} else if uint32(w.NumSGE) > maxSGE || w.NumSGE > MaxSGE || SendHdr+int(w.NumSGE)*SGESize > len(slot) {
			t.Fatalf("accepted %d SGEs (max %d, slot %d bytes)", w.NumSGE, maxSGE, len(slot))
		}
		again := make([]byte, len(slot))
		EncodeSend(again, &w, inline)
		var w2 SendWQE
		if st := DecodeSend(again, &w2, maxSGE, maxInline); st != WCSuccess || w2 != w {
			t.Fatalf("round trip: %s\n%+v\n%+v", st, w, w2)
		}
	})
}

// FuzzDecodeRecv is FuzzDecodeSend for receive WQEs.
func FuzzDecodeRecv(f *testing.F) {
	slot := make([]byte, 64)
	EncodeRecv(slot, &RecvWQE{WRID: 9, NumSGE: 3, SGE: [MaxSGE]SGE{{Addr: 1, Length: 2, LKey: 3}, {Addr: 4, Length: 5, LKey: 6}, {Addr: 7, Length: 8, LKey: 9}}})
	f.Add(slot, uint32(3))
	f.Add(bytes.Repeat([]byte{0xff}, 512), uint32(0xffffffff))
	f.Add([]byte{}, uint32(0))
	slot = make([]byte, RecvHdr+20*SGESize)
	EncodeRecv(slot, &RecvWQE{WRID: 10})
	slot[8] = 20
	f.Add(slot, uint32(255))
	f.Fuzz(func(t *testing.T, slot []byte, maxSGE uint32) {
		var w RecvWQE
		st := DecodeRecv(slot, &w, maxSGE)
		if st != WCSuccess {
			if st != WCLocQPOpErr && st != WCLocLenErr {
				t.Fatalf("status %s", st)
			}
			return
		}
		if uint32(w.NumSGE) > maxSGE || w.NumSGE > MaxSGE || RecvHdr+int(w.NumSGE)*SGESize > len(slot) {
			t.Fatalf("accepted %d SGEs (max %d, slot %d bytes)", w.NumSGE, maxSGE, len(slot))
		}
		again := make([]byte, len(slot))
		EncodeRecv(again, &w)
		var w2 RecvWQE
		if st := DecodeRecv(again, &w2, maxSGE); st != WCSuccess || w2 != w {
			t.Fatalf("round trip: %s\n%+v\n%+v", st, w, w2)
		}
	})
}

// FuzzRingIndex checks the ring index rules for any indices and sizes:
// Pending never reports more than size entries as legal, legal counts
// agree with the indices, and for a real ring (a power of two up to
// MaxCQE slots) Slot stays inside it and Next stays legal.
func FuzzRingIndex(f *testing.F) {
	f.Add(uint32(0), uint32(0), uint32(8))
	f.Add(uint32(8), uint32(0), uint32(8))
	f.Add(uint32(15), uint32(7), uint32(8))
	f.Add(uint32(0xdeadbeef), uint32(3), uint32(4096))
	f.Add(uint32(1), uint32(0), uint32(0))
	f.Add(uint32(0x80000000), uint32(0), uint32(0x80000000))
	f.Add(uint32(5), uint32(2), uint32(6))
	f.Fuzz(func(t *testing.T, tail, head, size uint32) {
		n, ok := Pending(tail, head, size)
		if ok {
			if n > size {
				t.Fatalf("Pending(%d, %d, %d) = %d entries, ok", tail, head, size, n)
			}
			if !ValidIndex(tail, size) || !ValidIndex(head, size) {
				t.Fatalf("Pending(%d, %d, %d) ok with an invalid index", tail, head, size)
			}
		}
		if size == 0 || size > MaxCQE || size&(size-1) != 0 {
			return
		}
		if !ok && ValidIndex(tail, size) && ValidIndex(head, size) && n <= size {
			t.Fatalf("Pending(%d, %d, %d) refused %d entries", tail, head, size, n)
		}
		for _, idx := range []uint32{tail, head} {
			if s := Slot(idx, size); s >= size {
				t.Fatalf("Slot(%d, %d) = %d", idx, size, s)
			}
			if ValidIndex(idx, size) {
				nx := Next(idx, size)
				if !ValidIndex(nx, size) || Slot(nx, size) != (Slot(idx, size)+1)%size {
					t.Fatalf("Next(%d, %d) = %d", idx, size, nx)
				}
			}
		}
		if ok {
			// Consuming every pending entry empties the ring.
			h := head
			for range n {
				h = Next(h, size)
			}
			if m, ok := Pending(tail, h, size); !ok || m != 0 {
				t.Fatalf("after consuming %d of Pending(%d, %d, %d): %d, %v", n, tail, head, size, m, ok)
			}
		}
	})
}

// FuzzLayoutCheck checks that a ring layout that Check accepts puts every
// slot of every queue inside the file, whatever the other side sent.
func FuzzLayoutCheck(f *testing.F) {
	l, _, _ := NewQPLayout(QPCaps{MaxSendWR: 64, MaxRecvWR: 32, MaxSendSGE: 2, MaxRecvSGE: 1, MaxInlineData: 128})
	f.Add(l.SQEntries, l.SQStride, l.RQEntries, l.RQStride, l.SQOffset, l.RQOffset, l.Size, int64(l.Size))
	f.Add(uint32(1), uint32(4096), uint32(1), uint32(4096), uint32(0xfffff000), uint32(4096), uint32(8192), int64(8192))
	c, _ := NewCQLayout(100)
	f.Add(c.Entries, uint32(0), uint32(0), uint32(0), c.Offset, uint32(0), c.Size, int64(c.Size))
	f.Fuzz(func(t *testing.T, sqn, sqs, rqn, rqs, sqo, rqo, size uint32, file int64) {
		l := QPLayout{SQEntries: sqn, SQStride: sqs, RQEntries: rqn, RQStride: rqs, SQOffset: sqo, RQOffset: rqo, Size: size}
		if l.Check(file) == nil {
			end := func(off, n, stride uint32) uint64 { return uint64(off) + uint64(n)*uint64(stride) }
			if end(sqo, sqn, sqs) > uint64(size) || end(rqo, rqn, rqs) > uint64(size) || int64(size) > file ||
				uint64(sqo) < HeaderSize || end(sqo, sqn, sqs) > uint64(rqo) {
				t.Fatalf("accepted %+v for a %d-byte file", l, file)
			}
		}
		c := CQLayout{Entries: sqn, Offset: sqo, Size: size}
		if c.Check(file) == nil {
			if uint64(sqo)+uint64(sqn)*CQESize > uint64(size) || int64(size) > file || uint64(sqo) < HeaderSize {
				t.Fatalf("accepted %+v for a %d-byte file", c, file)
			}
		}
	})
}

// FuzzParseGRH: ParseGRH never panics and accepts only a valid IPv4
// header in the last 20 bytes or an IPv6 header; what PutGRH writes reads
// back with the same GIDs, traffic class, hop limit and length.
func FuzzParseGRH(f *testing.F) {
	var b [GRHSize]byte
	v4 := GID{10: 0xff, 11: 0xff, 12: 10, 15: 1}
	PutGRH(b[:], &GRH{SGID: v4, DGID: v4, TrafficClass: 104, HopLimit: 64, PayLen: 1024})
	f.Add(b[:])
	v6 := GID{0: 0xfe, 1: 0x80, 15: 7}
	PutGRH(b[:], &GRH{SGID: v6, DGID: v6, TrafficClass: 3, HopLimit: 1, FlowLabel: 0x12345, PayLen: 7})
	f.Add(b[:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		g, err := ParseGRH(in)
		if err != nil {
			return
		}
		if len(in) < GRHSize {
			t.Fatalf("accepted %d bytes", len(in))
		}
		var out [GRHSize]byte
		PutGRH(out[:], &g)
		again, err := ParseGRH(out[:])
		if err != nil {
			t.Fatalf("PutGRH(%+v) does not parse: %v", g, err)
		}
		if again.SGID != g.SGID || again.DGID != g.DGID || again.TrafficClass != g.TrafficClass || again.HopLimit != g.HopLimit {
			t.Fatalf("round trip %+v → %+v", g, again)
		}
		if mapped4(g.SGID) != mapped4(g.DGID) {
			return // a v6 header with one mapped GID stays v6: the flow label survives only there
		}
		if !mapped4(g.SGID) && again.FlowLabel != g.FlowLabel {
			t.Fatalf("flow label %x → %x", g.FlowLabel, again.FlowLabel)
		}
	})
}

// FuzzDirectChannel: a direct-channel reply decodes without a panic, and
// the check a library makes before it maps the channel
// (DirectChannel.Check) accepts only geometry that keeps both rings
// inside the mapping, apart, and the mapping inside the file.
func FuzzDirectChannel(f *testing.F) {
	f.Add([]byte(`{"slot":2,"state":5,"size":540672,"tx_offset":0,"rx_offset":270336,"entries":64,"stride":4160,"peer_qpn":4660,"relay_ns":1000000}`), uint32(1024), int64(540672))
	f.Add([]byte(`{"slot":0,"state":9,"size":4096,"tx_offset":0,"rx_offset":64,"entries":4,"stride":128,"peer_qpn":1,"relay_ns":1000}`), uint32(1), int64(4096))
	f.Add([]byte(`{"slot":0,"state":5,"size":18446744073709551615,"tx_offset":18446744073709551552,"rx_offset":0,"entries":4096,"stride":65536,"relay_ns":5000}`), uint32(8), int64(1<<40))
	f.Fuzz(func(t *testing.T, body []byte, slots uint32, file int64) {
		var c DirectChannel
		if json.Unmarshal(body, &c) != nil || c.Check(slots, file) != nil {
			return
		}
		ring := ChanRingBytes(c.Entries, c.Stride)
		lo, hi := min(c.TxOffset, c.RxOffset), max(c.TxOffset, c.RxOffset)
		switch {
		case c.Slot >= slots || c.State&3 != GrantValid || c.State>>2 == 0:
			t.Fatalf("accepted slot %d state 0x%x (%d slots)", c.Slot, c.State, slots)
		case c.Entries == 0 || c.Entries&(c.Entries-1) != 0 || c.Stride < ChanSlotHeader || c.Stride%64 != 0:
			t.Fatalf("accepted %d entries of %d bytes", c.Entries, c.Stride)
		case c.Size > uint64(file) || hi+ring > c.Size || hi+ring < hi || lo+ring > hi || lo%64 != 0 || hi%64 != 0:
			t.Fatalf("accepted rings at 0x%x and 0x%x of %d bytes in %d of a %d-byte file", c.TxOffset, c.RxOffset, ring, c.Size, file)
		}
	})
}

// FuzzDirectGrant: a direct-map reply decodes without a panic, and the
// checks a library makes before it maps (DirectGrant.Check,
// DirectOpenReply.Check) accept only what keeps every access inside the
// mapping and the mapping inside the file.
func FuzzDirectGrant(f *testing.F) {
	f.Add([]byte(`{"slot":3,"state":5,"iova":4096,"length":100,"access":2,"map_offset":4096,"map_length":4096,"mr_offset":16}`), uint32(1024), int64(1<<20))
	f.Add([]byte(`{"slot":1024,"state":6,"iova":18446744073709551615,"length":2,"access":255,"map_offset":1,"map_length":0,"mr_offset":9}`), uint32(1024), int64(4096))
	f.Add([]byte(`{"slots":1024,"slot_size":16,"size":16384}`), uint32(0), int64(16384))
	f.Fuzz(func(t *testing.T, body []byte, slots uint32, file int64) {
		var g DirectGrant
		if json.Unmarshal(body, &g) == nil && g.Check(slots, 4096, file) == nil {
			if g.Slot >= slots || g.State&3 != GrantValid || g.MapOffset%4096 != 0 || g.MapLength%4096 != 0 ||
				g.MapOffset+g.MapLength > uint64(file) || g.MROffset+g.Length > g.MapLength || g.MROffset+g.Length < g.MROffset {
				t.Fatalf("accepted %+v (%d slots, %d-byte file)", g, slots, file)
			}
		}
		var r DirectOpenReply
		if json.Unmarshal(body, &r) == nil && r.Check(file) == nil {
			if uint64(r.Slots)*uint64(r.SlotSize) > uint64(r.Size) || int64(r.Size) > file || r.SlotSize != GrantSlotSize {
				t.Fatalf("accepted %+v for a %d-byte file", r, file)
			}
		}
	})
}
