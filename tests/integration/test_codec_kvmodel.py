"""The checked-in KV model (tests/data/kvmodel/) loads, is trained (not random), and its
real KV survives a round trip through kvd's codec (build/kvd-codec) with the quality
docs/compression.md reports: CacheGen at 32 bins and lmcache's fp8 serde, on two
held-out windows (two 256-token chunk objects each). Needs torch (the shared venv).
About 10-30 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "kvmodel"))

torch = pytest.importorskip("torch")


def _codec_bin() -> Path:
    kvd = os.environ.get("KVD_BIN") or os.environ.get("KVD_TEST_KVD_BIN")
    if kvd and (Path(kvd).parent / "kvd-codec").exists():
        return Path(kvd).parent / "kvd-codec"
    return REPO / "build" / "kvd-codec"


@pytest.fixture(scope="module")
def ref():
    import measure
    from model import load

    torch.set_num_threads(2)
    m = load(str(REPO / "tests/data/kvmodel/kvmodel.pt"))
    win = np.fromfile(REPO / "tests/data/kvmodel/heldout.bin", dtype=np.uint8).reshape(-1, 641)
    return measure.Reference(m, win[::32], greedy=False)


def test_checkpoint_is_the_trained_model(ref):
    ck = torch.load(REPO / "tests/data/kvmodel/kvmodel.pt", weights_only=True)
    recipe = json.loads(ck["recipe"])
    assert recipe["seed"] == 1234 and recipe["steps"] > 0
    cfg = ref.m.cfg
    assert (cfg.layers, cfg.kv_heads, cfg.head_dim) == (6, 2, 64)
    # A random-weight byte model scores about 8 bits per byte; this one is trained.
    assert ref.nll / np.log(2) < 3.0


def test_cachegen_32_bins_round_trip_on_real_kv(ref):
    import measure

    k, v, nbytes, stats = measure.run_kvd(ref, str(_codec_bin()), ["--bins", "32"])
    m = measure.metrics(ref, k, v, nbytes)
    assert stats["objects"] == ref.n * 2
    assert m["bits_per_value"] < 5.0, m["bits_per_value"]       # about 4.4
    assert max(m["k_rel_err"] + m["v_rel_err"]) < 0.08           # about 0.06
    assert m["kl_nats"] < 1e-3 and m["top1"] >= 0.98
    # Fewer bins: smaller and coarser.
    k16, v16, n16, _ = measure.run_kvd(ref, str(_codec_bin()), ["--bins", "16"])
    m16 = measure.metrics(ref, k16, v16, n16)
    assert n16 < nbytes and np.mean(m16["k_rel_err"]) > np.mean(m["k_rel_err"])


def test_fp8_serde_round_trip_on_real_kv(ref):
    import measure

    k, v, nbytes, _ = measure.run_kvd(ref, str(_codec_bin()), ["--codec", "fp8"])
    m = measure.metrics(ref, k, v, nbytes)
    assert m["ratio_bf16"] == 2.0
    assert max(m["k_rel_err"] + m["v_rel_err"]) < 0.04           # e4m3: 3 mantissa bits
    # The same cast as torch's: decode(encode(x)) == x.to(float8_e4m3fn).to(bfloat16).
    want = ref.k[0].to(torch.float8_e4m3fn).to(torch.bfloat16).float()
    assert torch.equal(k[0], want)
