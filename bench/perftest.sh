#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Unmodified perftest on the drop-in libibverbs (guest/ibverbs) beside the Go
# library and UCX, in one run, between the same two VMs:
#   memcpy: two VMs of one standalone agent;
#   tcp:    vm1 (host1) and vm3 (host2) of vrdmactl quickstart --keep;
#   peers:  bench/peers.sh (UCX over shared memory and TCP, sockperf, iperf3).
# ib_write_bw (64 KiB, 1 MiB; 128 outstanding, perftest's default), ib_write_lat
# and ib_send_bw (8 B), each followed by vrdmactl perf as server and client (the
# Go library in two processes, as perftest runs) with the same test, size and
# iterations in the same VMs, ROUNDS rounds (default 5); it prints every figure
# and then the medians with their ranges and the C / Go ratios. Root or not;
# needs perftest, gcc, libibverbs-dev and what bench/peers.sh needs. Works in
# /tmp/pt. The helpers are bench/lib.sh's; bench/run measures the same and
# more, and writes docs/BENCHMARKS.md.
#
#   bench/perftest.sh            # everything
#   ROUNDS=9 bench/perftest.sh   # more rounds (the figures on two cores are noisy)
#   PEERS=0 bench/perftest.sh    # without bench/peers.sh
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
. "$REPO/bench/lib.sh"
rounds=${ROUNDS:-5}
mkdir -p /tmp/pt && cd /tmp/pt
build_vrdma /tmp/pt || exit 1
: >/tmp/pt/figures

if [ "${PEERS:-1}" != 0 ]; then
  echo "== peers (bench/peers.sh)"
  "$REPO/bench/peers.sh" || echo "bench/peers.sh failed: its figures are missing"
fi

trap dropin_stop EXIT
dropin_start /tmp/pt /tmp/pt || exit 1

# pt PATH TEST ARGS...: perftest's result line of the client.
pt() { local path=$1; shift; dropin_pt "$path" /tmp/pt/cli.out "$@"; }
# golib PATH TEST ARGS...: the Go library's result line of the client.
golib() { local path=$1; shift; dropin_go "$path" /tmp/pt/go.out "$@"; }
# fig NAME VALUE: one figure, printed and kept for the summary.
fig() { echo "$1: $2"; echo "$1 $2" >>/tmp/pt/figures; }

for r in $(seq "$rounds"); do
  echo "== round $r"
  for path in memcpy tcp; do
    n64=500000 n1m=20000 nlat=20000 nsend=200000 # as bench/run's
    [ $path = tcp ] && n64=20000 n1m=2000 nlat=5000 nsend=50000
    fig "$path.c.write_bw_64KiB" "$(pt $path ib_write_bw -s 65536 -n $n64 | awk '{print $4}')"
    fig "$path.go.write_bw_64KiB" "$(golib $path write_bw -s 65536 -n $n64 | awk '{print $4}')"
    fig "$path.c.write_bw_1MiB" "$(pt $path ib_write_bw -s 1048576 -n $n1m | awk '{print $4}')"
    fig "$path.go.write_bw_1MiB" "$(golib $path write_bw -s 1048576 -n $n1m | awk '{print $4}')"
    fig "$path.c.write_lat_8B" "$(pt $path ib_write_lat -s 8 -n $nlat | awk '{print $5}')"
    fig "$path.go.write_lat_8B" "$(golib $path write_lat -s 8 -n $nlat | awk '{print $5}')"
    fig "$path.c.send_rate_8B" "$(pt $path ib_send_bw -s 8 -n $nsend | awk '{print $5}')"
    fig "$path.go.send_rate_8B" "$(golib $path send_bw -s 8 -n $nsend | awk '{print $5}')"
  done
done

echo "== medians over $rounds rounds [range]; bandwidth MiB/s, latency µs (typical, one way), rate Mpps"
python3 - /tmp/pt/figures <<'PY'
import sys, statistics as st
v = {}
for line in open(sys.argv[1]):
    k, _, x = line.partition(" ")
    try:
        v.setdefault(k, []).append(float(x))
    except ValueError:
        pass  # a run that printed no figure
print("| path | figure | C drop-in (perftest) | Go library (vrdmactl perf) | C / Go |")
print("|---|---|---|---|---|")
for path in ("memcpy", "tcp"):
    for f in ("write_bw_64KiB", "write_bw_1MiB", "write_lat_8B", "send_rate_8B"):
        c, g = v.get(f"{path}.c.{f}"), v.get(f"{path}.go.{f}")
        if not c or not g:
            print(f"| {path} | {f} | {c} | {g} | |")
            continue
        cm, gm = st.median(c), st.median(g)
        print(f"| {path} | {f} | {cm:,.2f} ({min(c):,.2f}–{max(c):,.2f}) | {gm:,.2f} ({min(g):,.2f}–{max(g):,.2f}) | {cm / gm:.2f} |")
PY
