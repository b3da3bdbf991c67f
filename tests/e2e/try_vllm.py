"""Try kvd with a real vLLM (README: "Try it with a real vLLM").

Writes the small random-weight Llama of the e2e tests to MODEL_DIR (no download), starts
one vLLM for CPUs (offline LLM API, vllm_worker.py) with LMCacheMPConnector pointed at a
kvd on 127.0.0.1:PORT, sends a 1,000-token prompt, resets vLLM's own prefix cache, sends it
again, and prints both outputs and their cached-token counts (the second: 768, loaded from
kvd). Run it with .venv-e2e/bin/python:

    tests/e2e/try_vllm.py [--port 5555] [--block-size 128] [--mode lmcache_driven]
"""

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_harness import ServerAt, VllmProcess  # noqa: E402
from model import write_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=5555)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--mode", default="lmcache_driven", choices=["lmcache_driven", "engine_driven"])
    ap.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "kvd-tiny-llama"))
    args = ap.parse_args()
    from e2e_harness import vllm_settings

    model = write_model(args.model_dir)
    settings = vllm_settings(model, args.block_size, ServerAt(args.port), args.mode, heartbeat=10.0)
    rng = random.Random(1)
    prompt = [rng.randrange(3, 2000) for _ in range(1000)]
    log = Path(tempfile.gettempdir()) / "kvd-try-vllm.log"
    print(f"starting vLLM (log: {log}) ...", flush=True)
    with VllmProcess(settings, log) as p:
        out, cached = p.generate([prompt])
        print(f"first:  output {out[0]}, cached prompt tokens {cached[0]}")
        time.sleep(1)  # stores are asynchronous
        p.reset_prefix_cache()
        out2, cached2 = p.generate([prompt])
        print(f"again:  output {out2[0]}, cached prompt tokens {cached2[0]} (from kvd)")
    return 0 if out == out2 and cached2[0] == 768 else 1


if __name__ == "__main__":
    sys.exit(main())
