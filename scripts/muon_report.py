#!/usr/bin/env python3
"""The table and the validation curves of scripts/gpu_check.sh muon-shakespeare.

  python3 scripts/muon_report.py GPU_OUT [--markdown FILE] [--svg FILE]

Reads GPU_OUT/muon_{ARCH}_{adamw,muon}.json (train_gpt --json), GPU_OUT/muon_{ARCH}_muon_lr{LR}.json
(train_gpt --optimizer muon --muon-lr LR) and GPU_OUT/muon_{ARCH}_muon_torch.json
(scripts/train_torch_shakespeare.py --json), ARCH in gpt2, nanochat, llama; a missing file is a row
left out. The target is the gpt2 + AdamW run's best validation loss: for each run, the first
evaluated step whose validation loss is at or below it, and that step over the gpt2 + AdamW run's
step of its best (its fraction of the steps the reference needed); and the same for the loss every
run reaches, the highest of the runs' best losses (where the target is below some runs' best).
Prints the markdown table (also written to --markdown) and draws every run's validation curve into
--svg.
"""
import argparse
import glob
import json
import os
import sys

ARCHS = ("gpt2", "nanochat", "llama")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def runs_of(out):
    """(label, steps, val losses, train seconds, peak bytes or None) per run found, ours then PyTorch's."""
    runs = []
    for arch in ARCHS:
        for optimizer in ("adamw", "muon"):
            j = load(os.path.join(out, f"muon_{arch}_{optimizer}.json"))
            if j:
                r = j["runs"][0]
                runs.append((f"{arch} + {optimizer}, normtape", r["val_steps"], r["val_losses"], r["train_seconds"],
                             r["peak_allocated_bytes"]))
        for path in sorted(glob.glob(os.path.join(out, f"muon_{arch}_muon_lr*.json"))):
            r = load(path)["runs"][0]
            lr = os.path.basename(path)[len(f"muon_{arch}_muon_lr"):-len(".json")]
            runs.append((f"{arch} + muon (lr {lr}), normtape", r["val_steps"], r["val_losses"], r["train_seconds"],
                         r["peak_allocated_bytes"]))
        j = load(os.path.join(out, f"muon_{arch}_muon_torch.json"))
        if j:
            evals = j["evaluations"]
            runs.append((f"{arch} + muon, PyTorch", [e["step"] for e in evals], [e["val_loss"] for e in evals],
                         j["train_time_s"], j.get("peak_allocated_bytes")))
    return runs


def first_at_or_below(steps, losses, target):
    return next((s for s, v in zip(steps, losses) if v <= target), None)


def table(runs):
    reference = next((r for r in runs if r[0] == "gpt2 + adamw, normtape"), None)
    if reference is None:
        return "no gpt2 + AdamW run of normtape: nothing to compare with\n"
    target = min(reference[2])
    common = max(min(r[2]) for r in runs)  # every run reaches it
    ref_target = first_at_or_below(reference[1], reference[2], target)
    ref_common = first_at_or_below(reference[1], reference[2], common)
    lines = [f"Targets: the gpt2 + AdamW run's best validation loss, {target:.4f} (step {ref_target}), and "
             f"{common:.4f}, the highest of the runs' best losses, which every run reaches (gpt2 + AdamW: step "
             f"{ref_common}).", "",
             f"| run | best validation loss (step) | first step at or below {target:.4f} (of gpt2 + AdamW's) "
             f"| first step at or below {common:.4f} (of gpt2 + AdamW's) | training time, s | peak allocated, MiB |",
             "|---|---|---|---|---|---|"]
    for label, steps, losses, seconds, peak in runs:
        best = min(losses)
        cells = []
        for level, ref in ((target, ref_target), (common, ref_common)):
            reached = first_at_or_below(steps, losses, level)
            cells.append(f"{reached} ({reached / ref:.2f})" if reached else "not reached")
        lines.append(f"| {label} | {best:.4f} ({steps[losses.index(best)]}) | {cells[0]} | {cells[1]} | "
                     f"{seconds:.1f} | {f'{peak / 2**20:,.0f}' if peak else '-'} |")
    return "\n".join(lines) + "\n"


def svg(runs, path):
    """The validation curves, one polyline per run, on a 720 x 420 canvas."""
    w, h, left, right, top, bottom = 720, 420, 60, 200, 20, 40
    steps = [s for r in runs for s in r[1]]
    losses = [v for r in runs for v in r[2]]
    x0, x1 = 0, max(steps)
    y0, y1 = min(losses) - 0.02, min(max(losses), min(losses) + 1.0)
    def px(s): return left + (s - x0) / (x1 - x0) * (w - left - right)
    def py(v): return top + (y1 - min(v, y1)) / (y1 - y0) * (h - top - bottom)
    colors = ["#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{left}" y="{h - 8}">step</text><text x="4" y="{top + 8}">val loss</text>']
    for k in range(6):
        v = y0 + (y1 - y0) * k / 5
        parts.append(f'<text x="4" y="{py(v) + 4:.1f}">{v:.2f}</text>'
                     f'<line x1="{left}" x2="{w - right}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#ddd"/>')
    for k in range(6):
        s = x0 + (x1 - x0) * k / 5
        parts.append(f'<text x="{px(s) - 10:.1f}" y="{h - bottom + 14}">{s:.0f}</text>')
    for i, (label, st, vs, _, _) in enumerate(runs):
        c = colors[i % len(colors)]
        dash = ' stroke-dasharray="4 3"' if "PyTorch" in label else ""
        points = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in zip(st, vs))
        parts.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5"{dash} points="{points}"/>')
        parts.append(f'<line x1="{w - right + 10}" x2="{w - right + 30}" y1="{top + 14 * i + 6}" y2="{top + 14 * i + 6}" '
                     f'stroke="{c}" stroke-width="2"{dash}/><text x="{w - right + 34}" y="{top + 14 * i + 10}">{label}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the directory of the runs' JSON files")
    parser.add_argument("--markdown", help="write the table here")
    parser.add_argument("--svg", help="draw the validation curves here")
    a = parser.parse_args()
    runs = runs_of(a.out)
    if not runs:
        sys.exit(f"muon_report.py: no runs' JSON in {a.out}")
    text = table(runs)
    print(text, end="")
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    if a.svg:
        svg(runs, a.svg)


if __name__ == "__main__":
    main()
