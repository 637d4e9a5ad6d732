#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/empty-match.json: the ids Hugging Face
`tokenizers` gives with tern-tiny's tokenizer whose Split regex is replaced
by patterns that can match the empty string (an empty match still splits
there). tests/test_hardening_input.c builds the same tokenizer and compares.

    python3 -m pip install --target /tmp/pyt tokenizers
    PYTHONPATH=/tmp/pyt python3 tools/tokenizer/empty_match_expectations.py
"""
import json
import os

from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
PATTERNS = ["x*", "\\s*", "(?=b)", "a?"]
TEXTS = ["abxxc", "xxabx", "hello world", "axbxc xx", "x", "ab", "bab  ba", "über xx café b",
         "  leading and trailing  ", "x\ny\n\nxx", "aaa bbb aaa"]


def tokenizer_with(pattern):
    with open(os.path.join(ROOT, "models/tern-tiny/tokenizer.json")) as f:
        tj = json.load(f)
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
    return tj


def main():
    out = []
    for p in PATTERNS:
        tok = Tokenizer.from_str(json.dumps(tokenizer_with(p)))
        cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in TEXTS]
        out.append({"pattern": p, "cases": cases})
    path = os.path.join(ROOT, "tests/fixtures/tokenizer/empty-match.json")
    with open(path, "w") as f:
        pats = []
        for o in out:
            cases = ",\n".join("   " + json.dumps(c, ensure_ascii=False) for c in o["cases"])
            pats.append(' {"pattern": %s, "cases": [\n%s]}' % (json.dumps(o["pattern"]), cases))
        f.write("[\n" + ",\n".join(pats) + "\n]\n")


if __name__ == "__main__":
    main()
