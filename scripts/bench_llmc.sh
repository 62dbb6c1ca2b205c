#!/usr/bin/env bash
# scripts/bench_llmc.sh: GPT-2 124M's training step, train_gpt beside karpathy/llm.c's train_gpt2cu, on
# this machine's GPU, in one run: llm.c built here from its source (with cuDNN attention), both fed
# random tokens (B 16, T 1024, vocabulary 50304, tied, bf16, AdamW with f32 masters), run in turn
# twice; per run the median step time (llm.c's after its first 5 steps, ours over all its steps as
# train_gpt reports it) and the process's largest memory by nvidia-smi (polled every 0.2 s).
#   scripts/bench_llmc.sh LLMC_SRC CUDNN_FRONTEND_INCLUDE TRAIN_GPT OUT_DIR
# LLMC_SRC: a checkout of github.com/karpathy/llm.c (copied, not changed); CUDNN_FRONTEND_INCLUDE:
# the include/ folder of github.com/NVIDIA/cudnn-frontend; TRAIN_GPT: our built train_gpt. With
# CUDA 13, two lines of llm.c need changing, done on the copy: cudaMemAdvise takes a cudaMemLocation,
# and cudnn-frontend needs -lnvrtc -lcuda. Runs: llm.c with -r 1 (GELU recomputed, as ours by
# default) and train_gpt under Normalized with --cuda-graph off and on.
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: scripts/bench_llmc.sh LLMC_SRC CUDNN_FRONTEND_INCLUDE TRAIN_GPT OUT_DIR" >&2; exit 2; }
src=$(cd "$1" && pwd) frontend=$(cd "$2" && pwd) train_gpt=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
out=$(mkdir -p "$4" && cd "$4" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src/." "$work/llm.c"
cd "$work/llm.c"
sed -i 's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    llmc/cuda_utils.cuh
mkdir -p cudnn-frontend && cp -r "$frontend" cudnn-frontend/include  # where its Makefile looks
make train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 \
    NVCC_LDFLAGS="-lcublas -lcublasLt -lnvidia-ml -lcudnn -lnvrtc -lcuda" > "$out/llmc_build.log" 2>&1 ||
    { tail -20 "$out/llmc_build.log"; exit 1; }
# llm.c's token file: 256 int32 of header (magic 20240520, version 1, token count), uint16 tokens.
python3 - "$work/tokens.bin" <<'PY'
import sys, numpy as np
n = 16 * 1024 * 48 + 1
header = np.zeros(256, np.int32); header[:3] = (20240520, 1, n)
tokens = np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16)
with open(sys.argv[1], "wb") as f: f.write(header.tobytes()); f.write(tokens.tobytes())
PY

# run LABEL COMMAND...: runs it with its largest nvidia-smi memory sampled, logs to $out/LABEL.log.
run() {
    local label=$1; shift
    "$@" > "$out/$label.log" 2>&1 &
    local pid=$! peak=0 m
    while kill -0 $pid 2>/dev/null; do
        m=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
            awk -F', ' -v p=$pid '$1 == p {print $2}')
        [ -n "$m" ] && [ "$m" -gt "$peak" ] && peak=$m
        sleep 0.2
    done
    wait $pid || { echo "$label failed:"; tail -5 "$out/$label.log"; exit 1; }
    echo "$peak" > "$out/$label.mib"
}
gpt2=(--layers 12 --heads 12 --embd 768 --seq 1024 --batch 16 --vocab 50304 --tie on --data random --policy normalized
      --steps 40 --log-every 10 --chart "$out/train_gpt.svg")
for round in 1 2; do
    run "llmc_$round" ./train_gpt2cu -i "$work/tokens.bin" -j "$work/tokens.bin" -e d12 -b 16 -t 1024 -r 1 -x 40 \
        -v 1000 -s 1000 -h 0 -n 0
    for g in off on; do
        run "ours_graph_${g}_$round" "$train_gpt" "${gpt2[@]}" --cuda-graph $g --json "$out/ours_graph_${g}_$round.json"
    done
done
python3 - "$out" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
rows = []
for r in (1, 2):
    ms = [float(m) for m in re.findall(r"\| ([0-9.]+) ms \|", open(f"{out}/llmc_{r}.log").read())][5:]
    rows.append((f"llm.c -r 1 ({r})", statistics.median(ms), int(open(f"{out}/llmc_{r}.mib").read())))
    for g in ("off", "on"):
        j = json.load(open(f"{out}/ours_graph_{g}_{r}.json"))["runs"][0]
        rows.append((f"train_gpt, --cuda-graph {g} ({r})", j["step_ms_median"], int(open(f"{out}/ours_graph_{g}_{r}.mib").read())))
base = statistics.median([ms for name, ms, _ in rows if name.startswith("llm.c")])
for name, ms, mib in rows:
    print(f"{name:32s} median step {ms:7.2f} ms  {ms / base:5.3f}x llm.c's  nvidia-smi {mib:6d} MiB")
PY
