#!/bin/bash
# Unmodified perftest on the drop-in libibverbs (guest/ibverbs) between two VMs
# of one standalone agent (the memcpy path), beside vrdmactl perf --local
# --path memcpy, three rounds alternating. Root or not; needs perftest, gcc and
# libibverbs-dev (it builds the library and the binaries). Works in /tmp/pt.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p /tmp/pt && cd /tmp/pt
(cd "$repo" && go build -o /tmp/pt/ ./cmd/vrdmactl ./cmd/vrdmad && make -s -C guest/ibverbs >/dev/null) || exit 1
rm -rf /tmp/pt/state /tmp/pt/s
export VRDMA_SOCKET=/tmp/pt/s
./vrdmad --socket /tmp/pt/s --state-dir /tmp/pt/state --no-control-plane --log-level warn 2>/tmp/pt/agent.log &
AG=$!
sleep 1
printf '%s\n' '.encoding = "UTF-8"' 'config.version = "8"' 'virtualHW.version = "20"' 'guestOS = "ubuntu-64"' 'memSize = "64"' 'ethernet0.present = "TRUE"' 'ethernet0.virtualDev = "vrdma"' > vm.vmx
./vrdmactl --socket /tmp/pt/s vm define vmA vm.vmx >/dev/null 2>&1
./vrdmactl --socket /tmp/pt/s vm define vmB vm.vmx >/dev/null 2>&1
export LD_LIBRARY_PATH=$repo/guest/ibverbs/build
pt() { # test args...
  local t=$1; shift
  VRDMA_VM=vmA $t -d vrdma0 -x 0 "$@" >/tmp/pt/srv.out 2>&1 &
  local s=$!
  sleep 0.5
  VRDMA_VM=vmB $t -d vrdma0 -x 0 "$@" localhost 2>&1 | grep -E "^\s*[0-9]+\s+[0-9]+" | tail -1
  wait $s
}
for r in 1 2 3; do
  echo "round $r"
  echo -n "ib_write_bw 65536: "; pt ib_write_bw -s 65536 -n 5000
  echo -n "ib_write_bw 1M: "; pt ib_write_bw -s 1048576 -n 1000
  echo -n "ib_write_lat 8: "; pt ib_write_lat -s 8 -n 5000
  echo -n "ib_send_bw 8: "; pt ib_send_bw -s 8 -n 50000
  echo -n "perf write_bw 65536: "; /tmp/pt/vrdmactl perf write_bw --local --path memcpy -s 65536 -n 5000 --out_json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["BW_average"], "MiB/s")'
  echo -n "perf write_bw 1M: "; /tmp/pt/vrdmactl perf write_bw --local --path memcpy -s 1048576 -n 1000 --out_json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["BW_average"], "MiB/s")'
  echo -n "perf write_lat 8: "; /tmp/pt/vrdmactl perf write_lat --local --path memcpy -s 8 -n 5000 --out_json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["t_typical"], "us typical")'
  echo -n "perf send_bw 8: "; /tmp/pt/vrdmactl perf send_bw --local --path memcpy -s 8 -n 50000 --out_json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["MsgRate"], "Mpps")'
done
kill $AG
