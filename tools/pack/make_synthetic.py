#!/usr/bin/env python3
"""Synthetic Hugging Face checkpoint of the Qwen3.5/3.6 MoE text model, for timing `tern pack`.

Random bf16 weights (no model quality), the real tensor names and shapes for the chosen sizes,
sharded like a Hugging Face export (model-0000N-of-0000M.safetensors + index) with fused experts.
The defaults give ~440 MB: hidden 1024, 6 layers, 16 experts of 512, vocab 16384, an MTP layer.

Run:  python3 tools/pack/make_synthetic.py OUT [--hidden 1024] [--layers 8] [--experts 64] [--inter 512]
      build/tern pack OUT OUT-packed
"""

import argparse
import json
import os

import numpy as np


def bf16(rng, *shape, std=0.02):
    """Random bf16 bit patterns (float32 rounded by truncation: plenty for timing)."""
    x = (rng.standard_normal(shape, dtype=np.float32) * std).view(np.uint32)
    return (x >> 16).astype(np.uint16)


def save_bf16(tensors, path):
    """A safetensors file of bf16 tensors given as uint16 bit patterns."""
    header, off = {}, 0
    for name in sorted(tensors):
        n = tensors[name].nbytes
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for name in sorted(tensors):
            f.write(np.ascontiguousarray(tensors[name]).astype("<u2").tobytes())


def layer(rng, p, a, attn):
    H, I, E, S = a.hidden, a.inter, a.experts, a.inter
    t = {p + "input_layernorm.weight": bf16(rng, H), p + "post_attention_layernorm.weight": bf16(rng, H)}
    if attn:
        q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
        t.update({p + "self_attn.q_proj.weight": bf16(rng, 2 * q, H), p + "self_attn.k_proj.weight": bf16(rng, kv, H),
                  p + "self_attn.v_proj.weight": bf16(rng, kv, H), p + "self_attn.o_proj.weight": bf16(rng, H, q),
                  p + "self_attn.q_norm.weight": bf16(rng, a.head_dim), p + "self_attn.k_norm.weight": bf16(rng, a.head_dim)})
    else:
        kd, vd = 2 * 128, 4 * 128
        t.update({p + "linear_attn.in_proj_qkv.weight": bf16(rng, 2 * kd + vd, H),
                  p + "linear_attn.in_proj_z.weight": bf16(rng, vd, H), p + "linear_attn.in_proj_a.weight": bf16(rng, 4, H),
                  p + "linear_attn.in_proj_b.weight": bf16(rng, 4, H), p + "linear_attn.out_proj.weight": bf16(rng, H, vd),
                  p + "linear_attn.conv1d.weight": bf16(rng, 2 * kd + vd, 1, 4), p + "linear_attn.A_log": bf16(rng, 4),
                  p + "linear_attn.dt_bias": bf16(rng, 4), p + "linear_attn.norm.weight": bf16(rng, 128)})
    t.update({p + "mlp.gate.weight": bf16(rng, E, H), p + "mlp.shared_expert_gate.weight": bf16(rng, 1, H),
              p + "mlp.shared_expert.gate_proj.weight": bf16(rng, S, H), p + "mlp.shared_expert.up_proj.weight": bf16(rng, S, H),
              p + "mlp.shared_expert.down_proj.weight": bf16(rng, H, S),
              p + "mlp.experts.gate_up_proj": bf16(rng, E, 2 * I, H), p + "mlp.experts.down_proj": bf16(rng, E, H, I)})
    return t


def config(a):
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(a.layers)]
    return {"model_type": "qwen3_5_moe_text", "dtype": "bfloat16", "hidden_size": a.hidden, "vocab_size": a.vocab,
            "num_hidden_layers": a.layers, "layer_types": types, "num_attention_heads": a.heads,
            "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4, "num_experts": a.experts, "num_experts_per_tok": 8,
            "moe_intermediate_size": a.inter, "shared_expert_intermediate_size": a.inter,
            "mtp_num_hidden_layers": 1, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
            "tie_word_embeddings": False, "eos_token_id": 1}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    os.makedirs(a.out, exist_ok=True)
    n_shards = a.layers + 2

    def shards():
        # one shard at a time: the whole model never sits in memory
        yield {"lm_head.weight": bf16(rng, a.vocab, a.hidden),
               "model.language_model.embed_tokens.weight": bf16(rng, a.vocab, a.hidden),
               "model.language_model.norm.weight": bf16(rng, a.hidden)}
        for i in range(a.layers):
            yield layer(rng, f"model.language_model.layers.{i}.", a, (i + 1) % 4 == 0)
        mtp = layer(rng, "mtp.layers.0.", a, True)
        mtp.update({"mtp.fc.weight": bf16(rng, a.hidden, 2 * a.hidden), "mtp.norm.weight": bf16(rng, a.hidden),
                    "mtp.pre_fc_norm_embedding.weight": bf16(rng, a.hidden),
                    "mtp.pre_fc_norm_hidden.weight": bf16(rng, a.hidden)})
        yield mtp

    weight_map, total = {}, 0
    for k, tensors in enumerate(shards()):
        name = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        path = os.path.join(a.out, name)
        save_bf16(tensors, path)
        weight_map.update({t: name for t in tensors})
        total += os.path.getsize(path)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1, sort_keys=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a), f, indent=1, sort_keys=True)
    print(f"{a.out}: {n_shards} shards, {total / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
