// vLLM's request fields beyond OpenAI's, through the official openai client against `paged serve` on stories260K
// (with the Llama 2 chat template): prompt_logprobs (completions and chat; checked against Hugging Face's logits and
// against the logprob the sampler reports for the same token), continue_final_message, a request's own
// chat_template (a hostile one refused quickly, the server serving on), spaces_between_special_tokens, cache_salt
// (prefix-cache hits within one salt only, seen in /metrics), priority (refused without priority scheduling), the
// X-Request-Id header.
// Usage: node check_request_fields.mjs --base http://127.0.0.1:PORT --golden .../stories260K-greedy.json --model DIR
import OpenAI from "openai";
import { goldenContinuations } from "./golden_text.mjs";
import { check, checkEqual, finish, metrics, parseArgs, waitForDrained, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
const golden = goldenContinuations(args.golden, args.model);
await waitForHealth(base);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const model = "stories260K";

/// POSTs `body` to `path`; the status and the parsed answer.
async function post(path, body) {
  const r = await fetch(`${base}${path}`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

/// Checks a vLLM prompt_logprobs list for `ids`: null first, then per token a dict holding it and at most k others.
function checkPromptLogprobs(list, ids, k, what) {
  if (!check(Array.isArray(list) && list.length === ids.length, `${what}: one entry per prompt token`, list)) return;
  checkEqual(list[0], null, `${what}: the first token has none`);
  for (let i = 1; i < ids.length; ++i) {
    const entry = list[i];
    const mine = entry?.[String(ids[i])];
    if (!check(mine !== undefined, `${what}: entry ${i} holds the prompt's token ${ids[i]}`, entry)) return;
    check(Object.keys(entry).length <= k + 1, `${what}: entry ${i} holds at most ${k + 1} tokens`, entry);
    check(mine.logprob <= 0 && mine.rank >= 1 && typeof mine.decoded_token === "string",
          `${what}: entry ${i} has logprob, rank, decoded_token`, mine);
    const ranks = Object.values(entry).map((v) => v.rank).sort((a, b) => a - b);
    check(ranks.slice(0, k).every((r, j) => r === j + 1), `${what}: the top ${k} rank 1..${k}`, entry);
  }
}

// ---- prompt_logprobs -------------------------------------------------------------------------------------------
for (const g of golden.slice(0, 3)) {
  // The golden prompt followed by HF's greedy token: that token ranks first with HF's top 5 behind it.
  const ids = [...g.prompt_ids, g.greedy_ids[0]];
  const r = await client.completions.create({ model, prompt: ids, max_tokens: 2, temperature: 0, prompt_logprobs: 5, n: 2 });
  checkPromptLogprobs(r.choices[0].prompt_logprobs, ids, 5, `prompt_logprobs of "${g.prompt}"`);
  checkEqual(r.choices[1].prompt_logprobs, r.choices[0].prompt_logprobs, "both choices of n=2 carry the prompt's");
  const last = r.choices[0].prompt_logprobs.at(-1);
  const top = Object.entries(last).filter(([, v]) => v.rank <= 5).sort((a, b) => a[1].rank - b[1].rank);
  checkEqual(top.map(([id]) => Number(id)), g.last_logits_top5.ids, `HF's top 5 after "${g.prompt}"`);
  const gaps = top.map(([, v]) => v.logprob - top[0][1].logprob);
  const hfGaps = g.last_logits_top5.values.map((v) => v - g.last_logits_top5.values[0]);
  check(gaps.every((x, j) => Math.abs(x - hfGaps[j]) < 1e-3), "logprob gaps are HF's logit gaps", { gaps, hfGaps });

  // The logprob the sampler reports for its greedy token is the prompt logprob of that token after the prompt.
  const sampled = await client.completions.create({ model, prompt: g.prompt_ids, max_tokens: 1, temperature: 0, logprobs: 1 });
  const scored = await client.completions.create({ model, prompt: ids, max_tokens: 1, prompt_logprobs: 0 });
  const want = sampled.choices[0].logprobs.token_logprobs[0];
  const got = scored.choices[0].prompt_logprobs.at(-1)[String(g.greedy_ids[0])].logprob;
  check(Math.abs(got - want) < 1e-5, "prompt logprob == the sampler's logprob of the same token", { got, want });
  checkEqual(Object.keys(scored.choices[0].prompt_logprobs.at(-1)).length, 1, "prompt_logprobs 0: the token alone");
}
{
  const messages = [{ role: "user", content: "Once upon a time" }];
  const tokens = (await post("/tokenize", { model, messages })).body.tokens;
  const r = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, prompt_logprobs: 1 });
  checkPromptLogprobs(r.prompt_logprobs, tokens, 1, "chat prompt_logprobs, at the top of the response");
  check(!("prompt_logprobs" in r.choices[0]), "chat: none in the choice", r.choices[0]);
  const plain = await client.completions.create({ model, prompt: "Once", max_tokens: 1 });
  check(!("prompt_logprobs" in plain.choices[0]), "not asked: no prompt_logprobs", plain.choices[0]);
  for (const body of [{ model, prompt: "Once", prompt_logprobs: 1, stream: true }, { model, prompt: "Once", prompt_logprobs: 21 },
                      { model, prompt: "Once", prompt_logprobs: -1 }]) {
    const bad = await post("/v1/completions", body);
    checkEqual([bad.status, bad.body.error?.param], [400, "prompt_logprobs"], `refused: ${JSON.stringify(body)}`);
  }
}

// ---- continue_final_message ------------------------------------------------------------------------------------
{
  const messages = [{ role: "user", content: "Tell me a story." }, { role: "assistant", content: "Once upon a" }];
  const open = { model, messages, continue_final_message: true, add_generation_prompt: false };
  const prompt = (await post("/tokenize", open)).body;
  const text = (await post("/detokenize", { model, tokens: prompt.tokens })).body.prompt;
  check(text.endsWith("[/INST] Once upon a"), "continue_final_message: the prompt ends in the final message", text);
  const closed = (await post("/tokenize", { model, messages, add_generation_prompt: false })).body;
  checkEqual(closed.tokens.slice(0, prompt.tokens.length), prompt.tokens,
             "it is the closed conversation without what follows the final message");
  check(closed.count > prompt.count, "the closed one goes on after the final message", closed);
  const r = await client.chat.completions.create({ ...open, max_tokens: 8, temperature: 0 });
  checkEqual(r.usage.prompt_tokens, prompt.count, "the completion continues that prompt");
  // The same prompt as a completion gives the same continuation.
  const same = await client.completions.create({ model, prompt: prompt.tokens, max_tokens: 8, temperature: 0 });
  checkEqual(r.choices[0].message.content, same.choices[0].text, "chat continuation == completion of the prompt");
  for (const body of [{ model, messages, continue_final_message: true },
                      { model, messages: messages.slice(0, 1), continue_final_message: true, add_generation_prompt: false }]) {
    const bad = await post("/v1/chat/completions", body);
    checkEqual([bad.status, bad.body.error?.param], [400, "continue_final_message"], `refused: ${JSON.stringify(body)}`);
  }
}

// ---- a request's own chat_template -----------------------------------------------------------------------------
{
  // A template that writes BOS and the last message's text alone: the chat prompt is the golden prompt.
  const g = golden[0];
  const chat_template = "{{ bos_token }}{{ messages[-1].content }}";
  const messages = [{ role: "user", content: g.prompt }];
  const tokens = (await post("/tokenize", { model, messages, chat_template })).body.tokens;
  checkEqual(tokens, g.prompt_ids, "a request's template renders the prompt (BOS from the model)");
  const r = await client.chat.completions.create({ model, messages, chat_template, max_tokens: 64, temperature: 0 });
  checkEqual(r.choices[0].message.content, g.text, "chat with a request's template gives the golden continuation");
  const kwargs = await post("/tokenize", { model, messages, chat_template: "{{ greeting }}", chat_template_kwargs: { greeting: "Hello" } });
  checkEqual(kwargs.body.count > 0 && kwargs.status, 200, "chat_template_kwargs reach a request's template");
  const server = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0 });
  check(server.usage.prompt_tokens > g.prompt_ids.length, "the server's template is unchanged for others", server.usage);

  const started = Date.now();
  for (const hostile of ["{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                         "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "{% if %}"]) {
    const bad = await post("/v1/chat/completions", { model, messages, chat_template: hostile });
    checkEqual([bad.status, bad.body.error?.param], [400, "chat_template"], `refused: ${hostile}`);
  }
  check(Date.now() - started < 5000, "hostile templates are refused within 5 s", Date.now() - started);
  const after = await client.completions.create({ model, prompt: g.prompt, max_tokens: 64, temperature: 0 });
  checkEqual(after.choices[0].text, g.text, "the server serves on after hostile templates");
}

// ---- spaces_between_special_tokens -----------------------------------------------------------------------------
{
  const ok = await post("/v1/completions", { model, prompt: "Once", max_tokens: 2, skip_special_tokens: false,
                                             spaces_between_special_tokens: false });
  checkEqual(ok.status, 200, "spaces_between_special_tokens false is taken");
  const bad = await post("/v1/completions", { model, prompt: "Once", max_tokens: 2, skip_special_tokens: false,
                                              spaces_between_special_tokens: true });
  checkEqual([bad.status, bad.body.error?.param], [400, "spaces_between_special_tokens"],
             "spaces_between_special_tokens true with special tokens written is refused");
}

// ---- cache_salt: the prefix cache is shared only between requests of one salt -----------------------------------
{
  const hits = async () => (await metrics(base)).paged_prefix_cache_hit_tokens_total;
  // A prompt of its own (5 full blocks), so that nothing earlier cached it.
  const prompt = Array.from({ length: 90 }, (_, i) => 300 + ((i * 37) % 200));
  const run = async (salt) => {
    const before = await hits();
    const r = await post("/v1/completions", { model, prompt, max_tokens: 1, temperature: 0,
                                              ...(salt === undefined ? {} : { cache_salt: salt }) });
    checkEqual(r.status, 200, `a request with cache_salt ${salt}`);
    return (await hits()) - before;
  };
  checkEqual(await run("tenant-a-7f3b9c1e"), 0, "the first of salt a computes its prompt");
  check(await run("tenant-a-7f3b9c1e") >= 80, "the second of salt a finds it cached");
  checkEqual(await run("tenant-b-2d8e4a60"), 0, "salt b does not find salt a's blocks");
  checkEqual(await run(undefined), 0, "no salt does not find them either");
  check(await run(undefined) >= 80, "and unsalted requests share among themselves");
  const empty = await post("/v1/completions", { model, prompt: "Once", max_tokens: 1, cache_salt: "" });
  checkEqual([empty.status, empty.body.error?.param], [400, "cache_salt"], "an empty cache_salt is refused");
}

// ---- priority: this server schedules first come, first served ---------------------------------------------------
{
  const zero = await post("/v1/completions", { model, prompt: "Once", max_tokens: 1, priority: 0 });
  checkEqual(zero.status, 200, "priority 0 is every request's under fcfs");
  const urgent = await post("/v1/completions", { model, prompt: "Once", max_tokens: 1, priority: -5 });
  checkEqual([urgent.status, urgent.body.error?.param], [400, "priority"],
             "another priority needs priority scheduling");
}

// ---- X-Request-Id: a client's id names the response and comes back in its header (vLLM's) -------------------------
{
  const send = (id, stream) => fetch(`${base}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json", ...(id === undefined ? {} : { "X-Request-Id": id }) },
    body: JSON.stringify({ model, prompt: "Once", max_tokens: 2, stream }),
  });
  const plain = await send("trace-42:a", false);
  checkEqual([plain.status, plain.headers.get("x-request-id"), (await plain.json()).id],
             [200, "trace-42:a", "cmpl-trace-42:a"], "X-Request-Id names the response");
  const streamed = await send("trace-43", true);
  checkEqual([streamed.status, streamed.headers.get("x-request-id")], [200, "trace-43"], "and a stream's header");
  check((await streamed.text()).includes('"id":"cmpl-trace-43"'), "and its chunks' id");
  const none = await send(undefined, false);
  checkEqual(none.headers.get("x-request-id"), null, "no X-Request-Id, none back");
  const bad = await send("x".repeat(300), false);
  checkEqual([bad.status, (await bad.json()).error?.param], [400, "X-Request-Id"],
             "a 300-character X-Request-Id is refused");
}

const drained = await waitForDrained(base);
check(drained.paged_kv_blocks_free === drained.paged_kv_blocks_total, "KV pool drained after the requests", drained);
finish("check_request_fields");
