#!/usr/bin/env python3
"""Hugging Face transformers `generate` throughput on the H200: the baseline beside `paged bench`.

Builds the model of MODEL_DIR/config.json with random bf16 weights directly on the GPU (no checkpoint), then runs
greedy generate in static batches of --batch requests, in order. Two workloads:
  - fixed: --num-prompts random prompts of --input-len tokens, each producing exactly --output-len tokens;
  - --requests FILE: the (prompt length, output length) pairs `paged bench --requests-out FILE` wrote, so both
    engines serve the same length mix. HF's generate has one length budget per batch: prompts are left-padded to
    the batch's longest and every row generates the batch's longest output (min_new_tokens = max_new_tokens, as
    paged bench ignores EOS). Only the tokens each request asked for count as output; the rest is the padding waste
    of static batching, reported beside it. This is the HF baseline of the vLLM paper and launch blog.
--num-prompts limits how many requests run (the first ones of the file). Prints one JSON line.

usage: hf_generate_bench.py MODEL_DIR [--num-prompts 512] [--batch 256] [--input-len 512] [--output-len 128]
                            [--requests FILE]
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
    ap.add_argument("--requests", help="JSON from `paged bench --requests-out`: {'requests': [[in, out], ...]}")
    args = ap.parse_args()
    if args.requests:
        with open(args.requests) as f:
            lengths = [tuple(r) for r in json.load(f)["requests"]][:args.num_prompts]
    else:
        lengths = [(args.input_len, args.output_len)] * args.num_prompts
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.model_dir)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config)
    model.eval()
    vocab = config.vocab_size
    pad = 0
    # Warm-up (kernels, allocator) outside the timed region.
    warm = torch.randint(100, vocab, (2, 16), device="cuda")
    with torch.no_grad():
        model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=4, min_new_tokens=4,
                       do_sample=False, pad_token_id=pad)
    torch.cuda.synchronize()
    start = time.time()
    useful = generated = 0
    with torch.no_grad():
        for i in range(0, len(lengths), args.batch):
            batch = lengths[i:i + args.batch]
            longest_in = max(n for n, _ in batch)
            longest_out = max(m for _, m in batch)
            ids = torch.full((len(batch), longest_in), pad, dtype=torch.long, device="cuda")
            mask = torch.zeros_like(ids)
            for row, (n, _) in enumerate(batch):  # left padding, as decoder-only generate expects
                ids[row, longest_in - n:] = torch.randint(100, vocab, (n,), device="cuda")
                mask[row, longest_in - n:] = 1
            out = model.generate(ids, attention_mask=mask, max_new_tokens=longest_out, min_new_tokens=longest_out,
                                 do_sample=False, pad_token_id=pad)
            generated += (out.shape[1] - longest_in) * len(batch)
            useful += sum(m for _, m in batch)
    torch.cuda.synchronize()
    seconds = time.time() - start
    print(json.dumps({"engine": "hf-transformers", "workload": args.requests or "fixed", "num_prompts": len(lengths),
                      "batch": args.batch, "output_tokens": useful, "generated_tokens": generated,
                      "seconds": seconds, "output_tok_per_s": useful / seconds,
                      "requests_per_s": len(lengths) / seconds}))


if __name__ == "__main__":
    main()
