#!/usr/bin/env python3
"""Checks that the fixture tests can fail: applies one deliberate mistake at
a time to a copy of the engine (each a detail of the model's math that is easy
to get wrong), rebuilds the tests and runs the fixture suite. Every mutation
must make at least one fixture test fail.

    python3 tools/mutation_check.py            # all mutations
    python3 tools/mutation_check.py rope_pairs # one
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name -> list of (file, exact text, replacement)
MUTATIONS = {
    "rmsnorm_plus_one": [
        ("src/cpu/ops.c", "y[i] = x[i] * r * (1.0f + w[i]);", "y[i] = x[i] * r * w[i];"),
    ],
    "query_gate_interleave": [  # all queries, then all gates, instead of per head
        ("src/engine/forward.c",
         "static inline size_t q_at(int t, int h, int nh, int hd) { return ((size_t)t * nh + h) * 2 * hd; }\n"
         "static inline size_t gate_at(int t, int h, int nh, int hd) { return q_at(t, h, nh, hd) + hd; }\n"
         "static inline size_t q_head_stride(int hd) { return (size_t)2 * hd; }",
         "static inline size_t q_at(int t, int h, int nh, int hd) { return (size_t)t * nh * 2 * hd + (size_t)h * hd; }\n"
         "static inline size_t gate_at(int t, int h, int nh, int hd) { return q_at(t, nh + h, nh, hd); }\n"
         "static inline size_t q_head_stride(int hd) { return (size_t)hd; }"),
    ],
    "rope_pairs": [  # interleaved (2d, 2d+1) pairs instead of rotate-half (d, d+half)
        ("src/cpu/attention.c", "float a = x[d], b = x[d + half];", "float a = x[2 * d], b = x[2 * d + 1];"),
        ("src/cpu/attention.c", "x[d] = a * c - b * s;\n        x[d + half] = b * c + a * s;",
         "x[2 * d] = a * c - b * s;\n        x[2 * d + 1] = b * c + a * s;"),
    ],
    "v_head_to_k_head": [  # tiled (j % nk) instead of grouped (j / (nv/nk))
        ("src/cpu/gdn.c", "int m = j / group;", "int m = j % io->nk;"),
        ("src/cpu/gdn.c", "gdn_chunk(io, j, j / group, t0, n, S, &s);", "gdn_chunk(io, j, j % io->nk, t0, n, S, &s);"),
    ],
    "topk_renormalise": [
        ("src/cpu/moe.c", "if (renorm)", "if (0)"),
    ],
    "shared_expert_sigmoid_gate": [
        ("src/engine/forward.c", "float s = tern_sigmoid(tern_dot(xn + (size_t)t * H, gw, H));", "float s = 1.0f;"),
    ],
    "yarn_attention_factor": [  # YaRN's cos/sin scale dropped
        ("src/cpu/attention.c", "float c = cosf(ang) * scale, s = sinf(ang) * scale;", "float c = cosf(ang), s = sinf(ang);"),
    ],
    "yarn_ramp_direction": [  # the fast dims interpolated and the slow ones extrapolated
        ("src/model/rope.c", "double e = 1.0 - ramp;", "double e = ramp;"),
    ],
    "gdn_qk_l2norm": [
        ("src/cpu/gdn.c", "            tern_l2norm(qh, dk);\n", ""),
        ("src/cpu/gdn.c", "            tern_l2norm(k + (size_t)t * kd + (size_t)h * dk, dk);\n", ""),
    ],
}


def run(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, shell=True, capture_output=True, text=True)


def check(name, edits):
    with tempfile.TemporaryDirectory(prefix="tern-mut-") as tmp:
        tmp = Path(tmp)
        for part in ("Makefile", "include", "src", "tests", "scripts"):
            src = ROOT / part
            (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp / part)
        (tmp / "models").symlink_to(ROOT / "models")   # tern-tiny and its reference outputs, read only
        for rel, old, new in edits:
            p = tmp / rel
            text = p.read_text()
            if text.count(old) != 1:
                return f"mutation text not found once in {rel}: {old!r}"
            p.write_text(text.replace(old, new))
        b = run("make -s -j2 build/tern-tests", tmp)
        if b.returncode != 0:
            return "build failed:\n" + b.stderr[-2000:]
        r = run("build/tern-tests --filter 'fixture/*' --jobs 2", tmp)
        fails = [l.split()[1].rstrip(":") for l in r.stdout.splitlines() + r.stderr.splitlines()
                 if l.startswith("[FAIL]")]
        synth = [l for l in (r.stdout + r.stderr).splitlines() if "Synthesis" in l]
        return fails, synth[-1] if synth else ""


def main():
    names = sys.argv[1:] or list(MUTATIONS)
    bad = 0
    for name in names:
        res = check(name, MUTATIONS[name])
        if isinstance(res, str):
            print(f"{name:28s} ERROR {res}")
            bad += 1
            continue
        fails, synth = res
        caught = len(fails) > 0
        bad += not caught
        print(f"{name:28s} {'caught' if caught else 'NOT CAUGHT'}: {len(fails)} failing "
              f"({', '.join(sorted(fails)[:4])}{', ...' if len(fails) > 4 else ''})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
