#!/usr/bin/env python3
"""Trains tern-tiny: a small, real Qwen3.5/3.6 MoE text model (HF model_type `qwen3_5_moe`) with its MTP head.

  python3 tools/train/train.py --out models/tern-tiny [--device cuda] [--time-budget-s 300] [--max-steps N]

Inputs: data/corpus/{train,heldout}.txt (build_corpus.py) and data/tokenizer/ (train_tokenizer.py).

Model: transformers' `Qwen3_5MoeForCausalLM` + the oracle's `MTPHead` (tools/oracle/make_fixtures.py, the math the
C engine implements), every block type of the full model in the same ratios (3 Gated DeltaNet : 1 gated attention,
routed top-k experts + gated shared expert in every layer, partial RoPE 0.25, GQA, untied lm_head, one MTP layer).
See TEXT_CONFIG below and tools/train/README.md.

Training: packed documents separated by <|endoftext|>, windows of --seq-len (+2 tokens for the MTP target);
loss = LM cross-entropy + --mtp-weight * MTP cross-entropy (the draft at position t sees the final-normed hidden
state h_t and embed(x_{t+1}) and predicts x_{t+2}) + --aux-weight * per-layer switch load-balancing loss.
AdamW, fp32 master weights, bf16 autocast on CUDA, linear warmup then cosine decay, where the cosine progress is
max(step / total_steps, elapsed / --time-budget-s): the schedule always ends when the time budget does.
total_steps comes from --max-steps or --epochs. The held-out loss is measured every --eval-every-s seconds and the
snapshot with the lowest held-out LM loss is the one saved.

Output (--out): config.json (nested published form), generation_config.json, model.safetensors (BF16, names
`model.language_model.*`, `lm_head.weight`, fused experts, `mtp.*` 3.6 layout) written with the oracle's writer,
tokenizer.json, tokenizer_config.json, chat_template.jinja, and, computed from the SAVED files reloaded into fp32
(as the oracle does): reference.safetensors (oracle format, 130-token held-out prompt, via the oracle's
compute_references) and metrics.json (held-out perplexity, MTP top-1 acceptance, the loss log, timings, config,
parameter counts, corpus statistics).
"""

import argparse
import hashlib
import inspect
import json
import math
import os
import shutil
import sys
import time
import traceback
from collections import OrderedDict

os.environ.setdefault("USE_HUB_KERNELS", "0")  # never try to fetch kernels from a hub (no network)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "oracle"))

T0 = time.time()


def import_oracle():
    """Imports tools/oracle/make_fixtures.py without letting its import-time environment defaults (one CPU thread,
    no visible GPU) leak into this process: torch is already initialised and CUDA has not been touched yet."""
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
    saved = {k: os.environ.get(k) for k in keys}
    import make_fixtures as mf
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    return mf


mf = import_oracle()
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import Qwen3_5MoeForCausalLM  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf_qwen  # noqa: E402

from build_corpus import read_split  # noqa: E402
from train_tokenizer import ADDED_TOKENS  # noqa: E402

L, A = mf.L, mf.A

# --------------------------------------------------------------------------------------------------------------
# Model configuration
# --------------------------------------------------------------------------------------------------------------


def text_config_fields(vocab_size, special, preset):
    """Published-form text_config (same fields as the oracle's tiny fixture / the Qwen3.6 release)."""
    if preset == "full":
        dims = dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                    linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                    linear_value_head_dim=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=64,
                    shared_expert_intermediate_size=64, mrope_section=[3, 3, 2])
    elif preset == "small":  # CPU smoke tests only
        dims = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                    linear_value_head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                    shared_expert_intermediate_size=32, mrope_section=[2, 1, 1])
    else:
        raise ValueError(preset)
    n = dims["num_hidden_layers"]
    rotary = int(dims["head_dim"] * 0.25)
    assert rotary % 2 == 0 and sum(dims["mrope_section"]) == rotary // 2
    return OrderedDict([
        ("model_type", "qwen3_5_moe_text"),
        ("attention_bias", False),
        ("attention_dropout", 0.0),
        ("attn_output_gate", True),
        ("bos_token_id", special["endoftext"]),
        ("dtype", "bfloat16"),
        ("eos_token_id", special["endoftext"]),
        ("full_attention_interval", 4),
        ("head_dim", dims["head_dim"]),
        ("hidden_act", "silu"),
        ("hidden_size", dims["hidden_size"]),
        ("initializer_range", 0.02),
        ("layer_types", [A if i % 4 == 3 else L for i in range(n)]),
        ("linear_conv_kernel_dim", 4),
        ("linear_key_head_dim", dims["linear_key_head_dim"]),
        ("linear_num_key_heads", dims["linear_num_key_heads"]),
        ("linear_num_value_heads", dims["linear_num_value_heads"]),
        ("linear_value_head_dim", dims["linear_value_head_dim"]),
        ("mamba_ssm_dtype", "float32"),
        ("max_position_embeddings", 262144),
        ("moe_intermediate_size", dims["moe_intermediate_size"]),
        ("mtp_num_hidden_layers", 1),
        ("mtp_use_dedicated_embeddings", False),
        ("num_attention_heads", dims["num_attention_heads"]),
        ("num_experts", dims["num_experts"]),
        ("num_experts_per_tok", dims["num_experts_per_tok"]),
        ("num_hidden_layers", n),
        ("num_key_value_heads", dims["num_key_value_heads"]),
        ("output_router_logits", False),
        ("pad_token_id", None),
        ("partial_rotary_factor", 0.25),
        ("rms_norm_eps", 1e-06),
        ("rope_parameters", OrderedDict([
            ("mrope_interleaved", True),
            ("mrope_section", dims["mrope_section"]),
            ("partial_rotary_factor", 0.25),
            ("rope_theta", 10000000),
            ("rope_type", "default"),
        ])),
        ("router_aux_loss_coef", 0.001),
        ("shared_expert_intermediate_size", dims["shared_expert_intermediate_size"]),
        ("use_cache", True),
        ("vocab_size", vocab_size),
    ])


def special_ids(tok):
    ids = {t: tok.token_to_id(t) for t, _ in ADDED_TOKENS}
    return dict(endoftext=ids["<|endoftext|>"], im_start=ids["<|im_start|>"], im_end=ids["<|im_end|>"],
                vision_start=ids["<|vision_start|>"], vision_end=ids["<|vision_end|>"],
                image=ids["<|image_pad|>"], video=ids["<|video_pad|>"])


def checkpoint_spec(text_fields, special, seed):
    """The oracle's fixture spec for a Qwen3.6-release-style checkpoint (like its `tiny` fixture), text only."""
    return dict(
        seed=seed, text=text_fields, nested=True, prefix="model.language_model.", main_experts="fused",
        mtp_experts="fused", dtype=torch.bfloat16, f32_suffixes=(), shards=1, visual=False, special=special,
        generation=OrderedDict([
            ("bos_token_id", special["endoftext"]),
            ("do_sample", True),
            ("eos_token_id", [special["im_end"], special["endoftext"]]),
            ("pad_token_id", special["endoftext"]),
            ("temperature", 0.7),
            ("top_k", 20),
            ("top_p", 0.95),
        ]),
    )


def write_weights(spec, outdir, tensors, shard_bytes):
    """model.safetensors (the oracle's writer), or, when shard_bytes > 0 and the weights exceed it, greedy shards
    model-0000i-of-0000n.safetensors of at most shard_bytes each in name order + model.safetensors.index.json
    (same format as the oracle's sharded fixture). Sharding only serves transport limits; finalize.py merges."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if not shard_bytes or total <= shard_bytes:
        mf.write_checkpoint(dict(spec, shards=1), outdir, tensors)
        return ["model.safetensors"]
    groups, cur, acc = [], OrderedDict(), 0
    for name, t in tensors.items():
        nb = t.numel() * t.element_size()
        assert nb <= shard_bytes, f"tensor {name} alone exceeds the shard size"
        if cur and acc + nb > shard_bytes:
            groups.append(cur)
            cur, acc = OrderedDict(), 0
        cur[name] = t
        acc += nb
    groups.append(cur)
    n = len(groups)
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map = OrderedDict()
    for fn, g in zip(files, groups):
        save_file(g, os.path.join(outdir, fn), metadata={"format": "pt"})
        weight_map.update((name, fn) for name in g)
    mf.write_json(os.path.join(outdir, "model.safetensors.index.json"),
                  OrderedDict([("metadata", {"total_size": total}), ("weight_map", weight_map)]))
    mf.write_json(os.path.join(outdir, "generation_config.json"), spec["generation"])
    return files + ["model.safetensors.index.json"]


def write_config(spec, outdir):
    """config.json in the nested published form. The oracle's writer adds its tiny fixture's vision_config; the
    text model has no vision tower, so only its out_hidden_size is made consistent with the text width."""
    cfg = mf.config_json(spec)
    cfg["vision_config"]["out_hidden_size"] = spec["text"]["hidden_size"]
    mf.write_json(os.path.join(outdir, "config.json"), cfg)


# --------------------------------------------------------------------------------------------------------------
# Model construction and initialisation
# --------------------------------------------------------------------------------------------------------------


class RotaryPositions3D(nn.Module):
    """Wraps MTPHead's rotary embedding: transformers 5.17 requires (3, batch, positions) position ids (mRoPE rows)
    where 5.24 also accepts (batch, positions), which is what MTPHead passes. Text positions: the three rows are
    equal, so this changes nothing on 5.24. The wrapped module keeps only a non-persistent buffer (no state)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, position_ids):
        if position_ids.ndim == 2:
            position_ids = position_ids[None].expand(3, -1, -1)
        return self.inner(x, position_ids)


def patch_mtp(mtp):
    if not isinstance(mtp.rotary, RotaryPositions3D):
        mtp.rotary = RotaryPositions3D(mtp.rotary)
    return mtp


def build_train_models(text_fields, seed, attn_impl, experts_impl):
    cfg = mf.text_config_from_fields(text_fields)
    cfg._attn_implementation = attn_impl
    cfg._experts_implementation = experts_impl
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(cfg)
    mtp = patch_mtp(mf.MTPHead(cfg))
    mtp.layer_cfg._attn_implementation = attn_impl
    mtp.layer_cfg._experts_implementation = experts_impl
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "lm_head must be untied"
    init_weights(model, mtp, seed)
    return cfg, model, mtp


@torch.no_grad()
def init_weights(model, mtp, seed):
    """Explicit init of every parameter (main model and MTP head, whose inner layer transformers leaves
    uninitialised): projections, embeddings, routers, experts N(0, 0.02); (1+w) RMSNorms 0; gated GDN norm 1;
    depthwise conv U(-0.5, 0.5) (PyTorch's default for it); GDN decay as in Mamba2 / FLA: A ~ U(1, 16) and
    dt_bias = softplus^-1(dt) with dt log-uniform in [1e-3, 1e-1], i.e. memory lengths of ~1 to ~1000 tokens."""
    gen = torch.Generator().manual_seed(seed)
    params = [(n, p) for n, p in model.named_parameters()] + [("mtp." + n, p) for n, p in mtp.named_parameters()]
    for name, p in params:
        shape = p.shape
        if name.endswith("linear_attn.norm.weight"):
            v = torch.ones(shape)
        elif name.endswith("norm.weight"):
            v = torch.zeros(shape)
        elif name.endswith("linear_attn.dt_bias"):
            dt = torch.exp(torch.rand(shape, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            v = dt + torch.log(-torch.expm1(-dt))
        elif name.endswith("linear_attn.A_log"):
            v = torch.log(1.0 + 15.0 * torch.rand(shape, generator=gen))
        elif name.endswith("linear_attn.conv1d.weight"):
            v = torch.rand(shape, generator=gen) - 0.5
        elif name.endswith(".weight") or name.endswith("gate_up_proj") or name.endswith("down_proj"):
            v = torch.randn(shape, generator=gen) * 0.02
        else:
            raise ValueError(f"no init rule for {name}")
        p.copy_(v)


def count_params(model, mtp, cfg):
    main = sum(p.numel() for p in model.parameters())
    m = sum(p.numel() for p in mtp.parameters())
    e, k = cfg.num_experts, cfg.num_experts_per_tok
    routed = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    emb = model.model.embed_tokens.weight.numel()
    active = main - emb - routed + routed * k // e  # one embedding row is negligible
    return {"total": main + m, "main_without_mtp": main, "mtp": m, "embeddings": emb,
            "lm_head": model.lm_head.weight.numel(), "routed_experts_main": routed,
            "active_per_token_main_excl_embedding": active}


# --------------------------------------------------------------------------------------------------------------
# MTP forward (batched training form of MTPHead.forward: same modules, same math)
# --------------------------------------------------------------------------------------------------------------


def mtp_forward(mtp, final_hidden, next_embeds, lm_head_weight):
    """final_hidden = main model output after its final norm, next_embeds = embed(x_{t+1}); both [B, T, H].
    Returns (normed MTP output [B, T, H], draft logits [B, T, V]); position t predicts x_{t+2}."""
    u = mtp.fused_input(next_embeds, final_hidden)
    b, t, _ = u.shape
    pos = torch.arange(t, device=u.device)[None].expand(b, t)
    cos_sin = mtp.rotary(u, pos)
    if mtp.layer_cfg._attn_implementation == "sdpa":
        mask = None  # sdpa applies a causal mask itself when no mask is given
    else:
        mask = torch.full((t, t), torch.finfo(u.dtype).min, dtype=u.dtype, device=u.device).triu(1)[None, None]
    layer = mtp.layers[0]
    u = layer(u, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos,
              **{mf._cache_kw(layer.forward): None})
    out = mtp.norm(u)
    return out, F.linear(out, lm_head_weight)


# --------------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------------


def token_stream(tok, path, eot):
    docs = read_split(path)
    enc = tok.encode_batch(docs, add_special_tokens=False)
    ids = []
    for e in enc:
        ids.extend(e.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int64), docs, enc


class Batcher:
    """Epochs over the packed training stream: each epoch cuts it into windows of seq_len + 2 tokens (stride seq_len)
    at a random offset and visits them in a random order."""

    def __init__(self, stream, seq_len, batch, seed):
        self.stream, self.seq_len, self.batch = stream, seq_len, batch
        self.gen = torch.Generator().manual_seed(seed)
        self.epoch, self.order, self.pos = 0, None, 0
        self.windows_per_epoch = (len(stream) - seq_len - 2) // seq_len
        self._new_epoch()

    def _new_epoch(self):
        off = int(torch.randint(0, self.seq_len, (1,), generator=self.gen))
        n = (len(self.stream) - off - self.seq_len - 2) // self.seq_len + 1
        self.starts = off + self.seq_len * torch.randperm(n, generator=self.gen)
        self.pos = 0

    def next(self):
        if self.pos + self.batch > len(self.starts):
            self.epoch += 1
            self._new_epoch()
        s = self.starts[self.pos:self.pos + self.batch]
        self.pos += self.batch
        idx = s[:, None] + torch.arange(self.seq_len + 2)[None]
        return self.stream[idx]

    def epochs_done(self):
        return self.epoch + self.pos / max(1, len(self.starts))


def eval_windows(stream, seq_len, max_tokens=None):
    n = (len(stream) - 2) // seq_len
    if max_tokens:
        n = max(1, min(n, max_tokens // seq_len))
    idx = (torch.arange(n) * seq_len)[:, None] + torch.arange(seq_len + 2)[None]
    return stream[idx]


# --------------------------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------------------------


class RouterCapture:
    """Forward hooks on every router (main layers and the MTP layer): keeps their logits for the balance loss."""

    def __init__(self, modules):
        self.logits = []
        self.hooks = [m.register_forward_hook(self._hook) for m in modules if isinstance(m, hf_qwen.Qwen3_5MoeTopKRouter)]
        self.k = None

    def _hook(self, mod, inp, out):
        self.logits.append(out[0])
        self.k = mod.top_k

    def take(self):
        out, self.logits = self.logits, []
        return out

    def remove(self):
        for h in self.hooks:
            h.remove()


def balance_loss(router_logits, k):
    """Switch-transformer load balancing, per layer, averaged over layers: E * sum_e f_e * P_e."""
    if not router_logits:
        return torch.zeros(())
    losses = []
    for lg in router_logits:
        p = lg.float().softmax(-1)
        e = p.shape[-1]
        top = p.topk(k, dim=-1).indices
        f = torch.zeros(e, device=p.device).scatter_add_(0, top.reshape(-1), torch.ones(top.numel(), device=p.device))
        f = f / top.numel()
        losses.append(e * (f * p.mean(0)).sum())
    return torch.stack(losses).mean()


def forward_losses(model, mtp, w, autocast, mtp_detach=False, return_logits=False):
    """w: [B, T+2] token windows. Returns dict with lm / mtp mean CE (fp32) and optionally logits."""
    x, y_lm, nxt, y_mtp = w[:, :-2], w[:, 1:-1], w[:, 1:-1], w[:, 2:]
    with autocast():
        h = model.model(input_ids=x, use_cache=False).last_hidden_state
        logits = model.lm_head(h)
        hm = h.detach() if mtp_detach else h
        _, dlogits = mtp_forward(mtp, hm, model.model.embed_tokens(nxt), model.lm_head.weight)
    v = logits.shape[-1]
    lm = F.cross_entropy(logits.float().reshape(-1, v), y_lm.reshape(-1))
    mt = F.cross_entropy(dlogits.float().reshape(-1, v), y_mtp.reshape(-1))
    out = {"lm": lm, "mtp": mt}
    if return_logits:
        out["logits"], out["dlogits"] = logits, dlogits
    return out


@torch.no_grad()
def evaluate(model, mtp, windows, batch, device, autocast, n_real_vocab):
    """Held-out LM / MTP cross-entropy and top-1 agreement counts over the given windows."""
    was_training = model.training
    model.eval()
    mtp.eval()
    tot = dict(lm=0.0, mtp=0.0, n=0, n_mtp=0, lm_top1=0, mtp_top1_actual=0, mtp_top1_greedy=0)
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch].to(device)
        o = forward_losses(model, mtp, w, autocast, return_logits=True)
        lg, dl = o["logits"].float()[..., :n_real_vocab], o["dlogits"].float()[..., :n_real_vocab]
        b, t = w.shape[0], w.shape[1] - 2
        tot["lm"] += o["lm"].item() * b * t
        tot["mtp"] += o["mtp"].item() * b * t
        tot["n"] += b * t
        greedy = lg.argmax(-1)  # greedy[:, t] = main model's prediction of x_{t+1}
        draft = dl.argmax(-1)  # draft[:, t] = MTP's prediction of x_{t+2}
        tot["lm_top1"] += (greedy == w[:, 1:-1]).sum().item()
        # MTP draft at t vs the actual x_{t+2}, and vs the main model's own greedy token for position t+2
        # (= argmax of the main logits at t+1): only t = 0..T-2 have both.
        tot["mtp_top1_actual"] += (draft[:, :-1] == w[:, 2:-1]).sum().item()
        tot["mtp_top1_greedy"] += (draft[:, :-1] == greedy[:, 1:]).sum().item()
        tot["n_mtp"] += b * (t - 1)
    if was_training:
        model.train()
        mtp.train()
    return {
        "heldout_lm_loss": tot["lm"] / tot["n"],
        "heldout_mtp_loss": tot["mtp"] / tot["n"],
        "heldout_ppl": math.exp(tot["lm"] / tot["n"]),
        "heldout_mtp_ppl": math.exp(tot["mtp"] / tot["n"]),
        "heldout_lm_top1": tot["lm_top1"] / tot["n"],
        "mtp_accept_vs_actual": tot["mtp_top1_actual"] / tot["n_mtp"],
        "mtp_accept_vs_greedy": tot["mtp_top1_greedy"] / tot["n_mtp"],
        "heldout_tokens": tot["n"],
    }


# --------------------------------------------------------------------------------------------------------------
# Reference computation (oracle) on the saved files
# --------------------------------------------------------------------------------------------------------------


def force_torch_gdn():
    """If an optional kernel package (fla, causal_conv1d) was picked up by transformers at import time, put the
    pure-PyTorch reference functions back for the fp32 CPU references (what the oracle requires)."""
    swapped = []
    for name in mf.GDN_FUNCS:
        fn = getattr(hf_qwen, name)
        nl = inspect.getclosurevars(fn).nonlocals
        if nl.get("is_new_implementation") and "torch_function" in nl:
            setattr(hf_qwen, name, nl["torch_function"])
            swapped.append(name)
    return swapped


def cache_kwarg_shim(model):
    """make_fixtures.compute_references passes the decode cache as `cache=` (transformers >= 5.24 spelling); older
    versions call it `past_key_values` and would silently ignore `cache`. Translate it on this model instance."""
    orig = model.forward
    if "cache" in inspect.signature(orig).parameters:
        return

    def forward(*args, cache=None, **kwargs):
        if cache is not None:
            kwargs["past_key_values"] = cache
        return orig(*args, **kwargs)

    model.forward = forward


def reload_saved(outdir, spec, seed):
    cfg = mf.load_text_config(outdir, spec)
    model, mtp = mf.build_models(cfg, seed + 1000)
    patch_mtp(mtp)
    disk, _ = mf.read_checkpoint(outdir)
    main_sd, mtp_sd = mf.from_disk_tensors(spec, disk)
    model.load_state_dict(main_sd, strict=True)
    mtp.load_state_dict(mtp_sd, strict=True)
    return cfg, model, mtp, main_sd, mtp_sd, disk


def prompt_candidates(held_docs, held_enc, held_stream, n, k=8):
    """Up to k held-out 130-token prompts: the first n tokens of each held-out KJV chapter (file order), then windows
    of the packed held-out stream (fortunes, chats and <|endoftext|>) starting at document starts."""
    out = []
    for d, e in zip(held_docs, held_enc):
        if len(out) >= k // 2:
            break
        if not d.startswith("<|im_start|>") and "\n\n" in d[:40] and len(e.ids) >= n:
            out.append((torch.tensor(e.ids[:n], dtype=torch.int64), "KJV " + d.split("\n", 1)[0]))
    pos = 0
    for d, e in zip(held_docs, held_enc):
        if len(out) >= k:
            break
        if pos + n <= len(held_stream) and not ("\n\n" in d[:40] and not d.startswith("<|im_start|>")):
            out.append((held_stream[pos:pos + n].clone(), f"packed held-out stream from token {pos}"))
        pos += len(e.ids) + 1
    if not out:
        raise SystemExit("no held-out text is long enough for the reference prompt")
    return out


@torch.no_grad()
def prompt_robustness(model, mtp, prompt, greedy_prompt, greedy_steps):
    """Smallest gap between the k-th and (k+1)-th router logit (main layers and MTP, 130-token run) and smallest
    top1 - top2 margin of a greedy continuation of prompt[:greedy_prompt] (cache-free forwards): how far the
    reference is from a tie that an engine's rounding could flip (the oracle's robustness measures)."""
    gaps = []

    def hook(mod, inp, out):
        lg = out[0].float().sort(dim=-1, descending=True).values
        gaps.append((lg[:, mod.top_k - 1] - lg[:, mod.top_k]).min().item())

    hooks = [m.register_forward_hook(hook) for m in list(model.modules()) + list(mtp.modules())
             if isinstance(m, hf_qwen.Qwen3_5MoeTopKRouter)]
    final = model.model(input_ids=prompt[None], use_cache=False).last_hidden_state[0]
    mtp(model.model.embed_tokens(prompt[1:]), final[:-1], model.lm_head.weight)
    for h in hooks:
        h.remove()
    ids, margins = prompt[:greedy_prompt], []
    for _ in range(greedy_steps):
        logits = model(input_ids=ids[None], use_cache=False).logits[0, -1].float()
        top2 = logits.topk(2).values
        margins.append((top2[0] - top2[1]).item())
        ids = torch.cat([ids, logits.argmax()[None]])
    return min(gaps), min(margins)


def choose_prompt(model, mtp, candidates):
    """The candidate farthest from a tie: max of min(router gap / MIN_ROUTER_GAP, greedy margin /
    MIN_GREEDY_MARGIN) (the oracle's thresholds). Returns (prompt, label, report)."""
    report = []
    for prompt, label in candidates:
        gap, margin = prompt_robustness(model, mtp, prompt, mf.GREEDY_PROMPT, mf.GREEDY_STEPS)
        score = min(gap / mf.MIN_ROUTER_GAP, margin / mf.MIN_GREEDY_MARGIN)
        report.append(dict(label=label, min_router_gap=gap, greedy_min_margin=margin, score=score))
    best = max(range(len(candidates)), key=lambda i: report[i]["score"])
    return candidates[best][0], candidates[best][1], report


# --------------------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------------------


def cpu_threads():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def set_experts_impl(cfg, mtp, impl):
    """transformers picks the experts implementation from the config at every forward."""
    cfg._experts_implementation = impl
    mtp.layer_cfg._experts_implementation = impl


def time_steps(model, mtp, w, autocast, dev, reps):
    """Seconds per forward + backward (no optimizer step) on batch w, after one warm-up; the losses and the
    gradient norm of the first routed-expert tensor of the last repetition."""
    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for i in range(reps + 1):
        if i == 1:
            sync()
            t = time.time()
        model.zero_grad(set_to_none=True)
        mtp.zero_grad(set_to_none=True)
        o = forward_losses(model, mtp, w, autocast)
        (o["lm"] + 0.3 * o["mtp"]).backward()
    sync()
    dt = (time.time() - t) / reps
    g = model.model.layers[0].mlp.experts.gate_up_proj.grad.float().norm().item()
    model.zero_grad(set_to_none=True)
    mtp.zero_grad(set_to_none=True)
    return dt, o["lm"].item(), o["mtp"].item(), g


def probe_experts(model, mtp, cfg, w, autocast, dev, candidates):
    """Runs a few training steps with each experts implementation of transformers on a real batch, keeps those whose
    losses and expert gradients agree with the eager loop (the reference), returns the fastest and the report.
    An implementation that raises (e.g. a dtype its kernel does not support) is skipped."""
    report = OrderedDict()
    for impl in candidates:
        try:
            set_experts_impl(cfg, mtp, impl)
            dt, lm, mt, g = time_steps(model, mtp, w, autocast, dev, reps=3)
            report[impl] = dict(step_s=dt, lm=lm, mtp=mt, grad=g)
        except Exception as e:  # noqa: BLE001 (any failure means: do not use it)
            report[impl] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
    ref = report.get("eager", {})
    ok = []
    for impl, r in report.items():
        if "error" in r:
            continue
        if impl != "eager" and ("error" in ref or abs(r["lm"] - ref["lm"]) > 0.02 or abs(r["mtp"] - ref["mtp"]) > 0.02
                                or abs(r["grad"] - ref["grad"]) > 0.05 * abs(ref["grad"]) + 1e-6):
            r["rejected"] = "differs from eager"
            continue
        ok.append(impl)
    if not ok:
        raise SystemExit(f"no experts implementation works: {report}")
    best = min(ok, key=lambda i: report[i]["step_s"])
    set_experts_impl(cfg, mtp, best)
    return best, report


def lr_at(step, progress, args):
    warm = min(1.0, (step + 1) / max(1, args.warmup_steps))
    cos = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return args.lr * warm * cos


def param_groups(model, mtp, wd):
    decay, no_decay = [], []
    for n, p in list(model.named_parameters()) + [("mtp." + n, p) for n, p in mtp.named_parameters()]:
        if p.dim() >= 2 and "conv1d" not in n:
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def write_metrics(path, metrics):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(metrics, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "data"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--preset", default="full", choices=["full", "small"], help="small: CPU smoke tests only")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=0,
                    help="sequences per step (0: CUDA: fit --epochs into the time budget at the probed step time, "
                         "16..64; CPU: 16)")
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.05)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--mtp-detach", action="store_true", help="stop the MTP loss gradient at the main hidden state")
    ap.add_argument("--aux-weight", type=float, default=0.01, help="router load-balancing loss weight")
    ap.add_argument("--max-steps", type=int, default=0, help="total steps (0: from --epochs)")
    ap.add_argument("--epochs", type=float, default=6.0, help="total steps = epochs over the train stream")
    ap.add_argument("--time-budget-s", type=float, default=300.0, help="training loop wall-clock budget")
    ap.add_argument("--eval-every-s", type=float, default=20.0)
    ap.add_argument("--eval-tokens", type=int, default=0, help="cap on held-out tokens per eval (0: all)")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--attn", default="sdpa", help="attention implementation for training (sdpa | eager)")
    ap.add_argument("--experts", default="auto",
                    help="experts implementation for training: a transformers name (eager, grouped_mm, ...) or auto "
                         "(CUDA: the faster of eager and grouped_mm among those that agree with eager; CPU: eager)")
    ap.add_argument("--amp", default="auto", choices=["auto", "on", "off"],
                    help="bf16 autocast (auto: on for CUDA; 'on' on the CPU tests the mixed-precision path)")
    ap.add_argument("--seed", type=int, default=3636)
    ap.add_argument("--skip-spec-check", action="store_true")
    ap.add_argument("--shard-mib", type=float, default=0.0,
                    help="split the weights into files of at most this many MiB (0: one model.safetensors)")
    ap.add_argument("--no-tokenizer-copy", action="store_true",
                    help="do not copy the tokenizer files into --out (finalize.py adds them)")
    return ap


def main():
    args = build_parser().parse_args()

    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_num_threads(cpu_threads())
        # The GDN decay products underflow into subnormal floats as training goes on, which slows x86 CPUs down
        # several-fold; flush them during training (off again for the references).
        torch.set_flush_denormal(True)
    amp = dev.type == "cuda" if args.amp == "auto" else args.amp == "on"

    def autocast():
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp)

    os.makedirs(args.out, exist_ok=True)
    metrics_path = os.path.join(args.out, "metrics.json")
    timing = {}
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {dev}"
        + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else f", {torch.get_num_threads()} threads"))
    gdn_impl = {n: getattr(inspect.getclosurevars(getattr(hf_qwen, n)).nonlocals.get("implementation"), "__module__", "?")
                for n in mf.GDN_FUNCS}
    log(f"GDN functions from: {gdn_impl}")

    # ---- data
    tok_dir = os.path.join(args.data, "tokenizer")
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    special = special_ids(tok)
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    vocab = (n_tok + 63) // 64 * 64
    train_stream, _, _ = token_stream(tok, os.path.join(args.data, "corpus", "train.txt"), special["endoftext"])
    held_stream, held_docs, held_enc = token_stream(tok, os.path.join(args.data, "corpus", "heldout.txt"),
                                                    special["endoftext"])
    corpus_stats = {}
    for fn in (os.path.join(args.data, "corpus", "stats.json"), os.path.join(tok_dir, "stats.json")):
        if os.path.exists(fn):
            with open(fn) as f:
                corpus_stats[os.path.basename(os.path.dirname(fn))] = json.load(f)
    log(f"tokenizer {n_tok} ids (vocab rows {vocab}); train {len(train_stream):,} tokens, held-out "
        f"{len(held_stream):,} tokens")
    timing["data_s"] = time.time() - T0

    # ---- model
    fields = text_config_fields(vocab, special, args.preset)
    cfg, model, mtp = build_train_models(fields, args.seed, args.attn,
                                         "eager" if args.experts == "auto" else args.experts)
    params = count_params(model, mtp, cfg)
    log("params: " + ", ".join(f"{k} {v:,}" for k, v in params.items()))
    if args.preset == "full":
        assert params["total"] <= 20_000_000, params
    # The batched MTP forward must equal the oracle's MTPHead.forward (eager, one sequence) on the same weights.
    with torch.no_grad():
        hh, ee = torch.randn(2, 70, cfg.hidden_size), torch.randn(2, 70, cfg.hidden_size) * 0.02
        mine = mtp_forward(mtp, hh, ee, model.lm_head.weight)[1]
        saved = mtp.layer_cfg._attn_implementation
        mtp.layer_cfg._attn_implementation = "eager"
        ref = torch.stack([mtp(ee[i], hh[i], model.lm_head.weight)[1] for i in range(2)])
        mtp.layer_cfg._attn_implementation = saved
        err = mf.rel_err(mine, ref)
        assert err < 1e-4, f"batched MTP forward differs from MTPHead.forward: {err}"
    model.to(dev).train()
    mtp.to(dev).train()
    windows_eval = eval_windows(held_stream, args.seq_len, args.eval_tokens or None)
    # Experts implementation and batch size. On the GPU a step of this small model costs about the same whatever the
    # batch (kernel launches and host syncs dominate: 0.40 s at batch 16 with the eager experts loop on the H200),
    # so `--batch 0` picks the batch that fits --epochs into the time budget at the probed step time.
    probe_b = 16
    probe_w = train_stream[:probe_b * (args.seq_len + 2)].view(probe_b, args.seq_len + 2).to(dev)
    experts_report = None
    if args.experts == "auto" and dev.type != "cuda":
        args.experts = "eager"
    if args.experts == "auto":
        impl, experts_report = probe_experts(model, mtp, cfg, probe_w, autocast, dev, ["eager", "grouped_mm"])
        log(f"experts implementation: {impl} (" + "; ".join(
            f"{k}: " + (v["error"] if "error" in v else f"{v['step_s'] * 1000:.0f} ms/step"
                        + (f", {v['rejected']}" if "rejected" in v else ""))
            for k, v in experts_report.items()) + ")")
        args.experts = impl
    if args.batch <= 0:
        if dev.type == "cuda":
            step_s = (experts_report[args.experts]["step_s"] if experts_report else
                      time_steps(model, mtp, probe_w, autocast, dev, reps=3)[0])
            windows = (len(train_stream) - args.seq_len - 2) // args.seq_len
            steps_fit = max(1.0, 0.85 * args.time_budget_s / (step_s * 1.15))  # +15 % for optimizer and evals
            args.batch = int(min(64, max(16, math.ceil(args.epochs * windows / steps_fit / 8) * 8)))
            log(f"batch {args.batch}: {step_s * 1000:.0f} ms per step at batch {probe_b}, {args.epochs:g} epochs of "
                f"{windows} windows in {args.time_budget_s:.0f} s")
        else:
            args.batch = 16
    del probe_w
    batcher = Batcher(train_stream, args.seq_len, args.batch, args.seed)
    steps_per_epoch = batcher.windows_per_epoch / args.batch
    total_steps = args.max_steps or max(1, int(args.epochs * steps_per_epoch))
    opt = torch.optim.AdamW(param_groups(model, mtp, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=(dev.type == "cuda"))
    routers = RouterCapture(list(model.modules()) + list(mtp.modules()))
    all_params = list(model.parameters()) + list(mtp.parameters())

    metrics = OrderedDict(
        model="tern-tiny", torch=torch.__version__, transformers=transformers.__version__, device=str(dev),
        device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        args=vars(args), text_config=fields, params=params, tokenizer_size=n_tok, vocab_rows=vocab,
        tokens={"train": len(train_stream), "heldout": len(held_stream)}, corpus=corpus_stats,
        tokenizer_sha256={fn: sha256(os.path.join(tok_dir, fn)) for fn in
                          ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")},
        total_steps_planned=total_steps, steps_per_epoch=steps_per_epoch, experts_probe=experts_report,
        train_log=[], eval_log=[])
    log(f"training: batch {args.batch} x {args.seq_len} = {args.batch * args.seq_len:,} tokens/step, "
        f"{steps_per_epoch:.1f} steps/epoch, planned {total_steps} steps, budget {args.time_budget_s:.0f} s")

    # ---- training loop
    best = None
    t_start = time.time()
    last_eval = t_start
    acc = dict(lm=0.0, mtp=0.0, aux=0.0, n=0)
    step = 0
    step_times = []
    while True:
        elapsed = time.time() - t_start
        if step >= total_steps or elapsed >= args.time_budget_s:
            break
        progress = max(step / total_steps, elapsed / args.time_budget_s)
        lr = lr_at(step, progress, args)
        for g in opt.param_groups:
            g["lr"] = lr
        ts = time.time()
        w = batcher.next().to(dev, non_blocking=True)
        routers.take()
        o = forward_losses(model, mtp, w, autocast, mtp_detach=args.mtp_detach)
        aux = balance_loss(routers.take(), routers.k)
        loss = o["lm"] + args.mtp_weight * o["mtp"] + args.aux_weight * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(all_params, args.grad_clip)
        opt.step()
        lm_v, mtp_v, aux_v = o["lm"].item(), o["mtp"].item(), aux.item()
        if not math.isfinite(lm_v):
            raise SystemExit(f"loss is {lm_v} at step {step}")
        step_times.append(time.time() - ts)
        acc["lm"] += lm_v
        acc["mtp"] += mtp_v
        acc["aux"] += aux_v
        acc["n"] += 1
        step += 1
        if step % args.log_every == 0 or step == 1:
            rec = dict(step=step, time_s=round(time.time() - t_start, 2), lr=lr, epoch=round(batcher.epochs_done(), 3),
                       tokens=step * args.batch * args.seq_len, loss_lm=acc["lm"] / acc["n"],
                       loss_mtp=acc["mtp"] / acc["n"], loss_aux=acc["aux"] / acc["n"], grad_norm=gn.item(),
                       step_s=sum(step_times[-args.log_every:]) / len(step_times[-args.log_every:]))
            metrics["train_log"].append(rec)
            log(f"step {step:5d} lr {lr:.2e} ep {rec['epoch']:.2f} lm {rec['loss_lm']:.4f} mtp {rec['loss_mtp']:.4f} "
                f"aux {rec['loss_aux']:.3f} gn {rec['grad_norm']:.2f} {rec['step_s'] * 1000:.0f} ms/step")
            acc = dict(lm=0.0, mtp=0.0, aux=0.0, n=0)
        now = time.time()
        done = step >= total_steps or now - t_start >= args.time_budget_s
        if now - last_eval >= args.eval_every_s or done:
            ev = evaluate(model, mtp, windows_eval, args.batch, dev, autocast, n_tok)
            ev.update(step=step, time_s=round(now - t_start, 2), epoch=round(batcher.epochs_done(), 3))
            metrics["eval_log"].append(ev)
            log(f"eval step {step}: held-out lm {ev['heldout_lm_loss']:.4f} (ppl {ev['heldout_ppl']:.2f}) "
                f"mtp {ev['heldout_mtp_loss']:.4f} accept {ev['mtp_accept_vs_actual']:.3f}/"
                f"{ev['mtp_accept_vs_greedy']:.3f}")
            if best is None or ev["heldout_lm_loss"] < best["heldout_lm_loss"]:
                best = dict(ev)
                best["state"] = ({k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                                 {k: v.detach().to("cpu", copy=True) for k, v in mtp.state_dict().items()})
            write_metrics(metrics_path, metrics)
            last_eval = time.time()
    routers.remove()
    train_s = time.time() - t_start
    timing["train_s"] = train_s
    timing["steps"] = step
    timing["mean_step_s"] = sum(step_times[1:]) / max(1, len(step_times) - 1)
    timing["first_step_s"] = step_times[0] if step_times else None
    log(f"trained {step} steps in {train_s:.1f} s ({timing['mean_step_s'] * 1000:.0f} ms/step after the first); "
        f"best held-out lm {best['heldout_lm_loss']:.4f} at step {best['step']}")
    metrics["best_step"] = best["step"]
    metrics["final_step"] = step

    # ---- save (best snapshot), BF16, oracle writer
    t1 = time.time()
    model.load_state_dict(best["state"][0])
    mtp.load_state_dict(best["state"][1])
    model.to("cpu")
    mtp.to("cpu")
    spec = checkpoint_spec(fields, special, args.seed)
    for fn in os.listdir(args.out):  # what an earlier run wrote
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(args.out, fn))
    tensors = mf.to_disk_tensors(spec, model, mtp)
    weight_files = write_weights(spec, args.out, tensors, int(args.shard_mib * 2 ** 20))
    write_config(spec, args.out)
    if not args.no_tokenizer_copy:
        for fn in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copyfile(os.path.join(tok_dir, fn), os.path.join(args.out, fn))
    log(f"saved {', '.join(weight_files)}")
    del model, mtp, best
    timing["save_s"] = time.time() - t1

    # ---- reload the saved files into fp32 (CPU) and compute the oracle references
    t1 = time.time()
    torch.set_num_threads(cpu_threads())
    torch.set_flush_denormal(False)
    swapped = force_torch_gdn()
    if swapped:
        log(f"using the PyTorch reference GDN functions for the references (was a kernel package): {swapped}")
    mf.install_call_counters()
    cfg2, model, mtp, main_sd, mtp_sd, disk = reload_saved(args.out, spec, args.seed)
    for n, t in disk.items():
        assert torch.equal(t, tensors[n]), f"tensor {n} changed on disk"
    del tensors
    cache_kwarg_shim(model)
    prompt, prompt_label, prompt_report = choose_prompt(
        model, mtp, prompt_candidates(held_docs, held_enc, held_stream, mf.PROMPT_LEN))
    log(f"reference prompt: {prompt_label} (" + "; ".join(
        f"{r['label']}: gap {r['min_router_gap']:.1e} margin {r['greedy_min_margin']:.1e}" for r in prompt_report) + ")")
    info, greedy_text, ref_error = {}, None, None
    try:  # a failure here must not lose the trained model: it is reported and finalize.py can redo it
        ref, info = mf.compute_references(model, mtp, prompt, cfg2, False)
        ref = OrderedDict((k, v.contiguous()) for k, v in ref.items())
        save_file(ref, os.path.join(args.out, "reference.safetensors"),
                  metadata={"tern_oracle": "format=1;fixture=tern-tiny;full_logits=false"})
        greedy_text = tok.decode(ref["greedy.tokens"].tolist(), skip_special_tokens=False)
        log(f"references written; prompt: {tok.decode(prompt[:16].tolist())!r} -> greedy {greedy_text!r}")
        if not args.skip_spec_check:
            info["spec_check"] = mf.spec_check(main_sd, mtp_sd, cfg2, ref)
            worst = max(info["spec_check"].values())
            log(f"independent spec re-implementation vs references: max rel err {worst:.1e}")
            if worst >= mf.SPEC_RTOL:
                log(f"WARNING: spec check above {mf.SPEC_RTOL}: {info['spec_check']}")
        try:
            info["hf_loader_rel_err"] = mf.hf_loader_check(args.out, ref)
        except Exception as e:  # informational only
            info["hf_loader_rel_err"] = f"not run: {type(e).__name__}: {e}"
    except Exception:
        ref_error = traceback.format_exc()
        log(f"ERROR while computing the references (the model is saved; finalize.py recomputes them):\n{ref_error}")
    timing["reference_s"] = time.time() - t1

    # ---- final held-out metrics from the reloaded (saved, bf16-rounded) weights, fp32 math
    t1 = time.time()
    if dev.type == "cuda":  # true fp32 for the final numbers
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    for m in (model, mtp):
        m.to(dev)
    model.config._attn_implementation = "sdpa"
    mtp.layer_cfg._attn_implementation = "sdpa"
    final = evaluate(model, mtp, eval_windows(held_stream, args.seq_len, args.eval_tokens or None), args.batch, dev,
                     lambda: torch.autocast(device_type=dev.type, enabled=False), n_tok)
    timing["final_eval_s"] = time.time() - t1
    timing["total_s"] = time.time() - T0
    ref_info = {k: info[k] for k in ("logits_std", "mtp_logits_std", "greedy_min_margin", "min_router_gap",
                                      "prefix_rel_err", "greedy_vs_recompute_rel_err", "mtp_incremental_rel_err",
                                      "final_to_logits_rel_err", "spec_check", "hf_loader_rel_err") if k in info}
    metrics["final"] = final
    metrics["reference"] = dict(ref_info, prompt_text=tok.decode(prompt.tolist()), prompt_source=prompt_label,
                                prompt_candidates=prompt_report, greedy_text=greedy_text,
                                gdn_functions_swapped=swapped, error=ref_error)
    metrics["timing"] = timing
    metrics["files"] = {fn: os.path.getsize(os.path.join(args.out, fn)) for fn in sorted(os.listdir(args.out))
                        if fn != "metrics.json"}
    write_metrics(metrics_path, metrics)
    total_mb = sum(metrics["files"].values()) / 1e6
    log(f"final (saved weights): held-out ppl {final['heldout_ppl']:.3f} (lm loss {final['heldout_lm_loss']:.4f}), "
        f"MTP ppl {final['heldout_mtp_ppl']:.2f}, MTP top-1 acceptance {final['mtp_accept_vs_actual']:.3f} vs text, "
        f"{final['mtp_accept_vs_greedy']:.3f} vs greedy; files {total_mb:.2f} MB; total {timing['total_s']:.1f} s")
    assert total_mb <= 40, "model directory exceeds 40 MB"
    if ref_error:
        raise SystemExit("reference computation failed (see above); everything else was written")


if __name__ == "__main__":
    main()
