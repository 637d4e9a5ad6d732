#!/usr/bin/env python3
"""Builds the tern-tiny training corpus from public-domain / free English text shipped in Debian packages.

  python3 tools/train/build_corpus.py            (from the repo root; needs apt-get and dpkg, not root for dpkg -x)

Steps (all deterministic for a given set of package versions):

1. `apt-get download bible-kjv bible-kjv-text fortunes fortunes-min` into data/debs/ (runs `apt-get update` once
   and retries when the download fails) and `dpkg -x` each package into data/debs/root/.
   bible-kjv-text holds the King James text in a compressed random-access format (bible.data); the package's own
   reader, `bible` from bible-kjv, dumps it (`bible -f -p DIR Gen1:1-Rev22:21`, one verse a line).
2. KJV: one document per chapter, "Book N" heading + one verse per line, verse numbers dropped.
3. Fortunes: every fortune file of fortunes + fortunes-min except ascii-art (pictures, not text); Debian ships
   no offensive fortunes in these packages (fortunes-off is a separate package that is not used). Each fortune
   (between `%` lines) is one document: overstrike/backspace and bell characters removed, double-encoded UTF-8
   repaired, tabs expanded, text dedented, indentation capped at 4 spaces, runs of inner spaces collapsed,
   attribution lines normalised to "-- Name"; fortunes that are mostly non-letters (ASCII art), too short or too
   long are dropped, duplicates removed.
4. Split by document (per source): 2 % held out.
5. Chat examples (ChatML, rendered with the official Qwen3.6 template tests/fixtures/chat/qwen3.6.jinja through
   transformers' chat-template renderer): fortune requests (any or by topic), verse lookups by reference, verses
   about a word; single- and two-turn, some with a system message; half with enable_thinking=false (empty think
   block), half with a short reasoning line inside <think>...</think>. Made separately from the train and the
   held-out documents, so held-out text never leaks into training. Target: ~7 % of the characters.
6. Deterministic shuffle; written to data/corpus/{train,heldout}.txt as documents separated by DOC_SEP
   ("\\n<|endoftext|>\\n"); data/corpus/stats.json has counts, package versions and license notes;
   data/corpus/licenses/ has the packages' copyright files.
"""

import argparse
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE = os.path.join(ROOT, "tests", "fixtures", "chat", "qwen3.6.jinja")
PACKAGES = ["bible-kjv", "bible-kjv-text", "fortunes", "fortunes-min"]
DOC_SEP = "\n<|endoftext|>\n"
SEED = 20260416
HELDOUT_FRAC = 0.02
CHAT_CHAR_SHARE = 0.07

KJV_BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
    "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
    "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai",
    "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James", "1 Peter", "2 Peter",
    "1 John", "2 John", "3 John", "Jude", "Revelation",
]

LICENSES = {
    "bible-kjv-text": "King James Version text (1611): public domain (its copyright has expired; Debian copyright "
                      "file: 'The copyright for the King James Version text of the Bible is expired'). In the "
                      "United Kingdom the KJV remains under Crown letters patent.",
    "bible-kjv": "the `bible` reader program used only to decompress the text at build time (not part of the "
                 "corpus): GPL-2+ / unrestricted-use legend of the Bible Retrieval System (Chip Chapin, 1989).",
    "fortunes": "fortune-mod data files, Debian package 'fortunes' (main, DFSG-free): distributed under the "
                "BSD license of fortune-mod (Copyright (c) 1991 The Regents of the University of California); "
                "the files are collections of short quotations attributed to their authors.",
    "fortunes-min": "same as fortunes (the 'fortunes' data file set of fortune-mod), BSD license.",
}

# Fortune files whose text is not prose.
FORTUNE_SKIP = {"ascii-art"}

# Topic names for "Tell me a fortune about X" (fortune file -> phrase).
FORTUNE_TOPICS = {
    "computers": "computers", "science": "science", "love": "love", "food": "food", "wisdom": "wisdom",
    "work": "work", "politics": "politics", "literature": "literature", "sports": "sports", "pets": "pets",
    "medicine": "medicine", "law": "the law", "education": "education", "art": "art", "kids": "children",
    "men-women": "men and women", "songs-poems": "songs and poems", "linux": "Linux", "debian": "Debian",
    "startrek": "Star Trek", "humorists": "humor", "people": "people", "platitudes": "platitudes",
    "definitions": "definitions", "riddles": "riddles", "magic": "magic", "news": "the news",
    "drugs": "drugs", "pratchett": "Terry Pratchett", "tao": "the Tao", "perl": "Perl", "goedel": "logic",
    "paradoxum": "paradoxes", "zippy": "Zippy the Pinhead", "ethnic": "foreign lands",
}

VERSE_WORDS = [
    "light", "love", "water", "fire", "peace", "wisdom", "bread", "sea", "king", "heart", "mountain", "night",
    "fear", "joy", "truth", "mercy", "river", "star", "wind", "gold", "sheep", "shepherd", "vine", "rain",
    "harvest", "strength", "hope", "faith", "grace", "darkness", "morning", "earth", "heaven", "life", "death",
    "children", "city", "house", "stone", "tree", "garden", "bird", "lion", "wine", "silver", "sword", "song",
    "prayer", "friend", "brother", "mother", "father", "understanding", "knowledge", "righteousness", "salt",
    "oil", "honey", "cloud", "sun", "moon", "field", "gate", "door", "path", "word",
]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are tern-tiny, a small language model trained on old books and fortune cookies.",
    "You are a friendly assistant. Keep your answers short.",
    "You quote fortunes and verses from the King James Bible.",
]

FORTUNE_ASKS = [
    "Tell me a fortune.", "Give me a fortune cookie.", "Can you tell me my fortune?", "Share a quote with me.",
    "Say something wise.", "I need a laugh. Tell me a fortune.", "Give me a random quote.",
    "What does the fortune cookie say?", "Tell me something clever.", "Please share a fortune.",
    "Do you have a good quote for today?", "fortune", "Tell me a joke or a saying.", "Cheer me up with a quote.",
]
FORTUNE_TOPIC_ASKS = [
    "Tell me a fortune about {t}.", "Give me a quote about {t}.", "Do you know a saying about {t}?",
    "Share something funny about {t}.", "What is a good fortune about {t}?", "Quote something on {t}.",
]
FORTUNE_PREFIXES = ["", "", "", "Here is one:\n\n", "Here is a fortune for you:\n\n", "Sure.\n\n",
                    "Here you go:\n\n", "This one is from the fortune files:\n\n"]
FORTUNE_THINK = [
    "The user wants a fortune. I will pick a short one from the fortune files.",
    "A fortune is requested. Something short and witty should do.",
    "They asked for a quote. I'll share one and keep it as written.",
    "The user asks for a saying. I will give one fortune, quoted exactly.",
    "I should answer with a single fortune and nothing else.",
]
FORTUNE_TOPIC_THINK = [
    "The user wants a fortune about {t}. I will pick one on that topic.",
    "A quote about {t} is requested. One from the {f} file fits.",
    "They asked for something about {t}. I'll share a fortune on {t}.",
]
REF_ASKS = [
    "What does {r} say?", "Quote {r}.", "Recite {r} from the King James Bible.", "Can you tell me {r}?",
    "What is written in {r}?", "Read me {r}, please.", "{r}?", "Give me the text of {r} (KJV).",
]
REF_ANSWERS = ["{r} says: \"{v}\"", "{v} ({r})", "In the King James Version, {r} reads:\n\n{v}", "\"{v}\"\n\n-- {r}",
               "{r}: {v}"]
REF_THINK = [
    "The user wants the text of {r}. In the King James Version it reads as follows.",
    "They asked for {r}. I will quote the verse exactly.",
    "{r} is in the book of {b}. I'll give the KJV text.",
]
WORD_ASKS = [
    "Quote a verse about {w}.", "Give me a Bible verse that mentions {w}.", "Is there a verse about {w}?",
    "Find me a verse with the word \"{w}\".", "What does the Bible say about {w}?",
    "Tell me a scripture about {w}.",
]
WORD_ANSWERS = ["{r} says: \"{v}\"", "Here is one from {r}:\n\n{v}", "\"{v}\" ({r})", "{v}\n\n-- {r}",
                "One verse is {r}: {v}"]
WORD_THINK = [
    "The user wants a verse that mentions {w}. {r} has the word.",
    "A verse about {w}. {r} in {b} fits.",
    "I need a King James verse with \"{w}\" in it. {r} will do.",
]
FOLLOW_UPS = ["Another one, please.", "One more.", "Tell me another.", "Thanks! Another?", "And another one?",
              "Give me a different one."]


def log(msg):
    print(msg, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


# --------------------------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------------------------


def fetch_packages(debdir):
    os.makedirs(debdir, exist_ok=True)
    have = lambda p: glob.glob(os.path.join(debdir, f"{p}_*.deb"))  # noqa: E731
    missing = [p for p in PACKAGES if not have(p)]
    if missing:
        log(f"apt-get download {' '.join(missing)}")
        try:
            run(["apt-get", "download"] + missing, cwd=debdir)
        except subprocess.CalledProcessError:
            log("download failed; running apt-get update once and retrying")
            run(["apt-get", "update"])
            run(["apt-get", "download"] + missing, cwd=debdir)
    root = os.path.join(debdir, "root")
    if os.path.isdir(root):
        shutil.rmtree(root)
    versions = {}
    for p in PACKAGES:
        debs = sorted(have(p))
        assert len(debs) == 1, f"expected one .deb for {p} in {debdir}, found {debs}"
        run(["dpkg", "-x", debs[0], root])
        versions[p] = subprocess.run(["dpkg-deb", "-f", debs[0], "Version"], check=True, capture_output=True,
                                     text=True).stdout.strip()
    return root, versions


# --------------------------------------------------------------------------------------------------------------
# KJV
# --------------------------------------------------------------------------------------------------------------


def read_kjv(root):
    reader = os.path.join(root, "usr", "bin", "bible")
    data_dir = os.path.join(root, "usr", "lib")
    out = subprocess.run([reader, "-f", "-p", data_dir, "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True).stdout
    verse_re = re.compile(r"^(\S+?)(\d+):(\d+) (.*)$")
    abbrev_order, verses = [], []
    for line in out.splitlines():
        m = verse_re.match(line)
        assert m, f"unexpected KJV line: {line!r}"
        ab, ch, vs, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()
        if not abbrev_order or abbrev_order[-1] != ab:
            abbrev_order.append(ab)
        verses.append((ab, ch, vs, re.sub(r"\s+", " ", text)))
    assert len(abbrev_order) == len(KJV_BOOKS), abbrev_order
    name = dict(zip(abbrev_order, KJV_BOOKS))
    verses = [(name[ab], ch, vs, t) for ab, ch, vs, t in verses]
    assert len(verses) == 31102, len(verses)
    chapters = {}
    for book, ch, vs, t in verses:
        chapters.setdefault((book, ch), []).append((vs, t))
    docs = []
    for (book, ch), vv in chapters.items():
        text = f"{book} {ch}\n\n" + "\n".join(t for _, t in vv)
        docs.append(dict(src="kjv", text=nfc(text), book=book, chapter=ch, verses=vv))
    return docs


# --------------------------------------------------------------------------------------------------------------
# Fortunes
# --------------------------------------------------------------------------------------------------------------


def nfc(s):
    return unicodedata.normalize("NFC", s)


ATTR_RE = re.compile(r"^\s*--\s*(\S.*)$")


def clean_fortune(raw):
    s = raw.replace("\r", "")
    while "\x08" in s:  # overstrike: a backspace erases the character before it
        s2 = re.sub("[^\x08]\x08", "", s)
        s = s.replace("\x08", "") if s2 == s else s2
    s = s.replace("\x07", "")
    if re.search(r"[\x80-\xff]", s):  # double-encoded UTF-8 ("â\x80\x9c")
        try:
            s = s.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            pass
    if any((ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) < 0xa0 or c == "\ufffd" for c in s):
        return None
    lines = [ln.expandtabs(8).rstrip() for ln in s.split("\n")]
    s = textwrap.dedent("\n".join(lines)).strip("\n")
    out = []
    for ln in s.split("\n"):
        m = ATTR_RE.match(ln)
        if m:
            out.append("-- " + re.sub(r" {2,}", " ", m.group(1)))
            continue
        body = ln.lstrip(" ")
        indent = min(len(ln) - len(body), 4)
        out.append(" " * indent + re.sub(r" {2,}", " ", body))
    s = "\n".join(out)
    s = re.sub(r"\n{3,}", "\n\n", s).strip()
    letters = sum(c.isalpha() for c in s)
    nonspace = sum(not c.isspace() for c in s)
    if len(s) < 12 or len(s) > 4000 or nonspace == 0 or letters / nonspace < 0.6:
        return None
    return nfc(s)


def read_fortunes(root):
    fdir = os.path.join(root, "usr", "share", "games", "fortunes")
    docs, seen, dropped = [], set(), 0
    for path in sorted(glob.glob(os.path.join(fdir, "*"))):
        name = os.path.basename(path)
        if name.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        if name in FORTUNE_SKIP:
            continue
        with open(path, "rb") as f:
            raw = f.read().decode("utf-8", errors="replace")
        for chunk in re.split(r"(?m)^%\s*$", raw):
            if not chunk.strip():
                continue
            text = clean_fortune(chunk)
            if text is None:
                dropped += 1
                continue
            key = re.sub(r"\s+", " ", text).lower()
            if key in seen:
                continue
            seen.add(key)
            docs.append(dict(src="fortune", text=text, file=name))
    return docs, dropped


# --------------------------------------------------------------------------------------------------------------
# Chat examples
# --------------------------------------------------------------------------------------------------------------


def load_renderer():
    with open(TEMPLATE) as f:
        template = f.read()
    try:
        from transformers.utils.chat_template_utils import render_jinja_template

        def render(messages, enable_thinking):
            out = render_jinja_template(conversations=[messages], chat_template=template,
                                        add_generation_prompt=False, enable_thinking=enable_thinking)
            # transformers returns (rendered list, generation indices)
            return out[0][0] if isinstance(out, tuple) else out[0]
    except ImportError:  # same environment as transformers' renderer
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, **k: json.dumps(x, indent=indent, ensure_ascii=False)
        env.globals["raise_exception"] = raise_exception
        compiled = env.from_string(template)

        def render(messages, enable_thinking):
            return compiled.render(messages=messages, add_generation_prompt=False, enable_thinking=enable_thinking)
    return render


class ChatMaker:
    def __init__(self, rng, kjv_docs, fortune_docs, render):
        self.rng = rng
        self.render = render
        self.verses = [(d["book"], d["chapter"], vs, t) for d in kjv_docs for vs, t in d["verses"]]
        self.short_verses = [v for v in self.verses if len(v[3]) <= 300]
        self.fortunes = [d for d in fortune_docs if len(d["text"]) <= 450]
        self.by_file = {}
        for d in self.fortunes:
            self.by_file.setdefault(d["file"], []).append(d)
        self.topics = [f for f in FORTUNE_TOPICS if len(self.by_file.get(f, [])) >= 1]
        self.word_index = {}
        for w in VERSE_WORDS:
            rx = re.compile(r"\b" + re.escape(w) + r"\b", re.IGNORECASE)
            hits = [v for v in self.short_verses if rx.search(v[3])]
            if hits:
                self.word_index[w] = hits

    def exchange(self, thinking):
        """One (user, assistant, reasoning) triple."""
        r = self.rng
        kind = r.choices(["fortune", "fortune_topic", "ref", "word"], weights=[3, 2, 2, 3])[0]
        if kind == "fortune_topic" and not self.topics:
            kind = "fortune"
        if kind == "word" and not self.word_index:
            kind = "ref"
        if kind == "fortune":
            d = r.choice(self.fortunes)
            user = r.choice(FORTUNE_ASKS)
            answer = r.choice(FORTUNE_PREFIXES) + d["text"]
            think = r.choice(FORTUNE_THINK)
        elif kind == "fortune_topic":
            f = r.choice(self.topics)
            d = r.choice(self.by_file[f])
            t = FORTUNE_TOPICS[f]
            user = r.choice(FORTUNE_TOPIC_ASKS).format(t=t)
            answer = r.choice(FORTUNE_PREFIXES) + d["text"]
            think = r.choice(FORTUNE_TOPIC_THINK).format(t=t, f=f)
        elif kind == "ref":
            b, c, v, text = r.choice(self.short_verses)
            ref = f"{b} {c}:{v}"
            user = r.choice(REF_ASKS).format(r=ref)
            answer = r.choice(REF_ANSWERS).format(r=ref, v=text)
            think = r.choice(REF_THINK).format(r=ref, b=b)
        else:
            w = r.choice(sorted(self.word_index))
            b, c, v, text = r.choice(self.word_index[w])
            ref = f"{b} {c}:{v}"
            user = r.choice(WORD_ASKS).format(w=w)
            answer = r.choice(WORD_ANSWERS).format(r=ref, v=text)
            think = r.choice(WORD_THINK).format(w=w, r=ref, b=b)
        if r.random() < 0.15:
            user = user.lower() if r.random() < 0.5 else user.rstrip(".?")
        return user, answer, (think if thinking else "")

    def conversation(self):
        r = self.rng
        thinking = r.random() < 0.5
        messages = []
        if r.random() < 0.25:
            messages.append({"role": "system", "content": r.choice(SYSTEM_PROMPTS)})
        turns = 2 if r.random() < 0.2 else 1
        for i in range(turns):
            user, answer, think = self.exchange(thinking)
            if i > 0 and r.random() < 0.5:
                user = r.choice(FOLLOW_UPS)
            messages.append({"role": "user", "content": user})
            msg = {"role": "assistant", "content": answer}
            if think:
                msg["reasoning_content"] = think
            messages.append(msg)
        text = self.render(messages, thinking)
        assert text.endswith("<|im_end|>\n"), text[-40:]
        assert text.count("<|im_start|>") == text.count("<|im_end|>")
        return dict(src="chat", text=nfc(text), thinking=thinking)

    def make(self, target_chars):
        docs, n = [], 0
        while n < target_chars:
            d = self.conversation()
            docs.append(d)
            n += len(d["text"])
        return docs


# --------------------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------------------


def split_docs(docs, rng, frac):
    idx = list(range(len(docs)))
    rng.shuffle(idx)
    n_held = max(1, round(len(docs) * frac))
    held = set(idx[:n_held])
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def write_split(path, docs):
    for d in docs:
        assert DOC_SEP.strip() not in d["text"], "document contains the separator token"
    with open(path, "w", encoding="utf-8") as f:
        f.write(DOC_SEP.join(d["text"] for d in docs))


def read_split(path):
    """Inverse of write_split (used by the tokenizer and training scripts)."""
    with open(path, encoding="utf-8") as f:
        return f.read().split(DOC_SEP)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "data"), help="data directory (default: data/)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()

    debdir = os.path.join(args.data, "debs")
    outdir = os.path.join(args.data, "corpus")
    os.makedirs(outdir, exist_ok=True)
    root, versions = fetch_packages(debdir)
    log(f"packages: {versions}")

    kjv = read_kjv(root)
    fortunes, dropped = read_fortunes(root)
    log(f"KJV: {len(kjv)} chapters, {sum(len(d['text']) for d in kjv):,} chars; fortunes: {len(fortunes)} "
        f"({dropped} dropped), {sum(len(d['text']) for d in fortunes):,} chars")

    rng = random.Random(args.seed)
    kjv_tr, kjv_ho = split_docs(kjv, rng, HELDOUT_FRAC)
    fo_tr, fo_ho = split_docs(fortunes, rng, HELDOUT_FRAC)
    render = load_renderer()
    splits = {}
    for name, k, fo in (("train", kjv_tr, fo_tr), ("heldout", kjv_ho, fo_ho)):
        plain = sum(len(d["text"]) for d in k + fo)
        target = plain * CHAT_CHAR_SHARE / (1 - CHAT_CHAR_SHARE)
        chat = ChatMaker(random.Random(f"{args.seed}-{name}"), k, fo, render).make(target)
        docs = k + fo + chat
        random.Random(f"{args.seed}-shuffle-{name}").shuffle(docs)
        splits[name] = docs
        write_split(os.path.join(outdir, f"{name}.txt"), docs)

    lic_dir = os.path.join(outdir, "licenses")
    os.makedirs(lic_dir, exist_ok=True)
    for p in PACKAGES:
        shutil.copyfile(os.path.join(root, "usr", "share", "doc", p, "copyright"),
                        os.path.join(lic_dir, f"{p}.copyright"))

    stats = {"packages": versions, "licenses": LICENSES, "doc_separator": DOC_SEP, "seed": args.seed,
             "heldout_fraction": HELDOUT_FRAC, "chat_char_share_target": CHAT_CHAR_SHARE,
             "fortunes_dropped": dropped, "fortune_files_skipped": sorted(FORTUNE_SKIP), "splits": {}}
    for name, docs in splits.items():
        s = {}
        for src in ("kjv", "fortune", "chat"):
            sel = [d for d in docs if d["src"] == src]
            s[src] = {"docs": len(sel), "chars": sum(len(d["text"]) for d in sel)}
        s["chat"]["thinking"] = sum(1 for d in docs if d["src"] == "chat" and d["thinking"])
        s["total"] = {"docs": len(docs), "chars": sum(len(d["text"]) for d in docs),
                      "bytes": os.path.getsize(os.path.join(outdir, f"{name}.txt"))}
        stats["splits"][name] = s
        log(f"{name}: " + ", ".join(f"{k} {v['docs']} docs / {v['chars']:,} chars" for k, v in s.items()))
    with open(os.path.join(outdir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
        f.write("\n")
    log(f"wrote {outdir}/train.txt, heldout.txt, stats.json, licenses/")


if __name__ == "__main__":
    sys.exit(main())
