"""The well-behaved client of the flood test (driven by test_faults.py; not a test module).

    python faults_victim.py URL MODEL SECONDS

Sequential round trips for SECONDS: a 16-chunk LOOKUP plus its QUERY_PREFETCH_STATUS and
END_SESSION (timed as "lookup": the pool path), then GET_CHUNK_SIZE (timed as "chunk_size":
the inline path), 2 ms apart. Prints "VICTIM {json of latency lists in seconds}".
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from faults_util import RawClient, cache_key  # noqa: E402


def main() -> int:
    url, model, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    c = RawClient(url)
    toks = [(i * 13) % 50_000 + 3 for i in range(16 * 256)]
    out: dict[str, list[float]] = {"lookup": [], "chunk_size": []}
    deadline = time.monotonic() + seconds
    i = 0
    try:
        while time.monotonic() < deadline:
            i += 1
            rq = f"victim-{i}"
            t = time.monotonic()
            c.call("lookup", cache_key(model, 1, None, toks, 0, len(toks), rq), 1, timeout=30)
            c.call("query_prefetch_status", rq, timeout=30)
            c.call("end_session", rq, timeout=30)
            out["lookup"].append(time.monotonic() - t)
            t = time.monotonic()
            c.call("get_chunk_size", timeout=30)
            out["chunk_size"].append(time.monotonic() - t)
            time.sleep(0.002)
    finally:
        c.close()
    print("VICTIM " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
