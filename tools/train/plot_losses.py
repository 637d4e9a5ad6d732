#!/usr/bin/env python3
"""Plots the loss log of a tern-tiny training run.

  python3 tools/train/plot_losses.py models/tern-tiny/metrics.json [-o models/tern-tiny/loss.png]

Reads `train_log` (per-interval mean train LM and MTP losses) and `eval_log` (held-out LM and MTP losses) from the
metrics.json that train.py writes, and draws both against training tokens, with the epoch count on a second axis
and the saved (best held-out) step marked. Needs matplotlib (`pip install matplotlib`).
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics")
    ap.add_argument("-o", "--out", help="PNG path (default: loss.png beside metrics.json)")
    args = ap.parse_args()
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.metrics)), "loss.png")
    with open(args.metrics) as f:
        m = json.load(f)
    tr, ev = m.get("train_log", []), m.get("eval_log", [])
    tokens_per_step = m["args"]["batch"] * m["args"]["seq_len"]

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    if tr:
        x = [r["tokens"] / 1e6 for r in tr]
        ax.plot(x, [r["loss_lm"] for r in tr], color="tab:blue", lw=1.2, label="train LM")
        ax.plot(x, [r["loss_mtp"] for r in tr], color="tab:orange", lw=1.2, label="train MTP (t+2)")
    if ev:
        x = [r["step"] * tokens_per_step / 1e6 for r in ev]
        ax.plot(x, [r["heldout_lm_loss"] for r in ev], "o-", color="navy", ms=3.5, lw=1.2, label="held-out LM")
        ax.plot(x, [r["heldout_mtp_loss"] for r in ev], "s-", color="darkred", ms=3.5, lw=1.2,
                label="held-out MTP (t+2)")
    best = m.get("best_step")
    if best is not None:
        ax.axvline(best * tokens_per_step / 1e6, color="gray", ls=":", lw=1, label=f"saved (step {best})")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    lows = [r["heldout_lm_loss"] for r in ev] + [r["loss_lm"] for r in tr]
    if lows:
        ax.set_ylim(max(0.0, min(lows) - 0.3), min(10.0, max(r["loss_mtp"] for r in tr) if tr else 10.0) + 0.2)
    ax.grid(alpha=0.3)
    p = m.get("params", {})
    fin = m.get("final", {})
    title = f"tern-tiny: {p.get('total', 0) / 1e6:.1f} M parameters"
    if fin:
        title += (f"; held-out ppl {fin['heldout_ppl']:.2f}, MTP top-1 acceptance "
                  f"{fin['mtp_accept_vs_greedy']:.1%} (vs greedy)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    spe = m.get("steps_per_epoch")
    if spe:
        sec = ax.secondary_xaxis("top", functions=(lambda t: t * 1e6 / tokens_per_step / spe,
                                                   lambda e: e * spe * tokens_per_step / 1e6))
        sec.set_xlabel("epochs", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
