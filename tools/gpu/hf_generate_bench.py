#!/usr/bin/env python3
"""Hugging Face transformers `generate` throughput on the H200: the baseline beside `paged bench`.

Builds the model of MODEL_DIR/config.json with random bf16 weights directly on the GPU (no checkpoint), then runs
greedy generate over --num-prompts random prompts of --input-len tokens in batches of --batch, each producing exactly
--output-len tokens (min_new_tokens = max_new_tokens, as paged bench ignores EOS). Prints one JSON line.

usage: hf_generate_bench.py MODEL_DIR [--num-prompts 512] [--batch 256] [--input-len 512] [--output-len 128]
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--num-prompts", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.model_dir)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config)
    model.eval()
    vocab = config.vocab_size
    prompts = torch.randint(100, vocab, (args.num_prompts, args.input_len), device="cuda")
    # Warm-up (kernels, allocator) outside the timed region.
    with torch.no_grad():
        model.generate(prompts[:2], attention_mask=torch.ones_like(prompts[:2]), max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    start = time.time()
    produced = 0
    with torch.no_grad():
        for i in range(0, args.num_prompts, args.batch):
            batch = prompts[i:i + args.batch]
            out = model.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=args.output_len,
                                 min_new_tokens=args.output_len, do_sample=False, pad_token_id=0)
            produced += (out.shape[1] - batch.shape[1]) * batch.shape[0]
    torch.cuda.synchronize()
    seconds = time.time() - start
    print(json.dumps({"engine": "hf-transformers", "num_prompts": args.num_prompts, "batch": args.batch,
                      "output_tokens": produced, "seconds": seconds, "output_tok_per_s": produced / seconds,
                      "requests_per_s": args.num_prompts / seconds}))


if __name__ == "__main__":
    main()
