#!/usr/bin/env python3
"""Tiny random-weight checkpoints of the model families the engine serves, with Hugging Face float32 references.

Run where transformers (5.x) and torch are installed (the H200 machine); everything runs on the CPU in float32:
    python3 tools/gpu/make_family_refs.py --out DIR
For each family below it writes DIR/<name>/: config.json, generation_config.json and model.safetensors as
save_pretrained writes them (float32, transformers' own config fields: rope_parameters, dtype, layer_types), and
refs.json with, per prompt case,
  - "prompt": the token ids, "tokens": HF's greedy continuation (use_cache, one token at a time after the prompt),
  - "margins": HF's top-1 minus top-2 logit at each greedy step (a step whose margin is tiny is a near-tie),
  - "prompt_logits": the logits after the prompt's last token, "last_logits": the logits that chose the last greedy
    token (after prompt + tokens[:-1]), both rounded to 5 decimals,
  - "max_model_len": the context the case stays within (the engine's max_model_len to run it with: Phi-3's LongRoPE
    uses its short factors while a sequence stays within original_max_position_embeddings, and the long ones for a
    sequence that is longer from its first token).
Every model is well under 2 MB so that DIR can be copied to tests/models/ and committed; the CPU tests
(tests/kernels/cpu/test_model_families.cpp) read it from there and skip when it is absent.

Weights: seeded normal init with a larger range than HF's default (peakier logits, fewer near-ties), RMSNorm weights
(including Qwen3's q_norm / k_norm) set to 1 + noise and biases to noise, so that a runner ignoring one of them fails.
Gemma 3's norms scale by (1 + weight), so theirs are set to noise around 0 (HF initialises them to zeros).
Sliding-window models use a window of 32 (Gemma 3: 16) and prompts of 70-150 tokens, crossing the window several
times.

Mixture of experts (Mixtral, Qwen3-MoE): save_pretrained writes the experts in the checkpoint layout of its
transformers generation (per expert: block_sparse_moe.experts.E.w1/w2/w3 or mlp.experts.E.gate_proj/up_proj/down_proj,
by default in 5.x, which converts back to the original format on save) and, with save_original_format=False, fused as
transformers 5 holds them in memory (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]); each
MoE model is written both ways, <name>/ and <name>-fused/ (same weights, same refs.json, checked by reloading).

--families builds only the named families (the part of a model's name before its first '-': gemma3 builds gemma3
and gemma3-softcap) or model_types (mixtral,qwen3_moe); every model keeps its seed (its place in the list, or its own
in OWN_SEEDS) whatever is selected, so the others' files do not change.
"""
import argparse
import json
import os
import sys

import torch
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, MistralConfig, MixtralConfig, Phi3Config,
                          Qwen2Config, Qwen3Config, Qwen3MoeConfig)

VOCAB = 512
WINDOW = 32
GEMMA3_WINDOW = 16
STEPS = 24


def families():
    """name -> (config, [(prompt length, max_model_len), ...])."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, rms_norm_eps=1e-6, initializer_range=0.1,
                  bos_token_id=1, eos_token_id=2, max_position_embeddings=512)
    long_cases = [(70, 512), (110, 512), (150, 512)]
    gemma3_common = dict(vocab_size=VOCAB, rms_norm_eps=1e-6, initializer_range=0.1, bos_token_id=2, eos_token_id=1,
                         pad_token_id=0, max_position_embeddings=512, tie_word_embeddings=True,
                         sliding_window=GEMMA3_WINDOW, hidden_activation="gelu_pytorch_tanh")
    gemma3_cases = [(12, 512), (40, 512), (90, 512), (150, 512)]
    return {
        # Qwen3: q_norm / k_norm per head, head_dim 32 != hidden / heads (16), GQA 2, untied, no bias.
        "qwen3": (Qwen3Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                              tie_word_embeddings=False, attention_bias=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common),
                  [(12, 512), (40, 512), (90, 512)]),
        # Qwen3 with tied embeddings and attention_bias = true, head_dim 24, MQA.
        "qwen3-tied-bias": (Qwen3Config(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                        head_dim=24, tie_word_embeddings=True, attention_bias=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common),
                            [(12, 512), (60, 512)]),
        # Qwen3 with sliding layers: layer 0 full, layers 1-3 sliding (use_sliding_window, max_window_layers 1;
        # transformers writes layer_types).
        "qwen3-sliding": (Qwen3Config(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      tie_word_embeddings=False, use_sliding_window=True, sliding_window=WINDOW,
                                      max_window_layers=1,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common),
                          long_cases),
        # Mistral: every layer sliding.
        "mistral-sliding": (MistralConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=16, sliding_window=WINDOW, tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common),
                            long_cases),
        # Qwen2: q/k/v bias, tied, sliding from layer 2 on (max_window_layers 2 of 3).
        "qwen2-sliding": (Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                      tie_word_embeddings=True, use_sliding_window=True, sliding_window=WINDOW,
                                      max_window_layers=2,
                                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common),
                          long_cases),
        # Phi-3: fused qkv_proj / gate_up_proj, partial rotary (0.5 of head_dim 16), LongRoPE with
        # original_max_position_embeddings 64 of 256 (attention factor sqrt(1 + ln 4 / ln 64)); cases within 64
        # (short factors) and longer prompts (long factors).
        "phi3-longrope": (Phi3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                     initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                     max_position_embeddings=256, original_max_position_embeddings=64,
                                     tie_word_embeddings=False,
                                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.5,
                                                      "short_factor": [1.0, 1.3, 2.1, 3.7],
                                                      "long_factor": [1.2, 2.5, 6.0, 11.0]}),
                          [(16, 64), (36, 64), (80, 256), (120, 256)]),
        # Gemma 3 text: 5 sliding layers (window 16, RoPE base 10^4) to 1 full (base 10^6), q/k norms, (1 + weight)
        # norms, four per layer, GeGLU (tanh GELU), embeddings times sqrt(64), query_pre_attn_scalar 24 (not
        # head_dim 64), head_dim 64 != hidden / heads (16; 64 so that the CUDA runner takes it too), GQA 2, tied; no
        # soft-capping.
        "gemma3": (Gemma3TextConfig(**gemma3_common, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                    query_pre_attn_scalar=24,
                                    layer_types=["sliding_attention"] * 5 + ["full_attention"],
                                    rope_parameters={
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}),
                   gemma3_cases),
        # Gemma 3 with final logit soft-capping (a cap small enough to bend the logits of these weights; no
        # attn_logit_softcapping, which the engine refuses), hidden 48 (sqrt(48) is not exact), MQA, head_dim 64,
        # linear RoPE scaling (factor 4) on the full layers as Gemma 3 4B-27B have, 7 layers: sliding, sliding, full,
        # sliding x 3, full.
        "gemma3-softcap": (Gemma3TextConfig(**gemma3_common, hidden_size=48, intermediate_size=96,
                                            num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=1,
                                            head_dim=64, query_pre_attn_scalar=20,
                                            attn_logit_softcapping=None, final_logit_softcapping=2.5,
                                            layer_types=["sliding_attention"] * 2 + ["full_attention"] +
                                            ["sliding_attention"] * 3 + ["full_attention"],
                                            rope_parameters={
                                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                   "rope_theta": 1000000.0}}),
                           gemma3_cases),
        # Mixtral: 8 experts, top-2 (softmax over all, renormalised over the chosen two), expert intermediate 64, GQA 2.
        "mixtral": (MixtralConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                  **dict(common, intermediate_size=64)),
                    [(12, 512), (40, 512), (90, 512)]),
        # Qwen3-MoE: 16 experts, top-4, norm_topk_prob, moe_intermediate 32, q/k norms, head_dim 32 != 64 / 4, every
        # layer sparse (decoder_sparse_step 1, mlp_only_layers []).
        "qwen3-moe": (Qwen3MoeConfig(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                     num_experts=16, num_experts_per_tok=4, norm_topk_prob=True,
                                     moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[],
                                     tie_word_embeddings=False, attention_bias=False,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common),
                      [(12, 512), (40, 512), (90, 512)]),
        # Qwen3-MoE without norm_topk_prob (the chosen softmax weights are not renormalised), top-2 of 8, untied.
        "qwen3-moe-unnormalised": (Qwen3MoeConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                  head_dim=16, num_experts=8, num_experts_per_tok=2,
                                                  norm_topk_prob=False, moe_intermediate_size=48,
                                                  decoder_sparse_step=1, mlp_only_layers=[],
                                                  tie_word_embeddings=False,
                                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                                  **common),
                                   [(12, 512), (60, 512)]),
    }


# The seeds of the models added after session 6; the earlier ones keep their position in families() as their seed, so
# that models others add beside these in the same session shift no one's weights.
OWN_SEEDS = {"mixtral": 1000, "qwen3-moe": 1001, "qwen3-moe-unnormalised": 1002}


def is_moe(cfg):
    return cfg.model_type in ("mixtral", "qwen3_moe")


def randomise(model, seed, norm_centre):
    """Norm weights norm_centre + noise, biases noise (HF initialises them to ones, or zeros, and zeros)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(norm_centre + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def feed_forward_tensors(model_dir):
    """Layer 0's feed-forward tensors in model_dir/model.safetensors, name and shape (of the experts only expert 0)."""
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    names = [k for k in header if k.startswith("model.layers.0.") and ("mlp" in k or "moe" in k)]
    first_expert = [k for k in names if ".experts." not in k or ".experts.0." in k or k.endswith("_proj")]
    return [f"{k} {header[k]['shape']}" for k in sorted(first_expert)]


def rounded(logits):
    return [round(float(x), 5) for x in logits]


def greedy(model, prompt, steps):
    """HF's greedy continuation of one prompt (batch 1, KV cache), its margins and the two logits rows."""
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
        prompt_logits = logits.clone()
        tokens, margins = [], []
        for step in range(steps):
            top = torch.topk(logits, 2)
            nxt = int(torch.argmax(logits))  # the first maximum, as the engine's greedy pick
            tokens.append(nxt)
            margins.append(round(float(top.values[0] - top.values[1]), 6))
            last_logits = logits.clone()
            if step + 1 < steps:
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1]
    return tokens, margins, prompt_logits, last_logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="folder to write one sub-folder per model into")
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--families", default="",
                    help="comma-separated families: a model name's part before its first '-', or a model_type "
                         "(e.g. gemma3,mixtral,qwen3_moe; default: all)")
    args = ap.parse_args()
    torch.set_num_threads(4)
    torch.use_deterministic_algorithms(True)
    only = set(filter(None, args.only.split(",")))
    chosen_families = set(filter(None, args.families.split(",")))
    all_models = families()
    known = {name.split("-")[0] for name in all_models} | {cfg.model_type for cfg, _ in all_models.values()}
    unknown = chosen_families - known
    if unknown or only - set(all_models):
        print(f"unknown families or models: {sorted(unknown | (only - set(all_models)))}", file=sys.stderr)
        return 2
    for position, (name, (cfg, cases)) in enumerate(all_models.items()):
        seed = OWN_SEEDS.get(name, position)
        if only and name not in only:
            continue
        if chosen_families and name.split("-")[0] not in chosen_families and cfg.model_type not in chosen_families:
            continue
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(torch.float32).eval()
        randomise(model, seed, norm_centre=0.0 if cfg.model_type == "gemma3_text" else 1.0)
        model_dir = os.path.join(args.out, name)
        model.save_pretrained(model_dir, safe_serialization=True)
        # Reload as the engine will: from the files, float32.
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        gen = torch.Generator().manual_seed(100 + seed)
        refs = {"model": name, "model_type": cfg.model_type, "steps": STEPS, "cases": []}
        for length, max_model_len in cases:
            steps = min(STEPS, max_model_len - length)
            prompt = torch.randint(3, VOCAB, (length,), generator=gen).tolist()
            tokens, margins, prompt_logits, last_logits = greedy(model, prompt, steps)
            refs["cases"].append({"prompt": prompt, "max_model_len": max_model_len, "tokens": tokens,
                                  "margins": margins, "prompt_logits": rounded(prompt_logits),
                                  "last_logits": rounded(last_logits)})
        dirs = [model_dir]
        if is_moe(cfg):
            # The fused layout of the same weights; its reload must give the same logits as the per-expert one.
            fused_dir = model_dir + "-fused"
            model.save_pretrained(fused_dir, safe_serialization=True, save_original_format=False)
            fused = AutoModelForCausalLM.from_pretrained(fused_dir, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
            with torch.no_grad():
                probe = torch.tensor([refs["cases"][0]["prompt"]])
                if not torch.allclose(model(probe).logits, fused(probe).logits, rtol=0, atol=1e-6):
                    print(f"{name}: the fused checkpoint reloads to other logits", file=sys.stderr)
                    return 1
            dirs.append(fused_dir)
        for d in dirs:
            with open(os.path.join(d, "refs.json"), "w") as f:
                json.dump(dict(refs, model=os.path.basename(d)), f, separators=(",", ":"))
            size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
            print(f"{os.path.basename(d)}: {len(cases)} cases, {size / 1e6:.2f} MB in {d}")
            if is_moe(cfg):
                print("  layer 0 feed-forward tensors: " + ", ".join(feed_forward_tensors(d)))
            if size > 2e6:
                print(f"{os.path.basename(d)} is over 2 MB", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
