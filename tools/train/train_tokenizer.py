#!/usr/bin/env python3
"""Trains the tern-tiny tokenizer: a byte-level BPE with the Qwen3.5/3.6 layout (docs/qwen36-model.md section 4).

  python3 tools/train/train_tokenizer.py        (after build_corpus.py; writes data/tokenizer/)

- model: BPE over the GPT-2 byte alphabet (all 256 byte symbols are in the vocabulary), no unk, no byte fallback,
  merges applied by rank; trained with HF `tokenizers` on data/corpus/train.txt to BPE_VOCAB (8000) entries, ids
  0..7999. Special-token strings are removed from the training text so no merge is spent on them.
- normalizer NFC; pre-tokenizer Sequence[Split(Qwen3.5 regex, isolated), ByteLevel(add_prefix_space=false,
  trim_offsets=false, use_regex=false)]; decoder ByteLevel; no post-processor.
- the 33 Qwen3.5/3.6 added tokens, real strings, in the order of the Qwen table, right after the BPE vocabulary
  (ids 8000..8032, tokenizer size 8033); special=false for the tool/fim/think tokens as in Qwen3, special=true
  for the rest; all normalized=false, no lstrip/rstrip/single_word.
- tokenizer_config.json: eos <|im_end|>, pad <|endoftext|>, no bos, chat_template = the official Qwen3.6 template
  text (tests/fixtures/chat/qwen3.6.jinja), model_max_length 262144; chat_template.jinja (same text).

The script checks the result: round trips, special-token ids, the chat template through transformers'
AutoTokenizer (which must give the same ids as the raw tokenizers object).
"""

import argparse
import json
import os
import sys
from collections import OrderedDict

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from build_corpus import read_split  # noqa: E402

TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "chat", "qwen3.6.jinja")
BPE_VOCAB = 8000
MODEL_MAX_LENGTH = 262144

QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# (content, special), in the order of the Qwen3.5/3.6 table (ids 248044..248076 in the real tokenizer).
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
]
assert len(ADDED_TOKENS) == 33


def training_texts(docs):
    for d in docs:
        for tok, _ in ADDED_TOKENS:
            if tok in d:
                d = d.replace(tok, "\n")
        yield d


def build(train_docs, vocab_size):
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_texts(train_docs), trainer=trainer, length=len(train_docs))
    n = tok.get_vocab_size(with_added_tokens=False)
    assert n == vocab_size, f"BPE vocabulary has {n} entries, wanted {vocab_size} (corpus too small?)"
    for content, special in ADDED_TOKENS:  # one at a time keeps the table order across special/non-special
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([t])
        else:
            tok.add_tokens([t])
    for i, (content, _) in enumerate(ADDED_TOKENS):
        assert tok.token_to_id(content) == vocab_size + i, content
    return tok


def tokenizer_config(tok, template):
    decoder = OrderedDict()
    for content, special in ADDED_TOKENS:
        decoder[str(tok.token_to_id(content))] = OrderedDict([
            ("content", content), ("lstrip", False), ("normalized", False), ("rstrip", False),
            ("single_word", False), ("special", special)])
    return OrderedDict([
        ("add_bos_token", False),
        ("add_prefix_space", False),
        ("added_tokens_decoder", decoder),
        ("bos_token", None),
        ("chat_template", template),
        ("clean_up_tokenization_spaces", False),
        ("eos_token", "<|im_end|>"),
        ("errors", "replace"),
        ("model_max_length", MODEL_MAX_LENGTH),
        ("pad_token", "<|endoftext|>"),
        ("split_special_tokens", False),
        ("tokenizer_class", "PreTrainedTokenizerFast"),  # loads tokenizer.json as written
        ("unk_token", None),
    ])


def write(tok, outdir, template):
    os.makedirs(outdir, exist_ok=True)
    tok.save(os.path.join(outdir, "tokenizer.json"))
    # tokenizers writes "post_processor": null already; make sure no other writer added one.
    with open(os.path.join(outdir, "tokenizer.json")) as f:
        j = json.load(f)
    assert j["post_processor"] is None and j["model"]["type"] == "BPE"
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tok, template), f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(outdir, "chat_template.jinja"), "w") as f:
        f.write(template)


def check(outdir, sample_docs, bpe_vocab=BPE_VOCAB):
    raw = Tokenizer.from_file(os.path.join(outdir, "tokenizer.json"))
    for d in sample_docs:
        ids = raw.encode(d, add_special_tokens=False).ids
        assert raw.decode(ids, skip_special_tokens=False) == d, "round trip failed"
    specials = "".join(t for t, _ in ADDED_TOKENS)
    assert raw.encode(specials).ids == list(range(bpe_vocab, bpe_vocab + 33))
    report = {"tokenizer_size": raw.get_vocab_size(with_added_tokens=True)}
    try:  # transformers' view of the same files (what a user of the model directory gets)
        from transformers import AutoTokenizer
        hf = AutoTokenizer.from_pretrained(outdir)
        # Same pre-tokenizer as written (a Qwen2Tokenizer class would swap in the Qwen2 regex without \p{M}).
        probe = "x\u0301y don't  12\n\n"
        assert (hf.backend_tokenizer.pre_tokenizer.pre_tokenize_str(probe)
                == raw.pre_tokenizer.pre_tokenize_str(probe)), "transformers rebuilt a different pre-tokenizer"
        for d in sample_docs[:200]:
            assert hf.encode(d, add_special_tokens=False) == raw.encode(d, add_special_tokens=False).ids
        assert hf.eos_token == "<|im_end|>" and hf.eos_token_id == bpe_vocab + 2
        assert hf.pad_token_id == bpe_vocab
        msgs = [{"role": "user", "content": "Tell me a fortune."}]
        p = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        assert p == "<|im_start|>user\nTell me a fortune.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", p
        report["transformers_class"] = type(hf).__name__
    except ImportError:
        report["transformers_class"] = None
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=os.path.join(ROOT, "data", "corpus"))
    ap.add_argument("--out", default=os.path.join(ROOT, "data", "tokenizer"))
    ap.add_argument("--vocab", type=int, default=BPE_VOCAB, help="BPE vocabulary size without added tokens")
    args = ap.parse_args()

    train = read_split(os.path.join(args.corpus, "train.txt"))
    held = read_split(os.path.join(args.corpus, "heldout.txt"))
    with open(TEMPLATE) as f:
        template = f.read()
    tok = build(train, args.vocab)
    write(tok, args.out, template)
    report = check(args.out, held, args.vocab)

    raw = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    stats = {}
    for name, docs in (("train", train), ("heldout", held)):
        enc = raw.encode_batch(docs, add_special_tokens=False)
        n_tok = sum(len(e.ids) for e in enc) + len(docs)  # + one <|endoftext|> per document when packed
        n_chars = sum(len(d) for d in docs)
        stats[name] = {"docs": len(docs), "chars": n_chars, "tokens_packed": n_tok,
                       "chars_per_token": round(n_chars / n_tok, 3)}
    report["corpus"] = stats
    report["bpe_vocab"] = args.vocab
    report["added_tokens"] = len(ADDED_TOKENS)
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
