"""tools/blend_server_check.py in its CPU mode (--device cpu: shared-memory tensors), against a
real `kvd server --engine-type blend`: the GPU check's CacheBlend case (scripts/gpu-check.sh
runs it with --device cuda) keeps working on machines without a GPU. A Llama-8B-shaped worker
registers a cos/sin cache, stores a document, finds it behind another prefix and retrieves it;
the tool checks V byte for byte, K against a float64 rotation, and that nothing else was
written. About 5-10 s; skipped under the sanitizer runs, which test kvd, not this tool.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ops_fixtures as F

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.release_kvd,
              pytest.mark.skipif(os.environ.get("KVD_TEST_SANITIZER") is not None,
                                 reason="tests the GPU check's tool, not kvd: once, in the "
                                        "plain run")]


def test_blend_server_check_cpu_mode_passes_against_kvd(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("zmq")
    kvd = F.Kvd(tmp_path / "kvd.log", l1_size_gb=1.0, extra=["--engine-type", "blend"]).start()
    try:
        r = subprocess.run(
            [sys.executable, str(REPO_ROOT / "tools" / "blend_server_check.py"), "--url", kvd.url,
             "--device", "cpu"],
            capture_output=True, text=True, timeout=300)
        assert kvd.proc.poll() is None, "kvd exited during the run"
    finally:
        kvd.stop()
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-4000:]
    assert "VERDICT: PASS" in text, text[-4000:]
    for line in ("cb_register_rope with the table in cpu memory", "V of all 32 layers byte-identical",
                 "K is not left as stored", "nothing written outside the match's blocks"):
        assert f"ok    {line}" in text, text[-4000:]
