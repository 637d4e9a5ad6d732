#!/usr/bin/env python3
"""MLX-style affine-quantized checkpoint for the `tern pack` tests.

Reads the bf16 oracle fixture tests/fixtures/tiny and writes what `mlx_lm.convert -q` makes of a
Qwen3.5/3.6 MoE checkpoint, re-implemented here in numpy (MLX itself is not needed):

  * names `language_model.model.layers.N...`, `language_model.lm_head.weight` (mlx_lm's
    qwen3_5_moe sanitize); the MTP head is kept under `mtp.*` the way MTP-carrying MLX repos do;
  * routed experts split from `gate_up_proj` into `mlp.switch_mlp.{gate,up,down}_proj`, stacked [E, ...];
  * every Linear quantized (`weight` U32 words + `scales` + `biases`, bf16): 4-bit, group 32 by default,
    router `mlp.gate` and `shared_expert_gate` 8-bit group 64 (mlx_lm's quant_predicate for this model);
  * the (1 + w) RMSNorm weights stored shifted: w + 1 (input/post_attention layernorms, final norm,
    q_norm/k_norm, and the MTP norms), but not linear_attn.norm (the gated norm multiplies by w);
  * conv1d.weight moved from HF's [C, 1, K] to MLX's [C, K, 1];
  * config.json gets the "quantization" block with the per-module overrides.

The quantizer is MLX's affine one (scale/bias chosen so the larger-magnitude edge of each group is
exact, which gives negative scales for groups whose max dominates), and q is packed into little-endian
uint32 words, element i of a word at bits [i*bits, (i+1)*bits). Deterministic: same input, same bytes.

Run:  python3 tools/pack/make_mlx_fixture.py [--src tests/fixtures/tiny] [--out tests/fixtures/mlx-tiny]
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

SHIFTED_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
                 ".k_norm.weight", "model.norm.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
                 "mtp.pre_fc_norm_hidden.weight")


def bf16_bits(x):
    """float32 numpy -> uint16 bf16 bit patterns (round to nearest even, via torch)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


def bf16_value(bits):
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()


def mlx_quantize(w, bits, group):
    """w float32 [..., cols] -> (uint32 words [..., cols*bits/32], scales bf16 bits, biases bf16 bits)."""
    levels = (1 << bits) - 1
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group, group).astype(np.float32)
    w_max, w_min = g.max(-1), g.min(-1)
    scale = np.maximum((w_max - w_min) / levels, 1e-7)
    neg_edge = np.abs(w_min) > np.abs(w_max)
    scale = np.where(neg_edge, scale, -scale)
    edge = np.where(neg_edge, w_min, w_max)
    q0 = np.rint(edge / scale)
    scale = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scale)
    bias = np.where(q0 == 0, 0, edge)
    s_bits, b_bits = bf16_bits(scale), bf16_bits(bias)
    s, b = bf16_value(s_bits)[..., None], bf16_value(b_bits)[..., None]
    q = np.clip(np.rint((g - b) / s), 0, levels).astype(np.uint32).reshape(w.shape)
    per_word = 32 // bits
    q = q.reshape(*w.shape[:-1], w.shape[-1] // per_word, per_word)
    words = np.zeros(q.shape[:-1], dtype=np.uint32)
    for i in range(per_word):
        words |= q[..., i] << np.uint32(i * bits)
    return words.astype("<u4"), s_bits, b_bits


def mlx_name(name):
    if name.startswith("model.language_model."):
        return "language_model.model." + name[len("model.language_model."):]
    if name == "lm_head.weight":
        return "language_model.lm_head.weight"
    return name  # mtp.*


def quant_params(name, default_bits, default_group):
    if name.endswith(".mlp.gate.weight") or name.endswith("shared_expert_gate.weight"):
        return 8, 64
    return default_bits, default_group


def is_linear(name, shape):
    if len(shape) < 2 or not name.endswith("weight") or "conv1d" in name or "norm" in name:
        return False
    return True


def convert(src, bits, group):
    tensors = load_file(os.path.join(src, "model.safetensors"))
    out, overrides = {}, {}

    def put_linear(name, w):
        b, g = quant_params(name, bits, group)
        words, s, bi = mlx_quantize(w, b, g)
        base = mlx_name(name)[: -len("weight")]
        out[base + "weight"], out[base + "scales"], out[base + "biases"] = words, s, bi
        if (b, g) != (bits, group):
            overrides[base[:-1]] = {"group_size": g, "bits": b}

    for name in sorted(tensors):
        t = tensors[name]
        if name.startswith("model.visual"):
            continue  # mlx_lm drops the vision tower
        w = t.float().numpy()
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("experts.gate_up_proj")]
            half = w.shape[1] // 2
            put_linear(prefix + "switch_mlp.gate_proj.weight", w[:, :half, :])
            put_linear(prefix + "switch_mlp.up_proj.weight", w[:, half:, :])
        elif name.endswith("mlp.experts.down_proj"):
            put_linear(name[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight", w)
        elif is_linear(name, w.shape):
            put_linear(name, w)
        elif name.endswith(SHIFTED_NORMS):
            out[mlx_name(name)] = bf16_bits(w + 1.0)
        elif name.endswith("conv1d.weight"):
            out[mlx_name(name)] = bf16_bits(np.moveaxis(w, 2, 1))  # [C, 1, K] -> [C, K, 1]
        else:
            out[mlx_name(name)] = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else w
    return out, overrides


def save_bf16(path, tensors):
    """safetensors.numpy has no bf16: write uint16 bit patterns, then relabel the dtypes in the header."""
    save_file(tensors, path, metadata={"format": "mlx"})
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    for k, v in header.items():
        if k != "__metadata__" and v["dtype"] == "U16":
            v["dtype"] = "BF16"
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + data[8 + n:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default="tests/fixtures/tiny")
    ap.add_argument("--out", default="tests/fixtures/mlx-tiny")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=32)
    a = ap.parse_args()
    tensors, overrides = convert(a.src, a.bits, a.group)
    os.makedirs(a.out, exist_ok=True)
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    cfg["quantization"] = {"group_size": a.group, "bits": a.bits, "mode": "affine", **overrides}
    cfg["quantization_config"] = cfg["quantization"]
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copy(os.path.join(a.src, "generation_config.json"), a.out)
    save_bf16(os.path.join(a.out, "model.safetensors"), tensors)
    total = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"{a.out}: {len(tensors)} tensors, {total} bytes")


if __name__ == "__main__":
    main()
