#!/usr/bin/env python3
"""Small FP8 block-quantized checkpoint for the `tern pack` tests.

Writes a random Qwen3.5/3.6 MoE text model (flat `qwen3_5_moe_text` config, bare `model.` prefix,
per-expert routed experts, an MTP layer) in the layout of the published FP8 checkpoints: each large
projection is `weight` F8_E4M3 plus `weight_scale_inv` F32 [ceil(rows/128), ceil(cols/128)], meaning
w = fp8 * scale_inv per 128 x 128 block; embeddings, lm_head, router, shared_expert_gate,
in_proj_a/b, norms, conv1d, A_log and dt_bias stay bf16. Dimensions are picked so blocks are partial
(160 = 1.25 blocks) and 160 is a multiple of 32 but not of 64 (tern pack then quantizes with group 32).

The FP8 rounding is torch's float8_e4m3fn cast, an encoder independent of tern's decoder.
Deterministic (fixed seed).

Run:  python3 tools/pack/make_fp8_fixture.py [--out tests/fixtures/fp8-small]
"""

import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file

H, V, I, SH, E, TOPK = 160, 64, 32, 32, 4, 2
HEADS, KV, HD = 2, 1, 32
GK, GV, GKD, GVD, CONV = 2, 4, 16, 16, 4
BLOCK = 128
LAYERS = ["linear_attention", "full_attention"]

CONFIG = {
    "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "dtype": "bfloat16",
    "hidden_size": H, "vocab_size": V, "num_hidden_layers": len(LAYERS), "layer_types": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD, "attn_output_gate": True,
    "linear_num_key_heads": GK, "linear_num_value_heads": GV, "linear_key_head_dim": GKD,
    "linear_value_head_dim": GVD, "linear_conv_kernel_dim": CONV, "num_experts": E, "num_experts_per_tok": TOPK,
    "moe_intermediate_size": I, "shared_expert_intermediate_size": SH, "mtp_num_hidden_layers": 1,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "eos_token_id": 1, "bos_token_id": 0,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [BLOCK, BLOCK],
                            "modules_to_not_convert": ["lm_head", "embed_tokens", "mlp.gate", "shared_expert_gate",
                                                       "in_proj_a", "in_proj_b"]},
}


def fp8(w):
    """Block-wise FP8 with scale_inv = amax / 448 per 128 x 128 block."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)
    scale_inv = torch.zeros(br, bc, dtype=torch.float32)
    q = torch.zeros(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = blk.abs().max().clamp(min=1e-12) / 448.0
            scale_inv[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale_inv


class Writer:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.t = {}

    def rand(self, *shape, std=0.05):
        return torch.randn(*shape, generator=self.g) * std

    def bf16(self, name, *shape, std=0.05, mean=0.0):
        self.t[name] = (self.rand(*shape, std=std) + mean).to(torch.bfloat16)

    def fp8(self, name, rows, cols):
        # a few outliers so blocks get different scales
        w = self.rand(rows, cols)
        w[0, 0] = 0.4
        q, s = fp8(w)
        self.t[name] = q
        self.t[name + "_scale_inv"] = s

    def moe(self, p, per_expert=True):
        self.bf16(p + "mlp.gate.weight", E, H)
        self.bf16(p + "mlp.shared_expert_gate.weight", 1, H)
        for part, r, c in (("gate", SH, H), ("up", SH, H), ("down", H, SH)):
            self.fp8(f"{p}mlp.shared_expert.{part}_proj.weight", r, c)
        for e in range(E):
            for part, r, c in (("gate", I, H), ("up", I, H), ("down", H, I)):
                self.fp8(f"{p}mlp.experts.{e}.{part}_proj.weight", r, c)

    def attn(self, p):
        self.fp8(p + "self_attn.q_proj.weight", HEADS * HD * 2, H)
        self.fp8(p + "self_attn.k_proj.weight", KV * HD, H)
        self.fp8(p + "self_attn.v_proj.weight", KV * HD, H)
        self.fp8(p + "self_attn.o_proj.weight", H, HEADS * HD)
        self.bf16(p + "self_attn.q_norm.weight", HD, std=0.1)
        self.bf16(p + "self_attn.k_norm.weight", HD, std=0.1)

    def gdn(self, p):
        conv = 2 * GK * GKD + GV * GVD
        self.fp8(p + "linear_attn.in_proj_qkv.weight", conv, H)
        self.fp8(p + "linear_attn.in_proj_z.weight", GV * GVD, H)
        self.bf16(p + "linear_attn.in_proj_a.weight", GV, H)
        self.bf16(p + "linear_attn.in_proj_b.weight", GV, H)
        self.fp8(p + "linear_attn.out_proj.weight", H, GV * GVD)
        self.bf16(p + "linear_attn.conv1d.weight", conv, 1, CONV, std=0.2)
        self.bf16(p + "linear_attn.A_log", GV, std=0.5)
        self.bf16(p + "linear_attn.dt_bias", GV, std=0.5)
        self.bf16(p + "linear_attn.norm.weight", GVD, std=0.1, mean=1.0)


def build():
    w = Writer(1234)
    w.bf16("model.embed_tokens.weight", V, H)
    w.bf16("lm_head.weight", V, H)
    w.bf16("model.norm.weight", H, std=0.1)
    for i, kind in enumerate(LAYERS):
        p = f"model.layers.{i}."
        w.bf16(p + "input_layernorm.weight", H, std=0.1)
        w.bf16(p + "post_attention_layernorm.weight", H, std=0.1)
        (w.gdn if kind == "linear_attention" else w.attn)(p)
        w.moe(p)
    w.fp8("mtp.fc.weight", H, 2 * H)
    for n in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
              "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight"):
        w.bf16(n, H, std=0.1)
    w.attn("mtp.layers.0.")
    w.moe("mtp.layers.0.")
    return w.t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/fp8-small")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t = build()
    save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"{a.out}: {len(t)} tensors, {total} bytes")


if __name__ == "__main__":
    main()
