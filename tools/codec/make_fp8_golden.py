#!/usr/bin/env python3
"""Writes tests/data/codec/fp8_golden/: torch's own float8 casts, the reference kvd's fp8
serde must match bit for bit (lmcache 0.5.6's fp8 serde is `.to(float8_*)` and back).

  bf16_to_e4m3fn.bin, bf16_to_e5m2.bin, fp16_to_e4m3fn.bin, fp16_to_e5m2.bin
      65536 bytes: the cast of every 16-bit pattern (index = the pattern).
  e4m3fn_to_bf16.bin, e5m2_to_bf16.bin, e4m3fn_to_fp16.bin, e5m2_to_fp16.bin
      256 little-endian u16: the cast back of every fp8 pattern.
  e4m3fn_to_fp32.bin, e5m2_to_fp32.bin    256 little-endian u32.
  fp32_cases.bin, fp32_to_e4m3fn.bin, fp32_to_e5m2.bin
      4096 float32 inputs (specials, boundaries, random) and their casts.

  python3 tools/codec/make_fp8_golden.py tests/data/codec/fp8_golden   (needs torch)
"""
import os
import sys

import numpy as np
import torch


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    pats = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    kinds = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    for src, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        x = pats.view(dt)
        for name, k in kinds.items():
            x.to(k).view(torch.uint8).numpy().tofile(os.path.join(out, f"{src}_to_{name}.bin"))
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for name, k in kinds.items():
        f8 = b.view(k)
        f8.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tofile(os.path.join(out, f"{name}_to_bf16.bin"))
        f8.to(torch.float16).view(torch.int16).numpy().astype("<i2").tofile(os.path.join(out, f"{name}_to_fp16.bin"))
        f8.to(torch.float32).view(torch.int32).numpy().astype("<i4").tofile(os.path.join(out, f"{name}_to_fp32.bin"))
    rng = np.random.default_rng(8)
    special = [0.0, -0.0, 1.0, 448.0, 449.0, 464.0, 480.0, 57344.0, 61440.0, 65536.0, 1e30, -1e30,
               float("inf"), float("-inf"), float("nan"), 2.0 ** -9, 2.0 ** -10, 1.5 * 2.0 ** -10,
               2.0 ** -16, 2.0 ** -17, 1.5 * 2.0 ** -17, 1e-40, 3e-39]
    rand = list((rng.standard_normal(2048) * np.exp2(rng.integers(-20, 20, 2048))).astype(np.float32))
    bits = rng.integers(0, 2 ** 32, 4096 - len(special) - len(rand), dtype=np.uint64).astype(np.uint32)
    cases = np.concatenate([np.array(special, dtype=np.float32), np.array(rand, dtype=np.float32),
                            bits.view(np.float32)])
    cases.astype("<f4").tofile(os.path.join(out, "fp32_cases.bin"))
    t = torch.from_numpy(cases.copy())
    for name, k in kinds.items():
        t.to(k).view(torch.uint8).numpy().tofile(os.path.join(out, f"fp32_to_{name}.bin"))
    print(f"wrote {out} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
