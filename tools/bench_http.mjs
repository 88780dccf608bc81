#!/usr/bin/env node
// Load benchmark of the HTTP API: N streamed /v1/completions requests at C concurrent over loopback; prints
// requests/s, output tokens/s, TTFT, TPOT and end-to-end latency (p50/p99) and the error count.
//
//   node tools/bench_http.mjs --base http://127.0.0.1:8000 [--requests 1000] [--concurrency 64]
//   node tools/bench_http.mjs --paged build/paged --model ../shared/models/stories260K [...]   (starts the server)
//   options: --max-tokens 64 (each request generates exactly this many: ignore_eos) --seed 1 --json
//
// Prompts are seeded synthetic TinyStories-like sentences of 4 to 32 words. Needs only Node >= 18 (fetch).
import { spawn } from "node:child_process";
import net from "node:net";

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, "");
    const next = argv[i + 1];
    if (next === undefined || next.startsWith("--")) out[key] = true;
    else out[key] = argv[++i];
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const requests = Number(args.requests ?? 1000);
const concurrency = Number(args.concurrency ?? 64);
const maxTokens = Number(args["max-tokens"] ?? 64);
let seed = Number(args.seed ?? 1);

function random() {  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const words = ("once upon a time there was a little girl named lily she loved to play outside in the park one day " +
  "saw big red ball dog cat tree sun happy sad friend mom said wanted went home found box bird sky").split(" ");
function prompt() {
  const n = 4 + Math.floor(random() * 29);
  const w = Array.from({ length: n }, () => words[Math.floor(random() * words.length)]);
  w[0] = w[0][0].toUpperCase() + w[0].slice(1);
  return w.join(" ");
}

async function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = s.address().port;
      s.close(() => resolve(port));
    });
  });
}

async function waitForHealth(base, child) {
  for (let i = 0; i < 600; i++) {
    if (child && child.exitCode !== null) throw new Error(`paged serve exited with ${child.exitCode}`);
    try {
      if ((await fetch(`${base}/health`)).ok) return;
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${base}/health never answered`);
}

let base = args.base ?? "http://127.0.0.1:8000";
let server = null;
if (args.paged) {
  if (!args.model) throw new Error("--paged needs --model DIR");
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  const extra = args["server-args"] ? String(args["server-args"]).split(" ") : [];
  server = spawn(args.paged, ["serve", "--model", args.model, "--port", String(port), ...extra], { stdio: ["ignore", "inherit", "inherit"] });
}
await waitForHealth(base, server);
const model = (await (await fetch(`${base}/v1/models`)).json()).data[0].id;

/// One streamed request: TTFT (to the first chunk with text), TPOT over the rest, end-to-end time, tokens.
async function one(text) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model, prompt: text, max_tokens: maxTokens, ignore_eos: true, temperature: 0.8, seed: Math.floor(random() * 1e9),
      stream: true, stream_options: { include_usage: true },
    }),
  });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  let first = null;
  let last = null;
  let tokens = 0;
  let done = false;
  let buffer = "";
  const decoder = new TextDecoder();
  for await (const part of r.body) {
    buffer += decoder.decode(part, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!frame.startsWith("data: ")) continue;
      const payload = frame.slice(6);
      if (payload === "[DONE]") {
        done = true;
        continue;
      }
      const chunk = JSON.parse(payload);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      if (chunk.choices?.some((c) => c.text)) {
        const now = performance.now();
        first ??= now;
        last = now;
      }
    }
  }
  if (!done) throw new Error("stream ended without [DONE]");
  const end = performance.now();
  return {
    ttft: (first ?? end) - t0,
    tpot: tokens > 1 && first !== null ? (last - first) / (tokens - 1) : null,
    e2e: end - t0,
    tokens,
  };
}

const prompts = Array.from({ length: requests }, prompt);
const results = [];
const errors = [];
let next = 0;
const start = performance.now();
await Promise.all(
  Array.from({ length: Math.min(concurrency, requests) }, async () => {
    while (next < prompts.length) {
      const text = prompts[next++];
      try {
        results.push(await one(text));
      } catch (e) {
        errors.push(String(e.message ?? e));
      }
    }
  }),
);
const seconds = (performance.now() - start) / 1000;
if (server) server.kill("SIGTERM");

function percentile(values, q) {
  const v = values.filter((x) => x !== null).sort((a, b) => a - b);
  if (!v.length) return NaN;
  return v[Math.min(v.length - 1, Math.max(0, Math.ceil(q * v.length) - 1))];
}
const outTokens = results.reduce((s, r) => s + r.tokens, 0);
const summary = {
  requests,
  concurrency,
  max_tokens: maxTokens,
  completed: results.length,
  errors: errors.length,
  duration_s: +seconds.toFixed(3),
  requests_per_s: +(results.length / seconds).toFixed(2),
  output_tokens_per_s: +(outTokens / seconds).toFixed(1),
  ttft_ms: { p50: +percentile(results.map((r) => r.ttft), 0.5).toFixed(2), p99: +percentile(results.map((r) => r.ttft), 0.99).toFixed(2) },
  tpot_ms: { p50: +percentile(results.map((r) => r.tpot), 0.5).toFixed(3), p99: +percentile(results.map((r) => r.tpot), 0.99).toFixed(3) },
  e2e_ms: { p50: +percentile(results.map((r) => r.e2e), 0.5).toFixed(2), p99: +percentile(results.map((r) => r.e2e), 0.99).toFixed(2) },
};
if (args.json) {
  console.log(JSON.stringify(summary));
} else {
  console.log(`model ${model} at ${base}: ${requests} requests, ${concurrency} concurrent, ${maxTokens} tokens each`);
  console.log(`  completed ${summary.completed}, errors ${summary.errors}, ${summary.duration_s} s`);
  console.log(`  ${summary.requests_per_s} requests/s, ${summary.output_tokens_per_s} output tokens/s`);
  console.log(`  TTFT  p50 ${summary.ttft_ms.p50} ms   p99 ${summary.ttft_ms.p99} ms`);
  console.log(`  TPOT  p50 ${summary.tpot_ms.p50} ms   p99 ${summary.tpot_ms.p99} ms`);
  console.log(`  E2E   p50 ${summary.e2e_ms.p50} ms   p99 ${summary.e2e_ms.p99} ms`);
}
if (errors.length) {
  console.error(`first errors:\n  ${errors.slice(0, 5).join("\n  ")}`);
  process.exitCode = 1;
}
