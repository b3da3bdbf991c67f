"""An offline CacheBlend reference: a Llama forward in float64 torch, written from the model's
config.json and safetensors alone (no vLLM, no kvd_blend code), that computes what a blended
prefill must give. Qwen2 (q/k/v biases) and Qwen3 (per-head q_norm/k_norm RMSNorm before RoPE;
biases only with attention_bias) too, by config.json's architectures.

    ref = RefLlama(model_dir)
    src = ref.prefill(context_tokens)               # exact KV of a stored prompt
    out = ref.blend(tokens, start, segments, reused, check_layer, ratio)
    out.kept        # positions that ran after the check layer (HKVD: top ceil(ratio * n) reused
                    # rows by squared K deviation, ties to the earlier row; plus every position
                    # no segment covers, and the last)
    ref.greedy(out.cache, out.logits, n)            # greedy tokens after the prompt

`reused[p]` is, per layer, the (K before RoPE, V) of the stored token that lands at position p:
the reused K at p is that K rotated to p (what the server's re-rotation from the old position
computes, up to rounding). Positions before `start` are a prefix (computed exactly, as a loaded
prefix is).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file

DT = torch.float64


@dataclass
class LayerCache:
    k: torch.Tensor  # [n, kvh, d] after RoPE
    v: torch.Tensor  # [n, kvh, d]


@dataclass
class BlendResult:
    kept: list[int]
    cache: list[LayerCache]
    logits: torch.Tensor
    deviation: dict[int, float]  # K deviation per reused position at the check layer
    score: dict[int, float] | None = None  # what the policy ranked by (hkvd: the deviation)


class RefLlama:
    def __init__(self, folder: str, dtype: torch.dtype = DT) -> None:
        self.dtype = dtype
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = c.get("rms_norm_eps", 1e-6)
        arch = (c.get("architectures") or ["LlamaForCausalLM"])[0]
        # vLLM's Qwen2 always has q/k/v biases; Llama and Qwen3 have them with attention_bias.
        self.qkv_bias = arch == "Qwen2ForCausalLM" or bool(c.get("attention_bias", False))
        self.qk_norm = arch == "Qwen3ForCausalLM"
        theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        tensors = {}
        for name in sorted(os.listdir(folder)):
            if name.endswith(".safetensors"):
                tensors.update(load_file(os.path.join(folder, name)))
        self.w = {k: v.to(dtype) for k, v in tensors.items()}
        if "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        for l in range(self.layers):
            a = f"model.layers.{l}.self_attn."
            need = ([a + f"{x}_proj.bias" for x in "qkv"] if self.qkv_bias else []) + \
                ([a + "q_norm.weight", a + "k_norm.weight"] if self.qk_norm else [])
            missing = [n for n in need if n not in self.w]
            assert not missing, f"{arch}: no {missing} in the checkpoint"
        half = self.head_dim // 2
        self.inv_freq = (1.0 / (theta ** (torch.arange(0, half, dtype=DT) * 2 / self.head_dim)))

    # --- pieces ----------------------------------------------------------------------------

    def _norm(self, x: torch.Tensor, w: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[w]

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """NeoX rotation of x [n, h, d] to positions pos [n]."""
        f = torch.outer(pos.to(DT), self.inv_freq)
        cos, sin = f.cos()[:, None, :].to(x.dtype), f.sin()[:, None, :].to(x.dtype)
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _qkv(self, l: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p = f"model.layers.{l}."
        x = self._norm(h, p + "input_layernorm.weight")
        q, k, v = (x @ self.w[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        if self.qkv_bias:
            q, k, v = (y + self.w[p + f"self_attn.{n}_proj.bias"] for y, n in zip((q, k, v), "qkv"))
        q = q.view(-1, self.heads, self.head_dim)
        k = k.view(-1, self.kv_heads, self.head_dim)
        v = v.view(-1, self.kv_heads, self.head_dim)
        if self.qk_norm:  # per head, before RoPE (the K a server stores is this, rotated)
            q = self._norm(q, p + "self_attn.q_norm.weight")
            k = self._norm(k, p + "self_attn.k_norm.weight")
        return q, k, v

    def _attend(self, l: int, q: torch.Tensor, qpos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [m, H, d] at positions qpos; k, v [n, kvh, d] at positions 0..n-1 (causal by
        position: query p sees keys 0..p)."""
        rep = self.heads // self.kv_heads
        kk = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [H, n, d]
        vv = v.repeat_interleave(rep, dim=1).transpose(0, 1)
        allowed = torch.arange(k.shape[0])[None, :] <= qpos[:, None]  # [m, n]
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), kk, vv, attn_mask=allowed, scale=1.0 / math.sqrt(self.head_dim))
        o = o.transpose(0, 1).reshape(q.shape[0], -1)
        return o @ self.w[f"model.layers.{l}.self_attn.o_proj.weight"].T

    def _mlp(self, l: int, h: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{l}."
        x = self._norm(h, p + "post_attention_layernorm.weight")
        g = x @ self.w[p + "mlp.gate_proj.weight"].T
        u = x @ self.w[p + "mlp.up_proj.weight"].T
        return (torch.nn.functional.silu(g) * u) @ self.w[p + "mlp.down_proj.weight"].T

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self._norm(h, "model.norm.weight") @ self.w["lm_head.weight"].T

    # --- full prefill ----------------------------------------------------------------------

    def prefill(self, tokens: list[int]) -> tuple[list[LayerCache], list[torch.Tensor], torch.Tensor]:
        """Exact forward: per layer the cache (K after RoPE, V), per layer K before RoPE, and
        the last row's logits."""
        pos = torch.arange(len(tokens))
        h = self.w["model.embed_tokens.weight"][torch.tensor(tokens)]
        cache, k_pre = [], []
        for l in range(self.layers):
            q, k, v = self._qkv(l, h)
            k_pre.append(k)
            q, k = self.rope(q, pos), self.rope(k, pos)
            cache.append(LayerCache(k, v))
            h = h + self._attend(l, q, pos, k, v)
            h = h + self._mlp(l, h)
        return cache, k_pre, self._logits(h[-1:])[0]

    # --- blended prefill -------------------------------------------------------------------

    def blend(self, tokens: list[int], start: int, reused: dict[int, list[tuple[torch.Tensor, torch.Tensor]]],
              check_layer: int, ratio: float, policy: str = "hkvd",
              segments: list[tuple[int, int]] | None = None) -> BlendResult:
        """policy: hkvd (top ceil(ratio * n) reused rows by deviation, ties to the earlier
        row), random:SEED (ceil(ratio * n) rows drawn with torch's generator seeded SEED),
        boundary:K (the first K rows of each segment [cur_st, cur_ed) in `segments`, or of each
        run of consecutive reused positions when not given), attn (top ceil(ratio * n) reused
        rows by the attention the rows after the last reused one give them at the check
        layer: an exploration of the quality bench, not a kvd_blend policy), kv (top
        ceil(ratio * n) reused rows by K deviation over its mean plus V deviation over its
        mean: an exploration too), grad (a gradual filter: the top ceil(2 * ratio * n) by K
        deviation at the check layer, then the top ceil(ratio * n) of those by K deviation at
        the next layer), oracle (top ceil(ratio * n) by `given`, a score per reused position
        known offline, e.g. error_score's: a bound, not a policy)."""
        return self.blend_many(tokens, start, reused, check_layer, [(ratio, policy)], segments)[0]

    def blend_many(self, tokens: list[int], start: int,
                   reused: dict[int, list[tuple[torch.Tensor, torch.Tensor]]], check_layer: int,
                   specs: list[tuple[float, str]],
                   segments: list[tuple[int, int]] | None = None,
                   given: dict[int, float] | None = None) -> list[BlendResult]:
        """blend() for several (ratio, policy) at once: the layers before the check layer are
        the same for all of them and run once. `given`: the oracle policy's score."""
        n = len(tokens)
        pos = torch.arange(n)
        reused_pos = sorted(p for p in reused if p >= start)
        reused_set = set(reused_pos)
        rp = torch.tensor(reused_pos, dtype=torch.long)
        # Per layer, the reused K rotated to its new position, and V.
        rk = [self.rope(torch.stack([reused[p][l][0] for p in reused_pos]).to(self.dtype), rp)
              if reused_pos else None for l in range(self.layers)]
        rv = [torch.stack([reused[p][l][1] for p in reused_pos]).to(self.dtype)
              if reused_pos else None for l in range(self.layers)]
        h0 = self.w["model.embed_tokens.weight"][torch.tensor(tokens)]
        front: list[LayerCache] = []
        for l in range(min(check_layer, self.layers)):
            q, k, v = self._qkv(l, h0)
            q, k = self.rope(q, pos), self.rope(k, pos)
            front.append(LayerCache(k, v))
            h0 = h0 + self._attend(l, q, pos, k, v)
            h0 = h0 + self._mlp(l, h0)
        out = []
        for ratio, policy in specs:
            h, rows, cache = h0, pos.clone(), list(front)
            kept: list[int] = list(range(n))
            deviation: dict[int, float] = {}
            score: dict[int, float] | None = None
            second: float | None = None  # grad: the ratio of the filter at check_layer + 1
            for l in range(len(front), self.layers):
                q, k, v = self._qkv(l, h)
                q, k = self.rope(q, rows), self.rope(k, rows)
                if not reused_pos:
                    kl, vl = k, v
                else:
                    kl = torch.empty(n, self.kv_heads, self.head_dim, dtype=self.dtype)
                    vl = torch.empty_like(kl)
                    kl[rp], vl[rp] = rk[l], rv[l]
                    if l == check_layer:
                        dev = ((k[rp] - kl[rp]) ** 2).flatten(1).sum(1)
                        deviation = {p: float(d) for p, d in zip(reused_pos, dev)}
                        score = deviation
                        name = policy.partition(":")[0]
                        if name == "attn":
                            score = self._question_attention(q, k, reused_pos)
                        elif name == "kv":
                            score = self._kv_deviation(k[rp], kl[rp], v[rp], vl[rp], reused_pos)
                        elif name == "oracle":
                            assert given is not None, "the oracle policy needs a given score"
                            score = given
                        if name == "grad":
                            chosen = self._choose(reused_pos, score, min(1.0, 2 * ratio), "hkvd", segments)
                            second = ratio
                        else:
                            chosen = self._choose(reused_pos, score, ratio, policy, segments)
                        kept = sorted({p for p in range(n) if p not in reused_set} | chosen | {n - 1})
                        idx = torch.tensor(kept)
                        q, k, v, h, rows = q[idx], k[idx], v[idx], h[idx], rows[idx]
                    elif second is not None and l == check_layer + 1:
                        # grad's second filter: among the reused rows still computed, the top
                        # ceil(second * n) by this layer's K deviation (ties to the earlier row).
                        cur = rows.tolist()
                        cand = [i for i, p in enumerate(cur) if p in reused_set and p != n - 1]
                        dev2 = ((k[cand] - kl[rows[cand]]) ** 2).flatten(1).sum(1).tolist()
                        score = {cur[i]: d for i, d in zip(cand, dev2)}  # what the last filter ranked by
                        chosen = self._choose(sorted(score), score, second, "hkvd", segments,
                                              of=len(reused_pos))
                        keep = [i for i, p in enumerate(cur) if p not in score or p in chosen]
                        kept = [cur[i] for i in keep]
                        idx = torch.tensor(keep)
                        q, k, v, h, rows = q[idx], k[idx], v[idx], h[idx], rows[idx]
                    # The kept rows' fresh KV replaces the reused.
                    kl[rows] = k
                    vl[rows] = v
                    assert len(reused_set | set(rows.tolist())) == n, "a position has no KV"
                cache.append(LayerCache(kl, vl))
                h = h + self._attend(l, q, rows, kl, vl)
                h = h + self._mlp(l, h)
            out.append(BlendResult(kept=[p for p in kept if p >= start], cache=cache,
                                   logits=self._logits(h[-1:])[0], deviation=deviation, score=score))
        return out

    def _question_attention(self, q: torch.Tensor, k: torch.Tensor, reused_pos: list[int]) -> dict[int, float]:
        """Per reused position, the attention weight the rows after the last reused one (the
        question) give it at this layer, summed over those rows and every head (fresh q and k
        of all n rows, causal by position)."""
        n = k.shape[0]
        qrows = torch.arange(reused_pos[-1] + 1, n)
        rep = self.heads // self.kv_heads
        kk = k.repeat_interleave(rep, dim=1)  # [n, H, d]
        s = torch.einsum("mhd,nhd->hmn", q[qrows], kk) / math.sqrt(self.head_dim)
        s = s.masked_fill(torch.arange(n)[None, None, :] > qrows[None, :, None], float("-inf"))
        a = torch.softmax(s, dim=-1).sum((0, 1))
        return {p: float(a[p]) for p in reused_pos}

    def error_score(self, full: list[LayerCache], reused: dict[int, list[tuple[torch.Tensor, torch.Tensor]]],
                    reused_pos: list[int]) -> dict[int, float]:
        """Per reused position, how far its reused KV is from full prefill's over every layer:
        the sum over layers of its squared K error (K rotated to the position) over the mean
        squared norm of full prefill's K at that layer over the reused rows, plus the same of V.
        Known only offline: the oracle policy's score, a bound on what a choice of rows can
        recover at a ratio, not something an engine can compute."""
        rp = torch.tensor(reused_pos, dtype=torch.long)
        total = torch.zeros(len(reused_pos), dtype=torch.float64)
        for l in range(self.layers):
            kr = self.rope(torch.stack([reused[p][l][0] for p in reused_pos]).to(self.dtype), rp)
            vr = torch.stack([reused[p][l][1] for p in reused_pos]).to(self.dtype)
            for fresh, old in ((full[l].k[rp], kr), (full[l].v[rp], vr)):
                d = ((fresh - old) ** 2).flatten(1).sum(1).to(torch.float64)
                total += d / (fresh.to(torch.float64) ** 2).flatten(1).sum(1).mean().clamp_min(1e-30)
        return {p: float(x) for p, x in zip(reused_pos, total)}

    @staticmethod
    def _kv_deviation(k: torch.Tensor, k_reused: torch.Tensor, v: torch.Tensor, v_reused: torch.Tensor,
                      reused_pos: list[int]) -> dict[int, float]:
        """Per reused position, its squared K deviation over the mean of those of every reused
        row, plus the same of V (fresh against reused, rows in reused_pos order): the `kv`
        exploration's score, so that neither of K and V outweighs the other by its scale."""
        dk = ((k - k_reused) ** 2).flatten(1).sum(1)
        dv = ((v - v_reused) ** 2).flatten(1).sum(1)
        both = dk / dk.mean().clamp_min(1e-30) + dv / dv.mean().clamp_min(1e-30)
        return {p: float(d) for p, d in zip(reused_pos, both)}

    @staticmethod
    def _choose(reused_pos: list[int], score: dict[int, float], ratio: float, policy: str,
                segments: list[tuple[int, int]] | None, of: int | None = None) -> set[int]:
        """The reused positions a policy keeps; the quota is ceil(ratio * of), `of` being
        len(reused_pos) unless given (grad's second filter: a share of all reused rows, chosen
        among fewer)."""
        quota = math.ceil(ratio * (len(reused_pos) if of is None else of) - 1e-9)
        name, _, arg = policy.partition(":")
        # score: the K deviation (hkvd), K and V deviations each over its mean (kv), the
        # question's attention (attn), or the offline error (oracle)
        if name in ("hkvd", "kv", "attn", "oracle"):
            return set(sorted(reused_pos, key=lambda p: (-score[p], p))[:quota])
        if name == "random":
            g = torch.Generator().manual_seed(int(arg or 0))
            pick = torch.randperm(len(reused_pos), generator=g)[:quota].tolist()
            return {reused_pos[i] for i in pick}
        if name == "boundary" and segments is not None:
            return {p for a, b in segments for p in range(a, min(b, a + int(arg)))}
        if name == "boundary":
            k, out, prev = int(arg), set(), None
            run_start = None
            for p in reused_pos:
                if prev is None or p != prev + 1:
                    run_start = p
                if p - run_start < k:
                    out.add(p)
                prev = p
            return out
        raise ValueError(f"unknown policy {policy!r}")

    def greedy(self, cache: list[LayerCache], first_logits: torch.Tensor, n_new: int) -> list[int]:
        """Greedy tokens from the prompt's cache and its last row's logits."""
        return self.greedy_many([cache], [first_logits], n_new)[0]

    def greedy_many(self, caches: list[list[LayerCache]], first_logits: list[torch.Tensor],
                    n_new: int) -> list[list[int]]:
        """greedy() for several prompt caches of the same length at once (one batched step per
        token instead of one per cache). Each layer's K/V is one [B, kvh, n + n_new, d] buffer
        filled in place, and query head h reads KV head h // (heads / kv_heads) without
        repeating the cache per head."""
        b = len(caches)
        n = caches[0][0].k.shape[0]
        rep = self.heads // self.kv_heads
        scale = 1.0 / math.sqrt(self.head_dim)
        ks, vs = [], []
        for l in range(self.layers):
            k = torch.empty(b, self.kv_heads, n + n_new, self.head_dim, dtype=self.dtype)
            v = torch.empty_like(k)
            for i, c in enumerate(caches):
                k[i, :, :n] = c[l].k.transpose(0, 1)
                v[i, :, :n] = c[l].v.transpose(0, 1)
            ks.append(k)
            vs.append(v)
        outs = [[int(lg.argmax())] for lg in first_logits]
        p = n
        while len(outs[0]) < n_new:
            pos = torch.full((b,), p)
            h = self.w["model.embed_tokens.weight"][torch.tensor([o[-1] for o in outs])]  # [B, hidden]
            for l in range(self.layers):
                q, k, v = self._qkv(l, h)  # [B, H|kvh, d]
                q, k = self.rope(q, pos), self.rope(k, pos)
                ks[l][:, :, p] = k
                vs[l][:, :, p] = v
                kk, vv = ks[l][:, :, :p + 1], vs[l][:, :, :p + 1]  # [B, kvh, p+1, d]
                qq = q.view(b, self.kv_heads, rep, self.head_dim)
                att = torch.softmax((qq @ kk.transpose(-1, -2)) * scale, dim=-1)  # [B, kvh, rep, p+1]
                o = (att @ vv).reshape(b, -1)
                h = h + o @ self.w[f"model.layers.{l}.self_attn.o_proj.weight"].T
                h = h + self._mlp(l, h)
            nxt = self._logits(h).argmax(-1).tolist()
            for o, t in zip(outs, nxt):
                o.append(int(t))
            p += 1
        return outs
