#!/usr/bin/env python3
"""Writes token_chain_vectors.json: chained chunk keys for kvd's keys tests.

Each case is a token list (given by a generator so the file stays small), a chunk size and
the expected chunk keys, computed here with the pip package `blake3` and checked against
lmcache 0.5.6's own TokenHasher (lmcache.v1.multiprocess.token_hasher) when it imports.

    .venv/bin/python tests/data/token_chains/make_vectors.py > tests/data/token_chains/token_chain_vectors.json
"""
import json
import struct
import sys

import blake3

NONE_SEED = (0).to_bytes(8, "big", signed=True) + struct.pack(">I", 0)


def tokens_of(gen):
    kind, n, a, b, m = gen["kind"], gen["n"], gen["a"], gen["b"], gen["mod"]
    if kind == "affine":  # (i * a + b) % mod
        return [(i * a + b) % m for i in range(n)]
    if kind == "xorshift":  # 32-bit xorshift stream seeded with a, values % mod
        x, out = a or 1, []
        for _ in range(n):
            x ^= (x << 13) & 0xFFFFFFFF
            x ^= x >> 17
            x ^= (x << 5) & 0xFFFFFFFF
            out.append(x % m)
        return out
    raise ValueError(kind)


def chain(tokens, c):
    prev = blake3.blake3(NONE_SEED).digest()
    out = []
    for i in range(0, len(tokens) - len(tokens) % c, c):
        prev = blake3.blake3(prev + struct.pack(f">{c}I", *tokens[i:i + c])).digest()
        out.append(prev.hex())
    return out


GENS = [
    # (generator, chunk sizes)
    ({"kind": "affine", "n": 4096, "a": 7919, "b": 13, "mod": 151936}, [256, 247, 248, 249, 504, 505, 512, 1000]),
    ({"kind": "affine", "n": 200, "a": 104729, "b": 7, "mod": 2**32}, [1, 8, 16]),
    ({"kind": "xorshift", "n": 3000, "a": 2463534242, "b": 0, "mod": 2**32}, [256, 63, 64, 65, 255, 257, 503]),
    ({"kind": "affine", "n": 1024, "a": 0, "b": 4294967295, "mod": 2**32}, [256]),  # all 2^32 - 1
    ({"kind": "affine", "n": 1024, "a": 0, "b": 0, "mod": 2**32}, [256]),           # all zero
]


def main():
    try:
        sys.path.insert(0, ".")
        from lmcache.v1.multiprocess.token_hasher import TokenHasher  # noqa: E402
    except Exception as e:  # pragma: no cover - informational only
        TokenHasher = None
        print(f"note: lmcache TokenHasher not importable ({e}); pip blake3 only", file=sys.stderr)
    cases = []
    for gen, sizes in GENS:
        toks = tokens_of(gen)
        for c in sizes:
            keys = chain(toks, c)
            if TokenHasher is not None:
                th = TokenHasher(chunk_size=c, hash_algorithm="blake3")
                theirs = [h.hex() for h in th.compute_chunk_hashes(toks)]
                assert theirs == keys, f"TokenHasher disagrees for {gen} chunk {c}"
            cases.append({"tokens": gen, "chunk_size": c, "keys": keys})
    json.dump({"none_hash": blake3.blake3(NONE_SEED).hexdigest(),
               "checked_against_lmcache_token_hasher": TokenHasher is not None,
               "cases": cases}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
