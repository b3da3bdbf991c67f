"""tools/gpu_harness.py in its CPU mode (--device cpu: shared-memory tensors), against a real
kvd: the GPU check's own harness keeps working on machines without a GPU.

MiniMax-M3 at TP=8 runs its 8 ranks as 8 processes of their own, as vLLM's workers do (issue
26 item 1: in one process, PyTorch's caching allocator put small tensors of different ranks in
one CUDA allocation and kvd refused the odd ranks' registrations); Llama-8B runs as one rank.
Every byte is checked after each retrieve. About 30-60 s on 2 cores; skipped under the
sanitizer runs, which test kvd, not this harness.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ops_fixtures as F

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.release_kvd,
              pytest.mark.skipif(os.environ.get("KVD_TEST_SANITIZER") is not None,
                                 reason="tests the GPU harness, not kvd: once, in the plain run")]


def test_gpu_harness_cpu_mode_runs_m3_ranks_as_processes_and_checks_every_byte(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("zmq")
    kvd = F.Kvd(tmp_path / "kvd.log", l1_size_gb=1.0).start()
    out = tmp_path / "results.json"
    try:
        r = subprocess.run(
            [sys.executable, str(REPO_ROOT / "tools" / "gpu_harness.py"), "--url", kvd.url,
             "--device", "cpu", "--client", "raw", "--models", "m3-tp8,llama-nhd",
             "--chunks", "2", "--rounds", "1", "--out", str(out)],
            capture_output=True, text=True, timeout=300)
        assert kvd.proc.poll() is None, "kvd exited during the run"
    finally:
        kvd.stop()
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-4000:]
    assert "VERDICT: PASS" in text, text[-4000:]
    results = {m["model"]: m for m in json.loads(out.read_text())}
    m3, llama = results["m3-tp8"], results["llama-nhd"]
    assert m3["ok"] and llama["ok"], text[-4000:]
    assert m3["ranks"] == 8
    pids = m3["rank_pids"]
    assert len(set(pids)) == 8, f"the 8 ranks ran in {len(set(pids))} process(es): {pids}"
    assert not set(pids) & set(llama["rank_pids"]), "a TP=8 rank ran in the harness's own process"
    for m in (m3, llama):
        assert m["store_gbps"] and m["retrieve_gbps"] and min(m["store_gbps"] + m["retrieve_gbps"]) > 0
    assert len(llama["rank_pids"]) == 1  # one rank: in the harness's own process
