// A `ws` client on /v1/stream: two generations at once on one socket (their frames interleave), a third cancelled
// mid-way, and error frames for bad frames.
// Usage: node check_websocket.mjs --base http://127.0.0.1:PORT --golden .../stories260K-greedy.json
import net from "node:net";
import WebSocket from "ws";
import { goldenContinuations } from "./golden_text.mjs";
import { check, checkEqual, finish, metrics, parseArgs, waitForDrained, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
const golden = goldenContinuations(args.golden, args.model);  // each case's `text`: the prompt's continuation
await waitForHealth(base);

const ws = new WebSocket(`${base.replace(/^http/, "ws")}/v1/stream`);
await new Promise((resolve, reject) => {
  ws.once("open", resolve);
  ws.once("error", reject);
});

const gens = {};   // id -> { text, ids, done }
const errors = {}; // id -> error frame
const order = [];  // ids of token frames in arrival order
let cancelSent = false;
const allDone = new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error("timed out waiting for the generations")), 60000);
  ws.on("message", (data) => {
    const f = JSON.parse(data.toString());
    if (f.type === "token") {
      const g = (gens[f.id] ??= { text: "", ids: [], done: null, frames: 0 });
      g.text += f.text;
      g.ids.push(...f.token_ids);
      g.frames++;
      order.push(f.id);
      if (f.id === "c" && !cancelSent) {
        cancelSent = true;
        ws.send(JSON.stringify({ type: "cancel", id: "c" }));
      }
    } else if (f.type === "done") {
      (gens[f.id] ??= { text: "", ids: [], done: null, frames: 0 }).done = f;
    } else if (f.type === "error") {
      errors[f.id] = f;
    }
    const expectedErrors = ["bad", "dup-check", "404", "nope", "lp", "plp", "echo", "st", "so"];
    if (["a", "b", "c", "u"].every((id) => gens[id]?.done) && expectedErrors.every((id) => errors[id])) {
      clearTimeout(timer);
      resolve();
    }
  });
});

const [a, b] = golden;
ws.send(JSON.stringify({ type: "generate", id: "a", prompt: a.prompt, max_tokens: 64, temperature: 0 }));
ws.send(JSON.stringify({ type: "generate", id: "b", prompt: b.prompt, max_tokens: 64, temperature: 0 }));
// Long enough to be cancelled mid-way: 400 tokens, EOS ignored.
ws.send(JSON.stringify({ type: "generate", id: "c", prompt: golden[2].prompt, max_tokens: 400, ignore_eos: true, temperature: 0 }));
// Bad frames: invalid parameter, duplicate running id (c still runs), cancel of an unknown id, unknown type.
ws.send(JSON.stringify({ type: "generate", id: "bad", prompt: "x", temperature: -1 }));
ws.send(JSON.stringify({ type: "generate", id: "dup-check", prompt: "x", max_tokens: 0 }));
ws.send(JSON.stringify({ type: "cancel", id: "404" }));
ws.send(JSON.stringify({ type: "frobnicate", id: "nope" }));
// Fields token frames cannot carry: refused, naming them.
ws.send(JSON.stringify({ type: "generate", id: "lp", prompt: "x", logprobs: 2 }));
ws.send(JSON.stringify({ type: "generate", id: "plp", prompt: "x", prompt_logprobs: 0 }));
ws.send(JSON.stringify({ type: "generate", id: "echo", prompt: "x", echo: true }));
// Every generation streams: 'stream' true and 'stream_options.include_usage' are taken, anything else they say is not.
ws.send(JSON.stringify({ type: "generate", id: "u", prompt: "x", max_tokens: 2, stream: true,
                         stream_options: { include_usage: true } }));
ws.send(JSON.stringify({ type: "generate", id: "st", prompt: "x", stream: false }));
ws.send(JSON.stringify({ type: "generate", id: "so", prompt: "x", stream_options: { continuous_usage_stats: true } }));
await allDone;

checkEqual(gens.a.text, a.text, "ws generation a equals the golden continuation");
checkEqual(gens.a.ids, a.greedy_ids, "ws generation a token ids");
checkEqual(gens.a.done.finish_reason, "length", "ws generation a finish_reason");
checkEqual(gens.a.done.usage, { prompt_tokens: a.prompt_ids.length, completion_tokens: 64, total_tokens: a.prompt_ids.length + 64 }, "ws a usage");
checkEqual(gens.b.text, b.text, "ws generation b equals the golden continuation");
checkEqual(gens.b.done.finish_reason, "length", "ws generation b finish_reason");
// Both ran at once: b's first token came before a's last.
const lastA = order.lastIndexOf("a");
const firstB = order.indexOf("b");
check(firstB < lastA, "generations a and b interleave on one socket", { firstB, lastA });
checkEqual(gens.c.done.finish_reason, "cancelled", "generation c was cancelled");
check(gens.c.ids.length < 400, "cancelled generation stopped early", gens.c.ids.length);
checkEqual(errors.bad.error.code, 400, "invalid generate frame: error code 400");
checkEqual(errors.bad.error.param, "temperature", "invalid generate frame names the parameter");
checkEqual(errors["dup-check"].error.code, 400, "max_tokens 0: error 400");
checkEqual(errors["404"].error.code, 404, "cancel of an unknown id: error 404");
checkEqual(errors.nope.error.code, 400, "unknown frame type: error 400");
checkEqual(gens.u.done.usage?.completion_tokens, 2, "stream true with include_usage: served, usage in its done frame");
for (const [id, field] of [["lp", "logprobs"], ["plp", "prompt_logprobs"], ["echo", "echo"], ["st", "stream"],
                           ["so", "stream_options"]]) {
  checkEqual(errors[id].error.code, 400, `${field} on the WebSocket: error 400`);
  checkEqual(errors[id].error.param, field, `${field} on the WebSocket: names the field`);
}

ws.close();

// Frames that no id can answer: a key given twice (which value would count?), and an id of 1e999 (infinity, which
// the answers would echo as `Infinity`, not JSON). Each is answered by one error frame naming the field.
const raw = new WebSocket(`${base.replace(/^http/, "ws")}/v1/stream`);
await new Promise((resolve, reject) => {
  raw.once("open", resolve);
  raw.once("error", reject);
});
const rawErrors = [];
const rawDone = new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error("timed out waiting for the raw frames' errors")), 20000);
  raw.on("message", (data) => {
    rawErrors.push(JSON.parse(data.toString()));  // each must be JSON
    if (rawErrors.length === 2) {
      clearTimeout(timer);
      resolve();
    }
  });
});
raw.send('{"type": "generate", "id": "twice", "prompt": "x", "max_tokens": 2, "max_tokens": 100000}');
raw.send('{"type": "generate", "id": 1e999, "prompt": "x", "max_tokens": 2}');
await rawDone;
checkEqual(rawErrors.map((f) => [f.type, f.error?.code, f.error?.param]),
           [["error", 400, "max_tokens"], ["error", 400, "id"]], "raw frames: a key twice, an infinite id");
raw.close();

// Upgrades whose handshake fields RFC 6455 refuses (a client of another protocol version, a malformed key): an
// OpenAI-style JSON answer (426 naming the version this server speaks, or 400), not a WebSocket, and not counted as
// an upgrade in /metrics.
const rawUpgrade = (headers) =>
  new Promise((resolve, reject) => {
    const url = new URL(base);
    const socket = net.connect(Number(url.port), url.hostname);
    let text = "";
    socket.setTimeout(10000, () => reject(new Error("no answer to a raw upgrade")));
    socket.on("data", (d) => (text += d.toString()));
    socket.on("end", () => resolve(text));
    socket.on("error", reject);
    socket.write(`GET /v1/stream HTTP/1.1\r\nHost: ${url.host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n` +
                 headers.map((h) => h + "\r\n").join("") + "\r\n");
  });
const upgradesBefore = (await metrics(base))['paged_http_responses_total{code="101"}'] ?? 0;
const goodKey = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==";
for (const [headers, status, named] of [
  [["Sec-WebSocket-Version: 8", goodKey], 426, "Sec-WebSocket-Version"],
  [[goodKey], 426, "Sec-WebSocket-Version"],
  [["Sec-WebSocket-Version: 13"], 400, "Sec-WebSocket-Key"],
  [["Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: abc"], 400, "Sec-WebSocket-Key"],
]) {
  const answer = await rawUpgrade(headers);
  const [head, body] = answer.split("\r\n\r\n");
  checkEqual(Number(head.split(" ")[1]), status, `upgrade with ${headers.join(", ")}: status`);
  if (status === 426) check(/\r\nSec-WebSocket-Version: 13\r\n/i.test(head), "a 426 names version 13", head);
  let error;
  try {
    error = JSON.parse(body).error;
  } catch {
    error = undefined;
  }
  check(error?.message?.includes(named), `upgrade with ${headers.join(", ")}: a JSON error naming ${named}`, body);
}
checkEqual((await metrics(base))['paged_http_responses_total{code="101"}'] ?? 0, upgradesBefore,
           "refused upgrades are not counted as 101");

const drained = await waitForDrained(base);
check(drained.paged_kv_blocks_free === drained.paged_kv_blocks_total, "KV pool drained after the WebSocket", drained);
finish("check_websocket");
