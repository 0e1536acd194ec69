#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/peers.sh - measure the peer baselines vrdma benchmarks are compared against.
#
# Default mode "loopback": 127.0.0.1 / lo / shared memory. Mode "veth" (--veth,
# root only): the same TCP/UDP peers, server in network namespace peers-PID-a
# (10.199.250.1) and client in peers-PID-b (10.199.250.2), each joined by a veth
# pair to a bridge in namespace peers-PID-sw, MTU 9000 (PEERS_VETH_MTU) - the
# topology of the vrdma test harness (internal/testenv/netns.go), i.e. the path of
# BenchmarkTCP*/veth. The shared-memory UCX tests are skipped in veth mode (null
# figures, reason under "skipped"). The namespaces are deleted on exit.
# Server pinned to core 0, client to core 1 (override with PEERS_SERVER_CPU /
# PEERS_CLIENT_CPU). Every tool invocation runs under `timeout`; background
# servers are killed on exit.
#
#   bench/peers.sh                 # human table on stdout
#   bench/peers.sh --json out.json # also write the figures as a JSON object
#   bench/peers.sh --veth ...      # TCP/UDP peers across a veth pair (root)
#   bench/peers.sh --keep-logs     # keep raw tool output (path printed at exit)
#
# Needs: ucx-utils (ucx_perftest), sockperf, iperf3, jq, iproute2 (ss, ip),
# util-linux (taskset), coreutils (timeout). ~45 s on a quiet box (veth: ~30 s);
# tests disturbed by other processes are retried (see measure()), so a busy box
# takes longer.
# Exit status: 0 all figures measured; 1 some test failed (its figures are null
# in the JSON and listed under "errors"); 2 usage / missing tool / --veth without
# root / namespaces could not be set up.
#
# Units: UCX "MB/s" is 2^20 B/s, so *_MiBps keys hold exactly what ucx_perftest
# prints as MB/s. UCX and sockperf latencies are one-way (RTT/2), in microseconds.
# UCX "avg" is UCX's "overall" column (whole run); "median" is UCX's 50.0%ile
# column (median of the last 2048 iterations). iperf3 Gbit/s is 10^9 bit/s.
# Notes and reference figures: bench/PEERS-NOTES.md.
set -euo pipefail

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

JSON_OUT=""
KEEP_LOGS=0
MODE=loopback
while (($#)); do
    case "$1" in
        --json) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; JSON_OUT=$2; shift 2 ;;
        --json=*) JSON_OUT=${1#--json=}; shift ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        --veth) MODE=veth; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "peers.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ $MODE == veth && $EUID -ne 0 ]]; then
    echo "peers.sh: --veth creates network namespaces and needs root (euid $EUID): run it as root, or without --veth for the loopback figures" >&2
    exit 2
fi
NEED=(ucx_perftest sockperf iperf3 jq ss taskset timeout awk sed)
[[ $MODE == veth ]] && NEED+=(ip)
for tool in "${NEED[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "peers.sh: missing tool: $tool" >&2; exit 2; }
done

PROBE_HOST=127.0.0.1               # the placement probe always runs on the root namespace's lo
# Where the TCP/UDP peers run: server in namespace SRV_NS listening on HOST, client
# in CLI_NS bound to CLI_ADDR; UCX TCP restricted to TCP_DEV. Empty namespace = this one.
if [[ $MODE == veth ]]; then
    NS_PREFIX=peers-                   # namespaces: peers-PID-{sw,a,b}
    SW_NS=${NS_PREFIX}$$-sw
    SRV_NS=${NS_PREFIX}$$-a
    CLI_NS=${NS_PREFIX}$$-b
    HOST=10.199.250.1
    CLI_ADDR=10.199.250.2
    VETH_PREFIX=30
    VETH_MTU=${PEERS_VETH_MTU:-9000}   # the harness's default (ClusterOptions.MTU = records.MaxMTU)
    TCP_DEV=eth0                       # interface name inside the host namespaces, as in the harness
else
    SW_NS=""; SRV_NS=""; CLI_NS=""
    HOST=127.0.0.1
    CLI_ADDR=127.0.0.1
    TCP_DEV=lo
fi
NETNS_CREATED=()
SRV_CPU=${PEERS_SERVER_CPU:-0}
CLI_CPU=${PEERS_CLIENT_CPU:-1}
PORT=${PEERS_PORT_BASE:-23400}     # each server/client pair gets the next port
UCX_TIMEOUT=12                     # seconds per ucx_perftest client (each test takes <4 s on a quiet box)
SRV_TIMEOUT=40                     # seconds, backstop for each background server
SOCKPERF_SECS=3                    # sockperf -t; it adds ~2.5 s (warm-up + drain) on top
SOCKPERF_MSG=14                    # sockperf 3.7 minimum message size (8 is rejected)
IPERF_SECS=5
RETRIES=${PEERS_RETRIES:-2}        # extra attempts for a test disturbed by other processes
DISTURB_PCT=${PEERS_DISTURB_PCT:-10} # foreign CPU (% of one core, averaged over the test) that counts as disturbed
QUIET_PCT=10                       # before each attempt, wait for a 0.2 s window below this ...
QUIET_MAX_S=5                      # ... for at most this long
DEADLINE_S=${PEERS_DEADLINE_S:-60} # after this many seconds: no more retries or quiet-waiting
HARD_DEADLINE_S=${PEERS_HARD_DEADLINE_S:-125} # tests not started by then are skipped (failed)
PROBE_NEAR_US=0.15                 # probe median below this = "near" vCPU placement

# --- veth mode: network namespaces ------------------------------------------
# Mirrors internal/testenv/netns.go: a "switch" namespace holding bridge br0, and
# per host a namespace whose eth0 is a veth joined to br0 through a port in the
# switch namespace; lo up everywhere, the same MTU on the bridge and both veth
# ends. Nothing touches the root namespace's links, addresses or routes.

# nsip ARGS...: ip with a timeout; on failure, print the command and its output and exit 2.
nsip() {
    local out
    if ! out=$(timeout 10 ip "$@" 2>&1); then
        echo "peers.sh: --veth: 'ip $*' failed: $out" >&2
        exit 2
    fi
}
# netns_sweep: delete namespaces peers-PID-* left by runs of this script that
# were killed before their trap ran (PID gone), and any with our own PID.
netns_sweep() {
    local n pid
    for n in $(ip netns list 2>/dev/null | awk '{ print $1 }'); do
        [[ $n =~ ^${NS_PREFIX}([0-9]+)-(sw|a|b)$ ]] || continue
        pid=${BASH_REMATCH[1]}
        if ((pid == $$)) || ! kill -0 "$pid" 2>/dev/null; then
            echo "peers.sh: deleting stale network namespace $n" >&2
            timeout 10 ip netns delete "$n" || true
        fi
    done
}
# netns_add NAME: create namespace NAME (recorded for netns_delete) and bring lo up.
netns_add() {
    nsip netns add "$1"
    NETNS_CREATED+=("$1")
    nsip -n "$1" link set lo up
}
# netns_setup: build the topology and wait until it forwards.
netns_setup() {
    local ns port addr i ok
    netns_sweep
    netns_add "$SW_NS"
    nsip -n "$SW_NS" link add br0 mtu "$VETH_MTU" type bridge
    nsip -n "$SW_NS" link set br0 up
    for ns in "$SRV_NS" "$CLI_NS"; do
        port=v${ns##*-}                       # switch ports va, vb
        addr=$HOST; [[ $ns == "$CLI_NS" ]] && addr=$CLI_ADDR
        netns_add "$ns"
        nsip -n "$SW_NS" link add "$port" mtu "$VETH_MTU" type veth peer name "$TCP_DEV" mtu "$VETH_MTU" netns "$ns"
        nsip -n "$SW_NS" link set "$port" master br0 up
        nsip -n "$ns" addr add "$addr/$VETH_PREFIX" dev "$TCP_DEV"
        nsip -n "$ns" link set "$TCP_DEV" up
    done
    # Both bridge ports forwarding and both eth0 with carrier (bridge without STP:
    # immediate, but do not rely on it).
    for ((i = 0; i < 100; i++)); do
        ok=1
        for port in va vb; do
            ip -n "$SW_NS" -d link show "$port" 2>/dev/null | grep -q 'state forwarding' || ok=0
        done
        for ns in "$SRV_NS" "$CLI_NS"; do
            ip -n "$ns" link show "$TCP_DEV" 2>/dev/null | grep -q 'LOWER_UP' || ok=0
        done
        ((ok)) && break
        sleep 0.05
    done
    ((ok)) || { echo "peers.sh: --veth: links not up after 5 s (see 'ip -n $SW_NS -d link')" >&2; exit 2; }
    # The client must reach the server through eth0, nothing else.
    ip -n "$CLI_NS" route get "$HOST" 2>/dev/null | grep -q "dev $TCP_DEV " ||
        { echo "peers.sh: --veth: no route from $CLI_NS to $HOST via $TCP_DEV" >&2; exit 2; }
    echo "peers.sh: veth mode: server in netns $SRV_NS ($HOST), client in netns $CLI_NS ($CLI_ADDR)," \
         "bridge br0 in netns $SW_NS, MTU $VETH_MTU" >&2
}
# netns_delete: delete the namespaces this run created (switch last); called from
# cleanup after every server has been killed and reaped.
netns_delete() {
    local i ns
    for ((i = ${#NETNS_CREATED[@]} - 1; i >= 0; i--)); do
        ns=${NETNS_CREATED[i]}
        [[ -e /run/netns/$ns ]] || continue
        timeout 10 ip netns delete "$ns" ||
            echo "peers.sh: could not delete network namespace $ns: delete it with 'ip netns delete $ns'" >&2
    done
    NETNS_CREATED=()
}

LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/vrdma-peers.XXXXXX")
SERVER_PIDS=()
SRV_PID=""

cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    for p in "${SERVER_PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${SERVER_PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    netns_delete
    if ((KEEP_LOGS)); then
        echo "peers.sh: raw logs kept in $LOGDIR" >&2
    else
        rm -rf "$LOGDIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- results bookkeeping ----------------------------------------------------
declare -A FIG=()      # figure key -> number or "null"
declare -A CMDS=()     # test id -> client command line of the kept attempt
declare -A QUAL=()     # test id -> "foreign_cpu_pct attempts wall_s placement probe_before probe_after"
FIG_KEYS=()
TEST_IDS=()
ERRORS=()
DISTURBED=()
SKIPPED=()            # test ids not run in this mode
declare -A SKIP_WHY=() # test id -> reason
declare -A R=()        # figures of the current attempt
R_KEYS=()
R_ERR=""
R_CMD=""
DRY_KEYS=0             # 1: test functions only declare their figure keys

rkeys() { local k; R=(); R_KEYS=("$@"); for k in "$@"; do R[$k]=null; done; }
is_num() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
# ss_srv ARGS...: ss in the server's namespace (SRV_NS; empty = this one).
ss_srv() {
    if [[ -n $SRV_NS ]]; then ss -N "$SRV_NS" "$@"; else ss "$@"; fi
}
# next_port: advance PORT to the next port with no TCP/UDP socket bound to it (in
# the server's namespace), so a stray listener (another run, another tool) can
# never answer our client.
next_port() {
    PORT=$((PORT + 1))
    while ss_srv -H -n -a -t -u "sport = :$PORT" 2>/dev/null | grep -q .; do PORT=$((PORT + 1)); done
}
fgt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }

# --- foreign-load accounting -------------------------------------------------
# Other work on this 2-core box (builds, tests) skews the figures. cpu_sample
# prints: box busy ticks (user+nice+system+irq+softirq+steal), CPU ticks used by
# this script and its reaped descendants, and uptime in ticks (USER_HZ = 100).
cpu_sample() {
    awk -v self="/proc/$$/stat" '
        FILENAME == "/proc/stat" && $1 == "cpu" { busy = $2 + $3 + $4 + $7 + $8 + $9 }
        FILENAME == "/proc/uptime" { wall = $1 * 100 }
        FILENAME == self { sub(/^.*\) /, ""); split($0, f, " "); ours = f[12] + f[13] + f[14] + f[15] }
        END { printf "%d %d %d\n", busy, ours, wall }' /proc/stat /proc/uptime "/proc/$$/stat"
}
# foreign_pct "SAMPLE_BEFORE" "SAMPLE_AFTER": CPU used by others, in % of one core.
foreign_pct() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        split(a, x, " "); split(b, y, " "); w = y[3] - x[3]; if (w <= 0) w = 1
        f = (y[1] - x[1]) - (y[2] - x[2]); if (f < 0) f = 0
        printf "%.1f\n", 100 * f / w }'
}
# wait_quiet: wait (at most QUIET_MAX_S) for a 0.2 s window with little foreign load.
wait_quiet() {
    local i a b pct
    for ((i = 0; i < QUIET_MAX_S * 5; i++)); do
        a=$(cpu_sample); sleep 0.2; b=$(cpu_sample)
        pct=$(foreign_pct "$a" "$b")
        fgt "$pct" "$QUIET_PCT" || return 0
    done
    echo "peers.sh: box still busy (${pct}% of a core used by other processes); measuring anyway" >&2
}

# --- vCPU placement probe ----------------------------------------------------
# On this VM the core-to-core latency between vCPU 0 and 1 is bimodal and flips
# every few tens of seconds (hypervisor moving the vCPUs): the median one-way
# UCX shm put latency is ~0.075 us ("near") or ~0.27 us ("far"), and every
# shared-memory figure follows it. probe() measures it (~0.15 s) into PROBE_US.
# The probe runs in this script's own namespace in both modes (SRV_NS shadowed).
probe() {
    local saved_err=$R_ERR log SRV_NS=""
    PROBE_US=null
    next_port
    if start_server probe t "$PORT" env UCX_TLS=posix,self ucx_perftest -p "$PORT" -c "$SRV_CPU"; then
        log="$LOGDIR/probe.$PORT.cli.log"
        timeout -k 1 3 taskset -c "$CLI_CPU" env UCX_TLS=posix,self ucx_perftest "$PROBE_HOST" -p "$PORT" \
            -c "$CLI_CPU" -t ucp_put_lat -s 8 -n 20000 -w 2000 -f -v >"$log" 2>&1 || true
        stop_server "$SRV_PID" 20
        PROBE_US=$(awk -F, '
            $1 == "iterations" { for (i = 1; i <= NF; i++) if ($i ~ /(percentile|typical)_lat$/) c = i; next }
            c && $1 ~ /^ *[0-9]+ *$/ { m = $c } END { print (m == "" ? "null" : m) }' "$log")
        is_num "$PROBE_US" || PROBE_US=null
    fi
    R_ERR=$saved_err
}
# placement BEFORE AFTER: near | far | mixed | unknown
placement() {
    local b=$1 a=$2
    if [[ $b == null || $a == null ]]; then echo unknown
    elif ! fgt "$b" "$PROBE_NEAR_US" && ! fgt "$a" "$PROBE_NEAR_US"; then echo near
    elif fgt "$b" "$PROBE_NEAR_US" && fgt "$a" "$PROBE_NEAR_US"; then echo far
    else echo mixed; fi
}

# measure ID FUNC ARGS...: run a test with a placement probe before and after,
# retrying (up to RETRIES more times, while time is left) when other processes
# used more than DISTURB_PCT% of a core during it or the placement changed
# during it. Keeps the successful attempt with the lowest score (foreign CPU %,
# +1000 if the placement changed).
measure() {
    local id=$1 try tries=0 ok a b pct wall best="" score k last_err="no attempt ran" p0 p1 pl
    shift
    TEST_IDS+=("$id")
    if (($(date +%s) - START > HARD_DEADLINE_S)); then
        ERRORS+=("$id: skipped, time budget of ${HARD_DEADLINE_S}s used up (box busy?)")
        QUAL[$id]="null 0 null unknown null null"
        echo "peers.sh: $id skipped (time budget used up)" >&2
        DRY_KEYS=1; "$@" || true; DRY_KEYS=0
        for k in "${R_KEYS[@]}"; do FIG_KEYS+=("$k"); FIG[$k]=null; done
        return 0
    fi
    for ((try = 1; try <= 1 + RETRIES; try++)); do
        if ((try > 1 && $(date +%s) - START > DEADLINE_S)); then break; fi
        (($(date +%s) - START > DEADLINE_S)) || wait_quiet
        tries=$try
        probe; p0=$PROBE_US
        R_ERR=""; R_CMD=""
        a=$(cpu_sample)
        if "$@"; then ok=1; else ok=0; fi
        b=$(cpu_sample)
        probe; p1=$PROBE_US
        pl=$(placement "$p0" "$p1")
        pct=$(foreign_pct "$a" "$b")
        wall=$(awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.1f", (y[3] - x[3]) / 100 }')
        if ((try == 1)); then
            for k in "${R_KEYS[@]}"; do FIG_KEYS+=("$k"); FIG[$k]=null; done
        fi
        if ((ok)); then
            score=$pct
            [[ $pl == mixed ]] && score=$(awk -v p="$pct" 'BEGIN { print p + 1000 }')
            if [[ -z $best ]] || fgt "$best" "$score"; then
                best=$score
                for k in "${R_KEYS[@]}"; do FIG[$k]=${R[$k]}; done
                CMDS[$id]=$R_CMD
                QUAL[$id]="$pct $try $wall $pl $p0 $p1"
            fi
            fgt "$score" "$DISTURB_PCT" || break
            echo "peers.sh: $id attempt $try disturbed (${pct}% of a core used by other processes, placement $pl)" >&2
        else
            last_err=$R_ERR
            echo "peers.sh: $id attempt $try failed: $R_ERR (logs: $LOGDIR)" >&2
        fi
    done
    if [[ -z $best ]]; then
        ERRORS+=("$id: $last_err")
        QUAL[$id]="null $tries null unknown null null"
    else
        read -r pct try wall pl p0 p1 <<<"${QUAL[$id]}"
        QUAL[$id]="$pct $tries $wall $pl $p0 $p1"
        fgt "$best" "$DISTURB_PCT" && DISTURBED+=("$id")
    fi
    return 0
}

# skip ID REASON FUNC ARGS...: a test that does not apply to this mode: its figures
# are null, it is listed under "skipped" (not "errors"), and it does not change the
# exit status.
skip() {
    local id=$1 why=$2 k
    shift 2
    TEST_IDS+=("$id")
    SKIPPED+=("$id")
    SKIP_WHY[$id]=$why
    QUAL[$id]="null 0 null unknown null null"
    DRY_KEYS=1; "$@" || true; DRY_KEYS=0
    for k in "${R_KEYS[@]}"; do FIG_KEYS+=("$k"); FIG[$k]=null; done
}

# --- server lifecycle ------------------------------------------------------
# wait_listen t|u PORT: wait until something listens on PORT (tcp) / is bound (udp).
wait_listen() {
    local proto=$1 port=$2 i
    for ((i = 0; i < 100; i++)); do
        if ss_srv -H -n -l "-$proto" "sport = :$port" 2>/dev/null | grep -q .; then
            return 0
        fi
        kill -0 "$SRV_PID" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# in_ns NS: set NSX to the command prefix that runs a command in namespace NS (empty if NS is).
# `ip netns exec` execs the command in place (no fork), so timeout signals the tool itself.
NSX=()
in_ns() { NSX=(); [[ -z $1 ]] || NSX=(ip netns exec "$1"); }

# start_server NAME t|u PORT CMD...: run CMD pinned to SRV_CPU in the background,
# in the server's namespace.
start_server() {
    local name=$1 proto=$2 port=$3
    shift 3
    in_ns "$SRV_NS"
    timeout -k 2 "$SRV_TIMEOUT" "${NSX[@]}" taskset -c "$SRV_CPU" "$@" >"$LOGDIR/$name.$port.srv.log" 2>&1 &
    SRV_PID=$!
    SERVER_PIDS+=("$SRV_PID")
    if ! wait_listen "$proto" "$port"; then
        stop_server "$SRV_PID" 0
        R_ERR="server did not listen on port $port"
        return 1
    fi
}

# stop_server PID GRACE_TICKS: let it exit by itself for GRACE_TICKS*50ms, then TERM.
stop_server() {
    local pid=$1 grace=$2 i p keep=()
    for ((i = 0; i < grace; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${SERVER_PIDS[@]}"; do [[ $p == "$pid" ]] || keep+=("$p"); done
    SERVER_PIDS=("${keep[@]}")
}

# run_client NAME TIMEOUT CMD...: run CMD pinned to CLI_CPU with a timeout, in the
# client's namespace; stdout -> CLI_LOG.
run_client() {
    local name=$1 tmo=$2 rc=0 tool
    shift 2
    in_ns "$CLI_NS"
    R_CMD="${NSX[*]}${NSX:+ }taskset -c $CLI_CPU $*"
    CLI_LOG="$LOGDIR/$name.$PORT.cli.log"
    timeout -k 2 "$tmo" "${NSX[@]}" taskset -c "$CLI_CPU" "$@" >"$CLI_LOG" 2>"${CLI_LOG%.log}.err" || rc=$?
    if ((rc)); then
        for tool in "$@"; do [[ $tool == env || $tool == *=* ]] || break; done
        if ((rc == 124)); then R_ERR="$tool client timed out after ${tmo}s (box busy?)"
        else R_ERR="$tool client exit status $rc: $(tail -n1 "${CLI_LOG%.log}.err" 2>/dev/null)"; fi
    fi
    return "$rc"
}

# --- UCX ---------------------------------------------------------------------
# ucx ID KIND(lat|bw) TLS NETDEV TEST SIZE ITERS WARMUP [extra ucx_perftest args]
# Keys: <ID>_median_us and <ID>_avg_us (lat) or <ID>_MiBps (bw).
ucx() {
    local id=$1 kind=$2 tls=$3 netdev=$4 test=$5 size=$6 iters=$7 warmup=$8
    shift 8
    local envs=("UCX_TLS=$tls") rc=0 parsed med avg bw
    [[ -n $netdev ]] && envs+=("UCX_NET_DEVICES=$netdev")
    if [[ $kind == lat ]]; then rkeys "${id}_median_us" "${id}_avg_us"; else rkeys "${id}_MiBps"; fi
    ((DRY_KEYS == 0)) || return 0
    next_port
    start_server "$id" t "$PORT" env "${envs[@]}" ucx_perftest -p "$PORT" -c "$SRV_CPU" || return 1
    run_client "$id" "$UCX_TIMEOUT" env "${envs[@]}" ucx_perftest "$HOST" -p "$PORT" -c "$CLI_CPU" \
        -t "$test" -s "$size" -n "$iters" -w "$warmup" "$@" -f -v || rc=$?
    stop_server "$SRV_PID" 60
    ((rc == 0)) || return 1
    # -f -v prints a CSV header line then the final line; select columns by name.
    parsed=$(awk -F, '
        $1 == "iterations" { for (i = 1; i <= NF; i++) col[$i] = i; hdr = 1; next }
        hdr && $1 ~ /^ *[0-9]+ *$/ { n = split($0, v, ",") }
        END {
            if (!n) exit 1
            med = ""; for (c in col) if (c ~ /(percentile|typical)_lat$/) med = v[col[c]]
            printf "%s %s %s\n", med, v[col["overall_lat"]], v[col["overall_bw"]]
        }' "$CLI_LOG") || { R_ERR="unparsable ucx_perftest output"; return 1; }
    read -r med avg bw <<<"$parsed"
    if [[ $kind == lat ]]; then
        is_num "${med:-}" && is_num "${avg:-}" || { R_ERR="no latency figures in ucx_perftest output"; return 1; }
        R[${id}_median_us]=$med; R[${id}_avg_us]=$avg
    else
        is_num "${bw:-}" || { R_ERR="no bandwidth figure in ucx_perftest output"; return 1; }
        R[${id}_MiBps]=$bw
    fi
}

# --- sockperf ----------------------------------------------------------------
# sockperf_pp ID udp|tcp. Keys: <ID>_median_us, <ID>_avg_us, <ID>_p99_us (half-RTT).
sockperf_pp() {
    local id=$1 proto=$2 flag=() ssproto=u rc=0 txt med avg p99
    [[ $proto == tcp ]] && { flag=(--tcp); ssproto=t; }
    rkeys "${id}_median_us" "${id}_avg_us" "${id}_p99_us"
    ((DRY_KEYS == 0)) || return 0
    next_port
    start_server "$id" "$ssproto" "$PORT" sockperf sr -i "$HOST" -p "$PORT" "${flag[@]}" || return 1
    run_client "$id" $((SOCKPERF_SECS + 5)) sockperf pp -i "$HOST" -p "$PORT" "${flag[@]}" -m "$SOCKPERF_MSG" \
        -t "$SOCKPERF_SECS" || rc=$?
    stop_server "$SRV_PID" 0
    ((rc == 0)) || return 1
    txt=$(sed 's/\x1b\[[0-9;]*m//g' "$CLI_LOG")
    avg=$(sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' <<<"$txt" | head -n1)
    med=$(sed -n 's/.*percentile 50\.000 = *\([0-9.]*\).*/\1/p' <<<"$txt" | head -n1)
    p99=$(sed -n 's/.*percentile 99\.000 = *\([0-9.]*\).*/\1/p' <<<"$txt" | head -n1)
    if ! { is_num "$avg" && is_num "$med" && is_num "$p99"; }; then
        R_ERR="unparsable sockperf output (note: sockperf exits 0 on bad options)"
        return 1
    fi
    R[${id}_median_us]=$med; R[${id}_avg_us]=$avg; R[${id}_p99_us]=$p99
}

# --- iperf3 ------------------------------------------------------------------
# Keys: iperf3_tcp_Gbps (10^9 bit/s), iperf3_tcp_MiBps, iperf3_tcp_retransmits.
iperf3_tcp() {
    local id=iperf3_tcp rc=0 bps retr
    rkeys "${id}_Gbps" "${id}_MiBps" "${id}_retransmits"
    ((DRY_KEYS == 0)) || return 0
    next_port
    start_server "$id" t "$PORT" iperf3 -s -1 -B "$HOST" -p "$PORT" || return 1
    run_client "$id" $((IPERF_SECS + 5)) iperf3 -c "$HOST" -B "$CLI_ADDR" -p "$PORT" -t "$IPERF_SECS" -J || rc=$?
    stop_server "$SRV_PID" 40
    ((rc == 0)) || return 1
    bps=$(jq -r '.end.sum_received.bits_per_second // empty' "$CLI_LOG" 2>/dev/null || true)
    retr=$(jq -r '.end.sum_sent.retransmits // empty' "$CLI_LOG" 2>/dev/null || true)
    is_num "${bps%.*}" || { R_ERR="unparsable iperf3 JSON"; return 1; }
    R[${id}_Gbps]=$(awk -v b="$bps" 'BEGIN { printf "%.2f", b / 1e9 }')
    R[${id}_MiBps]=$(awk -v b="$bps" 'BEGIN { printf "%.0f", b / 8 / 1048576 }')
    if is_num "${retr:-}"; then R[${id}_retransmits]=$retr; fi
}

# --- run ---------------------------------------------------------------------
if [[ $MODE == veth ]]; then netns_setup; fi
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)
SHM=posix,self
TCP=tcp
SP=$SOCKPERF_MSG
# Shared-memory tests do not cross a network path: measured in loopback mode only.
SHM_RUN=(measure)
if [[ $MODE == veth ]]; then
    SHM_RUN=(skip_shm)
    skip_shm() { skip "$1" "shared memory only: not run in veth mode (see the loopback run)" "${@:2}"; }
fi

# UCX shared memory. Window (-O) is given explicitly as 32, the ucx_perftest
# default for tag_bw/ucp_put_bw, so the figure does not depend on the build.
"${SHM_RUN[@]}" ucx_shm_put_lat_8B   ucx ucx_shm_put_lat_8B   lat "$SHM" "" ucp_put_lat 8        500000  50000
"${SHM_RUN[@]}" ucx_shm_tag_lat_8B   ucx ucx_shm_tag_lat_8B   lat "$SHM" "" tag_lat     8        200000  20000
"${SHM_RUN[@]}" ucx_shm_put_bw_4KiB  ucx ucx_shm_put_bw_4KiB  bw  "$SHM" "" ucp_put_bw  4096     1000000 100000 -O 32
"${SHM_RUN[@]}" ucx_shm_put_bw_64KiB ucx ucx_shm_put_bw_64KiB bw  "$SHM" "" ucp_put_bw  65536    200000  20000  -O 32
"${SHM_RUN[@]}" ucx_shm_put_bw_1MiB  ucx ucx_shm_put_bw_1MiB  bw  "$SHM" "" ucp_put_bw  1048576  20000   2000   -O 32
"${SHM_RUN[@]}" ucx_shm_put_bw_64MiB ucx ucx_shm_put_bw_64MiB bw  "$SHM" "" ucp_put_bw  67108864 200     20     -O 32
"${SHM_RUN[@]}" ucx_shm_tag_bw_64KiB ucx ucx_shm_tag_bw_64KiB bw  "$SHM" "" tag_bw      65536    100000  10000  -O 32
"${SHM_RUN[@]}" ucx_shm_tag_bw_1MiB  ucx ucx_shm_tag_bw_1MiB  bw  "$SHM" "" tag_bw      1048576  10000   1000   -O 32
# UCX over TCP, restricted to lo (loopback) or the namespaces' eth0 (veth).
measure ucx_tcp_tag_lat_8B   ucx ucx_tcp_tag_lat_8B   lat "$TCP" "$TCP_DEV" tag_lat     8        100000  10000
measure ucx_tcp_tag_bw_64KiB ucx ucx_tcp_tag_bw_64KiB bw  "$TCP" "$TCP_DEV" tag_bw      65536    20000   2000   -O 32
measure ucx_tcp_tag_bw_1MiB  ucx ucx_tcp_tag_bw_1MiB  bw  "$TCP" "$TCP_DEV" tag_bw      1048576  4000    400    -O 32
measure ucx_tcp_put_bw_64KiB ucx ucx_tcp_put_bw_64KiB bw  "$TCP" "$TCP_DEV" ucp_put_bw  65536    10000   1000   -O 32
measure ucx_tcp_put_bw_1MiB  ucx ucx_tcp_put_bw_1MiB  bw  "$TCP" "$TCP_DEV" ucp_put_bw  1048576  1000    100    -O 32
# Kernel sockets.
measure "sockperf_udp_pp_${SP}B" sockperf_pp "sockperf_udp_pp_${SP}B" udp
measure "sockperf_tcp_pp_${SP}B" sockperf_pp "sockperf_tcp_pp_${SP}B" tcp
measure iperf3_tcp iperf3_tcp

ELAPSED=$(($(date +%s) - START))
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# --- human table ---------------------------------------------------------------
f() {
    local v=${FIG[$1]:-null} id
    if [[ $v != null ]]; then echo "$v"; return; fi
    for id in "${SKIPPED[@]}"; do [[ $1 == "$id"_* ]] && { echo "skip"; return; }; done
    echo "FAIL"
}
bg() { local q; read -r q _ <<<"${QUAL[$1]:-null}"; [[ $q == null ]] && echo "-" || echo "$q"; }
pl() { local q; read -r _ _ _ q _ <<<"${QUAL[$1]:-x x x unknown}"; echo "${q:-unknown}"; }
FMT='%-16s %-12s %-7s %10s %10s %12s %6s  %s\n'
lat_row() { printf "$FMT" "$1" "$2" "$3" "$(f "$4_median_us")" "$(f "$4_avg_us")" "-" "$(bg "$4")" "$(pl "$4")"; }
bw_row()  { printf "$FMT" "$1" "$2" "$3" "-" "-" "$(f "$4_MiBps")" "$(bg "$4")" "$(pl "$4")"; }
echo
if [[ $MODE == veth ]]; then
    WHERE="veth (server netns $SRV_NS $HOST, client netns $CLI_NS $CLI_ADDR, bridge, MTU $VETH_MTU)"
else
    WHERE="loopback"
fi
echo "vrdma peer baselines: $WHERE, server cpu $SRV_CPU, client cpu $CLI_CPU, ${ELAPSED}s, loadavg $LOAD_BEFORE -> $LOAD_AFTER"
printf "$FMT" "path" "test" "size" "median_us" "avg_us" "MiB/s" "bg%" "vcpus"
printf "$FMT" "----" "----" "----" "---------" "------" "-----" "---" "-----"
lat_row "ucx posix,self" ucp_put_lat "8 B"    ucx_shm_put_lat_8B
lat_row "ucx posix,self" tag_lat     "8 B"    ucx_shm_tag_lat_8B
bw_row  "ucx posix,self" ucp_put_bw  "4 KiB"  ucx_shm_put_bw_4KiB
bw_row  "ucx posix,self" ucp_put_bw  "64 KiB" ucx_shm_put_bw_64KiB
bw_row  "ucx posix,self" ucp_put_bw  "1 MiB"  ucx_shm_put_bw_1MiB
bw_row  "ucx posix,self" ucp_put_bw  "64 MiB" ucx_shm_put_bw_64MiB
bw_row  "ucx posix,self" tag_bw      "64 KiB" ucx_shm_tag_bw_64KiB
bw_row  "ucx posix,self" tag_bw      "1 MiB"  ucx_shm_tag_bw_1MiB
lat_row "ucx tcp ($TCP_DEV)" tag_lat   "8 B"    ucx_tcp_tag_lat_8B
bw_row  "ucx tcp ($TCP_DEV)" tag_bw    "64 KiB" ucx_tcp_tag_bw_64KiB
bw_row  "ucx tcp ($TCP_DEV)" tag_bw    "1 MiB"  ucx_tcp_tag_bw_1MiB
bw_row  "ucx tcp ($TCP_DEV)" ucp_put_bw "64 KiB" ucx_tcp_put_bw_64KiB
bw_row  "ucx tcp ($TCP_DEV)" ucp_put_bw "1 MiB" ucx_tcp_put_bw_1MiB
lat_row "sockperf udp"   ping-pong   "$SP B"  "sockperf_udp_pp_${SP}B"
lat_row "sockperf tcp"   ping-pong   "$SP B"  "sockperf_tcp_pp_${SP}B"
bw_row  "iperf3 tcp"     "1 stream"  "${IPERF_SECS} s" iperf3_tcp
echo "iperf3: $(f iperf3_tcp_Gbps) Gbit/s, $(f iperf3_tcp_retransmits) retransmits." \
     "sockperf p99: udp $(f "sockperf_udp_pp_${SP}B_p99_us") us, tcp $(f "sockperf_tcp_pp_${SP}B_p99_us") us."
echo "Latencies are one-way (RTT/2). MiB/s = 2^20 B/s (ucx_perftest prints it as 'MB/s')."
echo "bg% = CPU used by other processes during the kept attempt, in % of one core (>${DISTURB_PCT} = disturbed)."
echo "vcpus = vCPU placement from the probe before/after the test: near (shm put_lat median <= ${PROBE_NEAR_US} us)," \
     "far, or mixed (changed during the test). Shared-memory figures depend on it; see bench/PEERS-NOTES.md."
if ((${#DISTURBED[@]})); then echo "DISTURBED (all attempts had foreign load): ${DISTURBED[*]}"; fi
if ((${#SKIPPED[@]})); then echo "SKIPPED (${SKIP_WHY[${SKIPPED[0]}]}): ${SKIPPED[*]}"; fi
if ((${#ERRORS[@]})); then printf 'FAILED: %s\n' "${ERRORS[@]}"; fi

# --- JSON --------------------------------------------------------------------
if [[ -n $JSON_OUT ]]; then
    # MTU of the path the TCP peers used: the namespaces' eth0, or lo.
    NET_MTU=$(${CLI_NS:+ip netns exec "$CLI_NS"} cat "/sys/class/net/$TCP_DEV/mtu" 2>/dev/null || true)
    ver() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo unknown; }
    {
        for k in "${FIG_KEYS[@]}"; do printf 'F\t%s\t%s\n' "$k" "${FIG[$k]}"; done
        for k in "${TEST_IDS[@]}"; do
            if [[ -n ${CMDS[$k]:-} ]]; then printf 'C\t%s\t%s\n' "$k" "${CMDS[$k]}"; fi
        done
        for e in "${ERRORS[@]}"; do printf 'E\t%s\t\n' "$e"; done
        for k in "${SKIPPED[@]}"; do printf 'S\t%s\t%s\n' "$k" "${SKIP_WHY[$k]}"; done
        for k in "${TEST_IDS[@]}"; do
            read -r q1 q2 q3 q4 q5 q6 <<<"${QUAL[$k]:-null 0 null unknown null null}"
            printf 'Q\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$k" "$q1" "$q2" "$q3" "$q4" "$q5" "$q6"
        done
    } | jq -R -s \
        --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        --arg cpu "$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)" \
        --arg ncpu "$(nproc)" \
        --arg kernel "$(uname -r)" \
        --arg ucx "$(ver ucx-utils)" --arg sockperf "$(ver sockperf)" --arg iperf3 "$(ver iperf3)" \
        --arg srv "$SRV_CPU" --arg cli "$CLI_CPU" --arg elapsed "$ELAPSED" \
        --arg lb "$LOAD_BEFORE" --arg la "$LOAD_AFTER" --arg spmsg "$SOCKPERF_MSG" --arg disturb "$DISTURB_PCT" --arg near "$PROBE_NEAR_US" \
        --arg mode "$MODE" --arg saddr "$HOST" --arg caddr "$CLI_ADDR" --arg dev "$TCP_DEV" \
        --arg sns "$SRV_NS" --arg cns "$CLI_NS" --arg swns "$SW_NS" --arg mtu "$NET_MTU" '
        [split("\n")[] | select(length > 0) | split("\t")] as $rows
        | def nul: if . == "" then null else . end;
        {
            schema: "vrdma-peers/1",
            mode: $mode,
            meta: {
                network: {
                    mode: $mode, server_addr: $saddr, client_addr: $caddr, ucx_net_devices: $dev,
                    server_netns: ($sns | nul), client_netns: ($cns | nul), switch_netns: ($swns | nul),
                    topology: (if $mode == "veth" then "veth pairs to bridge br0 (as internal/testenv/netns.go)" else "lo" end),
                    mtu: ($mtu | nul | if . == null then null else tonumber end)
                },
                date: $date, cpu_model: $cpu, cpus: ($ncpu | tonumber), kernel: $kernel,
                packages: {"ucx-utils": $ucx, sockperf: $sockperf, iperf3: $iperf3},
                server_cpu: ($srv | tonumber), client_cpu: ($cli | tonumber),
                elapsed_s: ($elapsed | tonumber), loadavg_before: $lb, loadavg_after: $la,
                sockperf_msg_bytes: ($spmsg | tonumber),
                disturb_threshold_pct_of_core: ($disturb | tonumber),
                probe_near_threshold_us: ($near | tonumber),
                units: {
                    _us: "microseconds, one-way (RTT/2) for UCX and sockperf",
                    _MiBps: "2^20 bytes/s (ucx_perftest prints this as MB/s)",
                    _Gbps: "10^9 bits/s"
                }
            },
            figures: ([$rows[] | select(.[0] == "F")
                       | {key: .[1], value: (if .[2] == "null" then null else (.[2] | tonumber) end)}]
                      | from_entries),
            commands: ([$rows[] | select(.[0] == "C") | {key: .[1], value: .[2]}] | from_entries),
            quality: ([$rows[] | select(.[0] == "Q")
                       | {key: .[1], value: {
                            foreign_cpu_pct_of_core: (if .[2] == "null" then null else (.[2] | tonumber) end),
                            attempts: (.[3] | tonumber),
                            wall_s: (if .[4] == "null" then null else (.[4] | tonumber) end),
                            disturbed: (if .[2] == "null" then null
                                        else ((.[2] | tonumber) > ($disturb | tonumber)) or .[5] == "mixed" end),
                            vcpu_placement: .[5],
                            probe_before_us: (if .[6] == "null" then null else (.[6] | tonumber) end),
                            probe_after_us: (if .[7] == "null" then null else (.[7] | tonumber) end)}}]
                      | from_entries),
            errors: [$rows[] | select(.[0] == "E") | .[1]],
            skipped: ([$rows[] | select(.[0] == "S") | {key: .[1], value: .[2]}] | from_entries)
          }
        | .placement = (.skipped as $sk | .quality | to_entries | map(select($sk[.key] == null))
                        | group_by(.value.vcpu_placement)
                        | map({key: .[0].value.vcpu_placement, value: map(.key)}) | from_entries)' >"$JSON_OUT"
    echo "wrote $JSON_OUT"
fi

((${#ERRORS[@]} == 0)) || exit 1
