#!/usr/bin/env bash
# Regenerates the flags table in docs/cli.md from the kvd binary's own table
# (src/cli/flags_table_lmcache.cc and flags_table_kvd.cc), between the "flags table" markers.
# Usage: scripts/update-cli-doc.sh [path/to/kvd]        (default: build/kvd)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
KVD="${1:-build/kvd}"
table="$("$KVD" server --list-flags markdown)"
python3 - "$table" <<'PY'
import sys
path = "docs/cli.md"
doc = open(path).read()
begin, end = "<!-- flags table: begin -->\n", "<!-- flags table: end -->"
head, rest = doc.split(begin, 1)
_, tail = rest.split(end, 1)
open(path, "w").write(head + begin + sys.argv[1] + "\n" + end + tail)
PY
echo "docs/cli.md updated"
