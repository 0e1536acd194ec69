#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
#
# A RoCEv2 peer that knows nothing of vrdma, written independently of its
# engine with scapy's RoCE layer (scapy.contrib.roce, Debian python3-scapy):
# it crafts the packets by hand, scapy computes their ICRC.
#
#   roce_peer.py isolation DST QPN PSN VA RKEY WAIT
#
# sends to DST:4791 (listening on eth0) an RC SEND_ONLY, an RC RDMA_WRITE_ONLY (RETH VA, RKEY),
# an RC RDMA_READ_REQUEST and a UD SEND_ONLY (DETH), all to QPN from PSN
# on, and listens WAIT seconds for anything DST sends back; it prints
# "sent N" and "answers M" (UDP datagrams from DST). An ICMP echo request
# to DST proves that the listener hears DST: "echo replies K".
import struct
import sys
import time

from scapy.all import ICMP, IP, UDP, Raw, AsyncSniffer, conf, send
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


if __name__ == "__main__":
    if len(sys.argv) != 8 or sys.argv[1] != "isolation":
        sys.exit("usage: roce_peer.py isolation DST QPN PSN VA RKEY WAIT")
    a = sys.argv
    isolation(a[2], int(a[3], 0), int(a[4], 0), int(a[5], 0), int(a[6], 0), float(a[7]))
