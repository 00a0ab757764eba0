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
    python3 benches/perf_servers.py 4000 8 stack baseline
"""
import collections
import re
import subprocess
import sys
import tempfile

EXE = "target/release/overhead"


def record(mode, rate, seconds, outdir):
    data = f"{outdir}/{mode}.data"
    server = subprocess.Popen(
        [EXE, "serve", "--mode", mode, "--sink", "http://127.0.0.1:9"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = f"http://127.0.0.1:{server.stdout.readline().split()[1]}"

    def load(*args):
        res = subprocess.run([EXE, "load", "--url", url, "--workload", "json", *args],
                             capture_output=True, text=True, check=True)
        return int(res.stdout.split()[0])

    load("--secs", "3", "--concurrency", "8")
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "1999", "-g",
         "-p", str(server.pid), "-o", data, "--", "sleep", str(seconds + 1)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    requests = load("--secs", str(seconds), "--rate", str(rate))
    perf.wait()
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


def main():
    rate, seconds, modes = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    with tempfile.TemporaryDirectory() as outdir:
        results = {m: record(m, rate, seconds, outdir) for m in modes}
    print("mode: requests; sampled µs of CPU per request: user, kernel; "
          "spanprof's own functions")
    for m, (n, f) in results.items():
        user = sum(v for (side, _), v in f.items() if side == "user")
        kernel = sum(v for (side, _), v in f.items() if side == "kernel")
        own = sum(v for (_, fn), v in f.items()
                  if "spanprof" in fn and "spanprof_bench" not in fn)
        print(f"  {m}: {n}; {user:.1f}, {kernel:.1f}; {own:.2f}")
    _, a = results[modes[0]]
    for m in modes[1:]:
        _, b = results[m]
        print(f"\n{m} - {modes[0]}: largest changes, µs per request")
        keys = set(a) | set(b)
        for k in sorted(keys, key=lambda k: -abs(b[k] - a[k]))[:25]:
            print(f"  {b[k] - a[k]:+6.2f}  [{k[0]}] {k[1][:140]}")


if __name__ == "__main__":
    main()
