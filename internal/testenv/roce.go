// SPDX-License-Identifier: Apache-2.0

package testenv

// ICRCv1Script is a Python program (Debian's python3 with scapy, for
// rdpcap) that prints how many RoCE v1 frames a pcap holds and how many
// of them carry a wrong ICRC: CRC-32 (zlib) over 8 bytes of 0xFF, the GRH
// with traffic class, flow label and hop limit set to ones, the BTH with
// byte 4 set to ones and the rest up to the ICRC, least significant byte
// first on the wire (docs/wire-rdma.md). It computes every frame's ICRC
// from the brief's rules alone (scapy computes no RoCE v1 ICRC); its
// argument is the pcap.
const ICRCv1Script = `
import sys, zlib, struct
from scapy.all import rdpcap, raw

n = bad = 0
for pkt in rdpcap(sys.argv[1]):
    b = raw(pkt)
    off = 12
    (et,) = struct.unpack("!H", b[off:off+2])
    if et == 0x8100:
        off += 4
        (et,) = struct.unpack("!H", b[off:off+2])
    if et != 0x8915 or b[:6] == bytes.fromhex("020000000099"):
        continue
    g = bytearray(b[off+2:off+42])
    (paylen,) = struct.unpack("!H", bytes(g[4:6]))
    tp = bytearray(b[off+42:off+42+paylen])
    if len(g) < 40 or len(tp) != paylen or paylen < 16:
        n += 1; bad += 1
        continue
    n += 1
    want = bytes(tp[-4:])
    g[0] |= 0x0f
    g[1] = g[2] = g[3] = g[7] = 0xff
    tp[4] = 0xff
    got = (zlib.crc32(b"\xff" * 8 + bytes(g) + bytes(tp[:-4])) & 0xffffffff).to_bytes(4, "little")
    if got != want:
        bad += 1
print(n, bad)
`
