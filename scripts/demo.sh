#!/usr/bin/env bash
# scripts/demo.sh: the main job. Installs what is missing, builds, and trains the byte-level GPT
# twice, once per norm save policy, on data/tinyshakespeare.txt (or --data FILE), then prints the
# side-by-side memory table and writes train_gpt.svg and train_gpt.json.
# Extra arguments go to train_gpt (see build/train_gpt --help).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_build_deps
configure_and_build train_gpt
"$BUILD/train_gpt" --policy both --json train_gpt.json --chart train_gpt.svg "$@"
