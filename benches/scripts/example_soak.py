#!/usr/bin/env python3
"""The example shop's memory over a long run under its own load.

Starts `target/release/checkout --load 0` (build it first: `cargo build --release
-p checkout`) and `checkout load` against it, and every minute records the shop
process's RssAnon (/proc/PID/status) and the viewer's /debug/spanprof/api/memory.
Prints one JSON object: the per-minute table, the requests served, and the growth of
RssAnon over the last 10 minutes (least-squares slope, MB/min).

    python3 benches/scripts/example_soak.py [--minutes 30] [--concurrency 4]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "target", "release", "checkout")
API = "127.0.0.1:3300"
VIEWER = "127.0.0.1:6360"


def rss_anon_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise RuntimeError("no RssAnon")


def memory():
    with urllib.request.urlopen(f"http://{VIEWER}/debug/spanprof/api/memory", timeout=10) as r:
        return json.load(r)


def slope(points):
    """Least-squares slope of (x, y) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=4)
    a = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} missing: cargo build --release -p checkout")
    shop = subprocess.Popen(
        [BIN, "--listen", API, "--viewer", VIEWER, "--load", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    load = None
    try:
        for _ in range(100):
            try:
                memory()
                break
            except OSError:
                time.sleep(0.2)
        else:
            sys.exit("the shop did not start")
        load = subprocess.Popen(
            [BIN, "load", "--target", f"http://{API}", "--duration", f"{a.minutes * 60 + 30}s",
             "--concurrency", str(a.concurrency)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        rows = []
        start = time.monotonic()
        for minute in range(1, a.minutes + 1):
            time.sleep(max(0.0, start + 60 * minute - time.monotonic()))
            m = memory()
            p, spans = m["profiler"], m["recent_spans"]
            row = {
                "minute": minute,
                "rss_anon_mb": round(rss_anon_kb(shop.pid) / 1024, 1),
                "profiler_mb": round(p["total_bytes"] / 2**20, 1),
                "profiler_bound_mb": round(p["bound_bytes"] / 2**20, 1),
                "store_mb": round(p["store"]["bytes"] / 2**20, 1),
                "caches_mb": round(sum(p[c]["bytes"] for c in ("stack_cache", "symbol_cache", "labels_cache")) / 2**20, 1),
                "recent_spans_mb": round(spans["bytes"] / 2**20, 1),
                "recent_spans": spans["spans"],
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        elapsed = time.monotonic() - start
        load.send_signal(signal.SIGINT)
        out, _ = load.communicate(timeout=30)
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        served = int(summary.split()[0]) if summary[:1].isdigit() else None
        last = [(r["minute"], r["rss_anon_mb"]) for r in rows[-10:]]
        print(json.dumps({
            "minutes": a.minutes,
            "concurrency": a.concurrency,
            "load": summary,
            "requests_per_s": round(served / elapsed) if served else None,
            "rss_anon_mb_end": rows[-1]["rss_anon_mb"],
            "rss_anon_mb_peak": max(r["rss_anon_mb"] for r in rows),
            "growth_last_10_min_mb_per_min": round(slope(last), 3),
            "rows": rows,
        }, indent=1))
    finally:
        for p in (load, shop):
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()


if __name__ == "__main__":
    main()
