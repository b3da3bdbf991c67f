"""Measures KV compression on the KV model's own KV cache (docs/compression.md).

For every held-out window of the sample (641 bytes): the first 512 tokens are the cached
context (two 256-token chunks, i.e. two kvd objects [2][layers][256][kv_heads*head_dim]
in bfloat16, as an engine stores them); the next 128 tokens are computed with that cache
and scored; and 64 tokens are generated greedily from the prompt (the context plus one
token). Every codec setting replaces the cached KV by its decoded reconstruction; the
baseline is the uncompressed bfloat16 cache.

Reported per setting: bits per value all-in and the ratio against bfloat16 and against
8-bit per-token quantization (1 byte per value plus a 16-bit scale per token and plane);
relative error ||KV' - KV|| / ||KV|| per layer for K and V; attention-output error per
layer with the model's own queries (the continuation tokens' queries against the cached
keys and values); next-token KL(baseline || codec) and top-1 agreement over the 128
scored positions; perplexity of those positions relative to the baseline; and greedy
agreement (positions equal of 64, and tokens before the first difference).

  python3 tools/kvmodel/measure.py --codec-bin build/kvd-codec --out build/compression \
      [--sweep default|quick] [--settings NAME,...]

Writes OUT/results.json and OUT/tables.md. Needs torch and numpy; the lmcache rows need
lmcache 0.5.6 and numba (the shared venv has both) and are skipped otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import types

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from model import load  # noqa: E402

CTX, CONT, GEN, CHUNK = 512, 128, 64, 256


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


class Reference:
    """Everything computed once with the uncompressed (bfloat16) cache."""

    def __init__(self, model, windows: np.ndarray, greedy: bool = True):
        self.m = model
        self.with_greedy = greedy
        cfg = model.cfg
        x = torch.from_numpy(windows.astype(np.int64))
        self.x = x
        n = x.shape[0]
        caps = [dict() for _ in range(cfg.layers)]
        with torch.no_grad():
            model(x[:, :CTX], captures=caps)
        self.k = [bf16(c["k"]) for c in caps]   # [N, KVH, CTX, hd]
        self.v = [bf16(c["v"]) for c in caps]
        self.k32 = [c["k"] for c in caps]
        self.v32 = [c["v"] for c in caps]
        self.logits, self.q = self.continuation(self.k, self.v, want_q=True)
        self.greedy = self.generate(self.k, self.v) if greedy else None
        tgt = x[:, CTX + 1:CTX + CONT + 1]
        self.nll = F.cross_entropy(self.logits.reshape(-1, cfg.vocab), tgt.reshape(-1)).item()
        self.attn = [self.attention(i, self.k[i], self.v[i]) for i in range(cfg.layers)]
        self.n = n

    def continuation(self, k, v, want_q=False):
        caps = [dict() for _ in range(self.m.cfg.layers)] if want_q else None
        with torch.no_grad():
            logits = self.m(self.x[:, CTX:CTX + CONT], past=list(zip(k, v)), start=CTX, captures=caps)
        return logits, ([c["q"] for c in caps] if want_q else None)

    def generate(self, k, v):
        past = list(zip(k, v))
        tok = self.x[:, CTX:CTX + 1]
        out = []
        with torch.no_grad():
            for i in range(GEN):
                caps = [dict() for _ in range(self.m.cfg.layers)]
                logits = self.m(tok, past=past, start=CTX + i, captures=caps)
                past = [(torch.cat([pk, c["k"]], 2), torch.cat([pv, c["v"]], 2))
                        for (pk, pv), c in zip(past, caps)]
                tok = logits[:, -1:].argmax(-1)
                out.append(tok)
        return torch.cat(out, 1)

    def attention(self, layer, k, v):
        cfg = self.m.cfg
        rep = cfg.heads // cfg.kv_heads
        q = self.q[layer]                                   # [N, H, CONT, hd]
        kk = k.repeat_interleave(rep, 1)
        vv = v.repeat_interleave(rep, 1)
        w = torch.softmax(q @ kk.transpose(-1, -2) / math.sqrt(cfg.head_dim), -1)
        return w @ vv


def to_objects(ref: Reference, k, v) -> bytes:
    """[N][chunk] objects [2][L][256][KVH*hd] bfloat16, the kvd canonical layout."""
    objs = []
    for n in range(ref.n):
        for c in range(CTX // CHUNK):
            sl = slice(c * CHUNK, (c + 1) * CHUNK)
            planes = [t[n, :, sl, :].transpose(0, 1).reshape(CHUNK, -1) for t in k] + \
                     [t[n, :, sl, :].transpose(0, 1).reshape(CHUNK, -1) for t in v]
            objs.append(torch.stack(planes).to(torch.bfloat16))
    return torch.stack(objs).view(torch.int16).numpy().tobytes()


def from_objects(ref: Reference, data: bytes):
    cfg = ref.m.cfg
    L, KVH, hd = cfg.layers, cfg.kv_heads, cfg.head_dim
    t = torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy()).view(torch.bfloat16).float()
    t = t.reshape(ref.n, CTX // CHUNK, 2 * L, CHUNK, KVH, hd).permute(2, 0, 4, 1, 3, 5)
    t = t.reshape(2 * L, ref.n, KVH, CTX, hd)
    return [t[i] for i in range(L)], [t[L + i] for i in range(L)]


# ---- codecs ---------------------------------------------------------------------------

def run_kvd(ref, codec_bin, args):
    cfg = ref.m.cfg
    raw = to_objects(ref, ref.k, ref.v)
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.raw"), os.path.join(d, "out.raw")
        with open(src, "wb") as f:
            f.write(raw)
        layout = f"2,{cfg.layers},{CHUNK},{cfg.kv_heads * cfg.head_dim},bfloat16"
        r = subprocess.run([codec_bin, "roundtrip", "--layout", layout, *args, src, dst],
                           capture_output=True, text=True, check=True)
        stats = json.loads(r.stdout)
        with open(dst, "rb") as f:
            out = f.read()
    k, v = from_objects(ref, out)
    return k, v, stats["encoded_bytes"], stats


def run_int8(ref):
    """8-bit per-token absmax quantization per plane (the size baseline), in torch."""
    def q(t):  # t [N, KVH, T, hd]: per (token) absmax over all heads and dims
        tt = t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)
        s = bf16(tt.abs().amax(-1, keepdim=True))
        y = torch.where(s > 0, torch.round(tt / s * 127).clamp(-127, 127) * (s / 127), torch.zeros_like(tt))
        return bf16(y).reshape(t.shape[0], t.shape[2], t.shape[1], t.shape[3]).transpose(1, 2)
    k = [q(t) for t in ref.k]
    v = [q(t) for t in ref.v]
    return k, v, int8_bytes(ref), {}


def int8_bytes(ref):
    cfg = ref.m.cfg
    values = 2 * cfg.layers * ref.n * CTX * cfg.kv_heads * cfg.head_dim
    scales = 2 * cfg.layers * ref.n * CTX * 2
    return values + scales


def run_lmcache(ref):
    """lmcache 0.5.6's own CacheGen codec (in-process serde, CPU kernels), its bin
    schedule for this model (32 bins everywhere: fewer than 10 layers), no anchors.
    Size = its pickled output."""
    import types
    # lmcache's cachegen modules import transformers.AutoConfig only to look up model
    # names it does not know; the minimal venv has no transformers, and the schedule is
    # passed explicitly here, so a stand-in module is enough.
    if "transformers" not in sys.modules:
        try:
            import transformers  # noqa: F401
        except ImportError:
            sys.modules["transformers"] = types.SimpleNamespace(AutoConfig=None)
    from lmcache.storage_backend.serde.cachegen_encoder import encode_function
    from lmcache.storage_backend.serde.cachegen_decoder import decode_function_gpu, do_dequantize
    cfg = ref.m.cfg
    L, KVH, hd = cfg.layers, cfg.kv_heads, cfg.head_dim
    kb = torch.full((L,), 32.0)
    vb = torch.full((L,), 32.0)
    total = 0
    ks = [torch.empty_like(t) for t in ref.k]
    vs = [torch.empty_like(t) for t in ref.v]
    for n in range(ref.n):
        for c in range(CTX // CHUNK):
            sl = slice(c * CHUNK, (c + 1) * CHUNK)
            # [L, 2, T, H, D]
            kv = torch.stack([torch.stack([ref.k[l][n, :, sl].transpose(0, 1), ref.v[l][n, :, sl].transpose(0, 1)])
                              for l in range(L)]).to(torch.bfloat16)
            enc = encode_function(kv, None, kb, vb, CHUNK)
            blob = enc.to_bytes()
            total += len(blob)
            out = type(enc).from_bytes(blob)
            buf = torch.zeros((CHUNK, 2 * L * KVH * hd), dtype=torch.uint8)
            key, value = decode_function_gpu(out.cdf, out.data_chunks, L, CHUNK, buf)
            key = do_dequantize(key, kb, out.max_tensors_key).to(torch.bfloat16).float()
            value = do_dequantize(value, vb, out.max_tensors_value).to(torch.bfloat16).float()
            for l in range(L):
                ks[l][n, :, sl] = key[l].reshape(CHUNK, KVH, hd).transpose(0, 1)
                vs[l][n, :, sl] = value[l].reshape(CHUNK, KVH, hd).transpose(0, 1)
    return ks, vs, total, {}


# ---- metrics --------------------------------------------------------------------------

def metrics(ref: Reference, k, v, nbytes):
    cfg = ref.m.cfg
    values = 2 * cfg.layers * ref.n * CTX * cfg.kv_heads * cfg.head_dim
    rel = lambda a, b: (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()  # noqa: E731
    logits, _ = ref.continuation(k, v)
    lp_ref = F.log_softmax(ref.logits, -1)
    lp = F.log_softmax(logits, -1)
    kl = (lp_ref.exp() * (lp_ref - lp)).sum(-1).mean().item()
    top1 = (logits.argmax(-1) == ref.logits.argmax(-1)).float().mean().item()
    tgt = ref.x[:, CTX + 1:CTX + CONT + 1]
    nll = F.cross_entropy(logits.reshape(-1, cfg.vocab), tgt.reshape(-1)).item()
    if ref.with_greedy:
        eq = ref.generate(k, v) == ref.greedy
        prefix = torch.where((~eq).any(1), (~eq).float().argmax(1), torch.full((ref.n,), GEN)).float()
    else:
        eq = torch.ones(1, dtype=torch.bool)
        prefix = torch.full((1,), GEN)
    return {
        "bytes": nbytes,
        "bits_per_value": 8 * nbytes / values,
        "ratio_bf16": 2 * values / nbytes,
        "ratio_int8": int8_bytes(ref) / nbytes,
        "k_rel_err": [rel(a, b) for a, b in zip(k, ref.k)],
        "v_rel_err": [rel(a, b) for a, b in zip(v, ref.v)],
        "attn_rel_err": [rel(ref.attention(i, k[i], v[i]), ref.attn[i]) for i in range(cfg.layers)],
        "kl_nats": kl,
        "top1": top1,
        "ppl_delta": math.exp(nll - ref.nll) - 1,
        "greedy_positions": eq.float().mean().item(),
        "greedy_prefix": (prefix / GEN).mean().item(),
        "greedy_all64": (prefix == GEN).float().mean().item(),
    }


def settings(sweep: str):
    if sweep == "sensitivity":
        # One layer (K and V) at 12 bins, the others at 64: which layers matter most.
        return [(f"kvd layer {i} at 12 bins, others 64", "kvd",
                 ["--bins", f"k={layer_spans(i)} v={layer_spans(i)}"]) for i in range(6)]
    s = [("bf16", "none", []), ("fp32 (KV not rounded to bf16)", "fp32", [])]
    s.append(("int8 per-token", "int8", []))
    s.append(("fp8 e4m3fn", "kvd", ["--codec", "fp8", "--fp8-dtype", "float8_e4m3fn"]))
    s.append(("fp8 e5m2", "kvd", ["--codec", "fp8", "--fp8-dtype", "float8_e5m2"]))
    s.append(("lmcache cachegen (32 bins)", "lmcache", []))
    bins = [8, 12, 16, 20, 24, 32, 48, 64] if sweep == "default" else [16, 32]
    for b in bins:
        s.append((f"kvd {b} bins", "kvd", ["--bins", str(b)]))
    if sweep == "default":
        # Layer-dependent schedules (layer 0 is the most sensitive: --sweep sensitivity).
        sched = [
            ("layer 0 at 32, others 16", "k=0-1:32,1-:16 v=0-1:32,1-:16"),
            ("layer 0 at 32, others 20", "k=0-1:32,1-:20 v=0-1:32,1-:20"),
            ("layers 0-1 at 32, others 16 (lmcache's split shape)", "k=0-2:32,2-:16 v=0-2:32,2-:16"),
            ("K 20, V 16", "k=0-:20 v=0-:16"),
        ]
        for name, spec in sched:
            s.append((f"kvd {name}", "kvd", ["--bins", spec]))
        for g, b, ab in ((5, 16, 32), (10, 16, 32), (20, 16, 32), (10, 16, 16), (10, 32, 32)):
            s.append((f"kvd anchors G={g}, {b} bins, anchor {ab}", "kvd",
                      ["--bins", str(b), "--anchor-group", str(g), "--anchor-bins", str(ab)]))
    return s


def layer_spans(i: int, low: int = 12, high: int = 64) -> str:
    parts = []
    if i > 0:
        parts.append(f"0-{i}:{high}")
    parts.append(f"{i}-{i + 1}:{low}")
    parts.append(f"{i + 1}-:{high}")
    return ",".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "tests/data/kvmodel/kvmodel.pt"))
    ap.add_argument("--sample", default=os.path.join(REPO, "tests/data/kvmodel/heldout.bin"))
    ap.add_argument("--codec-bin", default=os.path.join(REPO, "build/kvd-codec"))
    ap.add_argument("--out", default=os.path.join(REPO, "build/compression"))
    ap.add_argument("--sweep", default="default", choices=["default", "quick", "sensitivity"])
    ap.add_argument("--settings", default="", help="comma-separated name prefixes to run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--resize", default="",
                    help="results.json of an earlier run: recompute only the sizes of its kvd "
                         "settings with --codec-bin (for an encoder change that leaves the decoded "
                         "values unchanged, which is checked)")
    ap.add_argument("--dump-objects", default="", metavar="FILE",
                    help="only write the bf16 KV objects of the first --dump-windows windows "
                         "(2 per window, [2][layers][256][kv_heads*head_dim]) to FILE: the input "
                         "of kvd-codec-bench --objects")
    ap.add_argument("--dump-windows", type=int, default=16)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load(a.model)
    win = np.fromfile(a.sample, dtype=np.uint8).reshape(-1, CTX + CONT + 1)
    if a.dump_objects:
        return dump_objects(a, model, win[:a.dump_windows])
    os.makedirs(a.out, exist_ok=True)
    if a.resize:
        return resize(a, model, win)
    t0 = time.time()
    ref = Reference(model, win)
    print(f"reference: {ref.n} windows, baseline perplexity {math.exp(ref.nll):.3f} "
          f"({ref.nll / math.log(2):.3f} bits/byte), {time.time() - t0:.0f} s", flush=True)
    results = {"model": os.path.relpath(a.model, REPO), "windows": ref.n,
               "baseline_nll_bits": ref.nll / math.log(2), "settings": []}
    only = [p for p in a.settings.split(",") if p]
    for name, kind, args in settings(a.sweep):
        if only and not any(name.startswith(p) for p in only):
            continue
        t0 = time.time()
        try:
            if kind == "none":
                k, v, nb, st = ref.k, ref.v, 2 * 2 * model.cfg.layers * ref.n * CTX * model.cfg.kv_heads * model.cfg.head_dim, {}
            elif kind == "fp32":
                k, v, nb, st = ref.k32, ref.v32, 4 * 2 * model.cfg.layers * ref.n * CTX * model.cfg.kv_heads * model.cfg.head_dim, {}
            elif kind == "int8":
                k, v, nb, st = run_int8(ref)
            elif kind == "lmcache":
                k, v, nb, st = run_lmcache(ref)
            else:
                k, v, nb, st = run_kvd(ref, a.codec_bin, args)
        except ImportError as e:
            print(f"{name}: skipped ({e})", flush=True)
            continue
        m = metrics(ref, k, v, nb)
        m["name"] = name
        m["args"] = args
        if st:
            m["plane_bytes"] = st.get("plane_bytes")
        results["settings"].append(m)
        print(f"{name:58s} {m['bits_per_value']:5.2f} b/v  x{m['ratio_bf16']:5.2f}  "
              f"K {np.mean(m['k_rel_err']):.4f} V {np.mean(m['v_rel_err']):.4f}  "
              f"attn {np.mean(m['attn_rel_err']):.4f}  KL {m['kl_nats']:.5f}  top1 {m['top1']:.4f}  "
              f"ppl {100 * m['ppl_delta']:+.3f}%  greedy {m['greedy_positions']:.3f}/{m['greedy_prefix']:.3f}  "
              f"({time.time() - t0:.0f} s)", flush=True)
        write(a.out, results)   # after every setting: an interrupted sweep keeps what it measured
    print(f"wrote {a.out}/results.json and tables.md")


def write(out, results):
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "tables.md"), "w") as f:
        f.write(tables(results))


def dump_objects(a, model, win):
    cfg = model.cfg
    x = torch.from_numpy(win.astype(np.int64))
    caps = [dict() for _ in range(cfg.layers)]
    with torch.no_grad():
        model(x[:, :CTX], captures=caps)
    ref = types.SimpleNamespace(n=x.shape[0], m=model)
    data = to_objects(ref, [bf16(c["k"]) for c in caps], [bf16(c["v"]) for c in caps])
    with open(a.dump_objects, "wb") as f:
        f.write(data)
    print(f"wrote {ref.n * (CTX // CHUNK)} objects of layout 2,{cfg.layers},{CHUNK},"
          f"{cfg.kv_heads * cfg.head_dim} bfloat16 ({len(data)} bytes) to {a.dump_objects}")


def resize(a, model, win):
    """Sizes of the kvd settings of an earlier results.json with the current codec; the
    decoded KV must be bit-identical to what the earlier run's decoder produced for the
    quality figures to stand, so it is compared against the reference of this run: the
    relative errors must come out the same."""
    with open(a.resize) as f:
        res = json.load(f)
    ref = Reference(model, win, greedy=False)
    rel = lambda x, y: (torch.linalg.vector_norm(x - y) / torch.linalg.vector_norm(y)).item()  # noqa: E731
    for m in res["settings"]:
        if not m["name"].startswith("kvd ") or "--codec" in m["args"]:
            continue
        k, v, nb, st = run_kvd(ref, a.codec_bin, m["args"])
        errs = [rel(x, y) for x, y in zip(k, ref.k)] + [rel(x, y) for x, y in zip(v, ref.v)]
        if max(abs(e - f) for e, f in zip(errs, m["k_rel_err"] + m["v_rel_err"])) > 1e-9:
            raise SystemExit(f"{m['name']}: decoded KV differs from the earlier run; rerun it in full")
        values = 2 * model.cfg.layers * ref.n * CTX * model.cfg.kv_heads * model.cfg.head_dim
        m.update(bytes=nb, bits_per_value=8 * nb / values, ratio_bf16=2 * values / nb,
                 ratio_int8=int8_bytes(ref) / nb, plane_bytes=st.get("plane_bytes"))
        print(f"{m['name']:58s} {m['bits_per_value']:5.3f} b/v  x{m['ratio_bf16']:5.2f}", flush=True)
    res["resized_with"] = os.path.relpath(a.codec_bin, REPO)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(a.out, "tables.md"), "w") as f:
        f.write(tables(res))
    print(f"wrote {a.out}/results.json and tables.md")


def tables(res) -> str:
    lines = ["| setting | bits/value | × vs bf16 | × vs int8 | K rel err | V rel err | attn err | "
             "KL (nats) | top-1 | ppl Δ | greedy = (pos / prefix / 64 of 64) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in res["settings"]:
        lines.append(
            f"| {m['name']} | {m['bits_per_value']:.3f} | {m['ratio_bf16']:.2f} | {m['ratio_int8']:.2f} | "
            f"{np.mean(m['k_rel_err']):.4f} | {np.mean(m['v_rel_err']):.4f} | {np.mean(m['attn_rel_err']):.4f} | "
            f"{m['kl_nats']:.5f} | {m['top1']:.4f} | {100 * m['ppl_delta']:+.3f}% | "
            f"{m['greedy_positions']:.3f} / {m['greedy_prefix']:.3f} / {m['greedy_all64']:.2f} |")
    lines.append("")
    lines.append("Per layer (relative error of K, of V, of the attention output):")
    lines.append("")
    for m in res["settings"]:
        per = ", ".join(f"L{i}: {a:.4f}/{b:.4f}/{c:.4f}" for i, (a, b, c) in
                        enumerate(zip(m["k_rel_err"], m["v_rel_err"], m["attn_rel_err"])))
        lines.append(f"- {m['name']}: {per}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
