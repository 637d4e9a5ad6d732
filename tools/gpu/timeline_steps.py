#!/usr/bin/env python3
"""timeline_steps.py RUN.csv [--kernels N] [--steps-out FILE] [--roles]

The decode step's timeline from tools/gpu/kernel_timeline.c's CSV: the
graph-launched kernels cut into steps at each embed_kernel, the steps of the
most common kernel count kept (the decode test's), and per kernel its
marginal time: how much later the step's last end is for it (end minus the
latest end before it in the step; for PDL launches the start can be earlier
than the predecessor's end, so durations overlap and only the marginal
times add up to the step). Prints, as Markdown: the step's span, the gaps
between steps, then per kernel name the count a step, the median duration and
the median marginal time each, their sum a step and its share. --roles adds
the same by role of tern's one-token step (a one-token GEMV is the input
projections of a DeltaNet or an attention layer, the lm_head, the output
projection or the router, by its template and the kernel after it)."""
import csv
import re
import statistics
import sys
from collections import Counter, defaultdict


def short(name):
    """The kernel's identifier and, for a template, its mangled arguments
    (_Z14moe_down_kernelILi0ELi0EEv... -> moe_down_kernel<Li0ELi0E>)."""
    m = re.match(r"_Z(\d+)", name)
    if not m:
        return re.sub(r"\(.*$", "", name).replace(" ", "")
    k = int(m.group(1))
    base = name[m.end():m.end() + k]
    rest = name[m.end() + k:]
    if rest.startswith("I"):   # template arguments end where the void return type follows
        end = rest.find("Ev")
        return f"{base}<{rest[1:end]}>" if end > 0 else base
    return base


def role_of(name, nxt):
    """The role of a kernel of tern's one-token step (src/engine/gpu_decode.c, step1)."""
    if name.startswith("gemv1s_kernel"):
        return ("input projections (DeltaNet)" if nxt.startswith("gdn") else
                "input projections (attention)" if nxt.startswith("attn") else "lm_head")
    if name.startswith("gemv1_kernel"):
        # the router is the only plain GEMV followed by the experts
        return "router + top-k" if nxt.startswith("moe_gate") else "output projection"
    if name.startswith("moe_gate") and re.search(r"ELb1E(Lb[01]E)?>$", name):   # FUSED = true
        return "experts (gate/up and down, one launch)"
    for prefix, role in (("gdn_step", "DeltaNet step"), ("moe_gate", "experts' gate/up"),
                         ("moe_down", "experts' down"), ("attn_", "attention core"), ("topk_", "sampling"),
                         ("argmax", "sampling"), ("embed", "embedding")):
        if name.startswith(prefix):
            return role
    return name


def steps_of(rows):
    steps, cur = [], None
    for r in rows:
        if r["graph"] == 0:
            continue
        if r["name"].startswith("embed_kernel"):  # the step's first kernel
            if cur:
                steps.append(cur)
            cur = []
        if cur is not None:
            cur.append(r)
    if cur:
        steps.append(cur)
    return steps


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    want = None
    if "--kernels" in args:
        i = args.index("--kernels")
        want = int(args[i + 1])
        del args[i:i + 2]
    rows = []
    with open(args[0]) as f:
        for r in csv.DictReader(f):
            rows.append({"s": int(r["start_ns"]), "e": int(r["end_ns"]), "graph": int(r["graph_id"]),
                         "name": short(r["name"]), "grid": int(r["grid"])})
    steps = steps_of(rows)
    if not steps:
        sys.exit("timeline_steps: no graph-launched steps (no embed_kernel in a graph)")
    counts = Counter(len(s) for s in steps)
    n = want or counts.most_common(1)[0][0]
    keep = [s for s in steps if len(s) == n]
    if len(keep) > 2:
        keep = keep[1:-1]   # the first and last of a run may follow or precede other work
    spans = [s[-1]["e"] - s[0]["s"] for s in keep]
    ends = [max(r["e"] for r in s) for s in keep]
    gaps = [keep[i + 1][0]["s"] - ends[i] for i in range(len(keep) - 1)]
    print(f"{len(steps)} graph steps; {len(keep)} of {n} kernels kept")
    print(f"step span (first start to last end): median {statistics.median(spans) / 1e3:.1f} us")
    if gaps:
        print(f"gap from a step's last end to the next step's first start: median {statistics.median(gaps) / 1e3:.1f} us")
    # per position: duration and marginal time, medians over the kept steps
    dur = defaultdict(list)
    marg = defaultdict(list)
    lead = defaultdict(list)
    for s in keep:
        latest = s[0]["s"]
        for i, r in enumerate(s):
            dur[i].append(r["e"] - r["s"])
            marg[i].append(max(0, r["e"] - latest))
            lead[i].append(r["s"] - latest)
            latest = max(latest, r["e"])
    names = [r["name"] for r in keep[0]]
    by = defaultdict(lambda: {"n": 0, "dur": [], "marg": [], "lead": []})
    for i, nm in enumerate(names):
        b = by[nm]
        b["n"] += 1
        b["dur"].append(statistics.median(dur[i]))
        b["marg"].append(statistics.median(marg[i]))
        b["lead"].append(statistics.median(lead[i]))
    total = sum(sum(b["marg"]) for b in by.values())
    print(f"sum of marginal times: {total / 1e3:.1f} us a step\n")
    print("| kernel | count | duration us (median) | marginal us (median) | start - previous end us | us a step | share |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for nm, b in sorted(by.items(), key=lambda kv: -sum(kv[1]["marg"])):
        t = sum(b["marg"])
        print(f"| {nm} | {b['n']} | {statistics.median(b['dur']) / 1e3:.2f} | {statistics.median(b['marg']) / 1e3:.2f} | "
              f"{statistics.median(b['lead']) / 1e3:.2f} | {t / 1e3:.1f} | {100 * t / total:.1f} % |")
    if "--roles" in args:
        roles = defaultdict(list)
        for i, nm in enumerate(names):
            nxt = names[i + 1] if i + 1 < len(names) else ""
            roles[role_of(nm, nxt)].append(statistics.median(marg[i]))
        print("\n| role | count | marginal us (median) | us a step | share |")
        print("|---|---:|---:|---:|---:|")
        for role, v in sorted(roles.items(), key=lambda kv: -sum(kv[1])):
            print(f"| {role} | {len(v)} | {statistics.median(v) / 1e3:.2f} | {sum(v) / 1e3:.1f} | "
                  f"{100 * sum(v) / total:.1f} % |")
    if "--steps-out" in args:
        with open(args[args.index("--steps-out") + 1], "w") as f:
            f.write("position,name,duration_us,marginal_us,lead_us\n")
            for i, nm in enumerate(names):
                f.write(f"{i},{nm},{statistics.median(dur[i]) / 1e3:.3f},{statistics.median(marg[i]) / 1e3:.3f},"
                        f"{statistics.median(lead[i]) / 1e3:.3f}\n")


if __name__ == "__main__":
    main()
