#!/usr/bin/env python3
"""sass_sizes.py FILE.cubin [FILE.cubin ...] [--top N] [--match TEXT]

The SASS size of every kernel in a cubin (the .text.<kernel> sections of
its ELF), largest first, with demangled names where c++filt exists. Code
that a launch runs once comes cold from L2 at ~45 ns a KB on the H200
(tools/gpu/icacheprobe.cu, docs/experiments/cuda-moe.md, step 56), so a kernel's size
and how many of its instances a decode step runs are part of its time.
ncu_stalls.py gives the part a launch actually runs.

    nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -Iinclude -Isrc -cubin \\
        -o /tmp/moe.cubin src/cuda/moe_seg.cu
    python3 tools/gpu/sass_sizes.py /tmp/moe.cubin --top 10

Only the standard library (c++filt optional)."""
import argparse
import shutil
import struct
import subprocess
import sys


def text_sections(path):
    """(size in bytes, mangled kernel name) for each .text.* section of an ELF64 file."""
    with open(path, "rb") as f:
        d = f.read()
    if d[:4] != b"\x7fELF" or d[4] != 2:
        raise ValueError("not an ELF64 file (a cubin: nvcc -cubin)")
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", d, shoff + i * shentsize) for i in range(shnum)]
    names_off = secs[shstrndx][4]
    out = []
    for name, _typ, _flags, _addr, _off, size in secs:
        end = d.index(b"\0", names_off + name)
        n = d[names_off + name:end].decode(errors="replace")
        if n.startswith(".text."):
            out.append((size, n[len(".text."):]))
    return out


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    r = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    got = r.stdout.splitlines()
    return dict(zip(names, got)) if r.returncode == 0 and len(got) == len(names) else {n: n for n in names}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cubin", nargs="+")
    ap.add_argument("--top", type=int, default=0, help="kernels to list per file (default all)")
    ap.add_argument("--match", default="", help="only kernels whose demangled name contains this")
    a = ap.parse_args()
    for path in a.cubin:
        try:
            secs = text_sections(path)
        except (OSError, ValueError, struct.error) as e:
            sys.exit(f"sass_sizes: {path}: {e}")
        names = demangle([n for _, n in secs])
        rows = sorted(((s, names[n]) for s, n in secs if a.match in names[n]), reverse=True)
        total = sum(s for s, _ in rows)
        print(f"### {path}: {len(rows)} kernels, {total / 1024:.1f} KB of SASS\n")
        print("| KB | instructions | kernel |")
        print("|---:|---:|---|")
        for s, n in rows[: a.top or None]:
            print(f"| {s / 1024:.1f} | {s // 16} | `{n[:110]}` |")
        print()


if __name__ == "__main__":
    main()
