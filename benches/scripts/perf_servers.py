#!/usr/bin/env python3
"""User and kernel CPU per request of `overhead`'s servers, by function, with `perf`.

For each mode given, starts `overhead serve --mode MODE` natively, warms it up (3 s
closed-loop, 8 connections), then records it with `perf record -e cpu-clock -F 1999
-g` (a software event: it works in VMs without hardware counters; frame-pointer call
graphs) while `overhead load` sends RATE JSON requests per second open-loop for
SECONDS. Prints, per mode, the sampled CPU per request split into user and kernel and
the share of spanprof's own functions; the ns per request of each piece of spanprof
(a worker's sample is charged to the innermost non-helper frame of its call chain, so
the malloc or system call a piece makes is the piece's; spanprof's threads whole);
then, against the first mode, the functions whose CPU per request changed most. perf's own sampling cost is in every mode alike.

    cargo build --release -p spanprof-bench --bin overhead
    python3 benches/scripts/perf_servers.py 4000 8 stack baseline

With `--concurrent` (first argument) every mode runs at the same time, each
recorded by its own `perf` while its own load sends RATE / n requests per second: the
machine's other load then falls on every mode alike, and the differences between
modes are not run-to-run noise (see `overhead --concurrent`).

    python3 benches/scripts/perf_servers.py --concurrent 4000 8 baseline-sampling baseline-nospans

PERF_SERVERS_WARMUP (seconds, default 3) sets each server's warm-up: the collector's
steady state (its caches filled, the code's DWARF parsed) takes a minute or more.
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
    load(url, "--secs", os.environ.get("PERF_SERVERS_WARMUP", "3"), "--concurrency", "8")
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


# What spanprof does, by the module of its innermost frame on a worker's call chain
# (first match wins).
PIECES = [
    ("ProfileCorrelationLayer", ("spanprof_tower::layer", "spanprof_tower::policy",
                                 "spanprof_tower::setup")),
    ("SpanProfileLayer", ("spanprof_tower::tracing_layer", "spanprof_core::span_map",
                          "spanprof_tower::otel_context", "spanprof_core::setup")),
    ("task hooks", ("spanprof_core::hooks",)),
    ("SpanProfileProcessor and registry", ("spanprof_tower::processor",
                                           "spanprof_tower::registry")),
    ("latency histograms", ("spanprof_core::latency",)),
    ("label records and polls", ("spanprof_core::labels", "spanprof_core::poll",
                                 "spanprof_core::sys::pool", "spanprof_core::sys::record",
                                 "spanprof_core::sys::slot", "spanprof_core::registration",
                                 "spanprof_core::intern", "spanprof_core::threads")),
    ("sampler on the workers", ("spanprof_core::sys",)),
]
# Frames a sample is charged through to the code that called them.
HELPERS = ("core::", "alloc::", "std::", "<core::", "<alloc::", "<std::", "hashbrown::",
           "<hashbrown::", "[unknown]", "__rust", "_rust", "__rdl", "__rg")


def own(fn):
    return "spanprof" in fn and "spanprof_bench" not in fn and "spanprof_workloads" not in fn


def piece_of(fn):
    for name, prefixes in PIECES:
        if any(p in fn for p in prefixes):
            return name
    return "other spanprof code on the workers"


def pieces(data, requests):
    """ns per request by piece: a worker's sample goes to the piece of the innermost
    frame on its chain that is not a helper (kernel, libc, std, hashbrown), if that
    frame is spanprof's, so what spanprof's code calls (malloc, memcpy, system calls)
    is charged to it; a spanprof thread's samples all go to that thread."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,period,ip,sym,dso"],
                         capture_output=True, text=True).stdout
    by = collections.Counter()
    comm, period, chain = None, 0, []

    def flush():
        if comm is None:
            return
        if comm.startswith("spanprof-collec") or comm.startswith("spanprof-drain"):
            by["collector and drain threads"] += period
            return
        if comm.startswith("spanprof"):
            by["sinks' threads (push)"] += period
            return
        for fn, dso in chain:
            if (dso.startswith("[kernel") or "libc.so" in dso or "ld-linux" in dso
                    or "[vdso]" in dso or fn.startswith(HELPERS)):
                continue
            if own(fn):
                by[piece_of(fn)] += period
            return

    for line in out.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            flush()
            m = re.match(r"^\s*(\S.*?)\s+(\d+)\s*$", line)
            comm, period, chain = (m.group(1), int(m.group(2)), []) if m else (line, 0, [])
        else:
            m = re.match(r"\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$", line)
            if m:
                chain.append((re.sub(r"\+0x[0-9a-f]+$", "", m.group(1)), m.group(2)))
    flush()
    return {k: v / requests for k, v in by.items()}


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
        by_piece = {m: pieces(f"{outdir}/{m}.data", n) for m, (n, _) in results.items()}
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
    print("\nns of CPU per request by piece (spanprof's code with what it calls; "
          "the kernel's signal delivery not included)")
    names = [n for n, _ in PIECES] + ["other spanprof code on the workers",
                                      "collector and drain threads", "sinks' threads (push)"]
    print(f"  {'piece':36s}" + "".join(f"{m[:14]:>15s}" for m in modes))
    for name in names + ["all"]:
        row = [sum(by_piece[m].values()) if name == "all" else by_piece[m].get(name, 0)
               for m in modes]
        print(f"  {name:36s}" + "".join(f"{v:15.0f}" for v in row))
    _, a = results[modes[0]]
    for m in modes[1:]:
        _, b = results[m]
        print(f"\n{m} - {modes[0]}: largest changes, µs per request")
        keys = set(a) | set(b)
        for k in sorted(keys, key=lambda k: -abs(b[k] - a[k]))[:25]:
            print(f"  {b[k] - a[k]:+6.2f}  [{k[0]}] {k[1][:140]}")


if __name__ == "__main__":
    main()
