#!/usr/bin/env bash
# scripts/test.sh: the whole test suite. Installs what is missing (including Debian's
# python3-torch for the PyTorch cross-check), builds, and runs every test through ctest.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_build_deps
install_packages python3 python3-torch
configure_and_build
cd "$BUILD"
ctest --output-on-failure -j "$(nproc)"
