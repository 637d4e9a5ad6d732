#!/usr/bin/env python3
"""phase_trace.py TRACE.csv [--self-routed] [--tail]

The phase trace of a measurement build (make CUDA=1 TRACE=1, loaded with
`tern bench --phase-trace TRACE.csv`; src/cuda/trace.cuh): one record per block of an
instrumented kernel, thread 0's %globaltimer at the kernel's marks. Records
of one kernel and aux value are cut into calls (a call's blocks start within
a few microseconds; calls of one kernel are a layer apart), the calls with the
most common block count kept, and per mark the median over calls of (the
median block's, the last block's) time since the call's reference: the
first block's release from the wait (mark 2 for the GEMVs, 1 for the
experts' gate/up; the first start for the down kernel, an ordinary launch).
Prints a Markdown table per kernel.

--self-routed keeps only the records after the last call of the fused
router's epilogue (kernel 2): `tern bench` decodes first with the host
observing the routing (its routing statistics), which keeps the router's
epilogue and the two-kernel chain, then the timed steps, where the experts
route themselves; without it a trace mixes both kinds of step.

--tail adds, for the experts' one launch (kernel 6), where its last blocks
spend the time after their down rows are written (mark 6 to the end): the
next kernel waits for the last block, so the tail is on the step's path.
Per block, end - mark 6 for the chunk's reducer (of the blocks of one
chunk, the one whose mark 6 came last) and for the others; and per call the
last block to end: its segment, whether it reduced, its mark 6 and end."""
import csv
import statistics
import sys
from collections import Counter, defaultdict

# (labels of marks 0 .. TRACE_MARKS - 1, the last the end; "" unused)
def _marks(*labels):
    return list(labels[:-1]) + [""] * (12 - len(labels)) + [labels[-1]]


KERNELS = {
    1: ("one-token GEMV (register tiles)", _marks("start", "first weights requested", "wait released", "input built",
                                                 "rows written", "x in (thread 0)", "norm's sum in", "end"), 2),
    2: ("fused router (register tiles + top-k in the last block)",
        _marks("start", "first weights requested", "wait released", "input built", "rows written", "block counted",
               "routed (last block)", "end"), 2),
    3: ("one-token GEMV (staged)", _marks("start", "first tiles requested", "wait released", "input built",
                                          "first tile landed", "x in (thread 0)", "norm's sum in", "end"), 2),
    4: ("experts' gate/up", _marks("start", "wait released", "first weights requested", "x as digits", "h written",
                                   "", "", "", "top k done", "end"), 1),
    5: ("experts' down", _marks("start", "ids read", "rows requested", "rows landed", "products", "end"), 0),
    6: ("experts in one launch", _marks("start", "wait released", "first weights requested", "x as digits",
                                        "h written", "segment done", "down rows written", "routed (warp 0)", "top k done",
                                        "segment's h in", "down rows in shared memory", "end"), 1),
    7: ("DeltaNet step", _marks("start", "S requested", "wait released", "conv in", "conv outputs shared",
                                "head's norm sums in", "outputs exchanged (with the projection)",
                                "W landed (with the projection)", "end"), 2),
    8: ("sampler (top-k draw; aux 1: the block that ran stage 2)",
        _marks("start", "wait released", "logits in", "slice's top k", "slice's k written", "stage 2 elected",
               "survivors listed", "top k sorted", "id written", "end"), 1),
}
GAP_NS = 8000   # blocks of one call start within this of the previous block


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1 or any(a not in ("--self-routed", "--tail") for a in sys.argv[1:] if a.startswith("--")):
        sys.exit(__doc__)
    with open(args[0]) as f:
        rd = csv.DictReader(f)
        nm = sum(1 for k in rd.fieldnames if k.startswith("m"))   # marks a record (trace_marks.h)
        recs = [(int(r["kid"]), int(r["aux"]), [int(r[f"m{i}"]) for i in range(nm)], int(r["block"])) for r in rd]
    if "--self-routed" in sys.argv:
        observed = [m[0] for kid, _, m, _b in recs if kid == 2]
        if observed:
            cut = max(observed) + GAP_NS
            recs = [r for r in recs if r[2][0] > cut]
    if "--tail" in sys.argv:
        tail(recs, nm)
    groups = defaultdict(list)
    for kid, aux, m, _b in recs:
        groups[(kid, aux)].append(m)
    # the router's and the sampler's aux say whether the block was the last; trace both together
    merged = defaultdict(list)
    for (kid, aux), recs in groups.items():
        merged[(kid, 0 if kid in (2, 8) else aux)].extend((aux, m) for m in recs)
    for (kid, aux), recs in sorted(merged.items()):
        name, marks, ref = KERNELS.get(kid, (f"kernel {kid}", [f"m{i}" for i in range(12)], 0))
        nm = len(recs[0][1])
        if nm == 8:   # a trace of the 8-mark builds (before trace_marks.h): the same marks, the end at 7
            marks = marks[:7] + [marks[-1]]
        elif nm != len(marks):
            marks = [f"m{i}" for i in range(nm)]
        recs.sort(key=lambda am: am[1][0])
        calls, cur, last0 = [], [], None
        for am in recs:
            if last0 is not None and am[1][0] - last0 > GAP_NS:
                calls.append(cur)
                cur = []
            cur.append(am)
            last0 = am[1][0]
        if cur:
            calls.append(cur)
        n = Counter(len(c) for c in calls).most_common(1)[0][0]
        calls = [c for c in calls if len(c) == n]
        med = defaultdict(list)
        mx = defaultdict(list)
        for c in calls:
            t0 = min(m[ref] for _, m in c)
            for i in range(nm):
                vals = [m[i] - t0 for a, m in c if m[i]]
                if kid == 2 and i == 6:
                    vals = [m[i] - t0 for a, m in c if a == 1 and m[i]]
                if vals:
                    med[i].append(statistics.median(vals))
                    mx[i].append(max(vals))
        print(f"### {name}, aux {aux}: {len(calls)} calls of {n} blocks (us since the first block's "
              f"'{marks[ref]}')\n")
        print("| mark | median block | last block |")
        print("|---|---:|---:|")
        rows = [(statistics.median(med[i]), statistics.median(mx[i]), marks[i]) for i in range(nm) if i in med and marks[i]]
        for m_, x_, label in sorted(rows):   # in time order (marks set inside helpers fall between others)
            print(f"| {label} | {m_ / 1e3:.2f} | {x_ / 1e3:.2f} |")
        print()


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def tail(recs, nm):
    """The experts' one launch after mark 6 (see --tail above)."""
    rs = sorted((r for r in recs if r[0] == 6), key=lambda r: r[2][0])
    calls, cur = [], []
    for r in rs:
        if cur and r[2][0] - cur[-1][2][0] > GAP_NS:
            calls.append(cur)
            cur = []
        cur.append(r)
    if cur:
        calls.append(cur)
    if not calls:
        return
    n = Counter(len(c) for c in calls).most_common(1)[0][0]
    calls = [c for c in calls if len(c) == n]
    end, m6 = nm - 1, 6
    red, other, lasts = [], [], []
    # a block's chunk is its blockIdx.x = block % gridDim.x, and gridDim.x is
    # the shared segment's block count (aux 1: one block a chunk)
    if not any(r[1] == 1 for r in calls[0]):
        print("### experts in one launch, tail: no shared segment in the trace, so no grid width to find "
              "the chunks by (--tail needs a model with a shared expert)\n")
        return
    for c in calls:
        gx = sum(1 for r in c if r[1] == 1)
        t0 = min(r[2][1] for r in c)
        by_chunk = defaultdict(list)
        for r in c:
            by_chunk[r[3] % gx].append(r)
        reducers = {max(rr, key=lambda r: r[2][m6])[3] for rr in by_chunk.values()}
        for r in c:
            (red if r[3] in reducers else other).append(r[2][end] - r[2][m6])
        lr = max(c, key=lambda r: r[2][end])
        lasts.append((lr[3] // gx, lr[3] in reducers, (lr[2][m6] - t0) / 1e3, (lr[2][end] - t0) / 1e3))
    print(f"### experts in one launch, tail: {len(calls)} calls of {n} blocks\n")
    print("| blocks | count | end - mark 6 p50 (us) | p90 | max |")
    print("|---|---:|---:|---:|---:|")
    for label, v in (("reducers", red), ("others", other)):
        if v:
            print(f"| {label} | {len(v)} | {pct(v, 0.5) / 1e3:.2f} | {pct(v, 0.9) / 1e3:.2f} | {max(v) / 1e3:.2f} |")
    print("\nlast block of a call (first 12 calls): segment, reducer, mark 6, end (us since the first wait release)\n")
    for seg, isr, a, b in lasts[:12]:
        print(f"- segment {seg}, {'reducer' if isr else 'not reducer'}, {a:.2f}, {b:.2f}")
    segs = Counter(s for s, _, _, _ in lasts)
    print(f"\nlast block's segment over all calls: {dict(sorted(segs.items()))}; "
          f"reducer in {sum(1 for l in lasts if l[1])} of {len(lasts)}\n")


if __name__ == "__main__":
    main()
