"""Blend-aware model classes: vLLM's Llama, Qwen2 and Qwen3 with CacheBlend's forward.

A step with no blend plan (no KvdBlendConnector, blend off, nothing reused) runs the parent's
forward unchanged. A step with plans (kvd_blend.connector) runs `BlendForward`:

    1. each plan is matched to its rows in the batch (positions, token ids and block table
       must all agree, else that request is not blended) and its non-prefix segments are
       retrieved: the server scatters the reused KV, re-rotated to the new positions, into
       every layer's paged cache (before layer 0, so that no fresh KV has overwritten it yet);
    2. layers before the check layer run on every row (their fresh KV replaces the reused);
    3. in the check layer's attention (the module vLLM calls with post-RoPE q, k, v), the
       deviation of each reused row's fresh K from the reused K still in the cache is
       measured (and of V, for policy kv), and `plan.choose_rows` picks the rows that go on;
       only those rows' K/V are written and attend (to every position of their request,
       causally, through vLLM's own CPU attention kernel: a run of consecutive rows is one
       query chunk);
    4. later layers run on the kept rows only; the other rows keep the reused KV (policy
       grad: the check layer keeps twice the share, and the next layer's attention filters
       those again by its own K deviation, the same way);
    5. the final hidden states are scattered back to a full-size tensor (vLLM picks each
       request's last row, which is always kept).

Any exception, or a condition it does not handle (another attention backend or cache
layout, pipeline parallelism, padding, sliding windows, several KV cache groups), falls back
to the parent's forward before anything was written, or, after, to the parent's forward over
every row, which rewrites every computed row's KV: an exact full prefill either way. Logged
with "kvd_blend: fallback" and counted.

Tensor parallelism: every rank runs the same steps on its own heads, so the ranks agree
twice, with an all-reduce over the tensor-parallel group: after the retrieves (a request any
rank could not retrieve is blended by none: reason "peer_rank" on the others) and in the check
layer, before any rank writes a kept row (a failure on one rank makes every rank fall back;
the per-row deviations, sums over each rank's heads, are summed over the ranks so that every
rank keeps the same rows). A failure inside vLLM's own layers is not covered.

Threads: the worker's execution thread only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

import torch

from kvd_blend import cpu_layout
from kvd_blend.plan import (BlendRequestPlan, choose_rows, exact_mask, k_deviation, kv_score,
                            reused_mask, runs)

logger = logging.getLogger("vllm.kvd_blend")  # under vLLM's logger: its handlers and level

# Observability and fault injection for tests (read once, when vLLM imports the model):
#   KVD_BLEND_TRACE=<file>   one JSON line per blended request: its segments and the positions
#                            that ran after the check layer
#   KVD_BLEND_FAULT=check_layer   raise inside the check layer's attention, after the reused
#                            K was read and before the kept rows' KV is written (the fallback
#                            path must still give an exact prefill); check_layer@R: on
#                            tensor-parallel rank R only
#   KVD_BLEND_FAULT_WHILE=<file>  the fault above fires only while this file exists (one
#                            vLLM runs blends that succeed, then blends that fail)
_TRACE = os.environ.get("KVD_BLEND_TRACE", "")
_FAULT = os.environ.get("KVD_BLEND_FAULT", "")
_FAULT_WHILE = os.environ.get("KVD_BLEND_FAULT_WHILE", "")


class _TensorParallel:
    """This worker's tensor-parallel group: size, rank and a sum all-reduce (size 1 when vLLM
    runs no such group)."""

    def __init__(self) -> None:
        self.size, self.rank, self._all_reduce = 1, 0, None
        try:
            from vllm.distributed import (  # noqa: PLC0415
                get_tensor_model_parallel_rank,
                get_tensor_model_parallel_world_size,
                tensor_model_parallel_all_reduce,
            )

            self.size = int(get_tensor_model_parallel_world_size())
            self.rank = int(get_tensor_model_parallel_rank())
            self._all_reduce = tensor_model_parallel_all_reduce
        except Exception:  # noqa: BLE001 - no distributed state: one rank
            self.size, self.rank = 1, 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.size <= 1 else self._all_reduce(t.clone())


def _fault_here(where: str, rank: int) -> bool:
    name, _, at = _FAULT.partition("@")
    if name != where or (at and not (at.isdigit() and int(at) == rank)):
        return False
    return not _FAULT_WHILE or os.path.exists(_FAULT_WHILE)


class BlendPeerFailed(Exception):
    """Another tensor-parallel rank failed: this one falls back with it."""


class BlendUnsupported(Exception):
    """A step the blend loop does not handle: run the normal forward instead."""


def _blend_connector() -> Any:
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group  # noqa: PLC0415

    from kvd_blend.connector import KvdBlendConnector  # noqa: PLC0415

    if not has_kv_transfer_group():
        return None
    conn = get_kv_transfer_group()
    return conn if isinstance(conn, KvdBlendConnector) and conn.blend_active else None


class BlendForwardMixin:
    """Put before a vLLM *ForCausalLM class whose `.model` has embed_input_ids, layers,
    start_layer, end_layer and norm, and whose decoder layers call an `Attention` module as
    `self_attn.attn(q, k, v)` (Llama, Qwen2, Qwen3)."""

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors: Any = None, inputs_embeds: torch.Tensor | None = None,
                **kwargs: Any) -> Any:
        conn = _blend_connector()
        plans = conn.blend_plans() if conn is not None else {}
        if not plans:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        bf = BlendForward(self, conn, plans)
        try:
            out = bf.run(input_ids, positions, intermediate_tensors, inputs_embeds, kwargs)
            if out is not None:
                return out
        except BlendUnsupported as e:
            for rid in bf.plans:
                conn.blend_stats.fallback("unsupported", rid, str(e))
        except BlendPeerFailed as e:
            for rid in bf.plans:
                conn.blend_stats.fallback("peer_rank", rid, str(e))
        except Exception as e:  # noqa: BLE001 - an exact prefill instead
            logger.exception("kvd_blend: blend forward failed")
            for rid in bf.plans:
                conn.blend_stats.fallback("exception", rid, f"{type(e).__name__}: {e}")
        finally:
            bf.restore()
        return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)


class BlendForward:
    """One step's blend forward (see the module docstring)."""

    def __init__(self, lm: Any, conn: Any, plans: dict[str, BlendRequestPlan]) -> None:
        self.lm = lm
        self.conn = conn
        self.cfg = conn.blend_config
        self.plans = dict(plans)
        self.tp = _TensorParallel()
        self._swapped: list[tuple[dict, str, Any]] = []
        self._patched: list[Any] = []  # attention modules whose forward is intercepted
        self.n_rows = 0  # the step's batch rows

    # --- the loop -----------------------------------------------------------------------------

    def run(self, input_ids, positions, intermediate_tensors, inputs_embeds, kwargs) -> torch.Tensor | None:
        from vllm.forward_context import get_forward_context  # noqa: PLC0415

        model = self.lm.model
        if intermediate_tensors is not None or kwargs:
            raise BlendUnsupported("pipeline parallelism or extra layer arguments")
        if getattr(model, "aux_hidden_state_layers", None):
            raise BlendUnsupported("auxiliary hidden states (speculative decoding)")
        layers = list(model.layers)
        if model.start_layer != 0 or model.end_layer != len(layers):
            raise BlendUnsupported("pipeline parallelism")
        check = self.cfg.check_layer
        if check >= len(layers):
            raise BlendUnsupported(f"check layer {check} but the model has {len(layers)} layers")
        attns = [layer.self_attn.attn for layer in layers]
        names = [a.layer_name for a in attns]
        fc = get_forward_context()
        if not isinstance(fc.attn_metadata, dict) or not isinstance(fc.slot_mapping, dict):
            raise BlendUnsupported("attention metadata is not one dict per layer")
        md = fc.attn_metadata.get(names[0])
        if type(md).__name__ != "CPUAttentionMetadata":
            raise BlendUnsupported(f"attention metadata {type(md).__name__} (CPU attention only)")
        if any(fc.attn_metadata.get(n) is not md for n in names):
            raise BlendUnsupported("layers in several KV cache groups")
        if getattr(attns[0], "isa", None) not in cpu_layout.SUPPORTED_ISAS:
            raise BlendUnsupported(f"CPU attention kernels {getattr(attns[0], 'isa', None)!r} "
                                   f"(blend reads {', '.join(cpu_layout.SUPPORTED_ISAS)} caches)")
        if getattr(attns[0].impl, "sliding_window", -1) not in (-1, None):
            raise BlendUnsupported("sliding-window attention")
        n_rows = int(input_ids.shape[0]) if input_ids is not None else int(inputs_embeds.shape[0])
        self.n_rows = n_rows
        if md.num_actual_tokens != n_rows or not md.causal or md.dynamic_causal is not None:
            raise BlendUnsupported("padded, non-causal or dynamically causal batch")

        rows_of = self._match(md, input_ids, positions, attns[0].kv_cache.shape[2])
        blended: dict[str, tuple[BlendRequestPlan, int]] = {}  # plan, its first row
        t0 = time.monotonic()
        retrieved = {rid: self.conn.retrieve_non_prefix(self.plans[rid]) for rid in rows_of}
        if self.tp.size > 1 and retrieved:
            # Every rank matched the same requests (same batch, same plans): blend only those
            # every rank retrieved.
            order = sorted(retrieved)
            failed = self.tp.sum(torch.tensor([0.0 if retrieved[r] else 1.0 for r in order]))
            for rid, f in zip(order, failed.tolist()):
                if f > 0 and retrieved[rid]:
                    retrieved[rid] = False
                    self.conn.blend_stats.fallback("peer_rank", rid,
                                                   "another tensor-parallel rank could not retrieve")
        for rid, row0 in rows_of.items():
            if retrieved[rid]:
                blended[rid] = (self.plans[rid], row0)
        retrieve_ms = (time.monotonic() - t0) * 1e3
        # From here on, failures are counted per blended request.
        self.plans = {rid: p for rid, (p, _) in blended.items()}
        if not blended:
            return None

        hidden = model.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in layers[:check]:
            hidden, residual = layer(positions, hidden, residual)

        # Policy grad filters twice: at the check layer and at the next.
        second = self.cfg.policy.gradual and check + 1 < len(layers)
        kept: dict[str, torch.Tensor] = {}  # "keep": the rows that go on, unless all of them
        self._intercept(attns[check], fc, names, blended, positions, None, kept, final=not second)
        hidden, residual = layers[check](positions, hidden, residual)
        self._unintercept()
        keep = kept.get("keep")
        if keep is not None:
            hidden, residual, positions = hidden[keep], residual[keep], positions[keep]
        rest = layers[check + 1:]
        if second:
            kept = {}
            self._intercept(attns[check + 1], fc, names, blended, positions, keep, kept, final=True)
            hidden, residual = layers[check + 1](positions, hidden, residual)
            self._unintercept()
            keep2 = kept.get("keep")  # among the rows that ran the layer
            if keep2 is not None:
                hidden, residual, positions = hidden[keep2], residual[keep2], positions[keep2]
                keep = keep2 if keep is None else keep[keep2]
            rest = layers[check + 2:]
        for layer in rest:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = model.norm(hidden, residual)
        if keep is not None:
            full = hidden.new_zeros((n_rows, hidden.shape[1]))
            full[keep] = hidden
            hidden = full
        logger.info("kvd_blend: blended %s: %d of %d rows run after layer %d (%s); retrieve %.1f ms",
                    ",".join(blended), n_rows if keep is None else int(keep.numel()), n_rows,
                    check, self.cfg.policy, retrieve_ms)
        return hidden

    def _match(self, md: Any, input_ids: torch.Tensor, positions: torch.Tensor,
               block_size: int) -> dict[str, int]:
        """plan -> its first row in the batch; a plan that does not match exactly one request of
        the batch is dropped (counted)."""
        qsl = md.query_start_loc.tolist()
        seq = md.seq_lens.tolist()
        out: dict[str, int] = {}
        taken: set[int] = set()
        for rid, plan in list(self.plans.items()):
            n = plan.end - plan.start
            want = torch.tensor(plan.token_ids[plan.start:plan.end], dtype=input_ids.dtype)
            nblk = -(-plan.end // block_size)
            blocks = plan.block_ids[0][:nblk] if plan.block_ids else []
            hits = []
            for i in range(len(seq)):
                a, b = qsl[i], qsl[i + 1]
                if b - a != n or seq[i] != plan.end or i in taken:
                    continue
                if int(positions[a]) != plan.start or not torch.equal(input_ids[a:b].cpu(), want):
                    continue
                if len(blocks) != nblk or md.block_table[i, :nblk].tolist() != blocks:
                    continue
                hits.append(i)
            if len(hits) != 1:
                self.conn.blend_stats.fallback("batch_mismatch", rid,
                                               f"{len(hits)} requests of the batch match its plan")
                continue
            taken.add(hits[0])
            out[rid] = qsl[hits[0]]
        return out

    # --- the check layer ----------------------------------------------------------------------

    def _intercept(self, attn: Any, fc: Any, names: list[str],
                   blended: dict[str, tuple[BlendRequestPlan, int]], positions: torch.Tensor,
                   cur: torch.Tensor | None, kept: dict[str, torch.Tensor], final: bool) -> None:
        """Makes `attn`'s next call choose the rows that go on. `cur`: the batch rows that run
        this layer, in order (None: every row; else what an earlier filter kept), whose
        positions are `positions`. A first filter (cur None) keeps the policy's share (grad:
        its first, wider share); a second (grad's) keeps the policy's share among `cur`.
        kept["keep"]: the indices into `cur` that go on, unless all of them. `final`: the
        choice is the last one (traced)."""
        original = attn.forward
        wide = cur is None and not final  # grad's first filter

        def check_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          *args: Any, **kwargs: Any) -> torch.Tensor:
            n_cur = int(query.shape[0])
            md = fc.attn_metadata[attn.layer_name]  # the metadata of the rows that run here
            slot_mapping = fc.slot_mapping[attn.layer_name]
            keep_mask = torch.ones(n_cur, dtype=torch.bool)
            with_v = self.cfg.policy.with_v
            # per plan: its indices here, its rows, and (with_v) the rows its ratio counts
            mine: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
            devs: list[torch.Tensor] = []   # per plan: K deviations (then K and V's, with_v)
            error: Exception | None = None
            try:
                batch_rows = torch.arange(n_cur) if cur is None else cur
                k3 = key.view(n_cur, attn.num_kv_heads, attn.head_size)
                v3 = value.view(n_cur, attn.num_kv_heads, attn.head_size) if with_v else None
                for plan, row0 in blended.values():
                    n = plan.end - plan.start
                    rel = batch_rows - row0
                    here = torch.nonzero((rel >= 0) & (rel < n), as_tuple=False).flatten()
                    rel = rel[here]  # the plan's rows (0-based within the request) that run here
                    reused_all = reused_mask(plan)
                    mine.append((here, rel, reused_all & ~exact_mask(plan) if with_v else None))
                    reused = reused_all[rel]
                    at, rows = here[reused], rel[reused]
                    dev = torch.zeros((2 if with_v else 1) * n, dtype=torch.float32)  # K's, then V's
                    old_k = cpu_layout.read_k(attn.kv_cache, slot_mapping[at])
                    dev[:n][rows] = k_deviation(k3[at], old_k)
                    if with_v:
                        old_v = cpu_layout.read_v(attn.kv_cache, slot_mapping[at])
                        dev[n:][rows] = k_deviation(v3[at], old_v)  # the same distance, of V
                    devs.append(dev)
                if cur is None and _fault_here("check_layer", self.tp.rank):
                    raise RuntimeError(f"KVD_BLEND_FAULT={_FAULT}")
            except Exception as e:  # noqa: BLE001 - every rank learns of it before going on
                error = e
            if self.tp.size > 1:
                failed = self.tp.sum(torch.tensor([0.0 if error is None else 1.0]))
                if error is None and failed.item() > 0:
                    error = BlendPeerFailed("another tensor-parallel rank failed in the check layer")
            if error is not None:
                raise error
            if self.tp.size > 1 and devs:
                # Each rank's deviations sum over its own heads: their sum is the whole model's.
                devs = list(torch.split(self.tp.sum(torch.cat(devs)), [d.numel() for d in devs]))
            if with_v:  # the whole model's K and V deviations, each over its mean
                devs = [kv_score(d[:d.numel() // 2], d[d.numel() // 2:], counted)
                        for d, (_, _, counted) in zip(devs, mine)]
            for (plan, _), dev, (here, rel, _) in zip(blended.values(), devs, mine):
                if cur is None:
                    chosen = choose_rows(plan, dev, self.cfg, ratio=self.cfg.first_ratio if wide else None)
                else:
                    among = torch.zeros(plan.end - plan.start, dtype=torch.bool)
                    among[rel] = True
                    chosen = choose_rows(plan, dev, self.cfg, among=among)
                if _TRACE and final and self.tp.rank == 0:
                    _trace(plan, chosen, dev, self.n_rows)
                keep_mask[here] = torch.isin(rel, chosen)
            if bool(keep_mask.all()):
                return original(query, key, value, *args, **kwargs)
            keep = torch.nonzero(keep_mask, as_tuple=False).flatten()
            kept["keep"] = keep
            self._swap(fc, names, self._subset_metadata(md, attn, keep, keep_mask, positions,
                                                        query.dtype), slot_mapping[keep])
            out = original(query[keep], key[keep], value[keep], *args, **kwargs)
            full = out.new_zeros((n_cur,) + tuple(out.shape[1:]))
            full[keep] = out
            return full

        attn.forward = check_forward
        self._patched.append(attn)

    def _unintercept(self) -> None:
        while self._patched:
            del self._patched.pop().forward  # the instance attribute; the class method shows again

    def _subset_metadata(self, md: Any, attn: Any, keep: torch.Tensor, keep_mask: torch.Tensor,
                         positions: torch.Tensor, dtype: torch.dtype) -> Any:
        """The CPU attention metadata of the kept rows: each run of consecutive kept rows of a
        request is one query chunk whose sequence ends at its last row's position."""
        from vllm import _custom_ops as ops  # noqa: PLC0415
        from vllm import envs  # noqa: PLC0415

        qsl = md.query_start_loc.tolist()
        qstarts, seq_lens, table_rows = [0], [], []
        kept = keep_mask.tolist()
        for i in range(len(qsl) - 1):
            rows = [r for r in range(qsl[i], qsl[i + 1]) if kept[r]]
            for a, b in runs(rows):
                qstarts.append(qstarts[-1] + (b - a))
                seq_lens.append(int(positions[b - 1]) + 1)
                table_rows.append(i)
        qsl_t = torch.tensor(qstarts, dtype=md.query_start_loc.dtype)
        seq_t = torch.tensor(seq_lens, dtype=md.seq_lens.dtype)
        sched = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=len(seq_lens), num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads,
            head_dim=attn.head_size, seq_lens=seq_t, dtype=dtype, query_start_loc=qsl_t,
            causal=True, sliding_window_size=-1, isa=attn.isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV, dynamic_causal=None,
            kv_cache_dtype=attn.kv_cache_dtype)
        return dataclasses.replace(
            md, num_actual_tokens=int(keep.numel()),
            max_query_len=max(b - a for a, b in zip(qstarts, qstarts[1:])),
            query_start_loc=qsl_t, max_seq_len=max(seq_lens), seq_lens=seq_t,
            block_table=md.block_table[torch.tensor(table_rows, dtype=torch.long)],
            slot_mapping=md.slot_mapping[keep], scheduler_metadata=sched)

    def _swap(self, fc: Any, names: list[str], md: Any, slots: torch.Tensor) -> None:
        for n in names:
            self._swapped.append((fc.attn_metadata, n, fc.attn_metadata[n]))
            fc.attn_metadata[n] = md
            self._swapped.append((fc.slot_mapping, n, fc.slot_mapping[n]))
            fc.slot_mapping[n] = slots

    def restore(self) -> None:
        self._unintercept()
        while self._swapped:
            d, n, v = self._swapped.pop()
            d[n] = v


def _trace(plan: BlendRequestPlan, chosen: torch.Tensor, dev: torch.Tensor, batch_rows: int) -> None:
    rec = {"req_id": plan.req_id, "start": plan.start, "end": plan.end, "batch_rows": batch_rows,
           "segments": [[s.old_st, s.old_ed, s.cur_st, s.cur_ed] for s in plan.segments],
           "kept": (chosen + plan.start).tolist(), "deviation": dev.tolist()}
    with open(_TRACE, "a") as f:
        f.write(json.dumps(rec) + "\n")


def _classes() -> dict[str, type]:
    from vllm.model_executor.models.llama import LlamaForCausalLM  # noqa: PLC0415

    out = {"LlamaForCausalLM": type("KvdBlendLlamaForCausalLM", (BlendForwardMixin, LlamaForCausalLM), {})}
    try:
        from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM  # noqa: PLC0415

        out["Qwen2ForCausalLM"] = type("KvdBlendQwen2ForCausalLM", (BlendForwardMixin, Qwen2ForCausalLM), {})
    except ImportError:  # pragma: no cover
        pass
    try:
        from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM  # noqa: PLC0415

        out["Qwen3ForCausalLM"] = type("KvdBlendQwen3ForCausalLM", (BlendForwardMixin, Qwen3ForCausalLM), {})
    except ImportError:  # pragma: no cover
        pass
    return out


_CLASSES = _classes()
KvdBlendLlamaForCausalLM = _CLASSES["LlamaForCausalLM"]
KvdBlendQwen2ForCausalLM = _CLASSES.get("Qwen2ForCausalLM")
KvdBlendQwen3ForCausalLM = _CLASSES.get("Qwen3ForCausalLM")
