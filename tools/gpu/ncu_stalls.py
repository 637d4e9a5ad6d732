#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's source page.

Run on the GPU machine, one kernel launch per file:

    ncu --clock-control none --graph-profiling node -k regex:^moe_down --launch-skip 3 --launch-count 1 \
        --section WarpStateStats --section SourceCounters --page source --print-source sass --csv \
        build-cuda/tern-cuda-tests --time --only moe > down.csv
    python3 tools/gpu/ncu_stalls.py down.csv [--top 20]

Prints, as markdown, the kernel's sampled stall reasons (share of all warp
samples) and the SASS lines that hold the most samples with their reasons:
e.g. `long_sb` on the first use of a global load is waiting for DRAM/L2,
`no_inst` is instruction-cache misses, `barrier` is __syncthreads. Lines
before the CSV header (the program's own output) are skipped. Only the
standard library.
"""
import argparse
import csv
import io
import sys


def kernel_tables(lines):
    """(kernel name, rows) for each kernel's source table in the file."""
    out, name, i = [], "?", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith('"Kernel Name"'):
            name = next(csv.reader([line]))[1]
        if line.startswith('"Address"'):
            j = i + 1
            while j < len(lines) and lines[j].startswith('"') and not lines[j].startswith('"Kernel Name"'):
                j += 1
            out.append((name, list(csv.reader(io.StringIO("\n".join(lines[i:j]))))))
            i = j
            continue
        i += 1
    return out


def as_int(v):
    try:
        return int(v or 0)
    except ValueError:
        return 0


def report(name, rows, top):
    head, data = rows[0], rows[1:]
    ix = {k: i for i, k in enumerate(head)}
    reasons = [k for k in head if k.startswith("stall_") and "Not Issued" not in k]
    samples_col = ix.get("Warp Stall Sampling (All Samples)")
    if samples_col is None:
        print(f"{name}: no stall samples in this table", file=sys.stderr)
        return
    totals = {k: 0 for k in reasons}
    lines, total = [], 0
    for r in data:
        n = as_int(r[samples_col])
        total += n
        per = {k[6:]: as_int(r[ix[k]]) for k in reasons if as_int(r[ix[k]])}
        for k in reasons:
            totals[k] += as_int(r[ix[k]])
        lines.append((n, r[ix["Source"]].strip(), per))
    print(f"\n### {name}: {total} warp samples over {len(data)} SASS lines\n")
    ex_col = ix.get("Instructions Executed")
    if ex_col is not None:
        # each SASS instruction is 16 bytes; code run once per launch comes
        # cold from L2 (tools/gpu/icacheprobe.cu: ~45 ns per KB)
        run = sum(1 for r in data if as_int(r[ex_col]) > 0)
        print(f"executed code: {run} of {len(data)} SASS lines, {run * 16 / 1024:.1f} KB; "
              f"warp instructions executed: {sum(as_int(r[ex_col]) for r in data)}\n")
    print("| stall reason | samples | share |")
    print("|---|---:|---:|")
    for k, v in sorted(totals.items(), key=lambda kv: -kv[1]):
        if v:
            print(f"| {k[6:]} | {v} | {100 * v / max(total, 1):.1f} % |")
    print("\n| samples | SASS | reasons |")
    print("|---:|---|---|")
    for n, src, per in sorted(lines, key=lambda x: -x[0])[:top]:
        why = ", ".join(f"{k} {v}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
        print(f"| {n} | `{src[:70]}` | {why} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=20, help="SASS lines to list per kernel (default 20)")
    a = ap.parse_args()
    for path in a.csv:
        try:
            with open(path, errors="replace") as f:
                tables = kernel_tables(f.read().splitlines())
        except OSError as e:
            sys.exit(f"ncu_stalls: {path}: {e.strerror}")
        if not tables:
            print(f"{path}: no source table (was --page source --csv given?)", file=sys.stderr)
        for name, rows in tables:
            report(name, rows, a.top)


if __name__ == "__main__":
    main()
