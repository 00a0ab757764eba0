#!/usr/bin/env python3
"""How many spans the span registry evicts before its table is full.

A simulation of `crates/spanprof-tower/src/registry.rs`: 16 384 places in buckets
of WINDOW, a span takes the first empty place of its bucket (a uniform hash of its
id); when all are held, the holder at the bucket's first place goes (what the
registry does between two exports, when all holders are equally old). `--window 4
--overlapping` simulates the registry's first version instead: windows of four
places starting at any place. Spans leave in the
order they came (first in, first out), `HELD` of them held at once. Prints the share
of tracked spans evicted, for a table an eighth full (the default batch queue of
2 048 ended spans) and a fifth full.

    python3 benches/scripts/registry_window.py
    python3 benches/scripts/registry_window.py --window 4 --overlapping
"""
import collections
import random
import sys

SLOTS = 16384
WINDOW = int(sys.argv[sys.argv.index("--window") + 1]) if "--window" in sys.argv else 8
OVERLAPPING = "--overlapping" in sys.argv


def evicted_share(held, spans=400_000, seed=1):
    rng = random.Random(seed)
    table = [0] * SLOTS
    place = {}
    order = collections.deque()
    evicted = 0
    for n in range(1, spans + held + 1):
        if len(order) >= held:
            gone = order.popleft()
            if gone in place:
                table[place.pop(gone)] = 0
        if OVERLAPPING:
            home = rng.randrange(SLOTS)
        else:
            home = rng.randrange(SLOTS // WINDOW) * WINDOW
        for k in range(WINDOW):
            i = (home + k) % SLOTS
            if table[i] == 0:
                break
        else:
            i = home
            place.pop(table[i], None)
            if n > held:  # counted once the table is in its steady state
                evicted += 1
        table[i] = n
        place[n] = i
        order.append(n)
    return evicted / spans


for name, held in (("an eighth", SLOTS // 8), ("a fifth", SLOTS // 5)):
    print(f"window {WINDOW}{' (overlapping)' if OVERLAPPING else ''}, {name} of the table held ({held} spans): {100 * evicted_share(held):.3f} % of spans evicted")
