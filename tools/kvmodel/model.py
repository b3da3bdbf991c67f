"""A small Llama-style causal language model (RMSNorm, RoPE, grouped-query attention,
SwiGLU), byte-level vocabulary. Used to produce real KV caches for the codec's
measurements (docs/compression.md); trained by tools/kvmodel/train.py.

The forward pass can return each layer's post-RoPE K and V (the KV an engine caches) and
accept a past KV (possibly reconstructed by the codec) for the tokens before the ones it
computes, so the effect of compressed KV on the model's outputs can be measured exactly.
"""
from __future__ import annotations

import dataclasses
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Config:
    vocab: int = 256          # bytes
    dim: int = 128
    layers: int = 6
    heads: int = 4            # query heads (heads * head_dim may differ from dim)
    kv_heads: int = 2         # key/value heads (GQA): 2 * 64 = 128 channels per K or V
    head_dim: int = 64
    ffn: int = 384            # SwiGLU hidden size
    rope_theta: float = 10000.0
    max_seq: int = 640
    norm_eps: float = 1e-5

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "Config":
        return Config(**json.loads(text))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(cfg: Config, device=None):
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    pos = torch.arange(cfg.max_seq, dtype=torch.float64)
    ang = torch.outer(pos, inv)                       # [S, hd/2]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def apply_rope(x, cos, sin):
    # x: [B, H, S, hd]; NeoX layout (first half / second half), as Llama in vLLM.
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.q = nn.Linear(cfg.dim, cfg.heads * cfg.head_dim, bias=False)
        self.k = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin, past=None, capture=None):
        cfg = self.cfg
        b, s, _ = x.shape
        q = self.q(x).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if capture is not None:
            capture["q"], capture["k"], capture["v"] = q, k, v
        if past is not None:
            pk, pv = past                          # [B, KVH, P, hd], post-RoPE
            kf, vf = torch.cat([pk, k], 2), torch.cat([pv, v], 2)
            p = pk.shape[2]
            mask = torch.ones(s, p + s, dtype=torch.bool, device=x.device).tril(p)
        else:
            kf, vf, mask = k, v, None
        rep = cfg.heads // cfg.kv_heads
        kf = kf.repeat_interleave(rep, dim=1)
        vf = vf.repeat_interleave(rep, dim=1)
        if mask is None:
            y = F.scaled_dot_product_attention(q, kf, vf, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, kf, vf, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.n1 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.n2 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w1 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x, cos, sin, past=None, capture=None):
        x = x + self.attn(self.n1(x), cos, sin, past, capture)
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Model(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        cos, sin = rope_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def init_weights(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        for name, p in sorted(self.named_parameters()):
            if p.dim() == 2:
                std = 0.02
                if name.endswith("o.weight") or name.endswith("w2.weight"):
                    std = 0.02 / math.sqrt(2 * self.cfg.layers)
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, idx, past=None, start=0, captures=None):
        """idx [B, S] token ids at positions start..start+S-1. past: per layer (K, V)
        [B, KVH, start, hd] or None. captures: list (one dict per layer) filled with the
        layer's q, k, v of these tokens (post-RoPE). Returns logits [B, S, vocab]
        (the output head is tied to the embedding)."""
        s = idx.shape[1]
        cos = self.cos[start:start + s]
        sin = self.sin[start:start + s]
        x = self.emb(idx)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, None if past is None else past[i],
                    None if captures is None else captures[i])
        return F.linear(self.norm(x), self.emb.weight)


def load(path: str, device="cpu") -> Model:
    ck = torch.load(path, map_location=device, weights_only=True)
    cfg = Config.from_json(ck["config"])
    m = Model(cfg)
    m.load_state_dict({k: v.float() for k, v in ck["weights"].items()})
    m.eval()
    return m
