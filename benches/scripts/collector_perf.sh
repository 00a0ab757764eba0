#!/usr/bin/env bash
# Where spanprof's collector thread spends its CPU in steady state: one `overhead`
# server of MODE, WARM seconds of requests of WORKLOAD (json by default) at RATE a
# second (1 000 by default; the checkout mix takes about 60), past the first minute's
# symbolization, then REC more seconds under `perf record` of the collector thread
# alone. Prints the collector's and the drain thread's CPU per request over the
# recording, and the collector's per sample (the `SIGPROF`s the server's threads
# took, counted by `perf stat`); the profile is left in /tmp/collector.perf.data.
#
#   cargo build --release -p spanprof-bench --bin overhead
#   benches/scripts/collector_perf.sh baseline 90 60
#   WORKLOAD=checkout RATE=60 benches/scripts/collector_perf.sh baseline 120 60
#   perf report -i /tmp/collector.perf.data --children --sort sym
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-baseline}; WARM=${2:-90}; REC=${3:-60}
WORKLOAD=${WORKLOAD:-json}; RATE=${RATE:-1000}
. benches/scripts/serve.sh
start_server "$MODE"
$EXE load --url $URL --workload $WORKLOAD --secs $WARM --rate $RATE >/dev/null
C=$(thread_ids spanprof-collec)
c0=$(thread_cpu spanprof-collec); d0=$(thread_cpu spanprof-drain)
perf record -q -e cpu-clock -F 4999 -g -t $C -o /tmp/collector.perf.data -- sleep $REC &
PERF=$!
perf stat -x, -e signal:signal_deliver --filter 'sig == 27' -p $SRV_PID \
    -o /tmp/collector.signals -- sleep $REC &
SIGNALS=$!
r=$($EXE load --url $URL --workload $WORKLOAD --secs $REC --rate $RATE | cut -d' ' -f1)
wait $PERF
wait $SIGNALS
c1=$(thread_cpu spanprof-collec); d1=$(thread_cpu spanprof-drain)
s=$(grep signal_deliver /tmp/collector.signals | cut -d, -f1)
s=${s//[!0-9]/}
python3 -c "
r, s = $r, ${s:-0}
per_sample = f'{($c1-$c0)/1000/s:.2f} us/sample' if s else 'samples not counted'
print(f'requests {r}, samples {s}: collector {($c1-$c0)/1000/max(r,1):.3f} us/req, {per_sample}, '
      f'drain {($d1-$d0)/1000/max(r,1):.3f} us/req')"
kill $SRV_PID
