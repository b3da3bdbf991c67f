"""Cuts the held-out evaluation sample for the codec measurements: --windows windows of
--length bytes at evenly spaced offsets of the corpus's held-out split (deterministic).
The sample is checked in (tests/data/kvmodel/heldout.bin) so the measurements in
docs/compression.md rerun on any machine.

  python3 tools/kvmodel/sample.py CORPUS_DIR OUT [--windows 64] [--length 641]
"""
import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--length", type=int, default=641)
    a = ap.parse_args()
    held = np.fromfile(os.path.join(a.corpus, "heldout.bin"), dtype=np.uint8)
    span = len(held) - a.length
    starts = [i * span // a.windows for i in range(a.windows)]
    np.concatenate([held[s:s + a.length] for s in starts]).tofile(a.out)
    print(f"{a.windows} windows of {a.length} bytes -> {a.out}")


if __name__ == "__main__":
    main()
