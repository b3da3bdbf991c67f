"""The offline reference's decoding (blend_reference.py, `RefLlama.greedy_many`) against the
plainest form of greedy decoding: one full prefill of the prompt and the tokens so far per
new token. Runs on the session's random-weight model (GQA: 4 query heads over 2 KV heads), in
seconds; no vLLM and no kvd.

greedy_many is what the quality bench (bench/blend_quality.py) and the vLLM blend tests
compare against, and it decodes several caches at once from buffers filled in place, so a
slip in its batching, its positions or its head grouping would make both wrong.
"""

from __future__ import annotations

import random

import pytest
import torch

from blend_reference import RefLlama

N_NEW = 6


@pytest.fixture(scope="module")
def ref(model_dir) -> RefLlama:
    torch.set_grad_enabled(False)
    return RefLlama(model_dir)


def _plain_greedy(ref: RefLlama, tokens: list[int], n_new: int) -> list[int]:
    out: list[int] = []
    for _ in range(n_new):
        _, _, logits = ref.prefill(tokens + out)
        out.append(int(logits.argmax()))
    return out


def test_greedy_many_equals_one_prefill_per_token(ref, model_spec):
    assert ref.heads // ref.kv_heads > 1, "the model must group query heads for this test"
    rng = random.Random(7)
    prompts = [[rng.randrange(model_spec.vocab) for _ in range(40)] for _ in range(3)]
    prefilled = [ref.prefill(p) for p in prompts]
    got = ref.greedy_many([c for c, _, _ in prefilled], [lg for _, _, lg in prefilled], N_NEW)
    expected = [_plain_greedy(ref, p, N_NEW) for p in prompts]
    assert got == expected
    # The three prompts decode differently: a batch that mixed up its rows would show.
    assert len({tuple(e) for e in expected}) == 3
    # greedy() is greedy_many of one.
    assert ref.greedy(prefilled[1][0], prefilled[1][2], N_NEW) == expected[1]


def test_greedy_many_decodes_a_blended_cache_like_its_prefill(ref, model_spec):
    """A blend at ratio 1.0 recomputes every row, so its cache decodes to full prefill's tokens."""
    rng = random.Random(11)
    doc = [rng.randrange(model_spec.vocab) for _ in range(24)]
    head = [rng.randrange(model_spec.vocab) for _ in range(8)]
    stored, k_pre, _ = ref.prefill(head + doc)
    prompt = [rng.randrange(model_spec.vocab) for _ in range(5)] + doc + [rng.randrange(model_spec.vocab)]
    at = 5
    reused = {at + j: [(k_pre[l][len(head) + j], stored[l].v[len(head) + j]) for l in range(ref.layers)]
              for j in range(len(doc))}
    full = ref.blend(prompt, 0, reused, 1, 1.0)
    reuse = ref.blend(prompt, 0, reused, 1, 0.0)
    assert ref.greedy(full.cache, full.logits, N_NEW) == _plain_greedy(ref, prompt, N_NEW)
    # ... and full reuse really is a different cache (the check above can tell).
    assert not torch.allclose(reuse.cache[-1].v, full.cache[-1].v)


def test_question_attention_is_the_questions_softmax_mass_per_reused_row(ref):
    """The quality bench's `attn` exploration ranks reused rows by this score: per reused
    position, the softmax weight the rows after the last reused one give it, summed over
    those rows and every query head (head h reads KV head h // (heads / kv_heads))."""
    g = torch.Generator().manual_seed(3)
    n, d = 12, ref.head_dim
    q = torch.randn(n, ref.heads, d, generator=g, dtype=ref.dtype)
    k = torch.randn(n, ref.kv_heads, d, generator=g, dtype=ref.dtype)
    reused_pos = [2, 3, 4, 5, 7, 8]
    got = ref._question_attention(q, k, reused_pos)
    rep = ref.heads // ref.kv_heads
    expected = {p: 0.0 for p in reused_pos}
    for i in range(9, n):  # the rows after position 8
        for h in range(ref.heads):
            w = torch.softmax(torch.stack([q[i, h] @ k[j, h // rep] for j in range(i + 1)]) / d ** 0.5, 0)
            for p in reused_pos:
                expected[p] += float(w[p])
    assert got.keys() == expected.keys()
    for p in reused_pos:
        assert abs(got[p] - expected[p]) < 1e-9, p
    # The ranking the policy uses: rows by score, highest first, ties to the earlier row.
    chosen = ref._choose(reused_pos, got, 0.5, "attn", None)
    assert chosen == set(sorted(reused_pos, key=lambda p: (-expected[p], p))[:3])


def test_kv_deviation_weighs_k_and_v_each_over_its_mean(ref):
    """The quality bench's `kv` exploration ranks reused rows by K deviation over its mean plus
    V deviation over its mean; a row that deviates only in V ranks high in it and low by K."""
    g = torch.Generator().manual_seed(5)
    rows, heads, d = 6, ref.kv_heads, ref.head_dim
    k, kr, v, vr = (torch.randn(rows, heads, d, generator=g, dtype=ref.dtype) for _ in range(4))
    vr[4] = v[4] + 50.0   # row 4: a large V deviation
    kr[4] = k[4]          # and no K deviation
    reused_pos = [10, 11, 12, 13, 14, 15]
    got = ref._kv_deviation(k, kr, v, vr, reused_pos)
    dk = [float(((k[i] - kr[i]) ** 2).sum()) for i in range(rows)]
    dv = [float(((v[i] - vr[i]) ** 2).sum()) for i in range(rows)]
    for i, p in enumerate(reused_pos):
        expected = dk[i] / (sum(dk) / rows) + dv[i] / (sum(dv) / rows)
        assert abs(got[p] - expected) < 1e-6 * max(1.0, expected), p
    assert 14 in ref._choose(reused_pos, got, 1 / 6, "kv", None)
    assert 14 not in ref._choose(reused_pos, {p: dk[i] for i, p in enumerate(reused_pos)}, 0.5, "hkvd", None)


def _doc_in_new_place(ref: RefLlama, model_spec, seed: int):
    """A 24-token document stored behind an 8-token head, reused at position 5 of a prompt
    (the positions move, the context before it changes): (prompt, reused)."""
    rng = random.Random(seed)
    doc = [rng.randrange(model_spec.vocab) for _ in range(24)]
    head = [rng.randrange(model_spec.vocab) for _ in range(8)]
    stored, k_pre, _ = ref.prefill(head + doc)
    prompt = [rng.randrange(model_spec.vocab) for _ in range(5)] + doc + [rng.randrange(model_spec.vocab)]
    reused = {5 + j: [(k_pre[l][len(head) + j], stored[l].v[len(head) + j]) for l in range(ref.layers)]
              for j in range(len(doc))}
    return prompt, reused


def test_grad_at_half_is_hkvd_checked_one_layer_later(ref, model_spec):
    """The bench's `grad` exploration (the paper's gradual filter) keeps 2r of the reused rows
    at the check layer and r of those by the next layer's K deviation. At r = 0.5 the first
    filter keeps every row, so the next layer's input is full prefill's and grad must equal
    HKVD at 0.5 with the check one layer later: the same rows, the same cache and logits."""
    prompt, reused = _doc_in_new_place(ref, model_spec, 13)
    grad = ref.blend(prompt, 0, reused, 0, 0.5, "grad")
    later = ref.blend(prompt, 0, reused, 1, 0.5, "hkvd")
    assert grad.kept == later.kept
    assert torch.allclose(grad.logits, later.logits)
    assert all(torch.equal(a.v, b.v) for a, b in zip(grad.cache, later.cache))
    # At a smaller ratio it keeps ceil(r * n) reused rows, a subset of what the first filter kept.
    grad = ref.blend(prompt, 0, reused, 0, 0.25, "grad")
    wide = ref.blend(prompt, 0, reused, 0, 0.5, "hkvd")
    kept_reused = [p for p in grad.kept if p in reused]
    assert len(kept_reused) == 6 and set(kept_reused) <= set(wide.kept)


def test_error_score_is_each_rows_kv_error_over_every_layer(ref, model_spec):
    """The bench's oracle bound ranks reused rows by error_score: per row, the sum over layers
    of its squared K error against full prefill (K rotated to its new position) over the mean
    squared K norm of that layer, plus the same of V. A row whose reused KV is full prefill's
    scores 0."""
    prompt, reused = _doc_in_new_place(ref, model_spec, 17)
    full, k_pre, _ = ref.prefill(prompt)
    exact = 9
    reused[exact] = [(k_pre[l][exact], full[l].v[exact]) for l in range(ref.layers)]
    pos = sorted(reused)
    got = ref.error_score(full, reused, pos)
    per_layer = []
    for l in range(ref.layers):
        dk = [float(((full[l].k[p] - ref.rope(reused[p][l][0][None], torch.tensor([p]))[0]) ** 2).sum())
              for p in pos]
        dv = [float(((full[l].v[p] - reused[p][l][1]) ** 2).sum()) for p in pos]
        nk = sum(float((full[l].k[p] ** 2).sum()) for p in pos) / len(pos)
        nv = sum(float((full[l].v[p] ** 2).sum()) for p in pos) / len(pos)
        per_layer.append((dk, nk, dv, nv))
    for i, p in enumerate(pos):
        expected = sum(dk[i] / nk + dv[i] / nv for dk, nk, dv, nv in per_layer)
        assert abs(got[p] - expected) < 1e-6 * max(1.0, expected), p
    assert got[exact] < 1e-9 * max(got.values())
    assert exact not in ref._choose(pos, got, 0.5, "oracle", None)
