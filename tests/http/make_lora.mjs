// Writes a PEFT LoRA adapter for a float32 Llama checkpoint (one model.safetensors) and the reference it is checked
// against: the checkpoint with every pair merged into its weight, W + (alpha / r) B A (PEFT's merge_and_unload),
// computed here in float64, independently of the server's C++.
// Usage: node make_lora.mjs --model DIR --adapter OUT_DIR --merged OUT_DIR [--rank 8] [--alpha 16] [--seed 1]
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "./common.mjs";

const args = parseArgs();
const rank = Number(args.rank ?? 8), alpha = Number(args.alpha ?? 16);
let state = Number(args.seed ?? 1) >>> 0;
const uniform = () => {  // xorshift32 in [-1, 1)
  state ^= state << 13; state >>>= 0; state ^= state >>> 17; state ^= state << 5; state >>>= 0;
  return state / 2 ** 31 - 1;
};

function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString("utf8"));
  const tensors = {};
  for (const [name, e] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    if (e.dtype !== "F32") throw new Error(`${name}: ${e.dtype}, not F32`);
    const [b, en] = e.data_offsets;
    const bytes = buf.subarray(8 + n + b, 8 + n + en);
    tensors[name] = { shape: e.shape, data: new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length)) };
  }
  return tensors;
}

function writeSafetensors(file, tensors) {
  const header = { __metadata__: { format: "pt" } };
  let offset = 0;
  const parts = [];
  for (const [name, t] of Object.entries(tensors)) {
    const bytes = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    header[name] = { dtype: "F32", shape: t.shape, data_offsets: [offset, offset + bytes.length] };
    offset += bytes.length;
    parts.push(bytes);
  }
  let text = JSON.stringify(header);
  while ((8 + text.length) % 8) text += " ";
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(text.length));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(text, "utf8"), ...parts]));
}

const base = readSafetensors(path.join(args.model, "model.safetensors"));
const adapter = {};
const merged = { ...base };
const scale = alpha / rank;
for (const [name, t] of Object.entries(base)) {
  if (!/\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$/.test(name)) continue;
  const [out, inp] = t.shape;
  const module = name.slice(0, -".weight".length);
  const a = new Float32Array(rank * inp).map(() => uniform() / Math.sqrt(inp));
  const b = new Float32Array(out * rank).map(() => (0.5 * uniform()) / Math.sqrt(rank));
  adapter[`base_model.model.${module}.lora_A.weight`] = { shape: [rank, inp], data: a };
  adapter[`base_model.model.${module}.lora_B.weight`] = { shape: [out, rank], data: b };
  const w = new Float32Array(t.data);
  for (let o = 0; o < out; ++o)
    for (let i = 0; i < inp; ++i) {
      let d = 0;
      for (let j = 0; j < rank; ++j) d += b[o * rank + j] * a[j * inp + i];
      w[o * inp + i] = t.data[o * inp + i] + scale * d;
    }
  merged[name] = { shape: t.shape, data: w };
}
fs.mkdirSync(args.adapter, { recursive: true });
writeSafetensors(path.join(args.adapter, "adapter_model.safetensors"), adapter);
fs.writeFileSync(path.join(args.adapter, "adapter_config.json"), JSON.stringify({
  peft_type: "LORA", r: rank, lora_alpha: alpha, target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
  "up_proj", "down_proj"], bias: "none", use_rslora: false, task_type: "CAUSAL_LM" }));
fs.mkdirSync(args.merged, { recursive: true });
for (const f of fs.readdirSync(args.model))
  if (f !== "model.safetensors" && fs.statSync(path.join(args.model, f)).isFile())
    fs.copyFileSync(path.join(args.model, f), path.join(args.merged, f));
writeSafetensors(path.join(args.merged, "model.safetensors"), merged);
console.log(`make_lora: ${Object.keys(adapter).length / 2} pairs of rank ${rank}`);
