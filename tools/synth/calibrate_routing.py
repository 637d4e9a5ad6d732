#!/usr/bin/env python3
"""Fits the parameters of tern synth's "prose" routing to published routing
statistics of Qwen 3.6 35B-A3B (../shared/docs/seed-system.md §3a).

The model (src/synth/synth.h): the router logit of expert e for token t is

    pop * P[e]  +  ctx * C_t[e]  +  N_t[e]

with P ~ N(0, 1) fixed per expert (popularity), C an AR(1) process of lag-1
correlation rho (the topic, which the synthetic model carries in a moving
average of recent tokens), N ~ N(0, 1) fresh per token; the top k logits are
the token's experts. This script simulates the model for a grid of (pop,
ctx, rho), measures the statistics the published trace reports, and prints
the best fits. tern bench measures the same statistics on the engine's real
routing (docs/experiments/synth-bench.md).

    python3 tools/synth/calibrate_routing.py            # the grid fit
    python3 tools/synth/calibrate_routing.py --check 1.5 1.5 0.8
"""
import argparse

import numpy as np

E, K = 256, 8
# published: token-to-token reuse, distinct experts per 8 / 32 / 128 tokens
# (383-token trace), lifetime distinct experts per layer (7,808 first
# touches / 40 layers)
TARGET = {"reuse": 0.38, "d8": 33.9, "d32": 76.1, "d128": 131.4, "life": 7808 / 40}


def simulate(pop, ctx, rho, tokens, layers, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(layers):
        p = rng.standard_normal(E) * pop
        c = rng.standard_normal(E)
        tops = np.empty((tokens, K), dtype=np.int64)
        for t in range(tokens):
            c = rho * c + np.sqrt(1 - rho * rho) * rng.standard_normal(E)
            z = p + ctx * c + rng.standard_normal(E)
            tops[t] = np.argsort(-z)[:K]
        out.append(tops)
    return out


def stats(tops):
    r = {k: [] for k in TARGET}
    for top in tops:
        sets = [set(x) for x in top]
        T = len(sets)
        r["reuse"].append(np.mean([len(sets[t] & sets[t - 1]) / K for t in range(1, T)]))
        for w, key in ((8, "d8"), (32, "d32"), (128, "d128")):
            r[key].append(np.mean([len(set().union(*sets[a:a + w])) for a in range(0, T - w + 1, w // 2)]))
        r["life"].append(len(set().union(*sets)))
    return {k: float(np.mean(v)) for k, v in r.items()}


def lfu_hit_rate(top, slots):
    """The engine's LFU plan (src/experts/cache.c): experts in ascending order,
    lifetime counts, ties to the least recently used, the token's own pinned."""
    count = np.zeros(E)
    where, last = {}, {}
    hits = n = 0
    for t, row in enumerate(top, 1):
        for e in sorted(row):
            count[e] += 1
            n += 1
            if e in where:
                hits += 1
            elif len(where) < slots:
                where[e] = True
            else:
                victim = min((x for x in where if last[x] != t), key=lambda x: (count[x], last[x]))
                del where[victim]
                where[e] = True
            last[e] = t
    return hits / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", nargs=3, type=float, metavar=("POP", "CTX", "RHO"))
    ap.add_argument("--tokens", type=int, default=383)
    args = ap.parse_args()
    if args.check:
        tops = simulate(*args.check, tokens=512, layers=8, seed=1)
        print("statistics over the first %d tokens:" % args.tokens, stats([t[:args.tokens] for t in tops]))
        for s in (32, 64, 128):
            print("LFU @ %d slots over 512 tokens: %.1f %%" % (s, 100 * np.mean([lfu_hit_rate(t, s) for t in tops])))
        return
    fits = []
    for pop in (0.5, 0.8, 1.0, 1.2, 1.5, 1.8):
        for ctx in (1.0, 1.5, 2.0, 3.0):
            for rho in (0.7, 0.8, 0.9, 0.95):
                s = stats(simulate(pop, ctx, rho, args.tokens, 4, 0))
                err = sum(((s[k] - TARGET[k]) / TARGET[k]) ** 2 for k in TARGET)
                fits.append((err, pop, ctx, rho, s))
    fits.sort(key=lambda f: f[0])
    print("target:", TARGET)
    for err, pop, ctx, rho, s in fits[:5]:
        print("pop %.1f ctx %.1f rho %.2f  error %.4f  %s" % (pop, ctx, rho, err,
              " ".join("%s %.2f" % kv for kv in s.items())))


if __name__ == "__main__":
    main()
