#!/usr/bin/env bash
# CPU per request of the collector and the tokio workers of one `overhead` server, over
# its life: N chunks of CHUNK seconds of requests of WORKLOAD (json by default) at RATE
# per second, read from /proc/PID/task/*/schedstat after each, and the collector's per
# sample (the `SIGPROF`s the server's threads took, counted by `perf stat`).
#
#   cargo build --release -p spanprof-bench --bin overhead
#   benches/scripts/collector_aging.sh baseline 1000 60 5
#   WORKLOAD=checkout benches/scripts/collector_aging.sh baseline 60 60 12
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=$1; RATE=$2; CHUNK=$3; N=$4
. benches/scripts/serve.sh
start_server "$MODE"
cpu() { echo "$(thread_cpu spanprof-collec) $(thread_cpu tokio-rt-worker)"; }
read c0 w0 < <(cpu)
for i in $(seq 1 $N); do
  # The SIGPROFs the server's threads take in the chunk: its samples.
  perf stat -x, -e signal:signal_deliver --filter 'sig == 27' -p $SRV_PID \
      -o /tmp/collector_aging.signals -- sleep $CHUNK &
  SIGNALS=$!
  r=$($EXE load --url $URL --workload ${WORKLOAD:-json} --secs $CHUNK --rate $RATE | cut -d' ' -f1)
  wait $SIGNALS
  s=$(grep signal_deliver /tmp/collector_aging.signals | cut -d, -f1)
  s=${s//[!0-9]/}; s=${s:-0}
  read c1 w1 < <(cpu)
  echo "chunk $i: requests $r samples $s collector $(python3 -c "print(round(($c1-$c0)/1000/max($r,1),2))") us/req" \
    "$(python3 -c "print(f'{($c1-$c0)/1000/$s:.1f} us/sample' if $s else 'samples not counted')")" \
    "workers $(python3 -c "print(round(($w1-$w0)/1000/max($r,1),1))") us/req"
  c0=$c1; w0=$w1
done
kill $SRV_PID
