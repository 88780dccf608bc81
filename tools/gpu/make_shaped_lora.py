#!/usr/bin/env python3
"""A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors in float32) of rank R on every projection
(q, k, v, o, gate, up, down) of a Llama-family model folder's config.json: random values, for timing LoRA on a
--load-format dummy model of the same shape (the lora stage of run_gpu_checks.sh). Nothing but the standard library.
usage: make_shaped_lora.py MODEL_DIR OUT_DIR [--rank 16]"""
import argparse
import json
import os
import random
import struct

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("out")
parser.add_argument("--rank", type=int, default=16)
args = parser.parse_args()
config = json.load(open(os.path.join(args.model, "config.json")))
hidden, inter = config["hidden_size"], config["intermediate_size"]
heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
head_dim = config.get("head_dim") or hidden // heads
shapes = {"self_attn.q_proj": (heads * head_dim, hidden), "self_attn.k_proj": (kv_heads * head_dim, hidden),
          "self_attn.v_proj": (kv_heads * head_dim, hidden), "self_attn.o_proj": (hidden, heads * head_dim),
          "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
r = args.rank
rng = random.Random(1)
# One block of small random floats, repeated: the values do not matter for timing, only that they are finite.
pool = struct.pack(f"<{r * 4096}f", *[rng.uniform(-0.01, 0.01) for _ in range(r * 4096)])
header, sizes, offset = {"__metadata__": {"format": "pt"}}, [], 0
for layer in range(config["num_hidden_layers"]):
    for module, (out_features, in_features) in shapes.items():
        for name, shape in (("lora_A", [r, in_features]), ("lora_B", [out_features, r])):
            size = shape[0] * shape[1] * 4
            header[f"base_model.model.model.layers.{layer}.{module}.{name}.weight"] = {
                "dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
            sizes.append(size)
text = json.dumps(header)
text += " " * (-(8 + len(text)) % 8)
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, "adapter_model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text.encode())
    for size in sizes:
        f.write((pool * (size // len(pool) + 1))[:size])
json.dump({"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "bias": "none", "use_rslora": False,
           "target_modules": [m.split(".")[1] for m in shapes], "task_type": "CAUSAL_LM"},
          open(os.path.join(args.out, "adapter_config.json"), "w"))
print(f"make_shaped_lora: {len(sizes) // 2} pairs of rank {r}, {offset >> 20} MiB in {args.out}")
