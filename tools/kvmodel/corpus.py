"""Builds the text corpus for the KV model from documentation shipped by Debian packages:
licence texts (/usr/share/common-licenses), package copyright files and READMEs
(/usr/share/doc) and English manual pages (/usr/share/man/man1-8, groff markup stripped).

Deterministic for a given set of installed packages: files are read in sorted order,
exact duplicates are dropped, and a document goes to the held-out split when the first
byte of the SHA-256 of its path is below 13 (about 5%). manifest.json records every file
used with its split and size, and the SHA-256 of both splits, so a rerun on another
machine can tell whether it trained on the same text.

  python3 tools/kvmodel/corpus.py OUT_DIR [--max-train-mb 24]
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys

ROOTS = [
    ("licence", "/usr/share/common-licenses"),
    ("doc", "/usr/share/doc"),
    ("man", "/usr/share/man"),
]
DOC_NAME = re.compile(r"^(copyright|README[^/]*|NEWS[^/]*|[^/]*\.(txt|md|rst))(\.gz)?$", re.I)
MAN_DIR = re.compile(r"^/usr/share/man/man[1-8]/")
KEEP_MACROS = {"SH", "SS", "B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB",
               "Nm", "Nd", "Sh", "Ss", "Fl", "Ar", "Op", "Xr", "Pa", "Dl", "It", "Em"}
ESCAPES = [(r"\-", "-"), (r"\(em", "--"), (r"\(en", "-"), (r"\(aq", "'"), (r"\(lq", '"'),
           (r"\(rq", '"'), (r"\(bu", "*"), (r"\e", "\\"), (r"\&", ""), (r"\ ", " "),
           (r"\~", " "), (r"\|", ""), (r"\^", ""), (r"\:", ""), (r"\%", ""), (r"\c", "")]
FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[-+]?\d|\\\*(\(..|\[[^\]]*\]|.)|\\\(..|\\.")


def strip_groff(text: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith(('.\\"', "'\\\"", '.\\}', "\\\"")):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            if not parts or parts[0] not in KEEP_MACROS or len(parts) < 2:
                continue
            line = parts[1].replace('"', "")
        for a, b in ESCAPES:
            line = line.replace(a, b)
        line = FONT.sub("", line)
        out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\0" in data[:4096]:
        return None
    return data


def documents():
    for kind, root in ROOTS:
        paths = []
        for d, _, files in os.walk(root):
            for f in files:
                p = os.path.join(d, f)
                if os.path.islink(p):
                    continue
                if kind == "doc" and not DOC_NAME.match(f):
                    continue
                if kind == "man" and not MAN_DIR.match(p):
                    continue
                paths.append(p)
        for p in sorted(paths):
            data = read(p)
            if not data:
                continue
            text = data.decode("utf-8", errors="replace")
            if kind == "man":
                text = strip_groff(text)
            if len(text) < 200:
                continue
            yield kind, p, text.encode("utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max-train-mb", type=float, default=24.0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    seen = set()
    docs = {"train": [], "heldout": []}
    for kind, path, data in documents():
        h = hashlib.sha256(data).digest()
        if h in seen:
            continue
        seen.add(h)
        split = "heldout" if hashlib.sha256(path.encode()).digest()[0] < 13 else "train"
        docs[split].append((hashlib.sha256(b"order" + path.encode()).digest(), kind, path, data))
    # A fixed pseudo-random order (by a hash of the path) mixes licences, docs and man
    # pages before the size cap applies.
    limit = {"train": int(a.max_train_mb * 1e6), "heldout": int(a.max_train_mb * 1e6 / 8)}
    splits = {"train": [], "heldout": []}
    files = []
    for split in ("train", "heldout"):
        size = 0
        for _, kind, path, data in sorted(docs[split]):
            if size >= limit[split]:
                break
            splits[split].append(data + b"\n\n")
            size += len(data) + 2
            files.append({"path": path, "kind": kind, "split": split, "bytes": len(data)})
    man = {"files": files}
    for split, parts in splits.items():
        blob = b"".join(parts)
        with open(os.path.join(a.out, split + ".bin"), "wb") as f:
            f.write(blob)
        man[split] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
                      "documents": len(parts)}
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1)
    print(f"train {man['train']['bytes']/1e6:.1f} MB ({man['train']['documents']} docs), "
          f"heldout {man['heldout']['bytes']/1e6:.1f} MB ({man['heldout']['documents']} docs)")


if __name__ == "__main__":
    sys.exit(main())
