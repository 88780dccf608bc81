// The official openai client against `paged serve` on stories260K: completions and chat completions, streamed and
// not, n=2, logprobs, stop, echo; greedy completions must equal the Hugging Face golden continuations.
// Usage: node check_openai.mjs --base http://127.0.0.1:PORT --golden .../stories260K-greedy.json --model DIR
import { readFileSync } from "node:fs";
import net from "node:net";
import path from "node:path";
import OpenAI from "openai";
import { goldenContinuations } from "./golden_text.mjs";
import { check, checkEqual, finish, parseArgs, waitForDrained, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
const golden = goldenContinuations(args.golden, args.model);  // each case's `text`: the prompt's continuation
await waitForHealth(base);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });

const models = await client.models.list();
const model = models.data[0].id;
checkEqual(model, "stories260K", "GET /v1/models names the served model");
const card = await client.models.retrieve(model);
checkEqual(card, models.data[0], "GET /v1/models/{id} (models.retrieve): the listed card");
let missing = null;
try {
  await client.models.retrieve("no/such-model");
} catch (e) {
  missing = e;
}
checkEqual([missing instanceof OpenAI.NotFoundError, missing?.code, missing?.param], [true, "model_not_found", "model"],
  "models.retrieve of a name not served: NotFoundError, model_not_found");

const health = await fetch(`${base}/health`);
checkEqual([health.status, health.headers.get("content-type"), await health.json()],
  [200, "application/json", { status: "ok", replicas: [{ kind: "local", state: "ready" }] }],
  "GET /health: 200, the local replica ready");

/// Collects a streamed completion: text per choice index, finish reasons, usage chunk.
async function collectStream(stream, field) {
  const text = {};
  const finish = {};
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const piece = field(c);
      if (piece !== undefined && piece !== null) text[c.index] = (text[c.index] ?? "") + piece;
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  return { text, finish, usage, chunks };
}

// ---- completions: greedy equals the golden continuations -----------------------------------------------------
for (const g of golden) {
  const r = await client.completions.create({ model, prompt: g.prompt, max_tokens: 64, temperature: 0 });
  checkEqual(r.choices[0].text, g.text, `greedy completion of "${g.prompt}"`);
  checkEqual(r.usage.prompt_tokens, g.prompt_ids.length, `prompt_tokens of "${g.prompt}"`);
  checkEqual(r.usage.completion_tokens, g.greedy_ids.length, `completion_tokens of "${g.prompt}"`);
  checkEqual(r.usage.total_tokens, g.prompt_ids.length + g.greedy_ids.length, `total_tokens of "${g.prompt}"`);
  checkEqual(r.choices[0].finish_reason, "length", `finish_reason of "${g.prompt}"`);
  check(r.object === "text_completion" && r.id.startsWith("cmpl-"), "completion object and id", r);

  const s = await collectStream(
    await client.completions.create({
      model, prompt: g.prompt, max_tokens: 64, temperature: 0, stream: true, stream_options: { include_usage: true },
    }),
    (c) => c.text,
  );
  checkEqual(s.text[0], g.text, `streamed greedy completion of "${g.prompt}" concatenates to the golden text`);
  check(!s.text[0].includes("\uFFFD"), "streamed text is valid UTF-8");
  checkEqual(s.finish[0], "length", "streamed finish_reason");
  checkEqual(s.usage && s.usage.completion_tokens, g.greedy_ids.length, "streamed usage chunk: completion_tokens");
  checkEqual(s.usage && s.usage.prompt_tokens, g.prompt_ids.length, "streamed usage chunk: prompt_tokens");
  check(s.chunks > 2, "a streamed completion comes in several chunks", s.chunks);
}

// A batch of prompts, token-id prompts, echo.
{
  const r = await client.completions.create({
    model, prompt: [golden[0].prompt, golden[1].prompt], max_tokens: 64, temperature: 0,
  });
  checkEqual(r.choices.map((c) => c.index), [0, 1], "batched prompts: choice indices");
  checkEqual(r.choices.map((c) => c.text), [golden[0].text, golden[1].text], "batched prompts: texts");
  checkEqual(r.usage.prompt_tokens, golden[0].prompt_ids.length + golden[1].prompt_ids.length, "batched usage");
  const ids = await client.completions.create({ model, prompt: golden[2].prompt_ids, max_tokens: 64, temperature: 0 });
  checkEqual(ids.choices[0].text, golden[2].text, "token-id prompt gives the golden continuation");
  const echo = await client.completions.create({ model, prompt: golden[0].prompt, max_tokens: 64, temperature: 0, echo: true });
  checkEqual(echo.choices[0].text, golden[0].prompt + golden[0].text, "echo prepends the prompt");
  // lm-evaluation-harness's loglikelihood request: context + continuation echoed with logprobs, nothing generated.
  // The continuation is Hugging Face's greedy one, so each of its tokens is the likeliest where it stands.
  const g = golden[1];
  const scored = await client.completions.create({ model, prompt: [...g.prompt_ids, ...g.greedy_ids], max_tokens: 0,
                                                   echo: true, logprobs: 1, temperature: 0 });
  const c = scored.choices[0];
  const lp = c.logprobs;
  const all = g.prompt_ids.length + g.greedy_ids.length;
  checkEqual([lp.tokens.length, lp.token_logprobs.length, lp.top_logprobs.length, lp.text_offset.length],
             [all, all, all, all], "echo + logprobs: one entry per prompt token");
  checkEqual([lp.token_logprobs[0], lp.top_logprobs[0]], [null, null], "nothing scores the first token");
  checkEqual(c.finish_reason, "length", "max_tokens 0 ends at once");
  checkEqual(scored.usage.completion_tokens, 0, "max_tokens 0 generates nothing");
  let greedy = 0;
  for (let i = g.prompt_ids.length; i < all; i++) {
    const top = lp.top_logprobs[i];
    const best = Object.keys(top).reduce((a, b) => (top[a] >= top[b] ? a : b));
    greedy += best === lp.tokens[i] && lp.token_logprobs[i] === top[best];
  }
  checkEqual(greedy, g.greedy_ids.length, "every token of the greedy continuation is the likeliest");
  const both = await client.completions.create({ model, prompt: g.prompt, max_tokens: 4, echo: true, logprobs: 2,
                                                 prompt_logprobs: 2, temperature: 0 });
  const plp = both.choices[0].prompt_logprobs;
  checkEqual(both.choices[0].logprobs.token_logprobs.slice(1, plp.length),
             plp.slice(1).map((entry, i) => entry[String(g.prompt_ids[i + 1])].logprob),
             "echoed logprobs are the prompt_logprobs of the same tokens");
}

// n = 2: greedy twice is the golden text twice; sampled with a seed, two streams.
{
  const r = await client.completions.create({ model, prompt: golden[0].prompt, max_tokens: 64, temperature: 0, n: 2 });
  checkEqual(r.choices.length, 2, "n=2 gives two choices");
  checkEqual(r.choices.map((c) => c.text), [golden[0].text, golden[0].text], "n=2 greedy choices");
  checkEqual(r.usage.completion_tokens, 128, "n=2 usage counts both completions");
  const s = await collectStream(
    await client.completions.create({
      model, prompt: golden[1].prompt, max_tokens: 20, temperature: 0.8, seed: 7, n: 2, stream: true,
      stream_options: { include_usage: true },
    }),
    (c) => c.text,
  );
  checkEqual(Object.keys(s.text).sort(), ["0", "1"], "n=2 stream: both choices stream");
  check(s.finish[0] && s.finish[1], "n=2 stream: both choices finish", s.finish);
  check(s.usage && s.usage.completion_tokens > 0 && s.usage.completion_tokens <= 40, "n=2 stream usage", s.usage);
  const again = await client.completions.create({
    model, prompt: golden[1].prompt, max_tokens: 20, temperature: 0.8, seed: 7, n: 2,
  });
  checkEqual(again.choices.map((c) => c.text), [s.text[0], s.text[1]], "seeded sampling: streamed == non-streamed");
}

// stop strings and logprobs.
{
  const cut = golden[0].text.indexOf(" girl");
  const r = await client.completions.create({ model, prompt: golden[0].prompt, max_tokens: 64, temperature: 0, stop: [" girl"] });
  checkEqual(r.choices[0].text, golden[0].text.slice(0, cut), "stop string cuts the text before it");
  checkEqual(r.choices[0].finish_reason, "stop", "stop string: finish_reason");
  const kept = await client.completions.create({ model, prompt: golden[0].prompt, max_tokens: 64, temperature: 0,
    stop: [" girl", " named"], include_stop_str_in_output: true });
  checkEqual(kept.choices[0].text, golden[0].text.slice(0, cut + " girl".length),
    "include_stop_str_in_output keeps the first stop string matched");
  const streamed = await collectStream(await client.completions.create({ model, prompt: golden[0].prompt, max_tokens: 64,
    temperature: 0, stop: [" girl"], include_stop_str_in_output: true, stream: true }), (c) => c.text);
  checkEqual(streamed.text[0], golden[0].text.slice(0, cut + " girl".length), "include_stop_str_in_output streamed");
  const lp = await client.completions.create({ model, prompt: golden[0].prompt, max_tokens: 8, temperature: 0, logprobs: 2 });
  const l = lp.choices[0].logprobs;
  checkEqual(l.tokens.length, 8, "completions logprobs: one token per generated token");
  checkEqual(l.token_logprobs.length, 8, "completions logprobs: token_logprobs");
  checkEqual(l.text_offset.length, 8, "completions logprobs: text_offset");
  check(l.top_logprobs.every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 2), "top_logprobs dicts", l.top_logprobs);
  check(l.token_logprobs.every((x) => typeof x === "number" && x <= 0), "logprobs are <= 0", l.token_logprobs);
  checkEqual(l.tokens.join(""), golden[0].text.slice(0, l.tokens.join("").length), "logprob tokens spell the text");
}

// ---- allowed_token_ids and bad_words (vLLM's) -----------------------------------------------------------------
{
  // Greedy within the set of Hugging Face's own greedy tokens: its choices were in the set, so the text is the same.
  const g = golden[0];
  const allowed = [...new Set(g.greedy_ids)];
  const within = await client.completions.create({ model, prompt: g.prompt, max_tokens: 64, temperature: 0,
    allowed_token_ids: allowed });
  checkEqual(within.choices[0].text, g.text, "allowed_token_ids of the golden tokens: the golden text");
  // Sampled: every token (as "token_id:N") is one of the set.
  const sampled = await client.completions.create({ model, prompt: g.prompt, max_tokens: 40, temperature: 1, seed: 3,
    n: 2, allowed_token_ids: allowed.slice(0, 12), logprobs: 0, return_tokens_as_token_ids: true });
  for (const c of sampled.choices) {
    const ids = c.logprobs.tokens.map((t) => Number(t.slice("token_id:".length)));
    check(ids.length > 0 && ids.every((id) => allowed.slice(0, 12).includes(id)), "sampled tokens within allowed_token_ids", ids);
  }
  // A bad word changes the greedy text exactly where the word came first, and it does not come there.
  const cut = g.text.indexOf(" girl");
  check(cut > 0, "the golden text has the word", g.text);
  const banned = await client.completions.create({ model, prompt: g.prompt, max_tokens: 64, temperature: 0,
    bad_words: ["girl"] });
  const text = banned.choices[0].text;
  checkEqual(text.slice(0, cut), g.text.slice(0, cut), "bad_words: the text before the word is unchanged");
  check(!text.slice(cut).startsWith(" girl"), "bad_words: the word is not written where it was", text);
  const chat = await client.chat.completions.create({ model, messages: [{ role: "user", content: g.prompt }],
    max_tokens: 16, temperature: 0, bad_words: ["the", "a"], allowed_token_ids: allowed });
  check(typeof chat.choices[0].message.content === "string", "chat takes allowed_token_ids and bad_words", chat);
}

// ---- skip_special_tokens ---------------------------------------------------------------------------------------
// stories260K separates its stories with BOS: greedy from the first golden prompt writes one within 400 tokens.
{
  const bosText = JSON.parse(readFileSync(path.join(args.model, "tokenizer_config.json"), "utf8")).bos_token;
  const bosId = golden[0].prompt_ids[0];  // Hugging Face's ids start with BOS
  const request = { model, prompt: golden[0].prompt, max_tokens: 400, temperature: 0 };
  const kept = (await client.completions.create({ ...request, skip_special_tokens: false })).choices[0].text;
  const skipped = (await client.completions.create(request)).choices[0].text;
  check(kept.includes(bosText), `skip_special_tokens false writes ${bosText}`, kept);
  check(!skipped.includes(bosText), `skip_special_tokens defaults to true: no ${bosText}`, skipped);
  checkEqual(skipped, kept.split(bosText).join(""), "skip_special_tokens true only leaves out the special text");
  const s = await collectStream(
    await client.completions.create({ ...request, skip_special_tokens: false, stream: true }),
    (c) => c.text,
  );
  checkEqual(s.text[0], kept, "skip_special_tokens false: streamed == non-streamed");
  // A token that stops the completion never becomes text (vLLM without include_stop_str_in_output).
  const stopped = await client.completions.create({ ...request, skip_special_tokens: false, stop_token_ids: [bosId] });
  checkEqual(stopped.choices[0].finish_reason, "stop", "stop_token_ids [BOS]: finish_reason");
  checkEqual(stopped.choices[0].text, kept.slice(0, kept.indexOf(bosText)), "the stopping BOS is not written");
}

// ---- chat completions ----------------------------------------------------------------------------------------
{
  const messages = [{ role: "system", content: "You tell stories." }, { role: "user", content: "Once upon a time" }];
  const r = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  const msg = r.choices[0].message;
  checkEqual(msg.role, "assistant", "chat: assistant message");
  check(typeof msg.content === "string" && msg.content.length > 0, "chat: content", msg);
  check(r.object === "chat.completion" && r.id.startsWith("chatcmpl-"), "chat object and id", r);
  check(r.usage.prompt_tokens > 10, "chat: prompt_tokens count the rendered template", r.usage);
  check(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 24, "chat: completion_tokens", r.usage);
  checkEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, "chat: total_tokens");

  const s = await collectStream(
    await client.chat.completions.create({
      model, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
    }),
    (c) => c.delta.content,
  );
  checkEqual(s.text[0], msg.content, "chat stream concatenates to the non-streamed content");
  checkEqual(s.finish[0], r.choices[0].finish_reason, "chat stream: finish_reason");
  const counts = (u) => [u.prompt_tokens, u.completion_tokens, u.total_tokens];
  checkEqual(counts(s.usage), counts(r.usage), "chat stream: usage chunk equals the non-streamed usage");
  // The same prompt again: its whole blocks come from the prefix cache (OpenAI's prompt_tokens_details).
  checkEqual(r.usage.prompt_tokens_details.cached_tokens % 16, 0, "cached tokens are whole blocks");
  checkEqual(s.usage.prompt_tokens_details.cached_tokens, Math.floor((r.usage.prompt_tokens - 1) / 16) * 16,
             "the repeated prompt's whole blocks are cached (the last token is computed)");

  const two = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, n: 2 });
  checkEqual(two.choices.map((c) => c.message.content), [msg.content, msg.content], "chat n=2 greedy choices");
  const two_s = await collectStream(
    await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0, n: 2, stream: true }),
    (c) => c.delta.content,
  );
  checkEqual([two_s.text[0], two_s.text[1]], [msg.content, msg.content], "chat n=2 streamed choices");

  const lp = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = lp.choices[0].logprobs.content;
  checkEqual(content.length, lp.usage.completion_tokens, "chat logprobs: one entry per token");
  check(content.every((t) => typeof t.token === "string" && Array.isArray(t.bytes) && t.top_logprobs.length <= 2),
        "chat logprobs entries have token, bytes, top_logprobs", content[0]);
}

// ---- return_token_ids (vLLM's): the prompt's and the answer's token ids --------------------------------------
{
  const post = async (url, body) => (await fetch(`${base}${url}`, { method: "POST",
    headers: { "content-type": "application/json" }, body: JSON.stringify(body) })).json();
  const prompt = "The little cat";
  const tokenized = (await post("/tokenize", { model, prompt })).tokens;
  const r = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, logprobs: 0,
    return_token_ids: true, return_tokens_as_token_ids: true });
  const choice = r.choices[0];
  checkEqual(choice.prompt_token_ids, tokenized, "return_token_ids: prompt_token_ids are /tokenize's");
  checkEqual(choice.token_ids, choice.logprobs.tokens.map((t) => Number(t.slice("token_id:".length))),
    "return_token_ids: token_ids are the tokens of the logprobs");
  const detokenized = (await post("/detokenize", { model, tokens: choice.token_ids })).prompt;
  check(detokenized.length > 0 && choice.text.endsWith(detokenized),
    "return_token_ids: token_ids detokenize to the text (a leading space aside)", [detokenized, choice.text]);
  const plain = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
  check(!("token_ids" in plain.choices[0]) && !("prompt_token_ids" in plain.choices[0]), "no token ids unasked",
    plain.choices[0]);
  // Streamed: the prompt's ids in the choice's first chunk, the new ids in each.
  let streamedIds = [], streamedPrompt = null, chunks = 0;
  for await (const chunk of await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0,
    stream: true, return_token_ids: true })) {
    for (const c of chunk.choices) {
      if (chunks++ === 0) streamedPrompt = c.prompt_token_ids;
      else check(!("prompt_token_ids" in c), "prompt_token_ids in the first chunk only", c);
      streamedIds.push(...(c.token_ids ?? []));
    }
  }
  checkEqual([streamedPrompt, streamedIds], [tokenized, choice.token_ids], "streamed token ids == whole");

  const messages = [{ role: "user", content: "Once upon a time" }];
  const chatTokens = (await post("/tokenize", { model, messages, add_generation_prompt: true })).tokens;
  const c = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0,
    return_token_ids: true });
  checkEqual(c.prompt_token_ids, chatTokens, "chat return_token_ids: the rendered prompt's tokens");
  checkEqual((await post("/detokenize", { model, tokens: c.choices[0].token_ids })).prompt, c.choices[0].message.content,
    "chat return_token_ids: token_ids detokenize to the content");
  let chatIds = [], chatPrompt = null, first = true;
  for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0,
    stream: true, return_token_ids: true })) {
    if (first) chatPrompt = chunk.prompt_token_ids;
    else check(!("prompt_token_ids" in chunk), "chat: prompt_token_ids in the first chunk only", chunk);
    first = false;
    for (const ch of chunk.choices) chatIds.push(...(ch.token_ids ?? []));
  }
  checkEqual([chatPrompt, chatIds], [chatTokens, c.choices[0].token_ids], "chat streamed token ids == whole");
}

// ---- SageMaker's /invocations (vLLM's): chat or a completion by the body's fields, answered as those are --------
{
  const invoke = (body) => fetch(`${base}/invocations`, { method: "POST",
    headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  const g = golden[1];
  const completion = await (await invoke({ model, prompt: g.prompt, max_tokens: 64, temperature: 0 })).json();
  checkEqual([completion.object, completion.choices[0].text], ["text_completion", g.text],
    "/invocations with a prompt: the greedy completion");
  const messages = [{ role: "user", content: "Once upon a time" }];
  const chat = await (await invoke({ model, messages, max_tokens: 12, temperature: 0 })).json();
  const direct = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
  checkEqual([chat.object, chat.id.startsWith("chatcmpl-"), chat.choices[0].message.content],
    ["chat.completion", true, direct.choices[0].message.content], "/invocations with messages: the chat completion");
  const streamed = await invoke({ model, prompt: g.prompt, max_tokens: 64, temperature: 0, stream: true });
  const sse = await streamed.text();
  const pieces = sse.split("\n").filter((l) => l.startsWith("data: ") && l !== "data: [DONE]")
    .map((l) => JSON.parse(l.slice(6)).choices.map((c) => c.text).join(""));
  checkEqual([streamed.headers.get("content-type"), pieces.join(""), sse.trimEnd().endsWith("data: [DONE]")],
    ["text/event-stream", g.text, true], "/invocations streamed: SSE of the same completion");
  const neither = await invoke({ model, input: "Once upon a time" });
  const e = (await neither.json()).error;
  checkEqual([neither.status, e.param], [400, "messages"], "/invocations with neither messages nor a prompt: 400");
  checkEqual((await fetch(`${base}/invocations`)).status, 405, "GET /invocations: 405");
  const both = await invoke({ model, messages, prompt: "x" });
  checkEqual([both.status, (await both.json()).error.param], [400, "prompt"],
    "/invocations with messages and a prompt: chat, which refuses the prompt");
}

// ---- GET /load (vLLM's server load): the requests generating now ---------------------------------------------
{
  const load = async () => (await (await fetch(`${base}/load`)).json()).server_load;
  await waitForDrained(base);
  checkEqual(await load(), 0, "GET /load with nothing in flight: 0");
  // Two streams held open (a chunk read from each), then the first closed early by its client.
  const streams = [], iterators = [];
  for (let i = 0; i < 2; ++i) {
    streams.push(await client.completions.create({ model, prompt: golden[i].prompt, max_tokens: 400, stream: true,
      ignore_eos: true }));
    iterators.push(streams[i][Symbol.asyncIterator]());
    await iterators[i].next();
  }
  checkEqual(await load(), 2, "GET /load with two streams open: 2");
  streams[0].controller.abort();
  for (let r = await iterators[1].next(); !r.done; r = await iterators[1].next());
  let after = await load();
  for (let i = 0; i < 100 && after !== 0; ++i, after = await load()) await new Promise((r) => setTimeout(r, 50));
  checkEqual(after, 0, "GET /load once one stream ended and the other's client left: 0");
}

// ---- pipelining: two requests written at once on one connection are answered in order ------------------------
{
  const url = new URL(base);
  const request = (g) => {
    const body = JSON.stringify({ prompt: g.prompt, max_tokens: 64, temperature: 0 });
    return `POST /v1/completions HTTP/1.1\r\nHost: ${url.host}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
  };
  const raw = await new Promise((resolve, reject) => {
    const sock = net.connect(Number(url.port), url.hostname, () => sock.write(request(golden[3]) + request(golden[4])));
    let data = Buffer.alloc(0);
    sock.on("data", (d) => {
      data = Buffer.concat([data, d]);
      if (data.toString().split("HTTP/1.1 200").length === 3 && data.toString().trimEnd().endsWith("}}")) {
        sock.end();
        resolve(data.toString());
      }
    });
    sock.on("error", reject);
    setTimeout(() => reject(new Error("pipelined responses did not arrive")), 30000);
  });
  const bodies = raw.split(/HTTP\/1\.1 200 OK\r\n/).slice(1).map((r) => JSON.parse(r.slice(r.indexOf("\r\n\r\n") + 4)));
  checkEqual(bodies.map((b) => b.choices[0].text), [golden[3].text, golden[4].text],
             "pipelined requests are answered in order");
}

const drained = await waitForDrained(base);
check(drained.paged_kv_blocks_free === drained.paged_kv_blocks_total, "KV pool drained after the requests", drained);
finish("check_openai");
