"""Fixtures of the end-to-end suite (a real vLLM for CPUs, see tests/e2e/README.md).

Run with `make e2e` (builds kvd, creates .venv-e2e, runs pytest from it).

- `server_kind`: "kvd" (default) or "lmcache" (KVD_E2E_SERVER=lmcache: the reference
  `lmcache server --supported-transfer-mode auto` from .venv-e2e).
- `model_dir`: one small random-weight Llama-style model per session (model.py).
- `start_server(**kw)`: starts a CacheServer of `server_kind` (stopped at the end).
- `start_vllm(settings, name, env=None)`: starts one VllmProcess (closed at the end). Only one
  vLLM runs at a time (the machine is small): starting a second closes nothing, it
  fails the test.
- `vllm_settings` (from e2e_harness) builds settings for a block size and a server.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e_harness import CacheServer, VllmProcess, server_kind as _server_kind
from model import ModelSpec, write_model


@pytest.fixture(scope="session")
def server_kind() -> str:
    return _server_kind()


@pytest.fixture(scope="session")
def logdir(tmp_path_factory) -> Path:
    keep = os.environ.get("KVD_E2E_LOGDIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return Path(keep)
    return tmp_path_factory.mktemp("e2e-logs")


@pytest.fixture(scope="session")
def model_spec() -> ModelSpec:
    return ModelSpec()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, model_spec) -> str:
    return write_model(str(tmp_path_factory.mktemp("model")), model_spec)


@pytest.fixture(scope="module")
def start_server(server_kind, logdir):
    servers: list[CacheServer] = []

    def start(**kw) -> CacheServer:
        s = CacheServer(kw.pop("kind", server_kind), logdir, **kw).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


_running: list[VllmProcess] = []


@pytest.fixture(scope="module")
def start_vllm(logdir):
    mine: list[VllmProcess] = []

    def start(settings: dict, name: str, env: dict | None = None) -> VllmProcess:
        live = [p for p in _running if p.proc is not None]
        assert not live, "one vLLM at a time: close the previous VllmProcess first"
        p = VllmProcess(settings, logdir / f"vllm-{name}.log", env=env)
        _running.append(p)
        mine.append(p)
        try:
            return p.start()
        except BaseException:
            p.close()
            raise

    yield start
    for p in mine:
        p.close()
