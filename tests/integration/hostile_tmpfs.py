"""Helper of test_hostile.py (finding 3): kvd on a /dev/shm that fills up.

Run as `unshare -m python hostile_tmpfs.py KVD_BIN PORT` (or `unshare --map-root-user
--mount ...` without root, see mount_ns.py): in its own mount namespace it
mounts a 16 MiB tmpfs on /dev/shm (only this process tree sees it), starts kvd with a 64 MiB
L1 in it, registers a CPU worker (raw frames) whose segment lives there too, stores distinct
prompts until the tmpfs is full, then tries an engine-driven PREPARE_STORE. Prints one JSON
line: what the stores answered, whether kvd survived, what PREPARE_STORE answered.
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import faults_util as F  # noqa: E402
import kvd_harness as H  # noqa: E402


def main() -> int:
    kvd, port = sys.argv[1], int(sys.argv[2])
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", "/dev/shm"], check=True)
    seg = F.Segment("kvd_hostile_tmpfs_kv", F.RAW_LAYER_BYTES)
    with open(seg.path, "r+b") as f:  # the worker's KV: written once, fully backed
        m = mmap.mmap(f.fileno(), F.RAW_LAYER_BYTES)
        m[:] = bytes((i * 7) & 0xFF for i in range(F.RAW_LAYER_BYTES))
        m.close()
    log = open(os.environ.get("HOSTILE_TMPFS_LOG", "/dev/null"), "wb")
    proc = subprocess.Popen([kvd, "server", "--host", "127.0.0.1", "--port", str(port),
                             "--l1-size-gb", "0.0625", "--eviction-policy", "LRU",
                             "--http-port", "0", "--shm-name", "kvd_hostile_tmpfs_pool"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out = {"stores": [], "alive": False, "prepare_slots": None}
    try:
        H.wait_until_answers(f"tcp://127.0.0.1:{port}", 60, proc)
        c = F.RawClient(f"tcp://127.0.0.1:{port}")
        F.register_raw(c, 1, "hostile-tmpfs", "/" + seg.name)
        for i in range(200):  # 200 objects of 128 KiB: 25 MiB, the tmpfs holds 16
            toks = [5000 + i * 300 + t for t in range(H.CHUNK_SIZE)]
            key = F.cache_key("hostile-tmpfs", 1, 0, toks, 0, H.CHUNK_SIZE, f"tmpfs-{i}")
            try:
                out["stores"].append(c.call("store", key, 1, [list(range(16))], b"", timeout=10)[1])
            except TimeoutError:
                out["stores"].append(None)
                break
            if proc.poll() is not None:
                break
        if proc.poll() is None:
            reg = {"instance_id": 2, "model_name": "hostile-tmpfs-ed", "world_size": 1,
                   "block_size": 16, "num_layers": 1, "hidden_dim_size": 128,
                   "dtype_str": "bfloat16", "use_mla": False, "num_physical_slots": 256}
            c.call(14, reg, timeout=10)
            key = F.cache_key("hostile-tmpfs-ed", 1, 0, list(range(9, 9 + H.CHUNK_SIZE)), 0,
                              H.CHUNK_SIZE, "tmpfs-ed")
            reply = c.call(16, key, 2, timeout=10)
            out["prepare_slots"] = len(((reply or {}).get("context") or {}).get("slots") or [])
        time.sleep(0.2)
        out["alive"] = proc.poll() is None
        out["returncode"] = proc.returncode
        c.close()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        seg.close()
        log.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
