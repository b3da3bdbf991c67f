"""Trains the KV model (tools/kvmodel/model.py) on the corpus of tools/kvmodel/corpus.py.

Deterministic for a given corpus, seed, step count and thread count: weights are
initialised from --seed, batches are drawn from a generator seeded with --seed + 1, and
the schedule depends only on --steps. `--steps auto` times a few warm-up steps (then
discarded: the real run starts again from the seed) and picks the step count whose
process CPU time (user + system, all threads) fits --cpu-minutes; the budget is in CPU
time because the machine is shared (wall time depends on the load: both are recorded).
The count used is written into the checkpoint, so `--steps N` reruns it exactly.

  python3 tools/kvmodel/train.py --corpus DIR --out tests/data/kvmodel/kvmodel.pt
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

# Idle OpenMP threads sleep instead of spinning: on a shared machine spinning burns CPU
# time that other processes need (numerics are unchanged).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Model  # noqa: E402


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def batches(data: np.ndarray, batch: int, seq: int, seed: int):
    g = np.random.default_rng(seed)
    while True:
        starts = g.integers(0, len(data) - seq - 1, size=batch)
        x = np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(x)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def make(cfg: Config, seed: int, lr: float):
    torch.manual_seed(seed)
    m = Model(cfg)
    m.init_weights(seed)
    decay = [p for n, p in m.named_parameters() if p.dim() == 2]
    other = [p for n, p in m.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    return m, opt


def step_fn(m, opt, x, lr):
    for g in opt.param_groups:
        g["lr"] = lr
    logits = m(x[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    return loss.item()


@torch.no_grad()
def evaluate(m, data: np.ndarray, seq: int, n: int) -> float:
    m.eval()
    tot, cnt = 0.0, 0
    for i in range(n):
        s = i * (len(data) - seq - 1) // n
        x = torch.from_numpy(data[s:s + seq + 1].astype(np.int64))[None]
        logits = m(x[:, :-1])
        tot += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
        cnt += seq
    m.train()
    return tot / cnt / math.log(2)  # bits per byte


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", default="auto")
    ap.add_argument("--cpu-minutes", type=float, default=28.0,
                    help="budget of --steps auto in CPU minutes (2 threads: 14 minutes of the 2-core CPU)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=640)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", default="{}", help="JSON overrides of model.Config")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = Config(**json.loads(a.config))
    cfg.max_seq = max(cfg.max_seq, a.seq)
    train = np.fromfile(os.path.join(a.corpus, "train.bin"), dtype=np.uint8)
    held = np.fromfile(os.path.join(a.corpus, "heldout.bin"), dtype=np.uint8)
    manifest = json.load(open(os.path.join(a.corpus, "manifest.json")))
    load_before = os.getloadavg()
    t_start = time.time()

    if a.steps == "auto":
        m, opt = make(cfg, a.seed, a.lr)
        it = batches(train, a.batch, a.seq, a.seed + 1)
        step_fn(m, opt, next(it), 1e-4)  # first step pays one-off costs
        c0 = cpu_seconds()
        for _ in range(3):
            step_fn(m, opt, next(it), 1e-4)
        per = (cpu_seconds() - c0) / 3
        left = a.cpu_minutes * 60 - cpu_seconds() - 30  # keep 30 CPU s for eval/save
        steps = max(10, int(left / per))
        print(f"timing: {per:.2f} CPU s/step -> {steps} steps", flush=True)
    else:
        steps = int(a.steps)

    m, opt = make(cfg, a.seed, a.lr)
    it = batches(train, a.batch, a.seq, a.seed + 1)
    log = []
    t0 = time.time()
    cpu0 = cpu_seconds()
    for s in range(steps):
        loss = step_fn(m, opt, next(it), lr_at(s, steps, a.lr, a.warmup))
        if s % 20 == 0 or s == steps - 1:
            el = time.time() - t0
            log.append({"step": s, "loss": round(loss, 4), "elapsed_s": round(el, 1)})
            print(f"step {s:5d}/{steps}  loss {loss:.4f} nats  {el:6.0f} s wall  "
                  f"{cpu_seconds() - cpu0:6.0f} s CPU  load {os.getloadavg()[0]:.1f}", flush=True)
    train_s = time.time() - t0
    cpu_s = cpu_seconds() - cpu0
    held_bpb = evaluate(m, held, a.seq, 32)
    print(f"held-out: {held_bpb:.3f} bits/byte; train {train_s:.0f} s wall, {cpu_s:.0f} s CPU", flush=True)
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        rev = ""
    recipe = {
        "command": " ".join(sys.argv), "seed": a.seed, "steps": steps, "batch": a.batch,
        "seq": a.seq, "lr": a.lr, "warmup": a.warmup, "threads": a.threads,
        "torch": torch.__version__, "git": rev,
        "train_wall_s": round(train_s, 1), "train_cpu_s": round(cpu_s, 1),
        "total_cpu_s": round(cpu_seconds(), 1),
        "total_wall_s": round(time.time() - t_start, 1),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "heldout_bits_per_byte": round(held_bpb, 4),
        "corpus": {k: manifest[k] for k in ("train", "heldout")},
        "log": log,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    weights = {k: v.detach().to(torch.float16) for k, v in m.state_dict().items()}
    torch.save({"config": cfg.to_json(), "weights": weights, "recipe": json.dumps(recipe)}, a.out)
    with open(os.path.splitext(a.out)[0] + ".recipe.json", "w") as f:
        json.dump(recipe, f, indent=1)
    print(f"saved {a.out} ({os.path.getsize(a.out)/1e6:.1f} MB)")


if __name__ == "__main__":
    main()
