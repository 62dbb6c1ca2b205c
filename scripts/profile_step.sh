#!/usr/bin/env bash
# scripts/profile_step.sh: where a training step's GPU time goes, normtape beside PyTorch eager.
# Nsight Compute (ncu) times every kernel of train_gpt's gpt2-medium-ish preset and of
# scripts/bench_torch_gpt.py's same model, both cut to --layers LAYERS (default 2: the 12 layers
# only repeat), and the kernels of each framework's last step (forward, backward, optimizer) are
# summed by category: GEMM, attention, norms, elementwise (with bias gradients, cuBLASLt's included,
# and copies),
# cross-entropy, optimizer (with the gradient norm), other. A step begins at its embedding lookup.
# ncu runs each kernel alone (caches flushed, clocks as the GPU sets them): the sums are kernel
# time, without the gaps between kernels.
#   scripts/profile_step.sh BUILD_DIR OUT_DIR [LAYERS]
# Writes OUT_DIR/profile_ours.csv, profile_torch.csv (ncu's raw rows) and profile.md (the table).
# Needs an NVIDIA GPU, ncu, and a python3 with CUDA torch.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/profile_step.sh BUILD_DIR OUT_DIR [LAYERS]" >&2; exit 2; }
BUILD="$1" OUT="$2" LAYERS="${3:-2}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT"
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
[ -n "$NCU" ] || { echo "profile_step: ncu not found" >&2; exit 2; }
ncu_times() {  # ncu_times CSV COMMAND...: every kernel's duration, in launch order
    local csv=$1; shift
    timeout 420 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
        --print-kernel-base function "$@" > "$csv" 2> "${csv%.csv}.err"
}
ncu_times "$OUT/profile_ours.csv" "$BUILD/train_gpt" --preset gpt2-medium-ish --layers "$LAYERS" --policy input \
    --steps 2 --log-every 1 || { echo "profile_step: ncu on train_gpt failed"; tail -5 "$OUT/profile_ours.err"; exit 1; }
ncu_times "$OUT/profile_torch.csv" python3 "$ROOT/scripts/bench_torch_gpt.py" --layers "$LAYERS" --steps 1 ||
    { echo "profile_step: ncu on bench_torch_gpt.py failed"; tail -5 "$OUT/profile_torch.err"; exit 1; }
python3 - "$OUT" "$LAYERS" <<'PY'
import csv, io, re, sys
out, layers = sys.argv[1], sys.argv[2]
# First match wins; names are ncu's function names of both frameworks' kernels.
CATEGORIES = [
    ("attention", r"flash|fmha|sdpa|attention|cudnn|dot_do_o"),
    ("cross-entropy", r"cross_entropy|softmax|nll_loss"),
    ("norms", r"norm_(forward|backward|param)|layer_norm|rms_norm|GammaBeta|RowwiseMoments|ComputeInternalGradients"),
    ("optimizer", r"adam|multi_tensor|clip_coef|grad_scale|grad_sum_squares"),
    ("GEMM", r"gemm|nvjet|xmma|cutlass|cublas|sm90_|sm80_|splitKreduce"),
    ("elementwise", r"elementwise|map_(vector|scalar)_kernel|gelu|column_sum|Bgrad|reduce_kernel|copy|fill|sum_partial|"
                    r"single_block_sum"),
]
ORDER = [c for c, _ in CATEGORIES] + ["other"]
STEP_START = r"embedding_forward_kernel|vectorized_gather_kernel"

def last_step(path):
    text = open(path).read()
    rows = list(csv.reader(io.StringIO("\n".join(l for l in text.splitlines() if l.startswith('"')))))
    hdr = rows[0]
    name_at, time_at = hdr.index("Kernel Name"), hdr.index("gpu__time_duration.sum")
    kernels = [(r[name_at], float(r[time_at].replace(",", ""))) for r in rows[2:] if len(r) > time_at]
    starts = [i for i, (n, _) in enumerate(kernels) if re.search(STEP_START, n)]
    # Where the positions are a second lookup, a step starts at the first of the two.
    firsts = [i for k, i in enumerate(starts) if k == 0 or i - starts[k - 1] > 4]
    return kernels[firsts[-1]:] if firsts else kernels

def by_category(kernels):
    ms = {c: 0.0 for c in ORDER}
    names = {c: {} for c in ORDER}
    for n, ns in kernels:
        cat = next((c for c, pat in CATEGORIES if re.search(pat, n, re.I)), "other")
        ms[cat] += ns / 1e6
        names[cat][n] = names[cat].get(n, 0.0) + ns / 1e6
    return ms, names

lo, lt = last_step(f"{out}/profile_ours.csv"), last_step(f"{out}/profile_torch.csv")
ours, torch_ = by_category(lo), by_category(lt)
to, tt = sum(ours[0].values()), sum(torch_[0].values())
lines = [f"Kernel time of one training step, gpt2-medium-ish preset at {layers} layers (ncu; ms, % of the step;",
         f"{len(lo)} kernels of normtape's step, {len(lt)} of PyTorch's)", "",
         "| category | normtape ms | % | PyTorch eager ms | % | ours / torch |", "|---|---|---|---|---|---|"]
for c in ORDER:
    a, b = ours[0][c], torch_[0][c]
    ratio = f"{a / b:.2f}" if b > 0 else "-"
    lines.append(f"| {c} | {a:.3f} | {100 * a / to:.1f} | {b:.3f} | {100 * b / tt:.1f} | {ratio} |")
lines.append(f"| **total** | **{to:.3f}** | 100 | **{tt:.3f}** | 100 | **{to / tt:.2f}** |")
lines += ["", "Largest kernels per category (ms):"]
for label, (_, names) in (("normtape", ours), ("PyTorch", torch_)):
    for c in ORDER:
        top = sorted(names[c].items(), key=lambda kv: -kv[1])[:3]
        if top:
            lines.append(f"- {label} {c}: " + "; ".join(f"{n[:60]} {t:.3f}" for n, t in top))
open(f"{out}/profile.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
