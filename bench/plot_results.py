#!/usr/bin/env python3
"""Draws the PNG figures of docs/benchmarks-history.md (run A) from a run_side_by_side.py results folder.

Needs matplotlib, which is not a kvd dependency: use a throwaway virtualenv, e.g.

    python3 -m venv /tmp/plotvenv && /tmp/plotvenv/bin/pip install matplotlib
    /tmp/plotvenv/bin/python bench/plot_results.py build/bench-results docs/img
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KVD, LM, REF = "#1f77b4", "#ff7f0e", "#7f7f7f"
CASES = ["ping", "lookup_miss_1k", "lookup_hit_1k", "lookup_hit_8k", "lookup_hit_32k",
         "end_session"]


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def control_figures(res: Path, out: Path) -> None:
    k = {(c["name"], c["concurrency"]): c for c in load(res / "kvd_main.json")
         .get("control", {}).get("cases", [])}
    l = {(c["name"], c["concurrency"]): c for c in load(res / "lmcache_main.json")
         .get("control", {}).get("cases", [])}
    concs = sorted({c for _, c in k})
    if not concs:
        return
    for metric, ylabel, fname in (("rps", "requests/s (log)", "control_rps.png"),
                                  ("p50_us", "p50 latency, µs (log)", "control_p50.png")):
        fig, axes = plt.subplots(1, len(concs), figsize=(4.6 * len(concs), 4.2), sharey=True)
        if len(concs) == 1:
            axes = [axes]
        for ax, conc in zip(axes, concs):
            xs = range(len(CASES))
            kv = [k.get((c, conc), {}).get(metric, 0) for c in CASES]
            lv = [l.get((c, conc), {}).get(metric, 0) for c in CASES]
            ax.bar([x - 0.2 for x in xs], kv, 0.4, label="kvd", color=KVD)
            ax.bar([x + 0.2 for x in xs], lv, 0.4, label="lmcache server", color=LM)
            floor = k.get(("zmq_echo_floor", conc), {}).get(metric)
            if floor:
                ax.axhline(floor, color=REF, ls="--", lw=1,
                           label="ZMQ echo floor (no server)")
            ax.set_yscale("log")
            ax.set_xticks(list(xs))
            ax.set_xticklabels([c.replace("lookup_", "") for c in CASES], rotation=35,
                               ha="right", fontsize=8)
            ax.set_title(f"{conc} client{'s' if conc > 1 else ''}")
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_ylabel(ylabel)
        axes[0].legend(fontsize=8)
        fig.suptitle("Control path: " + ("throughput" if metric == "rps" else "median latency")
                     + " (lookups include QUERY_PREFETCH_STATUS until done)")
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)


def data_figure(res: Path, out: Path) -> None:
    kd = {m["model"]: m for m in load(res / "kvd_main.json").get("data", {}).get("models", [])}
    ld = {m["model"]: m for m in load(res / "lmcache_main.json").get("data", {})
          .get("models", [])}
    models = [m for m in kd if "error" not in kd[m]]
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(5.6 * len(models), 4.2), sharey=True)
    if len(models) == 1:
        axes = [axes]
    ops = [("store_cold", "store\n(first pass)"), ("store", "store\n(after CLEAR)"),
           ("retrieve", "retrieve")]
    for ax, name in zip(axes, models):
        k, l = kd[name], ld.get(name, {})
        xs = range(len(ops))
        kv = [(k.get(o) or {}).get("gbps", 0) for o, _ in ops]
        lv = [(l.get(o) or {}).get("gbps", 0) for o, _ in ops]
        ax.bar([x - 0.2 for x in xs], kv, 0.4, label="kvd", color=KVD)
        ax.bar([x + 0.2 for x in xs], lv, 0.4, label="lmcache server", color=LM)
        ax.axhline(k.get("memcpy_mt_gbps", 0), color=REF, ls="--", lw=1,
                   label=f"memcpy, {k.get('memcpy_mt_threads', '?')} threads")
        ax.axhline(k.get("memcpy_1t_gbps", 0), color=REF, ls=":", lw=1, label="memcpy, 1 thread")
        ax.axhline(k.get("memcpy_mt_fresh_gbps", 0), color="#2ca02c", ls="-.", lw=1,
                   label="memcpy into fresh pages")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([lbl for _, lbl in ops], fontsize=8)
        ax.set_title(f"{name} ({k.get('chunk_bytes_per_rank', 0) / 2**20:.1f} MiB/chunk/rank)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("GB/s (10^9 bytes/s)")
    axes[0].legend(fontsize=8)
    fig.suptitle("CPU shared-memory data path")
    fig.tight_layout()
    fig.savefig(out / "data_gbps.png", dpi=110)
    plt.close(fig)


def scale_figure(res: Path, out: Path) -> None:
    ks = load(res / "kvd_scale.json").get("scale", {}).get("levels", [])
    ls_ = load(res / "lmcache_scale.json").get("scale", {}).get("levels", [])
    if not ks:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for levels, label, color in ((ks, "kvd", KVD), (ls_, "lmcache server", LM)):
        if not levels:
            continue
        xs = [lv["entries"] for lv in levels]
        a1.plot(xs, [lv.get("metadata_bytes_per_entry", 0) for lv in levels], "o-", color=color,
                label=f"{label} (since the first request)")
        a1.plot(xs, [lv.get("metadata_bytes_per_entry_marginal", 0) for lv in levels], "s--",
                color=color, alpha=0.6, label=f"{label} (since the previous level)")
        for kind, style in (("lookup_hit_1k", "o-"), ("lookup_hit_32k", "s--"),
                            ("lookup_miss_1k", "^:")):
            a2.plot(xs, [lv["lookup"][kind]["p50_us"] for lv in levels], style, color=color,
                    label=f"{label} {kind.replace('lookup_', '')}")
    a1.axhline(256, color=REF, ls="--", lw=1, label="goal: 256 B")
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("cached entries (4 KiB objects)")
    a1.set_ylabel("anonymous RSS growth per entry, bytes")
    a1.set_title("Server metadata per cached object")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a2.set_xscale("log")
    a2.set_yscale("log")
    a2.set_xlabel("cached entries")
    a2.set_ylabel("p50 latency, µs (LOOKUP + QUERY)")
    a2.set_title("Lookup latency vs table size (1 client)")
    a2.legend(fontsize=7)
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=110)
    plt.close(fig)


def hash_figure(res: Path, out: Path) -> None:
    impls = load(res / "kvd_main.json").get("hash", {}).get("impls", [])
    if not impls:
        return
    seen, rows = set(), []
    for i in impls:
        if i["impl"] in seen:
            continue
        seen.add(i["impl"])
        rows.append(i)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["chain_input_gbps"] for r in rows], 0.4,
           label="chained 256-token chunks (server workload)", color=KVD)
    ax.bar([x + 0.2 for x in xs], [r["bulk_1mib_gbps"] for r in rows], 0.4,
           label="one 1 MiB input", color="#9467bd")
    ax.axhline(1.0, color=REF, ls="--", lw=1, label="goal: 1 GB/s per core")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["impl"] for r in rows])
    ax.set_ylabel("GB/s of hash input, 1 thread")
    ax.set_title("kvd BLAKE3 (in-process)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "hash.png", dpi=110)
    plt.close(fig)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    res, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    control_figures(res, out)
    data_figure(res, out)
    scale_figure(res, out)
    hash_figure(res, out)
    for p in sorted(out.glob("*.png")):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
