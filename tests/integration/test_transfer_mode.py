"""--supported-transfer-mode with the real lmcache 0.5.6 adapters: the mode kvd serves
stores and hits; the other mode's registration is refused, with a log line naming the flag,
and none of its stores is accepted.

Run:  KVD_TEST_KVD_BIN=build/kvd .venv/bin/python -m pytest tests/integration/test_transfer_mode.py -q
"""

from __future__ import annotations

import gc

import pytest

import kvd_harness as H

pytestmark = pytest.mark.skipif(H.server_kind() != "kvd", reason="a kvd flag default")


def _store_and_hit(c: H.TPCluster) -> tuple[list[bool], int]:
    toks = H.unique_tokens(2 * H.CHUNK_SIZE)
    src = list(range(1, 1 + 2 * H.CHUNK_SIZE // H.BLOCK_SIZE))
    results = c.store("tm-store", toks, src)
    c.end_session("tm-store")
    return results, c.probe(toks)


@pytest.mark.parametrize("served", ["lmcache_driven", "engine_driven"])
def test_only_the_served_transfer_mode_works(served, tmp_path):
    other = "engine_driven" if served == "lmcache_driven" else "lmcache_driven"
    srv = H.ServerProc(kind="kvd", port=H.free_port(), l1_size_gb=0.25,
                       log_path=tmp_path / "kvd.log",
                       extra_args=["--supported-transfer-mode", served])
    srv.start()
    try:
        c = H.TPCluster(srv.url, mode=served, model_name=f"tm-{served}", tp=2, mq_timeout=10)
        try:
            results, hit = _store_and_hit(c)
            assert results == [True, True] and hit == 2 * H.CHUNK_SIZE
        finally:
            c.close()
        refused_results = None
        try:
            c = H.TPCluster(srv.url, mode=other, model_name=f"tm-{other}", tp=2, mq_timeout=5)
        except Exception:  # noqa: BLE001 - the adapter may raise on a refused registration
            pass
        else:
            try:
                refused_results, hit = _store_and_hit(c)
                assert hit == 0
            finally:
                c.close()
        assert refused_results in (None, [False, False]), refused_results
        log = (tmp_path / "kvd.log").read_text()
        assert f"--supported-transfer-mode {served}" in log, log[-2000:]
    finally:
        gc.collect()
        srv.stop()
