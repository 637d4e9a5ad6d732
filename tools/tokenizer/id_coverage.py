#!/usr/bin/env python3
"""The share of each text's tokens whose id lies below K, for a few K: how far a
vocabulary's id order follows frequency (docs/experiments/mtp.md, "A smaller
draft vocabulary"). HTML files are read without their tags and scripts.

    pip install tokenizers
    python3 tools/tokenizer/id_coverage.py TOKENIZER_JSON [LABEL=]FILE[,FILE...] ...
"""
import html
import re
import sys

from tokenizers import Tokenizer

KS = [8192, 16384, 32768, 65536, 131072]


def text_of(path):
    t = open(path, encoding="utf-8", errors="ignore").read()
    if path.endswith(".html"):
        t = re.sub(r"<script.*?</script>|<style.*?</style>", " ", t, flags=re.S)
        t = html.unescape(re.sub(r"<[^>]+>", " ", t))
    return t


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    tok = Tokenizer.from_file(sys.argv[1])
    print("| text | tokens | " + " | ".join(f"ids < {k:,}" for k in KS) + " |")
    print("|---|---:|" + "---:|" * len(KS))
    for arg in sys.argv[2:]:
        label, _, files = arg.rpartition("=")
        ids = tok.encode("".join(text_of(p) for p in files.split(","))).ids
        if not ids:
            sys.exit(f"id_coverage: {files}: no tokens")
        shares = " | ".join(f"{100 * sum(i < k for i in ids) / len(ids):.1f} %" for k in KS)
        print(f"| {label or files} | {len(ids):,} | {shares} |")


if __name__ == "__main__":
    main()
