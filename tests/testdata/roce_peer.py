#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
#
# A RoCEv2 peer that knows nothing of vrdma, written independently of its
# engine with scapy's RoCE layer (scapy.contrib.roce, Debian python3-scapy):
# it crafts the packets by hand, scapy computes their ICRC.
#
#   roce_peer.py isolation DST QPN PSN VA RKEY WAIT
#   roce_peer.py rc DST QPN VA RKEY LQPN LPSN
#   roce_peer.py icrc PCAP     checks the ICRC of every RoCEv2 packet of a capture:
#                              prints "icrc: ok N bad M"
#   roce_peer.py cm DST SRC PORT WAIT
#                              an RDMA CM REQ on QP1 (see cm below)
#   roce_peer.py cmhostile DST hostile packets to QP1 (see cmhostile below)
#
# sends to DST:4791 (listening on eth0) an RC SEND_ONLY, an RC RDMA_WRITE_ONLY (RETH VA, RKEY),
# an RC RDMA_READ_REQUEST and a UD SEND_ONLY (DETH), all to QPN from PSN
# on, and listens WAIT seconds for anything DST sends back; it prints
# "sent N" and "answers M" (UDP datagrams from DST). An ICMP echo request
# to DST proves that the listener hears DST: "echo replies K".
import struct
import sys
import threading
import time

from scapy.all import ICMP, IP, UDP, Raw, AsyncSniffer, conf, rdpcap, send
from scapy.contrib.roce import BTH

conf.verb = 0


def packet(dst, op, qpn, psn, ext, payload=b"", ackreq=1):
    pad = (4 - len(payload) % 4) % 4
    return (IP(dst=dst, id=1, flags="DF") / UDP(sport=49152, dport=4791) /
            BTH(opcode=op, dqpn=qpn, psn=psn, ackreq=ackreq, padcount=pad) /
            Raw(ext + payload + b"\0" * pad))


def isolation(dst, qpn, psn, va, rkey, wait):
    msg = b"not a vrdma peer"
    reth = struct.pack("!QII", va, rkey, len(msg))
    deth = struct.pack("!II", 0x11111111, 0x000042)  # Q_Key, source QP
    pkts = [
        packet(dst, 0x04, qpn, psn, b"", msg),                  # RC SEND_ONLY
        packet(dst, 0x0A, qpn, psn + 1, reth, msg),             # RC RDMA_WRITE_ONLY
        packet(dst, 0x0C, qpn, psn + 2, reth),                  # RC RDMA_READ_REQUEST
        packet(dst, 0x64, qpn, 0, deth, b"\0" * 16 + msg, 0),  # UD SEND_ONLY
    ]
    sniffer = AsyncSniffer(iface="eth0", lfilter=lambda p: IP in p and p[IP].src == dst, store=True)
    sniffer.start()
    time.sleep(0.5)
    for p in pkts:
        send(p)
    send(IP(dst=dst) / ICMP())
    time.sleep(wait)
    got = sniffer.stop() or []
    answers = [p for p in got if UDP in p]
    print("sent %d" % len(pkts))
    print("answers %d" % len(answers))
    print("echo replies %d" % len([p for p in got if ICMP in p and p[ICMP].type == 0]))
    for p in answers:
        print("answer: %s" % p.summary())


# rc mode: the peer is the RC requester QP LQPN, whose first PSN is LPSN,
# of a QP QPN at DST connected to it, with a region at VA, RKEY. It sends
# a SEND (the QP must have a receive posted), an RDMA WRITE of 64 bytes at
# VA, an RDMA READ of 64 bytes at VA+256 and an RDMA WRITE with a wrong
# rkey, waits for each answer, checks every answer's ICRC, and prints:
#   send: ACK|<what came>      write: ACK|...     read: <hex>|...
#   badkey: NAK 0xSS|...       icrc: ok N bad M
WRITE_DATA = bytes((0x30 + i * 3) & 0xFF for i in range(64))
SEND_DATA = b"scapy send"


class Answers:
    """The RoCE packets DST sends, as they arrive."""

    def __init__(self, dst):
        self.dst, self.got, self.cv = dst, [], threading.Condition()
        self.good = self.bad = 0

    def add(self, p):
        if IP not in p or UDP not in p or p[IP].src != self.dst or p[UDP].dport != 4791:
            return
        raw_ip = bytes(p[IP])
        q = IP(raw_ip)
        q[BTH].icrc = None
        if bytes(q)[-4:] == raw_ip[-4:]:
            self.good += 1
        else:
            self.bad += 1
        u = bytes(p[UDP].payload)
        ans = {"op": u[0], "psn": int.from_bytes(u[9:12], "big"), "pad": (u[1] >> 4) & 3, "rest": u[12:-4]}
        with self.cv:
            self.got.append(ans)
            self.cv.notify_all()

    def wait(self, psn, timeout=3.0):
        end = time.time() + timeout
        with self.cv:
            while True:
                for a in self.got:
                    if a["psn"] == psn:
                        return a
                left = end - time.time()
                if left <= 0:
                    return None
                self.cv.wait(left)


def describe(a):
    if a is None:
        return "nothing"
    return "opcode 0x%02x psn %d rest %s" % (a["op"], a["psn"], a["rest"].hex())


def rc(dst, qpn, va, rkey, lqpn, lpsn):
    ans = Answers(dst)
    sniffer = AsyncSniffer(iface="eth0", prn=ans.add, store=False)
    sniffer.start()
    time.sleep(0.5)

    def ack(a):
        # an ACKNOWLEDGE whose AETH syndrome is an ACK (0b000xxxxx)
        return a is not None and a["op"] == 0x11 and len(a["rest"]) == 4 and a["rest"][0] >> 5 == 0

    send(packet(dst, 0x04, qpn, lpsn, b"", SEND_DATA))
    a = ans.wait(lpsn)
    print("send: %s" % ("ACK" if ack(a) else describe(a)))
    reth = struct.pack("!QII", va, rkey, len(WRITE_DATA))
    send(packet(dst, 0x0A, qpn, lpsn + 1, reth, WRITE_DATA))
    a = ans.wait(lpsn + 1)
    print("write: %s" % ("ACK" if ack(a) else describe(a)))
    reth = struct.pack("!QII", va + 256, rkey, 64)
    send(packet(dst, 0x0C, qpn, lpsn + 2, reth))
    a = ans.wait(lpsn + 2)
    if a is not None and a["op"] == 0x10 and len(a["rest"]) >= 4 + 64:
        print("read: %s" % a["rest"][4:4 + 64].hex())
    else:
        print("read: %s" % describe(a))
    reth = struct.pack("!QII", va, rkey ^ 0xFF00, len(WRITE_DATA))
    send(packet(dst, 0x0A, qpn, lpsn + 3, reth, WRITE_DATA))
    a = ans.wait(lpsn + 3)
    if a is not None and a["op"] == 0x11 and len(a["rest"]) == 4 and a["rest"][0] >> 5 == 3:
        print("badkey: NAK 0x%02x" % a["rest"][0])
    else:
        print("badkey: %s" % describe(a))
    time.sleep(0.3)
    sniffer.stop()
    print("icrc: ok %d bad %d" % (ans.good, ans.bad))


# cm mode: the peer at SRC sends DST's QP1 an RDMA CM REQ (a CM MAD built
# here by hand from the InfiniBand specification's layout, chapter 12, and
# RDMA CM's IP header, Annex A11) for TCP port PORT, from its QP 0x654321
# with PSN 0x200, asking for answers within 4.096 us * 2^14 (67 ms), at most
# 2 retries, with the private data of vrdmactl native-peer --cm (its
# region); it never sends the RTU. For WAIT seconds it prints each CM
# MAD DST sends back, in order: "REP qpn Q", "MRA", "REJ reason R msg M",
# or "other ATTR", each checked to name its comm ID ("bad comm ID" if not),
# then "icrc: ok N bad M".
CM_COMM_ID = 0x0C0FFEE0


def cm_req(dst, src, port):
    hdr = struct.pack("!BBBBHHQHHI", 1, 0x07, 2, 0x03, 0, 0, 0x1234, 0x0010, 0, 0)
    gid = lambda a: b"\0" * 10 + b"\xff\xff" + bytes(int(x) for x in a.split("."))
    d = bytearray(232)
    struct.pack_into("!I", d, 0, CM_COMM_ID)
    struct.pack_into("!Q", d, 8, 0x01060000 | port)  # RDMA_PS_TCP, port
    struct.pack_into("!Q", d, 16, 0x0200000000000042)
    struct.pack_into("!I", d, 32, 0x654321 << 8 | 1)  # local QPN, responder resources
    struct.pack_into("!I", d, 36, 1)  # initiator depth
    d[43] = 20 << 3  # remote CM response timeout 20 (no MRA before 2 s), RC
    struct.pack_into("!I", d, 44, 0x200 << 8 | 14 << 3 | 7)  # PSN, local CM response timeout 14, retry 7
    struct.pack_into("!H", d, 48, 0xFFFF)
    d[50] = 3 << 4 | 7  # path MTU 1024, RNR retry 7
    d[51] = 2 << 4  # max CM retries 2
    d[56:72], d[72:88] = gid(src), gid(dst)
    d[93] = 64
    d[95] = 14 << 3
    pd = bytearray(36)
    pd[1] = 0x40
    struct.pack_into("!H", pd, 2, 40000)
    pd[16:20] = bytes(int(x) for x in src.split("."))
    pd[32:36] = bytes(int(x) for x in dst.split("."))
    d[140:176] = pd
    # vrdmactl native-peer --cm's region after the header: address, rkey, size
    d[176:192] = struct.pack("!QII", 0, 0x1234, 4096)
    deth = struct.pack("!II", 0x80010000, 1)
    return packet(dst, 0x64, 1, 0, deth, hdr + bytes(d), 0)


def cm(dst, src, port, wait):
    ans = Answers(dst)
    sniffer = AsyncSniffer(iface="eth0", prn=ans.add, store=False)
    sniffer.start()
    time.sleep(0.5)
    send(cm_req(dst, src, port))
    time.sleep(wait)
    sniffer.stop()
    for a in ans.got:
        mad = a["rest"][8:]  # after the DETH
        if a["op"] != 0x64 or len(mad) != 256:
            print("not a MAD: %s" % describe(a))
            continue
        attr = struct.unpack("!H", mad[16:18])[0]
        d = mad[24:]
        ids = "" if struct.unpack("!I", d[4:8])[0] == CM_COMM_ID else " bad comm ID"
        if attr == 0x0013:
            print("REP qpn 0x%06x%s" % (int.from_bytes(d[12:15], "big"), ids))
        elif attr == 0x0011:
            print("MRA%s" % ids)
        elif attr == 0x0012:
            print("REJ reason %d msg %d%s" % (struct.unpack("!H", d[10:12])[0], d[8] >> 6, ids))
        else:
            print("other 0x%04x" % attr)
    print("icrc: ok %d bad %d" % (ans.good, ans.bad))


# cmhostile mode: packets to DST's QP1 that no CM may act on, each with a
# right ICRC: a MAD cut short (200 bytes), a whole MAD with another Q_Key
# than the GSI's, a MAD of another class (0x04), a LAP (an attribute RDMA
# CM does not use), an RTU and a REP naming comm IDs nobody has. It prints
# "sent N" and "answers M" (what DST sent back within a second).
def cmhostile(dst):
    def mad(cls, attr, data):
        return struct.pack("!BBBBHHQHHI", 1, cls, 2, 0x03, 0, 0, 0x99, attr, 0, 0) + data.ljust(232, b"\0")

    gsi = struct.pack("!II", 0x80010000, 1)
    ids = struct.pack("!II", 0x11223344, 0x55667788)
    pkts = [
        packet(dst, 0x64, 1, 0, gsi, mad(0x07, 0x0014, ids)[:200], 0),
        packet(dst, 0x64, 1, 0, struct.pack("!II", 0x11111111, 1), mad(0x07, 0x0014, ids), 0),
        packet(dst, 0x64, 1, 0, gsi, mad(0x04, 0x0014, ids), 0),
        packet(dst, 0x64, 1, 0, gsi, mad(0x07, 0x0019, ids), 0),
        packet(dst, 0x64, 1, 0, gsi, mad(0x07, 0x0014, ids), 0),
        packet(dst, 0x64, 1, 0, gsi, mad(0x07, 0x0013, ids + struct.pack("!I", 0x80010000) + struct.pack("!I", 0x123456 << 8)), 0),
    ]
    ans = Answers(dst)
    sniffer = AsyncSniffer(iface="eth0", prn=ans.add, store=False)
    sniffer.start()
    time.sleep(0.5)
    for p in pkts:
        send(p)
    time.sleep(1.0)
    sniffer.stop()
    print("sent %d" % len(pkts))
    print("answers %d" % len(ans.got))


def icrc(pcap):
    good = bad = 0
    for p in rdpcap(pcap):
        if IP not in p or BTH not in p:
            continue
        raw_ip = bytes(p[IP])
        q = IP(raw_ip)
        q[BTH].icrc = None
        if bytes(q)[-4:] == raw_ip[-4:]:
            good += 1
        else:
            bad += 1
    print("icrc: ok %d bad %d" % (good, bad))


if __name__ == "__main__":
    a = sys.argv
    if len(a) == 8 and a[1] == "isolation":
        isolation(a[2], int(a[3], 0), int(a[4], 0), int(a[5], 0), int(a[6], 0), float(a[7]))
    elif len(a) == 3 and a[1] == "icrc":
        icrc(a[2])
    elif len(a) == 3 and a[1] == "cmhostile":
        cmhostile(a[2])
    elif len(a) == 6 and a[1] == "cm":
        cm(a[2], a[3], int(a[4]), float(a[5]))
    elif len(a) == 8 and a[1] == "rc":
        rc(a[2], int(a[3], 0), int(a[4], 0), int(a[5], 0), int(a[6], 0), int(a[7], 0))
    else:
        sys.exit("usage: roce_peer.py isolation DST QPN PSN VA RKEY WAIT | rc DST QPN VA RKEY LQPN LPSN | cm DST SRC PORT WAIT | cmhostile DST | icrc PCAP")
