#!/usr/bin/env bash
# The `paged generate` command line against bad input (issue 2, acceptance 5) and its output contract:
#   bash tests/integration/cli_errors.sh PATH/TO/paged
# Every bad input must end with a clear message on stderr and exit 1 (runtime error) or 2 (usage), never a signal.
# The positive half checks the --json lines, the golden greedy outputs (batch and one at a time) and --stats.
# JSON is checked with node (installed by tools/setup.sh).
set -u

PAGED=${1:?usage: cli_errors.sh PATH/TO/paged}
SRC=${PAGED_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
MODEL=$SRC/models/stories260K
GOLDEN=$SRC/tests/golden/stories260K-greedy.json
command -v node >/dev/null || { echo "cli_errors: node is required (tools/setup.sh installs it)" >&2; exit 1; }
[ -x "$PAGED" ] || { echo "cli_errors: $PAGED is not an executable" >&2; exit 1; }
[ -f "$MODEL/model.safetensors" ] || { echo "cli_errors: no model at $MODEL" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/paged_cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
failures=0
checks=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run ARGS...: runs paged generate with a 60 s guard; sets $rc, leaves stdout in $TMP/out and stderr in $TMP/err.
run() {
  timeout -s KILL 60 "$PAGED" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
  rc=$?
}

# expect_fail NAME RC REGEX ARGS...: exit status RC, stderr matching REGEX (extended, case-insensitive), no output.
expect_fail() {
  local name=$1 want=$2 pattern=$3
  shift 3
  checks=$((checks + 1))
  run "$@"
  if ((rc >= 128)); then
    fail "$name: killed by signal $((rc - 128)) (exit $rc); stderr: $(head -c 600 "$TMP/err")"
    return
  fi
  [ "$rc" = "$want" ] || fail "$name: exit $rc, expected $want; stderr: $(head -c 600 "$TMP/err")"
  grep -qiE -- "$pattern" "$TMP/err" || fail "$name: stderr does not match /$pattern/: $(head -c 600 "$TMP/err")"
  grep -q '^paged: ' "$TMP/err" || fail "$name: stderr does not start with 'paged: '"
  if [ "$want" = 2 ]; then grep -q '^usage:' "$TMP/err" || fail "$name: usage error without the usage text"; fi
  [ ! -s "$TMP/out" ] || fail "$name: wrote to stdout: $(head -c 300 "$TMP/out")"
  [ -z "$(find "$TMP" -maxdepth 2 -name 'core*' -print -quit)" ] || fail "$name: left a core file"
  echo "ok   $name (exit $rc): $(head -n 1 "$TMP/err" | cut -c1-160)"
}

# A copy of the model folder to break: mkmodel NAME -> prints its path.
mkmodel() {
  local d=$TMP/models/$1
  mkdir -p "$d"
  cp "$MODEL"/{config.json,model.safetensors,tokenizer.model,tokenizer_config.json,generation_config.json} "$d"/
  chmod u+w "$d"/*
  echo "$d"
}

# edit_json FILE JS: runs JS with `j` bound to the parsed file, then writes `j` back.
edit_json() {
  node -e '
    const fs = require("fs");
    const f = process.argv[1];
    const j = JSON.parse(fs.readFileSync(f, "utf8"));
    new Function("j", process.argv[2])(j);
    fs.writeFileSync(f, JSON.stringify(j, null, 2));
  ' "$1" "$2"
}

# edit_st FILE JS: rewrites a safetensors header; JS sees `h` (the header object) and `n` (data bytes).
edit_st() {
  node -e '
    const fs = require("fs");
    const f = process.argv[1];
    const buf = fs.readFileSync(f);
    const len = Number(buf.readBigUInt64LE(0));
    const h = JSON.parse(buf.subarray(8, 8 + len).toString("utf8"));
    const data = buf.subarray(8 + len);
    new Function("h", "n", process.argv[2])(h, data.length);
    let s = JSON.stringify(h);
    while (Buffer.byteLength(s) % 8) s += " ";
    const head = Buffer.alloc(8);
    head.writeBigUInt64LE(BigInt(Buffer.byteLength(s)));
    fs.writeFileSync(f, Buffer.concat([head, Buffer.from(s, "utf8"), data]));
  ' "$1" "$2"
}

GEN=(generate --max-tokens 8 --temperature 0)

# bad_model NAME DESCRIPTION REGEX: `generate` on the broken copy $TMP/models/NAME fails with exit 1 and REGEX.
bad_model() { expect_fail "$2" 1 "$3" "${GEN[@]}" --model "$TMP/models/$1" --prompt "Once upon a time"; }
# bad_config NAME JS DESCRIPTION REGEX: a copy whose config.json JS edits (see edit_json) fails so.
bad_config() { edit_json "$(mkmodel "$1")/config.json" "$2"; bad_model "$1" "$3" "$4"; }
# bad_header NAME JS DESCRIPTION REGEX: a copy whose safetensors header JS edits (see edit_st) fails so.
bad_header() { edit_st "$(mkmodel "$1")/model.safetensors" "$2"; bad_model "$1" "$3" "$4"; }

echo "== bad model folders"

# Truncated safetensors: the data cut short, and a header length beyond the end of the file.
m=$(mkmodel cut)
head -c $(($(stat -c %s "$MODEL/model.safetensors") - 1000)) "$MODEL/model.safetensors" >"$m/model.safetensors"
bad_model cut "truncated safetensors (data cut short)" "model\.safetensors.*tensor '.*out of range"
m=$(mkmodel header_len)
node -e 'const fs = require("fs"); const b = fs.readFileSync(process.argv[1]);
  b.writeBigUInt64LE(BigInt(b.length + 100), 0); fs.writeFileSync(process.argv[1], b);' "$m/model.safetensors"
bad_model header_len "truncated safetensors (header length beyond the file)" "model\.safetensors.*truncated.*header length"
m=$(mkmodel tiny)
head -c 5 "$MODEL/model.safetensors" >"$m/model.safetensors"
bad_model tiny "truncated safetensors (5 bytes)" "truncated"
m=$(mkmodel empty_weights)
: >"$m/model.safetensors"
bad_model empty_weights "empty safetensors" "truncated"

# Out-of-range data_offsets.
bad_header offsets 'const t = h["model.layers.3.self_attn.k_proj.weight"];
  const size = t.data_offsets[1] - t.data_offsets[0]; t.data_offsets = [n - size + 64, n + 64];' "out-of-range data_offsets" \
  "model\.layers\.3\.self_attn\.k_proj\.weight.*out of range"
bad_header offsets_reversed 'const t = h["model.norm.weight"]; t.data_offsets.reverse();' "reversed data_offsets" \
  "model\.norm\.weight.*data_offsets"
m=$(mkmodel malformed_header)
node -e 'const fs = require("fs"); const b = fs.readFileSync(process.argv[1]);
  b.fill(0x23, 8, 40); fs.writeFileSync(process.argv[1], b);' "$m/model.safetensors"
bad_model malformed_header "malformed safetensors header" "malformed JSON header"
bad_header dtype 'h["model.layers.0.mlp.up_proj.weight"].dtype = "F64";' "unsupported dtype" \
  "model\.layers\.0\.mlp\.up_proj\.weight.*unsupported dtype F64"
bad_header f8_e5m2 'const t = h["model.layers.0.mlp.up_proj.weight"]; t.dtype = "F8_E5M2";
  t.data_offsets[1] = t.data_offsets[0] + (t.data_offsets[1] - t.data_offsets[0]) / 4;' "FP8 e5m2 tensor" \
  "model\.layers\.0\.mlp\.up_proj\.weight.*dtype F8_E5M2 is not supported"
# Pre-quantised FP8 checkpoints: a quantization_config this runtime does not read, an FP8 tensor without one.
bad_config quant_gptq 'j.quantization_config = {quant_method: "gptq", bits: 4};' "quantization_config gptq" \
  "unsupported quantization_config\.quant_method = \"gptq\""
bad_config quant_int 'j.quantization_config = {quant_method: "compressed-tensors", format: "float-quantized",
  config_groups: {group_0: {targets: ["Linear"], weights: {num_bits: 8, type: "int", strategy: "channel"}}}};' \
  "compressed-tensors int8" "quantization_config\.config_groups\.group_0\.weights\.type = \"int\""
bad_header f8_no_config 'const t = h["model.layers.0.mlp.up_proj.weight"]; t.dtype = "F8_E4M3";
  t.data_offsets[1] = t.data_offsets[0] + (t.data_offsets[1] - t.data_offsets[0]) / 4;' "FP8 tensor, no config" \
  "model\.layers\.0\.mlp\.up_proj\.weight' is F8_E4M3 but config\.json has no quantization_config"

# Shapes that disagree with the config: an edited config, and a tensor with a wrong (transposed) shape.
bad_config hidden 'j.hidden_size = 128;' "shape mismatch (config hidden_size)" \
  "model\.embed_tokens\.weight.*\[512, 64\].*\[512, 128\]"
bad_config layers 'j.num_hidden_layers = 7;' "shape mismatch (more layers than the checkpoint)" "model\.layers\.5\."
bad_header transposed 'h["model.layers.2.mlp.down_proj.weight"].shape.reverse();' "shape mismatch (transposed tensor)" \
  "model\.layers\.2\.mlp\.down_proj\.weight.*\[172, 64\].*\[64, 172\]"
bad_header shape_bytes 'h["model.norm.weight"].shape = [65];' "shape inconsistent with the bytes" \
  "model\.norm\.weight.*does not match"

# Unsupported architecture / model type / config fields.
bad_config arch 'j.architectures = ["GPTNeoXForCausalLM"];' "unsupported architecture" \
  "architectures.*GPTNeoXForCausalLM"
bad_config model_type 'j.model_type = "gpt_neox";' "unsupported model_type" "model_type.*gpt_neox"
bad_config missing_field 'delete j.num_attention_heads;' "missing config field" "missing.*num_attention_heads"
bad_config rope 'j.rope_scaling = {rope_type: "yarn", factor: 4};' "unsupported rope_scaling" "rope_scaling.*yarn"
m=$(mkmodel bad_config)
printf '{"model_type": "llama",' >"$m/config.json"
bad_model bad_config "malformed config.json" "config\.json.*malformed JSON"

# Missing or broken tokenizer.
m=$(mkmodel no_tokenizer)
rm "$m/tokenizer.model"
bad_model no_tokenizer "missing tokenizer" "no tokenizer.*tokenizer\.(json|model)"
m=$(mkmodel bad_tokenizer)
echo "not a sentencepiece model" >"$m/tokenizer.model"
bad_model bad_tokenizer "corrupt tokenizer.model" "tokenizer\.model"
m=$(mkmodel no_weights)
rm "$m/model.safetensors"
bad_model no_weights "missing weights" "no model\.safetensors"
expect_fail "missing model folder" 1 "model directory not found" \
  "${GEN[@]}" --model "$TMP/does-not-exist" --prompt "Once upon a time"

echo "== structured outputs (--guided-*)"
expect_fail "a JSON schema that does not compile" 2 "invalid --guided-json: JSON schema: unknown type 'strin'" \
  "${GEN[@]}" --model "$MODEL" --prompt "Once" --guided-json '{"type": "strin"}'
expect_fail "two structured outputs" 2 "only one of --guided-json" \
  "${GEN[@]}" --model "$MODEL" --prompt "Once" --guided-regex a --guided-choice '["b"]'
expect_fail "a whitespace pattern beside a regex" 2 "--guided-whitespace-pattern applies" \
  "${GEN[@]}" --model "$MODEL" --prompt "Once" --guided-regex a --guided-whitespace-pattern " "
checks=$((checks + 1))
run generate --model "$MODEL" --prompt "Once" --temperature 1 --seed 7 --max-tokens 40 --json \
  --guided-regex '(Tom|Sue) (ran|saw) [a-z]{1,8}\.'
if [ "$rc" != 0 ] || ! node -e 'const o = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    process.exit(/^(Tom|Sue) (ran|saw) [a-z]{1,8}\.$/.test(o.outputs[0].text) ? 0 : 1)' "$TMP/out"; then
  fail "--guided-regex: exit $rc, answer $(head -c 300 "$TMP/out")"
else
  echo "ok   --guided-regex: $(head -c 160 "$TMP/out")"
fi

echo "== bad prompts"
long=$(for _ in $(seq 200); do printf 'Once upon a time, '; done)
expect_fail "prompt longer than the context" 1 "prompt 1:.*maximum context length is 512.*prompt has [0-9]{3,}" \
  "${GEN[@]}" --model "$MODEL" --prompt "$long"
expect_fail "prompt plus max-tokens longer than the context" 1 "prompt 1:.*maximum context length is 512" \
  generate --model "$MODEL" --max-tokens 500 --prompt "Once upon a time, there was a little girl who liked to play"
printf '{"prompt": "Once upon a time"}\n{"prompt": "%s"}\n' "$long" >"$TMP/long.jsonl"
expect_fail "prompt longer than the context (second prompt of a file)" 1 "prompt 2:.*maximum context length" \
  "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/long.jsonl"

expect_fail "invalid UTF-8 in --prompt (stray byte)" 1 "prompt 1:.*UTF-8" \
  "${GEN[@]}" --model "$MODEL" --prompt $'Once upon \xff a time'
expect_fail "invalid UTF-8 in --prompt (truncated sequence)" 1 "prompt 1:.*UTF-8" \
  "${GEN[@]}" --model "$MODEL" --prompt $'Once upon a time \xe2\x82'
expect_fail "invalid UTF-8 in --prompt (surrogate)" 1 "prompt 1:.*UTF-8" \
  "${GEN[@]}" --model "$MODEL" --prompt $'Once \xed\xa0\x80 upon'
expect_fail "invalid UTF-8 in --prompt (overlong)" 1 "prompt 1:.*UTF-8" \
  "${GEN[@]}" --model "$MODEL" --prompt $'Once \xc0\xaf upon'
printf '{"prompt": "Once upon a time"}\n{"prompt": "Once \xff upon"}\n' >"$TMP/utf8.jsonl"
expect_fail "invalid UTF-8 in a prompts file" 1 "utf8\.jsonl:2:.*UTF-8" \
  "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/utf8.jsonl"
printf '{"prompt": "Once \\ud800 upon"}\n' >"$TMP/surrogate.jsonl"
expect_fail "lone surrogate escape in a prompts file" 1 "surrogate\.jsonl:1|UTF-8|surrogate" \
  "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/surrogate.jsonl"

printf '{"prompt": "Once upon a time"}\n{"prompt": "unterminated\n' >"$TMP/bad1.jsonl"
expect_fail "malformed prompts file (not JSON)" 1 "bad1\.jsonl:2:.*JSON" \
  "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/bad1.jsonl"
printf '{"text": "Once upon a time"}\n' >"$TMP/bad2.jsonl"
expect_fail "malformed prompts file (no prompt key)" 1 "bad2\.jsonl:1:.*prompt" \
  "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/bad2.jsonl"
printf '{"prompt": 42}\n' >"$TMP/bad3.jsonl"
expect_fail "malformed prompts file (prompt not a string)" 1 "bad3\.jsonl:1:.*prompt" \
  "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/bad3.jsonl"
printf '["Once upon a time"]\n' >"$TMP/bad4.jsonl"
expect_fail "malformed prompts file (array line)" 1 "bad4\.jsonl:1:.*prompt" \
  "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/bad4.jsonl"
printf '\n\n' >"$TMP/empty.jsonl"
expect_fail "empty prompts file" 1 "no prompts" "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/empty.jsonl"
expect_fail "missing prompts file" 1 "cannot open prompts file" \
  "${GEN[@]}" --model "$MODEL" --prompts-file "$TMP/none.jsonl"

echo "== usage errors"
P=(--model "$MODEL" --prompt "Once upon a time")
expect_fail "unknown flag" 2 "unknown flag --frobnicate" generate "${P[@]}" --frobnicate 3
expect_fail "unknown switch" 2 "unknown flag --verbose" generate "${P[@]}" --verbose=1
expect_fail "unknown command" 2 "unknown command 'frobnicate'" frobnicate "${P[@]}"
expect_fail "a positional argument beside --model" 2 "the model is given twice: as hello" generate "${P[@]}" hello
expect_fail "no command" 2 "missing command"
expect_fail "missing --model" 2 "--model" generate --prompt "Once upon a time"
expect_fail "no prompt" 2 "exactly one of --prompt and --prompts-file" generate --model "$MODEL"
expect_fail "both prompt sources" 2 "exactly one of --prompt and --prompts-file" \
  generate "${P[@]}" --prompts-file "$TMP/bad1.jsonl"
expect_fail "flag without its value" 2 "--max-tokens needs a value" generate "${P[@]}" --max-tokens

echo "== bad flag values"
expect_fail "--max-tokens not a number" 2 "--max-tokens expects an integer, got 'abc'" generate "${P[@]}" --max-tokens abc
expect_fail "--max-tokens with junk" 2 "--max-tokens expects an integer" generate "${P[@]}" --max-tokens 12x
expect_fail "--max-tokens overflow" 2 "--max-tokens expects an integer" generate "${P[@]}" --max-tokens 99999999999
expect_fail "--max-tokens 0" 2 "invalid --max-tokens" generate "${P[@]}" --max-tokens 0
expect_fail "--max-tokens beyond the context" 2 "invalid --max-tokens.*maximum context length is 512" \
  generate "${P[@]}" --max-tokens 100000
expect_fail "--temperature not a number" 2 "--temperature expects a number" generate "${P[@]}" --temperature hot
expect_fail "--temperature negative" 2 "invalid --temperature" generate "${P[@]}" --temperature -1
expect_fail "--temperature nan" 2 "invalid --temperature" generate "${P[@]}" --temperature nan
expect_fail "--top-p 0" 2 "invalid --top-p" generate "${P[@]}" --top-p 0
expect_fail "--top-p above 1" 2 "invalid --top-p" generate "${P[@]}" --top-p 1.5
expect_fail "--top-k below -1" 2 "invalid --top-k" generate "${P[@]}" --top-k -5
expect_fail "--min-p above 1" 2 "invalid --min-p" generate "${P[@]}" --min-p 2
expect_fail "--n 0" 2 "invalid --n" generate "${P[@]}" --n 0
expect_fail "--seed negative" 2 "--seed expects a non-negative integer" generate "${P[@]}" --seed -1
expect_fail "--seed junk" 2 "--seed expects a non-negative integer" generate "${P[@]}" --seed 12abc
expect_fail "--repetition-penalty 0" 2 "invalid --repetition-penalty" generate "${P[@]}" --repetition-penalty 0
expect_fail "--presence-penalty 3" 2 "invalid --presence-penalty" generate "${P[@]}" --presence-penalty 3
expect_fail "--logprobs 50" 2 "invalid --logprobs" generate "${P[@]}" --logprobs 50
expect_fail "--stop-token-ids junk" 2 "--stop-token-ids" generate "${P[@]}" --stop-token-ids 2,x
expect_fail "--stop-token-ids outside the vocabulary" 2 "invalid --stop-token-ids" generate "${P[@]}" --stop-token-ids 9999
expect_fail "--allowed-token-ids outside the vocabulary" 2 "invalid --allowed-token-ids" generate "${P[@]}" --allowed-token-ids 5,9999
expect_fail "--allowed-token-ids empty" 2 "--allowed-token-ids expects" generate "${P[@]}" --allowed-token-ids ""
expect_fail "--bad-words blank" 2 "invalid --bad-words" generate "${P[@]}" --bad-words " "
expect_fail "--min-tokens above --max-tokens" 2 "invalid --min-tokens" generate "${P[@]}" --max-tokens 4 --min-tokens 8
expect_fail "--block-size 0" 2 "--block-size" generate "${P[@]}" --block-size 0
expect_fail "--block-size 1000" 2 "--block-size" generate "${P[@]}" --block-size 1000
expect_fail "--num-kv-blocks 0" 2 "--num-kv-blocks" generate "${P[@]}" --num-kv-blocks 0
expect_fail "--max-num-seqs 0" 2 "--max-num-seqs" generate "${P[@]}" --max-num-seqs 0
expect_fail "--long-prefill-token-threshold negative" 2 "--long-prefill-token-threshold" generate "${P[@]}" \
  --long-prefill-token-threshold -1
expect_fail "--preemption-mode" 2 "--preemption-mode" generate "${P[@]}" --preemption-mode sometimes
expect_fail "--device" 2 "--device" generate "${P[@]}" --device tpu
expect_fail "--swap-space negative" 2 "--swap-space" generate "${P[@]}" --swap-space -4
expect_fail "--kv-offloading-size negative" 2 "--kv-offloading-size" generate "${P[@]}" --kv-offloading-size -1
expect_fail "--kv-disk-size negative" 2 "--kv-disk-size" generate "${P[@]}" --kv-disk-size -1
expect_fail "a worker with a disk tier" 2 "not available with workers" worker "$MODEL" --kv-disk-dir "$TMP/kvdisk"
expect_fail "--kv-disk-dir without the CPU tier" 1 "needs --kv-offloading-size" generate "${P[@]}" \
  --kv-disk-dir "$TMP/kvdisk" --kv-disk-size 1
expect_fail "--quantization int4" 2 "--quantization must be auto, fp8 or none" generate "${P[@]}" --quantization int4
expect_fail "--quantization fp8 on the CPU" 1 "--quantization fp8 needs --device cuda" generate "${P[@]}" \
  --device cpu --quantization fp8
expect_fail "--kv-cache-dtype fp8_e5m2" 2 "--kv-cache-dtype must be auto, fp8 or fp8_e4m3" generate "${P[@]}" \
  --kv-cache-dtype fp8_e5m2
expect_fail "--kv-cache-dtype fp8_e4m3 on the CPU" 1 "--kv-cache-dtype fp8 needs --device cuda" generate "${P[@]}" \
  --device cpu --kv-cache-dtype fp8_e4m3
expect_fail "--max-model-len beyond the model" 1 "max_model_len must be in \[1, 512\]" \
  generate "${P[@]}" --max-model-len 4096

echo "== the output contract"
# The golden prompts as a prompts file, and the expected lines.
node -e '
  const fs = require("fs");
  const g = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
  fs.writeFileSync(process.argv[2], g.cases.map(c => JSON.stringify({prompt: c.prompt})).join("\n") + "\n");
' "$GOLDEN" "$TMP/golden.jsonl"

# The text of each golden case as `generate` prints it: the prompt's continuation (tests/http/golden_text.mjs).
node "$SRC/tests/http/golden_text.mjs" "$GOLDEN" "$MODEL" >"$TMP/continuations.jsonl"

# check_golden FILE: FILE has one --json line per golden case, in order, equal to the golden ids.
check_golden() {
  node -e '
    const fs = require("fs");
    const g = JSON.parse(fs.readFileSync(process.argv[1], "utf8")).cases;
    const texts = fs.readFileSync(process.argv[3], "utf8").trim().split("\n").map((l) => JSON.parse(l).text);
    const lines = fs.readFileSync(process.argv[2], "utf8").split("\n").filter(l => l.length);
    const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);
    let bad = 0;
    const fail = m => { console.error("  " + m); bad++; };
    if (lines.length !== g.length) fail(`${lines.length} lines for ${g.length} prompts`);
    lines.forEach((line, i) => {
      let o;
      try { o = JSON.parse(line); } catch (e) { return fail(`line ${i + 1} is not JSON: ${line.slice(0, 200)}`); }
      const c = g[i];
      if (!c) return;
      const keys = Object.keys(o).sort().join(",");
      if (keys !== "outputs,prompt,prompt_token_ids") fail(`line ${i + 1}: keys ${keys}`);
      if (o.prompt !== c.prompt) fail(`line ${i + 1}: prompt ${JSON.stringify(o.prompt)} (input order broken?)`);
      if (!eq(o.prompt_token_ids, c.prompt_ids)) fail(`line ${i + 1}: prompt_token_ids ${o.prompt_token_ids}`);
      if (!Array.isArray(o.outputs) || o.outputs.length !== 1) return fail(`line ${i + 1}: outputs ${JSON.stringify(o.outputs)}`);
      const out = o.outputs[0];
      const okeys = Object.keys(out).sort().join(",");
      if (okeys !== "finish_reason,text,token_ids") fail(`line ${i + 1}: output keys ${okeys}`);
      if (!eq(out.token_ids, c.greedy_ids)) {
        const k = out.token_ids.findIndex((t, j) => t !== c.greedy_ids[j]);
        fail(`line ${i + 1}: generated ids differ from the golden ids at index ${k}`);
      }
      if (out.text !== texts[i]) fail(`line ${i + 1}: text ${JSON.stringify(out.text)}`);
      if (out.finish_reason !== "length") fail(`line ${i + 1}: finish_reason ${out.finish_reason}`);
    });
    process.exit(bad ? 1 : 0);
  ' "$GOLDEN" "$1" "$TMP/continuations.jsonl"
}

# expect_ok NAME ARGS...: exit 0 and nothing alarming on stderr.
expect_ok() {
  local name=$1
  shift
  checks=$((checks + 1))
  run "$@"
  if [ "$rc" != 0 ]; then
    fail "$name: exit $rc; stderr: $(head -c 600 "$TMP/err")"
    return 1
  fi
  return 0
}

GREEDY=(generate --model "$MODEL" --max-tokens 64 --temperature 0 --json)
if expect_ok "golden batch" "${GREEDY[@]}" --prompts-file "$TMP/golden.jsonl"; then
  cp "$TMP/out" "$TMP/batch.jsonl"
  if check_golden "$TMP/batch.jsonl"; then echo "ok   golden prompts file: five --json lines equal the golden ids"
  else fail "golden prompts file: --json lines differ from $GOLDEN"; fi
fi

# One at a time, with --prompt, and at two other block sizes: the same lines.
: >"$TMP/alone.jsonl"
n=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).cases.length)' "$GOLDEN")
for ((i = 0; i < n; i++)); do
  p=$(node -e 'process.stdout.write(JSON.parse(require("fs").readFileSync(process.argv[1])).cases[+process.argv[2]].prompt)' \
    "$GOLDEN" "$i")
  expect_ok "golden prompt $i alone" "${GREEDY[@]}" --prompt "$p" && cat "$TMP/out" >>"$TMP/alone.jsonl"
done
if check_golden "$TMP/alone.jsonl" && cmp -s "$TMP/alone.jsonl" "$TMP/batch.jsonl"; then
  echo "ok   golden prompts one at a time: identical to the batch"
else
  fail "golden prompts one at a time differ from the batch or the golden file"
fi
for bs in 1 32; do
  if expect_ok "golden batch, block size $bs" "${GREEDY[@]}" --prompts-file "$TMP/golden.jsonl" --block-size "$bs"; then
    cmp -s "$TMP/out" "$TMP/batch.jsonl" && echo "ok   golden batch with --block-size $bs: identical" ||
      fail "golden batch with --block-size $bs differs"
  fi
done

# --stats: the outputs, then one last line {"stats": {...}} with the ten keys of the contract.
if expect_ok "--stats" "${GREEDY[@]}" --prompts-file "$TMP/golden.jsonl" --stats; then
  node -e '
    const fs = require("fs");
    const lines = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(l => l.length);
    const want = ["kv_blocks_free_at_end", "kv_blocks_total", "kv_disk_hit_tokens", "kv_offload_hit_tokens",
                  "kv_offloaded_blocks", "peak_running_seqs", "preemptions", "prefix_cache_hit_tokens",
                  "prompt_tokens_computed", "swapped_out_blocks"];
    const last = JSON.parse(lines[lines.length - 1]);
    const errs = [];
    if (Object.keys(last).join() !== "stats") errs.push("last line is not {\"stats\": ...}: " + lines[lines.length - 1]);
    const s = last.stats || {};
    if (Object.keys(s).sort().join() !== want.join()) errs.push("keys " + Object.keys(s).sort().join());
    for (const k of want) if (!Number.isInteger(s[k]) || s[k] < 0) errs.push(`${k} = ${s[k]}`);
    if (lines.length !== 6) errs.push(`${lines.length} lines, expected 5 outputs and the stats`);
    const golden = fs.readFileSync(process.argv[2], "utf8").split("\n").filter(l => l.length);
    if (lines.slice(0, -1).join("\n") !== golden.join("\n")) errs.push("the outputs before the stats changed");
    if (s.kv_blocks_total < 1) errs.push("kv_blocks_total < 1");
    if (s.kv_blocks_free_at_end !== s.kv_blocks_total) errs.push("blocks still held at the end: " + JSON.stringify(s));
    if (s.peak_running_seqs < 1 || s.peak_running_seqs > 5) errs.push("peak_running_seqs " + s.peak_running_seqs);
    if (s.prompt_tokens_computed < 1) errs.push("prompt_tokens_computed " + s.prompt_tokens_computed);
    if (errs.length) { console.error("  " + errs.join("\n  ")); process.exit(1); }
    console.log("ok   --stats: " + JSON.stringify(s));
  ' "$TMP/out" "$TMP/batch.jsonl" || fail "--stats line"
fi

# --n 2 with a seed: two outputs per prompt, reproducible; plain text mode starts with the prompt.
if expect_ok "--n 2 --seed" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 16 --temperature 0.8 \
  --seed 7 --n 2 --json; then
  cp "$TMP/out" "$TMP/n2a"
  expect_ok "--n 2 --seed again" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 16 \
    --temperature 0.8 --seed 7 --n 2 --json && { cmp -s "$TMP/out" "$TMP/n2a" || fail "--seed does not reproduce"; }
  node -e '
    const o = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const ok = o.outputs.length === 2 && o.outputs.every(c => c.token_ids.length >= 1 && c.token_ids.length <= 16 &&
      ["stop", "length"].includes(c.finish_reason) && typeof c.text === "string");
    process.exit(ok ? 0 : 1);
  ' "$TMP/n2a" && echo "ok   --n 2 --seed 7: two reproducible outputs" || fail "--n 2 output: $(cat "$TMP/n2a")"
fi
if expect_ok "text mode" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 8 --temperature 0; then
  head -n 1 "$TMP/out" | grep -q '^Once upon a time' && echo "ok   text mode prints the prompt and its completion" ||
    fail "text mode output: $(cat "$TMP/out")"
fi
# EOS ends a sequence with finish_reason "stop" unless --ignore-eos.
if expect_ok "eos" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 400 --temperature 0 --json; then
  node -e '
    const c = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).outputs[0];
    const ok = c.finish_reason === "stop" ? c.token_ids.length < 400 : c.token_ids.length === 400;
    process.exit(ok ? 0 : 1);
  ' "$TMP/out" && echo "ok   finish_reason matches the output length" || fail "finish_reason: $(cat "$TMP/out")"
fi
if expect_ok "--ignore-eos" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 300 --temperature 0 \
  --ignore-eos --json; then
  node -e '
    const c = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).outputs[0];
    process.exit(c.finish_reason === "length" && c.token_ids.length === 300 ? 0 : 1);
  ' "$TMP/out" && echo "ok   --ignore-eos runs to --max-tokens" || fail "--ignore-eos: $(head -c 300 "$TMP/out")"
fi

# --prompt-logprobs: a greedy run's own logprobs (--logprobs 0, the sampler's path) equal the prompt logprobs of its
# prompt followed by its output (the prompt scoring path), where the text tokenises back to the same ids.
PL=(generate --model "$MODEL" --temperature 0 --json)
if expect_ok "--logprobs 0" "${PL[@]}" --prompt "Once upon a time" --max-tokens 24 --logprobs 0; then
  cp "$TMP/out" "$TMP/gen_lp.json"
  text=$(node -e 'const o = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    process.stdout.write(o.prompt + o.outputs[0].text)' "$TMP/gen_lp.json")
  if expect_ok "--prompt-logprobs 0" "${PL[@]}" --prompt "$text" --max-tokens 1 --prompt-logprobs 0; then
    node -e '
      const fs = require("fs");
      const [gen, scored] = [process.argv[1], process.argv[2]].map(f => JSON.parse(fs.readFileSync(f, "utf8")));
      const ids = gen.prompt_token_ids.concat(gen.outputs[0].token_ids);
      const errs = [];
      if (JSON.stringify(scored.prompt_token_ids) !== JSON.stringify(ids)) errs.push("the text tokenised otherwise");
      const lp = scored.prompt_logprobs || [];
      if (lp.length !== ids.length - 1) errs.push(`${lp.length} prompt logprobs for ${ids.length} prompt tokens`);
      const tail = lp.slice(gen.prompt_token_ids.length - 1);
      gen.outputs[0].logprobs.forEach((want, i) => {
        if (!(Math.abs(tail[i] - want) < 1e-3)) errs.push(`token ${i}: prompt logprob ${tail[i]}, sampled ${want}`);
      });
      if (!lp.every(x => x <= 0)) errs.push("a logprob above 0");
      if (errs.length) { console.error("  " + errs.slice(0, 5).join("\n  ")); process.exit(1); }
    ' "$TMP/gen_lp.json" "$TMP/out" && echo "ok   --prompt-logprobs: the prompt scores equal the sampled logprobs" ||
      fail "--prompt-logprobs: $(head -c 300 "$TMP/out")"
  fi
fi
expect_fail "--prompt-logprobs 50" 2 "invalid --prompt-logprobs" generate "${P[@]}" --prompt-logprobs 50

# --no-skip-special-tokens: the text keeps the special tokens' own text (stories260K writes a BOS between stories
# within 400 greedy tokens), which the default drops; otherwise the same tokens and text.
bos=$(node -e 'const c = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  process.stdout.write(typeof c.bos_token === "string" ? c.bos_token : c.bos_token.content)' "$MODEL/tokenizer_config.json")
SPECIAL=(generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 400 --temperature 0 --json)
if expect_ok "skip special tokens (default)" "${SPECIAL[@]}" && cp "$TMP/out" "$TMP/skip.json" &&
  expect_ok "--no-skip-special-tokens" "${SPECIAL[@]}" --no-skip-special-tokens; then
  node -e '
    const fs = require("fs");
    const [skip, keep] = [process.argv[1], process.argv[2]].map(f => JSON.parse(fs.readFileSync(f, "utf8")).outputs[0]);
    const bos = process.argv[3];
    const ok = JSON.stringify(skip.token_ids) === JSON.stringify(keep.token_ids) && keep.text.includes(bos) &&
      !skip.text.includes(bos) && keep.text.split(bos).join("") === skip.text;
    process.exit(ok ? 0 : 1);
  ' "$TMP/skip.json" "$TMP/out" "$bos" && echo "ok   --no-skip-special-tokens keeps $bos in the text, the default drops it" ||
    fail "--no-skip-special-tokens: $(head -c 300 "$TMP/out")"
fi

# vLLM's conventions: --help and --version on every command (stdout, exit 0), the model as the positional argument,
# --no-NAME for every on/off flag, an unknown flag named as unknown even without a value.
for cmd in generate serve bench worker gen-certs; do
  checks=$((checks + 1))
  run "$cmd" --help
  [ "$rc" = 0 ] && grep -q '^usage:' "$TMP/out" && [ ! -s "$TMP/err" ] || fail "$cmd --help: exit $rc, $(head -c 200 "$TMP/err")"
done
checks=$((checks + 1))
run --version
[ "$rc" = 0 ] && grep -qE '^paged [0-9]+\.[0-9]+\.[0-9]+$' "$TMP/out" || fail "--version: exit $rc, $(cat "$TMP/out")"
if expect_ok "positional model" generate "$MODEL" --prompt "Once upon a time" --max-tokens 8 --temperature 0 --json; then
  cp "$TMP/out" "$TMP/positional.json"
  expect_ok "--model" generate --model "$MODEL" --prompt "Once upon a time" --max-tokens 8 --temperature 0 --json &&
    cmp -s "$TMP/out" "$TMP/positional.json" || fail "the positional model and --model differ"
fi
expect_fail "the model twice" 2 "given twice" generate "$MODEL" --model "$MODEL" --prompt hi
expect_fail "two positional arguments" 2 "unexpected argument" generate "$MODEL" "$MODEL" --prompt hi
expect_fail "unknown on/off flag" 2 "unknown flag --frobnicate" generate "$MODEL" --prompt hi --frobnicate
expect_fail "a switch with a bad value" 2 "on or off" generate "$MODEL" --prompt hi --ignore-eos=maybe
if expect_ok "--no-ignore-eos" generate "$MODEL" --prompt "Once upon a time" --max-tokens 8 --temperature 0 --json \
  --no-ignore-eos; then
  cmp -s "$TMP/out" "$TMP/positional.json" || fail "--no-ignore-eos differs from the default"
fi
if expect_ok "--skip-special-tokens=false" "${SPECIAL[@]}" --skip-special-tokens=false; then
  node -e 'process.exit(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).outputs[0].text.includes(
    process.argv[2]) ? 0 : 1)' "$TMP/out" "$bos" || fail "--skip-special-tokens=false drops $bos"
fi

# conf/serve.json's "engine" object: every engine flag, the flag winning over the file; unknown keys and bad values
# refused naming the key, before anything loads.
printf '{"model": "%s", "engine": {"max_num_seqs": 8, "numkv_blocks": 64}}' "$MODEL" >"$TMP/typo.json"
expect_fail "a misspelt engine key" 2 "unknown key .*typo\.json: engine\.numkv_blocks" serve --config "$TMP/typo.json"
printf '{"model": "%s", "engine": {"block_size": "big"}}' "$MODEL" >"$TMP/bad.json"
expect_fail "a bad engine value" 2 "engine\.block_size expects an integer" serve --config "$TMP/bad.json"
# Tool-call parsers: an unknown one, or auto tool choice without one, is a usage error before anything loads.
expect_fail "an unknown tool-call parser" 2 "unknown parser 'granite'" serve "$MODEL" --port 0 --tool-call-parser granite
expect_fail "auto tool choice without a parser" 2 "enable-auto-tool-choice needs --tool-call-parser" \
  serve "$MODEL" --port 0 --enable-auto-tool-choice
# Reasoning parsers: an unknown one is a usage error before anything loads, on the command line or in the file.
expect_fail "an unknown reasoning parser" 2 "unknown parser 'granite'" serve "$MODEL" --port 0 --reasoning-parser granite
printf '{"model": "%s", "server": {"reasoning_parser": "r1"}}' "$MODEL" >"$TMP/reasoning.json"
expect_fail "an unknown reasoning parser in the file" 2 "unknown parser 'r1'" serve --config "$TMP/reasoning.json"
printf '{"engines": {}}' >"$TMP/top.json"
expect_fail "an unknown top-level key" 1 "unknown key engines" serve --config "$TMP/top.json"
printf '{"model": "%s", "server": {"port": 0, "stats_interval_s": 0}, "engine": {"num_kv_blocks": 64}}' "$MODEL" \
  >"$TMP/engine.json"
# serve_blocks ARGS...: the KV blocks a server started with ARGS reports, then stopped.
serve_blocks() {
  : >"$TMP/serve.out"  # emptied first: the child truncates it only once it runs, and the wait below must not read
  # the previous server's lines
  "$PAGED" serve "$@" >"$TMP/serve.out" 2>&1 &
  local pid=$! line=""
  for _ in $(seq 1 600); do  # up to 60 s: a loaded machine starts slowly
    line=$(grep -oE 'KV cache: [0-9]+ blocks' "$TMP/serve.out") && break
    sleep 0.1
  done
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  echo "${line//[^0-9]/}"
}
checks=$((checks + 1))
[ "$(serve_blocks --config "$TMP/engine.json")" = 64 ] || fail "engine.num_kv_blocks 64: $(cat "$TMP/serve.out")"
checks=$((checks + 1))
[ "$(serve_blocks --config "$TMP/engine.json" --num-kv-blocks 48)" = 48 ] ||
  fail "--num-kv-blocks over the file's: $(cat "$TMP/serve.out")"

echo "== bench --dataset-name multiturn"
MT=(bench --model "$MODEL" --device cpu --dataset-name multiturn --num-conversations 6 --num-turns 5
  --system-prompt-len 64 --message-len 32 --output-len 16 --think-time 0.01 --num-kv-blocks 24 --swap-space 0)
expect_fail "multiturn histories longer than the context" 2 "more than the 512 of the model's context" \
  "${MT[@]}" --num-turns 40
expect_fail "multiturn takes no --num-prompts" 2 "unknown flag --num-prompts" "${MT[@]}" --num-prompts 3
expect_fail "multiturn --think-time negative" 2 "--think-time" "${MT[@]}" --think-time -1
# With --kv-offloading-size the same conversations run with the CPU tier and without: the tier's run promotes
# histories and computes fewer prompt tokens.
if expect_ok "multiturn, CPU tier on and off" "${MT[@]}" --kv-offloading-size 0.005 --json; then
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").pop());
    const on = r.cpu_tier, off = r.no_cpu_tier, errs = [];
    for (const [name, x] of [["on", on], ["off", off]]) {
      if (x.requests !== 30 || x.failed !== 0) errs.push(`${name}: ${x.requests} requests, ${x.failed} failed`);
      if (x.output_tokens !== 30 * 16) errs.push(`${name}: ${x.output_tokens} output tokens`);
      if (!(x.ttft_p50_s > 0 && x.ttft_p99_s >= x.ttft_p50_s)) errs.push(`${name}: TTFT ${x.ttft_p50_s} ${x.ttft_p99_s}`);
    }
    if (!(on.cpu_tier_hit_tokens > 0 && off.cpu_tier_hit_tokens === 0)) errs.push("CPU-tier hits " + JSON.stringify(r));
    if (!(on.prompt_tokens_computed < off.prompt_tokens_computed)) errs.push("computed " + JSON.stringify(r));
    if (on.prompt_tokens !== off.prompt_tokens) errs.push("the two runs sent different prompts");
    if (errs.length) { console.error("  " + errs.join("\n  ")); process.exit(1); }
    console.log("ok   multiturn: computed " + on.prompt_tokens_computed + " with the tier, " + off.prompt_tokens_computed + " without");
  ' "$TMP/out" || fail "multiturn JSON"
fi

echo "== bench --lora-path"
# vLLM's benchmark_throughput flags: the adapter (make_lora.mjs writes one for this model) loaded --max-loras times,
# each request of one of them; refused without --enable-lora, and a missing folder is a runtime error.
node "$SRC/tests/http/make_lora.mjs" --model "$MODEL" --adapter "$TMP/lora" --merged "$TMP/lora-merged" --rank 4 \
  >/dev/null || fail "make_lora"
LB=(bench --model "$MODEL" --device cpu --num-prompts 12 --random-input-len 32 --random-output-len 8 --json)
expect_fail "--lora-path without --enable-lora" 2 "--lora-path needs --enable-lora" "${LB[@]}" --lora-path "$TMP/lora"
expect_fail "--lora-path of no folder" 1 "not a folder" "${LB[@]}" --enable-lora --lora-path "$TMP/nothing"
if expect_ok "bench with two adapters" "${LB[@]}" --enable-lora --lora-path "$TMP/lora" --max-loras 2; then
  node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").pop());
    if (r.lora_adapters !== 2 || r.completed !== 12 || r.failed !== 0 || r.output_tokens !== 96) {
      console.error("  " + JSON.stringify(r)); process.exit(1);
    }
    console.log("ok   bench --lora-path: 12 requests over 2 adapters");
  ' "$TMP/out" || fail "bench --lora-path JSON"
fi

echo "== bench --floor-only"
# The H200 floor from config.json alone: a folder without weights or tokenizer will do; FP8 weights and KV cost less.
mkdir -p "$TMP/config_only"
cp "$MODEL/config.json" "$TMP/config_only/"
FLOOR=(bench --model "$TMP/config_only" --floor-only --json --dataset-name random --random-input-len 100
  --random-output-len 50 --num-prompts 4)
if expect_ok "floor, bf16" "${FLOOR[@]}"; then
  cp "$TMP/out" "$TMP/floor_bf16.json"
  if expect_ok "floor, FP8 weights and KV" "${FLOOR[@]}" --quantization fp8 --kv-cache-dtype fp8; then
    node -e '
      const [bf, f8] = process.argv.slice(1).map((p) => JSON.parse(require("fs").readFileSync(p, "utf8")));
      const errs = [];
      if (bf.prompt_tokens !== 400 || bf.output_tokens !== 200) errs.push("totals " + JSON.stringify(bf));
      if (!(bf.h200_floor_s > 0) || Math.abs(bf.floor_output_tok_per_s * bf.h200_floor_s - 200) > 1e-6)
        errs.push("floor " + JSON.stringify(bf));
      if (!(f8.h200_floor_s < bf.h200_floor_s)) errs.push("FP8 " + f8.h200_floor_s + " vs bf16 " + bf.h200_floor_s);
      if (errs.length) { console.error("  " + errs.join("\n  ")); process.exit(1); }
      console.log("ok   floor-only: " + bf.h200_floor_s + " s bf16, " + f8.h200_floor_s + " s FP8");
    ' "$TMP/floor_bf16.json" "$TMP/out" || fail "floor-only JSON"
  fi
fi
expect_fail "floor-only without config.json" 1 "config.json" bench --model "$TMP" --floor-only

echo "cli_errors: $checks checks, $failures failures"
((failures == 0))
