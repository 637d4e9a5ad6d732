#!/usr/bin/env python3
"""Expert-streaming footprint benchmark (not a test): does the expert budget
bound the real memory footprint?

Builds a synthetic packed model (random weights, 4-bit experts) big enough
that its experts do not fit the smallest budgets, then decodes with expert
budgets of 25 %, 50 % and 100 % of the expert bytes, and once with the
experts mapped (no budget). For each run it reports the peak RSS of the tern
process (wait4's ru_maxrss), the growth of the page cache (/proc/meminfo
"Cached", after asking the kernel to drop clean caches where that is
allowed), the hit rate and decode speed from --stats.

    python3 tools/bench_footprint.py [--keep DIR] [--layers 8] [--experts 64]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERN = os.path.join(ROOT, "build", "tern")


def cached_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1])
    return 0


def drop_caches():
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run(cmd):
    """Runs cmd; returns (stdout+stderr, exit code)."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.stdout, p.returncode


def measure(model, budget, tokens, n):
    # A fresh python child runs tern and reports RUSAGE_CHILDREN: the peak
    # RSS of that one tern process.
    probe = (
        "import os,sys,resource,subprocess;"
        "p=subprocess.Popen(sys.argv[1:],stdout=subprocess.PIPE,stderr=subprocess.STDOUT);"
        "out=p.stdout.read();p.wait();"
        "print(out.decode(),end='');"
        "print('PEAK_RSS_KB',resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss);"
        "sys.exit(p.returncode)"
    )
    cmd = [sys.executable, "-c", probe, TERN, "run", "-m", model, "--tokens", tokens, "-n", str(n),
           "--temp", "0", "--stats", "-t", "2"]
    if budget:
        cmd += ["--expert-budget", str(budget)]
    dropped = drop_caches()
    before = cached_kb()
    out, rc = run(cmd)
    after = cached_kb()
    if rc != 0:
        sys.exit(f"tern failed:\n{out}")
    rss = int(re.search(r"PEAK_RSS_KB (\d+)", out).group(1))
    dec = re.search(r"decode ([\d.]+) tok/s", out)
    hit = re.search(r"hit rate ([\d.]+)%", out)
    slots = re.search(r"(\d+) slots/layer", out)
    read = re.search(r"([\d.]+) MB read", out)
    return {"rss_mb": rss / 1024, "cache_mb": (after - before) / 1024, "decode": float(dec.group(1)) if dec else 0,
            "hit": float(hit.group(1)) if hit else 100.0, "slots": int(slots.group(1)) if slots else 0,
            "read_mb": float(read.group(1)) if read else 0, "dropped": dropped}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", help="build (or reuse) the synthetic models here instead of a temp dir")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("-n", type=int, default=64, help="tokens to decode per run")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="tern-footprint-")
    src, packed = os.path.join(work, "src"), os.path.join(work, "packed")
    if not os.path.exists(packed):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "pack", "make_synthetic.py"), src,
                        "--hidden", str(args.hidden), "--layers", str(args.layers), "--experts", str(args.experts)],
                       check=True)
        subprocess.run([TERN, "pack", src, packed, "-q"], check=True)
        shutil.rmtree(src)
    experts = sum(os.path.getsize(os.path.join(packed, "experts", f)) for f in os.listdir(os.path.join(packed, "experts")))
    resident = os.path.getsize(os.path.join(packed, "resident.bin"))
    tokens = " ".join(str((i * 7919) % 1000 + 1) for i in range(16))
    print(f"model: {packed}: resident.bin {resident / 1e6:.1f} MB, experts {experts / 1e6:.1f} MB; "
          f"decoding {args.n} tokens after a 16-token prompt, 2 threads")
    rows = []
    for label, frac in (("25 %", 0.25), ("50 %", 0.5), ("100 %", 1.0), ("mapped", None)):
        budget = int(experts * frac) if frac else 0
        r = measure(packed, budget, tokens, args.n)
        rows.append((label, budget, r))
    print()
    print("| budget | slots/layer | hit rate | read MB | peak RSS MB | page cache growth MB | decode tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, budget, r in rows:
        b = f"{label} ({budget / 1e6:.0f} MB)" if budget else label
        print(f"| {b} | {r['slots'] or '-'} | {r['hit']:.1f} % | {r['read_mb']:.0f} | {r['rss_mb']:.0f} | "
              f"{r['cache_mb']:.0f} | {r['decode']:.1f} |")
    if not rows[0][2]["dropped"]:
        print("\n(page cache could not be dropped between runs: growth is measured from a warm cache)")
    if not args.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
