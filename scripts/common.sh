# scripts/common.sh: sourced by demo.sh, test.sh and install_check.sh. Installs what is missing
# (Debian/Ubuntu, through apt-get as root or with sudo, only when a package is absent), then
# configures and builds into build/ (Release), or $BUILD with extra CMake arguments in CMAKE_ARGS.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NORMTAPE_BUILD_DIR:-$ROOT/build}"
CMAKE_ARGS=()

# install_packages PKG...: apt-get install the packages that dpkg does not list as installed.
install_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "normtape: installing ${missing[*]}"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || { echo "normtape: need root or sudo to install ${missing[*]}" >&2; exit 1; }
        sudo="sudo"
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The build's own needs: compiler, CMake, Eigen, doctest, CLI11, nlohmann-json, xxHash (its
# header only: the checksums of safetensors files), and OpenMPI (mpirun, and the collectives of cpu
# tensors: core/distributed.h).
install_build_deps() {
    install_packages g++ cmake make libeigen3-dev doctest-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev \
        libopenmpi-dev openmpi-bin
}

# configure_and_build [TARGET...]: every target when none is named. The CUDA backend is built when
# nvcc is found (on the PATH, or where the CUDA toolkit installs it) unless CMAKE_ARGS says
# -DNORMTAPE_CUDA=OFF.
configure_and_build() {
    if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
    # Only the project's own lines of CMake's output (the CUDA architectures chosen, say).
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${CMAKE_ARGS[@]}" | sed -n 's/^-- normtape: /normtape: /p'
    local targets=()
    [ $# -gt 0 ] && targets=(--target "$@")
    cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}"
}
