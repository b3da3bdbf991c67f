"""CacheBlend quality on a real trained model (SmolLM2-135M-Instruct), offline.

    .venv-e2e/bin/python bench/blend_quality.py [--n 100] [--out build/blend-quality.json]

A synthetic RAG set: a pool of documents, each holding one key fact ("The access code of
<name> is <4 digits>.") among distractor sentences (other names, other numbers), each exactly
256 or 512 tokens, each precomputed once behind the same 256-token system prompt (as a stored
context would be: the system chunk then the document's chunks). A prompt is the system prompt,
4-8 documents of the pool in another order, and a question about the key fact of one of them.

Every prompt is computed as:
    full      full prefill (the reference)
    reuse     every document's KV reused, nothing recomputed after the check layer
    hkvd@r    blend: the top r of reused rows by K deviation at the check layer (r = 0.05,
              0.15, 0.3)
    random    blend: a random 15% of the reused rows
    boundary  blend: the first 38 rows (15%) of each reused 256-token chunk
    attn@r    (only with --configs) an exploration beyond HKVD: the top r of reused rows by
              the attention the question gives them at the check layer
    kv@r      (only with --configs) an exploration too: the top r of reused rows by K
              deviation plus V deviation at the check layer, each over its mean
    grad@r    (only with --configs) the paper's gradual filter: the top 2r by K deviation at
              the check layer, then the top r of those by K deviation at the next layer
    oracle@r  (only with --configs) a bound, not a policy: the top r of reused rows by their
              KV error against full prefill over every layer (RefLlama.error_score), which
              only an offline run knows; with hkvd@0.5, how far this method can go here

by the offline float32 reference of tests/e2e/blend_reference.py: the computation
tests/e2e/test_blend_vllm.py checks kvd_blend's vLLM path against (same kept rows, same greedy
tokens, on the random-weight model). Reported per configuration: answer accuracy (the greedy
answer contains the code), first-token KL(full || config), 32-token agreement with full
prefill (share of positions with the same greedy token), per-layer KV error (relative L2 of
K and V over the reused rows, against full prefill's), and the issue's goals at ratio 0.15.

The documents' positions move, so their reused K is rotated from the context's positions to
the prompt's (what kvd's scatter does). The check layer is --check-layer (1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from blend_reference import RefLlama  # noqa: E402
from smollm2 import default_out_dir  # noqa: E402

CHUNK = 256
SYLLABLES = ["ka", "ren", "to", "mi", "sol", "var", "el", "dor", "an", "qui", "bel", "tes", "ro",
             "na", "zu", "fi", "lo", "mar", "ek", "sa"]
TOPICS = ["The harbour of {a} was rebuilt in {y} after a storm.",
          "{a} grows {n} tons of barley every year.",
          "The library of {a} keeps {n} old maps.",
          "In {y}, {a} hosted a festival of lanterns.",
          "The bridge near {a} is {n} metres long.",
          "{a} trades wool and copper with {b}.",
          "The school of {a} has {n} students.",
          "A road from {a} to {b} was opened in {y}.",
          "The museum of {a} shows {n} paintings of the sea.",
          "{a} is known for its blue glass and quiet streets.",
          "The council of {a} meets every {d} days.",
          "The tower of {b} can be seen from {a} on clear days.",
          "Travellers say the bread of {a} is the best in the valley.",
          "The river that runs through {a} freezes in {y} winters out of ten."]


def name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


class Tok:
    def __init__(self, folder: str) -> None:
        from tokenizers import Tokenizer  # noqa: PLC0415

        self.t = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))

    def ids(self, text: str) -> list[int]:
        return self.t.encode(text, add_special_tokens=False).ids

    def text(self, ids: list[int]) -> str:
        return self.t.decode(ids, skip_special_tokens=True)


def fit(ids: list[int], n: int, filler: list[int]) -> list[int]:
    while len(ids) < n:
        ids = ids + filler
    return ids[:n]


def make_system(tok: Tok) -> list[int]:
    head = tok.ids("<|im_start|>system\nYou are a careful assistant. You answer questions using the "
                   "documents the user gives. Answer with the code only.<|im_end|>\n<|im_start|>user\n"
                   "Here are the documents.\n")
    filler = tok.ids("Read every document with care. ")
    return fit(head, CHUNK, filler)


def make_doc(tok: Tok, rng: random.Random, length: int) -> dict:
    who = name(rng)
    code = f"{rng.randint(1000, 9999)}"
    sentences = [t.format(a=name(rng), b=name(rng), y=rng.randint(1500, 1990), n=rng.randint(3, 900),
                          d=rng.randint(2, 30)) for t in rng.sample(TOPICS * 3, 30)]
    distractors = [f"The access code of {name(rng)} is {rng.randint(1000, 9999)}." for _ in range(2)]
    pos = rng.randint(1, 5)
    body = sentences[:pos] + [f"The access code of {who} is {code}."] + distractors + sentences[pos:]
    ids = tok.ids("\n\nDocument about " + who + ". " + " ".join(body))
    filler = tok.ids(" " + " ".join(sentences))
    return {"who": who, "code": code, "ids": fit(ids, length, filler)}


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> float:
    lp = torch.log_softmax(p_logits.double(), -1)
    lq = torch.log_softmax(q_logits.double(), -1)
    return float((lp.exp() * (lp - lq)).sum())


# name -> (ratio, policy) of the reference's blend, or None for full prefill.
CONFIGS = {"full": None, "reuse": (0.0, "hkvd"), "hkvd@0.05": (0.05, "hkvd"),
           "hkvd@0.15": (0.15, "hkvd"), "hkvd@0.3": (0.3, "hkvd"),
           "random@0.15": (0.15, "random"), "boundary:38": (0.0, "boundary:38"),
           # Exploration: the reused rows the question attends to most at the check layer.
           "attn@0.15": (0.15, "attn"), "attn@0.3": (0.3, "attn"),
           # Exploration: the reused rows whose K and V deviate most (each over its mean).
           "kv@0.15": (0.15, "kv"), "kv@0.3": (0.3, "kv"),
           # Exploration: the paper's gradual filter (2r at the check layer, r at the next).
           "grad@0.15": (0.15, "grad"),
           # A bound, not a policy: the reused rows whose KV is furthest from full prefill's
           # over every layer (known only offline), and HKVD at a larger budget.
           "oracle@0.15": (0.15, "oracle"), "oracle@0.3": (0.3, "oracle"), "hkvd@0.5": (0.5, "hkvd")}
EXPLORATIONS = ("attn", "kv", "grad", "oracle", "hkvd@0.5")
DEFAULT_CONFIGS = [c for c in CONFIGS if not c.startswith(EXPLORATIONS)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_out_dir()))
    ap.add_argument("--n", type=int, default=100, help="prompts (default 100)")
    ap.add_argument("--pool", type=int, default=40, help="documents in the pool (default 40)")
    ap.add_argument("--check-layer", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--out", default=str(REPO / "build" / "blend-quality.json"))
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help="comma-separated, from: " + ", ".join(CONFIGS) + " (default: all but "
                         "the explorations attn@*, kv@*, grad@*, oracle@* and hkvd@0.5; the goals need "
                         "full, reuse, hkvd@0.15 and random@0.15)")
    args = ap.parse_args()
    unknown = [c for c in args.configs.split(",") if c not in CONFIGS]
    if unknown or "full" not in args.configs.split(","):
        ap.error(f"--configs: unknown {unknown}" if unknown else "--configs must include full")
    if not os.path.exists(os.path.join(args.model, "config.json")):
        sys.exit(f"no checkpoint at {args.model}: run `.venv-e2e/bin/python tests/e2e/smollm2.py`")
    torch.set_grad_enabled(False)
    t0 = time.monotonic()
    ref = RefLlama(args.model, dtype=torch.float32)
    tok = Tok(args.model)
    rng = random.Random(args.seed)
    system = make_system(tok)
    print(f"[blend-quality] model {args.model}: {ref.layers} layers; pool of {args.pool} documents",
          file=sys.stderr)
    pool = [make_doc(tok, rng, 512 if rng.random() < 0.3 else 256) for _ in range(args.pool)]
    # Each document's KV behind the system prompt: K before RoPE and V, per layer.
    for i, d in enumerate(pool):
        cache, k_pre, _ = ref.prefill(system + d["ids"])
        d["kv"] = [(k_pre[l][CHUNK:], cache[l].v[CHUNK:]) for l in range(ref.layers)]
        if (i + 1) % 10 == 0:
            print(f"[blend-quality] precomputed {i + 1}/{len(pool)} documents "
                  f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)

    configs = {c: CONFIGS[c] for c in args.configs.split(",")}
    rows = {c: {"correct": [], "kl": [], "agree": [], "k_err": [], "v_err": [], "kept": []} for c in configs}
    def report(done: int) -> dict:
        summary = {}
        for c, r in rows.items():
            k_layer = [statistics.mean(x[l] for x in r["k_err"]) for l in range(ref.layers)]
            v_layer = [statistics.mean(x[l] for x in r["v_err"]) for l in range(ref.layers)]
            summary[c] = {"accuracy": sum(r["correct"]) / len(r["correct"]),
                          "kl_median": statistics.median(r["kl"]), "kl_mean": statistics.mean(r["kl"]),
                          "agree32": statistics.mean(r["agree"]),
                          "agree32_all": sum(a == 1.0 for a in r["agree"]) / len(r["agree"]),
                          "k_err_mean": statistics.mean(k_layer), "v_err_mean": statistics.mean(v_layer),
                          "k_err_per_layer": k_layer, "v_err_per_layer": v_layer,
                          "rows_computed": statistics.mean(r["kept"])}
        goals = {}
        if all(c in summary for c in ("full", "reuse", "hkvd@0.15", "random@0.15")):
            goals = goals_of(summary)
        result = {"model": args.model, "prompts": done, "pool": args.pool, "check_layer": args.check_layer,
                  "seed": args.seed, "seconds": time.monotonic() - t0, "summary": summary, "goals": goals}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        return result

    def goals_of(summary: dict) -> dict:
        f, z, b, rnd = (summary[c] for c in ("full", "reuse", "hkvd@0.15", "random@0.15"))
        gap = f["accuracy"] - z["accuracy"]
        return {
            "accuracy >= 0.95 x full": b["accuracy"] >= 0.95 * f["accuracy"],
            "recovers >= 50% of the reuse gap": (b["accuracy"] - z["accuracy"]) >= 0.5 * gap if gap > 0 else None,
            "median KL <= 0.5 x reuse": b["kl_median"] <= 0.5 * z["kl_median"],
            "hkvd < random on KL": b["kl_median"] < rnd["kl_median"],
            "hkvd < random on KV error": b["k_err_mean"] + b["v_err_mean"] < rnd["k_err_mean"] + rnd["v_err_mean"],
        }


    for i in range(args.n):
        docs = rng.sample(pool, min(len(pool), rng.randint(4, 8)))
        target = rng.choice(docs)
        question = tok.ids(f"\nWhat is the access code of {target['who']}? Reply with the 4-digit "
                           f"code.<|im_end|>\n<|im_start|>assistant\nThe access code of {target['who']} is")
        tokens = list(system)
        reused, segments = {}, []
        for d in docs:
            at = len(tokens)
            tokens += d["ids"]
            for j in range(len(d["ids"])):
                reused[at + j] = [(d["kv"][l][0][j], d["kv"][l][1][j]) for l in range(ref.layers)]
            segments += [(at + c, at + c + CHUNK) for c in range(0, len(d["ids"]), CHUNK)]
        tokens += question
        full_cache, _, full_logits = ref.prefill(tokens)
        rp = torch.tensor(sorted(reused))
        blend_specs = []
        for c, spec in configs.items():
            if spec is not None:
                ratio, policy = spec
                blend_specs.append((ratio, f"random:{args.seed * 100003 + i}" if policy == "random" else policy))
        given = None
        if any(spec is not None and spec[1] == "oracle" for spec in configs.values()):
            given = ref.error_score(full_cache, reused, sorted(reused))
        blended = ref.blend_many(tokens, CHUNK, reused, args.check_layer, blend_specs, segments, given)
        caches = [full_cache] + [r.cache for r in blended]
        logits_all = [full_logits] + [r.logits for r in blended]
        kept_all = [len(tokens) - CHUNK] + [len(r.kept) for r in blended]
        outs = ref.greedy_many(caches, logits_all, args.answer_tokens)
        full_tokens = outs[0]
        for j, c in enumerate(configs):
            cache, logits, out, kept = caches[j], logits_all[j], outs[j], kept_all[j]
            r = rows[c]
            r["correct"].append(tok.text(out[:6]).strip().startswith(target["code"]))
            r["kl"].append(kl(full_logits, logits))
            r["agree"].append(sum(a == b for a, b in zip(out, full_tokens)) / len(full_tokens))
            r["kept"].append(kept / (len(tokens) - CHUNK))
            r["k_err"].append([float((cache[l].k[rp] - full_cache[l].k[rp]).norm() / full_cache[l].k[rp].norm())
                               for l in range(ref.layers)])
            r["v_err"].append([float((cache[l].v[rp] - full_cache[l].v[rp]).norm() / full_cache[l].v[rp].norm())
                               for l in range(ref.layers)])
        if (i + 1) % 10 == 0 and i + 1 < args.n:
            report(i + 1)  # partial results on disk while the run goes on
        if (i + 1) % 5 == 0 or i + 1 == args.n:
            acc = {c: sum(r["correct"]) / len(r["correct"]) for c, r in rows.items()}
            print(f"[blend-quality] {i + 1}/{args.n} prompts ({time.monotonic() - t0:.0f} s): accuracy "
                  + ", ".join(f"{c} {a:.2f}" for c, a in acc.items()), file=sys.stderr)

    result = report(args.n)
    summary, goals = result["summary"], result["goals"]
    print(f"\n{args.n} prompts, check layer {args.check_layer}, {time.monotonic() - t0:.0f} s\n")
    print("| config | rows computed | accuracy | median first-token KL | 32-token agreement | all 32 equal "
          "| K error | V error |")
    print("|---|---|---|---|---|---|---|---|")
    for c, s in summary.items():
        print(f"| {c} | {s['rows_computed']:.3f} | {s['accuracy']:.2f} | {s['kl_median']:.4f} | "
              f"{s['agree32']:.3f} | {s['agree32_all']:.2f} | {s['k_err_mean']:.4f} | {s['v_err_mean']:.4f} |")
    print()
    for g, ok in goals.items():
        print(f"- {g}: {'n/a' if ok is None else ('met' if ok else 'MISSED')}")
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
