#!/usr/bin/env python3
"""Before/after from one `overhead --compare` run, paired round by round.

`overhead --compare BINARY` serves `--compare-mode` (default `baseline`) from an
earlier build as one more mode, `compare`, in the same rounds as this build's. Each
round then gives both builds' ratios to the `stack` server of that round; their
quotient, after / before, is what the change did in that round, with whatever the
shared machine did in it cancelled out. This prints the median of those quotients
and a 95 % percentile-bootstrap interval of it, resampling the sets of processes
(`--restarts`), then the rounds within each set, as `overhead` does for its own
intervals (10 000 resamples, a fixed seed).

    python3 benches/paired.py RUN.json [MODE]      # MODE: default baseline
"""
import json
import random
import statistics
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    run = json.load(open(sys.argv[1]))
    mode = sys.argv[2] if len(sys.argv) > 2 else "baseline"
    workloads = [w for w in ("json", "checkout") if isinstance(run.get(w), dict)]
    if not workloads:
        sys.exit("no per-workload results in " + sys.argv[1])
    restarts = int(run.get("restarts", 1))
    for w in workloads:
        r = run[w]
        after = r.get(f"ratio_{mode}_rounds")
        before = r.get("ratio_compare_rounds")
        if not after or not before or len(after) != len(before):
            sys.exit(f"{w}: need ratio_{mode}_rounds and ratio_compare_rounds of one length "
                     "(a run with --compare)")
        q = [a / b for a, b in zip(after, before)]
        n = len(q)
        sets = [[q[i] for i in range(n) if i * restarts // n == s] for s in range(restarts)]
        sets = [s for s in sets if s]
        rng = random.Random(0x5EED)
        meds = []
        for _ in range(10_000):
            sample = []
            for _ in sets:
                s = sets[rng.randrange(len(sets))]
                sample.extend(s[rng.randrange(len(s))] for _ in s)
            meds.append(statistics.median(sample))
        meds.sort()
        print(json.dumps({
            "workload": w,
            "mode": mode,
            "rounds": n,
            "sets": len(sets),
            "after_over_before": round(statistics.median(q), 4),
            "lo": round(meds[249], 4),
            "hi": round(meds[9749], 4),
            "sets_medians": [round(statistics.median(s), 4) for s in sets],
            f"ratio_{mode}": r.get(f"ratio_{mode}"),
            "ratio_compare": r.get("ratio_compare"),
        }))


if __name__ == "__main__":
    main()
