#!/usr/bin/env python3
"""Where `overhead`'s servers spend their instructions per request, under Callgrind.

Runs `overhead serve --mode MODE` under `valgrind --tool=callgrind` for each mode
given (one file per thread), warms it up with 4 s of requests (the JSON API, or the
checkout mix with `--workload checkout`), zeroes the
counters, sends it SECONDS of closed-loop requests on one connection from
`overhead load`, stops it, and reads the tokio workers' threads only (the spanprof
collector, the span exporter and the Pyroscope push run elsewhere). It prints, per
mode, instructions per request, calls to glibc's `malloc` and how many of them missed
the per-thread cache (calls into `_int_malloc`); then, against the first mode, the
functions whose own (exclusive) instructions per request changed most, and the
inclusive cost per request of spanprof's entry points.

    cargo build --release -p spanprof-bench --bin overhead
    python3 benches/scripts/callgrind_servers.py 12 stack baseline [baseline-noprocessor ...]
    python3 benches/scripts/callgrind_servers.py --workload checkout 40 stack baseline
    SPANPROF_BASELINE_HZ=1 python3 benches/scripts/callgrind_servers.py --workers 1 12 stack baseline

With `--workers 1` the servers run one tokio worker (OVERHEAD_WORKERS): no allocation is
freed on another thread, so glibc's allocator takes the same paths in every mode; with
two, Callgrind's one-thread-at-a-time scheduling moves the share of allocations that
miss the thread cache from run to run. SPANPROF_BASELINE_HZ=1 makes sampling
negligible (under Callgrind a request lasts fifty times longer and so gets fifty times
the samples).

Exclusive costs sum to the total, so their differences add up to the difference of
the totals; inclusive costs (summed over the calls into a function) overlap: a
function's includes its callees'.
"""
import collections
import os
import glob
import re
import subprocess
import sys
import tempfile
import time

EXE = "target/release/overhead"
WORKER = "tokio::runtime::scheduler::multi_thread::worker::Context::run"
ENTRY_POINTS = [
    r"<spanprof_tower::layer::service::ProfileCorrelation<S,R> as tower_service::Service<.*>>::call",
    r"spanprof_tower::layer::Correlator::begin",
    r"<spanprof_tower::layer::future::ResponseFuture<F> as core::future::future::Future>::poll",
    r"<spanprof_tower::layer::future::ProfiledBody<B> as http_body::Body>::poll_frame",
    r"<spanprof_tower::tracing_layer::SpanProfileLayer as tracing_subscriber::layer::Layer<S>>::on_enter",
    r"<spanprof_tower::tracing_layer::SpanProfileLayer as tracing_subscriber::layer::Layer<S>>::on_exit",
    # Where the compiler inlines SpanProfileLayer's callbacks: every layer's enter and
    # exit (the figure in parentheses is the stack's own).
    r"<tracing_subscriber::layer::layered::Layered<L,S> as tracing_core::subscriber::Subscriber>::(enter|exit)('\d+)?",
    r"<spanprof_tower::processor::SpanProfileProcessor<P> as .*SpanProcessor>::on_end",
    r"spanprof_core::hooks::.*",
    r"spanprof_core::sys::handler::on_signal",
    r"malloc",
    r"free",
    r"realloc",
]


def parse_calls(path):
    """(caller, callee) -> [calls, inclusive Ir] from a callgrind output file."""
    names, edges = {}, collections.defaultdict(lambda: [0, 0])
    current = callee = pending = None

    def name(s):
        m = re.match(r"\((\d+)\)(?: (.*))?", s)
        if not m:
            return s
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names[m.group(1)]

    with open(path) as f:
        for line in f:
            if line.startswith("fn="):
                current = name(line[3:].strip())
            elif line.startswith("cfn="):
                callee = name(line[4:].strip())
            elif line.startswith("calls="):
                pending = int(line[6:].split()[0])
            elif pending is not None and line[:1] in "0123456789+-*":
                parts = line.split()
                edge = edges[(current, callee)]
                edge[0] += pending
                edge[1] += int(parts[1]) if len(parts) > 1 else 0
                pending = None
    return edges


def annotate(path):
    """Total Ir and function -> exclusive Ir, from callgrind_annotate."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", path],
        capture_output=True, text=True, check=True).stdout
    costs, total = collections.Counter(), 0
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        ir, fn = int(m.group(1).replace(",", "")), m.group(2)
        if fn == "PROGRAM TOTALS":
            total += ir
            continue
        fn = re.sub(r"\s*\[[^\]]*\]$", "", fn)
        head, _, tail = fn.partition(":")
        if tail and "/" in head:
            fn = tail
        costs[fn] += ir
    return total, costs


def measure(mode, seconds, outdir, workload):
    out = f"{outdir}/callgrind.{mode}.out"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--separate-threads=yes",
         f"--callgrind-out-file={out}", EXE, "serve", "--mode", mode,
         "--sink", "http://127.0.0.1:9"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = server.stdout.readline().split()[1]
    url = f"http://127.0.0.1:{port}"

    def load(secs):
        res = subprocess.run(
            [EXE, "load", "--url", url, "--workload", workload, "--secs", str(secs),
             "--concurrency", "1"], capture_output=True, text=True, check=True)
        return int(res.stdout.split()[0])

    load(4)  # warm-up: one-time costs (symbolizing, calibration, first allocations)
    subprocess.run(["callgrind_control", "--zero", str(server.pid)],
                   capture_output=True, check=True)
    requests = load(seconds)
    server.stdin.close()
    server.wait(timeout=600)
    time.sleep(0.5)
    result = {"requests": requests, "total": 0, "malloc": 0, "slow": 0,
              "self": collections.Counter(), "incl": collections.Counter()}
    for path in sorted(glob.glob(out + "-*")):
        edges = parse_calls(path)
        if not any(callee == WORKER for _, callee in edges):
            continue
        total, own = annotate(path)
        result["total"] += total
        # The frames that were running when the counters were zeroed (the thread's
        # roots) are charged their callees' cost at exit: not theirs, leave them out.
        result["self"].update({f: ir for f, ir in own.items() if ir < total / 2})
        for (caller, callee), (calls, ir) in edges.items():
            # Inclusive cost from the call edges, recursion counted once.
            if caller != callee:
                result["incl"][callee] += ir
            if callee == "malloc":
                result["malloc"] += calls
            if caller == "malloc" and callee == "_int_malloc":
                result["slow"] += calls
    return result


def main():
    args = sys.argv[1:]
    workload = "json"
    if args[:1] == ["--workload"]:
        workload, args = args[1], args[2:]
    if args[:1] == ["--workers"]:
        os.environ["OVERHEAD_WORKERS"] = args[1]
        args = args[2:]
    seconds = float(args[0])
    modes = args[1:]
    with tempfile.TemporaryDirectory() as outdir:
        results = {mode: measure(mode, seconds, outdir, workload) for mode in modes}
    per = {m: r["requests"] for m, r in results.items()}
    print("mode: requests, instructions per request on the workers, malloc calls per "
          "request, of which missed the thread cache")
    for m, r in results.items():
        n = per[m]
        print(f"  {m}: {n}, {r['total'] / n:,.0f}, {r['malloc'] / n:.1f}, "
              f"{r['slow'] / n:.1f}")
    ref = modes[0]
    for m in modes[1:]:
        a, b = results[ref], results[m]
        print(f"\n{m} - {ref}: {b['total'] / per[m] - a['total'] / per[ref]:+,.0f} "
              "instructions per request; largest changes of exclusive cost:")
        keys = set(a["self"]) | set(b["self"])
        diff = sorted(((b["self"][k] / per[m] - a["self"][k] / per[ref], k) for k in keys),
                      key=lambda d: -abs(d[0]))
        for d, k in diff[:25]:
            print(f"  {d:+9,.0f}  {k[:150]}")
        print(f"inclusive cost per request in {m} (and {ref}):")
        for pattern in ENTRY_POINTS:
            for k in sorted(k for k in b["incl"] if re.fullmatch(pattern, k)):
                print(f"  {b['incl'][k] / per[m]:9,.0f} ({a['incl'][k] / per[ref]:,.0f})  "
                      f"{k[:150]}")


if __name__ == "__main__":
    main()
