"""The blend plan of one request and the choice of the rows it recomputes. Pure: torch only.

A request's forward computes prompt positions [start, end) as rows [row0, row0 + end - start)
of the batch. Some of those positions lie in reused segments: their KV was scattered into the
paged cache by the server (re-rotated to these positions) before the forward. A segment may be
exact (a segmented-prefix chunk: same position, same tokens before it): its rows are reused
and never recomputed. Every layer before the check layer runs on all rows. At the check layer
the rows that go on are:

    - every row no segment covers (the question, gaps between documents, partial tails),
    - the last row of the request (its hidden state gives the next token),
    - of the reused rows: the top `ratio` by deviation (hkvd: K's; kv: K's and V's, each over
      its mean, `kv_score`), the first k rows of each segment (boundary), both, or a seeded
      random `ratio` (random, a control),

and from there on only those rows run; the other rows keep the reused KV in every later
layer. Policy grad (the paper's gradual filter) keeps twice the ratio at the check layer and
filters again at the next: `choose_rows(..., ratio, among)` keeps the top `ratio` of all the
reused rows among the rows `among` that are still computed. `choose_rows` returns the rows
sorted; `runs` cuts a sorted row list into runs of consecutive rows (each run attends causally
to every position up to its last one, which is how the engine's attention kernels see a chunk
of a prefill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kvd_blend.config import BlendConfig


@dataclass(frozen=True)
class Segment:
    """One reused chunk: stored at [old_st, old_ed), reused at [cur_st, cur_ed); `hash` is the
    storage key the server's lookup gave (sent back unchanged with the retrieve).

    `exact`: a segmented-prefix chunk (the server's `segmented_prefix_segments`, with
    --enable-segmented-prefix): the chunk after a gap in the prompt's cached prefix, at its own
    position, whose KV was computed after the same tokens as here. Its KV is the full
    prefill's, so none of its rows is recomputed; the rows of the gap are."""

    old_st: int
    old_ed: int
    cur_st: int
    cur_ed: int
    hash: bytes
    exact: bool = False

    @property
    def num_tokens(self) -> int:
        return self.cur_ed - self.cur_st


@dataclass
class BlendRequestPlan:
    """What the scheduler hands the workers for one request in one step (picklable)."""

    req_id: str
    token_ids: list[int]          # the prompt, as the lookup saw it
    lookup_end: int               # the lookup key's end (chunk-aligned)
    start: int                    # first position this step computes (vLLM's num_computed_tokens)
    end: int                      # one past the last position this step computes (prompt length)
    segments: list[Segment]
    block_ids: list[list[int]]    # per KV cache group, the request's blocks from position 0
    cache_salt: str = ""
    request_configs: dict[str, Any] | None = None


def segments_from_reply(reply: Any) -> list[Segment]:
    """The segments of a `cb_unified_lookup` reply: its non-prefix matches, then its
    segmented-prefix chunks (exact; absent from servers that do not send them). Raises on a
    malformed reply."""
    out = [Segment(int(m.old_st), int(m.old_ed), int(m.cur_st), int(m.cur_ed), bytes(m.hash))
           for m in reply.non_prefix_segments]
    for m in getattr(reply, "segmented_prefix_segments", None) or []:
        if int(m.old_st) != int(m.cur_st) or int(m.old_ed) != int(m.cur_ed):
            raise ValueError(f"segmented-prefix chunk moved: [{m.old_st}, {m.old_ed}) -> "
                             f"[{m.cur_st}, {m.cur_ed})")
        out.append(Segment(int(m.old_st), int(m.old_ed), int(m.cur_st), int(m.cur_ed),
                           bytes(m.hash), exact=True))
    return out


def usable_segments(segments: list[Segment], start: int, end: int) -> list[Segment]:
    """The segments wholly inside [start, end), in position order, none overlapping (the
    server's are non-overlapping already; a later one that overlaps an earlier is dropped)."""
    out: list[Segment] = []
    last_end = start
    for s in sorted(segments, key=lambda s: (s.cur_st, s.cur_ed)):
        if s.cur_st < last_end or s.cur_ed > end or s.cur_ed <= s.cur_st:
            continue
        if s.old_ed - s.old_st != s.cur_ed - s.cur_st:
            continue
        out.append(s)
        last_end = s.cur_ed
    return out


def reused_mask(plan: BlendRequestPlan) -> torch.Tensor:
    """bool [end - start]: True where the position's KV is reused."""
    m = torch.zeros(plan.end - plan.start, dtype=torch.bool)
    for s in plan.segments:
        m[s.cur_st - plan.start:s.cur_ed - plan.start] = True
    return m


def exact_mask(plan: BlendRequestPlan) -> torch.Tensor:
    """bool [end - start]: True where the position's KV is reused and exact (Segment.exact)."""
    m = torch.zeros(plan.end - plan.start, dtype=torch.bool)
    for s in plan.segments:
        if s.exact:
            m[s.cur_st - plan.start:s.cur_ed - plan.start] = True
    return m


def choose_rows(plan: BlendRequestPlan, deviation: torch.Tensor, cfg: BlendConfig,
                ratio: float | None = None, among: torch.Tensor | None = None) -> torch.Tensor:
    """Which of the request's rows (0-based within the request) run after the check layer.

    `deviation`: float [end - start], the per-row deviation of fresh against reused KV at the
    check layer (`k_deviation`, or `kv_score` for policy kv; only reused rows' entries are
    read). Ties in hkvd go to the earlier row.
    Exact segments' rows are never chosen and do not count toward the ratio.
    `ratio`: instead of cfg.recompute_ratio. `among` (bool [end - start], hkvd only): the
    quota stays `ratio` of every counted reused row, but only rows marked here are chosen
    (grad's second filter, among the rows the first kept).
    Returns the sorted int64 row indices.
    """
    n = plan.end - plan.start
    ratio = cfg.recompute_ratio if ratio is None else ratio
    reused = reused_mask(plan)
    keep = ~reused
    keep[n - 1] = True
    counted = reused & ~exact_mask(plan)
    n_reused = int(counted.sum())
    quota = min(n_reused, math.ceil(ratio * n_reused - 1e-9)) if n_reused else 0
    policy = cfg.policy
    if among is not None:
        if not policy.ranks_by_deviation or policy.boundary_k:
            raise ValueError("choose_rows among earlier choices: hkvd only")
        counted = counted & among
    reused_idx = torch.nonzero(counted, as_tuple=False).flatten()
    quota = min(quota, int(reused_idx.numel()))
    if policy.random:
        if quota:
            g = torch.Generator().manual_seed(policy.seed)
            pick = torch.randperm(n_reused, generator=g)[:quota]
            keep[reused_idx[pick]] = True
    else:
        if policy.ranks_by_deviation and quota:
            d = deviation.detach().to(torch.float64).flatten()[reused_idx]
            # Stable descending order: equal deviations keep their row order.
            order = torch.sort(-d, stable=True).indices[:quota]
            keep[reused_idx[order]] = True
        if policy.boundary_k:
            for s in plan.segments:
                if s.exact:
                    continue
                a = s.cur_st - plan.start
                keep[a:min(a + policy.boundary_k, s.cur_ed - plan.start)] = True
    return torch.nonzero(keep, as_tuple=False).flatten()


def runs(rows: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct rows -> [(first, last_plus_one)] of consecutive rows."""
    out: list[tuple[int, int]] = []
    for r in rows:
        if out and out[-1][1] == r:
            out[-1] = (out[-1][0], r + 1)
        else:
            out.append((r, r + 1))
    return out


def k_deviation(fresh_k: torch.Tensor, reused_k: torch.Tensor) -> torch.Tensor:
    """Per-row squared L2 distance of fresh and reused K ([rows, ...] each), in float32."""
    d = fresh_k.float().reshape(fresh_k.shape[0], -1) - reused_k.float().reshape(reused_k.shape[0], -1)
    return (d * d).sum(dim=1)


def kv_score(dk: torch.Tensor, dv: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
    """Policy kv's per-row deviation: the K deviation over its mean plus the V deviation over
    its mean, the means taken over the `counted` rows (bool, the reused rows the ratio counts),
    so that neither of K and V outweighs the other by its scale. dk, dv: float [rows], each a
    `k_deviation` (summed over every tensor-parallel rank first: a mean of per-rank sums is not
    the model's). Rows outside `counted` score 0."""
    dk, dv = dk.to(torch.float64), dv.to(torch.float64)
    out = torch.zeros_like(dk)
    if bool(counted.any()):
        mk = dk[counted].mean().clamp_min(1e-30)
        mv = dv[counted].mean().clamp_min(1e-30)
        out[counted] = dk[counted] / mk + dv[counted] / mv
    return out
