#!/usr/bin/env python3
"""glibc malloc-arena lock waits per request of `overhead`'s servers, over fresh processes.

For each of PROCESSES rounds and each mode given (interleaved), starts
`overhead serve --mode MODE` (or the server binary given with `--exe`), warms it up
(3 s at RATE JSON requests per second; `--workload checkout --rate R` for the
checkout mix), then traces its `futex` calls with `strace -f`
while 3 s more arrive at the same rate. A contended glibc arena lock shows as a
`FUTEX_WAIT` on the lock word of a thread arena: the `malloc_state` of a non-main
arena sits 0x30 bytes into its 64 MiB-aligned heap, so the address ends in `000030`
(main-arena waits are left out; none were seen). Prints, per process, arena-lock
waits per request, and per mode how many processes were *contended* (more than
THRESHOLD waits per request; uncontended processes of every mode read 0.01-0.05).

    cargo build --release -p spanprof-bench --bin overhead
    python3 benches/scripts/arena_waits.py 8 stack baseline
    python3 benches/scripts/arena_waits.py --exe /tmp/overhead-before 8 baseline
    python3 benches/scripts/arena_waits.py --workload checkout --rate 150 4 stack baseline

strace slows the traced process; the counts are for comparing modes and builds
measured the same way, not CPU figures. Needs `strace` (Debian's package).
"""
import re
import signal
import subprocess
import sys
import time

RATE = 1000
WORKLOAD = "json"
THRESHOLD = 0.1


def load(exe, url, secs):
    out = subprocess.run(
        [exe, "load", "--url", url, "--workload", WORKLOAD, "--secs", str(secs),
         "--rate", str(RATE)],
        capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def arena_waits_per_request(exe, mode, log):
    server = subprocess.Popen(
        [exe, "serve", "--mode", mode, "--sink", "http://127.0.0.1:9"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = f"http://127.0.0.1:{server.stdout.readline().split()[1]}"
        load(exe, url, 3)
        trace = subprocess.Popen(
            ["strace", "-f", "-p", str(server.pid), "-e", "trace=futex", "-o", log],
            stderr=subprocess.DEVNULL)
        time.sleep(1)  # strace attaches to every thread
        requests = load(exe, url, 3)
        trace.send_signal(signal.SIGINT)
        trace.wait()
    finally:
        server.stdin.close()
        server.terminate()
        server.wait()
    arena_wait = re.compile(r"futex\(0x7f[0-9a-f]*000030, FUTEX_WAIT")
    with open(log) as f:
        waits = sum(1 for line in f if arena_wait.search(line))
    return waits / requests


def main():
    global RATE, WORKLOAD
    args = sys.argv[1:]
    exe = "target/release/overhead"
    while args[0].startswith("--"):
        flag, value, args = args[0], args[1], args[2:]
        if flag == "--exe":
            exe = value
        elif flag == "--workload":
            WORKLOAD = value
        elif flag == "--rate":
            RATE = float(value)
        else:
            sys.exit(f"arena_waits.py: unknown option {flag}")
    processes, modes = int(args[0]), args[1:]
    seen = {m: [] for m in modes}
    for round_ in range(processes):
        for mode in modes:
            w = arena_waits_per_request(exe, mode, f"/tmp/arena-waits-{mode}.log")
            seen[mode].append(w)
            print(f"process {round_} {mode:24s} arena-lock waits per request {w:.3f}", flush=True)
    for mode, ws in seen.items():
        contended = sum(w > THRESHOLD for w in ws)
        print(f"{mode:24s} contended in {contended} of {len(ws)} processes; "
              f"waits per request: {' '.join(f'{w:.3f}' for w in ws)}")


if __name__ == "__main__":
    main()
