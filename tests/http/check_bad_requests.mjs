// Bad requests, each answered with its documented status and an OpenAI error body; afterwards the server still
// answers a correct request correctly and holds no KV blocks.
// Usage: node check_bad_requests.mjs --base http://127.0.0.1:PORT --golden .../stories260K-greedy.json
import { goldenContinuations } from "./golden_text.mjs";
import { check, checkEqual, finish, parseArgs, waitForDrained, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
const golden = goldenContinuations(args.golden, args.model);  // each case's `text`: the prompt's continuation
await waitForHealth(base);

const C = "/v1/completions";
const K = "/v1/chat/completions";
const user = [{ role: "user", content: "hi" }];
const longIds = [1, ...Array(520).fill(400)];
const bigBody = JSON.stringify({ prompt: "x".repeat(2 * 1024 * 1024) });
// r_i ::= r_(i+1) "a" | r_(i+1) "b" for 30 rules: the matcher's start would be on 2^30 stacks.
const ambiguousStart = ["root ::= r0", ...Array.from({ length: 30 }, (_, i) => `r${i} ::= r${i + 1} "a" | r${i + 1} "b"`),
  'r30 ::= "x"'].join("\n");

// [name, path, body (object, raw string or Buffer), expected status, expected param (undefined: not checked), method]
const cases = [
  ["malformed JSON", C, '{"prompt": "x"', 400],
  ["body not an object", C, "[1, 2]", 400],
  ["empty body", C, "", 400],
  ["invalid UTF-8", C, Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}')]), 400],
  ["missing prompt", C, {}, 400, "prompt"],
  ["prompt of wrong type", C, { prompt: 5 }, 400, "prompt"],
  ["empty prompt list", C, { prompt: [] }, 400, "prompt"],
  ["token id out of vocabulary", C, { prompt: [1, 512] }, 400, "prompt"],
  ["negative token id", C, { prompt: [1, -3] }, 400, "prompt"],
  ["unknown model", C, { model: "gpt-4", prompt: "x" }, 404, "model"],
  ["max_tokens zero", C, { prompt: "x", max_tokens: 0 }, 400, "max_tokens"],
  ["max_tokens as a string", C, { prompt: "x", max_tokens: "10" }, 400, "max_tokens"],
  ["prompt + max_tokens over the context", C, { prompt: "x", max_tokens: 600 }, 400, "max_tokens"],
  ["prompt over the context", C, { prompt: longIds }, 400, "prompt"],
  ["temperature negative", C, { prompt: "x", temperature: -0.5 }, 400, "temperature"],
  ["temperature too high", C, { prompt: "x", temperature: 3 }, 400, "temperature"],
  ["top_p zero", C, { prompt: "x", top_p: 0 }, 400, "top_p"],
  ["top_k below -1", C, { prompt: "x", top_k: -5 }, 400, "top_k"],
  ["min_p above 1", C, { prompt: "x", min_p: 2 }, 400, "min_p"],
  ["n zero", C, { prompt: "x", n: 0 }, 400, "n"],
  ["best_of below n", C, { prompt: "x", n: 3, best_of: 2 }, 400, "best_of"],
  ["stop of wrong type", C, { prompt: "x", stop: 7 }, 400, "stop"],
  ["seed of wrong type", C, { prompt: "x", seed: "abc" }, 400, "seed"],
  ["presence_penalty out of range", C, { prompt: "x", presence_penalty: 2.5 }, 400, "presence_penalty"],
  ["frequency_penalty out of range", C, { prompt: "x", frequency_penalty: -3 }, 400, "frequency_penalty"],
  ["repetition_penalty zero", C, { prompt: "x", repetition_penalty: 0 }, 400, "repetition_penalty"],
  ["logit_bias key out of vocabulary", C, { prompt: "x", logit_bias: { 100000: 5 } }, 400, "logit_bias"],
  ["logit_bias key not a number", C, { prompt: "x", logit_bias: { abc: 5 } }, 400, "logit_bias"],
  ["logit_bias value out of range", C, { prompt: "x", logit_bias: { 5: 150 } }, 400, "logit_bias"],
  ["logprobs too many", C, { prompt: "x", logprobs: 50 }, 400, "logprobs"],
  ["echo of wrong type", C, { prompt: "x", echo: "yes" }, 400, "echo"],
  ["stream_options without stream", C, { prompt: "x", stream_options: { include_usage: true } }, 400, "stream_options"],
  ["stream of wrong type", C, { prompt: "x", stream: "yes" }, 400, "stream"],
  ["chat without messages", K, {}, 400, "messages"],
  ["chat with empty messages", K, { messages: [] }, 400, "messages"],
  ["chat message without role", K, { messages: [{ content: "hi" }] }, 400, "messages"],
  ["chat message with unknown role", K, { messages: [{ role: "wizard", content: "hi" }] }, 400, "messages"],
  ["chat roles the template rejects", K, { messages: [{ role: "user", content: "a" }, { role: "user", content: "b" }] }, 400, "messages"],
  ["chat image content", K, { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "http://x" } }] }] }, 400, "messages"],
  ["chat top_logprobs without logprobs", K, { messages: user, top_logprobs: 2 }, 400, "top_logprobs"],
  ["chat max_tokens over the context", K, { messages: user, max_tokens: 100000 }, 400, "max_tokens"],
  ["a key given twice", C, '{"prompt": "x", "max_tokens": 2, "max_tokens": 100000}', 400, "max_tokens"],
  ["a nested key given twice", K, '{"messages": [{"role": "user", "content": "a", "content": "b"}]}', 400, "content"],
  ["logit_bias key with a space", C, { prompt: "x", logit_bias: { " 5": 1 } }, 400, "logit_bias"],
  ["logit_bias key with a plus", C, { prompt: "x", logit_bias: { "+5": 1 } }, 400, "logit_bias"],
  ["a grammar whose start is on 2^30 stacks", C, { prompt: "x", max_tokens: 4, guided_grammar: ambiguousStart }, 400,
   "guided_grammar"],
  ["a JSON schema that matches no text", C, { prompt: "x", max_tokens: 4, guided_json: { $ref: "#" } }, 400, "guided_json"],
  ["a whitespace pattern beside a regex", C, { prompt: "x", structured_outputs: { regex: "a", whitespace_pattern: " " } },
   400, "structured_outputs.whitespace_pattern"],
  ["a whitespace pattern without an output", C, { prompt: "x", guided_whitespace_pattern: " " }, 400, "guided_whitespace_pattern"],
  ["two whitespace options", C, { prompt: "x", structured_outputs: { json_object: true, disable_any_whitespace: true,
   whitespace_pattern: " " } }, 400, "structured_outputs.whitespace_pattern"],
  ["a whitespace pattern with a letter", C, { prompt: "x", guided_json: {}, guided_whitespace_pattern: "[ a]" }, 400,
   "guided_json"],
  ["a structural tag without structures", C, { prompt: "x", structured_outputs: { structural_tag: "{}" } }, 400,
   "structured_outputs"],
  ["a structural tag of xgrammar's newer form", C, { prompt: "x", response_format: { type: "structural_tag",
   format: { type: "const_string", value: "x" } } }, 400, "response_format.format"],
  ["257 stop strings", C, { prompt: "x", stop: Array.from({ length: 257 }, (_, i) => `s${i}`) }, 400, "stop"],
  ["1025 stop_token_ids", C, { prompt: "x", stop_token_ids: Array(1025).fill(3) }, 400, "stop_token_ids"],
  ["length_penalty without beam search", C, { prompt: "x", length_penalty: 2 }, 400, "length_penalty"],
  ["length_penalty out of range", C, { prompt: "x", use_beam_search: true, temperature: 0, length_penalty: 1000 }, 400,
   "length_penalty"],
  ["allowed_token_ids empty", C, { prompt: "x", allowed_token_ids: [] }, 400, "allowed_token_ids"],
  ["allowed_token_ids out of vocabulary", C, { prompt: "x", allowed_token_ids: [3, 100000] }, 400, "allowed_token_ids"],
  ["allowed_token_ids not a list", C, { prompt: "x", allowed_token_ids: 3 }, 400, "allowed_token_ids"],
  ["bad_words not a list", C, { prompt: "x", bad_words: "x" }, 400, "bad_words"],
  ["bad_words of numbers", C, { prompt: "x", bad_words: [3] }, 400, "bad_words"],
  ["a blank bad word", C, { prompt: "x", bad_words: ["  "] }, 400, "bad_words"],
  ["257 bad words", C, { prompt: "x", bad_words: Array.from({ length: 257 }, (_, i) => `w${i}`) }, 400, "bad_words"],
  ["body over the limit", C, bigBody, 413],
  ["unknown path", "/v1/embeddings", { input: "x" }, 404],
  ["unknown top-level path", "/nothing/here", null, 404, undefined, "GET"],
  ["GET on a POST endpoint", C, null, 405, undefined, "GET"],
  ["DELETE on completions", C, null, 405, undefined, "DELETE"],
  ["POST on /v1/models", "/v1/models", {}, 405],
  ["POST on /health", "/health", {}, 405],
  ["plain GET on the WebSocket endpoint", "/v1/stream", null, 400, undefined, "GET"],
];

check(cases.length >= 30, "at least 30 bad requests", cases.length);
for (const [name, path, body, status, param, method = "POST"] of cases) {
  let payload = body;
  if (body !== null && typeof body === "object" && !Buffer.isBuffer(body)) payload = JSON.stringify(body);
  let r;
  try {
    r = await fetch(`${base}${path}`, {
      method,
      headers: payload === null ? {} : { "content-type": "application/json" },
      body: payload === null ? undefined : payload,
    });
  } catch (e) {
    check(false, `${name}: request failed`, String(e.cause ?? e));
    continue;
  }
  checkEqual(r.status, status, `${name}: status`);
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    check(false, `${name}: body is JSON`, text.slice(0, 200));
    continue;
  }
  const e = json.error;
  check(e && typeof e.message === "string" && e.message.length > 0 && typeof e.type === "string" &&
          "param" in e && "code" in e,
        `${name}: OpenAI error body {error: {message, type, param, code}}`, json);
  if (param !== undefined) checkEqual(e?.param, param, `${name}: param`);
  if (status === 400) checkEqual(e?.type, "invalid_request_error", `${name}: type`);
}

// Nothing changed: a correct request is still answered right, and no request holds blocks.
const r = await fetch(`${base}${C}`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ prompt: golden[0].prompt, max_tokens: 64, temperature: 0 }),
});
checkEqual(r.status, 200, "a correct request after the bad ones: status");
const body = await r.json();
checkEqual(body.choices?.[0]?.text, golden[0].text, "a correct request after the bad ones: golden text");
const m = await waitForDrained(base);
check(m.paged_kv_blocks_free === m.paged_kv_blocks_total, "no KV blocks held after the bad requests", m);
checkEqual(m['paged_http_responses_total{code="400"}'] >= cases.filter((c) => c[3] === 400).length, true, "400s counted in /metrics");
finish("check_bad_requests");
