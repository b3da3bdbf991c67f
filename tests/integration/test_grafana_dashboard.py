"""docs/grafana/kvd-lmcache-dashboard.json queries only series that exist: every metric name
in its expressions is in kvd's /metrics (kvd started with an fs tier and P2P on, a real
redis-server as its fleet directory, so the tier and P2P series are there; a labelled family without traffic yet, such as the lookup series, has no sample but is
declared by its # TYPE line), and every lmcache_mp_* name is one lmcache 0.5.6 defines (its
OpenTelemetry name, found in the lmcache package's source, with the unit and _total the
Prometheus exporter appends)."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import urllib.request
from pathlib import Path

import lmcache

from kvd_harness import ServerProc, free_port
from tiers_util import Redis

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "kvd-lmcache-dashboard.json"
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "le", "op", "model_name", "l2_name",
                "cache_salt", "device", "reason"}
UNITS = ("_tokens", "_requests", "_chunks", "_keys", "_bytes", "_seconds", "_GB_per_second")


def dashboard_metrics() -> set[str]:
    dash = json.loads(DASHBOARD.read_text())
    names = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\[[0-9]+[smhd]\]", "", target["expr"])
            for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
                if word not in PROMQL_WORDS:
                    names.add(word)
    return names


def lmcache_otel_names() -> set[str]:
    """Every "lmcache_mp.<name>" string in the lmcache package, as Prometheus spells it."""
    found = set()
    for py in Path(lmcache.__file__).parent.rglob("*.py"):
        for m in re.findall(r'"(lmcache_mp\.[a-z0-9_.]+)"', py.read_text(errors="replace")):
            found.add(m.replace(".", "_"))
    return found


def base_names(metric: str) -> set[str]:
    """The OpenTelemetry names a Prometheus series may come from."""
    m = re.sub(r"_(bucket|sum|count)$", "", metric)
    m = re.sub(r"_total$", "", m)
    out = {m}
    for unit in UNITS:
        if m.endswith(unit):
            out.add(m[: -len(unit)])
    return out


def test_every_dashboard_metric_exists_in_kvd_and_in_lmcache(tmp_path: Path):
    names = dashboard_metrics()
    assert len(names) >= 15, names
    assert all(n.startswith(("lmcache_mp_", "kvd_")) for n in names), names

    otel = lmcache_otel_names()
    assert "lmcache_mp_lookup_requested" in otel  # the scan finds lmcache's definitions
    not_lmcache = sorted(n for n in names if n.startswith("lmcache_mp_") and not base_names(n) & otel)
    assert not not_lmcache, f"not defined by lmcache 0.5.6: {not_lmcache}"

    tier = tempfile.mkdtemp(prefix="kvd-grafana-")
    http = free_port()
    redis = Redis().start()
    secret = tmp_path / "p2p.secret"
    secret.write_text("grafana-test\n")
    srv = ServerProc(kind="kvd", port=free_port(), l1_size_gb=0.05, log_path=tmp_path / "kvd.log",
                     extra_args=["--l2-adapter", json.dumps({"type": "fs", "base_path": tier}),
                                 "--http-port", str(http),
                                 "--p2p-advertise-url", f"127.0.0.1:{free_port()}",
                                 "--p2p-directory", f"redis://127.0.0.1:{redis.port}",
                                 "--p2p-secret-file", str(secret), "--p2p-ucx-tls", "tcp"])
    try:
        srv.start()
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        srv.stop()
        redis.close()
        shutil.rmtree(tier, ignore_errors=True)
    exported = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines()
                if line and not line.startswith("#")}
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        exported.add(family)
        if kind == "histogram":
            exported.update(family + s for s in ("_bucket", "_sum", "_count"))
    missing = sorted(n for n in names if n not in exported)
    assert not missing, f"the dashboard queries series kvd does not export: {missing}"
