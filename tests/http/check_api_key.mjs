// A server started with --api-key: /v1/* without the key (or with a wrong one) is 401, with it the openai client
// works; /health and /metrics stay open; a WebSocket upgrade without the key is refused with 401. With --other KEY2
// (a second --api-key of the server): that key is let in too, and the responses one key stores are its own (the other
// gets 404 for them, by id and as previous_response_id, and cannot delete them); response ids are not guessable.
// Usage: node check_api_key.mjs --base http://127.0.0.1:PORT --key KEY [--other KEY2]
import OpenAI from "openai";
import WebSocket from "ws";
import { check, checkEqual, finish, parseArgs, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
await waitForHealth(base);

async function status(path, init = {}) {
  const r = await fetch(`${base}${path}`, init);
  const text = await r.text();
  return { status: r.status, text };
}
const post = (headers) => ({
  method: "POST",
  headers: { "content-type": "application/json", ...headers },
  body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 4 }),
});

for (const [name, headers] of [
  ["no key", {}],
  ["wrong key", { authorization: `Bearer ${args.key}x` }],
  ["not a bearer token", { authorization: args.key }],
]) {
  const r = await status("/v1/completions", post(headers));
  checkEqual(r.status, 401, `completions with ${name}: 401`);
  const e = JSON.parse(r.text).error;
  check(e && e.message && e.type && "param" in e && e.code === "invalid_api_key", `${name}: OpenAI error body`, r.text);
}
checkEqual((await status("/v1/models")).status, 401, "models without the key: 401");
checkEqual((await status("/v1/chat/completions", post({}))).status, 401, "chat without the key: 401");
checkEqual((await status("/v1/models", { headers: { authorization: `Bearer ${args.key}` } })).status, 200, "models with the key: 200");
checkEqual((await status("/v1/models/stories260K")).status, 401, "a model's card without the key: 401");
checkEqual((await status("/v1/models/stories260K", { headers: { authorization: `Bearer ${args.key}` } })).status, 200,
  "a model's card with the key: 200");
checkEqual((await status("/invocations", post({}))).status, 401, "SageMaker's /invocations without the key: 401");
const invoked = await status("/invocations", post({ authorization: `Bearer ${args.key}` }));
checkEqual([invoked.status, JSON.parse(invoked.text).object], [200, "text_completion"],
  "/invocations with the key: the completion");
checkEqual((await status("/health")).status, 200, "health needs no key");
checkEqual((await status("/metrics")).status, 200, "metrics need no key");

const good = new OpenAI({ baseURL: `${base}/v1`, apiKey: args.key, maxRetries: 0 });
const r = await good.completions.create({ model: "stories260K", prompt: "Once upon a time", max_tokens: 4, temperature: 0 });
checkEqual(r.usage.completion_tokens, 4, "the openai client with the key gets its completion");
const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: "wrong", maxRetries: 0 });
try {
  await bad.completions.create({ model: "stories260K", prompt: "x", max_tokens: 4 });
  check(false, "the openai client with a wrong key must fail");
} catch (e) {
  checkEqual(e.status, 401, "the openai client with a wrong key gets 401");
}

const wsStatus = await new Promise((resolve) => {
  const ws = new WebSocket(`${base.replace(/^http/, "ws")}/v1/stream`);
  ws.on("unexpected-response", (_req, res) => resolve(res.statusCode));
  ws.on("open", () => {
    ws.close();
    resolve(101);
  });
  ws.on("error", () => resolve(-1));
});
checkEqual(wsStatus, 401, "WebSocket upgrade without the key: 401");
const wsOk = await new Promise((resolve) => {
  const ws = new WebSocket(`${base.replace(/^http/, "ws")}/v1/stream`, { headers: { authorization: `Bearer ${args.key}` } });
  ws.on("open", () => {
    ws.close();
    resolve(true);
  });
  ws.on("error", () => resolve(false));
  ws.on("unexpected-response", () => resolve(false));
});
check(wsOk, "WebSocket upgrade with the key opens");

if (args.other) {
  const other = new OpenAI({ baseURL: `${base}/v1`, apiKey: args.other, maxRetries: 0 });
  const r2 = await other.completions.create({ model: "stories260K", prompt: "Once upon a time", max_tokens: 4, temperature: 0 });
  checkEqual(r2.choices[0].text, r.choices[0].text, "the second key is let in too");
  const mine = await good.responses.create({ model: "stories260K", input: "Once upon a time", max_output_tokens: 4 });
  checkEqual((await good.responses.retrieve(mine.id)).id, mine.id, "a key retrieves its own stored response");
  checkEqual(await other.responses.retrieve(mine.id).then(() => 200, (e) => e.status), 404,
    "another key gets 404 for it");
  checkEqual(await other.responses.create({ model: "stories260K", input: "x", previous_response_id: mine.id }).then(
    () => 200, (e) => [e.status, e.param]), [404, "previous_response_id"], "another key cannot continue it");
  checkEqual(await other.responses.delete(mine.id).then(() => 200, (e) => e.status), 404, "another key cannot delete it");
  checkEqual((await good.responses.retrieve(mine.id)).id, mine.id, "it is still there for its key");
  // Ids carry no counter (ids a few requests apart were a few apart in their last digits): random 96 bits.
  const next = await good.responses.create({ model: "stories260K", input: "x", max_output_tokens: 2 });
  const tail = (id) => parseInt(id.slice(-8), 16);
  check(/^resp_[0-9a-f]{24}$/.test(next.id) && Math.abs(tail(next.id) - tail(mine.id)) > 1000, "random response ids",
    [mine.id, next.id]);
}
finish("check_api_key");
