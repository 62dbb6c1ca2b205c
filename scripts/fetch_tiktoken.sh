#!/usr/bin/env bash
# scripts/fetch_tiktoken.sh [DIR]: the real encodings for normtape's BPE tokenizer and their
# reference encoder. Fetches the npm package `tiktoken` (the WASM build of OpenAI's tokenizer, a
# pinned version whose SHA-256 is checked) from the npm registry into DIR/tiktoken (default DIR:
# vocab/ of the source tree, ignored by git), then writes gpt2, cl100k_base and o200k_base as
# tiktoken rank files with their split patterns and special tokens (DIR/NAME.tiktoken,
# DIR/NAME.json), each rank checked against the WASM encoder (scripts/tiktoken_reference.mjs, which
# also encodes files for the tests). Needs node (Debian's nodejs) and python3; a package already
# unpacked is used as it is. Exits 2 when node is missing or the registry cannot be reached.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/vocab}"
VERSION=1.0.22
SHA256=55c339e756fdb17604f7c7e3eb35d2bcbffe4d960e8096e50285d1cefa51dd90
for tool in node python3; do
    command -v "$tool" >/dev/null || { echo "fetch_tiktoken: $tool not found (apt-get install nodejs python3)" >&2; exit 2; }
done
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
if [ ! -f "$DIR/tiktoken/package.json" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 - "https://registry.npmjs.org/tiktoken/-/tiktoken-$VERSION.tgz" "$SHA256" "$tmp/tiktoken.tgz" <<'PY' || exit 2
import hashlib, sys, urllib.request
url, want, out = sys.argv[1:]
try:
    data = urllib.request.urlopen(url, timeout=60).read()
except OSError as e:
    sys.exit(f"fetch_tiktoken: cannot fetch {url}: {e}")
if hashlib.sha256(data).hexdigest() != want:
    sys.exit(f"fetch_tiktoken: {url} has SHA-256 {hashlib.sha256(data).hexdigest()}, expected {want}")
open(out, "wb").write(data)
PY
    tar xzf "$tmp/tiktoken.tgz" -C "$tmp"
    mv "$tmp/package" "$DIR/tiktoken"
fi
node "$ROOT/scripts/tiktoken_reference.mjs" export "$DIR"
