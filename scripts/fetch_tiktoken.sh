#!/usr/bin/env bash
# scripts/fetch_tiktoken.sh [DIR]: the real encodings for normtape's BPE tokenizer and their
# reference encoder. Fetches the npm package `tiktoken` (the WASM build of OpenAI's tokenizer, a
# pinned version) into DIR/tiktoken (default DIR: vocab/ of the source tree, ignored by git), then
# writes gpt2, cl100k_base and o200k_base as tiktoken rank files with their split patterns and
# special tokens (DIR/NAME.tiktoken, DIR/NAME.json), each rank checked against the WASM encoder
# (scripts/tiktoken_reference.mjs, which also encodes files for the tests). Needs node and npm
# (Debian's nodejs and npm) and the npm registry; a package already unpacked is used as it is.
# Exits 2 when node or npm is missing or the registry cannot be reached.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/vocab}"
VERSION=1.0.22
for tool in node npm; do
    command -v "$tool" >/dev/null || { echo "fetch_tiktoken: $tool not found (apt-get install nodejs npm)" >&2; exit 2; }
done
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
if [ ! -f "$DIR/tiktoken/package.json" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && npm pack --silent "tiktoken@$VERSION" > /dev/null) ||
        { echo "fetch_tiktoken: npm could not fetch tiktoken@$VERSION" >&2; exit 2; }
    tar xzf "$tmp/tiktoken-$VERSION.tgz" -C "$tmp"
    mv "$tmp/package" "$DIR/tiktoken"
fi
node "$ROOT/scripts/tiktoken_reference.mjs" export "$DIR"
