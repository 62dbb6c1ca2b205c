#!/usr/bin/env bash
# scripts/bench_train_bpe.sh [BUILD] [MB] [VOCAB...]: train_bpe's time on a text of MB megabytes
# (default 100), by BUILD/train_tokenizer (default build/) with each vocabulary size (default 32768
# and 65536), on all the machine's threads. The text is data/tinyshakespeare.txt's lines drawn at
# random (seed 1) with 15% of their words replaced by random letters, so that, unlike Shakespeare
# repeated, it holds millions of distinct words, as a real corpus does.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
MB="${2:-100}"
shift $(( $# > 2 ? 2 : $# ))
VOCABS=("${@:-32768 65536}")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 - "$ROOT/data/tinyshakespeare.txt" "$MB" "$tmp/text.txt" <<'PY'
import random, sys
random.seed(1)
lines = open(sys.argv[1]).read().split("\n")
letters, want, out, size = "abcdefghijklmnopqrstuvwxyz", int(sys.argv[2]) * 1_000_000, [], 0
while size < want:
    words = random.choice(lines).split(" ")
    for i, w in enumerate(words):
        if w and random.random() < 0.15:
            words[i] = "".join(random.choice(letters[:random.randint(6, 26)]) for _ in range(random.randint(3, 10)))
    line = " ".join(words) + "\n"
    out.append(line)
    size += len(line)
open(sys.argv[3], "w").write("".join(out))
PY
for vocab in ${VOCABS[@]}; do
    "$BUILD/train_tokenizer" --data "$tmp/text.txt" --out "$tmp/bpe$vocab" --vocab "$vocab" --val-fraction 0 | head -2
done
