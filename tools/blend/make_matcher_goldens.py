#!/usr/bin/env python3
"""Goldens for kvd's CacheBlend matcher (src/blend/matcher.h), produced by lmcache 0.5.6's own code.

Writes tests/unit/blend/data/matcher_goldens.json, which tests/unit/blend/matcher_golden_test.cc
checks kvd against:

  poly       lmcache's numba window hashes (token_hasher.chunk_hash_windows_numba and
             rolling_hash_windows_numba) of a few token sequences, including ids at and above
             2^32 and up to 2^64 - 1, for window sizes 256 and 16;
  collision  two different 256-token windows (ids in [0, 50000)) with the same 64-bit hash,
             checked with lmcache's chunk_hash_windows_numba;
  scenarios  scripted STOREs, probes and removals run through lmcache's blend STORE handler
             (modules/blend/store.py: StoreMixin.store, then its synchronous drain into a real
             BlendTokenRangeMatcher, with real Sessions and the blake3 TokenHasher), the
             matcher's match_sub_sequence and remove_chunks, and the lookup's non-overlap
             selection (LookupMixin._non_overlapping_after_prefix). They cover the chunk-0
             skip, a chunk that was not committed, a STORE that starts past 0, the slot
             overwrite by a newer registration, removal, each window once at its first
             position, short queries, overlapping matches, the engineered collision and
             --enable-dedup-content.

Regenerate, from the repository root, with the project venv (`make venv`):

    .venv/bin/python tools/blend/make_matcher_goldens.py \
        --out tests/unit/blend/data/matcher_goldens.json

The output is deterministic (fixed seeds). The collision search (an LLL reduction in pure
Python) takes a few seconds.
"""

import argparse
from fractions import Fraction
import json
import os
import queue
import random
import sys
import threading
from types import SimpleNamespace

import numpy as np

from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.modules.blend.lookup import LookupMixin
from lmcache.v1.multiprocess.modules.blend.matcher import BlendTokenRangeMatcher
from lmcache.v1.multiprocess.modules.blend.store import StoreMixin
from lmcache.v1.multiprocess.session import Session
from lmcache.v1.multiprocess.token_hasher import (
    TokenHasher,
    chunk_hash_windows_numba,
    rolling_hash_windows_numba,
)

CHUNK = 256
M64 = 1 << 64
BASE = int(BlendTokenRangeMatcher._BASE)
VOCAB = 50000


# --- poly hash goldens ------------------------------------------------------------------


def poly_case(name, tokens, k, offsets):
    arr = np.array(tokens, dtype=np.uint64)
    chunks = chunk_hash_windows_numba(arr, k, BlendTokenRangeMatcher._BASE)
    rolling = rolling_hash_windows_numba(arr, k, BlendTokenRangeMatcher._BASE)
    return {
        "name": name,
        "k": k,
        "tokens": [int(t) for t in tokens],
        "chunk_hashes": [int(h) for h in chunks],
        "rolling_offsets": offsets,
        "rolling_hashes": [int(rolling[o]) for o in offsets],
        "num_rolling": int(rolling.shape[0]),
    }


def poly_goldens(rng):
    small = [rng.randrange(VOCAB) for _ in range(700)]
    specials = [0, 1, VOCAB - 1, (1 << 32) - 1, 1 << 32, (1 << 32) + 7, (1 << 63) - 1, 1 << 63,
                M64 - 2, M64 - 1]
    large = [specials[i % len(specials)] if i % 3 == 0 else rng.randrange(M64) for i in range(600)]
    return [
        poly_case("small_ids_k256", small, 256, [0, 1, 2, 100, 255, 256, 257, 300, 443, 444]),
        poly_case("large_ids_k256", large, 256, [0, 1, 17, 200, 256, 343, 344]),
        poly_case("small_ids_k16", small[:100], 16, [0, 1, 15, 16, 50, 84]),
        poly_case("exactly_one_window", small[:256], 256, [0]),
    ]


def numpy_refuses_negative_ids():
    """What lmcache's conversion (np.array(token_ids, dtype=np.uint64)) does with -1."""
    try:
        np.array([-1], dtype=np.uint64)
        return "accepted"
    except OverflowError:
        return "OverflowError"


# --- engineered collision ---------------------------------------------------------------


def lll(basis):
    """Textbook LLL (delta = 3/4) with exact rationals; fine for ~13 rows."""
    b = [list(r) for r in basis]
    n = len(b)

    def dot(u, v):
        return sum(x * y for x, y in zip(u, v))

    bs, norm = [None] * n, [None] * n
    mu = [[Fraction(0)] * n for _ in range(n)]

    def gram_schmidt_from(start):
        for i in range(start, n):
            v = [Fraction(x) for x in b[i]]
            for j in range(i):
                mu[i][j] = dot(b[i], bs[j]) / norm[j]
                v = [a - mu[i][j] * c for a, c in zip(v, bs[j])]
            bs[i], norm[i] = v, dot(v, v)

    gram_schmidt_from(0)
    k = 1
    while k < n:
        for j in range(k - 1, -1, -1):
            q = round(mu[k][j])
            if q:
                b[k] = [a - q * c for a, c in zip(b[k], b[j])]
                for i in range(j):
                    mu[k][i] -= q * mu[j][i]
                mu[k][j] -= q
        if norm[k] >= (Fraction(3, 4) - mu[k][k - 1] ** 2) * norm[k - 1]:
            k += 1
        else:
            b[k], b[k - 1] = b[k - 1], b[k]
            gram_schmidt_from(k - 1)
            k = max(k - 1, 1)
    return b


def find_collision(rng, first_pos=100, n=12):
    """Small d_i at positions first_pos .. first_pos+n-1 with sum d_i B^(255-i) = 0 mod 2^64.

    The lattice of integer vectors d with sum d_i c_i = 0 (mod 2^64) has determinant 2^64, so
    it holds vectors of norm about 2^(64/n); LLL on the rows (e_i | W c_i) and (0 | W 2^64),
    W large, finds one whose last coordinate is 0. Then x and y = x + d differ only there.
    """
    positions = list(range(first_pos, first_pos + n))
    coef = [pow(BASE, CHUNK - 1 - i, M64) for i in positions]
    weight = 1 << 30
    rows = [[int(i == j) for j in range(n)] + [weight * coef[i]] for i in range(n)]
    rows.append([0] * n + [weight * M64])
    for row in lll(rows):
        d = row[:-1]
        if row[-1] == 0 and any(d):
            break
    else:
        raise RuntimeError("LLL found no relation")
    assert sum(di * c for di, c in zip(d, coef)) % M64 == 0
    bound = max(abs(v) for v in d)
    x = [rng.randrange(bound, VOCAB - bound) for _ in range(CHUNK)]
    y = list(x)
    for p, di in zip(positions, d):
        y[p] = x[p] + di
    assert x != y and all(0 <= t < VOCAB for t in x + y)
    hx, hy = (int(chunk_hash_windows_numba(np.array(w, dtype=np.uint64), CHUNK,
                                           BlendTokenRangeMatcher._BASE)[0]) for w in (x, y))
    assert hx == hy, "lmcache's hash must collide"
    return {"x": x, "y": y, "positions": positions, "d": d, "h": hx}


# --- scripted scenarios through lmcache's STORE handler and matcher ---------------------


class FakeBlendServer:
    """The state StoreMixin.store and _drain_fingerprints_sync read, with a stub transfer
    module whose store commits exactly the chunks the script says."""

    def __init__(self, dedup_content):
        self._hasher = TokenHasher(chunk_size=CHUNK, hash_algorithm="blake3")
        self._sessions = {}
        self._ctx = SimpleNamespace(
            chunk_size=CHUNK,
            session_manager=SimpleNamespace(get_or_create=self._session),
        )
        self._mask = []
        self._transfer_module = SimpleNamespace(
            store_with_chunk_mask=lambda key, iid, blocks, ev: (b"", True, list(self._mask)),
            get_and_touch_context_entry=lambda iid: None,
        )
        self._token_range_matcher = BlendTokenRangeMatcher(CHUNK, dedup_content=dedup_content)
        self._fingerprint_queue = queue.Queue()
        self._pending_fp_hashes = set()
        self._pending_fp_lock = threading.Lock()
        self._prompt_store = None
        self.registered = 0
        self._emit_fingerprints_registered = self._count

    def _session(self, request_id):
        if request_id not in self._sessions:
            self._sessions[request_id] = Session(request_id=request_id, hasher=self._hasher)
        return self._sessions[request_id]

    def _count(self, rid, n):
        self.registered += n

    def store(self, rid, tokens, start, end, committed):
        key = IPCCacheServerKey.from_token_ids("model", 1, 0, tokens, start, end, rid)
        self._mask = committed
        StoreMixin.store(self, key, 0, [[0]], b"")
        self.registered = 0
        StoreMixin._drain_fingerprints_sync(self)
        keys = [TokenHasher.hash_to_bytes(h) for h in self._session(rid).get_hashes(start, end)]
        return keys, self.registered


def match_row(r):
    return [r.old_st, r.old_ed, r.cur_st, r.cur_ed, r.hash.hex()]


def run_scenario(name, docs, ops, dedup_content):
    server = FakeBlendServer(dedup_content)
    out_ops = []
    for n, op in enumerate(ops):
        tokens = [t for part in op.get("seq", []) for t in docs[part]]
        if op["op"] == "store":
            keys, registered = server.store(f"{name}-{n}", tokens, op["start"], op["end"],
                                            op["committed"])
            out_ops.append({**op, "keys": [k.hex() for k in keys], "registered": registered})
        elif op["op"] == "probe":
            matches = server._token_range_matcher.match_sub_sequence(tokens)
            rec = {**op, "matches": [match_row(r) for r in matches]}
            if "select_prefixes" in op:
                rec["selected"] = [
                    [match_row(r) for r in LookupMixin._non_overlapping_after_prefix(matches, p)]
                    for p in op["select_prefixes"]
                ]
            out_ops.append(rec)
        elif op["op"] == "remove":
            # Chunks of an earlier store, by index in its stored range.
            keys = [out_ops[op["of_store"]]["keys"][i] for i in op["chunks"]]
            server._token_range_matcher.remove_chunks([bytes.fromhex(h) for h in keys])
            out_ops.append({**op, "keys": keys})
        else:
            raise ValueError(op["op"])
    return {"name": name, "dedup_content": dedup_content, "ops": out_ops}


def scenario_goldens(rng, collision):
    def doc(n=CHUNK):
        return [rng.randrange(VOCAB) for _ in range(n)]

    docs = {name: doc() for name in "ABCDEFGHXYZ"}
    docs.update({"P100": doc(100), "P50": doc(50), "P37": doc(37), "P10": doc(10),
                 "P300": doc(300), "P20": doc(20)})
    docs["B255"] = docs["B"][:255]
    text = doc(384)  # W1 = text[0:256] and W2 = text[128:384] overlap in a query holding both
    docs.update({"W1": text[:256], "W2": text[128:], "W1W2": text})
    docs.update({"CX": collision["x"], "CY": collision["y"]})

    main_ops = [
        {"op": "store", "seq": ["A", "B", "C"], "start": 0, "end": 768, "committed": [True] * 3},
        {"op": "probe", "seq": ["P100", "A", "C", "B", "P50"], "select_prefixes": [0, 357]},
        {"op": "probe", "seq": ["P100", "C", "P37", "C"]},
        {"op": "probe", "seq": ["B255"]},
        {"op": "probe", "seq": ["P10", "B255"]},
        {"op": "store", "seq": ["D", "B"], "start": 0, "end": 512, "committed": [True] * 2},
        {"op": "probe", "seq": ["P100", "A", "C", "B", "P50"]},
        {"op": "store", "seq": ["E", "F", "G"], "start": 256, "end": 768, "committed": [True, False]},
        {"op": "probe", "seq": ["G", "F", "E"]},
        {"op": "store", "seq": ["E", "F", "G", "H"], "start": 512, "end": 1024,
         "committed": [True, True]},
        {"op": "probe", "seq": ["H", "G", "P20"]},
        {"op": "remove", "of_store": 0, "chunks": [1]},  # R1's B, whose slot R2's B now owns
        {"op": "probe", "seq": ["P100", "A", "C", "B", "P50"]},
        {"op": "store", "seq": ["X", "W1"], "start": 0, "end": 512, "committed": [True] * 2},
        {"op": "store", "seq": ["Y", "W2"], "start": 0, "end": 512, "committed": [True] * 2},
        {"op": "probe", "seq": ["P300", "W1W2", "P20"], "select_prefixes": [0, 300, 301, 429]},
        {"op": "store", "seq": ["Z", "CX"], "start": 0, "end": 512, "committed": [True] * 2},
        {"op": "probe", "seq": ["P10", "CY", "P10"]},
    ]
    dedup_ops = [
        {"op": "store", "seq": ["A", "B", "C"], "start": 0, "end": 768, "committed": [True] * 3},
        {"op": "store", "seq": ["D", "B", "B"], "start": 0, "end": 768, "committed": [True] * 3},
        {"op": "probe", "seq": ["P100", "A", "C", "B", "P50"]},
    ]
    return docs, [
        run_scenario("main", docs, main_ops, dedup_content=False),
        run_scenario("dedup", docs, dedup_ops, dedup_content=True),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--out", default=os.path.join(repo, "tests/unit/blend/data/matcher_goldens.json"))
    args = parser.parse_args()
    rng = random.Random(20260)
    collision = find_collision(rng)
    docs, scenarios = scenario_goldens(rng, collision)
    golden = {
        "generator": "tools/blend/make_matcher_goldens.py (lmcache 0.5.6)",
        "base": BASE,
        "chunk_size": CHUNK,
        "numpy_negative_token_id": numpy_refuses_negative_ids(),
        "poly": poly_goldens(rng),
        "collision": collision,
        "docs": docs,
        "scenarios": scenarios,
    }
    with open(args.out, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    summary = {s["name"]: [len(op.get("matches", [])) for op in s["ops"] if op["op"] == "probe"]
               for s in scenarios}
    print(f"wrote {args.out}: collision max |d| = {max(abs(v) for v in collision['d'])}, "
          f"matches per probe {summary}", file=sys.stderr)


if __name__ == "__main__":
    main()
