#!/usr/bin/env bash
# scripts/bench_tokenizer.sh [BUILD] [MB]: the BPE tokenizer's encoding throughput beside tiktoken's, on
# one cpu thread, in one run: a text of MB megabytes (default 10: data/tinyshakespeare.txt and
# tests/fixtures/tokenizer/unicode.txt repeated) encoded with each of gpt2, cl100k_base and
# o200k_base by BUILD/bench_tokenizer (default build/) and by tiktoken in node
# (scripts/tiktoken_reference.mjs), both as ordinary text and timed over one call each; the ids
# must be equal. Needs scripts/fetch_tiktoken.sh's vocab/ and node.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
MB="${2:-10}"
VOCAB="${NORMTAPE_VOCAB_DIR:-$ROOT/vocab}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 - "$ROOT" "$MB" "$tmp/text.txt" <<'PY'
import sys
root, mb, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
unit = open(root + "/data/tinyshakespeare.txt", "rb").read() + open(root + "/tests/fixtures/tokenizer/unicode.txt", "rb").read()
n = int(mb * 1e6)
open(out, "wb").write((unit * (n // len(unit) + 1))[:n].decode("utf-8", "ignore").encode())
PY
echo "$(nproc) cpus: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); node $(node --version)"
for name in gpt2 cl100k_base o200k_base; do
    node "$ROOT/scripts/tiktoken_reference.mjs" encode "$VOCAB" "$name" "$tmp/text.txt" "$tmp/theirs.bin" | sed 's/^/tiktoken /'
    "$BUILD/bench_tokenizer" --vocab "$VOCAB" --encoding "$name" --input "$tmp/text.txt" --repeat 1 --ids "$tmp/ours.bin"
    cmp -s "$tmp/theirs.bin" "$tmp/ours.bin" && echo "  the same ids" || { echo "  the ids DIFFER"; exit 1; }
done
