#!/usr/bin/env bash
# Tensor parallelism over NCCL on a machine with several H200s, from binaries built elsewhere (it builds nothing).
# Stages:
#   parity      TP=2 (and 4, 8 when there are that many GPUs) against TP=1 through the whole engine, on two
#               random-weight models saved by transformers (a Llama with GQA and an untied head; a Qwen2 with q/k/v
#               bias and a tied head; Qwen3, Phi-3, Mixtral and Qwen3-MoE; 16 heads, 8 KV heads, so that every TP up
#               to 8 divides them): greedy tokens
#               and the log-probability of every chosen token (`paged generate --json --logprobs 1`). Passes when
#               the chosen-token log-probabilities agree within 4x the bf16 noise of the model (HF bf16 against HF
#               float32 on the same prompts) and at least 90% of prompts decode identically, or every divergence
#               is such a near-tie (as tools/gpu/hf_parity.py judges HF against the engine).
#   throughput  `paged bench --load-format dummy` output tok/s for the Llama-3-8B shape at TP=1 and TP=2, one run.
#   big         the Llama-3-70B shape (80 layers, hidden 8192, 64 heads, 8 KV heads, intermediate 28672, vocab
#               128256, random bf16 weights) served by `paged bench` at the largest TP available (8, 4 or 2).
# NCCL_NVLS_ENABLE=0 throughout (the engine sets it too). Prints one table last.
#
# usage: tools/gpu/run_tp.sh [BIN_DIR]
#   BIN_DIR      folder with paged, the shared libraries the H200 machine lacks (libcaf_core, libcaf_io,
#                libboost_json) and a Llama 3 tokenizer (tokenizer.json, tokenizer_config.json); default
#                build/ship (tools/gpu/ship.sh makes it)
#   STAGES       which stages to run (default: all): parity throughput big
#   LOG_DIR      where the logs and the generated models go (default /tmp/paged_tp_logs)
#   NUM_PROMPTS  requests per bench run (default 1000); MAX_NUM_SEQS (512), MAX_BATCHED (8192) as for run_gpu_checks
#   GPUS         how many GPUs to use (default: all visible); PARITY_STEPS greedy steps per prompt (default 32)
set -uo pipefail
BIN=$(cd "${1:-build/ship}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
STAGES=${STAGES:-"parity throughput big"}
LOG_DIR=${LOG_DIR:-/tmp/paged_tp_logs}
NUM_PROMPTS=${NUM_PROMPTS:-1000}
mkdir -p "$LOG_DIR"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # NCCL's own account of a failure lands in the logs

source "$(dirname "$0")/stages.sh"

# GPUs this process may use (CUDA_VISIBLE_DEVICES respected; GPUS=N overrides), and the TP sizes they allow.
GPUS=${GPUS:-$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null ||
               nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
TPS=()
for tp in 2 4 8; do ((tp <= GPUS)) && TPS+=("$tp"); done
LARGEST=""
((${#TPS[@]} > 0)) && LARGEST=${TPS[-1]}
echo "GPUs: $GPUS; TP sizes: ${TPS[*]:-none}"
nvidia-smi topo -m >"$LOG_DIR/topology.log" 2>&1

# model_dir DIR JSON: a config-only model folder (random weights come from --load-format dummy) with the tokenizer.
model_dir() {
  mkdir -p "$1"
  cp "$BIN/tokenizer.json" "$BIN/tokenizer_config.json" "$1/"
  echo "$2" >"$1/config.json"
}

if wanted parity; then
  if ((${#TPS[@]} == 0)); then
    add_row "TP parity against TP=1" "SKIP" "$GPUS GPU(s)"
  else
    WORK=$LOG_DIR/parity
    mkdir -p "$WORK"
    cat >"$WORK/tp_parity.py" <<'PY'
"""TP=N against TP=1 through `paged generate`, with HF's bf16-vs-float32 gap as the noise scale (see run_tp.sh)."""
import json
import os
import subprocess
import sys

import numpy as np
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, MixtralConfig, Phi3Config, Qwen2Config, Qwen3Config,
                          Qwen3MoeConfig)

here, binary_dir, work, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tps = [int(t) for t in sys.argv[5].split()]
sys.path.insert(0, here)
from hf_parity import legacy_rope_keys  # noqa: E402

VOCAB = 128256  # the ids of the Llama 3 tokenizer
common = dict(vocab_size=VOCAB, rms_norm_eps=1e-5, initializer_range=0.05, bos_token_id=128000,
              eos_token_id=128001, max_position_embeddings=4096, hidden_size=1024, intermediate_size=2816,
              num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8)
configs = {
    "llama-gqa2-untied": LlamaConfig(head_dim=64, rope_theta=500000.0, tie_word_embeddings=False, **common),
    "qwen2-bias-tied": Qwen2Config(rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
                                   **common),
    # q_norm / k_norm replicated on every rank; sliding layers 2 and 3 (window 32 < the prompts + max_tokens).
    "qwen3-qknorm-sliding": Qwen3Config(head_dim=128, tie_word_embeddings=False, use_sliding_window=True,
                                        sliding_window=32, max_window_layers=2,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common),
    # qkv_proj and gate_up_proj fused in the checkpoint: each rank's rows are ranges of the one tensor.
    "phi3-fused": Phi3Config(tie_word_embeddings=False, pad_token_id=0, **common),
    # Mixtures of experts: the router replicated, every expert's intermediate size split across the ranks.
    "mixtral-8x2": MixtralConfig(num_local_experts=8, num_experts_per_tok=2, sliding_window=None,
                                 tie_word_embeddings=False, **common),
    "qwen3moe-16x4": Qwen3MoeConfig(head_dim=128, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256,
                                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                    tie_word_embeddings=False, **common),
}
words = ("the of and to in is was for on that with as by at from his her an it were which are this be had "
         "river mountain engine paged kernel block cache token model prompt stream memory").split()
rng = np.random.default_rng(7)
prompts = [" ".join(rng.choice(words, size=int(rng.integers(4, 60)))) for _ in range(16)]


def engine(model_dir, tp):
    """Greedy tokens and chosen-token log-probabilities per prompt, and the prompts' ids."""
    prompt_file = os.path.join(work, "prompts.jsonl")
    with open(prompt_file, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    cmd = [os.path.join(binary_dir, "paged"), "generate", "--model", model_dir, "--device", "cuda",
           "--tensor-parallel-size", str(tp), "--prompts-file", prompt_file, "--json", "--temperature", "0",
           "--ignore-eos", "--max-tokens", str(steps), "--logprobs", "1", "--max-model-len", "1024",
           "--max-num-seqs", "64"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"TP={tp}: paged generate failed ({run.returncode}): {run.stderr.strip()[-2000:]}")
    out = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{\"prompt\"")]
    return ([o["outputs"][0]["token_ids"] for o in out], [o["outputs"][0]["logprobs"] for o in out],
            [o["prompt_token_ids"] for o in out])


def hf_noise(model_dir, prompt_ids):
    """Largest gap, over the prompts, between HF bf16's and HF float32's log-probability of bf16's greedy token."""
    gaps = []
    models = {dt: AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt).cuda().eval()
              for dt in (torch.bfloat16, torch.float32)}
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids], device="cuda")
            lp = {dt: torch.log_softmax(m(x).logits[0, -1].float(), -1) for dt, m in models.items()}
            tok = int(torch.argmax(lp[torch.bfloat16]))
            gaps.append(abs(float(lp[torch.bfloat16][tok] - lp[torch.float32][tok])))
    del models
    torch.cuda.empty_cache()
    return max(gaps)


rows, ok_all = [], True
for name, cfg in configs.items():
    torch.manual_seed(0)
    model_dir = os.path.join(work, name)
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
    legacy_rope_keys(model_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        subprocess.run(["cp", os.path.join(binary_dir, f), model_dir], check=True)
    try:
        base_tokens, base_lps, prompt_ids = engine(model_dir, 1)
    except RuntimeError as e:
        rows.append((name, "1", "engine failed", "", "", str(e).splitlines()[-1][:200]))
        ok_all = False
        continue
    noise = hf_noise(model_dir, prompt_ids)
    tol = 4 * noise
    for tp in tps:
        try:
            tokens, lps, _ = engine(model_dir, tp)
        except RuntimeError as e:
            rows.append((name, str(tp), "engine failed", "", "", str(e).splitlines()[-1][:200]))
            ok_all = False
            continue
        n = len(prompts)
        full, worst, notes, all_ties = 0, 0.0, [], True
        for i in range(n):
            k = next((j for j in range(steps) if tokens[i][j] != base_tokens[i][j]), steps)
            if k > 0:
                worst = max(worst, max(abs(lps[i][j] - base_lps[i][j]) for j in range(k)))
            if k == steps:
                full += 1
                continue
            # Where the tokens part, the two chosen tokens' log-probabilities (of nearly the same distribution)
            # differ by about their logit gap: a near-tie when that is within the tolerance.
            gap = abs(lps[i][k] - base_lps[i][k])
            tie = gap <= tol
            all_ties = all_ties and tie
            notes.append(f"p{i}@{k}: gap {gap:.4f}{'' if tie else ' NOT A TIE'}")
        ok = worst <= tol and (full >= 0.9 * n or all_ties)
        ok_all = ok_all and ok
        rows.append((name, str(tp), f"{full}/{n}", f"{worst:.4f} (tol {tol:.4f} = 4 x HF bf16 noise)",
                     "PASS" if ok else "FAIL", "; ".join(notes)))

print(f"\nTP parity against TP=1 (greedy, {steps} steps, {len(prompts)} prompts)")
print("| config | TP | prompts decoding as TP=1 | max abs logprob diff before any divergence | result | divergences |")
print("|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
print("RESULT tp_parity", "PASS" if ok_all else "FAIL")
sys.exit(0 if ok_all else 1)
PY
    run parity 2400 python3 "$WORK/tp_parity.py" "$HERE" "$BIN" "$WORK" "${PARITY_STEPS:-32}" "${TPS[*]}"
    s=$?
    add_row "TP ${TPS[*]} parity against TP=1 (2 configs)" "$(status_word $s)" "see the parity table above"
    sed -n '/^TP parity/,$p' "$LOG_DIR/parity.log"
  fi
fi

LLAMA3_8B='{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
 "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
 "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": 128001,
 "torch_dtype": "bfloat16"}'
LLAMA3_70B='{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
 "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
 "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
 "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": 128001,
 "torch_dtype": "bfloat16"}'
# bench NAME MODEL_DIR TP: one `paged bench` run (random dataset, 512 in / 128 out) with random bf16 weights.
bench() {
  run "$1" 600 "$BIN/paged" bench --model "$2" --device cuda --load-format dummy --tensor-parallel-size "$3" \
    --num-prompts "$NUM_PROMPTS" --dataset-name random --random-input-len 512 --random-output-len 128 --json \
    --max-num-seqs "${MAX_NUM_SEQS:-512}" --max-num-batched-tokens "${MAX_BATCHED:-8192}"
}

if wanted throughput; then
  M=$LOG_DIR/llama3_8b_shape
  model_dir "$M" "$LLAMA3_8B"
  declare -A tok
  for tp in 1 2; do
    if ((tp > GPUS)); then
      add_row "paged bench, Llama-3-8B shape, TP=$tp" "SKIP" "$GPUS GPU(s)"
      continue
    fi
    bench "bench_8b_tp$tp" "$M" "$tp"
    s=$?
    line=$(bench_json "bench_8b_tp$tp")
    tok[$tp]=$(tok_per_s "$line")
    add_row "paged bench, Llama-3-8B shape, TP=$tp, $NUM_PROMPTS x (512 in / 128 out)" "$(status_word $s)" \
      "${tok[$tp]:-?} output tok/s; $line"
  done
  if [[ -n "${tok[1]:-}" && -n "${tok[2]:-}" ]]; then
    add_row "Llama-3-8B shape, TP=2 over TP=1" "DONE" \
      "$(awk -v a="${tok[2]}" -v b="${tok[1]}" 'BEGIN { printf "%.2fx output tok/s", a / b }')"
  fi
fi

if wanted big; then
  if [[ -z "$LARGEST" ]]; then
    add_row "paged bench, 70B shape" "SKIP" "$GPUS GPU(s): 70B in bf16 needs at least 2 H200s"
  else
    M=$LOG_DIR/llama3_70b_shape
    model_dir "$M" "$LLAMA3_70B"
    bench "bench_70b_tp$LARGEST" "$M" "$LARGEST"
    s=$?
    line=$(bench_json "bench_70b_tp$LARGEST")
    add_row "paged bench, 70B shape (80 layers, hidden 8192), TP=$LARGEST, $NUM_PROMPTS x (512 in / 128 out)" \
      "$(status_word $s)" "$(tok_per_s "$line") output tok/s; $line"
  fi
fi

echo
echo "| check | result | figures |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
