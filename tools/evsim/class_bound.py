#!/usr/bin/env python3
"""How far can an online policy get on a trace, given what it can see? (docs/eviction.md)

A policy that sees, for each cached block, only some features of its last use (a class:
how many times it was used, what its request looked like) and the time since, can do no
better than keeping each class for a fixed time after its last use: nothing new is learned
about a block while it sits unused. This script finds the best such per-class keep-times for
a trace *in hindsight* (fitted on the very trace it scores, so optimistic), under the average
capacity of the cache, and reports the token hit ratio they reach. Time is counted in stores
(blocks stored for the first time), the pace at which a full cache turns over.

The bound is optimistic in three ways: keep-times are fitted on the scored trace, capacity is
met on average rather than at every moment, and a block counts as a hit even when a block
before it in its request was not kept (prefix caching would miss it). A real policy with the
same features scores below it; one with more features may score above it.

Model (as tools/evsim): Mooncake JSON lines, chained hashes of 512-token blocks; complete
blocks only unless --partial-blocks. Standard library only; about a minute on the Mooncake
conversation trace.

  python3 tools/evsim/class_bound.py --trace /work/shared/data/mooncake_conversation_trace.jsonl
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import math


def load(path, block_tokens, partial_blocks):
    reqs = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            q = json.loads(line)
            ids = q["hash_ids"]
            if not partial_blocks:
                ids = ids[: q["input_length"] // block_tokens]
            reqs.append((q["input_length"], ids))
    return reqs


def observations(reqs, block_tokens):
    """One observation per use of a block: its features, the stores until its next use (None:
    never) and the tokens that next use would hit."""
    uses = collections.Counter()
    seen = set()
    last_use = {}  # block -> store clock of its last use
    obs = []
    clock = 0
    for tokens, ids in reqs:
        hit = 0
        while hit < len(ids) and ids[hit] in seen:
            hit += 1
        n = len(ids)
        for i, b in enumerate(ids):
            uses[b] += 1
            prev_gap = clock - last_use[b] if b in last_use else None
            obs.append({"block": b, "clock": clock, "uses": uses[b], "last": i == n - 1,
                        "from_end": n - 1 - i, "continued": hit > 1, "was_hit": i < hit,
                        "blocks": n, "prev_gap": prev_gap,
                        "tokens": max(0, min(block_tokens, tokens - i * block_tokens))})
            last_use[b] = clock
        clock += len({b for b in ids if b not in seen})
        seen.update(ids)
    nxt = {}
    for o in reversed(obs):
        o["gap"], o["next_tokens"] = nxt.get(o["block"], (None, 0))
        nxt[o["block"]] = (o["clock"], o["tokens"])
    for o in obs:
        if o["gap"] is not None:
            o["gap"] -= o["clock"]
    return obs


def log2_bucket(x):
    return None if x is None else min(int(math.log2(x + 1)), 17)


FEATURES = {
    "age only (= LRU)": lambda o: 0,
    "uses (1, 2, 3, 4+)": lambda o: min(o["uses"], 4),
    "uses, continued request": lambda o: (min(o["uses"], 4), o["continued"]),
    "uses, continued, request length": lambda o: (min(o["uses"], 4), o["continued"],
                                                  log2_bucket(o["blocks"])),
    "all of them": lambda o: (min(o["uses"], 4), o["last"], o["continued"], o["was_hit"],
                              log2_bucket(o["prev_gap"]), log2_bucket(o["blocks"]),
                              min(o["from_end"], 4)),
}
KEEP_TIMES = sorted({0} | {int(1.06 ** k) for k in range(1, 260) if 1.06 ** k < 4e5})


def bound(obs, classify, capacity_blocks, footprint_stores):
    """Best token hits with one keep-time per class, capacity met on average (Lagrangian over
    classes, the last class mixed between two keep-times)."""
    groups = collections.defaultdict(list)
    for o in obs:
        groups[classify(o)].append((o["gap"] if o["gap"] is not None else 10 ** 12,
                                    o["next_tokens"] if o["gap"] is not None else 0))
    curves = []  # per class: [(block-stores kept, tokens hit)] per keep-time
    for items in groups.values():
        items.sort()
        gaps = [g for g, _ in items]
        cum_gap, cum_tok = [0], [0]
        for g, t in items:
            cum_gap.append(cum_gap[-1] + g)
            cum_tok.append(cum_tok[-1] + t)
        curve = []
        for keep in KEEP_TIMES:
            k = bisect.bisect_right(gaps, keep)
            curve.append((cum_gap[k] + (len(items) - k) * keep, cum_tok[k]))
        curves.append(curve)

    def solve(price):
        cost = hits = 0
        for curve in curves:
            c, h = max(curve, key=lambda p: p[1] - price * p[0])
            cost += c
            hits += h
        return cost, hits

    budget = capacity_blocks * footprint_stores
    lo, hi = 1e-9, 1e4
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if solve(mid)[0] > budget:
            lo = mid
        else:
            hi = mid
    (c1, h1), (c2, h2) = solve(lo), solve(hi)
    if c1 == c2:
        return h2, len(curves)
    w = min(1.0, max(0.0, (budget - c2) / (c1 - c2)))
    return h2 + w * (h1 - h2), len(curves)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="/work/shared/data/mooncake_conversation_trace.jsonl")
    ap.add_argument("--capacities", default="0.05,0.1,0.2,0.4")
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--partial-blocks", action="store_true")
    args = ap.parse_args()
    reqs = load(args.trace, args.block_tokens, args.partial_blocks)
    footprint = len({b for _, ids in reqs for b in ids})
    total_tokens = sum(t for t, _ in reqs)
    obs = observations(reqs, args.block_tokens)
    caps = [float(c) for c in args.capacities.split(",")]
    print(f"{len(reqs)} requests, footprint {footprint} blocks, {total_tokens} input tokens")
    print("| features (classes) | " + " | ".join(f"{c * 100:g}%" for c in caps) + " |")
    print("|---|" + "---|" * len(caps))
    for name, classify in FEATURES.items():
        cells, classes = [], 0
        for c in caps:
            hits, classes = bound(obs, classify, c * footprint, footprint)
            cells.append(f"{100 * hits / total_tokens:.2f}%")
        print(f"| {name} ({classes}) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
