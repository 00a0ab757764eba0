#!/usr/bin/env python3
"""Instructions per request of `overhead`'s servers under Callgrind.

Runs `overhead serve --mode MODE` under `valgrind --tool=callgrind` for each mode
given, sends it SECONDS of closed-loop JSON requests on one connection from
`overhead load`, stops it, and prints the instructions its tokio workers executed per
request (inclusive cost of `worker::Context::run`) and those inside `handle_order`.

    cargo build --release -p spanprof-bench --bin overhead
    python3 benches/callgrind_servers.py 40 stack baseline
"""
import re
import subprocess
import sys
import tempfile

EXE = "target/release/overhead"


def inclusive(annotated, symbol):
    """Largest inclusive Ir of a line naming `symbol` in callgrind_annotate output."""
    best = 0
    for line in annotated.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*" + re.escape(symbol), line)
        if m:
            best = max(best, int(m.group(1).replace(",", "")))
    return best


def measure(mode, seconds, outdir):
    out = f"{outdir}/callgrind.{mode}.out"
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", EXE,
         "serve", "--mode", mode, "--sink", "http://127.0.0.1:9"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = server.stdout.readline().split()[1]
    load = subprocess.run(
        [EXE, "load", "--url", f"http://127.0.0.1:{port}", "--workload", "json",
         "--secs", str(seconds), "--concurrency", "1"],
        capture_output=True, text=True, check=True)
    server.stdin.close()
    server.wait(timeout=600)
    requests = int(load.stdout.split()[0])
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", out],
                               capture_output=True, text=True, check=True).stdout
    workers = inclusive(annotated, "tokio::runtime::scheduler::multi_thread::worker::Context::run")
    handler = inclusive(annotated, "spanprof_bench::service::handle_order")
    print(f"{mode}: {requests} requests, {workers / requests:,.0f} instructions per request "
          f"on the workers, {handler / requests:,.0f} in handle_order")


def main():
    seconds = float(sys.argv[1])
    with tempfile.TemporaryDirectory() as outdir:
        for mode in sys.argv[2:]:
            measure(mode, seconds, outdir)


if __name__ == "__main__":
    main()
