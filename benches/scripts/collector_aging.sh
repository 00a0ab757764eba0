#!/usr/bin/env bash
# CPU per request of the collector and the tokio workers of one `overhead` server, over
# its life: N chunks of CHUNK seconds of JSON requests at RATE per second, read from
# /proc/PID/task/*/schedstat after each.
#
#   cargo build --release -p spanprof-bench --bin overhead
#   benches/scripts/collector_aging.sh baseline 1000 60 5
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=$1; RATE=$2; CHUNK=$3; N=$4
. benches/scripts/serve.sh
start_server "$MODE"
cpu() { echo "$(thread_cpu spanprof-collec) $(thread_cpu tokio-rt-worker)"; }
read c0 w0 < <(cpu)
for i in $(seq 1 $N); do
  r=$($EXE load --url $URL --workload json --secs $CHUNK --rate $RATE | cut -d' ' -f1)
  read c1 w1 < <(cpu)
  echo "chunk $i: requests $r collector $(python3 -c "print(round(($c1-$c0)/1000/$r,2))") us/req workers $(python3 -c "print(round(($w1-$w0)/1000/$r,1))") us/req"
  c0=$c1; w0=$w1
done
kill $SRV_PID
