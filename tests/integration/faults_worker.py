"""A vLLM worker that dies on purpose (driven by test_faults.py; not a test module).

    python faults_worker.py MODE URL MODEL SEED N_CHUNKS

MODE
  engine-die-before-commit  engine_driven TP=1 worker: PREPARE_STORE reserves staging slots
                            in kvd's pool, the worker copies its blocks into them, and is
                            SIGKILLed where it would send COMMIT_STORE.
  lmcache-die-in-store      lmcache_driven TP=1 worker (CpuShm KV tensors): submits a STORE
                            of N_CHUNKS chunks and is SIGKILLed before the reply arrives.

The blocks 0 .. N_CHUNKS*blocks_per_chunk hold faults_pattern(SEED) bytes. Prints "READY"
when registered and "STORING" just before the fatal step; never exits normally.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kvd_harness as H  # noqa: E402


def prompt_tokens(seed: int, n_chunks: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 + 1 for i in range(n_chunks * H.CHUNK_SIZE)]


def fill(c: H.TPCluster, rank: int, blocks: list[int], seed: int) -> None:
    c.fill_random(rank, blocks, seed=seed)


def main() -> int:
    mode, url, model, seed, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    cmode = "engine_driven" if mode.startswith("engine") else "lmcache_driven"
    c = H.TPCluster(url, cmode, model, tp=1, mq_timeout=20.0)
    toks = prompt_tokens(seed, n)
    blocks = list(range(n * c.blocks_per_chunk))
    fill(c, 0, blocks, seed)
    print("READY", flush=True)
    if mode == "engine-die-before-commit":
        from lmcache.v1.multiprocess.transfer_context.shm import EngineDrivenContextShm

        def die(*_a, **_k):
            os.kill(os.getpid(), signal.SIGKILL)

        EngineDrivenContextShm.commit_store = die
        print("STORING", flush=True)
        c.store("dying-store", toks, blocks)
    elif mode == "lmcache-die-in-store":
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

        w = c.workers[0]
        o = LoadStoreOp(token_ids=toks, block_ids=[blocks], start=0, end=len(toks))
        print("STORING", flush=True)
        w.batched_submit_store_requests(["dying-store"], [o], w.create_recorded_event())
        os.kill(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    return 1


if __name__ == "__main__":
    sys.exit(main())
