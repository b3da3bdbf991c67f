"""Fixtures for the kvd integration suite.

Server under test: env KVD_TEST_SERVER = "kvd" (default; binary
KVD_TEST_KVD_BIN, default <repo>/build/kvd) or "lmcache" (reference
`lmcache server` from the venv running pytest). Extra server flags can be
appended with KVD_TEST_SERVER_ARGS (shell-quoted string).

Every test module gets its own server on a free 127.0.0.1 port. At module
teardown the server is stopped (SIGTERM, then SIGKILL) and /dev/shm must
hold no new lmcache_* (or kvd_*) entry created by the module.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kvd_harness as H  # noqa: E402

MODES = ("lmcache_driven", "engine_driven")


def pytest_configure(config):
    # lmcache's own deprecation noise (opentelemetry, google api core).
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning")
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning")
    # `make test` runs this suite in full against the ASan kvd and, against the Release kvd,
    # only the tests marked release_kvd (Makefile: interop-release).
    config.addinivalue_line(
        "markers", "release_kvd: make test also runs this against the Release kvd: the "
        "sanitizer run skips it or checks a looser bound")


def pytest_report_header(config):
    kind = H.server_kind()
    if kind == "kvd":
        where = os.environ.get("KVD_TEST_KVD_BIN", str(H.DEFAULT_KVD_BIN))
    else:
        where = H.lmcache_server_bin()
    return f"kvd integration: server under test = {kind} ({where})"


def _own_client_segment(name: str) -> bool:
    # lmcache_driven workers in *this* process migrate their KV tensors to
    # /dev/shm/lmcache_kv_<pid>_<n>; those are the client's, not the server's.
    return name.startswith(f"lmcache_kv_{os.getpid()}_")


def _server_shm_names(pid: int) -> set[str]:
    """/dev/shm names a live process maps or holds open."""
    names: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find("/dev/shm/")
                if i >= 0:
                    names.add(line[i + len("/dev/shm/"):].strip().split(" ")[0])
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/shm/"):
                names.add(target[len("/dev/shm/"):].split(" ")[0])
    except OSError:
        pass
    return names


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """The server under test, started for this module.

    A module can set SERVER_L1_GB (float) to choose --l1-size-gb, and
    SERVER_EXTRA_ARGS (list of str) to add flags to the server's command line.

    Teardown (after every cluster of the module is closed): SIGTERM, then
    SIGKILL; then /dev/shm must hold no new entry the server created (its
    pool, anything else it had mapped, names carrying its pid or its
    --shm-name). This process's own client KV segments (lmcache_kv_<pid>_*)
    are removed too (with a warning if still present). Other processes on
    the machine may create lmcache_*/kvd_* entries concurrently; those are
    ignored.
    """
    kind = H.server_kind()
    l1 = float(getattr(request.module, "SERVER_L1_GB", 1.0))
    logdir = tmp_path_factory.mktemp("server")
    port = H.free_port()
    extra = list(getattr(request.module, "SERVER_EXTRA_ARGS", []))
    srv = H.ServerProc(kind=kind, port=port, l1_size_gb=l1, log_path=logdir / f"{kind}-{port}.log",
                       extra_args=extra)
    before = _shm_entries()
    try:
        srv.start(ready_timeout=120.0)
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    except RuntimeError as exc:
        srv.stop()
        pytest.fail(f"{exc}\n--- server log tail ---\n{srv.log_tail()}")
    server_pid = srv.proc.pid
    try:
        yield srv
    finally:
        mapped = _server_shm_names(server_pid) if srv.alive() else set()
        alive = srv.alive()
        rc = srv.stop()
        if not alive:
            print(f"\n[server had already exited rc={rc}]\n{srv.log_tail()}", file=sys.stderr)

        def ours(name: str) -> bool:
            if _own_client_segment(name):
                return True
            if name.startswith("lmcache_kv_"):
                return False  # another process's client segment (mapped by the server)
            pid_tok = str(server_pid)
            return (
                name in mapped
                or name.endswith("_" + pid_tok)
                or ("_" + pid_tok + "_") in name
                or (bool(srv.shm_name) and name.endswith(srv.shm_name))
            )

        gc.collect()
        deadline = time.monotonic() + 5.0
        while True:
            leaked = {n for n in _shm_entries() - before if ours(n)}
            if not leaked or time.monotonic() > deadline:
                break
            time.sleep(0.1)
            gc.collect()
        for name in leaked:  # never leave junk on the machine, even when failing
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass
        server_side = sorted(n for n in leaked if not _own_client_segment(n))
        client_side = sorted(n for n in leaked if _own_client_segment(n))
        if client_side:
            # The lmcache client unlinks these when the last view of the KV
            # storage is garbage-collected; they are this process's, not the
            # server's, and were just removed above.
            warnings.warn(f"lmcache client KV segments were still alive after the module: {client_side}")
        assert not server_side, f"server left /dev/shm entries behind: {server_side}"


@pytest.fixture(scope="module", params=MODES)
def cluster(request, server):
    """One scheduler adapter + two TP worker adapters registered in `mode`."""
    mode = request.param
    c = H.TPCluster(server.url, mode=mode, model_name=f"kvd-it-{mode}", tp=2)
    try:
        yield c
    finally:
        c.close()
        gc.collect()


@pytest.fixture()
def check_server_alive(server):
    yield
    assert server.alive(), f"server died during the test\n{server.log_tail()}"
