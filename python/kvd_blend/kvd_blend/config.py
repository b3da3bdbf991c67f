"""BlendConfig: the `kvd.blend.*` keys of vLLM's `kv_connector_extra_config`.

    kvd.blend.enable             false   turn CacheBlend on (off: the connector is LMCacheMPConnector)
    kvd.blend.check_layer        1       layers before it run on every row; at it the deviation of
                                         fresh K against reused K picks the rows recomputed after it
    kvd.blend.recompute_ratio    0.15    share of the reused rows recomputed (highest deviation)
    kvd.blend.policy             hkvd    hkvd | kv | grad | boundary:K | hkvd+boundary[:K] | random[:SEED]
    kvd.blend.min_reused_tokens  256     a request reusing fewer tokens runs a normal prefill
    kvd.blend.retrieve_timeout_s 30      how long the worker waits for the non-prefix retrieve

lmcache's spellings `cb.check_layer` and `cb.recomp_ratio` are accepted too (the `kvd.blend.*`
key wins when both are given). Every value is checked here; a bad one is a ValueError naming
the key, raised when vLLM builds the connector (before any request).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_BOUNDARY_K = 8


@dataclass(frozen=True)
class BlendConfig:
    enable: bool = False
    check_layer: int = 1
    recompute_ratio: float = 0.15
    # Which reused rows are recomputed after the check layer (besides every row no chunk covered
    # and the last row): the top `recompute_ratio` by deviation (hkvd), the first `boundary_k`
    # rows of each reused segment (boundary), both, or a seeded random `recompute_ratio`
    # (random: a control for measurements, not for serving).
    hkvd: bool = True
    # The deviation hkvd ranks by: K's alone (policy hkvd, lmcache's), or K's over its mean
    # plus V's over its mean (policy kv: one more read of the reused V per row).
    kv_deviation: bool = False
    # Policy grad, the paper's gradual filter: the top min(1, 2 * recompute_ratio) by K
    # deviation at the check layer, then the top recompute_ratio (of all reused rows) among
    # those by K deviation at the next layer, from which on only they run.
    gradual: bool = False

    @property
    def first_ratio(self) -> float:
        """The share of the reused rows kept at the check layer."""
        return min(1.0, 2.0 * self.recompute_ratio) if self.gradual else self.recompute_ratio
    boundary_k: int = 0
    random_seed: int | None = None
    min_reused_tokens: int = 256
    retrieve_timeout_s: float = 30.0

    @property
    def policy(self) -> str:
        if self.random_seed is not None:
            return f"random:{self.random_seed}"
        if self.kv_deviation:
            return "kv"
        if self.gradual:
            return "grad"
        if self.hkvd and self.boundary_k:
            return f"hkvd+boundary:{self.boundary_k}"
        if self.boundary_k:
            return f"boundary:{self.boundary_k}"
        return "hkvd"

    @staticmethod
    def from_extra_config(extra: dict[str, Any] | None) -> "BlendConfig":
        extra = dict(extra or {})

        def pick(*keys: str) -> Any:
            for k in keys:
                if k in extra:
                    return k, extra[k]
            return None, None

        kw: dict[str, Any] = {}
        key, v = pick("kvd.blend.enable")
        if key is not None:
            kw["enable"] = _as_bool(key, v)
        key, v = pick("kvd.blend.check_layer", "cb.check_layer")
        if key is not None:
            kw["check_layer"] = _as_int(key, v, lo=0)
        key, v = pick("kvd.blend.recompute_ratio", "cb.recomp_ratio")
        if key is not None:
            r = _as_float(key, v)
            if not 0.0 <= r <= 1.0:
                raise ValueError(f"{key} must be within [0, 1], got {v!r}")
            kw["recompute_ratio"] = r
        key, v = pick("kvd.blend.policy")
        if key is not None:
            kw.update(_parse_policy(key, v))
        key, v = pick("kvd.blend.min_reused_tokens")
        if key is not None:
            kw["min_reused_tokens"] = _as_int(key, v, lo=0)
        key, v = pick("kvd.blend.retrieve_timeout_s")
        if key is not None:
            t = _as_float(key, v)
            if not t > 0:
                raise ValueError(f"{key} must be > 0, got {v!r}")
            kw["retrieve_timeout_s"] = t
        unknown = sorted(k for k in extra if k.startswith("kvd.blend.") and k not in _KNOWN)
        if unknown:
            raise ValueError(f"unknown kv_connector_extra_config keys: {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(_KNOWN))})")
        return BlendConfig(**kw)


_KNOWN = {
    "kvd.blend.enable", "kvd.blend.check_layer", "kvd.blend.recompute_ratio", "kvd.blend.policy",
    "kvd.blend.min_reused_tokens", "kvd.blend.retrieve_timeout_s",
}


def _parse_policy(key: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string, got {v!r}")
    s = v.strip().lower()
    if s in ("hkvd", "kv", "grad"):
        return {"hkvd": True, "kv_deviation": s == "kv", "gradual": s == "grad", "boundary_k": 0,
                "random_seed": None}
    name, _, arg = s.partition(":")
    if name in ("boundary", "hkvd+boundary"):
        k = DEFAULT_BOUNDARY_K if arg == "" else _as_int(key, arg, lo=1)
        return {"hkvd": name == "hkvd+boundary", "kv_deviation": False, "gradual": False,
                "boundary_k": k, "random_seed": None}
    if name == "random":
        seed = 0 if arg == "" else _as_int(key, arg, lo=0)
        return {"hkvd": False, "kv_deviation": False, "gradual": False, "boundary_k": 0,
                "random_seed": seed}
    raise ValueError(f"{key} must be one of hkvd, kv, grad, boundary:K, hkvd+boundary[:K], random[:SEED]; "
                     f"got {v!r}")


def _as_bool(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off"):
        return False
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ValueError(f"{key} must be a boolean, got {v!r}")


def _as_int(key: str, v: Any, lo: int) -> int:
    try:
        i = int(v)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be an integer, got {v!r}") from None
    if isinstance(v, bool) or (isinstance(v, float) and v != i):
        raise ValueError(f"{key} must be an integer, got {v!r}")
    if i < lo:
        raise ValueError(f"{key} must be >= {lo}, got {v!r}")
    return i


def _as_float(key: str, v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"{key} must be a number, got {v!r}")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number, got {v!r}") from None
