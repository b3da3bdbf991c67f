"""L1 memory flags: --l1-use-lazy, --l1-init-size-gb, --l1-align-bytes.

The server under test starts lazy with an initial size of 0 GiB and 64 KiB
alignment, so the first store must grow the pool's usable part before it can
be served, and every object sits on a 64 KiB boundary. A store, lookup and
retrieve through the real lmcache 0.5.6 adapters (both transfer modes) must
round-trip the bytes. Bad values stop startup with a message naming the flag
(checked on a configuration check: nothing is started).

The reference server runs this module too, without the extra flags (its lazy
allocator and engine-driven SHM pool do not go together).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import kvd_harness as H
from test_kv_flows import CHUNK, BPC, assert_same_bytes, blocks, rid, store_prompt

SERVER_L1_GB = 1.0
ALIGN = 65536
SERVER_EXTRA_ARGS = (
    ["--l1-use-lazy", "--l1-init-size-gb", "0", "--l1-align-bytes", str(ALIGN)]
    if H.server_kind() == "kvd" else []
)


def test_lazy_aligned_l1_serves_store_and_retrieve(server, cluster, check_server_alive):
    c = cluster
    toks, _src, expected = store_prompt(c, 2 * CHUNK)
    req = rid("l1flags-load")
    hit = c.lookup(req, toks)
    assert hit == 2 * CHUNK
    dst = blocks(80, 2 * BPC)
    for r in range(c.tp):
        c.zero_blocks(r, dst)
    assert c.retrieve(req, toks, dst, end=hit) == [True] * c.tp
    c.end_session(req)
    for r in range(c.tp):
        assert_same_bytes(c.snapshot_blocks(r, dst), expected[r], f"rank {r} retrieved blocks")
    if server.kind != "kvd":
        return
    log = Path(server.log_path).read_text(errors="replace")
    assert f"align {ALIGN}" in log, "the pool was not created with --l1-align-bytes"
    # Lazy from 0 bytes: the first store grew the usable part (to all of 1 GiB, one step).
    assert re.search(r"grew the pool's usable part from 0 to 1073741824 of 1073741824 bytes", log), (
        "no lazy growth logged\n" + server.log_tail())


def _check_config(*args: str) -> subprocess.CompletedProcess:
    kvd = os.environ.get("KVD_TEST_KVD_BIN", str(H.DEFAULT_KVD_BIN))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    return subprocess.run([kvd, "server", "--eviction-policy", "LRU", "--check-config", *args],
                          capture_output=True, text=True, timeout=20, env=env)


def test_bad_l1_values_stop_startup_with_the_flag_named():
    if H.server_kind() != "kvd":
        return
    cases = {
        ("--l1-size-gb", "1", "--l1-align-bytes", "3000"): "--l1-align-bytes 3000: must be a power of two",
        ("--l1-size-gb", "0.5", "--l1-align-bytes", "1073741824"):
            "--l1-align-bytes 1073741824: larger than --l1-size-gb",
        ("--l1-size-gb", "1", "--l1-init-size-gb", "-1"): "--l1-init-size-gb -1: out of range",
    }
    for args, message in cases.items():
        out = _check_config(*args)
        assert out.returncode == 2, (args, out.returncode, out.stderr)
        assert out.stderr.startswith("kvd: ") and message in out.stderr, (args, out.stderr)
    # An initial size above the L1 size (lmcache's default 20, or given) is capped, as lmcache
    # caps it: accepted.
    for args in (("--l1-size-gb", "1", "--l1-use-lazy"), ("--l1-size-gb", "2", "--l1-init-size-gb", "3")):
        ok = _check_config(*args)
        assert ok.returncode == 0, (args, ok.stderr)
        assert "l1_use_lazy=true l1_init_size_gb=" in ok.stdout + ok.stderr
