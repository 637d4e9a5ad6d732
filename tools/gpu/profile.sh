#!/usr/bin/env bash
# profile.sh OUT_DIR [KERNEL_REGEX] — on the GPU machine, with build-cuda/tern (or $TERN):
#   1. every kernel of a short full-shape run, timed alone (Nsight Compute; the clocks left alone), and the
#      per-kernel tables of one decode step and one prefill piece (tools/gpu/ncu_steps.py);
#   2. for the kernels matching KERNEL_REGEX (default: the experts, the one-token GEMVs and the grouped-expert
#      GEMM), one launch each with the sections that say why a kernel is slow: speed of light, memory
#      workload, warp stall reasons, occupancy, launch statistics;
#   3. for the same kernels, the stall samples per SASS line (tools/gpu/ncu_stalls.py: which loads,
#      barriers or instruction fetches the warps wait on).
# Outputs go to OUT_DIR (steps.csv, steps.md, detail.txt, src_KERNEL.csv, stalls.md).
set -euo pipefail
out=${1:?usage: profile.sh OUT_DIR [KERNEL_REGEX]}
regex=${2:-moe_gate_up_d_kernel|moe_gate_up_kernel|moe_down_kernel|gemv1_kernel|gemv1s_kernel|moeg_gemm_kernel}
tern=${TERN:-build-cuda/tern}
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
run=("$tern" bench --synth qwen3.6-35b-a3b --device cuda --force --bits 4 -p 512 -n 2 -c 2 -r 1 --top-k 20)

echo "profile: every kernel of ${run[*]}" >&2
"$ncu" --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
    --log-file "$out/steps.csv" "${run[@]}" > "$out/bench.txt" 2>&1
python3 "$here/ncu_steps.py" "$out/steps.csv" > "$out/steps.md"

echo "profile: sections of one launch of each kernel matching /$regex/" >&2
: > "$out/detail.txt"
for k in ${regex//|/ }; do
    "$ncu" --clock-control none --graph-profiling node -k "regex:^$k" --launch-skip 40 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section Occupancy --section LaunchStats "${run[@]}" >> "$out/detail.txt" 2>&1 || true
done
echo "profile: stall samples per SASS line of the same kernels" >&2
: > "$out/stalls.md"
for k in ${regex//|/ }; do
    "$ncu" --clock-control none --graph-profiling node -k "regex:^$k" --launch-skip 40 --launch-count 1 \
        --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
        "${run[@]}" > "$out/src_$k.csv" 2>&1 || true
    python3 "$here/ncu_stalls.py" "$out/src_$k.csv" >> "$out/stalls.md" 2>&1 || true
done
echo "profile: $out/steps.md, $out/detail.txt, $out/stalls.md" >&2
