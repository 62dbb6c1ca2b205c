#!/usr/bin/env bash
# scripts/profile_step.sh: where a training step's GPU time goes, normtape beside PyTorch eager and
# torch.compile. Nsight Compute (ncu) times every kernel of train_gpt's gpt2-medium-ish preset (under
# POLICY, default normalized, with GELU recompute: the preset's default) and of
# scripts/bench_torch_gpt.py's same model, eager and compiled, all cut to LAYERS layers (default 2:
# the 12 layers only repeat), and the kernels of each one's last step (forward, backward, optimizer)
# are summed by category: GEMM, attention, norms, elementwise (with bias gradients, cuBLASLt's
# included, and copies), cross-entropy, optimizer (with the gradient norm), other. A step begins at
# its embedding lookup. ncu runs each kernel alone (caches flushed, clocks as the GPU sets them): the
# sums are kernel time, without the gaps between kernels; the same runs without ncu give each one's
# step time by CUDA events, and the difference is the time the GPU waits between kernels.
#   scripts/profile_step.sh BUILD_DIR OUT_DIR [LAYERS] [POLICY]
# Writes OUT_DIR/profile_{ours,eager,compile}.csv (ncu's raw rows), the runs' logs and profile.md.
# Needs an NVIDIA GPU, ncu, and a python3 with CUDA torch.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/profile_step.sh BUILD_DIR OUT_DIR [LAYERS] [POLICY]" >&2; exit 2; }
BUILD="$1" OUT="$2" LAYERS="${3:-2}" POLICY="${4:-normalized}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUT"
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
[ -n "$NCU" ] || { echo "profile_step: ncu not found" >&2; exit 2; }
ncu_times() {  # ncu_times CSV [NCU FLAGS] COMMAND...: every kernel's duration, in launch order
    local csv=$1 flags=(); shift
    [ "$1" = --target-processes ] && { flags=("$1" "$2"); shift 2; }
    timeout 420 "$NCU" --clock-control none "${flags[@]}" --metrics gpu__time_duration.sum --csv --page raw \
        --print-units base --print-kernel-base function "$@" > "$csv" 2> "${csv%.csv}.err"
}
ours=("$BUILD/train_gpt" --preset gpt2-medium-ish --layers "$LAYERS" --policy "$POLICY" --log-every 1)
torch=(python3 "$ROOT/scripts/bench_torch_gpt.py" --layers "$LAYERS")
ncu_times "$OUT/profile_ours.csv" "${ours[@]}" --steps 2 ||
    { echo "profile_step: ncu on train_gpt failed"; tail -5 "$OUT/profile_ours.err"; exit 1; }
ncu_times "$OUT/profile_eager.csv" "${torch[@]}" --steps 1 ||
    { echo "profile_step: ncu on bench_torch_gpt.py failed"; tail -5 "$OUT/profile_eager.err"; exit 1; }
# Inductor's compile workers are processes of their own: ncu follows only the one that trains.
ncu_times "$OUT/profile_compile.csv" --target-processes application-only "${torch[@]}" --steps 1 --compile ||
    { echo "profile_step: ncu on bench_torch_gpt.py --compile failed"; tail -5 "$OUT/profile_compile.err"; exit 1; }
# The step times by CUDA events, without ncu.
"${ours[@]}" --steps 12 > "$OUT/profile_ours_events.log" 2>&1
"${torch[@]}" --steps 10 > "$OUT/profile_eager_events.log" 2>&1
"${torch[@]}" --steps 10 --compile > "$OUT/profile_compile_events.log" 2>&1
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
STEP_START = r"embedding_forward_kernel|vectorized_gather_kernel|fused_add_embedding_native"

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

def event_ms(path):
    """forward + backward + optimizer medians (ms) of a train_gpt or bench_torch_gpt.py log."""
    m = re.search(r"forward ([0-9.]+) ms \| backward ([0-9.]+) ms \| optimizer ([0-9.]+) ms", open(path).read())
    return sum(float(x) for x in m.groups()) if m else float("nan")

runs = [("normtape", "ours"), ("PyTorch eager", "eager"), ("torch.compile", "compile")]
steps = {key: last_step(f"{out}/profile_{key}.csv") for _, key in runs}
cats = {key: by_category(k) for key, k in steps.items()}
total = {key: sum(c[0].values()) for key, c in cats.items()}
lines = [f"Kernel time of one training step, gpt2-medium-ish preset at {layers} layers (ncu; ms, % of the step;",
         ", ".join(f"{len(steps[key])} kernels of {label}'s step" for label, key in runs) + ")", "",
         "| category | normtape ms | % | eager ms | % | compile ms | % | ours / eager | ours / compile |",
         "|---|---|---|---|---|---|---|---|---|"]
ratio = lambda a, b: f"{a / b:.2f}" if b > 0 else "-"
for c in ORDER:
    a, e, k = (cats[key][0][c] for key in ("ours", "eager", "compile"))
    lines.append(f"| {c} | {a:.3f} | {100 * a / total['ours']:.1f} | {e:.3f} | {100 * e / total['eager']:.1f} "
                 f"| {k:.3f} | {100 * k / total['compile']:.1f} | {ratio(a, e)} | {ratio(a, k)} |")
lines.append(f"| **kernels** | **{total['ours']:.3f}** | 100 | **{total['eager']:.3f}** | 100 | **{total['compile']:.3f}** "
             f"| 100 | **{ratio(total['ours'], total['eager'])}** | **{ratio(total['ours'], total['compile'])}** |")
wall = {key: event_ms(f"{out}/profile_{key}_events.log") for _, key in runs}
lines.append(f"| step by CUDA events (no ncu) | {wall['ours']:.3f} | | {wall['eager']:.3f} | | {wall['compile']:.3f} | "
             f"| {ratio(wall['ours'], wall['eager'])} | {ratio(wall['ours'], wall['compile'])} |")
lines += ["", "Largest kernels per category (ms):"]
for label, key in runs:
    for c in ORDER:
        top = sorted(cats[key][1][c].items(), key=lambda kv: -kv[1])[:3]
        if top:
            lines.append(f"- {label} {c}: " + "; ".join(f"{n[:60]} {t:.3f}" for n, t in top))
open(f"{out}/profile.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
