// Many mixed requests at once against a server with a small KV pool, through the official openai client: plain,
// n > 1, best_of, beam search, JSON schema and regex (checked with ajv / the regex), logprobs, penalties, prompt
// logprobs with echo, stop strings, streams of one and of three completions, a fifth of them aborted at a random
// moment. Every request that is not aborted must answer 200
// with its choices, each finished; afterwards nothing runs and the KV pool is whole again. Seeded: a failure
// reproduces with the same --seed.
// With --priorities 1 (a server with --scheduling-policy priority) each request has a random priority in [-3, 3].
// Usage: node check_stress.mjs --base http://127.0.0.1:PORT [--requests 300] [--seed 1] [--priorities 1]
import OpenAI from "openai";
import Ajv from "ajv";
import { check, finish, parseArgs, waitForDrained, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
const requests = Number(args.requests ?? 300);
let state = Number(args.seed ?? 1);
const rnd = () => {
  state = (state * 1103515245 + 12345) % 2147483648;
  return state / 2147483648;
};
const pick = (a) => a[Math.floor(rnd() * a.length)];
await waitForHealth(base);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0, timeout: 300000 });
const model = (await client.models.list()).data[0].id;
const schema = {
  type: "object",
  properties: { name: { type: "string", maxLength: 10 }, age: { type: "integer" } },
  required: ["name", "age"],
  additionalProperties: false,
};
const validate = new Ajv().compile(schema);
const regex = "(Once|The) [a-z ]{5,30}\\.";
const words = ("Once upon a time there was a little girl named Lily who loved to play in the park with her dog and " +
               "her friends every day the cat sat on the mat and looked at the big red ball").split(" ");
const text = (n) => Array.from({ length: n }, () => pick(words)).join(" ");
// Most prompts start with one of four long prefixes: prefix-cache hits, and evictions into the tiers.
const prefixes = Array.from({ length: 4 }, () => text(40 + Math.floor(rnd() * 60)));
const prompt = () => (rnd() < 0.6 ? pick(prefixes) + " " : "") + text(3 + Math.floor(rnd() * 60));

const kinds = ["plain", "n", "best_of", "beam", "schema", "regex", "logprobs", "stream", "stream_n", "penalties",
               "prompt_logprobs", "stop"];
const outcome = { ok: 0, aborted: 0, failed: {} };
async function one(i) {
  const kind = pick(kinds);
  const body = { model, prompt: prompt(), max_tokens: 1 + Math.floor(rnd() * 120), temperature: pick([0, 0.8, 1.0]),
                 seed: i };
  if (!["schema", "regex"].includes(kind) && rnd() < 0.5) body.ignore_eos = true;
  if (args.priorities) body.priority = Math.floor(rnd() * 7) - 3;
  if (kind === "n") body.n = 2 + Math.floor(rnd() * 3);
  if (kind === "best_of") Object.assign(body, { n: 2, best_of: 3 });
  if (kind === "beam") Object.assign(body, { use_beam_search: true, n: 2 + Math.floor(rnd() * 2), temperature: 0,
                                             max_tokens: Math.min(body.max_tokens, 60) });
  if (kind === "schema") body.guided_json = schema;
  if (kind === "regex") body.guided_regex = regex;
  if (kind === "logprobs") body.logprobs = 3;
  if (kind === "penalties") Object.assign(body, { repetition_penalty: 1.3, presence_penalty: 0.5,
                                                  frequency_penalty: 0.4, min_tokens: Math.min(body.max_tokens, 5) });
  if (kind === "prompt_logprobs") Object.assign(body, { prompt_logprobs: 2, echo: true, logprobs: 1 });
  if (kind === "stop") body.stop = [pick(words), "."];
  if (kind.startsWith("stream")) body.stream = true;
  if (kind === "stream_n") body.n = 3;
  const width = body.n ?? 1;
  const abort = new AbortController();
  if (rnd() < 0.2) setTimeout(() => abort.abort(), Math.floor(rnd() * 400));
  try {
    if (body.stream) {
      const finished = new Set();
      for await (const chunk of await client.completions.create(body, { signal: abort.signal }))
        for (const c of chunk.choices) if (c.finish_reason) finished.add(c.index);
      if (abort.signal.aborted) return outcome.aborted++;
      check(finished.size === width, `request ${i} (${kind}): all ${width} completions finish`, [...finished]);
      return outcome.ok++;
    }
    const r = await client.completions.create(body, { signal: abort.signal });
    check(r.choices.length === width, `request ${i} (${kind}): ${width} choices`, r.choices.length);
    for (const c of r.choices) {
      check(["stop", "length"].includes(c.finish_reason), `request ${i} (${kind}): a finish reason`, c.finish_reason);
      if (kind === "prompt_logprobs") {
        // One entry per prompt token, whatever preemption did to the scoring; the echo's logprobs the prompt's and
        // then the answer's tokens.
        check(c.prompt_logprobs?.length === r.usage.prompt_tokens, `request ${i}: prompt logprobs of every token`,
              [c.prompt_logprobs?.length, r.usage.prompt_tokens]);
        check(c.logprobs?.tokens.length === r.usage.prompt_tokens + r.usage.completion_tokens,
              `request ${i}: echoed logprobs of every token`, [c.logprobs?.tokens.length, r.usage]);
      }
      if (c.finish_reason !== "stop") continue;
      if (kind === "schema") check(validate(JSON.parse(c.text)), `request ${i}: the schema holds`, c.text);
      if (kind === "regex") check(new RegExp(`^${regex}$`).test(c.text), `request ${i}: the regex holds`, c.text);
    }
    outcome.ok++;
  } catch (e) {
    if (abort.signal.aborted) return outcome.aborted++;
    const key = `${kind}: ${e.status ?? ""} ${String(e.message).slice(0, 200)}`;
    outcome.failed[key] = (outcome.failed[key] ?? 0) + 1;
  }
}
await Promise.all(Array.from({ length: requests }, (_, i) => one(i)));
console.log(`check_stress: ${JSON.stringify(outcome)}`);
check(Object.keys(outcome.failed).length === 0, "no request failed", outcome.failed);
check(outcome.ok >= requests / 2, "most requests answered", outcome);
const m = await waitForDrained(base, 30000);
check(m.paged_kv_blocks_free === m.paged_kv_blocks_total, "the KV pool is whole again",
      [m.paged_kv_blocks_free, m.paged_kv_blocks_total]);
check(m.paged_cpu_blocks_free === m.paged_cpu_blocks_total, "the swap pool is whole again",
      [m.paged_cpu_blocks_free, m.paged_cpu_blocks_total]);
check(m.paged_num_requests_running === 0 && m.paged_num_requests_waiting === 0, "nothing runs or waits");
check(m.paged_num_preemptions_total > 0, "the pool was small enough to preempt", m.paged_num_preemptions_total);
finish("check_stress");
