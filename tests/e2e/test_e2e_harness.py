"""The e2e harness's own pieces that need no vLLM (seconds)."""

from __future__ import annotations

import os
import subprocess
import sys

from e2e_harness import remove_stale_lmcache_segments


def test_a_dead_workers_lmcache_segment_is_removed_and_a_live_ones_kept(tmp_path):
    """Regression: a fresh-clone CI run failed every blend test at vLLM's start with
    "[Errno 17] File exists: '/lmcache_kv_16059_0'": a worker killed by an earlier run had
    left its lmcache segment in /dev/shm, and the new worker got the same pid. The harness
    now removes the segments of dead processes before each vLLM start and after each close."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    names = {f"lmcache_kv_{dead_pid}_0": False, f"lmcache_kv_{dead_pid}_3": False,
             f"lmcache_kv_{os.getpid()}_0": True,       # this process: alive
             "lmcache_kv_1_0": True,                     # init: alive (or not ours to remove)
             "kvd_l1_123": True, "lmcache_kv_x_0": True}  # not an lmcache KV segment
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    removed = remove_stale_lmcache_segments(str(tmp_path))
    assert removed == sorted(n for n, keep in names.items() if not keep)
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, keep in names.items() if keep)
    assert remove_stale_lmcache_segments(str(tmp_path / "absent")) == []
