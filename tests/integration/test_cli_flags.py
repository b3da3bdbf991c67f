"""Every flag of the real `lmcache server` 0.5.6 against kvd's flags table.

The reference flags are read from lmcache's own parser (lmcache_server_flags.py), so a flag
that lmcache adds, renames or hides fails here until kvd's table (src/cli/flags_table_lmcache.cc)
says what kvd does with it. For every flag and every value worth trying (each choice, both
forms of a boolean, the default, a sample) kvd is run with `--check-config`, and its answer
must match what its table claims: implemented and accepted values start (accepted ones are
listed at startup), refused ones stop with exactly one line naming the flag, exit 2. Bad
values (wrong type, out of range, not a choice, JSON that does not parse) stop with one line
naming flag and value, exit 2, and nothing is started. docs/cli.md must show the table as
`kvd server --list-flags markdown` prints it.

Run:  KVD_BIN=build/kvd .venv/bin/python -m pytest tests/integration/test_cli_flags.py -q
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvd_harness import free_port

REPO = Path(__file__).resolve().parents[2]
KVD = os.environ.get("KVD_BIN") or os.environ.get("KVD_TEST_KVD_BIN") or str(REPO / "build/kvd")
BASE = ["--l1-size-gb", "0.25", "--eviction-policy", "LRU"]

# Values of free-text lmcache flags that lmcache documents in the help text.
KNOWN_VALUES = {"--hash-algorithm": ["builtin", "sha256_cbor", "blake3"],
                "--enable": ["transfer_query"],
                "--runtime-plugin-config": ["{}", '{"plugin.frontend.heartbeat_url": "http://x"}'],
                "--p2p-transfer-engine": ["nixl", "mooncake_te", "ucx"]}
# What kvd needs beside a flag given a non-empty value (P2P needs its directory and secret).
NEEDS = {"--p2p-advertise-url": ["--p2p-directory", "redis://127.0.0.1:6379",
                                 "--p2p-secret-file", "/dev/null"]}
JSON_SAMPLE = '{"type": "fs", "base_path": "/tmp/x"}'


def run_kvd(args: list[str], env: dict | None = None, timeout: float = 20) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    e.update(env or {})
    return subprocess.run([KVD, "server", *args], capture_output=True, text=True, timeout=timeout,
                          env=e)


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("lmcache_server_flags.py"))],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    flags = json.loads(out.stdout)
    assert len(flags) > 50, "lmcache's parser came back nearly empty"
    return flags


@pytest.fixture(scope="module")
def table() -> dict[str, dict]:
    out = run_kvd(["--list-flags", "json"])
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    return {r["name"]: r for r in rows}


def long_name(ref: dict) -> str:
    return next(o for o in ref["options"] if o.startswith("--") and not o.startswith("--no-"))


def expected_outcome(row: dict, value: str) -> str:
    """What kvd's table says happens to `value`: "ok", "accepted" or "refused"."""
    if row["support"] == "refused":
        return "refused"
    if row["serves"] is not None and value not in row["serves"]:
        if row["accepts"] is not None and value in row["accepts"]:
            return "accepted"
        return "refused"
    return "accepted" if row["support"] == "accepted" else "ok"


def cases(ref: dict) -> list[tuple[list[str], str]]:
    """(arguments, the value as kvd's table names it) to try for one reference flag."""
    name = long_name(ref)
    act = ref["action"]
    if act == "_HelpAction":
        return []
    if act == "BooleanOptionalAction":
        neg = next(o for o in ref["options"] if o.startswith("--no-"))
        return [([name], "true"), ([neg], "false")]
    if act in ("_StoreTrueAction",):
        return [([name], "true")]
    if act == "_AppendAction":
        return [([name, JSON_SAMPLE], JSON_SAMPLE)]
    if ref["nargs"] == "*":
        vals = ref["choices"] or KNOWN_VALUES.get(name) or ["x"]
        return [([name], "")] + [([name, v], v) for v in vals]
    if ref["choices"]:
        return [([name, str(c)], str(c)) for c in ref["choices"]]
    if name in KNOWN_VALUES:
        return [([name, v], v) for v in KNOWN_VALUES[name]]
    if name in ("--l1-size-gb",):
        return [([name, "0.5"], "0.5")]
    out = []
    d = ref["default"]
    if d not in (None, [], {}):
        out.append(([name, str(d)], str(d)))
    # Another valid value: half the default (stays inside kvd's ranges and cross-checks).
    if ref["type"] == "int":
        v = str(max(1, int(d) // 2)) if isinstance(d, (int, float)) and d else "7"
        out.append(([name, v], v))
    elif ref["type"] == "float":
        v = repr(float(d) / 2) if isinstance(d, (int, float)) and d else "7.5"
        out.append(([name, v], v))
    elif d == "" or name.endswith(("-url", "-dir", "-path", "-ip")):
        out.append(([name, ""], ""))
        out.append(([name, "/tmp/somewhere"], "/tmp/somewhere"))
    else:
        out.append(([name, "some-text"], "some-text"))
    return out


def test_every_reference_flag_is_in_kvds_table(reference, table):
    missing, mismatched = [], []
    for ref in reference:
        for opt in ref["options"]:
            if not opt.startswith("--"):
                continue
            name = opt
            if opt.startswith("--no-"):
                owner = [r for r in table.values() if r["negation"] == opt]
                if not owner:
                    missing.append(opt)
                continue
            row = table.get(name)
            if row is None:
                missing.append(opt)
                continue
            if row["origin"] != "lmcache":
                mismatched.append(f"{opt}: kvd's table marks it {row['origin']}")
            if row["group"] != ref["group"]:
                mismatched.append(f"{opt}: group {row['group']!r}, lmcache {ref['group']!r}")
            if row["hidden"] != ref["hidden"]:
                mismatched.append(f"{opt}: hidden={row['hidden']}, lmcache hidden={ref['hidden']}")
            kind = {"BooleanOptionalAction": "bool", "_StoreTrueAction": "switch",
                    "_AppendAction": "json-list", "_HelpAction": "help"}.get(ref["action"])
            if kind is None:
                kind = "list" if ref["nargs"] == "*" else (
                    "choice" if ref["choices"] else {"int": "int", "float": "float"}.get(
                        ref["type"], None))
            if kind is not None and row["kind"] != kind and not (
                    kind == "int" and row["kind"] == "float"):
                mismatched.append(f"{opt}: kind {row['kind']}, lmcache {kind}")
            # lmcache's choices, in its order; kvd may add its own after them (S3-FIFO).
            ref_choices = [str(c) for c in ref["choices"]] if ref["choices"] else []
            if ref_choices and row["kind"] == "choice" and row["choices"][:len(ref_choices)] != ref_choices:
                mismatched.append(f"{opt}: choices {row['choices']}, lmcache {ref['choices']}")
            shorts = [o for o in ref["options"] if not o.startswith("--")]
            if shorts and row["short"] not in shorts:
                mismatched.append(f"{opt}: short form {row['short']}, lmcache {shorts}")
    assert not missing, f"lmcache server flags that kvd's table does not list: {missing}"
    assert not mismatched, "\n".join(mismatched)
    ref_names = {o for r in reference for o in r["options"] if o.startswith("--")}
    extra = [n for n, r in table.items() if r["origin"] == "lmcache" and n not in ref_names]
    assert not extra, f"kvd's table lists lmcache flags that lmcache 0.5.6 does not have: {extra}"


def test_every_reference_flag_behaves_as_kvds_table_says(reference, table):
    jobs = []
    for ref in reference:
        row = table[long_name(ref)] if long_name(ref) in table else None
        for args, value in cases(ref):
            jobs.append((ref, row, args, value))
    assert len(jobs) > 100

    def check(job) -> str | None:
        ref, row, args, value = job
        want = expected_outcome(row, value)
        needs = NEEDS.get(args[0], []) if value else []
        out = run_kvd([*BASE, *args, *needs, "--check-config"])
        text = out.stdout + out.stderr
        label = " ".join(args)
        if want == "refused":
            lines = out.stderr.strip().splitlines()
            if out.returncode != 2 or len(lines) != 1 or not any(o in lines[0] for o in ref["options"]):
                return f"{label}: table says refused; got rc={out.returncode}: {text[-400:]}"
            if "not supported by kvd (" not in lines[0] or out.stdout.strip():
                return f"{label}: refusal must say why on its one line: {text[-400:]}"
            return None
        if out.returncode != 0:
            return f"{label}: table says {want}; got rc={out.returncode}: {text[-400:]}"
        ignored = [ln for ln in text.splitlines() if "accepted, no effect in kvd:" in ln]
        named = [ln for ln in ignored if re.search(r"no effect in kvd: " + re.escape(args[0]) + r"\b", ln)]
        if want == "accepted" and len(named) != 1:
            return f"{label}: accepted flags are listed once at startup; got {ignored}"
        if want == "ok" and named:
            return f"{label}: implemented, but listed as having no effect: {named}"
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = [e for e in pool.map(check, jobs) if e]
    assert not errors, "\n".join(errors)


def bad_values(ref: dict) -> list[str]:
    if ref["action"] == "_AppendAction" or long_name(ref) in ("--runtime-plugin-config",):
        return ["{not json", "[1, 2]"]
    if ref["choices"] and ref["nargs"] != "*":
        return ["no-such-choice"]
    if ref["type"] == "int":
        return ["twelve"]
    if ref["type"] == "float":
        return ["fast", "nan"]
    return []


def test_bad_values_name_flag_and_value_on_one_line(reference):
    jobs = [(long_name(r), v) for r in reference for v in bad_values(r)]
    jobs += [("--port", "70000"), ("--eviction-trigger-watermark", "1.5"), ("--l1-size-gb", "-1"),
             ("--http-port", "-5")]
    assert len(jobs) > 40

    def check(job) -> str | None:
        flag, value = job
        out = run_kvd([*BASE, f"{flag}={value}" if value.startswith("-") else flag, *(
            [] if value.startswith("-") else [value]), "--check-config"])
        lines = out.stderr.strip().splitlines()
        if out.returncode != 2 or len(lines) != 1 or flag not in lines[0] or value not in lines[0]:
            return f"{flag} {value!r}: rc={out.returncode} stderr={out.stderr!r}"
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        errors = [e for e in pool.map(check, jobs) if e]
    assert not errors, "\n".join(errors)




@pytest.mark.parametrize("bad", [["--chunk-size", "big"], ["--l2-adapter", "{oops"],
                                 ["--transport", "grpc"], ["--worker-reap-timeout-seconds", "5"]])
def test_a_bad_command_line_starts_nothing(bad):
    port, http_port = free_port(), free_port()
    shm = f"kvd_cli_test_{os.getpid()}_{port}"
    t0 = time.monotonic()
    out = run_kvd(["--host", "127.0.0.1", "--port", str(port), "--http-port", str(http_port),
                   "--shm-name", shm, *BASE, *bad])
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and bad[0] in out.stderr
    assert out.stdout == "", "nothing is logged when the command line is refused"
    assert time.monotonic() - t0 < 5
    assert not Path("/dev/shm", shm).exists()
    for p in (port, http_port):
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # still free: nothing listened on it


def test_unknown_flag_and_missing_required_flags():
    out = run_kvd([*BASE, "--no-such-flag", "1"])
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--no-such-flag" in out.stderr
    out = run_kvd(["--eviction-policy", "LRU"])
    assert out.returncode == 2 and "--l1-size-gb" in out.stderr
    out = run_kvd(["--l1-size-gb", "1"])
    assert out.returncode == 2 and "--eviction-policy" in out.stderr
    # argparse's unambiguous prefixes work as in lmcache; ambiguous ones are named.
    out = run_kvd([*BASE, "--chunk-si", "512", "--check-config"])
    assert out.returncode == 0 and "chunk_size=512" in out.stdout
    out = run_kvd([*BASE, "--l1-use", "--check-config"])
    assert out.returncode == 2 and "ambiguous" in out.stderr


def test_lmcache_log_level_and_the_flag_that_overrides_it():
    out = run_kvd([*BASE, "--check-config"], env={"LMCACHE_LOG_LEVEL": "DEBUG"})
    assert out.returncode == 0 and "log_level=debug (LMCACHE_LOG_LEVEL)" in out.stdout
    out = run_kvd([*BASE, "--check-config"], env={"LMCACHE_LOG_LEVEL": "warning"})
    assert out.returncode == 0
    assert "configuration OK" not in out.stdout, "info lines are hidden at WARNING"
    out = run_kvd([*BASE, "--log-level", "info", "--check-config"], env={"LMCACHE_LOG_LEVEL": "ERROR"})
    assert out.returncode == 0 and "log_level=info (--log-level)" in out.stdout
    out = run_kvd([*BASE, "--check-config"], env={"LMCACHE_LOG_LEVEL": "loud"})
    assert out.returncode == 2 and "LMCACHE_LOG_LEVEL loud" in out.stderr
    out = run_kvd([*BASE, "--check-config"], env={"LMCACHE_COORDINATOR_URL": "http://coord:9300"})
    assert out.returncode == 2 and "LMCACHE_COORDINATOR_URL" in out.stderr


def test_help_groups_flags_as_lmcache_does(reference):
    out = run_kvd(["--help"])
    assert out.returncode == 0
    sections: dict[str, str] = {}
    current = None
    for line in out.stdout.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = ""
        elif current:
            sections[current] += line + "\n"
    for ref in reference:
        if ref["hidden"]:
            for o in ref["options"]:
                assert o not in out.stdout, f"{o} is hidden in lmcache's --help"
            continue
        name = long_name(ref)
        assert ref["group"] in sections, f"group {ref['group']!r} missing from kvd server --help"
        assert re.search(r"(^|\s)" + re.escape(name) + r"\b", sections[ref["group"]]), \
            f"{name} not under {ref['group']!r}"


def test_startup_summary_is_grouped_and_lists_ignored_flags_once():
    out = run_kvd([*BASE, "--prometheus-port", "9090", "--instance-id", "x", "--prometheus-port",
                   "9091", "--check-config"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("] MP Server: host=localhost port=5555" in ln for ln in lines)
    assert any("] Eviction Policy: eviction_policy=LRU" in ln for ln in lines)
    ignored = [ln for ln in lines if "accepted, no effect in kvd: --prometheus-port" in ln]
    assert len(ignored) == 1 and "9091" in ignored[0] and "[info]" in ignored[0]


def test_docs_cli_md_shows_the_table():
    out = run_kvd(["--list-flags", "markdown"])
    assert out.returncode == 0
    doc = (REPO / "docs/cli.md").read_text()
    begin, end = "<!-- flags table: begin -->\n", "<!-- flags table: end -->"
    assert begin in doc and end in doc
    shown = doc.split(begin, 1)[1].split(end, 1)[0]
    assert shown == out.stdout, ("docs/cli.md is out of date: replace the table between the "
                                 "markers with `build/kvd server --list-flags markdown`")
