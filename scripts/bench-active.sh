#!/usr/bin/env bash
# Active-view benchmark: back-to-back TCP request/response (1 byte each way)
# over loopback and over a veth pair between two namespaces, all in one run:
#   - rttscope probe tcp-rr    -> rttscope serve
#   - bare blocking loop       -> rttscope serve   (examples/bare_rr.rs: the floor)
#   - bare blocking loop       -> bare blocking server
#   - rttscope probe tcp-rr    -> bare blocking server
#   - rttscope probe --async-io and --spin -> rttscope serve (one run each)
#   - ping -i 0.002 (median of per-reply times) and irtt -i 2ms (median RTT)
# Criterion: the probe is not the bottleneck: its P50 within 10% of the bare
# loop's, its transactions/s at least 90% of the bare loop's (same server).
# Each pair is run RUNS times, alternating which goes first. P50 is the median
# over runs. Transactions/s (= 1 / mean RTT) swings 5x between runs on a shared
# machine (other processes preempt either side), so the criterion uses the best
# run of each (the least disturbed); the median is printed next to it.
# Short runs, many of them, alternating: the machine is shared and its load
# moves; a median over interleaved runs is what survives that.
# Usage: scripts/bench-active.sh   (root; env: SECS=1 RUNS=15)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-1}
RUNS=${RUNS:-15}
[ "$(id -u)" = 0 ] || { echo "bench-active: needs root (network namespaces)" >&2; exit 1; }
for t in ip ping irtt python3; do
    command -v "$t" >/dev/null || { echo "bench-active: $t is missing" >&2; exit 1; }
done

cargo build --release -q -p rttscope --bin rttscope --example bare_rr
BIN=$PWD/target/release/rttscope
BARE=$PWD/target/release/examples/bare_rr

TAG=rtsbn$$
NSL=${TAG}l NSA=${TAG}a NSB=${TAG}b
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for n in "$NSL" "$NSA" "$NSB"; do ip netns del "$n" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

ip netns add "$NSL"; ip -n "$NSL" link set lo up
ip netns add "$NSA"; ip netns add "$NSB"
ip -n "$NSA" link set lo up; ip -n "$NSB" link set lo up
ip link add "${TAG}va" netns "$NSA" type veth peer name "${TAG}vb" netns "$NSB"
ip -n "$NSA" addr add 10.78.0.1/24 dev "${TAG}va"
ip -n "$NSB" addr add 10.78.0.2/24 dev "${TAG}vb"
ip -n "$NSA" link set "${TAG}va" up; ip -n "$NSB" link set "${TAG}vb" up

start_servers() { # ns addr
    ip netns exec "$1" "$BIN" serve --listen "$2:7878" 2>/dev/null & PIDS+=($!)
    ip netns exec "$1" "$BARE" server "$2:7879" 2>/dev/null & PIDS+=($!)
    ip netns exec "$1" irtt server -i 0 -b "$2:2112" >/dev/null 2>&1 & PIDS+=($!)
    sleep 1
}

probe() { # ns addr port [extra probe option] -> "p50 tps"
    ip netns exec "$1" "$BIN" probe tcp-rr "$2" -p "$3" -l "$SECS" --nodelay ${4:-} \
        -o P50_LATENCY,THROUGHPUT | tail -1 | awk -F, '{print $1, $2}'
}
bare() { # ns addr port -> "p50 tps"
    ip netns exec "$1" "$BARE" client "$2:$3" "$SECS" |
        python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["p50_us"], r["tps"])'
}
ping_med() { # ns addr -> median us
    ip netns exec "$1" ping -n -q -c 1000 -i 0.002 "$2" >/dev/null 2>&1 || true
    ip netns exec "$1" ping -n -c 1000 -i 0.002 "$2" |
        python3 -c 'import sys,statistics; v=[float(l.split("time=")[1].split()[0])*1000 for l in sys.stdin if "time=" in l]; print(round(statistics.median(v),1))'
}
irtt_med() { # ns addr -> median us
    ip netns exec "$1" irtt client -Q -i 2ms -d 3s -o - "$2:2112" |
        python3 -c 'import json,sys; r=json.load(sys.stdin); print(round(r["stats"]["rtt"]["median"]/1000,1))'
}
median() { python3 -c 'import sys,statistics; print(round(statistics.median(float(x) for x in sys.argv[1:]),2))' "$@"; }
best() { python3 -c 'import sys; print(round(max(float(x) for x in sys.argv[1:]),2))' "$@"; }

echo "# rttscope active-view benchmark"
echo "date: $(date -u +%FT%TZ)  kernel: $(uname -r)  cpus: $(nproc)  load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "each RR run: ${SECS}s back to back, request 1 B, response 1 B, TCP_NODELAY; $RUNS runs per pair, alternating order"
echo
FAIL=0
for path in loopback veth; do
    if [ "$path" = loopback ]; then C=$NSL S=$NSL A=127.0.0.1; else C=$NSA S=$NSB A=10.78.0.2; fi
    start_servers "$S" "$A"
    P50P=() TPSP=() P50B=() TPSB=() P50BB=() TPSBB=() P50PB=() TPSPB=()
    for i in $(seq "$RUNS"); do
        if [ $((i % 2)) = 1 ]; then
            read -r a b < <(probe "$C" "$A" 7878); P50P+=("$a"); TPSP+=("$b")
            read -r a b < <(bare "$C" "$A" 7878); P50B+=("$a"); TPSB+=("$b")
        else
            read -r a b < <(bare "$C" "$A" 7878); P50B+=("$a"); TPSB+=("$b")
            read -r a b < <(probe "$C" "$A" 7878); P50P+=("$a"); TPSP+=("$b")
        fi
    done
    read -r a b < <(bare "$C" "$A" 7879); P50BB+=("$a"); TPSBB+=("$b")
    read -r a b < <(probe "$C" "$A" 7879); P50PB+=("$a"); TPSPB+=("$b")
    read -r P50AS TPSAS < <(probe "$C" "$A" 7878 --async-io)
    read -r P50SP TPSSP < <(probe "$C" "$A" 7878 --spin)
    PING=$(ping_med "$C" "$A")
    IRTT=$(irtt_med "$C" "$A")
    p50p=$(median "${P50P[@]}") tpsp=$(median "${TPSP[@]}")
    p50b=$(median "${P50B[@]}") tpsb=$(median "${TPSB[@]}")
    bestp=$(best "${TPSP[@]}") bestb=$(best "${TPSB[@]}")
    echo "## $path ($A)"
    echo "| client -> server | P50 us (median) | trans/s best | trans/s median | runs: P50 us / trans/s |"
    echo "|---|---|---|---|---|"
    echo "| rttscope probe -> rttscope serve | $p50p | $bestp | $tpsp | ${P50P[*]} / ${TPSP[*]} |"
    echo "| bare loop -> rttscope serve | $p50b | $bestb | $tpsb | ${P50B[*]} / ${TPSB[*]} |"
    echo "| bare loop -> bare server | ${P50BB[0]} | ${TPSBB[0]} | - | 1 run |"
    echo "| rttscope probe -> bare server | ${P50PB[0]} | ${TPSPB[0]} | - | 1 run |"
    echo "| rttscope probe --async-io (tokio reactor) -> rttscope serve | $P50AS | $TPSAS | - | 1 run |"
    echo "| rttscope probe --spin (busy-poll) -> rttscope serve | $P50SP | $TPSSP | - | 1 run |"
    echo "| ping -i 0.002 (median time=) | $PING | - | - | 1000 echoes |"
    echo "| irtt -i 2ms (median RTT) | $IRTT | - | - | 3 s |"
    verdict=$(python3 -c "
p50p,p50b,tpsp,tpsb,bp,bb=$p50p,$p50b,$tpsp,$tpsb,$bestp,$bestb
ok = p50p <= 1.10*p50b and bp >= 0.90*bb
print(('PASS' if ok else 'FAIL') + ': probe P50 %.1f%% of bare; probe trans/s %.1f%% of bare (best runs; medians: %.1f%%)' % (100*p50p/p50b, 100*bp/bb, 100*tpsp/tpsb))")
    echo
    echo "$verdict"
    echo
    case $verdict in FAIL*) FAIL=1 ;; esac
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    PIDS=()
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $FAIL
