"""KvdBlendConnector: lmcache's LMCacheMPConnector plus CacheBlend's non-prefix reuse.

Use it with vLLM's `kv_connector_module_path`:

    --kv-transfer-config '{"kv_connector": "KvdBlendConnector",
        "kv_connector_module_path": "kvd_blend.connector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"kvd.blend.enable": true, ...}}'

What it adds to the parent (which does everything else: registration, prefix lookup/retrieve,
stores) when `kvd.blend.enable` is true and the server answers the blend handshake:

Scheduler side
    - the lookup is `cb_unified_lookup` (polled while it answers None) instead of LOOKUP +
      QUERY_PREFETCH_STATUS: its prefix is reported to vLLM exactly as LOOKUP's, its
      non-prefix segments (and its segmented-prefix chunks, exact: never recomputed) are kept
      for the request;
    - in the step that computes the rest of the prompt, the usable segments (wholly after
      what vLLM already has, from its own prefix cache or the prefix load) go to the workers
      in the connector metadata (`kvd_blend_plans`), with the request's block ids;
    - a request that reuses KV through blend never stores a chunk from its first
      re-positioned token on (its KV is approximate), through the parent's
      `max_offload_tokens`.

Worker side
    - after the KV caches are registered, `cb_register_rope` with the model's own cos/sin
      cache (shared memory);
    - `retrieve_non_prefix(plan)`, called by the blend model before layer 0, sends
      `cb_retrieve_pre_computed` and answers whether the server scattered the segments.

Any failure (no handshake, a lookup error or timeout, a retrieve answering false, kvd gone)
makes the request run vLLM's normal forward: an exact full prefill of what is not prefix.
Each one is logged with the prefix "kvd_blend: fallback" and counted in `BlendStats`.

Threads: vLLM calls the scheduler side from its scheduler thread and the worker side from
the worker's execution thread; nothing here is shared between the two.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kvd_blend.config import BlendConfig
from kvd_blend.plan import BlendRequestPlan, Segment, segments_from_reply, usable_segments

try:  # the connector class vLLM itself resolves for "LMCacheMPConnector"
    from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector
except ImportError:  # pragma: no cover - lmcache is a requirement of this package's use
    from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_mp_connector import (  # type: ignore
        LMCacheMPConnector,
    )
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

logger = logging.getLogger("vllm.kvd_blend")  # under vLLM's logger: its handlers and level

PROTOCOL_VERSION = 1


@dataclass
class BlendStats:
    """Fallbacks of one process (scheduler or worker), by reason; each is logged with its
    running total (the tests read the log lines)."""

    fallbacks: dict[str, int] = field(default_factory=dict)

    def fallback(self, reason: str, req_id: str, detail: str = "") -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        logger.warning("kvd_blend: fallback reason=%s request=%s total=%d%s", reason, req_id,
                       self.fallbacks[reason], f" ({detail})" if detail else "")


class _BlendLookups:
    """The scheduler adapter with LOOKUP + QUERY_PREFETCH_STATUS replaced by cb_unified_lookup.

    Wraps lmcache's LMCacheMPSchedulerAdapter (every other method is the wrapped one's). One
    server only (blend has no multi-server reconciliation)."""

    def __init__(self, inner: Any, stats: BlendStats) -> None:
        self._inner = inner
        self._stats = stats
        self._client = next(iter(inner.req_clients.values()))
        self._mq_timeout = float(getattr(inner, "_mq_timeout", 30.0))
        # request_id -> (future, key, submitted_at)
        self._pending: dict[str, tuple[Any, Any, float]] = {}
        self._results: dict[str, int] = {}
        self.segments: dict[str, list[Segment]] = {}
        self.lookup_end: dict[str, int] = {}
        self.lookup_ms: dict[str, float] = {}  # submit to answer, for the plan's log line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def maybe_submit_lookup_request(self, request_id: str, token_ids: list[int], cache_salt: str = "",
                                    request_configs: dict[str, Any] | None = None,
                                    reserve_last_token: bool = False) -> None:
        inner = self._inner
        inner._ensure_heartbeat_started()
        if not inner.is_healthy or request_id in self._pending or request_id in self._results:
            return
        chunk = inner.lmcache_tokens_per_chunk
        n = max(0, len(token_ids) - int(reserve_last_token))
        end = n // chunk * chunk
        key = inner._create_key(token_ids, start=0, end=end, request_id=request_id,
                                cache_salt=cache_salt,
                                request_configs=request_configs).no_worker_id_version()
        self.lookup_end[request_id] = end
        self._pending[request_id] = (self._client.cb_unified_lookup(key, inner.tp_size), key,
                                     time.monotonic())

    def check_lookup_result(self, request_id: str) -> int | None:
        if request_id in self._results:
            return self._results[request_id]
        pending = self._pending.get(request_id)
        if pending is None:
            return 0
        if not self._inner.is_healthy:
            return self._finish(request_id, 0, "server_unhealthy")
        fut, key, submitted = pending
        if not fut.query():
            if time.monotonic() - submitted >= self._mq_timeout:
                return self._finish(request_id, 0, "lookup_timeout")
            return None
        try:
            res = fut.result(timeout=0)
        except Exception as e:  # noqa: BLE001 - any transport error: a normal prefill
            return self._finish(request_id, 0, "lookup_error", f"{type(e).__name__}: {e}")
        if res is None:  # still loading into L1: poll again (the same key)
            self._pending[request_id] = (self._client.cb_unified_lookup(key, self._inner.tp_size),
                                         key, submitted)
            return None
        try:
            prefix = int(res.prefix_coverage_tokens)
            segs = segments_from_reply(res)
        except Exception as e:  # noqa: BLE001 - a malformed reply: no reuse at all
            return self._finish(request_id, 0, "lookup_reply", f"{type(e).__name__}: {e}")
        if prefix % self._inner.lmcache_tokens_per_chunk:
            return self._finish(request_id, 0, "lookup_reply", f"unaligned prefix {prefix}")
        if segs:
            self.segments[request_id] = segs
            self.lookup_ms[request_id] = (time.monotonic() - submitted) * 1e3
        return self._finish(request_id, prefix, None)

    def _finish(self, request_id: str, value: int, reason: str | None, detail: str = "") -> int:
        self._pending.pop(request_id, None)
        self._results[request_id] = value
        if reason is not None:
            self._stats.fallback(reason, request_id, detail)
        return value

    def cleanup_lookup_result(self, request_id: str) -> None:
        self._pending.pop(request_id, None)
        self._results.pop(request_id, None)
        self._inner.cleanup_lookup_result(request_id)

    def forget(self, request_id: str) -> None:
        self.cleanup_lookup_result(request_id)
        self.segments.pop(request_id, None)
        self.lookup_end.pop(request_id, None)
        self.lookup_ms.pop(request_id, None)


class KvdBlendConnector(LMCacheMPConnector):
    """LMCacheMPConnector with CacheBlend (see the module docstring)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.blend_config = BlendConfig.from_extra_config(extra)
        self.blend_stats = BlendStats()
        self._vllm_config = vllm_config
        self._blend_lookups: _BlendLookups | None = None
        self._rope_shm: Any = None  # keeps the shared-memory cos/sin table alive
        self.blend_active = False
        if not self.blend_config.enable:
            return
        if role == KVConnectorRole.SCHEDULER:
            adapter = self.scheduler_adapter
            if len(getattr(adapter, "req_clients", {})) != 1:
                logger.warning("kvd_blend: disabled: blend needs exactly one cache server")
                return
            if not self._handshake(next(iter(adapter.req_clients.values()))):
                return
            self._blend_lookups = _BlendLookups(adapter, self.blend_stats)
            self.scheduler_adapter = self._blend_lookups
            self.blend_active = True
            logger.info("kvd_blend: scheduler on: check_layer=%d ratio=%.3f policy=%s "
                        "min_reused_tokens=%d", self.blend_config.check_layer,
                        self.blend_config.recompute_ratio, self.blend_config.policy,
                        self.blend_config.min_reused_tokens)
        else:
            self.blend_active = self._handshake(self.worker_adapter.req_client)

    # --- both sides ---------------------------------------------------------------------------

    def _handshake(self, client: Any) -> bool:
        try:
            reply = client.cb_protocol_handshake(PROTOCOL_VERSION).result(timeout=10)
        except Exception as e:  # noqa: BLE001
            logger.warning("kvd_blend: disabled: the blend handshake failed (%s: %s); is the server "
                           "started with --engine-type blend?", type(e).__name__, e)
            return False
        if reply is None or tuple(reply) != (PROTOCOL_VERSION, True):
            logger.warning("kvd_blend: disabled: the server answered the blend handshake with %r "
                           "(start it with --engine-type blend)", reply)
            return False
        return True

    # --- scheduler side -----------------------------------------------------------------------

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> Any:
        plans: dict[str, BlendRequestPlan] = {}
        if self._blend_lookups is not None:
            steps: list[tuple[str, int]] = [
                (r.req_id, r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs]
            cached = scheduler_output.scheduled_cached_reqs
            steps += list(zip(cached.req_ids, cached.num_computed_tokens))
            for req_id, num_computed in steps:
                plan = self._plan_step(req_id, num_computed,
                                       scheduler_output.num_scheduled_tokens.get(req_id, 0))
                if plan is not None:
                    plans[req_id] = plan
        meta = super().build_connector_meta(scheduler_output)
        for req_id, plan in plans.items():  # blocks appended by the parent for cached requests
            tracker = self.request_trackers.get(req_id)
            plan.block_ids = [list(tracker.allocated_block_ids.get(g, []))
                              for g in sorted(tracker.allocated_block_ids)] if tracker else []
        meta.kvd_blend_plans = plans
        return meta

    def _plan_step(self, req_id: str, num_computed: int, num_scheduled: int) -> BlendRequestPlan | None:
        lookups = self._blend_lookups
        assert lookups is not None
        segs = lookups.segments.pop(req_id, None)
        if not segs or num_scheduled <= 0:
            if segs:
                lookups.segments[req_id] = segs  # not computing yet (waiting for the prefix load)
            return None
        tracker = self.request_trackers.get(req_id)
        if tracker is None:
            return None
        prompt = int(tracker.num_prompt_tokens)
        if num_computed >= prompt:
            return None
        end = num_computed + num_scheduled
        if end < prompt:
            # Chunked prefill: the blend loop needs the rest of the prompt in one forward.
            self.blend_stats.fallback("chunked_prefill", req_id,
                                      f"{num_scheduled} of {prompt - num_computed} tokens scheduled")
            return None
        usable = usable_segments(segs, num_computed, prompt)
        reused = sum(s.num_tokens for s in usable)
        if reused < max(1, self.blend_config.min_reused_tokens):
            logger.info("kvd_blend: request %s: %d reusable tokens after position %d, below "
                        "min_reused_tokens=%d: normal prefill", req_id, reused, num_computed,
                        self.blend_config.min_reused_tokens)
            return None
        # Nothing from the first re-positioned token on is stored: its KV is approximate.
        # Exact segments (segmented prefix) and the recomputed gaps before it are the full
        # prefill's; with only exact segments nothing is approximate.
        chunk = self.scheduler_adapter.lmcache_tokens_per_chunk
        moved = [s for s in usable if not s.exact]
        cap = moved[0].cur_st // chunk * chunk if moved else prompt
        if moved:
            tracker.max_offload_tokens = cap if tracker.max_offload_tokens is None else min(
                tracker.max_offload_tokens, cap)
        logger.info("kvd_blend: request %s: reusing %d tokens in %d segments of [%d, %d); "
                    "storing at most %d tokens; lookup %.1f ms", req_id, reused, len(usable),
                    num_computed, prompt, cap, lookups.lookup_ms.get(req_id, 0.0))
        return BlendRequestPlan(
            req_id=req_id, token_ids=list(tracker.get_token_ids()),
            lookup_end=lookups.lookup_end.get(req_id, 0), start=num_computed, end=prompt,
            segments=usable, block_ids=[], cache_salt=tracker.cache_salt,
            request_configs=tracker.request_configs)

    def request_finished(self, request: Any, block_ids: Any) -> Any:
        if self._blend_lookups is not None:
            self._blend_lookups.forget(request.request_id)
        return super().request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> Any:
        if self._blend_lookups is not None:
            self._blend_lookups.forget(request.request_id)
        return super().request_finished_all_groups(request, block_ids)

    # --- worker side --------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        super().register_kv_caches(kv_caches)
        if self.blend_active:
            self._register_rope(kv_caches)

    def _register_rope(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper  # noqa: PLC0415
        from vllm.model_executor.layers.rotary_embedding import get_rope  # noqa: PLC0415

        mc = self._vllm_config.model_config
        hf = mc.hf_text_config
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        try:
            if any(t.device.type != "cpu" for t in kv_caches.values()):
                raise RuntimeError("kvd_blend registers its rope table from CPU memory only for now")
            rope = get_rope(head_dim, max_position=hf.max_position_embeddings,
                            is_neox_style=True, rope_parameters=getattr(hf, "rope_parameters", None),
                            dtype=mc.dtype)
            cos_sin = rope.cos_sin_cache.detach().to(torch.float32).contiguous().clone()
            self._rope_shm = CpuShmTensorWrapper.wrap(cos_sin)
            rot = int(cos_sin.shape[1])
            n_groups = len(getattr(self.worker_adapter, "engine_group_infos", None) or ()) or 1
            self.worker_adapter.req_client.cb_register_rope(
                self.worker_adapter.instance_id, [self._rope_shm], head_dim, True, [0] * n_groups,
                [[0, rot]] * n_groups, [head_dim] * n_groups).result(timeout=60)
        except Exception as e:  # noqa: BLE001 - blend off for this worker, plain prefills
            self.blend_active = False
            logger.warning("kvd_blend: disabled on this worker: cb_register_rope failed (%s: %s)",
                           type(e).__name__, e)
            return
        logger.info("kvd_blend: worker on: rope registered (head_dim=%d, rotary dims=%d, %d positions)",
                    head_dim, rot, cos_sin.shape[0])

    def blend_plans(self) -> dict[str, BlendRequestPlan]:
        """This step's plans (empty when blend is off or nothing is reused)."""
        if not self.blend_active:
            return {}
        try:
            meta = self._get_connector_metadata()
        except Exception:  # noqa: BLE001 - no metadata bound (warm-up, profiling)
            return {}
        return dict(getattr(meta, "kvd_blend_plans", None) or {})

    def retrieve_non_prefix(self, plan: BlendRequestPlan) -> bool:
        """cb_retrieve_pre_computed for the plan's segments: True when the server scattered them
        (re-rotated) into this worker's blocks."""
        from lmcache.v1.multiprocess.custom_types import CBMatchResult  # noqa: PLC0415

        wa = self.worker_adapter
        key = wa._create_key(plan.token_ids, start=0, end=plan.lookup_end, request_id=plan.req_id,
                             cache_salt=plan.cache_salt, request_configs=plan.request_configs)
        matches = [CBMatchResult(old_st=s.old_st, old_ed=s.old_ed, cur_st=s.cur_st, cur_ed=s.cur_ed,
                                 hash=s.hash) for s in plan.segments]
        try:
            _, ran = wa.req_client.cb_retrieve_pre_computed(
                key, matches, plan.block_ids, wa.instance_id, b"").result(
                    timeout=self.blend_config.retrieve_timeout_s)
        except Exception as e:  # noqa: BLE001
            self.blend_stats.fallback("retrieve_error", plan.req_id, f"{type(e).__name__}: {e}")
            return False
        if not ran:
            self.blend_stats.fallback("scatter_not_run", plan.req_id,
                                      "the server answered scatter_ran=false")
            return False
        return True
