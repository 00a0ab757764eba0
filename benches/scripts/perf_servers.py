#!/usr/bin/env python3
"""User and kernel CPU per request of `overhead`'s servers, by function, with `perf`.

For each mode given, starts `overhead serve --mode MODE` natively, warms it up (3 s
closed-loop, 8 connections), then records it with `perf record -e cpu-clock -F 1999
-g` (a software event: it works in VMs without hardware counters; frame-pointer call
graphs) while `overhead load` sends RATE JSON requests per second open-loop for
SECONDS. Prints, per mode, the sampled CPU per request split into user and kernel and
the share of spanprof's own functions; then, against the first mode, the functions
whose CPU per request changed most. perf's own sampling cost is in every mode alike.

    cargo build --release -p spanprof-bench --bin overhead
    python3 benches/scripts/perf_servers.py 4000 8 stack baseline

With `--concurrent` (first argument) every mode runs at the same time, each
recorded by its own `perf` while its own load sends RATE / n requests per second: the
machine's other load then falls on every mode alike, and the differences between
modes are not run-to-run noise (see `overhead --concurrent`).

    python3 benches/scripts/perf_servers.py --concurrent 4000 8 baseline-sampling baseline-nospans
"""
import collections
import contextlib
import os
import concurrent.futures
import re
import subprocess
import sys
import tempfile

EXE = "target/release/overhead"


def start(mode):
    """Starts a server and warms it up; returns (process, url)."""
    server = subprocess.Popen(
        [EXE, "serve", "--mode", mode, "--sink", "http://127.0.0.1:9"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = f"http://127.0.0.1:{server.stdout.readline().split()[1]}"
    load(url, "--secs", "3", "--concurrency", "8")
    return server, url


def load(url, *args):
    res = subprocess.run([EXE, "load", "--url", url, "--workload", "json", *args],
                         capture_output=True, text=True, check=True)
    return int(res.stdout.split()[0])


def perf_start(server, data, seconds):
    return subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "1999", "-g",
         "-p", str(server.pid), "-o", data, "--", "sleep", str(seconds + 1)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def report(server, data, requests):
    """Stops the server; returns its sampled CPU per request by (side, function)."""
    server.stdin.close()
    server.wait(timeout=60)
    out = subprocess.run(
        ["perf", "report", "-i", data, "--no-children", "--sort", "sym", "--stdio",
         "-g", "none", "--percent-limit", "0"], capture_output=True, text=True).stdout
    total_ns = int(re.search(r"Event count \(approx.\): (\d+)", out).group(1))
    by_fn = collections.Counter()
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*)$", line)
        if m:
            us = float(m.group(1)) / 100 * total_ns / requests / 1000
            by_fn[("kernel" if m.group(2) == "k" else "user", m.group(3).strip())] += us
    return requests, by_fn


def record(mode, rate, seconds, outdir):
    server, url = start(mode)
    data = f"{outdir}/{mode}.data"
    perf = perf_start(server, data, seconds)
    requests = load(url, "--secs", str(seconds), "--rate", str(rate))
    perf.wait()
    return report(server, data, requests)


def record_concurrently(modes, rate, seconds, outdir):
    started = [start(m) for m in modes]
    perfs = [perf_start(s, f"{outdir}/{m}.data", seconds) for m, (s, _) in zip(modes, started)]
    with concurrent.futures.ThreadPoolExecutor(len(modes)) as pool:
        counts = list(pool.map(
            lambda su: load(su[1], "--secs", str(seconds), "--rate", str(rate / len(modes))),
            started))
    for p in perfs:
        p.wait()
    return {m: report(s, f"{outdir}/{m}.data", n)
            for m, (s, _), n in zip(modes, started, counts)}


def main():
    args = sys.argv[1:]
    together = args[:1] == ["--concurrent"]
    args = args[1:] if together else args
    rate, seconds, modes = float(args[0]), float(args[1]), args[2:]
    keep = os.environ.get("PERF_SERVERS_KEEP")
    with (contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory()) as outdir:
        if together:
            results = record_concurrently(modes, rate, seconds, outdir)
        else:
            results = {m: record(m, rate, seconds, outdir) for m in modes}
    print("mode: requests; sampled µs of CPU per request: user, kernel; "
          "spanprof's own functions")
    for m, (n, f) in results.items():
        user = sum(v for (side, _), v in f.items() if side == "user")
        kernel = sum(v for (side, _), v in f.items() if side == "kernel")
        own = sum(v for (_, fn), v in f.items()
                  if "spanprof" in fn and "spanprof_bench" not in fn
                  and "spanprof_workloads" not in fn)
        print(f"  {m}: {n}; {user:.1f}, {kernel:.1f}; {own:.2f}")
        mine = sorted(((v, fn) for (_, fn), v in f.items()
                       if "spanprof" in fn and "spanprof_bench" not in fn
                       and "spanprof_workloads" not in fn), reverse=True)
        for v, fn in mine[:int(os.environ.get("PERF_SERVERS_TOP", "8"))]:
            print(f"      {v:5.2f}  {fn[:130]}")
    _, a = results[modes[0]]
    for m in modes[1:]:
        _, b = results[m]
        print(f"\n{m} - {modes[0]}: largest changes, µs per request")
        keys = set(a) | set(b)
        for k in sorted(keys, key=lambda k: -abs(b[k] - a[k]))[:25]:
            print(f"  {b[k] - a[k]:+6.2f}  [{k[0]}] {k[1][:140]}")


if __name__ == "__main__":
    main()
