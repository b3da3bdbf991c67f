#!/usr/bin/env python3
"""Goldens for kvd's CacheBlend reorder planner (src/blend/reorder.h), produced by lmcache
0.5.6's own code (lmcache/v1/multiprocess/modules/blend/reorder.py).

Writes tests/unit/blend/data/reorder_goldens.json, which tests/unit/blend/reorder_test.cc
checks kvd against:

  segments  token runs ("documents" of 8 to 120 tokens, separators of 1 to 3 tokens, a
            question of 20 tokens); every prompt below is a list of segment ids.
  plans     reorder.plan(P, candidates, chunk_size, baseline_chunks, deadline, keep_prefix)
            for prompts made of the candidates' documents in another order, with other
            separators, documents left out or added, duplicated candidates, keep_prefix and
            baselines that forbid a plan; the answer as runs [start, length] of the
            permutation (null: keep P).
  stores    PromptStore scripts (record / resolve / candidates) with a small token bound, so
            that the oldest prompts are evicted; each candidates answer as the recorded
            prompts' indices, newest first, and the baseline.

Regenerate, from the repository root, with the project venv (`make venv`):

    .venv/bin/python tools/blend/make_reorder_goldens.py \
        --out tests/unit/blend/data/reorder_goldens.json

The output is deterministic (fixed seed; plans run with a 60 s budget, never reached).
"""

import argparse
import json
import random
import time

from lmcache.v1.multiprocess.modules.blend import reorder


def runs(perm):
    out = []
    for i in perm:
        if out and out[-1][0] + out[-1][1] == i:
            out[-1][1] += 1
        else:
            out.append([i, 1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rng = random.Random(20261205)

    # Segment table: 0..23 documents, 24..29 separators, 30 the question, 31..33 short runs
    # shared by several documents' ends (glue material).
    segs: list[list[int]] = []
    for _ in range(24):
        segs.append([rng.randrange(100, 30000) for _ in range(rng.randrange(8, 121))])
    for n in (1, 2, 3, 1, 2, 3):
        segs.append([rng.randrange(1, 100) for _ in range(n)])
    segs.append([rng.randrange(100, 30000) for _ in range(20)])
    for n in (1, 2, 3):
        segs.append([rng.randrange(1, 100) for _ in range(n)])
    DOCS, SEPS, Q = list(range(24)), list(range(24, 30)), 30

    def tokens(ids):
        return [t for s in ids for t in segs[s]]

    def prompt(docs, sep_pool, question=True):
        ids = []
        for d in docs:
            ids.append(d)
            ids.append(rng.choice(sep_pool))
        if question:
            ids.append(Q)
        return ids

    plans = []
    for case in range(48):
        chunk = rng.choice([16, 32, 64])
        n_docs = rng.randrange(2, 7)
        docs = rng.sample(DOCS, n_docs)
        seps = rng.sample(SEPS, rng.randrange(1, 3))
        cands = [prompt(docs, seps, question=rng.random() < 0.5)]
        for _ in range(rng.randrange(0, 3)):
            other = docs[:] if rng.random() < 0.5 else rng.sample(DOCS, rng.randrange(2, 6))
            rng.shuffle(other)
            cands.append(prompt(other, rng.sample(SEPS, 1)))
        if case % 7 == 3:
            cands.append(list(cands[0]))  # a duplicate
        p_docs = docs[:]
        rng.shuffle(p_docs)
        if case % 5 == 1 and len(p_docs) > 2:
            p_docs.pop()  # a document left out
        if case % 5 == 2:
            p_docs.insert(rng.randrange(len(p_docs) + 1), rng.choice(DOCS))  # one added
        p_seps = seps if case % 3 else rng.sample(SEPS + [31, 32, 33], 2)
        if case % 6 == 0:
            p_docs = docs[:1] + p_docs[1:] if p_docs[0] == docs[0] else [docs[0]] + [d for d in p_docs if d != docs[0]]
        P = prompt(p_docs, p_seps)
        keep = 0
        if case % 4 == 0:
            keep = len(segs[P[0]]) if P[0] == cands[0][0] else rng.randrange(0, 5)
        base = 0 if case % 8 else rng.randrange(0, 3)
        Pt = tokens(P)
        Ht = [tokens(c) for c in cands]
        perm = reorder.plan(Pt, Ht, chunk, base, time.monotonic() + 60, keep)
        plans.append({"prompt": P, "candidates": cands, "chunk_size": chunk,
                      "baseline_chunks": base, "keep_prefix": keep,
                      "perm": runs(perm) if perm is not None else None})

    # A prompt's chain hashes, for the store: one per 16-token chunk, equal exactly when the
    # token prefixes are (kvd's test uses its own chained hashes, with the same property).
    def chain_of(toks):
        return [repr(tuple(toks[: (i + 1) * 16])).encode() for i in range(len(toks) // 16)]

    stores = []
    nss = [("m", 1, ""), ("m", 2, ""), ("m", 1, "salt"), ("n", 1, "")]
    for script in range(8):
        max_tokens = [400, 900, 1 << 20][script % 3]
        st = reorder.PromptStore(max_tokens=max_tokens)
        recorded: list[list[int]] = []  # segment ids of each distinct recorded prompt
        index_of: dict[tuple, int] = {}
        steps = []
        for _ in range(18):
            ns = rng.choice(nss[: 1 + script % 4])
            r = rng.random()
            if r < 0.6 or not recorded:
                ids = prompt(rng.sample(DOCS, rng.randrange(1, 5)), SEPS[:2])
                toks = tokens(ids)
                rid = f"r{rng.randrange(6)}"
                st.record(ns, rid, toks, chain_of(toks))
                if tuple(toks) not in index_of:
                    index_of[tuple(toks)] = len(recorded)
                    recorded.append(ids)
                steps.append({"op": "record", "ns": list(ns), "request_id": rid,
                              "prompt": index_of[tuple(toks)]})
            elif r < 0.75:
                q = (rng.choice(["m", "", "n"]), rng.choice([1, 0, 2]), rng.choice(["", "salt"]))
                res = st.resolve(*q)
                steps.append({"op": "resolve", "query": list(q),
                              "resolved": list(res) if res else None})
            else:
                query = rng.randrange(len(recorded))
                hits = [[h, i] for h in rng.sample(range(len(recorded)), min(3, len(recorded)))
                        for i in range(len(tokens(recorded[h])) // 16) if rng.random() < 0.5]
                cands, base = st.candidates(
                    ns, [chain_of(tokens(recorded[h]))[i] for h, i in hits],
                    chain_of(tokens(recorded[query])))
                steps.append({"op": "candidates", "ns": list(ns), "hits": hits, "query": query,
                              "candidates": [index_of[tuple(int(x) for x in c)] for c in cands],
                              "baseline_chunks": base})
        stores.append({"max_tokens": max_tokens, "recorded": recorded, "steps": steps})

    with open(args.out, "w") as f:
        json.dump({"segments": segs, "plans": plans, "stores": stores}, f, separators=(",", ":"))
        f.write("\n")
    kept = sum(1 for p in plans if p["perm"] is None)
    print(f"wrote {args.out}: {len(plans)} plans ({kept} keep P), {len(stores)} store scripts")


if __name__ == "__main__":
    main()
