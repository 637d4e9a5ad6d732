#!/usr/bin/env python3
"""Builds the tokenizer test fixtures under tests/fixtures/tokenizer/.

  python3 tools/tokenizer/make_fixtures.py            (from the repo root)

What it writes, and why:
  qwen-like/    a ~3K-token byte-level BPE trained here with the Qwen3.5
                layout: NFC normaliser, Split(regex, Isolated) + ByteLevel(
                use_regex=false), the Qwen special tokens appended after the
                BPE vocabulary with Qwen3's flags (think/tool tokens are added
                but not special). Merges are [a, b] pairs (current format).
  legacy/       the same vocabulary in the older shape: ByteLevel(use_regex=
                true) with the GPT-2 regex, merges as "a b" strings, and extra
                added tokens that exercise lstrip / rstrip / single_word /
                normalized=true.
  cases.json    texts and the ids Hugging Face `tokenizers` gives for them with
                each tokenizer (encode without special-token templates), the
                same with split-special (encode_special_tokens) on, decode
                expectations for random id sequences, and the fragments from
                which the C test and this script build the same ~1 MB document
                (only the id count and a 64-bit FNV-1a hash of its ids are
                stored, not the ids).

The corpus is made from files present on a Debian machine (Python standard
library sources, /usr/share/common-licenses) plus multilingual strings written
here, so the fixture can be rebuilt without network access. Retraining on a
different machine may give a different vocabulary; the committed files are the
reference, this script is how they were made.
"""
import glob
import json
import os
import random
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                        normalizers, pre_tokenizers, trainers)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")

QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# (content, special) in Qwen3's order; Qwen3 marks the think/tool tokens
# special=false (matched whole, but kept by skip_special_tokens).
QWEN_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Maß, Straße.",
    "Le cœur a ses raisons que la raison ne connaît point. Ça va? Où est-ce?",
    "¿Dónde está la biblioteca? El niño comió piñata. ¡Qué día!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "日本語のテキストです。東京は大きな都市です。ひらがなとカタカナ。",
    "中文字符测试。我们今天去公园散步，天气很好。人工智能和机器学习。",
    "한국어 텍스트입니다. 안녕하세요, 만나서 반갑습니다.",
    "مرحبا بالعالم. اللغة العربية جميلة جدا. مَرْحَبًا",
    "שלום עולם. עברית נכתבת מימין לשמאל. שָׁלוֹם",
    "हिन्दी पाठ। नमस्ते दुनिया। भारत एक विशाल देश है। क्षत्रिय",
    "தமிழ் மொழி மிகவும் பழமையானது. வணக்கம்",
    "ภาษาไทย ที่นี่ สวัสดีครับ",
    "ខ្ញុំចង់បិទគណនីរបស់ខ្ញុំ",
    "Tiếng Việt có dấu: Việt Nam, phở, điện thoại.",
    "Emoji: 🔥🔥 👍🏽 ❤️ 👨‍👩‍👧‍👦 🇧🇷 👨‍💻 ☕️",
    "Math ∑∫√∞ ≤ ≥ ≠ ½ ¾ ² Ⅻ ℌ𝔢𝔩𝔩𝔬 𝟙𝟚𝟛",
    "Numbers 123 4567 89012 3.14159 1,000,000 ２０２４年 ٣٤٥",
    "don't won't I'm you're they've we'll he'd IT'S DON'T I'M YOU'RE It'Ll",
]


def corpus_lines():
    files = sorted(glob.glob("/usr/lib/python3*/*.py"))[:120]
    files += sorted(glob.glob("/usr/share/common-licenses/*"))
    for path in files:
        if os.path.isdir(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            yield f.read()
    for _ in range(40):
        for s in MULTILINGUAL:
            yield s


def qwen_like():
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    for content, special in QWEN_ADDED:
        t = AddedToken(content, single_word=False, lstrip=False, rstrip=False,
                       normalized=False, special=special)
        if special:
            tok.add_special_tokens([t])
        else:
            tok.add_tokens([t])
    return tok


def legacy_from(qwen_json):
    j = json.loads(qwen_json)
    j["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": True}
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                            for m in j["model"]["merges"]]
    nid = max(t["id"] for t in j["added_tokens"]) + 1
    extra = [
        # content, single_word, lstrip, rstrip, normalized, special
        ("<mask>", False, True, False, False, True),
        ("<R>", False, False, True, False, True),
        ("[SW]", True, False, False, False, False),
        ("cafe\u0301!", False, False, False, True, False),   # matched after NFC
        ("<both>", False, True, True, False, False),
        # one token a prefix of another: the longest match must win
        ("<pre>", False, False, False, False, True),
        ("<pre>post", False, False, False, False, True),
    ]
    for content, sw, ls, rs, norm, sp in extra:
        j["added_tokens"].append({"id": nid, "content": content, "single_word": sw,
                                  "lstrip": ls, "rstrip": rs, "normalized": norm,
                                  "special": sp})
        nid += 1
    return json.dumps(j, ensure_ascii=False, indent=1)


def cases():
    c = [
        "", " ", "  ", "   ", "\n", "\n\n", "\t", " \t\n ", "a", " a", "a ",
        "hello world", "Hello, World!",
        "don't won't I'm you're they've we'll he'd IT'S",
        "'s 's 'S 'T 'Re 'rE 'VE 'm 'M 'll 'Ll 'lL 'LL 'd 'D",
        "DON'T I'M YOU'RE THEY'VE WE'LL HE'D IT'S it'S It'Ll O'Neil's rock'n'roll",
        "x'ſx 'ſ a'ſ x'Sx", "''s ''S 'x 'xyz '1 '",
        "numbers 123 4567 89012 3.14159 1,000,000 -42 0x1F 1e-9",
        "line one\n\n\tline two   with    gaps\r\nline three\n",
        "trailing spaces    ", "    leading spaces", "a  b   c    d     e      f",
        " " * 30 + "x", "x" + " " * 30, "\n" * 17, "\t\t\t\t\t\tdeep", " \n \n \t \r\n  ",
        "def f(x):\n    if x:\n\t\treturn [i ** 2 for i in range(10)]\n" + "\t" * 8 + "pass\n",
        "int main(void) {\n\tfor (int i = 0; i < n; ++i) {\n\t\tif (a[i] && b[i]) {\n\t\t\t\tx += y;\n\t\t\t}\n\t}\n}\n",
        "    " * 12 + "deeply_indented = True\n" + "        " * 6 + "# comment",
        "{\"key\": \"value\", \"n\": 1.5, \"list\": [1, 2, 3]}",
        "café naïve résumé coöperate", "Cafe\u0301 decomposed", "\u212b angstrom sign",
        "ＡＢ fullwidth", "ﬁ ligature ﬀ", "e\u0323\u0301\u0302 stacked marks",
        "\u1100\u1161\u11a8 hangul jamo", "Ǆ ǅ ǆ digraphs",
        "日本語のテキスト 完全に壊れている", "中文字符测试", "한국어 텍스트",
        "مرحبا بالعالم", "مَرْحَبًا", "שלום עולם", "שָׁלוֹם", "Ελληνικά κείμενο", "Русский текст",
        "हिन्दी पाठ", "नमस्ते दुनिया", "क्ष", "தமிழ் மொழி", "ខ្ញុំចង់បិទគណនីរបស់ខ្ញុំ", "ภาษาไทย ที่นี่",
        "Tiếng Việt", "Tie\u0302\u0301ng Vie\u0323\u0302t",
        "🔥🔥 this is broken 🔥", "👨\u200d👩\u200d👧\u200d👦 family emoji", "🇧🇷 flag",
        "👍🏽 ❤️ 👨\u200d💻", "☕️", "a\ufe0fb", "zero\u200bwidth\u200d", "\u180e\u180eb a\u0085b \u2028x",
        "\u00a0\u00a0b \u3000x \u1680 y", "math ∑∫√∞ ≤ ≥ ≠",
        "symbols @#$%^&*()_+-=[]{}|;:'\",.<>/?`~", "a\u0000b control \x01\x1f\x7f",
        "...", "!!!???", "--", "—", "a—b–c", "¡¿Qué?! «guillemets» „quotes“ ‘single’",
        "\u0301abc", " \u0301abc", ".\u0301", "!\u0301x",
        "email me at someone@example.com or call +1 (555) 010-9999",
        "https://example.com/path?query=1&x=y#frag",
        "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    ]
    specials = [t for t, _ in QWEN_ADDED]
    c += specials
    c += ["".join(specials), " ".join(specials), "x" + "y".join(specials) + "z",
          "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
          "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
          "<|endoftext|><|endoftext|>", "<|endoftext", "<|im_start|", "<think", "<think≯",
          "<|im_end|≯x", "a<|endoftext|>\u0301b", "  <|im_end|>  ", "\n<think>\n",
          # legacy-only added tokens (plain text for qwen-like)
          "I saw a   <mask> there", "x<mask>", "<R>   tail", "<R>\n\nz", "a [SW] b", "a[SW]b",
          "[SW]", "[SW]x", "_[SW]", "café! cafe\u0301! x", "  <both>  y", "<mask><mask>",
          "<pre>post<pre>x<pre>pos"]
    c += MULTILINGUAL
    c.append("The customer wrote in about a recurring charge. " * 6)
    c.append("a" * 3000)
    c.append("中文" * 1000)
    c.append(" " * 5000 + "end")
    # seeded random strings over a mixed alphabet
    rng = random.Random(1234)
    alphabet = (list("abcXYZ019 '\t\n\r.,!?<>|_-") + ["é", "e\u0301", "ß", "ſ", "中", "日",
                "한", "ह", "ि", "\u0301", "\u200d", "🔥", "👍", "🏽", "\u00a0", "\u3000", "\u180e",
                "\u0085", "٣", "Ⅻ", "<|im_end|>", "<think>", "'S", "'ll"])
    for n in range(60):
        c.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))))
    return c


def fnv1a64_ids(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h ^= b
            h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def make_document(fragments, separators, nbytes=1 << 20):
    """Deterministic ~1 MB text; tests/test_tokenizer.c builds the same one."""
    x = 0x9E3779B97F4A7C15
    parts, size = [], 0
    mask = 0xFFFFFFFFFFFFFFFF

    def nxt():
        nonlocal x
        x ^= x >> 12
        x ^= (x << 25) & mask
        x ^= x >> 27
        return (x * 0x2545F4914F6CDD1D) & mask

    while size < nbytes:
        s = fragments[nxt() % len(fragments)] + separators[nxt() % len(separators)]
        parts.append(s)
        size += len(s.encode("utf-8"))
    return "".join(parts)


def expect(tok, texts, split_special=False):
    tok.encode_special_tokens = split_special
    out = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    tok.encode_special_tokens = False
    return out


def main():
    tok = qwen_like()
    qjson = tok.to_str(pretty=True)
    legacy_json = legacy_from(qjson)
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              "model_max_length": 262144, "tokenizer_class": "Qwen2Tokenizer"}
    for name, text in (("qwen-like", qjson), ("legacy", legacy_json)):
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
    legacy = Tokenizer.from_str(legacy_json)
    tok = Tokenizer.from_str(qjson)       # reload: test what was written

    texts = cases()
    split_texts = [t for t in texts if "<" in t or "[" in t]
    separators = [" ", "\n", "", "  ", "\t", "\n\n", ". "]
    fragments = [t for t in texts if 0 < len(t) < 400]
    doc = make_document(fragments, separators)
    rng = random.Random(99)
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    decode_cases = []
    for n in range(40):
        ids = [rng.randrange(n_vocab) for _ in range(rng.randint(1, 12))]
        decode_cases.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})
    # byte-level tokens that split a character: decode must emit U+FFFD as HF does
    for n in range(20):
        ids = [rng.randrange(256) for _ in range(rng.randint(1, 8))]
        decode_cases.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})
    out = {
        "qwen-like": {"cases": expect(tok, texts),
                      "split_special": expect(tok, split_texts, True)},
        "legacy": {"cases": expect(legacy, texts),
                   "split_special": expect(legacy, split_texts, True)},
        "decode": decode_cases,
        "document": {"fragments": fragments, "separators": separators,
                     "bytes": len(doc.encode("utf-8"))},
    }
    for name, t in (("qwen-like", tok), ("legacy", legacy)):
        ids = t.encode(doc, add_special_tokens=False).ids
        out["document"][name] = {"n_ids": len(ids), "fnv1a64": fnv1a64_ids(ids)}
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
    print("vocab", n_vocab, "cases", len(texts), "doc bytes", out["document"]["bytes"],
          out["document"]["qwen-like"], file=sys.stderr)


if __name__ == "__main__":
    main()
