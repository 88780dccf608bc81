// Reasoning outputs through the official openai client against `paged serve --reasoning-parser P` on stories260K
// at temperature 1 and several seeds. The stories model writes no think block on its own, so the answers are
// written under regexes (a whole think block, a closing tag alone, none, an answer cut inside the block); each
// answer's raw text comes from a server without the parser (--plain, the same seed), where the tags stay in the
// content. The parser's message.reasoning_content (and its alias message.reasoning) and message.content must be the
// raw text split by this file's own reading of vLLM's rules, and the stream's delta.reasoning_content fragments,
// then delta.content ones, must join to the same (and their token_ids to the whole answer's); the usage's
// completion_tokens_details.reasoning_tokens, whole and streamed, must count the tokens generated inside the think
// block by the same reading of the plain answer's tokens (their texts from its logprobs). With --tool-parser
// hermes: a call written after the think block is read from the content, one written inside it stays reasoning.
// Usage: node check_reasoning.mjs --base URL --plain URL --parser deepseek_r1|qwen3 [--tool-parser hermes]
import OpenAI from "openai";
import { check, checkEqual, finish, parseArgs, waitForHealth } from "./common.mjs";

const args = parseArgs();
await waitForHealth(args.base);
await waitForHealth(args.plain);
const client = new OpenAI({ baseURL: `${args.base}/v1`, apiKey: "unused", maxRetries: 0 });
const plain = new OpenAI({ baseURL: `${args.plain}/v1`, apiKey: "unused", maxRetries: 0 });
const model = "stories260K";
const messages = [{ role: "user", content: "Tell me a story." }];
const OPEN = "<think>", CLOSE = "</think>";

// The raw answer split as vLLM's parsers split it (null for an empty part).
function expectedSplit(parser, raw) {
  let reasoning, content;
  if (parser === "deepseek_r1") {
    // Reasoning up to the first </think>, an opening tag before it dropped; no </think>: all reasoning.
    const close = raw.indexOf(CLOSE);
    reasoning = close < 0 ? raw : raw.slice(0, close);
    content = close < 0 ? "" : raw.slice(close + CLOSE.length);
    const open = reasoning.indexOf(OPEN);
    if (open >= 0) reasoning = reasoning.slice(0, open) + reasoning.slice(open + OPEN.length);
  } else {
    // Reasoning only after <think>, up to </think> (or the end of an answer cut inside the block).
    const open = raw.indexOf(OPEN);
    if (open < 0) return { reasoning: null, content: raw || null };
    const after = raw.slice(open + OPEN.length);
    const close = after.indexOf(CLOSE);
    reasoning = close < 0 ? after : after.slice(0, close);
    content = raw.slice(0, open) + (close < 0 ? "" : after.slice(close + CLOSE.length));
  }
  return { reasoning: reasoning || null, content: content || null };
}

// How many of an answer's tokens (their texts, in order) come while it is inside its reasoning, by this file's reading
// of the same rules: from the start (deepseek_r1) or the token after the one completing <think> (qwen3), through the
// token that completes the first </think> after it.
function expectedReasoningTokens(parser, tokens) {
  let text = "", open = parser === "deepseek_r1" ? 0 : -1, closed = false, count = 0;
  for (const token of tokens) {
    if (open >= 0 && !closed) ++count;
    text += token;
    if (open < 0 && text.includes(OPEN)) open = text.indexOf(OPEN) + OPEN.length;
    if (open >= 0 && !closed && text.indexOf(CLOSE, open) >= 0) closed = true;
  }
  return count;
}

// The stream of `request`: its reasoning and content joined, and whether any content came before reasoning ended.
async function streamed(request) {
  const stream = await client.chat.completions.create({ ...request, stream: true,
                                                        stream_options: { include_usage: true } });
  let reasoning = "", alias = "", content = "", fragments = 0, interleaved = false, finish = null, usage = null;
  const ids = [];
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    ids.push(...(choice.token_ids ?? []));
    const d = choice.delta ?? {};
    if (d.reasoning_content) {
      reasoning += d.reasoning_content;
      ++fragments;
      if (content) interleaved = true;
    }
    if (d.reasoning) alias += d.reasoning;
    if (d.content) content += d.content;
    finish = choice.finish_reason ?? finish;
  }
  return { reasoning: reasoning || null, alias: alias || null, content: content || null, fragments, interleaved, finish,
           ids, usage };
}

const regexes = {
  "a think block, then the answer": `<think>[a-z ]{5,40}</think>[a-z ]{5,40}`,
  "a closing tag alone": `[a-z ]{5,40}</think>[a-z ]{5,40}`,
  "no think block": `[a-z ]{5,40}`,
  "a tag in the reasoning, a '<' in the answer": `<think>[a-z]{2,8}<think>[a-z ]{2,20}</think>[a-z]{2,8} < [a-z ]{2,20}`,
};
let split = 0, longFragments = 0;
for (let seed = 0; seed < 6; ++seed) {
  for (const [what, regex] of Object.entries(regexes)) {
    for (const max_tokens of [200, 6]) {
      const request = { model, messages, temperature: 1, seed, max_tokens, structured_outputs: { regex },
                        return_token_ids: true };
      const label = `seed ${seed}, ${what}, max_tokens ${max_tokens}`;
      const plainChoice = (await plain.chat.completions.create({ ...request, logprobs: true })).choices[0];
      const raw = plainChoice.message.content;
      const tokens = plainChoice.logprobs.content.map((t) => t.token);
      checkEqual(tokens.join(""), raw, `${label}: the plain answer's tokens spell it`);
      const reasoningTokens = expectedReasoningTokens(args.parser, tokens);
      if (max_tokens === 200 && what !== "no think block")
        check(raw.includes(CLOSE), `${label}: without the parser the tags stay in the content`, raw);
      const want = expectedSplit(args.parser, raw);
      const wholeAnswer = await client.chat.completions.create(request);
      const whole = wholeAnswer.choices[0];
      checkEqual(wholeAnswer.usage.completion_tokens_details?.reasoning_tokens, reasoningTokens,
                 `${label}: usage.completion_tokens_details.reasoning_tokens`);
      const got = { reasoning: whole.message.reasoning_content ?? null, content: whole.message.content ?? null };
      checkEqual(got, want, `${label}: the answer split into reasoning and content`);
      checkEqual(whole.message.reasoning ?? null, got.reasoning, `${label}: message.reasoning is reasoning_content`);
      const s = await streamed(request);
      checkEqual({ reasoning: s.reasoning, content: s.content }, want, `${label}: the stream joins to the same split`);
      checkEqual(s.alias, s.reasoning, `${label}: delta.reasoning is delta.reasoning_content`);
      checkEqual(s.finish, whole.finish_reason, `${label}: the finish reason streamed`);
      checkEqual(s.usage?.completion_tokens_details?.reasoning_tokens, reasoningTokens,
                 `${label}: the streamed usage's reasoning tokens`);
      checkEqual(s.ids, whole.token_ids, `${label}: the stream's token ids (return_token_ids), held-back text's too`);
      check(!s.interleaved, `${label}: no reasoning after content`);
      if (want.reasoning && want.content) ++split;
      if (s.fragments > 1) ++longFragments;
    }
  }
}
check(split >= 12, `answers with both parts (${split})`);
check(longFragments >= 8, `reasoning streamed in fragments (${longFragments})`);

if (args["tool-parser"] === "hermes") {
  const tools = [{ type: "function", function: { name: "get_weather", parameters: {
    type: "object", properties: { city: { type: "string", maxLength: 20 } }, required: ["city"] } } }];
  const call = '<tool_call>\\{"name": "get_weather", "arguments": \\{"city": "[A-Z][a-z]{1,8}"\\}\\}</tool_call>';
  for (let seed = 0; seed < 4; ++seed) {
    const request = { model, messages, tools, tool_choice: "auto", temperature: 1, seed, max_tokens: 300,
                      structured_outputs: { regex: `<think>[a-z ]{3,20}${call}[a-z ]{3,20}</think>Sure\\. ${call}` } };
    const whole = (await client.chat.completions.create(request)).choices[0];
    checkEqual(whole.finish_reason, "tool_calls", `seed ${seed}: the call after the think block is read`);
    checkEqual(whole.message.tool_calls?.length, 1, `seed ${seed}: the call inside the think block is not`);
    check(/^[a-z ]{3,20}<tool_call>.*<\/tool_call>[a-z ]{3,20}$/.test(whole.message.reasoning_content ?? ""),
          `seed ${seed}: the call inside the think block stays reasoning`, whole.message);
    checkEqual(whole.message.content, "Sure. ", `seed ${seed}: the content before the call`);
    const stream = client.chat.completions.stream({ ...request, stream: true });
    for await (const chunk of stream) void chunk;
    const joined = (await stream.finalChatCompletion()).choices[0];
    checkEqual(joined.message.tool_calls.map((c) => [c.function.name, c.function.arguments]),
               whole.message.tool_calls.map((c) => [c.function.name, c.function.arguments]),
               `seed ${seed}: the streamed call`);
    checkEqual(joined.message.content, whole.message.content, `seed ${seed}: the streamed content`);
  }
}
finish(`check_reasoning (${args.parser}${args["tool-parser"] ? ` with ${args["tool-parser"]}` : ""})`);
