#!/usr/bin/env bash
# scripts/gpu_profile.sh: Nsight Compute's hardware counters for chosen launches of the fast norm
# kernels in bench_norms; needs an NVIDIA GPU and Nsight Compute's ncu (see docs/PERFORMANCE.md).
#   scripts/gpu_profile.sh BENCH LABEL:DTYPE:N:SKIP...
#   e.g. scripts/gpu_profile.sh build-gpu/bench_norms fwd3000:bf16:3000:3 bin1024:bf16:1024:49
# SKIP counts the launches of *fast_kernel in `bench_norms --n N --dtype DTYPE` before the one
# profiled: 3 warm-ups and 20 runs per case (23 launches), in this order for layer, then for rms
# from 161 on: forward 0-22, forward normalized 23-45, backward input 46-68, output 69-91,
# normalized 92-114, +residual forward 115-137, +residual backward 138-160. For each launch it prints time, DRAM throughput and bytes, achieved
# occupancy, issue-slot use, instructions, registers, hit rates, shared-memory loads, wavefronts
# and bank conflicts, the L1's and the LSU and XU pipes' use, the largest warp stall reasons
# (cycles per issued instruction), and ncu's occupancy limits. Raw CSV goes to $GPU_OUT/ncu
# (default gpu_out/ncu in the repository).
set -u
[ $# -ge 2 ] || { echo "usage: scripts/gpu_profile.sh BENCH LABEL:DTYPE:N:SKIP..." >&2; exit 2; }
GPU_OUT="${GPU_OUT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/gpu_out}"; mkdir -p "$GPU_OUT/ncu"
BIN="$1"; shift
NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__grid_size,launch__block_size,lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
M="$M,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
M="$M,smsp__inst_executed_op_shared_ld.sum,l1tex__throughput.avg.pct_of_peak_sustained_active"
M="$M,smsp__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
for spec in "$@"; do
  IFS=: read -r label dtype n skip <<< "$spec"
  timeout 120 "$NCU" --clock-control none -k regex:fast_kernel --launch-skip "$skip" --launch-count 1 --metrics "$M" \
    --csv --page raw --print-units base "$BIN" --n "$n" --dtype "$dtype" > "$GPU_OUT/ncu/$label.csv" 2> "$GPU_OUT/ncu/$label.err" || echo "ncu $label failed"
done
python3 - "$GPU_OUT/ncu" "$@" <<'PY'
import csv, sys, os, io
d = sys.argv[1]
for spec in sys.argv[2:]:
    label = spec.split(":")[0]
    try:
        text = open(os.path.join(d, label + ".csv")).read()
        lines = [l for l in text.splitlines() if l.startswith('"')]
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
        hdr, vals = rows[0], rows[2]
        m = dict(zip(hdr, vals))
    except Exception as e:
        print(label, "no data", e); continue
    def g(k):
        try: return float(m[k].replace(",", ""))
        except: return float("nan")
    stalls = sorted(((g(k), k.split("stalled_")[1].split("_per_issue")[0]) for k in hdr if "issue_stalled" in k), reverse=True)
    print(f"{label:14} t={g('gpu__time_duration.sum')/1e3:7.1f}us dram={g('dram__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f}% "
          f"rd={g('dram__bytes_read.sum')/2**20:6.0f}MiB wr={g('dram__bytes_write.sum')/2**20:6.0f}MiB occ={g('sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f}% "
          f"issue={g('smsp__issue_active.avg.pct_of_peak_sustained_active'):5.1f}% inst={g('smsp__inst_executed.sum')/1e6:6.1f}M regs={g('launch__registers_per_thread'):.0f} "
          f"blk={g('launch__block_size'):.0f} grid={g('launch__grid_size'):.0f} L2hit={g('lts__t_sector_hit_rate.pct'):4.1f} L1hit={g('l1tex__t_sector_hit_rate.pct'):4.1f}")
    print(f"    shared: {g('smsp__inst_executed_op_shared_ld.sum')/1e6:.1f}M loads, "
          f"{g('l1tex__data_pipe_lsu_wavefronts_mem_shared.sum')/1e6:.1f}M wavefronts, "
          f"{g('l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum')/1e6:.2f}M bank conflicts; "
          f"L1 throughput {g('l1tex__throughput.avg.pct_of_peak_sustained_active'):.1f}%, "
          f"LSU pipe {g('smsp__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active'):.1f}%, "
          f"XU pipe {g('smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active'):.1f}%")
    print("    stalls/issue: " + ", ".join(f"{n}={v:.2f}" for v, n in stalls[:7]))
PY
for spec in "$@"; do
  IFS=: read -r label dtype n skip <<< "$spec"
  echo "== $label occupancy"
  timeout 120 "$NCU" --clock-control none -k regex:fast_kernel --launch-skip "$skip" --launch-count 1 --section LaunchStats \
    --section Occupancy "$BIN" --n "$n" --dtype "$dtype" 2>&1 |
    grep -E "Block Limit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size" | sed 's/  */ /g'
done
