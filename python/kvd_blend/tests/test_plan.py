"""Unit tests of kvd_blend's pure pieces: config parsing, segment filtering, row choice, runs."""

from __future__ import annotations

import pytest
import torch

from kvd_blend.config import BlendConfig, Policy
from types import SimpleNamespace

from kvd_blend.plan import (BlendRequestPlan, Segment, choose_rows, exact_mask, k_deviation,
                            kv_score, reused_mask, runs, segments_from_reply, usable_segments)


def seg(cur_st: int, n: int, old_st: int = 0) -> Segment:
    return Segment(old_st, old_st + n, cur_st, cur_st + n, b"h%d" % cur_st)


def plan(start: int, end: int, segments: list[Segment]) -> BlendRequestPlan:
    return BlendRequestPlan(req_id="r", token_ids=list(range(end)), lookup_end=end // 256 * 256,
                            start=start, end=end, segments=segments, block_ids=[[0]])


# --- config ---------------------------------------------------------------------------------

def test_config_defaults_are_the_issue_s():
    c = BlendConfig.from_extra_config({})
    assert (c.enable, c.check_layer, c.recompute_ratio, str(c.policy), c.min_reused_tokens) == (
        False, 1, 0.15, "hkvd", 256)


def test_config_reads_kvd_keys_and_lmcache_spellings():
    c = BlendConfig.from_extra_config({"kvd.blend.enable": "true", "cb.check_layer": 3,
                                       "cb.recomp_ratio": 0.3})
    assert (c.enable, c.check_layer, c.recompute_ratio) == (True, 3, 0.3)
    # The kvd.blend key wins over lmcache's.
    c = BlendConfig.from_extra_config({"cb.recomp_ratio": 0.3, "kvd.blend.recompute_ratio": 0.05})
    assert c.recompute_ratio == 0.05


@pytest.mark.parametrize("policy,want,ranks", [
    ("hkvd", Policy("hkvd"), True), ("boundary:4", Policy("boundary", boundary_k=4), False),
    ("hkvd+boundary", Policy("hkvd+boundary", boundary_k=8), True),
    ("hkvd+boundary:2", Policy("hkvd+boundary", boundary_k=2), True),
    ("random", Policy("random"), False), ("random:7", Policy("random", seed=7), False),
    (" KV ", Policy("kv"), True), ("grad", Policy("grad"), True)])
def test_config_policies(policy, want, ranks):
    c = BlendConfig.from_extra_config({"kvd.blend.policy": policy})
    assert c.policy == want
    assert c.policy.ranks_by_deviation == ranks
    assert (c.policy.with_v, c.policy.gradual, c.policy.random) == (
        want.name == "kv", want.name == "grad", want.name == "random")
    assert BlendConfig.from_extra_config({"kvd.blend.policy": str(c.policy)}) == c


@pytest.mark.parametrize("fields,needle", [
    ({"name": "topk"}, "unknown blend policy"),
    ({"name": "boundary"}, "boundary_k 0"),
    ({"name": "hkvd", "boundary_k": 3}, "boundary_k 3"),
    ({"name": "kv", "seed": 2}, "random only"),
    ({"name": "random", "seed": -1}, "seed -1"),
])
def test_policy_refuses_combinations_that_are_no_policy(fields, needle):
    with pytest.raises(ValueError) as e:
        Policy(**fields)
    assert needle in str(e.value)


@pytest.mark.parametrize("extra,needle", [
    ({"kvd.blend.recompute_ratio": 1.5}, "within [0, 1]"),
    ({"kvd.blend.recompute_ratio": "x"}, "must be a number"),
    ({"kvd.blend.check_layer": -1}, ">= 0"),
    ({"kvd.blend.check_layer": 1.5}, "integer"),
    ({"kvd.blend.enable": "maybe"}, "boolean"),
    ({"kvd.blend.policy": "topk"}, "must be one of"),
    ({"kvd.blend.policy": "boundary:0"}, ">= 1"),
    ({"kvd.blend.policy": "kv:1"}, "must be one of"),
    ({"kvd.blend.ratio": 0.1}, "unknown kv_connector_extra_config keys: kvd.blend.ratio"),
    ({"kvd.blend.retrieve_timeout_s": 0}, "> 0"),
])
def test_config_refuses_bad_values_by_name(extra, needle):
    with pytest.raises(ValueError, match=None) as e:
        BlendConfig.from_extra_config(extra)
    assert needle in str(e.value)
    assert next(iter(extra)) in str(e.value)


# --- segments -------------------------------------------------------------------------------

def test_usable_segments_drop_what_is_before_start_past_end_or_overlapping():
    segs = [seg(512, 256), seg(256, 256), seg(700, 256), seg(1024, 256), seg(1300, 256)]
    got = usable_segments(segs, start=300, end=1400)
    # 256 starts before the computed range; 700 overlaps 512's; 1300 ends past the prompt.
    assert [(s.cur_st, s.cur_ed) for s in got] == [(512, 768), (1024, 1280)]


def test_usable_segments_drop_length_mismatches():
    bad = Segment(0, 100, 512, 768, b"x")
    assert usable_segments([bad], 0, 1000) == []


# --- row choice -----------------------------------------------------------------------------

def test_ratio_one_keeps_every_row_and_ratio_zero_only_the_uncovered_and_last():
    p = plan(256, 1000, [seg(512, 256), seg(768, 128)])
    dev = torch.rand(p.end - p.start)
    assert choose_rows(p, dev, BlendConfig(recompute_ratio=1.0)).tolist() == list(range(744))
    kept = choose_rows(p, dev, BlendConfig(recompute_ratio=0.0)).tolist()
    # Uncovered: [256, 512) -> rows 0..255, [896, 1000) -> rows 640..743 (the last included).
    assert kept == list(range(256)) + list(range(640, 744))


def test_hkvd_keeps_the_top_ratio_of_reused_rows_by_deviation_ties_to_the_earlier_row():
    p = plan(0, 300, [seg(0, 256)])
    dev = torch.zeros(300)
    dev[[10, 20, 30]] = torch.tensor([5.0, 9.0, 7.0])
    dev[250:256] = 1.0  # ties among 250..255
    cfg = BlendConfig(recompute_ratio=7 / 256)  # ceil(7) = 7 rows of 256
    kept = set(choose_rows(p, dev, cfg).tolist())
    assert {10, 20, 30, 250, 251, 252, 253} <= kept
    assert not kept & {254, 255}
    assert set(range(256, 300)) <= kept          # uncovered tail
    assert len(kept) == 7 + 44


def test_boundary_keeps_the_first_k_rows_of_each_segment():
    p = plan(0, 600, [seg(0, 256), seg(300, 256)])
    cfg = BlendConfig(recompute_ratio=0.0, policy=Policy("boundary", boundary_k=3))
    kept = choose_rows(p, torch.zeros(600), cfg).tolist()
    assert kept[:3] == [0, 1, 2]
    assert {300, 301, 302} <= set(kept) and 303 not in kept and 3 not in kept


def test_random_is_seeded_and_takes_the_same_quota():
    p = plan(0, 512, [seg(0, 512)])
    cfg = BlendConfig(recompute_ratio=0.15, policy=Policy("random", seed=3))
    a = choose_rows(p, torch.zeros(512), cfg)
    b = choose_rows(p, torch.rand(512), cfg)
    assert torch.equal(a, b)
    assert a.numel() in (77, 78)  # ceil(0.15 * 512) = 77 reused rows, plus the last row unless drawn
    other = choose_rows(p, torch.zeros(512), BlendConfig(recompute_ratio=0.15, policy=Policy("random", seed=4)))
    assert not torch.equal(a, other)


def exact(cur_st: int, n: int) -> Segment:
    return Segment(cur_st, cur_st + n, cur_st, cur_st + n, b"e%d" % cur_st, exact=True)


def test_exact_segments_are_reused_never_chosen_and_outside_the_ratio():
    # [0, 256) moved (non-prefix), [512, 768) exact (segmented prefix); [256, 512) is the gap.
    p = plan(0, 800, [seg(0, 256, old_st=1024), exact(512, 256)])
    dev = torch.zeros(800)
    dev[512:768] = 100.0  # an exact row's deviation never makes it recomputed
    dev[5] = 1.0
    kept = set(choose_rows(p, dev, BlendConfig(recompute_ratio=1 / 256)).tolist())
    assert kept == {5} | set(range(256, 512)) | set(range(768, 800))  # quota ceil(1) of 256
    kept = set(choose_rows(p, dev, BlendConfig(recompute_ratio=1.0)).tolist())
    assert kept == set(range(512)) | set(range(768, 800)), "ratio 1: every moved row, no exact one"
    b = choose_rows(p, dev, BlendConfig(recompute_ratio=0.0, policy=Policy("boundary", boundary_k=2))).tolist()
    assert 0 in b and 1 in b and 512 not in b and 513 not in b
    r = choose_rows(p, dev, BlendConfig(recompute_ratio=1.0, policy=Policy("random", seed=1))).tolist()
    assert not set(r) & set(range(512, 768))
    assert exact_mask(p).sum().item() == 256 and reused_mask(p).sum().item() == 512


def _match(old_st: int, cur_st: int, n: int = 256) -> SimpleNamespace:
    return SimpleNamespace(old_st=old_st, old_ed=old_st + n, cur_st=cur_st, cur_ed=cur_st + n,
                           hash=b"k" * 32)


def test_segments_from_reply_marks_the_segmented_prefix_exact():
    reply = SimpleNamespace(non_prefix_segments=[_match(256, 1024)],
                            segmented_prefix_segments=[_match(512, 512)])
    got = segments_from_reply(reply)
    assert [(s.old_st, s.cur_st, s.exact) for s in got] == [(256, 1024, False), (512, 512, True)]
    # lmcache's own server (0.5.6) may send none.
    assert len(segments_from_reply(SimpleNamespace(non_prefix_segments=[_match(0, 256)]))) == 1
    with pytest.raises(ValueError, match="moved"):
        segments_from_reply(SimpleNamespace(non_prefix_segments=[],
                                            segmented_prefix_segments=[_match(512, 768)]))


def test_reused_mask_marks_segment_positions_relative_to_start():
    p = plan(100, 400, [seg(150, 50)])
    m = reused_mask(p)
    assert m.sum().item() == 50 and m[50] and m[99] and not m[49] and not m[100]


def test_runs_cut_sorted_rows_into_consecutive_runs():
    assert runs([]) == []
    assert runs([0, 1, 2, 5, 7, 8]) == [(0, 3), (5, 6), (7, 9)]


def test_k_deviation_is_per_row_squared_distance():
    a = torch.tensor([[[1.0, 2.0]], [[0.0, 0.0]]])
    b = torch.tensor([[[1.0, 0.0]], [[3.0, 4.0]]])
    assert k_deviation(a, b).tolist() == [4.0, 25.0]


def test_k_deviation_sums_over_heads_so_tensor_parallel_ranks_can_add_theirs():
    # Two ranks holding one head each: the sum of their per-row deviations is the deviation
    # over both heads (what model.py's all-reduce relies on to keep the same rows everywhere).
    g = torch.Generator().manual_seed(3)
    fresh, reused = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
    whole = k_deviation(fresh, reused)
    parts = k_deviation(fresh[:, :1], reused[:, :1]) + k_deviation(fresh[:, 1:], reused[:, 1:])
    assert torch.allclose(whole, parts)


def test_kv_score_adds_k_and_v_deviations_each_over_its_mean_over_the_counted_rows():
    dk = torch.tensor([1.0, 3.0, 100.0, 2.0])
    dv = torch.tensor([40.0, 0.0, 7.0, 20.0])
    counted = torch.tensor([True, True, False, True])  # row 2: exact or not reused
    got = kv_score(dk, dv, counted)
    mk, mv = (1 + 3 + 2) / 3, (40 + 0 + 20) / 3
    assert torch.allclose(got, torch.tensor([1 / mk + 40 / mv, 3 / mk, 0.0, 2 / mk + 20 / mv],
                                            dtype=torch.float64))
    # The row that deviates most in V ranks first by kv, another by K alone.
    p = plan(0, 4, [seg(0, 3)])   # rows 0-2 reused, row 3 (the last) computed
    dk, dv = torch.tensor([1.0, 3.0, 2.0, 0.0]), torch.tensor([40.0, 0.0, 20.0, 0.0])
    score = kv_score(dk, dv, reused_mask(p))   # 2.5, 1.5, 2.0
    cfg = BlendConfig(recompute_ratio=1 / 3)
    assert choose_rows(p, score, cfg).tolist() == [0, 3]         # kv: row 0, plus the last row
    assert choose_rows(p, dk, cfg).tolist() == [1, 3]            # K alone: row 1
    # Nothing counted: every score 0, no division by zero.
    assert kv_score(dk, dv, torch.zeros(4, dtype=torch.bool)).tolist() == [0.0] * 4


def test_grad_keeps_twice_the_ratio_first_then_the_ratio_among_those():
    c = BlendConfig.from_extra_config({"kvd.blend.policy": "grad", "kvd.blend.recompute_ratio": 0.15})
    assert (c.first_ratio, BlendConfig(recompute_ratio=0.15).first_ratio) == (0.3, 0.15)
    assert BlendConfig(recompute_ratio=0.6, policy=Policy("grad")).first_ratio == 1.0
    p = plan(0, 12, [seg(0, 10)])             # rows 0-9 reused, 10-11 computed
    first = torch.tensor([9.0, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0])
    wide = choose_rows(p, first, c, ratio=c.first_ratio)
    assert wide.tolist() == [0, 1, 2, 10, 11]  # ceil(0.3 * 10) = 3 reused rows
    among = torch.zeros(12, dtype=torch.bool)
    among[wide] = True
    # The next layer's deviations rank differently; rows outside `among` never come back, and
    # the quota is 0.15 of all 10 reused rows (2), not of the 3 still computed.
    second = torch.tensor([1.0, 5, 3, 0, 0, 0, 0, 0, 0, 99, 0, 0])
    assert choose_rows(p, second, c, among=among).tolist() == [1, 2, 10, 11]
    with pytest.raises(ValueError, match="hkvd only"):
        choose_rows(p, second, BlendConfig(policy=Policy("boundary", boundary_k=2)), among=among)
