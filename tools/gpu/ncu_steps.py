#!/usr/bin/env python3
"""Per-kernel tables of a tern GPU run from Nsight Compute's CSV.

Run on the GPU machine (kernels are timed alone: --graph-profiling node
profiles each node of a captured decode graph; --clock-control none leaves
the clocks alone):

    ncu --clock-control none --graph-profiling node \
        --metrics gpu__time_duration.sum --csv --log-file run.csv \
        tern bench --synth qwen3.6-35b-a3b --device cuda --force -p 512 -n 2 -c 2 -r 1
    python3 tools/gpu/ncu_steps.py run.csv

Prints, as markdown, one decode step (the kernels after the next-to-last
lm_head up to the last one; the lm_head is the longest one-token kernel) and
the prefill (every kernel before the first one-token GEMV, divided by the
number of prefill pieces, counted by a per-layer prefill kernel). Only the
standard library.
"""
import argparse
import collections
import csv
import re
import sys


def load(path):
    rows = []
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if len(r) < 15 or r[0] == "ID" or r[12] != "gpu__time_duration.sum":
                continue
            name = re.sub(r"\(.*", "", r[4].replace("void ", ""))
            unit = r[13]
            value = float(r[14].replace(",", ""))
            us = value / 1000.0 if unit == "ns" else value * 1000.0 if unit == "ms" else value
            rows.append((name, r[7], r[8], us))
    return rows


def table(title, kernels, divide=1.0):
    agg = collections.OrderedDict()
    total = 0.0
    for name, block, grid, us in kernels:
        a = agg.setdefault((name, block, grid), [0, 0.0])
        a[0] += 1
        a[1] += us
        total += us
    print(f"\n### {title}: {total / divide:,.1f} us in {len(kernels) / divide:.0f} kernels\n")
    print("| kernel | block | grid | count | us each | us total | share |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (name, block, grid), (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name[:60]} | {block} | {grid} | {n / divide:g} | {us / n:.2f} | {us / divide:,.1f} | "
              f"{100 * us / total:.1f} % |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--head-us", type=float, default=50.0,
                    help="a one-token kernel at least this long is the lm_head (default 50)")
    ap.add_argument("--piece-kernel", default="gdnc_chunk_kernel",
                    help="a prefill kernel launched once per DeltaNet layer and piece")
    ap.add_argument("--gdn-layers", type=int, default=30)
    a = ap.parse_args()
    rows = load(a.csv)
    if not rows:
        sys.exit(f"{a.csv}: no gpu__time_duration.sum rows")
    one_token = [i for i, r in enumerate(rows) if r[0].startswith("gemv1")]
    heads = [i for i in one_token if rows[i][3] >= a.head_us]
    if len(heads) >= 2:
        table("one decode step", rows[heads[-2] + 1:heads[-1] + 1])
    else:
        print("fewer than two one-token lm_head kernels: no decode step", file=sys.stderr)
    first = one_token[0] if one_token else len(rows)
    pre = rows[:first]
    pieces = sum(1 for r in pre if r[0] == a.piece_kernel) / a.gdn_layers
    if pieces >= 1:
        table(f"prefill, per piece ({pieces:g} pieces)", pre, divide=pieces)


if __name__ == "__main__":
    main()
