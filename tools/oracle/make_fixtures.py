#!/usr/bin/env python3
"""Reference-fixture generator ("oracle") for tern.

Builds four tiny random checkpoints of the Qwen3.5/3.6 MoE text model (HF model_type `qwen3_5_moe`),
writes them in the exact Hugging Face on-disk layouts the engine must read, loads the written files back
into a fresh fp32 transformers model plus an MTP head written here, and records golden outputs
(logits, per-layer hidden states, cached greedy decoding, MTP draft logits) in
`tests/fixtures/<name>/reference.safetensors`.

Run:  python3 tools/oracle/make_fixtures.py --out tests/fixtures

Everything runs on the CPU in float32 with eager attention, the eager MoE experts loop and the pure-PyTorch
Gated-DeltaNet / causal-conv1d fallbacks of transformers (the optional `fla`, `causal_conv1d` and `kernels`
packages must not be importable). See tools/oracle/README.md for the fixture format.
"""

import argparse
import copy
import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
from collections import Counter, OrderedDict

# Single-threaded, deterministic CPU math. Set before torch starts its thread pools.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("USE_HUB_KERNELS", "0")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf_qwen  # noqa: E402

MB = 1_000_000
SIZE_LIMIT = 5 * MB  # total bytes of all fixture directories
PROMPT_LEN = 130
RUN_LENGTHS = (1, 63, 64, 65, 130)
GREEDY_PROMPT = 16
GREEDY_STEPS = 32
PREFIX_RTOL = 1e-5  # max|short - long_prefix| / max|long_prefix|
CROSS_RTOL = 1e-4  # cached decode vs. full recompute, MTP one-shot vs. incremental
SPEC_RTOL = 1e-4  # transformers vs. the independent spec re-implementation (recurrent GDN, explicit loops)
MTP_SAMPLE_ROWS = (0, 62, 63, 64, 128)  # rows of the MTP draft logits stored in full (mtp.logits.rows)
# Robustness of the fixtures against small numeric differences of an engine (checked, see README):
MIN_ROUTER_GAP = 1.5e-3  # smallest gap between the k-th and (k+1)-th router logit anywhere
MIN_GREEDY_MARGIN = 5e-3  # smallest top1 - top2 logit gap of the greedy steps

L, A = "linear_attention", "full_attention"

# --------------------------------------------------------------------------------------------------------------
# Fixture definitions
# --------------------------------------------------------------------------------------------------------------

# Token ids standing in for the real special tokens (real: 248044 <|endoftext|>, 248045 <|im_start|>,
# 248046 <|im_end|>, 248053/248054 vision start/end, 248056/248057 image/video pad).
TINY_SPECIAL = dict(endoftext=500, im_start=501, im_end=502, vision_start=503, vision_end=504, image=505, video=506)
ODD_SPECIAL = dict(endoftext=370, im_start=371, im_end=372)

TINY_TEXT = OrderedDict(
    [
        ("model_type", "qwen3_5_moe_text"),
        ("attention_bias", False),
        ("attention_dropout", 0.0),
        ("attn_output_gate", True),
        ("bos_token_id", TINY_SPECIAL["endoftext"]),
        ("dtype", "bfloat16"),
        ("eos_token_id", TINY_SPECIAL["endoftext"]),
        ("full_attention_interval", 4),
        ("head_dim", 32),
        ("hidden_act", "silu"),
        ("hidden_size", 64),
        ("initializer_range", 0.02),
        ("layer_types", [L, L, L, A]),
        ("linear_conv_kernel_dim", 4),
        ("linear_key_head_dim", 16),
        ("linear_num_key_heads", 2),
        ("linear_num_value_heads", 4),
        ("linear_value_head_dim", 16),
        ("mamba_ssm_dtype", "float32"),
        ("max_position_embeddings", 4096),
        ("moe_intermediate_size", 32),
        ("mtp_num_hidden_layers", 1),
        ("mtp_use_dedicated_embeddings", False),
        ("num_attention_heads", 8),
        ("num_experts", 16),
        ("num_experts_per_tok", 4),
        ("num_hidden_layers", 4),
        ("num_key_value_heads", 1),
        ("output_router_logits", False),
        ("pad_token_id", None),
        ("partial_rotary_factor", 0.25),
        ("rms_norm_eps", 1e-06),
        (
            "rope_parameters",
            OrderedDict(
                [
                    ("mrope_interleaved", True),
                    ("mrope_section", [2, 1, 1]),
                    ("partial_rotary_factor", 0.25),
                    ("rope_theta", 10000000),
                    ("rope_type", "default"),
                ]
            ),
        ),
        ("router_aux_loss_coef", 0.001),
        ("shared_expert_intermediate_size", 32),
        ("use_cache", True),
        ("vocab_size", 512),
    ]
)

# Qwen3.5-35B-A3B published text_config has no bos_token_id; otherwise the same fields.
QWEN35_TEXT = OrderedDict((k, v) for k, v in TINY_TEXT.items() if k != "bos_token_id")

ODD_TEXT = OrderedDict(
    [
        ("model_type", "qwen3_5_moe_text"),
        ("architectures", ["Qwen3_5MoeForCausalLM"]),
        ("attention_bias", False),
        ("attention_dropout", 0.0),
        ("attn_output_gate", True),
        ("bos_token_id", ODD_SPECIAL["endoftext"]),
        ("dtype", "float16"),
        ("eos_token_id", [ODD_SPECIAL["im_end"], ODD_SPECIAL["endoftext"]]),
        ("head_dim", 16),
        ("hidden_act", "silu"),
        ("hidden_size", 48),
        ("initializer_range", 0.02),
        ("layer_types", [L, A, L, L, A, L]),
        ("linear_conv_kernel_dim", 2),
        ("linear_key_head_dim", 8),
        ("linear_num_key_heads", 2),
        ("linear_num_value_heads", 6),
        ("linear_value_head_dim", 12),
        ("mamba_ssm_dtype", "float32"),
        ("max_position_embeddings", 2048),
        ("moe_intermediate_size", 24),
        ("mtp_num_hidden_layers", 1),
        ("mtp_use_dedicated_embeddings", False),
        ("num_attention_heads", 6),
        ("num_experts", 8),
        ("num_experts_per_tok", 3),
        ("num_hidden_layers", 6),
        ("num_key_value_heads", 2),
        ("output_router_logits", False),
        ("pad_token_id", None),
        ("partial_rotary_factor", 0.5),
        ("rms_norm_eps", 1e-05),
        (
            "rope_parameters",
            OrderedDict(
                [
                    ("mrope_interleaved", True),
                    ("mrope_section", [2, 1, 1]),  # sums to rotary_dim/2 = 16*0.5/2 = 4
                    ("partial_rotary_factor", 0.5),
                    ("rope_theta", 10000),
                    ("rope_type", "default"),
                ]
            ),
        ),
        ("router_aux_loss_coef", 0.001),
        ("shared_expert_intermediate_size", 16),
        ("tie_word_embeddings", False),
        ("use_cache", True),
        ("vocab_size", 384),
    ]
)

# YaRN: rotary dims 8 (4 frequencies) at theta 100 over a native context of 64 positions put the correction range's
# ends at dims 0 and 3, so the four inverse frequencies are extrapolated, blended 2:1, 1:2 and interpolated; factor 4
# gives 256 positions, and the 130-token prompt reaches 66 past the native ones. beta_fast, beta_slow and the
# attention factor are left to their defaults (32, 1, 0.1 ln(factor) + 1), as a real config leaves them.
YARN_SPECIAL = dict(endoftext=250, im_start=251, im_end=252)

YARN_TEXT = OrderedDict(
    [
        ("model_type", "qwen3_5_moe_text"),
        ("architectures", ["Qwen3_5MoeForCausalLM"]),
        ("attention_bias", False),
        ("attention_dropout", 0.0),
        ("attn_output_gate", True),
        ("bos_token_id", YARN_SPECIAL["endoftext"]),
        ("dtype", "bfloat16"),
        ("eos_token_id", [YARN_SPECIAL["im_end"], YARN_SPECIAL["endoftext"]]),
        ("head_dim", 32),
        ("hidden_act", "silu"),
        ("hidden_size", 32),
        ("initializer_range", 0.02),
        ("layer_types", [L, A]),
        ("linear_conv_kernel_dim", 4),
        ("linear_key_head_dim", 16),
        ("linear_num_key_heads", 2),
        ("linear_num_value_heads", 4),
        ("linear_value_head_dim", 16),
        ("mamba_ssm_dtype", "float32"),
        ("max_position_embeddings", 64),
        ("moe_intermediate_size", 32),
        ("mtp_num_hidden_layers", 1),
        ("mtp_use_dedicated_embeddings", False),
        ("num_attention_heads", 4),
        ("num_experts", 4),
        ("num_experts_per_tok", 2),
        ("num_hidden_layers", 2),
        ("num_key_value_heads", 1),
        ("output_router_logits", False),
        ("pad_token_id", None),
        ("partial_rotary_factor", 0.25),
        ("rms_norm_eps", 1e-06),
        (
            "rope_parameters",
            OrderedDict(
                [
                    ("factor", 4.0),
                    ("mrope_interleaved", True),
                    ("mrope_section", [2, 1, 1]),
                    ("original_max_position_embeddings", 64),
                    ("partial_rotary_factor", 0.25),
                    ("rope_theta", 100),
                    ("rope_type", "yarn"),
                ]
            ),
        ),
        ("router_aux_loss_coef", 0.001),
        ("shared_expert_intermediate_size", 32),
        ("tie_word_embeddings", False),
        ("use_cache", True),
        ("vocab_size", 256),
    ]
)

# Variants of the YaRN parameters, each with the inverse frequencies and attention scaling transformers computes for
# it, written to yarn/rope_cases.json for the engine's config reader: (name, rope_parameters, other text-config
# fields). Together they take every branch of _compute_yarn_parameters and of the key standardisation before it.
YARN_ROPE = OrderedDict((k, v) for k, v in YARN_TEXT["rope_parameters"].items()
                        if k not in ("mrope_interleaved", "mrope_section"))
ROPE_CASES = [
    ("fixture", YARN_ROPE, {}),
    ("qwen36_1m", dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=262144, rope_theta=10000000,
                       partial_rotary_factor=0.25), dict(head_dim=256, max_position_embeddings=262144)),
    ("qwen36_512k", dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=262144, rope_theta=10000000,
                         partial_rotary_factor=0.25), dict(head_dim=256, max_position_embeddings=262144)),
    ("betas_and_attention_factor", dict(YARN_ROPE, beta_fast=16, beta_slow=2, attention_factor=1.5), {}),
    ("mscale", dict(YARN_ROPE, mscale=0.707, mscale_all_dim=1.3), {}),
    ("not_truncated", dict(YARN_ROPE, truncate=False), {}),
    ("null_factor", dict(YARN_ROPE, factor=None, original_max_position_embeddings=16), {}),
    ("top_level_original", OrderedDict((k, v) for k, v in YARN_ROPE.items() if k != "original_max_position_embeddings"),
     dict(original_max_position_embeddings=16)),
    ("older_type_key", OrderedDict(("type" if k == "rope_type" else k, v) for k, v in YARN_ROPE.items()), {}),
    ("zero_width_ramp", dict(YARN_ROPE, beta_fast=32, beta_slow=16), {}),
]

TINY_VISION = OrderedDict(
    [
        ("deepstack_visual_indexes", []),
        ("depth", 1),
        ("hidden_act", "gelu_pytorch_tanh"),
        ("hidden_size", 16),
        ("in_channels", 3),
        ("initializer_range", 0.02),
        ("intermediate_size", 32),
        ("model_type", "qwen3_5_moe"),  # as in the published file (transformers rewrites it to ..._vision)
        ("num_heads", 2),
        ("num_position_embeddings", 4),
        ("out_hidden_size", 64),
        ("patch_size", 2),
        ("spatial_merge_size", 2),
        ("temporal_patch_size", 2),
    ]
)


def generation_config(special, temperature, top_k, top_p):
    """generation_config.json of a fixture: sampling on, its end-of-turn and end-of-text ids."""
    return OrderedDict(
        [
            ("bos_token_id", special["endoftext"]),
            ("do_sample", True),
            ("eos_token_id", [special["im_end"], special["endoftext"]]),
            ("pad_token_id", special["endoftext"]),
            ("temperature", temperature),
            ("top_k", top_k),
            ("top_p", top_p),
        ]
    )

FIXTURES = OrderedDict(
    [
        (
            "tiny",
            dict(
                seed=3624,
                text=TINY_TEXT,
                nested=True,
                prefix="model.language_model.",
                main_experts="fused",
                mtp_experts="fused",
                dtype=torch.bfloat16,
                f32_suffixes=(),
                shards=1,
                visual=True,
                special=TINY_SPECIAL,
                generation=generation_config(TINY_SPECIAL, temperature=1.0, top_k=20, top_p=0.95),
            ),
        ),
        (
            "qwen35",
            dict(
                seed=3513,
                text=QWEN35_TEXT,
                nested=True,
                prefix="model.language_model.",
                main_experts="fused",
                mtp_experts="per_expert",
                dtype=torch.bfloat16,
                f32_suffixes=("linear_attn.A_log", "linear_attn.norm.weight"),
                shards=2,
                visual=True,
                special=TINY_SPECIAL,
                generation=generation_config(TINY_SPECIAL, temperature=0.6, top_k=20, top_p=0.95),
            ),
        ),
        (
            "odd",
            dict(
                seed=4806,
                text=ODD_TEXT,
                nested=False,
                prefix="model.",
                main_experts="per_expert",
                mtp_experts="fused",
                dtype=torch.float16,
                f32_suffixes=(),
                shards=1,
                visual=False,
                special=ODD_SPECIAL,
                generation=generation_config(ODD_SPECIAL, temperature=0.7, top_k=5, top_p=0.8),
            ),
        ),
        (
            "yarn",
            dict(
                seed=5164,
                text=YARN_TEXT,
                nested=False,
                prefix="model.",
                main_experts="fused",
                mtp_experts="fused",
                dtype=torch.bfloat16,
                f32_suffixes=(),
                shards=1,
                visual=False,
                special=YARN_SPECIAL,
                rope_cases=ROPE_CASES,
                generation=generation_config(YARN_SPECIAL, temperature=1.0, top_k=20, top_p=0.95),
            ),
        ),
    ]
)

# Init scales (see README "Initialisation").
STD_LINEAR = 0.02  # every projection not listed below, embeddings, mtp.fc
STD_MOE = 0.035  # routed experts (gate_up_proj, down_proj) and the shared expert MLP
STD_ROUTER = 0.5  # mlp.gate.weight (router) and mlp.shared_expert_gate.weight
STD_NORM = 0.1  # noise of (1+w) RMSNorm weights, of the gated-norm weight around 1, of dt_bias around 1
A_RANGE = (0.01, 16.0)  # A = exp(A_log), sampled log-uniformly in this range



# transformers renamed the cache argument and output field (past_key_values -> cache) between 5.17 and 5.24;
# the oracle runs on both, so it looks the names up once.
def _cache_kw(fn):
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


def _out_cache(out):
    return out.cache if hasattr(out, "cache") else out.past_key_values

def lm_head_std(hidden):
    # 1/sqrt(H): final normed hidden has rms ~1, so logits get std ~1.
    return 1.0 / math.sqrt(hidden)


# --------------------------------------------------------------------------------------------------------------
# Environment checks and call tracing
# --------------------------------------------------------------------------------------------------------------

GDN_FUNCS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update")
TRACED = GDN_FUNCS + ("eager_attention_forward",)
CALLS = Counter()


def check_environment():
    for pkg in ("fla", "causal_conv1d", "kernels"):
        if importlib.util.find_spec(pkg) is not None:
            sys.exit(f"error: optional package '{pkg}' is importable; uninstall it (the oracle must use the "
                     f"pure-PyTorch reference paths of transformers)")
    # The four GDN entry points are wrappers that pick an implementation once, at import time. Check it is the
    # torch function defined in the transformers module itself.
    for name in GDN_FUNCS:
        fn = getattr(hf_qwen, name)
        nonlocal_vars = inspect.getclosurevars(fn).nonlocals
        impl = nonlocal_vars.get("implementation", fn)
        assert nonlocal_vars.get("is_new_implementation", False) is False, name
        assert impl.__module__ == hf_qwen.__name__ and impl.__name__ == name, (name, impl)


def install_call_counters():
    """Wrap the module-level functions the model looks up at call time so that we can report which ran."""
    for name in TRACED:
        orig = getattr(hf_qwen, name)
        if getattr(orig, "_oracle_counted", False):
            continue

        def make(orig=orig, name=name):
            def counted(*args, **kwargs):
                CALLS[name] += 1
                return orig(*args, **kwargs)

            counted._oracle_counted = True
            return counted

        setattr(hf_qwen, name, make())


def take_calls():
    out = dict(CALLS)
    CALLS.clear()
    return out


# --------------------------------------------------------------------------------------------------------------
# Model construction
# --------------------------------------------------------------------------------------------------------------


def text_config_from_fields(fields):
    kw = {k: copy.deepcopy(v) for k, v in fields.items() if k not in ("model_type", "architectures")}
    cfg = Qwen3_5MoeTextConfig(**kw)
    return finish_config(cfg)


def finish_config(cfg):
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


class RMSNorm1p(nn.Module):
    """Zero-centred RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w), computed in fp32."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class MTPHead(nn.Module):
    """Multi-token-prediction head of Qwen3.5/3.6 (not part of transformers).

    Parameter names (under the checkpoint prefix `mtp.`) match the published checkpoints: fc, pre_fc_norm_embedding,
    pre_fc_norm_hidden, norm, layers.0.* (a full-attention decoder layer; transformers' class is reused for it).
    """

    def __init__(self, text_cfg):
        super().__init__()
        hidden = text_cfg.hidden_size
        eps = text_cfg.rms_norm_eps
        layer_cfg = copy.deepcopy(text_cfg)
        layer_cfg.layer_types = [A]
        layer_cfg.num_hidden_layers = 1
        finish_config(layer_cfg)
        self.layer_cfg = layer_cfg
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = RMSNorm1p(hidden, eps)
        self.pre_fc_norm_hidden = RMSNorm1p(hidden, eps)
        self.layers = nn.ModuleList([hf_qwen.Qwen3_5MoeDecoderLayer(layer_cfg, layer_idx=0)])
        self.norm = RMSNorm1p(hidden, eps)
        self.rotary = hf_qwen.Qwen3_5MoeTextRotaryEmbedding(layer_cfg)

    def fused_input(self, next_token_embeds, final_hidden):
        """u_t = fc(concat(norm_e(embed(x_{t+1})), norm_h(H_t))), embedding half first. Inputs [T, H]."""
        e = self.pre_fc_norm_embedding(next_token_embeds)
        h = self.pre_fc_norm_hidden(final_hidden)
        return self.fc(torch.cat([e, h], dim=-1))

    def forward(self, next_token_embeds, final_hidden, lm_head_weight):
        """One causal sequence at RoPE positions 0..T-1, no cache.
        Returns (normed output [T, H], draft logits [T, V])."""
        u = self.fused_input(next_token_embeds, final_hidden)[None]  # [1, T, H]
        t = u.shape[1]
        pos = torch.arange(t)[None]
        cos_sin = self.rotary(u, pos[None].expand(3, -1, -1))  # (t, h, w) rows, equal for text
        mask = torch.full((t, t), torch.finfo(u.dtype).min, dtype=u.dtype).triu(1)[None, None]
        u = self.layers[0](u, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos,
                           **{_cache_kw(self.layers[0].forward): None})
        out = self.norm(u)[0]
        return out, nn.functional.linear(out, lm_head_weight)

    def forward_incremental(self, next_token_embeds, final_hidden, lm_head_weight):
        """Same result, one position at a time with a fresh KV cache (cross-check of the causal mask)."""
        u_all = self.fused_input(next_token_embeds, final_hidden)
        cache = transformers.DynamicCache(config=self.layer_cfg)
        outs = []
        for t in range(u_all.shape[0]):
            u = u_all[t][None, None]
            pos = torch.tensor([[t]])
            cos_sin = self.rotary(u, pos[None].expand(3, -1, -1))  # (t, h, w) rows, equal for text
            u = self.layers[0](u, position_embeddings=cos_sin, attention_mask=None, position_ids=pos,
                               **{_cache_kw(self.layers[0].forward): cache})
            outs.append(nn.functional.linear(self.norm(u)[0, 0], lm_head_weight))
        return torch.stack(outs)


def build_models(text_cfg, seed):
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(text_cfg).eval()
    mtp = MTPHead(text_cfg).eval()
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    assert model.config._experts_implementation == "eager", model.config._experts_implementation
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "lm_head must be untied"
    for p in list(model.parameters()) + list(mtp.parameters()):
        assert p.dtype == torch.float32
    return model, mtp


def init_rule(name):
    """Which distribution a parameter (HF in-memory name, MTP prefixed with 'mtp.') gets."""
    if name.endswith("linear_attn.norm.weight"):
        return "gated_norm"
    if name.endswith("norm.weight"):  # input/post_attention layernorm, final norm, q_norm, k_norm, mtp norms
        return "norm1p"
    if name.endswith("linear_attn.dt_bias"):
        return "dt_bias"
    if name.endswith("linear_attn.A_log"):
        return "A_log"
    if name.endswith("linear_attn.conv1d.weight"):
        return "conv"
    if name.endswith("mlp.gate.weight") or name.endswith("mlp.shared_expert_gate.weight"):
        return "router"
    if ".mlp.experts." in name or ".mlp.shared_expert." in name:
        return "moe"
    if name == "lm_head.weight":
        return "lm_head"
    if name.endswith(".weight"):
        return "linear"
    raise ValueError(f"no init rule for {name}")


@torch.no_grad()
def init_weights(model, mtp, seed, hidden):
    gen = torch.Generator().manual_seed(seed)
    params = [(n, p) for n, p in model.named_parameters()] + [("mtp." + n, p) for n, p in mtp.named_parameters()]
    rules = Counter()
    for name, p in params:
        rule = init_rule(name)
        rules[rule] += 1
        shape = p.shape
        if rule == "linear":
            v = torch.randn(shape, generator=gen) * STD_LINEAR
        elif rule == "lm_head":
            v = torch.randn(shape, generator=gen) * lm_head_std(hidden)
        elif rule == "moe":
            v = torch.randn(shape, generator=gen) * STD_MOE
        elif rule == "router":
            v = torch.randn(shape, generator=gen) * STD_ROUTER
        elif rule == "norm1p":
            v = torch.randn(shape, generator=gen) * STD_NORM
        elif rule in ("gated_norm", "dt_bias"):
            v = 1.0 + torch.randn(shape, generator=gen) * STD_NORM
        elif rule == "A_log":
            lo, hi = math.log(A_RANGE[0]), math.log(A_RANGE[1])
            v = lo + (hi - lo) * torch.rand(shape, generator=gen)  # log-uniform A in A_RANGE
        elif rule == "conv":
            v = torch.rand(shape, generator=gen) - 0.5  # U(-0.5, 0.5)
        p.copy_(v)
    return rules


# --------------------------------------------------------------------------------------------------------------
# Checkpoint layout: in-memory names <-> on-disk names
# --------------------------------------------------------------------------------------------------------------

EXPERT_RE = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
PER_EXPERT_RE = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def split_experts(name, tensor, out):
    """Fused [E, 2I, H] gate_up / [E, H, I] down -> per-expert 2D {e}.gate_proj/up_proj/down_proj.weight."""
    m = EXPERT_RE.match(name)
    base, kind = m.group(1), m.group(2)
    if kind == "gate_up_proj":
        inter = tensor.shape[1] // 2
        for e in range(tensor.shape[0]):
            out[f"{base}.{e}.gate_proj.weight"] = tensor[e, :inter].contiguous()
            out[f"{base}.{e}.up_proj.weight"] = tensor[e, inter:].contiguous()
    else:
        for e in range(tensor.shape[0]):
            out[f"{base}.{e}.down_proj.weight"] = tensor[e].contiguous()


def fuse_experts(tensors):
    """Inverse of split_experts over a whole name->tensor dict."""
    groups = {}
    out = {}
    for name, t in tensors.items():
        m = PER_EXPERT_RE.match(name)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[name] = t
    for base, parts in groups.items():
        n = 1 + max(e for e, _ in parts)
        assert len(parts) == 3 * n, f"incomplete per-expert set under {base}"
        out[f"{base}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate")], parts[(e, "up")]], dim=0) for e in range(n)])
        out[f"{base}.down_proj"] = torch.stack([parts[(e, "down")] for e in range(n)])
    return out


def storage_dtype(spec, disk_name):
    if any(disk_name.endswith(s) for s in spec["f32_suffixes"]):
        return torch.float32
    return spec["dtype"]


def to_disk_tensors(spec, model, mtp):
    """Returns OrderedDict disk_name -> tensor (already in storage dtype), sorted by name."""
    raw = OrderedDict()
    for name, t in model.state_dict().items():
        if name.startswith("model."):
            raw[("main", spec["prefix"] + name[len("model."):])] = t
        else:
            assert name == "lm_head.weight", name
            raw[("main", name)] = t
    for name, t in mtp.state_dict().items():
        raw[("mtp", "mtp." + name)] = t
    out = {}
    for (part, name), t in raw.items():
        layout = spec["main_experts"] if part == "main" else spec["mtp_experts"]
        if EXPERT_RE.match(name) and layout == "per_expert":
            split_experts(name, t, out)
        else:
            out[name] = t
    if spec["visual"]:
        gen = torch.Generator().manual_seed(spec["seed"] + 7)
        v = TINY_VISION
        out["model.visual.patch_embed.proj.weight"] = torch.randn(
            v["hidden_size"], v["in_channels"], v["temporal_patch_size"], v["patch_size"], v["patch_size"],
            generator=gen) * 0.02
        out["model.visual.patch_embed.proj.bias"] = torch.zeros(v["hidden_size"])
        out["model.visual.pos_embed.weight"] = torch.randn(v["num_position_embeddings"], v["hidden_size"],
                                                           generator=gen) * 0.02
    return OrderedDict((n, out[n].detach().to(storage_dtype(spec, n)).contiguous()) for n in sorted(out))


def from_disk_tensors(spec, tensors):
    """disk_name -> tensor  ==>  (main state_dict, mtp state_dict) in fp32, in-memory names."""
    main, mtp = {}, {}
    prefix = spec["prefix"]
    for name, t in tensors.items():
        if name.startswith("model.visual."):
            continue
        t = t.to(torch.float32)
        if name.startswith("mtp."):
            mtp[name[len("mtp."):]] = t
        elif name == "lm_head.weight":
            main[name] = t
        else:
            assert name.startswith(prefix), name
            main["model." + name[len(prefix):]] = t
    return fuse_experts(main), fuse_experts(mtp)


# --------------------------------------------------------------------------------------------------------------
# Writing / reading the checkpoint directory
# --------------------------------------------------------------------------------------------------------------


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def config_json(spec):
    text = copy.deepcopy(spec["text"])
    if not spec["nested"]:
        return text
    s = spec["special"]
    return OrderedDict(
        [
            ("architectures", ["Qwen3_5MoeForConditionalGeneration"]),
            ("image_token_id", s["image"]),
            ("model_type", "qwen3_5_moe"),
            ("text_config", text),
            ("tie_word_embeddings", False),
            ("video_token_id", s["video"]),
            ("vision_config", copy.deepcopy(TINY_VISION)),
            ("vision_end_token_id", s["vision_end"]),
            ("vision_start_token_id", s["vision_start"]),
        ]
    )


def write_checkpoint(spec, outdir, tensors):
    write_json(os.path.join(outdir, "config.json"), config_json(spec))
    write_json(os.path.join(outdir, "generation_config.json"), spec["generation"])
    meta = {"format": "pt"}
    if spec["shards"] == 1:
        save_file(tensors, os.path.join(outdir, "model.safetensors"), metadata=meta)
        return
    # Sharded: fill shard 1 up to half the bytes, in name order (so one layer's tensors straddle the files, as in
    # real multi-file checkpoints), the rest into shard 2.
    n = spec["shards"]
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    shards = [OrderedDict() for _ in range(n)]
    acc, k = 0, 0
    weight_map = OrderedDict()
    for name, t in tensors.items():
        if k < n - 1 and acc >= total * (k + 1) / n:
            k += 1
        shards[k][name] = t
        weight_map[name] = files[k]
        acc += t.numel() * t.element_size()
    for f, sd in zip(files, shards):
        assert sd, "empty shard"
        save_file(sd, os.path.join(outdir, f), metadata=meta)
    write_json(os.path.join(outdir, "model.safetensors.index.json"),
               OrderedDict([("metadata", {"total_size": total}), ("weight_map", weight_map)]))


def read_checkpoint(outdir):
    """Reads every tensor of the checkpoint in outdir (single file or sharded with index)."""
    index_path = os.path.join(outdir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
    else:
        index, files = None, ["model.safetensors"]
    tensors, where = {}, {}
    for fn in files:
        with safe_open(os.path.join(outdir, fn), framework="pt") as f:
            for name in f.keys():
                assert name not in tensors, f"duplicate tensor {name}"
                tensors[name] = f.get_tensor(name)
                where[name] = fn
    if index is not None:
        assert index["weight_map"] == where, "index weight_map does not match the shard contents"
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        assert index["metadata"]["total_size"] == total
    return tensors, where


def load_text_config(outdir, spec):
    cfg = AutoConfig.from_pretrained(outdir)
    if spec["nested"]:
        assert cfg.model_type == "qwen3_5_moe", cfg.model_type
        cfg = cfg.text_config
    assert cfg.model_type == "qwen3_5_moe_text", cfg.model_type
    cfg = finish_config(cfg)
    want = spec["text"]
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads", "num_key_value_heads",
                "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "shared_expert_intermediate_size", "vocab_size", "rms_norm_eps",
                "tie_word_embeddings"):
        if key in want:
            assert getattr(cfg, key) == want[key], (key, getattr(cfg, key), want[key])
    rp = cfg.rope_parameters
    for key in ("rope_type", "rope_theta", "partial_rotary_factor", "mrope_section", "factor",
                "original_max_position_embeddings"):
        assert rp.get(key) == want["rope_parameters"].get(key), (key, rp.get(key))
    assert cfg.tie_word_embeddings is False
    return cfg


# --------------------------------------------------------------------------------------------------------------
# Reference computation
# --------------------------------------------------------------------------------------------------------------


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def margin_of(logits):
    top2 = logits.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


@torch.no_grad()
def compute_references(model, mtp, prompt, text_cfg, full_logits):
    ref = OrderedDict()
    info = {}
    ref["prompt"] = prompt.to(torch.int32)
    n_layers = text_cfg.num_hidden_layers
    n_gdn = sum(t == L for t in text_cfg.layer_types)
    n_attn = n_layers - n_gdn

    # Router margins: gap between the k-th and (k+1)-th largest router logit (main layers and MTP). A tiny gap
    # means an engine could pick a different expert set at that token.
    router_gaps = []

    def router_hook(mod, inp, out):
        logits = out[0].float().sort(dim=-1, descending=True).values
        k = mod.top_k
        router_gaps.append((logits[:, k - 1] - logits[:, k]).min().item())

    hooks = [m.register_forward_hook(router_hook)
             for m in list(model.modules()) + list(mtp.modules()) if isinstance(m, hf_qwen.Qwen3_5MoeTopKRouter)]

    # 1. Independent full-sequence forwards.
    take_calls()
    runs = {}
    for n in RUN_LENGTHS:
        out = model(input_ids=prompt[:n][None], use_cache=False)
        runs[n] = out.logits[0].float().clone()
        calls = take_calls()
        assert calls.get("torch_chunk_gated_delta_rule", 0) == n_gdn, calls
        assert calls.get("causal_conv1d_fn", 0) == n_gdn, calls
        assert calls.get("eager_attention_forward", 0) == n_attn, calls
        assert "torch_recurrent_gated_delta_rule" not in calls and "causal_conv1d_update" not in calls, calls
        info["prefill_calls"] = calls
    longest = runs[PROMPT_LEN]
    info["prefix_rel_err"] = {}
    for n in RUN_LENGTHS:
        e = rel_err(runs[n], longest[:n])
        info["prefix_rel_err"][n] = e
        assert e <= PREFIX_RTOL, f"run of length {n} differs from the prefix of the {PROMPT_LEN}-run: {e}"
        if full_logits:
            ref[f"logits.len{n}"] = runs[n]
    # Last-position logits of each separate run (what a prefill of that length returns).
    ref["logits.last"] = torch.stack([runs[n][-1] for n in RUN_LENGTHS])
    ref["logits.last.len"] = torch.tensor(RUN_LENGTHS, dtype=torch.int32)

    # 2. Per-layer residual stream and final norm output, 130-token run.
    captured = {}
    hooks2 = []
    for i, layer in enumerate(model.model.layers):
        hooks2.append(layer.register_forward_hook(
            lambda mod, inp, out, i=i: captured.__setitem__(i, (out[0] if isinstance(out, tuple) else out))))
    hooks2.append(model.model.norm.register_forward_hook(lambda mod, inp, out: captured.__setitem__("final", out)))
    out = model(input_ids=prompt[None], use_cache=False)
    take_calls()
    for h in hooks2:
        h.remove()
    assert rel_err(out.logits[0], longest) == 0.0
    for i in range(n_layers):
        ref[f"hidden.layer{i}"] = captured[i][0].float().clone()
    final = captured["final"][0].float().clone()
    ref["hidden.final"] = final
    info["final_to_logits_rel_err"] = rel_err(nn.functional.linear(final, model.lm_head.weight), longest)
    assert info["final_to_logits_rel_err"] < 1e-6
    info["logits_std"] = longest.std().item()
    info["layer_update_ratio"] = []
    prev = model.model.embed_tokens(prompt)
    for i in range(n_layers):
        h = ref[f"hidden.layer{i}"]
        info["layer_update_ratio"].append(((h - prev).norm() / prev.norm()).item())
        prev = h

    # 3. Greedy decoding with the cache (GDN recurrent single-token path + KV cache).
    gprompt = prompt[:GREEDY_PROMPT]
    out = model(input_ids=gprompt[None], use_cache=True)
    cache = _out_cache(out)
    info["greedy_prefill_calls"] = take_calls()
    tokens, margins, step_logits = [], [], []
    decode_calls = Counter()
    for step in range(GREEDY_STEPS):
        logits = out.logits[0, -1].float()
        tok = int(logits.argmax())
        tokens.append(tok)
        margins.append(margin_of(logits).item())
        step_logits.append(logits.clone())
        if step == GREEDY_STEPS - 1:
            break
        out = model(input_ids=torch.tensor([[tok]]), use_cache=True, **{_cache_kw(model.forward): cache})
        cache = _out_cache(out)
        decode_calls.update(take_calls())
    steps = GREEDY_STEPS - 1
    assert decode_calls["torch_recurrent_gated_delta_rule"] == steps * n_gdn, decode_calls
    assert decode_calls["causal_conv1d_update"] == steps * n_gdn, decode_calls
    assert "torch_chunk_gated_delta_rule" not in decode_calls and "causal_conv1d_fn" not in decode_calls
    info["decode_calls"] = dict(decode_calls)
    ref["greedy.prompt"] = gprompt.to(torch.int32)
    ref["greedy.tokens"] = torch.tensor(tokens, dtype=torch.int32)
    ref["greedy.margin"] = torch.tensor(margins, dtype=torch.float32)
    info["greedy_min_margin"] = min(margins)
    # Cross-check: the cached decode must match a cache-free forward over prompt + generated tokens.
    full_ids = torch.cat([gprompt, torch.tensor(tokens[:-1])])
    full = model(input_ids=full_ids[None], use_cache=False).logits[0, GREEDY_PROMPT - 1:].float()
    take_calls()
    info["greedy_vs_recompute_rel_err"] = rel_err(torch.stack(step_logits), full)
    assert info["greedy_vs_recompute_rel_err"] < CROSS_RTOL, info["greedy_vs_recompute_rel_err"]

    # 4. MTP draft logits over the 130-token prompt: pairs (H_t, x_{t+1}), t = 0..128.
    nxt = model.model.embed_tokens(prompt[1:])
    mtp_hidden, mtp_logits = mtp(nxt, final[:-1], model.lm_head.weight)
    take_calls()
    ref["mtp.hidden"] = mtp_hidden.float()
    if full_logits:
        ref["mtp.logits"] = mtp_logits
    ref["mtp.logits.rows"] = mtp_logits[list(MTP_SAMPLE_ROWS)]
    ref["mtp.logits.rows.t"] = torch.tensor(MTP_SAMPLE_ROWS, dtype=torch.int32)
    inc = mtp.forward_incremental(nxt, final[:-1], model.lm_head.weight).float()
    take_calls()
    info["mtp_incremental_rel_err"] = rel_err(inc, mtp_logits)
    assert info["mtp_incremental_rel_err"] < CROSS_RTOL, info["mtp_incremental_rel_err"]
    info["mtp_logits_std"] = mtp_logits.std().item()

    for h in hooks:
        h.remove()
    info["min_router_gap"] = min(router_gaps)
    return ref, info


@torch.no_grad()
def hf_loader_check(outdir, ref):
    """transformers' own loader (Qwen3_5MoeForCausalLM.from_pretrained, which handles the nested config, the
    model.language_model. prefix and per-expert tensors) must read the directory and give the same outputs."""
    model, loading = Qwen3_5MoeForCausalLM.from_pretrained(
        outdir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    assert not loading.get("missing_keys") and not loading.get("mismatched_keys"), loading
    model.eval()
    captured = {}
    hook = model.model.norm.register_forward_hook(lambda mod, inp, out: captured.__setitem__("final", out))
    out = model(input_ids=ref["prompt"].long()[None], use_cache=False)
    hook.remove()
    take_calls()
    return max(rel_err(captured["final"][0], ref["hidden.final"]), rel_err(out.logits[0, -1], ref["logits.last"][-1]))


# --------------------------------------------------------------------------------------------------------------
# Independent re-implementation of the model from docs/qwen36-model.md section 2 (plain fp32 torch ops, token-by-
# token recurrent Gated DeltaNet, per-token MoE loop). Used only as a cross-check of transformers and of the spec.
# --------------------------------------------------------------------------------------------------------------


def spec_rms1p(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def spec_yarn(inv, rot, rp):
    """YaRN (Peng et al. 2023, "NTK-by-parts" + attention temperature) from the paper's formulas, in float64: the
    fast dims (more than beta_fast turns over the native context) keep their frequency, the slow ones (fewer than
    beta_slow turns) are divided by the factor, a linear ramp between; cos and sin are scaled by 0.1 ln(factor) + 1."""
    base, factor, native = rp["rope_theta"], rp["factor"], rp["original_max_position_embeddings"]
    dim_of = lambda turns: rot * math.log(native / (turns * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
    lo, hi = max(math.floor(dim_of(rp.get("beta_fast", 32))), 0), min(math.ceil(dim_of(rp.get("beta_slow", 1))), rot - 1)
    ramp = ((torch.arange(rot // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    return inv / factor * ramp + inv * (1 - ramp), 0.1 * math.log(factor) + 1


def spec_rope_tables(cfg, n):
    rp = cfg.rope_parameters
    rot = int(cfg.head_dim * rp["partial_rotary_factor"])
    scale = 1.0
    if rp["rope_type"] == "yarn":
        inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
        inv, scale = spec_yarn(inv, rot, rp)
        inv = inv.float()
    else:
        inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None]
    return rot, ang.cos() * scale, ang.sin() * scale


def spec_attention(w, p, x, cfg):
    t, hd = x.shape[0], cfg.head_dim
    nq, nkv, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rms_norm_eps
    qg = (x @ w[p + "q_proj.weight"].T).view(t, nq, 2 * hd)  # per head: [query | gate]
    q, gate = qg[..., :hd], qg[..., hd:].reshape(t, nq * hd)
    k = (x @ w[p + "k_proj.weight"].T).view(t, nkv, hd)
    v = (x @ w[p + "v_proj.weight"].T).view(t, nkv, hd)
    q, k = spec_rms1p(q, w[p + "q_norm.weight"], eps), spec_rms1p(k, w[p + "k_norm.weight"], eps)
    rot, cos, sin = spec_rope_tables(cfg, t)
    half = rot // 2

    def rope(z):  # rotate_half pairing (d, d + rot/2) on the first rot dims of every head
        z1, z2 = z[..., :half], z[..., half:rot]
        c, s = cos[:, None], sin[:, None]
        return torch.cat([z1 * c - z2 * s, z2 * c + z1 * s, z[..., rot:]], dim=-1)

    q, k = rope(q), rope(k)
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)
    out = torch.empty(t, nq, hd)
    for h in range(nq):
        kv = h // (nq // nkv)
        sc = (q[:, h] @ k[:, kv].T) * hd ** -0.5
        out[:, h] = sc.masked_fill(causal, float("-inf")).softmax(-1) @ v[:, kv]
    o = out.reshape(t, nq * hd) * torch.sigmoid(gate)
    return o @ w[p + "o_proj.weight"].T


def spec_gdn(w, p, x, cfg):
    t = x.shape[0]
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, kern, eps = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim, cfg.rms_norm_eps
    qkv = x @ w[p + "in_proj_qkv.weight"].T
    cw = w[p + "conv1d.weight"][:, 0, :]  # [C, K]; column K-1 multiplies the current token
    padded = torch.cat([torch.zeros(kern - 1, qkv.shape[1]), qkv])
    c = sum(cw[:, j] * padded[j:j + t] for j in range(kern))
    c = c * torch.sigmoid(c)
    q = c[:, :nk * dk].view(t, nk, dk)
    k = c[:, nk * dk:2 * nk * dk].view(t, nk, dk)
    v = c[:, 2 * nk * dk:].view(t, nv, dv)
    z = (x @ w[p + "in_proj_z.weight"].T).view(t, nv, dv)
    beta = torch.sigmoid(x @ w[p + "in_proj_b.weight"].T)
    g = -torch.exp(w[p + "A_log"]) * nn.functional.softplus(x @ w[p + "in_proj_a.weight"].T + w[p + "dt_bias"])
    l2 = lambda u: u * torch.rsqrt((u * u).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    q = l2(q) * dk ** -0.5
    k = l2(k)
    r = nv // nk  # value head j uses q/k head j // r
    q, k = q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1)
    state = torch.zeros(nv, dk, dv)
    o = torch.empty(t, nv, dv)
    for i in range(t):
        state = state * torch.exp(g[i])[:, None, None]
        mem = torch.einsum("jkv,jk->jv", state, k[i])
        delta = beta[i][:, None] * (v[i] - mem)
        state = state + k[i][:, :, None] * delta[:, None, :]
        o[i] = torch.einsum("jkv,jk->jv", state, q[i])
    y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * w[p + "norm.weight"]
    y = y * nn.functional.silu(z)
    return y.reshape(t, nv * dv) @ w[p + "out_proj.weight"].T


def spec_moe(w, p, x, cfg):
    inter, topk = cfg.moe_intermediate_size, cfg.num_experts_per_tok
    probs = (x @ w[p + "gate.weight"].T).softmax(-1)
    top_w, top_i = probs.topk(topk, dim=-1)
    top_w = top_w / top_w.sum(-1, keepdim=True)
    gate_up, down = w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"]
    routed = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk):
            e = int(top_i[t, j])
            gu = gate_up[e] @ x[t]
            routed[t] += top_w[t, j] * (down[e] @ (nn.functional.silu(gu[:inter]) * gu[inter:]))
    sp = p + "shared_expert."
    shared = (nn.functional.silu(x @ w[sp + "gate_proj.weight"].T) * (x @ w[sp + "up_proj.weight"].T)) \
        @ w[sp + "down_proj.weight"].T
    return routed + torch.sigmoid(x @ w[p + "shared_expert_gate.weight"].T) * shared


def spec_layer(w, p, x, cfg, kind):
    eps = cfg.rms_norm_eps
    hn = spec_rms1p(x, w[p + "input_layernorm.weight"], eps)
    if kind == L:
        x = x + spec_gdn(w, p + "linear_attn.", hn, cfg)
    else:
        x = x + spec_attention(w, p + "self_attn.", hn, cfg)
    return x + spec_moe(w, p + "mlp.", spec_rms1p(x, w[p + "post_attention_layernorm.weight"], eps), cfg)


@torch.no_grad()
def spec_check(main_sd, mtp_sd, cfg, ref):
    """Recomputes logits.len130-equivalent, every hidden state and the MTP output from the spec; returns the
    largest relative error against the transformers-based references."""
    prompt = ref["prompt"].long()
    eps = cfg.rms_norm_eps
    x = main_sd["model.embed_tokens.weight"][prompt]
    errs = {}
    for i, kind in enumerate(cfg.layer_types):
        x = spec_layer(main_sd, f"model.layers.{i}.", x, cfg, kind)
        errs[f"hidden.layer{i}"] = rel_err(x, ref[f"hidden.layer{i}"])
    final = spec_rms1p(x, main_sd["model.norm.weight"], eps)
    errs["hidden.final"] = rel_err(final, ref["hidden.final"])
    logits = final @ main_sd["lm_head.weight"].T
    errs["logits.last"] = rel_err(logits[ref["logits.last.len"].long() - 1], ref["logits.last"])
    e = spec_rms1p(main_sd["model.embed_tokens.weight"][prompt[1:]], mtp_sd["pre_fc_norm_embedding.weight"], eps)
    h = spec_rms1p(final[:-1], mtp_sd["pre_fc_norm_hidden.weight"], eps)
    u = torch.cat([e, h], dim=-1) @ mtp_sd["fc.weight"].T
    u = spec_layer(mtp_sd, "layers.0.", u, cfg, A)
    out = spec_rms1p(u, mtp_sd["norm.weight"], eps)
    errs["mtp.hidden"] = rel_err(out, ref["mtp.hidden"])
    rows = ref["mtp.logits.rows.t"].long()
    errs["mtp.logits.rows"] = rel_err(out[rows] @ main_sd["lm_head.weight"].T, ref["mtp.logits.rows"])
    return errs


# --------------------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------------------


def rope_cases(spec):
    """transformers' inverse frequencies and attention scaling for each of spec's rope_cases, with the complete text
    config each was computed from."""
    out = []
    for name, rope, extra in spec["rope_cases"]:
        text = copy.deepcopy(spec["text"])
        text.update(copy.deepcopy(extra))
        text["rope_parameters"] = copy.deepcopy(OrderedDict(rope))
        cfg = text_config_from_fields(text)
        rot = hf_qwen.Qwen3_5MoeTextRotaryEmbedding(cfg)
        out.append(OrderedDict([("name", name), ("config", text), ("inv_freq", rot.inv_freq.tolist()),
                                ("attention_factor", float(rot.attention_scaling))]))
    return out


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_fixture(name, spec, outroot, full_logits):
    outdir = os.path.join(outroot, name)
    os.makedirs(outdir, exist_ok=True)
    for fn in os.listdir(outdir):  # remove what an earlier run wrote (e.g. when the shard count changed)
        if fn.endswith(".safetensors") or fn in ("config.json", "generation_config.json",
                                                 "model.safetensors.index.json", "rope_cases.json"):
            os.remove(os.path.join(outdir, fn))

    # Step 1: random model in fp32.
    cfg = text_config_from_fields(spec["text"])
    model, mtp = build_models(cfg, spec["seed"])
    rules = init_weights(model, mtp, spec["seed"], cfg.hidden_size)

    # Step 2: round to storage dtype, write, reload the written files into fresh fp32 modules.
    tensors = to_disk_tensors(spec, model, mtp)
    write_checkpoint(spec, outdir, tensors)
    del model, mtp
    cfg2 = load_text_config(outdir, spec)
    model, mtp = build_models(cfg2, spec["seed"] + 1000)  # different init: everything must come from the files
    disk, where = read_checkpoint(outdir)
    assert list(disk) == list(tensors)
    for n, t in disk.items():
        assert t.dtype == tensors[n].dtype and torch.equal(t, tensors[n]), n
    main_sd, mtp_sd = from_disk_tensors(spec, disk)
    model.load_state_dict(main_sd, strict=True)
    mtp.load_state_dict(mtp_sd, strict=True)

    # Step 3..6: references.
    gen = torch.Generator().manual_seed(spec["seed"] + 1)
    prompt = torch.randint(0, cfg2.vocab_size, (PROMPT_LEN,), generator=gen)
    ref, info = compute_references(model, mtp, prompt, cfg2, full_logits)
    info["spec_check"] = spec_check(main_sd, mtp_sd, cfg2, ref)
    info["hf_loader_rel_err"] = hf_loader_check(outdir, ref)
    worst = max(info["spec_check"].values())
    assert worst < SPEC_RTOL, info["spec_check"]
    assert info["hf_loader_rel_err"] < 1e-6, info["hf_loader_rel_err"]
    ref = OrderedDict((k, v.contiguous()) for k, v in ref.items())
    if "rope_cases" in spec:
        write_json(os.path.join(outdir, "rope_cases.json"), rope_cases(spec))
    save_file(ref, os.path.join(outdir, "reference.safetensors"),
              # a single metadata key: safetensors writes a multi-key metadata map in hash order (not reproducible)
              metadata={"tern_oracle": f"format=1;fixture={name};full_logits={str(full_logits).lower()}"})
    info["rules"] = dict(rules)
    info["tensors"] = [(n, str(t.dtype).replace("torch.", ""), list(t.shape), where[n]) for n, t in disk.items()]
    info["reference"] = [(n, str(t.dtype).replace("torch.", ""), list(t.shape)) for n, t in ref.items()]
    return outdir, info


def dir_files(outdir):
    return sorted((fn, os.path.getsize(os.path.join(outdir, fn))) for fn in os.listdir(outdir))


def write_tensor_list(path, infos):
    lines = ["# Tensor names of the tern oracle fixtures (generated by tools/oracle/make_fixtures.py; do not edit).",
             "# checkpoint lines: name  dtype  shape  file;  reference lines: name  dtype  shape", ""]
    for name, info in infos.items():
        lines.append(f"[{name}] checkpoint ({len(info['tensors'])} tensors)")
        for n, dt, shape, fn in info["tensors"]:
            lines.append(f"{n}  {dt}  {shape}  {fn}")
        lines.append("")
        lines.append(f"[{name}] reference.safetensors ({len(info['reference'])} tensors)")
        for n, dt, shape in info["reference"]:
            lines.append(f"{n}  {dt}  {shape}")
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output root, e.g. tests/fixtures")
    ap.add_argument("--only", nargs="*", choices=list(FIXTURES), help="generate only these fixtures")
    ap.add_argument("--tensor-list", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "TENSORS.txt"),
                    help="where to write the tensor name list ('' to skip)")
    ap.add_argument("--full-logits", action="store_true",
                    help="also store the vocabulary-wide logits.len{1,63,64,65,130} and mtp.logits (about 7 MB in "
                         "all; for local debugging only, exceeds the 5 MB budget of the committed fixtures)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.disable_progress_bar()
    check_environment()
    install_call_counters()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, CPU fp32, eager attention, "
          f"eager experts, threads {torch.get_num_threads()}")

    names = args.only or list(FIXTURES)
    infos, dirs = OrderedDict(), OrderedDict()
    for name in names:
        dirs[name], infos[name] = make_fixture(name, FIXTURES[name], args.out, args.full_logits)

    grand = 0
    for name in names:
        info = infos[name]
        files = dir_files(dirs[name])
        total = sum(s for _, s in files)
        grand += total
        print(f"\n== {name}: {dirs[name]}")
        for fn, s in files:
            print(f"   {s:>10,d}  {fn}")
        print(f"   {total:>10,d}  total")
        print(f"   logits std (len130) {info['logits_std']:.4f}; mtp logits std {info['mtp_logits_std']:.4f}")
        print(f"   min greedy top1-top2 margin {info['greedy_min_margin']:.5f}")
        print(f"   min router logit gap (k-th minus (k+1)-th) {info['min_router_gap']:.4f}")
        print(f"   layer update ratios |h_i - h_(i-1)| / |h_(i-1)|: "
              + " ".join(f"{r:.2f}" for r in info["layer_update_ratio"]))
        print("   prefix rel err: " + ", ".join(f"len{n} {e:.1e}" for n, e in info["prefix_rel_err"].items()))
        print(f"   hidden.final @ lm_head^T vs model logits rel err {info['final_to_logits_rel_err']:.1e}")
        print(f"   cached greedy vs recompute rel err {info['greedy_vs_recompute_rel_err']:.1e}; "
              f"MTP one-shot vs incremental rel err {info['mtp_incremental_rel_err']:.1e}")
        print("   spec re-implementation max rel err: "
              + ", ".join(f"{k} {v:.1e}" for k, v in info["spec_check"].items()))
        print(f"   transformers from_pretrained() of the directory vs references: rel err {info['hf_loader_rel_err']:.1e}")
        print(f"   calls per full forward: {info['prefill_calls']}")
        print(f"   calls in greedy prefill: {info['greedy_prefill_calls']}")
        print(f"   calls in {GREEDY_STEPS - 1} decode steps: {info['decode_calls']}")
        print(f"   init rules: {info['rules']}")
    print(f"\nTOTAL {grand:,d} bytes ({grand / MB:.3f} MB) for {len(names)} fixture(s); limit {SIZE_LIMIT:,d}")
    for name in names:
        assert infos[name]["min_router_gap"] >= MIN_ROUTER_GAP, (name, infos[name]["min_router_gap"])
        assert infos[name]["greedy_min_margin"] >= MIN_GREEDY_MARGIN, (name, infos[name]["greedy_min_margin"])
    if len(names) == len(FIXTURES) and not args.full_logits:
        assert grand < SIZE_LIMIT, "fixtures exceed the 5 MB budget"
        if args.tensor_list:
            write_tensor_list(args.tensor_list, infos)
            print(f"tensor list written to {args.tensor_list}")
    print("sha256:")
    for name in names:
        for fn, _ in dir_files(dirs[name]):
            print(f"   {sha256_file(os.path.join(dirs[name], fn))}  {name}/{fn}")


if __name__ == "__main__":
    main()
