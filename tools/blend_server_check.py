#!/usr/bin/env python3
"""CacheBlend through a running `kvd server --engine-type blend`, on a GPU or on CPU.

    python3 tools/blend_server_check.py --url tcp://127.0.0.1:5592 --device cuda
    python3 tools/blend_server_check.py --url tcp://127.0.0.1:5592 --device cpu

One Llama-8B-shaped worker (32 layers, FlashAttention NHD, bf16; its tensors in GPU memory
through CUDA IPC, or in POSIX shared memory with --device cpu) does what the blend connector
does, in lmcache 0.5.6's frames: registers its KV cache and a NeoX cos/sin cache (on the GPU
too: kvd reads it once), stores a system prompt and a document, looks up a prompt that holds
the same document after another prefix (cb_unified_lookup, polled), and retrieves it
(cb_retrieve_pre_computed with its event; on a GPU kvd answers the event of its own device
work). Checked: V byte-identical, K within 2^-6 (relative) of a float64 rotation from the
stored positions to the new ones and not left as stored, and no byte written outside the
match's blocks. Prints the retrieve's round trip (reply, and reply plus its event) beside a
plain RETRIEVE of the same chunk at its own position. Ends with VERDICT: PASS or FAIL.
Run by scripts/gpu-check.sh (--device cuda) and by tests/integration/test_blend_server_check.py
(--device cpu).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_harness as G  # noqa: E402

# lmcache 0.5.6's blend op ids, beside the harness's own (Wire sends by name).
G.OPS.update(cb_register_rope=25, cb_unregister_rope=26, cb_retrieve_pre_computed=27,
             cb_unified_lookup=28, cb_protocol_handshake=33)

CHUNK = 256
MAX_POS = 4096
REPS = 5


def rope_cache(torch, max_pos: int, rot_dim: int):
    """vLLM's NeoX cos/sin cache: [max_pos, rot_dim], cosines then sines, float32."""
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float32) / rot_dim))
    f = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    return torch.cat([f.cos(), f.sin()], dim=-1).contiguous()


def rotate_neox(torch, k, cache, old, new):
    """K [tokens, heads, D] from positions `old` to `new` (per token), in float64."""
    half = k.shape[-1] // 2
    c = cache.double()
    oc, os_, nc, ns = c[old, :half], c[old, half:], c[new, :half], c[new, half:]
    dcos = (nc * oc + ns * os_)[:, None, :]
    dsin = (ns * oc - nc * os_)[:, None, :]
    x = k.double()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * dcos - x2 * dsin, x2 * dcos + x1 * dsin], dim=-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--blocks", type=int, default=96)
    args = ap.parse_args()
    import torch  # noqa: PLC0415
    import zmq  # noqa: PLC0415

    ctx = zmq.Context()
    G.wait_for_server(ctx, args.url, args.timeout)
    spec = G.llama(args.blocks, hnd=False)
    spec.model_name = "blend-server-check"
    layers, bs = len(spec.tensors), spec.tokens_per_block[0]
    nh, hs = spec.hints["num_kv_heads"], spec.hints["head_dim"]
    bpc = CHUNK // bs
    mem = G.Memory(torch, args.device)
    events = G.Events(torch, args.device)
    wire = G.Wire(ctx, args.url, args.timeout)
    iid = 4242
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        G.log(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    def key(tokens, rid, worker):
        return G.cache_key(spec, 0, tokens, 0, len(tokens) // CHUNK * CHUNK, rid,
                           worker=worker is not None)

    kv = [mem.alloc(t) for t in spec.tensors]
    g = torch.Generator(device=kv[0].device).manual_seed(4242)
    for t in kv:  # finite values (random bytes would hold NaNs, which no rotation compares)
        t.copy_(torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32).to(t.dtype))
    sync()
    try:
        wire.call("register_kv_cache", iid, [mem.descriptor(t) for t in kv], spec.model_name,
                  spec.world_size, "vllm", spec.hints, spec.infos)
        hs_reply = wire.call("cb_protocol_handshake", 1)
        check(list(hs_reply) == [1, True], f"cb_protocol_handshake answers {hs_reply}")
        cache = rope_cache(torch, MAX_POS, hs)
        if args.device == "cuda":
            table = cache.cuda()
        else:
            table = mem.alloc(G.TensorSpec((MAX_POS, hs), "float32", 0, 0, 0, 0))
            table.copy_(cache)
        sync()
        reply = wire.call("cb_register_rope", iid, [mem.descriptor(table)], hs, True, [0],
                          [[0, hs]], [hs])
        check(reply is None, f"cb_register_rope with the table in {args.device} memory ({reply})")

        system, doc = G.unique_tokens(CHUNK), G.unique_tokens(CHUNK)
        src = list(range(1, 1 + 2 * bpc))  # system in blocks 1..16, doc in 17..32
        _ev, h = events.record()
        handle, ok = wire.call("store", key(system + doc, "bsc-store", 0), iid, [src], h)
        events.wait(bytes(handle))
        check(bool(ok), "store of the system prompt and the document")
        sync()
        stored = [t[:, src[bpc:]].clone() for t in kv]  # the document's blocks, per layer

        dst = list(range(2 * bpc + 1, 2 * bpc + 1 + 3 * bpc))  # positions 0..767 of the prompt
        rounds, rounds_done = [], []
        for rep in range(REPS):
            prompt = G.unique_tokens(CHUNK) + G.unique_tokens(CHUNK) + doc
            rid = f"bsc-q{rep}"
            res, deadline = None, time.monotonic() + args.timeout
            while res is None and time.monotonic() < deadline:
                res = wire.call("cb_unified_lookup", key(prompt, rid, None), 1)
                if res is None:
                    time.sleep(0.005)
            segs = [(m["old_st"], m["old_ed"], m["cur_st"], m["cur_ed"])
                    for m in (res or {}).get("non_prefix_segments", [])]
            if rep == 0:
                check(segs == [(256, 512, 512, 768)], f"cb_unified_lookup finds the document at 512: {segs}")
            if not segs:
                break
            for t in kv:
                t[:, dst[0]:dst[-1] + 1].zero_()
            sync()
            _ev, h = events.record()
            t0 = time.perf_counter()
            handle, ran = wire.call("cb_retrieve_pre_computed", key(prompt, rid, 0),
                                    res["non_prefix_segments"], [dst], iid, h)
            t1 = time.perf_counter()
            events.wait(bytes(handle))
            sync()
            t2 = time.perf_counter()
            rounds.append(t1 - t0)
            rounds_done.append(t2 - t0)
            if rep == 0:
                check(bool(ran), f"cb_retrieve_pre_computed answers scatter_ran=True "
                                 f"(event: {len(bytes(handle))} bytes)")
                if args.device == "cuda":
                    check(len(bytes(handle)) > 0, "a GPU scatter answers an event to wait for")
                got = [t[:, dst[2 * bpc:]].cpu() for t in kv]
                untouched = all(not t[:, dst[:2 * bpc]].any().item() for t in kv)
                check(untouched, "nothing written outside the match's blocks")
                pos = torch.arange(CHUNK)
                v_ok, k_err, k_moved = True, 0.0, False
                for g, s in zip(got, stored):
                    s = s.cpu()
                    v_ok = v_ok and torch.equal(g[1].view(torch.int16), s[1].view(torch.int16))
                    k_old = s[0].reshape(CHUNK, nh, hs)
                    k_new = g[0].reshape(CHUNK, nh, hs)
                    ref = rotate_neox(torch, k_old, cache, 256 + pos, 512 + pos)
                    k_err = max(k_err, (k_new.double() - ref).abs().max().item() /
                                max(1.0, ref.abs().max().item()))
                    k_moved = k_moved or not torch.equal(k_new.view(torch.int16), k_old.view(torch.int16))
                check(v_ok, f"V of all {layers} layers byte-identical")
                check(k_err <= 2 ** -6, f"K rotated 256+t -> 512+t: max relative error {k_err:.2e} (<= 2^-6)")
                check(k_moved, "K is not left as stored")
            wire.call("end_session", rid)
        # The same chunk by a plain RETRIEVE at its own position (a prefix hit), for scale.
        plain = []
        for _ in range(REPS):
            _ev, h = events.record()
            t0 = time.perf_counter()
            handle, _ok = wire.call("retrieve", key(system + doc, "bsc-plain", 0), iid, [src], h, 0)
            events.wait(bytes(handle))
            sync()
            plain.append(time.perf_counter() - t0)
        obj_mb = kv[0][:, :bpc].numel() * kv[0].element_size() * layers / 2 ** 20
        if rounds:
            G.log(f"blend retrieve of 1 chunk ({obj_mb:.0f} MiB): reply {statistics.median(rounds) * 1e3:.2f} ms, "
                  f"reply + event {statistics.median(rounds_done) * 1e3:.2f} ms (median of {len(rounds)}); "
                  f"plain RETRIEVE of 2 chunks at their own positions: {statistics.median(plain) * 1e3:.2f} ms")
        wire.call("cb_unregister_rope", iid)
        wire.call("unregister_kv_cache", iid)
    except Exception as e:  # noqa: BLE001
        failures.append(f"{type(e).__name__}: {e}")
        G.log(f"FAIL  {type(e).__name__}: {e}")
    finally:
        wire.close()
        mem.close()
    print(f"VERDICT: {'PASS' if not failures else 'FAIL (' + '; '.join(failures) + ')'}", flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
