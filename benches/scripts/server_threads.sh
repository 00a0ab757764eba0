#!/usr/bin/env bash
# Wake-ups and CPU per thread of one `overhead` server, and its sampler's counters.
#
# Starts `overhead serve --mode MODE`, warms it up (3 s closed-loop, 8 connections),
# sends RATE JSON requests per second open-loop for SECS seconds, then prints each
# thread's voluntary and involuntary context switches and its CPU time
# (/proc/PID/task/*/status and schedstat: on-CPU ns, wait ns, time slices) over the
# server's whole life, and the sampler's counters the server prints as it exits
# (`high_rate_in_cold`: high-rate signals that landed in cold work).
#
#   cargo build --release -p spanprof-bench --bin overhead
#   benches/scripts/server_threads.sh hot10 4000 8
set -euo pipefail
MODE=$1 RATE=$2 SECS=$3
EXE=target/release/overhead
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
coproc SRV { exec "$EXE" serve --mode "$MODE" --sink http://127.0.0.1:9 2>"$ERR"; }
read -r line <&"${SRV[0]}"
URL=http://127.0.0.1:$(echo "$line" | awk '{print $2}')
"$EXE" load --url "$URL" --workload json --secs 3 --concurrency 8 >/dev/null
REQ=$("$EXE" load --url "$URL" --workload json --secs "$SECS" --rate "$RATE" | awk '{print $1}')
echo "requests answered after the warm-up: $REQ"
for t in /proc/"$SRV_PID"/task/*; do
    printf '%-16s %s %s schedstat %s\n' "$(cat "$t"/comm)" \
        "$(grep -h '^voluntary_ctxt_switches' "$t"/status | tr -s '\t' ' ')" \
        "$(grep -h '^nonvoluntary_ctxt_switches' "$t"/status | tr -s '\t' ' ')" \
        "$(cat "$t"/schedstat)"
done
exec {SRV[1]}>&-
wait "$SRV_PID" || true
cat "$ERR"
