#!/usr/bin/env python3
"""Turns what the GPU run returned into the model directory models/tern-tiny/.

  python3 tools/train/finalize.py --src DIR_RETURNED [--dst models/tern-tiny]
  python3 tools/train/finalize.py [--dst models/tern-tiny]                   (refresh a finished directory)
  python3 tools/train/finalize.py --readme-only [--dst models/tern-tiny]     (README only; placeholders if no run)

DIR_RETURNED is what run_gpu.sh left under $OUT/tern-tiny/: config.json, generation_config.json, the weights
(model.safetensors, or shards model-0000i-of-0000n.safetensors + model.safetensors.index.json when the run split
them to stay under the per-file transfer limit), reference.safetensors and metrics.json.

Steps: copy config.json, generation_config.json, reference.safetensors, metrics.json; merge the shards into one
model.safetensors (tensor bytes unchanged; checked by reading both back); copy tokenizer.json,
tokenizer_config.json and chat_template.jinja from data/tokenizer/ (checked against the sha256 the run recorded);
recompute the oracle references from the merged directory with the local transformers and compare them with the
returned reference.safetensors (or write it, for the prompt train.py would choose, when the run did not return it)
and make metrics.json's `reference` section describe that file's prompt; draw loss.png (plot_losses.py); write
README.md (the model card) from metrics.json. Without --src only the last three steps run, on --dst as it is.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "chat_template.jinja", "reference.safetensors", "metrics.json", "loss.png",
               "README.md")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def merge_weights(src, dst):
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    index = os.path.join(src, "model.safetensors.index.json")
    if not os.path.exists(index):
        shutil.copyfile(os.path.join(src, "model.safetensors"), os.path.join(dst, "model.safetensors"))
        return 1
    with open(index) as f:
        idx = json.load(f)
    files = sorted(set(idx["weight_map"].values()))
    tensors = {}
    for fn in files:
        with safe_open(os.path.join(src, fn), framework="pt") as f:
            for name in f.keys():
                assert idx["weight_map"][name] == fn and name not in tensors, name
                tensors[name] = f.get_tensor(name)
    assert set(tensors) == set(idx["weight_map"]), "index and shards disagree"
    assert sum(t.numel() * t.element_size() for t in tensors.values()) == idx["metadata"]["total_size"]
    out = os.path.join(dst, "model.safetensors")
    save_file(OrderedDict((n, tensors[n]) for n in sorted(tensors)), out, metadata={"format": "pt"})
    with safe_open(out, framework="pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        for name in f.keys():
            t = f.get_tensor(name)
            assert t.dtype == tensors[name].dtype and torch.equal(t, tensors[name]), name
    return len(files)


def verify_references(dst, data_dir):
    """Recomputes the references from the merged directory with the local transformers (fp32, CPU, eager).
    With a reference.safetensors in dst: compares (largest relative difference per tensor). Without one (the GPU
    run did not return it): computes it for the prompt train.py would choose and writes it.
    Returns (errors per tensor or {}, the oracle's robustness info for the file's prompt)."""
    sys.path.insert(0, HERE)
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer
    import train as T

    mf = T.mf
    with open(os.path.join(dst, "config.json")) as f:
        text = json.load(f)["text_config"]
    spec = dict(nested=True, prefix="model.language_model.", text=text)
    T.force_torch_gdn()
    mf.install_call_counters()
    cfg, model, mtp, *_ = T.reload_saved(dst, spec, 0)
    T.cache_kwarg_shim(model)
    tok = Tokenizer.from_file(os.path.join(dst, "tokenizer.json"))
    path = os.path.join(dst, "reference.safetensors")
    errs, label, report = {}, None, None
    if not os.path.exists(path):
        stream, docs, enc = T.token_stream(tok, os.path.join(data_dir, "corpus", "heldout.txt"),
                                           tok.token_to_id("<|endoftext|>"))
        prompt, label, report = T.choose_prompt(model, mtp, T.prompt_candidates(docs, enc, stream, mf.PROMPT_LEN))
        ref, info = mf.compute_references(model, mtp, prompt, cfg, False)
        save_file(OrderedDict((k, v.contiguous()) for k, v in ref.items()), path,
                  metadata={"tern_oracle": "format=1;fixture=tern-tiny;full_logits=false"})
        print(f"reference.safetensors was not returned: computed here for {label}")
    else:
        ref_old = load_file(path)
        prompt = ref_old["prompt"].long()
        ref, info = mf.compute_references(model, mtp, prompt, cfg, False)
        for k, v in ref_old.items():
            if v.dtype == torch.int32:
                errs[k] = 0.0 if torch.equal(v, ref[k].to(torch.int32)) else float("inf")
            else:
                errs[k] = mf.rel_err(ref[k].float(), v)
    keep = ("logits_std", "mtp_logits_std", "greedy_min_margin", "min_router_gap", "prefix_rel_err",
            "greedy_vs_recompute_rel_err", "mtp_incremental_rel_err", "final_to_logits_rel_err")
    section = {k: info[k] for k in keep if k in info}
    section.update(prompt_text=tok.decode(prompt.tolist()),
                   greedy_text=tok.decode(ref["greedy.tokens"].tolist(), skip_special_tokens=False))
    if label is not None:
        section.update(prompt_source=label, prompt_candidates=report, computed_by="finalize.py")
    return errs, section


def planned_metrics(data_dir):
    """What the card can say before the GPU run: train.py's default configuration, parameter counts and the corpus
    statistics (when data/ exists)."""
    sys.path.insert(0, HERE)
    import train as T
    from train_tokenizer import BPE_VOCAB

    n_tok = BPE_VOCAB + len(T.ADDED_TOKENS)
    vocab = (n_tok + 63) // 64 * 64
    ids = {t: BPE_VOCAB + i for i, (t, _) in enumerate(T.ADDED_TOKENS)}
    special = dict(endoftext=ids["<|endoftext|>"], im_start=ids["<|im_start|>"], im_end=ids["<|im_end|>"],
                   vision_start=ids["<|vision_start|>"], vision_end=ids["<|vision_end|>"],
                   image=ids["<|image_pad|>"], video=ids["<|video_pad|>"])
    args = T.build_parser().parse_args(["--out", "-"])
    fields = T.text_config_fields(vocab, special, args.preset)
    cfg, model, mtp = T.build_train_models(fields, args.seed, "sdpa", "eager")
    corpus = {}
    for sub in ("corpus", "tokenizer"):
        fn = os.path.join(data_dir, sub, "stats.json")
        if os.path.exists(fn):
            with open(fn) as f:
                corpus[sub] = json.load(f)
    return {"text_config": fields, "params": T.count_params(model, mtp, cfg), "args": vars(args),
            "vocab_rows": vocab, "tokenizer_size": n_tok, "corpus": corpus}


def fmt(x, spec, missing="(pending)"):
    return missing if x is None else format(x, spec)


def model_card(metrics, dst):
    m = metrics or {}
    tc = m.get("text_config", {})
    p = m.get("params", {})
    fin = m.get("final", {})
    a = m.get("args", {})
    tim = m.get("timing", {})
    corpus = m.get("corpus", {})
    cstats = corpus.get("corpus", {})
    tstats = corpus.get("tokenizer", {}).get("corpus", {})
    lic = cstats.get("licenses", {})
    pk = cstats.get("packages", {})
    sp = cstats.get("splits", {})
    ref = m.get("reference", {})

    def g(d, *keys):
        for k in keys:
            if not isinstance(d, dict) or k not in d:
                return None
            d = d[k]
        return d

    if a.get("batch"):
        train_cmd = (f"train.py --device {a.get('device')} --batch {a.get('batch')} --epochs {a.get('epochs')} "
                     f"--experts {a.get('experts')} --lr {a.get('lr')} --time-budget-s {a.get('time_budget_s'):g} "
                     f"--seed {a.get('seed')} --shard-mib {a.get('shard_mib'):g} --no-tokenizer-copy")
    else:
        train_cmd = "(pending)"
    files = []
    for fn in MODEL_FILES:
        path = os.path.join(dst, fn)
        if os.path.exists(path) and fn != "README.md":
            files.append(f"| `{fn}` | {os.path.getsize(path):,} |")
    files_table = "\n".join(files) if files else "| (pending) | |"
    layer_types = tc.get("layer_types")
    pattern = ("".join("L" if t == "linear_attention" else "A" for t in layer_types) if layer_types else None)
    rot = int(tc["head_dim"] * tc["partial_rotary_factor"]) if tc else None

    def split_row(name):
        s = sp.get(name, {})
        t = tstats.get(name, {})
        return (f"| {name} | {fmt(g(s, 'kjv', 'docs'), ',')} / {fmt(g(s, 'fortune', 'docs'), ',')} / "
                f"{fmt(g(s, 'chat', 'docs'), ',')} | {fmt(g(s, 'total', 'chars'), ',')} | "
                f"{fmt(t.get('tokens_packed'), ',')} |")

    return f"""# tern-tiny

A small but **trained** model of the exact Qwen3.6-35B-A3B architecture (Hugging Face `model_type`
`qwen3_5_moe`, text model `qwen3_5_moe_text`): Gated DeltaNet and gated full attention in a 3 : 1 pattern,
a routed mixture of experts plus a gated shared expert in every layer, partial RoPE, GQA, an untied `lm_head`
and one multi-token-prediction (MTP) layer. It is tern's embedded default model, so that `tern` works out of
the box and quantization quality, MTP acceptance, the prompt cache and the server can be measured on a model
whose outputs mean something. It writes English in the style of the King James Bible and of Unix fortune
cookies and answers ChatML requests for a fortune or a verse; it knows nothing else.

Built by `tools/train/` (see `tools/train/README.md`); every number below comes from `metrics.json`.

## Architecture

| | tern-tiny | Qwen3.6-35B-A3B |
|---|---|---|
| hidden size | {tc.get('hidden_size', '(pending)')} | 2048 |
| layers (L = Gated DeltaNet, A = gated attention) | {len(layer_types) if layer_types else '(pending)'}: {pattern or ''} | 40: (LLLA) x 10 |
| attention q / kv heads, head dim | {tc.get('num_attention_heads', '')} / {tc.get('num_key_value_heads', '')}, {tc.get('head_dim', '')} | 16 / 2, 256 |
| RoPE | theta {tc.get('rope_parameters', {}).get('rope_theta', '')}, partial {tc.get('partial_rotary_factor', '')} (rotary dim {rot}), mrope_section {tc.get('rope_parameters', {}).get('mrope_section', '')} | theta 1e7, partial 0.25 (64), [11, 11, 10] |
| GDN k heads x dim, v heads x dim, conv | {tc.get('linear_num_key_heads', '')} x {tc.get('linear_key_head_dim', '')}, {tc.get('linear_num_value_heads', '')} x {tc.get('linear_value_head_dim', '')}, {tc.get('linear_conv_kernel_dim', '')} | 16 x 128, 32 x 128, 4 |
| routed experts, per token, intermediate | {tc.get('num_experts', '')}, {tc.get('num_experts_per_tok', '')}, {tc.get('moe_intermediate_size', '')} | 256, 8, 512 |
| shared expert intermediate | {tc.get('shared_expert_intermediate_size', '')} | 512 |
| vocabulary rows (tokenizer ids) | {m.get('vocab_rows', '(pending)')} ({m.get('tokenizer_size', '')}) | 248320 (248077) |
| MTP layers | 1 | 1 |
| parameters, total (incl. MTP) | {fmt(p.get('total'), ',')} | 35.95 B (incl. vision) |
| parameters without MTP | {fmt(p.get('main_without_mtp'), ',')} | 34.66 B |
| MTP parameters | {fmt(p.get('mtp'), ',')} | 0.84 B |

Checkpoint layout as the Qwen3.6 release: nested `config.json` (`qwen3_5_moe` with a `text_config`; the
`vision_config` is a stub, there are no vision weights), BF16 `model.safetensors` with `model.language_model.*`,
`lm_head.weight`, fused routed experts (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows first, and
`mlp.experts.down_proj` [E, H, I]) and the MTP layer as `mtp.*` (fused experts, 3.6 layout). Tokenizer: byte-level
BPE with the Qwen3.5/3.6 pre-tokenizer (NFC, the `\\p{{M}}` split regex, ByteLevel without regex), 8,000 BPE tokens
and the 33 Qwen added tokens with their real strings, order and special flags (`<|endoftext|>` =
{g(m, 'text_config', 'bos_token_id')}, `<|im_end|>` = eos); the official Qwen3.6 chat template.

## Files

| file | bytes |
|---|---|
{files_table}

`reference.safetensors` holds golden outputs in the oracle's format (tools/oracle/README.md) for a held-out
130-token prompt ({ref.get('prompt_source', 'chosen among 8 held-out candidates as the one farthest from a tie')}), computed with transformers in fp32 on the CPU from these exact BF16 files: per-layer hidden
states, last-position logits for prompt lengths 1, 63, 64, 65, 130, 32 cached greedy tokens from the first 16
prompt tokens with their top-1/top-2 margins, and the MTP output. Smallest greedy margin
{fmt(ref.get('greedy_min_margin'), '.4f')}, smallest router top-k gap {fmt(ref.get('min_router_gap'), '.2e')}.

## Results (held-out text, BF16 weights, fp32 math)

| metric | value |
|---|---|
| held-out perplexity (LM) | **{fmt(fin.get('heldout_ppl'), '.3f')}** (cross-entropy {fmt(fin.get('heldout_lm_loss'), '.4f')} nats/token) |
| LM top-1 accuracy | {fmt(fin.get('heldout_lm_top1'), '.3%')} |
| MTP draft perplexity (token t+2) | {fmt(fin.get('heldout_mtp_ppl'), '.3f')} |
| MTP top-1 = actual token t+2 | {fmt(fin.get('mtp_accept_vs_actual'), '.3%')} |
| MTP top-1 = main model's greedy token at t+2 (greedy speculative acceptance) | **{fmt(fin.get('mtp_accept_vs_greedy'), '.3%')}** |
| held-out tokens | {fmt(fin.get('heldout_tokens'), ',')} (windows of {a.get('seq_len', '')} tokens) |

![loss curve](loss.png)

## Training

    bash tools/train/run_gpu.sh        # on one H200; then tools/train/finalize.py --src <returned dir>
    # the training call it made: {train_cmd}

| | |
|---|---|
| hardware, software | {m.get('device_name', '(pending)')}; torch {m.get('torch', '')}, transformers {m.get('transformers', '')} |
| steps (saved snapshot: lowest held-out loss) | {fmt(m.get('final_step'), ',')} ({fmt(m.get('best_step'), ',')}) |
| tokens per step | {a.get('batch') or 'auto (16..64)'} x {a.get('seq_len', '')} (+2 for the MTP target), documents packed with `<|endoftext|>` |
| training time | {fmt(tim.get('train_s'), '.0f')} s ({fmt(tim.get('mean_step_s') and tim['mean_step_s'] * 1000, '.0f')} ms/step), whole run {fmt(tim.get('total_s'), '.0f')} s |
| optimizer | AdamW (0.9, 0.95), lr {a.get('lr', '')}, warmup {a.get('warmup_steps', '')} steps, cosine to {a.get('min_lr_ratio', '')} x (time- and step-based), weight decay {a.get('weight_decay', '')}, clip {a.get('grad_clip', '')}; fp32 master weights{', bf16 autocast' if str(m.get('device', 'cuda')).startswith('cuda') else ''} |
| loss | LM + {a.get('mtp_weight', '')} x MTP (draft from final-normed h_t and embed(x_(t+1)) predicts x_(t+2)) + {a.get('aux_weight', '')} x router load balance |

## Data and licenses

Public-domain and free English text from Debian packages, fetched and cleaned by `tools/train/build_corpus.py`:

| package | version | license |
|---|---|---|
| bible-kjv-text | {pk.get('bible-kjv-text', '')} | {lic.get('bible-kjv-text', 'King James Version (1611): public domain')} |
| fortunes, fortunes-min | {pk.get('fortunes', '')} | {lic.get('fortunes', 'BSD license of fortune-mod')} |
| bible-kjv | {pk.get('bible-kjv', '')} | {lic.get('bible-kjv', 'decompressor only, not part of the corpus')} |

About 7 % of the characters are chat examples made from the same text (fortune and verse requests, rendered
with the Qwen3.6 chat template, half with an empty think block and half with a short reasoning line). The
split is by document; held-out documents (and chat examples made from them) are never trained on.

| split | documents (KJV chapters / fortunes / chats) | characters | tokens (packed) |
|---|---|---|---|
{split_row('train')}
{split_row('heldout')}

The weights are released with tern under the repository's terms; the training text is public domain (KJV) or
BSD-licensed (fortunes), see the packages' copyright files.
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", help="directory returned by run_gpu.sh ($OUT/tern-tiny)")
    ap.add_argument("--dst", default=os.path.join(ROOT, "models", "tern-tiny"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "data", "tokenizer"))
    ap.add_argument("--readme-only", action="store_true", help="only (re)write README.md from dst/metrics.json")
    ap.add_argument("--no-verify", action="store_true", help="skip recomputing the references locally")
    args = ap.parse_args()
    os.makedirs(args.dst, exist_ok=True)

    if not args.readme_only and args.src:
        for fn in ("config.json", "generation_config.json", "reference.safetensors", "metrics.json"):
            if fn == "reference.safetensors" and not os.path.exists(os.path.join(args.src, fn)):
                if os.path.exists(os.path.join(args.dst, fn)):
                    os.remove(os.path.join(args.dst, fn))
                continue
            shutil.copyfile(os.path.join(args.src, fn), os.path.join(args.dst, fn))
        n = merge_weights(args.src, args.dst)
        print(f"model.safetensors from {n} file(s): {os.path.getsize(os.path.join(args.dst, 'model.safetensors')):,} bytes")
        with open(os.path.join(args.dst, "metrics.json")) as f:
            metrics = json.load(f)
        want = metrics.get("tokenizer_sha256", {})
        for fn in TOKENIZER_FILES:
            src = os.path.join(args.src, fn) if os.path.exists(os.path.join(args.src, fn)) else os.path.join(args.tokenizer, fn)
            if fn in want:
                assert sha256(src) == want[fn], f"{src} is not the file the model was trained with"
            shutil.copyfile(src, os.path.join(args.dst, fn))
    if not args.readme_only and (not args.no_verify
                                 or not os.path.exists(os.path.join(args.dst, "reference.safetensors"))):
        errs, section = verify_references(args.dst, os.path.dirname(os.path.abspath(args.tokenizer)))
        if errs:
            worst = max(errs.values())
            print(f"references recomputed locally: max rel err {worst:.2e} ("
                  + ", ".join(f"{k} {v:.1e}" for k, v in errs.items() if v > 0) + ")")
            assert worst < 1e-3, errs
        # metrics.json must describe the prompt that is in reference.safetensors (the GPU run's description is
        # kept as reference_gpu_run when they differ, e.g. when the references were made here).
        mpath = os.path.join(args.dst, "metrics.json")
        with open(mpath) as f:
            metrics = json.load(f)
        old = metrics.get("reference") or {}
        if old.get("prompt_text") != section["prompt_text"]:
            metrics["reference_gpu_run"] = old
            metrics["reference"] = section
            with open(mpath, "w") as f:
                json.dump(metrics, f, indent=1)
                f.write("\n")
            print("metrics.json: reference section updated for the prompt in reference.safetensors")
    if not args.readme_only:
        subprocess.run([sys.executable, os.path.join(HERE, "plot_losses.py"), os.path.join(args.dst, "metrics.json")],
                       check=True)
    mpath = os.path.join(args.dst, "metrics.json")
    metrics = None
    if os.path.exists(mpath):
        with open(mpath) as f:
            metrics = json.load(f)
    else:
        metrics = planned_metrics(os.path.dirname(os.path.abspath(args.tokenizer)))
        print("no metrics.json: README.md from the planned configuration, results pending")
    with open(os.path.join(args.dst, "README.md"), "w") as f:
        f.write(model_card(metrics, args.dst))
    total = sum(os.path.getsize(os.path.join(args.dst, fn)) for fn in os.listdir(args.dst))
    print(f"wrote {args.dst}/README.md; directory total {total / 1e6:.2f} MB")
    assert total <= 40e6, "model directory over 40 MB"


if __name__ == "__main__":
    main()
