# SPDX-License-Identifier: Apache-2.0
# bench/lib.sh - helpers shared by bench/run and bench/perftest.sh; sourced, not run.
#
# build_vrdma BIN         vrdmactl and vrdmad into BIN, the drop-in libibverbs into
#                         guest/ibverbs/build
# dropin_start BIN DIR    the VMs perftest runs between on each path: a standalone
#                         agent with VMs vmA and vmB (memcpy) and vmC and vmD, which
#                         allow each other direct mapping (memcpy-direct), and vrdmactl quickstart
#                         --keep (tcp: vm3 <- vm1, rdma: vm5 <- vm4); state and logs in DIR
# dropin_pt PATH OUT PROGRAM ARGS...
#                         unmodified perftest PROGRAM between the path's two VMs; the
#                         client's output in OUT, its result line on stdout
# dropin_go PATH OUT TEST ARGS...
#                         the same test with the Go library (vrdmactl perf TEST as
#                         server and client) between the same two VMs
# dropin_ucx PATH OUT ARGS...
#                         unmodified ucx_perftest ARGS on UCP over vrdma's rc_verbs
#                         (UCX_TLS=rc_verbs,ud_verbs:aux) between the path's two VMs,
#                         through vrdmactl exec; the client's CSV result line on stdout
# dropin_stop             stop what dropin_start started
#
# The callers set REPO (the repository) before sourcing, and may set DROPIN_MEM_MB, the
# guest memory of every VM dropin_start defines (default 64 MiB; UCX's rc_verbs needs
# 256: it registers a receive pool of 36 MiB). Every process these start runs
# under `timeout`; dropin_stop kills them by pid. Traffic stays on loopback addresses.

# build_vrdma BIN: build vrdmactl and vrdmad into BIN and the drop-in (make -s -C
# guest/ibverbs); the drop-in's directory is then DROPIN_LIB.
build_vrdma() {
    local bin=$1
    mkdir -p "$bin"
    (cd "$REPO" && go build -o "$bin/" ./cmd/vrdmactl ./cmd/vrdmad) || return 1
    make -s -C "$REPO/guest/ibverbs" >/dev/null || return 1
    DROPIN_LIB=$REPO/guest/ibverbs/build
}

DROPIN_PIDS=()
DROPIN_MEM_MB=${DROPIN_MEM_MB:-64}
DROPIN_BIN=""
DROPIN_DIR=""
declare -A DROPIN_SOCK=() # "PATH.srv" / "PATH.cli" -> agent socket (empty: the standalone agent's, memcpy and memcpy-direct)
declare -A DROPIN_VM=()   # "PATH.srv" / "PATH.cli" -> VM name

# dropin_start BIN DIR: start a standalone agent (--no-control-plane) with VMs vmA
# and vmB for the memcpy path, vmC and vmD (vrdma.directPeers naming each other) for
# memcpy-direct, and `vrdmactl quickstart --keep` for tcp and rdma,
# whose printed exec commands name each pair's agent sockets and VMs. Waits for
# quickstart's "ready" (at most a minute). Returns 1, with the reason on stderr,
# if either does not come up.
dropin_start() {
    DROPIN_BIN=$1 DROPIN_DIR=$2
    local vmx=$DROPIN_DIR/vm.vmx i path hdr vm
    mkdir -p "$DROPIN_DIR"
    rm -rf "$DROPIN_DIR/state" "$DROPIN_DIR/s"
    timeout 3600 "$DROPIN_BIN/vrdmad" --socket "$DROPIN_DIR/s" --state-dir "$DROPIN_DIR/state" \
        --no-control-plane --log-level warn 2>"$DROPIN_DIR/agent.log" &
    DROPIN_PIDS+=($!)
    timeout 3600 "$DROPIN_BIN/vrdmactl" quickstart --keep --memory "$DROPIN_MEM_MB" >"$DROPIN_DIR/qs.log" 2>&1 &
    DROPIN_PIDS+=($!)
    printf '%s\n' '.encoding = "UTF-8"' 'config.version = "8"' 'virtualHW.version = "20"' \
        'guestOS = "ubuntu-64"' "memSize = \"$DROPIN_MEM_MB\"" 'ethernet0.present = "TRUE"' \
        'ethernet0.virtualDev = "vrdma"' >"$vmx"
    for ((i = 0; i < 50; i++)); do [[ -S $DROPIN_DIR/s ]] && break; sleep 0.1; done
    cp "$vmx" "$vmx.C" && echo 'vrdma.directPeers = "vmD"' >>"$vmx.C"
    cp "$vmx" "$vmx.D" && echo 'vrdma.directPeers = "vmC"' >>"$vmx.D"
    for vm in vmA vmB vmC vmD; do
        local f=$vmx
        [[ -f $vmx.${vm#vm} ]] && f=$vmx.${vm#vm}
        if ! "$DROPIN_BIN/vrdmactl" --socket "$DROPIN_DIR/s" vm define "$vm" "$f" >/dev/null 2>&1; then
            echo "the standalone agent did not define $vm (log: $DROPIN_DIR/agent.log)" >&2
            return 1
        fi
    done
    DROPIN_SOCK[memcpy.srv]="" DROPIN_VM[memcpy.srv]=vmA
    DROPIN_SOCK[memcpy.cli]="" DROPIN_VM[memcpy.cli]=vmB
    DROPIN_SOCK[memcpy-direct.srv]="" DROPIN_VM[memcpy-direct.srv]=vmC
    DROPIN_SOCK[memcpy-direct.cli]="" DROPIN_VM[memcpy-direct.cli]=vmD
    for ((i = 0; i < 60; i++)); do grep -q '^ready$' "$DROPIN_DIR/qs.log" && break; sleep 1; done
    if ! grep -q '^ready$' "$DROPIN_DIR/qs.log"; then
        echo "quickstart --keep did not get ready in a minute:" >&2
        cat "$DROPIN_DIR/qs.log" >&2
        return 1
    fi
    # "# tcp: ..." is followed by the server's command, then the client's:
    # BIN/vrdmactl --socket SOCK exec --vm VM -- ib_write_bw ...
    for path in tcp rdma; do
        hdr=$(grep -A2 "^# $path:" "$DROPIN_DIR/qs.log" || true)
        DROPIN_SOCK[$path.srv]=$(sed -n 2p <<<"$hdr" | awk '{ print $3 }')
        DROPIN_VM[$path.srv]=$(sed -n 2p <<<"$hdr" | awk '{ print $6 }')
        DROPIN_SOCK[$path.cli]=$(sed -n 3p <<<"$hdr" | awk '{ print $3 }')
        DROPIN_VM[$path.cli]=$(sed -n 3p <<<"$hdr" | awk '{ print $6 }')
        if [[ -z ${DROPIN_SOCK[$path.srv]} || -z ${DROPIN_VM[$path.cli]} ]]; then
            echo "quickstart --keep printed no $path pair ($DROPIN_DIR/qs.log)" >&2
            return 1
        fi
    done
}

# dropin_side PATH srv|cli PROGRAM ARGS...: run PROGRAM as the workload of the
# path's server or client VM, for at most a minute.
dropin_side() {
    local path=$1 side=$2
    shift 2
    if [[ $path == memcpy* ]]; then
        VRDMA_SOCKET=$DROPIN_DIR/s VRDMA_VM=${DROPIN_VM[$path.$side]} LD_LIBRARY_PATH=$DROPIN_LIB \
            timeout 60 "$@"
    else
        timeout 60 "$DROPIN_BIN/vrdmactl" --socket "${DROPIN_SOCK[$path.$side]}" \
            exec --vm "${DROPIN_VM[$path.$side]}" --lib "$DROPIN_LIB" -- "$@"
    fi
}

# dropin_cmd PATH PROGRAM ARGS...: the client's command line, and where the
# server runs, for the record.
dropin_cmd() {
    local path=$1
    shift
    if [[ $path == memcpy* ]]; then
        echo "VRDMA_SOCKET=AGENT VRDMA_VM=${DROPIN_VM[$path.cli]} LD_LIBRARY_PATH=guest/ibverbs/build $* localhost" \
            "  # server: the same in ${DROPIN_VM[$path.srv]} without localhost"
    else
        echo "vrdmactl --socket HOST exec --vm ${DROPIN_VM[$path.cli]} --lib guest/ibverbs/build -- $* localhost" \
            "  # server: the same in ${DROPIN_VM[$path.srv]} without localhost"
    fi
}

# dropin_pt PATH OUT PROGRAM ARGS...: perftest PROGRAM (ib_write_bw, ...) between
# the path's two VMs, server first (-d vrdma0 -x 0 ARGS); the client's output goes
# to OUT, the server's to OUT.srv, and the client's result line (the last line
# that starts with two numbers) to stdout. A client that came before the server
# listened (it exits at once) runs again, up to 20 times.
dropin_pt() {
    local path=$1 out=$2 prog=$3 s line="" i
    shift 3
    dropin_side "$path" srv "$prog" -d vrdma0 -x 0 "$@" >"$out.srv" 2>&1 &
    s=$!
    for ((i = 0; i < 20; i++)); do
        sleep 0.5
        dropin_side "$path" cli "$prog" -d vrdma0 -x 0 "$@" localhost >"$out" 2>&1 || true
        line=$(grep -E '^\s*[0-9]+\s+[0-9]+' "$out" | tail -n1 || true)
        [[ -n $line ]] || ! grep -q "Couldn't connect" "$out" || ! kill -0 "$s" 2>/dev/null || continue
        break
    done
    wait "$s" 2>/dev/null || true
    echo "$line"
}

# dropin_perf PATH srv|cli ARGS...: vrdmactl perf ARGS as the workload of the
# path's server or client VM, for at most a minute.
dropin_perf() {
    local path=$1 side=$2 sock
    shift 2
    sock=${DROPIN_SOCK[$path.$side]}
    [[ $path == memcpy* ]] && sock=$DROPIN_DIR/s
    timeout 60 "$DROPIN_BIN/vrdmactl" --socket "$sock" perf "$@" --vm "${DROPIN_VM[$path.$side]}"
}

# dropin_go PATH OUT TEST ARGS...: vrdmactl perf TEST (write_bw, ...), the Go
# library in two processes as perftest runs, between the path's two VMs, server
# first; the client names the server by VM/vrdma0. The client's output goes to
# OUT, the server's to OUT.srv, and the client's result line to stdout, which is
# empty unless the pair took PATH (the report's "Transport" line). A client that
# fails while the server still waits (it came before the server listened) runs
# again, up to 20 times.
dropin_go() {
    local path=$1 out=$2 test=$3 s line="" i
    shift 3
    dropin_perf "$path" srv "$test" "$@" >"$out.srv" 2>&1 &
    s=$!
    for ((i = 0; i < 20; i++)); do
        sleep 0.5
        dropin_perf "$path" cli "$test" "$@" "${DROPIN_VM[$path.srv]}/vrdma0" >"$out" 2>&1 || true
        line=$(grep -E '^\s*[0-9]+\s+[0-9]+' "$out" | tail -n1 || true)
        [[ -n $line ]] || ! kill -0 "$s" 2>/dev/null || continue
        break
    done
    wait "$s" 2>/dev/null || true
    if [[ -n $line ]] && ! grep -qE "^ *Transport +: $path\b" "$out"; then
        echo "the pair took another path: $(grep -E '^ *Transport' "$out")" >>"$out"
        line=""
    fi
    echo "$line"
}

# dropin_exec PATH srv|cli PROGRAM ARGS...: run PROGRAM as the workload of the
# path's server or client VM through vrdmactl exec (the device view UCX needs, on
# every path), for at most a minute.
dropin_exec() {
    local path=$1 side=$2 sock=$DROPIN_DIR/s
    shift 2
    [[ $path == memcpy* ]] || sock=${DROPIN_SOCK[$path.$side]}
    timeout 60 "$DROPIN_BIN/vrdmactl" --socket "$sock" exec --vm "${DROPIN_VM[$path.$side]}" \
        --lib "$DROPIN_LIB" -- "$@"
}

# dropin_ucx PATH OUT ARGS...: ucx_perftest ARGS -f -v on UCP over vrdma's
# rc_verbs (UCX_TLS=rc_verbs,ud_verbs:aux: UCX 1.13 wires a UCP endpoint on
# rc_verbs up through ud_verbs), server in the path's server VM, client in its
# client VM, both through vrdmactl exec, the client once the server listens on
# its TCP port (127.0.0.1). The client's output goes to OUT, the server's to
# OUT.srv, and the client's result line (the CSV line after the header that
# starts with "iterations") to stdout, which is empty unless UCX's log names
# rc_verbs on vrdma0:1 as the lane of the test's operation (tag or rma) on both
# sides; then OUT's last line says why.
dropin_ucx() {
    local path=$1 out=$2 port=23800 s line="" i
    shift 2
    while ss -H -n -a -t "sport = :$port" 2>/dev/null | grep -q .; do port=$((port + 1)); done
    (
        export UCX_TLS=rc_verbs,ud_verbs:aux UCX_LOG_LEVEL=info
        dropin_exec "$path" srv ucx_perftest -p "$port"
    ) >"$out.srv" 2>&1 &
    s=$!
    for ((i = 0; i < 300; i++)); do
        ss -H -n -l -t "sport = :$port" 2>/dev/null | grep -q . && break
        kill -0 "$s" 2>/dev/null || break
        sleep 0.1
    done
    if ! ss -H -n -l -t "sport = :$port" 2>/dev/null | grep -q .; then
        echo "the server did not listen on port $port: $(grep -v '^\s*$' "$out.srv" | tail -n1)" >"$out"
        kill "$s" 2>/dev/null || true
        wait "$s" 2>/dev/null || true
        return 0
    fi
    (
        export UCX_TLS=rc_verbs,ud_verbs:aux UCX_LOG_LEVEL=info
        dropin_exec "$path" cli ucx_perftest 127.0.0.1 -p "$port" "$@" -f -v
    ) >"$out" 2>&1 || true
    wait "$s" 2>/dev/null || true
    line=$(awk -F, '$1 == "iterations" { h = 1; next } h && $1 ~ /^ *[0-9]+ *$/ { l = $0 } END { print l }' "$out")
    if [[ -n $line ]] && ! { grep -qE 'ep_cfg\[[0-9]+\]: (tag|rma)\(rc_verbs/vrdma0:1' "$out" &&
        grep -qE 'ep_cfg\[[0-9]+\]: (tag|rma)\(rc_verbs/vrdma0:1' "$out.srv"; }; then
        echo "UCX's log does not name rc_verbs on vrdma0:1 as the operation's lane" >>"$out"
        line=""
    fi
    echo "$line"
}

# dropin_stop: stop the standalone agent and quickstart (SIGINT: quickstart removes its
# hosts and state), waiting at most 20 s before killing them.
dropin_stop() {
    local p i
    ((${#DROPIN_PIDS[@]})) || return 0
    for p in "${DROPIN_PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for ((i = 0; i < 200; i++)); do
        local alive=0
        for p in "${DROPIN_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for p in "${DROPIN_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    DROPIN_PIDS=()
}
