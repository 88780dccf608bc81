// HTTPS (`paged serve --ssl-certfile --ssl-keyfile`, vLLM's flags) through real clients that trust the deployment's
// CA (NODE_EXTRA_CA_CERTS): the official openai client (a greedy completion equal to the golden continuation, a
// streamed chat equal to the whole one, a Responses answer), the token stream over wss:// (ws), and the dashboard's
// page; a plain HTTP request to the port gets no answer. With --mtls BASE (a server started with --ssl-ca-certs and
// --ssl-cert-reqs 2) and --cert / --key: a client without a certificate is refused in the handshake, one with a
// certificate of the CA is served.
// Usage: NODE_EXTRA_CA_CERTS=ca.pem node check_tls.mjs --base https://127.0.0.1:PORT --golden FILE --model DIR
//          [--mtls https://127.0.0.1:PORT2 --cert node.pem --key node-key.pem]
import { readFileSync } from "node:fs";
import https from "node:https";
import OpenAI from "openai";
import WebSocket from "ws";
import { goldenContinuations } from "./golden_text.mjs";
import { check, checkEqual, finish, parseArgs, waitForHealth } from "./common.mjs";

const args = parseArgs();
const base = args.base;
check(base.startsWith("https://"), "an https:// base", base);
await waitForHealth(base);
const golden = goldenContinuations(args.golden, args.model);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const model = (await client.models.list()).data[0].id;
checkEqual(model, "stories260K", "GET /v1/models over HTTPS");

const [a] = golden;
const completion = await client.completions.create({ model, prompt: a.prompt, max_tokens: 64, temperature: 0 });
checkEqual(completion.choices[0].text, a.text.slice(0, completion.choices[0].text.length),
  "a greedy completion over HTTPS is the golden continuation");
check(completion.choices[0].text.length > 0, "it has text");

const messages = [{ role: "user", content: "Once upon a time" }];
const whole = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
let streamed = "";
for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0,
  stream: true })) streamed += chunk.choices[0]?.delta?.content ?? "";
checkEqual(streamed, whole.choices[0].message.content, "a chat stream over HTTPS joins to the whole answer");
const response = await client.responses.create({ model, input: "Once upon a time", max_output_tokens: 8, temperature: 0 });
check(response.status === "completed" || response.status === "incomplete", "a Responses answer over HTTPS", response);

// The token stream over wss://.
const ws = new WebSocket(`${base.replace(/^https/, "wss")}/v1/stream`);
const text = await new Promise((resolve, reject) => {
  let got = "";
  const timer = setTimeout(() => reject(new Error("wss: timed out")), 30000);
  ws.once("error", reject);
  ws.on("open", () => ws.send(JSON.stringify({ type: "generate", id: "a", prompt: a.prompt, max_tokens: 64,
                                               temperature: 0 })));
  ws.on("message", (data) => {
    const f = JSON.parse(data.toString());
    if (f.type === "token") got += f.text;
    if (f.type === "done" || f.type === "error") {
      clearTimeout(timer);
      resolve(f.type === "done" ? got : f);
    }
  });
}).catch((e) => String(e));
ws.close();
checkEqual(text, completion.choices[0].text, "the wss:// token stream gives the completion's text");

const page = await fetch(`${base}/dashboard`);
checkEqual([page.status, page.headers.get("content-type")?.split(";")[0]], [200, "text/html"], "the dashboard over HTTPS");

// Plain HTTP to the HTTPS port: no answer (the handshake fails and the connection closes).
const plain = await fetch(base.replace(/^https/, "http") + "/health", { signal: AbortSignal.timeout(5000) })
  .then((r) => r.status, (e) => "refused");
checkEqual(plain, "refused", "plain HTTP to the HTTPS port gets no answer");

// Mutual TLS: the client's certificate is checked against --ssl-ca-certs.
if (args.mtls) {
  const get = (options) => new Promise((resolve) => {
    const req = https.get(`${args.mtls}/v1/models`, { ...options, timeout: 5000 }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode));
    });
    req.on("error", (e) => resolve(`refused (${e.code ?? e.message})`));
    req.on("timeout", () => req.destroy(new Error("timeout")));
  });
  const without = await get({});
  check(String(without).startsWith("refused"), "mutual TLS: a client without a certificate is refused", without);
  const withCert = await get({ cert: readFileSync(args.cert), key: readFileSync(args.key) });
  checkEqual(withCert, 200, "mutual TLS: a client with a certificate of the CA is served");
}

finish("check_tls");
