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
POLICY_NAMES = ("hkvd", "kv", "grad", "boundary", "hkvd+boundary", "random")


@dataclass(frozen=True)
class Policy:
    """Which reused rows are recomputed after the check layer, besides every row no chunk
    covered and the last row (`kvd.blend.policy`, spelled as str() gives it):

        hkvd             the top recompute_ratio of the reused rows by K deviation (lmcache's)
        kv               the same ranked by K's deviation over its mean plus V's over its mean
                         (one more read of the reused V per row)
        grad             the paper's gradual filter: the top min(1, 2 * recompute_ratio) by K
                         deviation at the check layer, then the top recompute_ratio (of all
                         reused rows) among those by K deviation at the next layer, from which
                         on only they run
        boundary:K       the first K rows of each reused segment
        hkvd+boundary:K  both hkvd's rows and boundary's
        random:SEED      a seeded random recompute_ratio (a control for measurements, not for
                         serving)

    Every combination the fields allow is one of these (checked when made)."""
    name: str = "hkvd"
    boundary_k: int = 0  # boundary and hkvd+boundary only (>= 1 there)
    seed: int = 0        # random only

    def __post_init__(self) -> None:
        if self.name not in POLICY_NAMES:
            raise ValueError(f"unknown blend policy {self.name!r} (known: {', '.join(POLICY_NAMES)})")
        if (self.boundary_k >= 1) != self.name.endswith("boundary"):
            raise ValueError(f"blend policy {self.name}: boundary_k {self.boundary_k} "
                             "(>= 1 with boundary, 0 otherwise)")
        if self.seed < 0 or (self.seed and self.name != "random"):
            raise ValueError(f"blend policy {self.name}: seed {self.seed} (>= 0, random only)")

    @property
    def ranks_by_deviation(self) -> bool:
        """Rows are chosen by deviation (top ratio)."""
        return self.name in ("hkvd", "kv", "grad", "hkvd+boundary")

    @property
    def with_v(self) -> bool:
        """The deviation weighs V's too (kv)."""
        return self.name == "kv"

    @property
    def gradual(self) -> bool:
        """Two filters: at the check layer and at the next (grad)."""
        return self.name == "grad"

    @property
    def random(self) -> bool:
        return self.name == "random"

    def __str__(self) -> str:
        if self.name.endswith("boundary"):
            return f"{self.name}:{self.boundary_k}"
        if self.random:
            return f"random:{self.seed}"
        return self.name


@dataclass(frozen=True)
class BlendConfig:
    enable: bool = False
    check_layer: int = 1
    recompute_ratio: float = 0.15
    policy: Policy = Policy()
    min_reused_tokens: int = 256
    retrieve_timeout_s: float = 30.0

    @property
    def first_ratio(self) -> float:
        """The share of the reused rows kept at the check layer."""
        return min(1.0, 2.0 * self.recompute_ratio) if self.policy.gradual else self.recompute_ratio

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
            kw["policy"] = _parse_policy(key, v)
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


def _parse_policy(key: str, v: Any) -> Policy:
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string, got {v!r}")
    text = v.strip().lower()
    if text in ("hkvd", "kv", "grad"):
        return Policy(text)
    name, _, arg = text.partition(":")
    if name in ("boundary", "hkvd+boundary"):
        return Policy(name, boundary_k=DEFAULT_BOUNDARY_K if arg == "" else _as_int(key, arg, lo=1))
    if name == "random":
        return Policy(name, seed=0 if arg == "" else _as_int(key, arg, lo=0))
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
